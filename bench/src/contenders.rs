//! The contenders: every lock under test behind one enum, and how a worker process makes one by name.

use super::*;

/// A lock implementation under test.
#[derive(Clone)]
pub(crate) enum Lib {
    Floor(MultiplexedConnection),
    Ours(LockRegistry),
    Rslock(rslock::LockManager),
    /// The `distributed-lock` crate (0.2) on Redis: `RedisLockProvider`,
    /// a lock made per key, acquired and released.
    PeerRedis(Arc<distributed_lock_redis::RedisLockProvider>),
    /// The `distributed-lock` crate (0.2) on PostgreSQL: advisory locks.
    PeerPostgres(Arc<distributed_lock_postgres::PostgresLockProvider>),
    /// A store driven through the `Store` trait alone, without the
    /// runtime (profiling only).
    Raw(Arc<dyn lock_runtime::store::Store>),
    /// In-process baseline: one tokio mutex per key.
    TokioMutex(Arc<std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>>),
    /// `#[distributed_lock]` over the global (memory) registry.
    Attribute,
    /// The MySQL floor: the library's statements by hand.
    MySqlFloor(Arc<MySqlFloor>),
    /// The `distributed-lock` crate (0.2) on MySQL: `GET_LOCK`.
    PeerMySql(Arc<distributed_lock_mysql::MySqlLockProvider>),
    /// The PostgreSQL floor: the library's insert-or-take-over statement,
    /// retried at once while held, and an owner-checked delete; no library.
    PgFloor(Arc<PgFloor>),
    /// The etcd floor: the plainest etcd lock, a put-if-absent transaction
    /// on the key and a lease granted once, retried at once while held, and
    /// an owner-checked delete; no library (which queues entries instead).
    EtcdFloor(Arc<EtcdFloor>),
    /// The ZooKeeper floor: create an ephemeral node named after the key,
    /// retried at once while it exists, then delete it; no library.
    ZkFloor(Arc<ZkFloor>),
}

/// A lock held through distributed-lock.
pub(crate) enum PeerHandle {
    Redis(distributed_lock_redis::RedisLockHandle),
    Postgres(distributed_lock_postgres::handle::PostgresLockHandle),
    MySql(distributed_lock_mysql::MySqlLockHandle),
}

impl PeerHandle {
    pub(crate) async fn release(self) -> Result<(), Error> {
        use distributed_lock_core::traits::LockHandle;
        match self {
            PeerHandle::Redis(handle) => handle.release().await?,
            PeerHandle::Postgres(handle) => handle.release().await?,
            PeerHandle::MySql(handle) => handle.release().await?,
        }
        Ok(())
    }
}

#[distributed_lock(key = "{key}", ttl = "30s")]
pub(crate) async fn attribute_section(key: &str, called: Instant) -> Duration {
    let waited = called.elapsed();
    work();
    waited
}

/// The attribute around an empty body, timing its wait as
/// [`Lib::with_lock`] does: what it adds to a lock, alone
/// (`--profile-overhead`).
#[distributed_lock(key = "{key}", ttl = "30s")]
pub(crate) async fn attribute_empty(key: &str, called: Instant) -> Duration {
    called.elapsed()
}

impl Lib {
    /// One critical section on `key`; returns how long acquiring took.
    pub(crate) async fn section(&self, key: &str) -> Result<Duration, Error> {
        if let Lib::Attribute = self {
            return Ok(attribute_section(key, Instant::now()).await?);
        }
        let (waited, ()) = self.with_lock(key, async { work() }).await?;
        Ok(waited)
    }

