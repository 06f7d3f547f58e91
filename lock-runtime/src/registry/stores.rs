//! The one-line constructors: a registry over each store with its defaults.
//! The only part of the API that names stores; each is
//! [`LockRegistry::new`] over the store's own `connect`.

#[cfg(any(
    feature = "redis",
    feature = "postgres",
    feature = "mysql",
    feature = "etcd",
    feature = "zookeeper"
))]
use crate::error::LockError;
#[cfg(feature = "etcd")]
use crate::store::etcd::EtcdStore;
use crate::store::memory::MemoryStore;
#[cfg(feature = "mysql")]
use crate::store::mysql::MySqlStore;
#[cfg(feature = "postgres")]
use crate::store::postgres::PostgresStore;
#[cfg(feature = "redis")]
use crate::store::redis::RedisStore;
#[cfg(feature = "redis")]
use crate::store::redlock::RedlockStore;
#[cfg(feature = "zookeeper")]
use crate::store::zookeeper::ZooKeeperStore;

use super::LockRegistry;

impl LockRegistry {
    /// An in-process registry over a fresh [`MemoryStore`]: locks exclude
    /// tasks of this process only.
    pub fn memory() -> LockRegistry {
        LockRegistry::new(MemoryStore::new())
    }

    /// A registry over one Redis server (`redis://[:password@]host:port[/db]`,
    /// `rediss://` for TLS), a Redis Cluster
    /// (`redis+cluster://host:port[,host:port...]`) or the master of a
    /// Sentinel group (`redis+sentinel://host:port[,..]/master`), with the
    /// [`RedisStore`] defaults (see [`RedisStore::builder`]).
    ///
    /// # Errors
    ///
    /// [`LockError::Connect`] naming the URL (password redacted) when the URL
    /// is invalid or the server cannot be reached or refuses the credentials.
    #[cfg(feature = "redis")]
    pub async fn redis(url: &str) -> Result<LockRegistry, LockError> {
        Ok(LockRegistry::new(RedisStore::connect(url).await?))
    }

    /// A registry over N ≥ 3 independent Redis masters with the Redlock
    /// algorithm; see [`RedlockStore`] for what it promises and what it
    /// needs.
    ///
    /// # Errors
    ///
    /// [`LockError::Connect`] naming the nodes (passwords redacted) for fewer
    /// than 3 nodes, a node given twice, an invalid URL, or fewer than a
    /// majority reachable.
    #[cfg(feature = "redis")]
    pub async fn redlock(urls: &[&str]) -> Result<LockRegistry, LockError> {
        Ok(LockRegistry::new(RedlockStore::connect(urls).await?))
    }

    /// A registry over a PostgreSQL database
    /// (`postgres://user:password@host:port/dbname`, or `host=.. user=..`),
    /// with the [`PostgresStore`] defaults: table `lock_leases`, created if
    /// missing.
    ///
    /// # Errors
    ///
    /// [`LockError::Connect`] naming the connect string (password redacted)
    /// when it is invalid, the server cannot be reached, refuses the
    /// credentials, or the table cannot be created.
    #[cfg(feature = "postgres")]
    pub async fn postgres(url: &str) -> Result<LockRegistry, LockError> {
        Ok(LockRegistry::new(PostgresStore::connect(url).await?))
    }

    /// A registry over a MySQL 8.0+ or MariaDB 10.6+ database
    /// (`mysql://user:password@host:port/database`), with the
    /// [`MySqlStore`] defaults: table `lock_leases` and its procedures,
    /// created if missing.
    ///
    /// # Errors
    ///
    /// [`LockError::Connect`] naming the URL (password redacted) when it is
    /// invalid, the server cannot be reached, refuses the credentials, or
    /// the table cannot be created.
    #[cfg(feature = "mysql")]
    pub async fn mysql(url: &str) -> Result<LockRegistry, LockError> {
        Ok(LockRegistry::new(MySqlStore::connect(url).await?))
    }

    /// A registry over the etcd cluster at `endpoints`
    /// (`http://127.0.0.1:2379`, ...), with the [`EtcdStore`] defaults.
    ///
    /// # Errors
    ///
    /// [`LockError::Connect`] naming the endpoints when none answers.
    #[cfg(feature = "etcd")]
    pub async fn etcd(endpoints: &[&str]) -> Result<LockRegistry, LockError> {
        Ok(LockRegistry::new(EtcdStore::connect(endpoints).await?))
    }

    /// A registry over the ZooKeeper ensemble at `connect_string`
    /// (`10.0.0.7:2181,10.0.0.8:2181`, optionally ending in a chroot path),
    /// with the [`ZooKeeperStore`] defaults.
    ///
    /// # Errors
    ///
    /// [`LockError::Connect`] naming the servers when none answers.
    #[cfg(feature = "zookeeper")]
    pub async fn zookeeper(connect_string: &str) -> Result<LockRegistry, LockError> {
        Ok(LockRegistry::new(
            ZooKeeperStore::connect(connect_string).await?,
        ))
    }
}