    /// Runs `body` holding `key`'s lock; returns how long acquiring took
    /// and what `body` returned.
    pub(crate) async fn with_lock<T>(
        &self,
        key: &str,
        body: impl Future<Output = T>,
    ) -> Result<(Duration, T), Error> {
        let called = Instant::now();
        match self {
            Lib::Floor(conn) => {
                let mut conn = conn.clone();
                let token = floor_acquire(&mut conn, key).await?;
                let waited = called.elapsed();
                let out = body.await;
                floor_release(&mut conn, key, &token).await?;
                Ok((waited, out))
            }
            Lib::Ours(registry) => {
                let guard = registry.lock(key, LockOptions::default().ttl(TTL)).await?;
                let waited = called.elapsed();
                let out = body.await;
                guard.release().await?;
                Ok((waited, out))
            }
            Lib::Rslock(manager) => {
                let lock = manager
                    .acquire_no_guard(key, TTL)
                    .await
                    .map_err(|e| format!("rslock: {e:?}"))?;
                let waited = called.elapsed();
                let out = body.await;
                manager.unlock(&lock).await;
                Ok((waited, out))
            }
            Lib::PeerRedis(_) | Lib::PeerPostgres(_) | Lib::PeerMySql(_) => {
                let handle = self.peer_acquire(key).await?;
                let waited = called.elapsed();
                let out = body.await;
                handle.release().await?;
                Ok((waited, out))
            }
            Lib::TokioMutex(map) => {
                let mutex = map
                    .lock()
                    .expect("map")
                    .entry(key.to_owned())
                    .or_default()
                    .clone();
                let guard = mutex.lock().await;
                let waited = called.elapsed();
                let out = body.await;
                drop(guard);
                Ok((waited, out))
            }
            Lib::Attribute => Err("the attribute runs its own body".into()),
            Lib::Raw(store) => {
                let loss = lock_runtime::store::LossSignal::new();
                let request = lock_runtime::store::AcquireRequest::new(
                    key,
                    lock_runtime::store::LockToken::random(),
                    TTL,
                    &loss,
                );
                let lock_runtime::store::Acquire::Acquired { mut lease, .. } =
                    store.acquire(request).await?
                else {
                    return Err("held".into());
                };
                let waited = called.elapsed();
                let out = body.await;
                lease.release(Duration::ZERO).await?;
                Ok((waited, out))
            }
            Lib::PgFloor(_) | Lib::MySqlFloor(_) | Lib::EtcdFloor(_) | Lib::ZkFloor(_) => {
                let token = self.store_floor_acquire(key).await?;
                let waited = called.elapsed();
                let out = body.await;
                self.store_floor_release(key, &token).await?;
                Ok((waited, out))
            }
        }
    }

    /// distributed-lock's acquire. Its Redis acquire is one attempt (a
    /// held key is `Timeout`), so like the floor it is retried at once.
    pub(crate) async fn peer_acquire(&self, key: &str) -> Result<PeerHandle, Error> {
        use distributed_lock_core::error::LockError;
        use distributed_lock_core::traits::{DistributedLock, LockProvider};
        match self {
            Lib::PeerRedis(provider) => {
                let lock = provider.create_lock(key);
                loop {
                    match lock.acquire(None).await {
                        Err(LockError::Timeout(_)) => continue,
                        other => return Ok(PeerHandle::Redis(other?)),
                    }
                }
            }
            Lib::PeerPostgres(provider) => Ok(PeerHandle::Postgres(
                provider.create_lock(key).acquire(None).await?,
            )),
            // No timeout is `GET_LOCK(name, -1)`, which MariaDB refuses
            // (NULL, warning 1411): an hour stands for "wait".
            Lib::PeerMySql(provider) => Ok(PeerHandle::MySql(
                provider
                    .create_lock(key)
                    .acquire(Some(Duration::from_secs(3600)))
                    .await?,
            )),
            _ => Err("not distributed-lock".into()),
        }
    }

    /// The PostgreSQL or etcd floor's acquire; returns the token.
    pub(crate) async fn store_floor_acquire(&self, key: &str) -> Result<String, Error> {
        match self {
            Lib::PgFloor(floor) => floor.acquire(key).await,
            Lib::MySqlFloor(floor) => floor.acquire(key).await,
            Lib::EtcdFloor(floor) => floor.acquire(key).await,
            Lib::ZkFloor(floor) if floor.queued => floor.acquire_queued(key).await,
            Lib::ZkFloor(floor) => floor.acquire(key).await,
            _ => Err("not a store floor".into()),
        }
    }

    /// The PostgreSQL or etcd floor's owner-checked delete.
    pub(crate) async fn store_floor_release(&self, key: &str, token: &str) -> Result<(), Error> {
        match self {
            Lib::PgFloor(floor) => floor.release(key, token).await,
            Lib::MySqlFloor(floor) => floor.release(key, token).await,
            Lib::EtcdFloor(floor) => floor.release(key, token).await,
            Lib::ZkFloor(floor) => floor.release(token).await,
            _ => Err("not a store floor".into()),
        }
    }
}

/// Builds a contender by name in a worker process.
pub(crate) async fn make_lib(name: &str, url: &str) -> Result<Lib, Error> {
    Ok(match name {
        "floor" => Lib::Floor(
            redis::Client::open(url)?
                .get_multiplexed_async_connection()
                .await?,
        ),
        "lock-runtime" => Lib::Ours(LockRegistry::redis(url).await?),
        "lock-runtime-fair" => Lib::Ours(
            LockRegistry::builder(
                lock_runtime::RedisStore::builder(url)
                    .fair(FAIR_GRANT_TIMEOUT)
                    .connect()
                    .await?,
            )
            .build()?,
        ),
        "lock-runtime-unfenced" => Lib::Ours(LockRegistry::new(
            lock_runtime::RedisStore::builder(url)
                .fencing(lock_runtime::store::redis::Fencing::Off)
                .connect()
                .await?,
        )),
        "raw" => Lib::Raw(Arc::new(
            lock_runtime::RedisStore::builder(url).connect().await?,
        )),
        "raw-nofence" => Lib::Raw(Arc::new(
            lock_runtime::RedisStore::builder(url)
                .fencing(lock_runtime::store::redis::Fencing::Off)
                .connect()
                .await?,
        )),
        "rslock" => Lib::Rslock(rslock::LockManager::new(vec![url.to_owned()])),
        "distributed-lock" => Lib::PeerRedis(Arc::new(
            distributed_lock_redis::RedisLockProvider::builder()
                .url(url)
                .expiry(TTL)
                .build()
                .await?,
        )),
        "pg-distributed-lock" => Lib::PeerPostgres(Arc::new(
            distributed_lock_postgres::PostgresLockProvider::builder()
                .connection_string(url)
                .build()
                .await?,
        )),
        "memory" => Lib::Ours(LockRegistry::memory()),
        "tokio-mutex" => Lib::TokioMutex(Arc::default()),
        "attribute" => {
            lock_runtime::init(LockRegistry::memory())?;
            Lib::Attribute
        }
        "pg-floor" => Lib::PgFloor(Arc::new(PgFloor::connect(url).await?)),
        "pg-lock-runtime" => Lib::Ours(LockRegistry::postgres(url).await?),
        "pg-raw" => Lib::Raw(Arc::new(
            lock_runtime::PostgresStore::builder(url).connect().await?,
        )),
        "mysql-floor" => Lib::MySqlFloor(Arc::new(MySqlFloor::connect(url).await?)),
        "mysql-lock-runtime" => Lib::Ours(LockRegistry::mysql(url).await?),
        "mysql-raw" => Lib::Raw(Arc::new(
            lock_runtime::MySqlStore::builder(url).connect().await?,
        )),
        "mysql-distributed-lock" => Lib::PeerMySql(Arc::new(
            distributed_lock_mysql::MySqlLockProvider::builder()
                .connection_string(url)
                .build()
                .await?,
        )),
        "etcd-floor" | "etcd-watch-floor" => Lib::EtcdFloor(Arc::new(
            EtcdFloor::connect(url, name == "etcd-watch-floor").await?,
        )),
        "etcd-lock-runtime" => {
            let endpoints: Vec<&str> = url.split(',').collect();
            Lib::Ours(LockRegistry::etcd(&endpoints).await?)
        }
        "etcd-raw" => {
            let endpoints: Vec<&str> = url.split(',').collect();
            Lib::Raw(Arc::new(
                lock_runtime::EtcdStore::builder(&endpoints)
                    .connect()
                    .await?,
            ))
        }
        "zk-floor" => Lib::ZkFloor(Arc::new(ZkFloor::connect(url).await?)),
        "zk-queue-floor" | "zk-multi-floor" => {
            let floor = ZkFloor::connect(url).await?;
            Lib::ZkFloor(Arc::new(ZkFloor {
                queued: true,
                multi: name == "zk-multi-floor",
                ..floor
            }))
        }
        "zk-lock-runtime" => Lib::Ours(LockRegistry::zookeeper(url).await?),
        "zk-raw" => Lib::Raw(Arc::new(
            lock_runtime::ZooKeeperStore::builder(url).connect().await?,
        )),
        other => return Err(format!("unknown contender {other}").into()),
    })
}
