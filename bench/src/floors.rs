//! The floors: each store's plainest lock, with no library, that the library is measured against.

use super::*;

/// A ZooKeeper session and the persistent node the floor's locks live
/// under.
pub(crate) struct ZkFloor {
    pub(crate) client: zookeeper_client::Client,
    /// Locks the recipe's way (a queue) rather than with one node.
    pub(crate) queued: bool,
    /// Queues as the library does: the create and an empty `setData` on
    /// the key's node in one transaction, held when ours is the only child
    /// (profiling only).
    pub(crate) multi: bool,
}

impl ZkFloor {
    pub(crate) const DIR: &str = "/bench-floor";
    pub(crate) const QUEUES: &str = "/bench-queues";

    pub(crate) async fn connect(connect: &str) -> Result<ZkFloor, Error> {
        let client = zookeeper_client::Client::connect(connect).await?;
        let persistent = zookeeper_client::CreateMode::Persistent
            .with_acls(zookeeper_client::Acls::anyone_all());
        client.mkdir(Self::DIR, &persistent).await?;
        client.mkdir(Self::QUEUES, &persistent).await?;
        Ok(ZkFloor {
            client,
            queued: false,
            multi: false,
        })
    }

    pub(crate) fn path(key: &str) -> String {
        format!("{}/{}", Self::DIR, key.replace('/', "%2F"))
    }

    /// Acquires `key` as the queue recipe does, without a library: an
    /// ephemeral sequential child under the key's node and, sent with it,
    /// the listing of the queue; held if ours is the lowest (else deleted
    /// and tried again at once). The token is the child's path.
    pub(crate) async fn acquire_queued(&self, key: &str) -> Result<String, Error> {
        let dir = format!("{}/{}", Self::QUEUES, key.replace('/', "%2F"));
        let sequential = zookeeper_client::CreateMode::EphemeralSequential
            .with_acls(zookeeper_client::Acls::anyone_all());
        let container =
            zookeeper_client::CreateMode::Container.with_acls(zookeeper_client::Acls::anyone_all());
        loop {
            let prefix = format!("{dir}/n-");
            if self.multi {
                let mut multi = self.client.new_multi_writer();
                multi.add_create(&prefix, &[], &sequential)?;
                multi.add_set_data(&dir, &[], None)?;
                match multi.commit().await {
                    Ok(results) => {
                        let mut path = String::new();
                        let mut alone = false;
                        for result in results {
                            match result {
                                zookeeper_client::MultiWriteResult::Create {
                                    path: made, ..
                                } => {
                                    path = made;
                                }
                                zookeeper_client::MultiWriteResult::SetData { stat } => {
                                    alone = stat.num_children == 1;
                                }
                                _ => {}
                            }
                        }
                        if alone {
                            return Ok(path);
                        }
                        self.client.delete(&path, None).await?;
                        continue;
                    }
                    Err(zookeeper_client::MultiWriteError::OperationFailed {
                        source: zookeeper_client::Error::NoNode,
                        ..
                    }) => match self.client.create(&dir, &[], &container).await {
                        Ok(_) | Err(zookeeper_client::Error::NodeExists) => continue,
                        Err(err) => return Err(err.into()),
                    },
                    Err(err) => return Err(err.to_string().into()),
                }
            }
            let create = self.client.create(&prefix, &[], &sequential);
            let list = self.client.list_children(&dir);
            let (created, listed) = tokio::join!(create, list);
            let sequence = match created {
                Ok((_, sequence)) => sequence,
                Err(zookeeper_client::Error::NoNode) => {
                    match self.client.create(&dir, &[], &container).await {
                        Ok(_) | Err(zookeeper_client::Error::NodeExists) => continue,
                        Err(err) => return Err(err.into()),
                    }
                }
                Err(err) => return Err(err.into()),
            };
            let name = format!("n-{sequence}");
            let path = format!("{dir}/{name}");
            let lowest = listed?.into_iter().min_by_key(|child| child.clone());
            if lowest.as_deref() == Some(name.as_str()) {
                return Ok(path);
            }
            self.client.delete(&path, None).await?;
        }
    }

    /// Acquires `key`, retried at once while held; the token is the path.
    pub(crate) async fn acquire(&self, key: &str) -> Result<String, Error> {
        let path = Self::path(key);
        let ephemeral =
            zookeeper_client::CreateMode::Ephemeral.with_acls(zookeeper_client::Acls::anyone_all());
        loop {
            match self.client.create(&path, &[], &ephemeral).await {
                Ok(_) => return Ok(path),
                Err(zookeeper_client::Error::NodeExists) => {}
                Err(err) => return Err(err.into()),
            }
        }
    }

    pub(crate) async fn release(&self, path: &str) -> Result<(), Error> {
        self.client.delete(path, None).await?;
        Ok(())
    }
}

/// An etcd client and one long lease for every lock the floor takes.
pub(crate) struct EtcdFloor {
    pub(crate) kv: etcd_client::KvClient,
    pub(crate) lease: i64,
    /// Waits for the key's deletion between attempts, as the library does,
    /// rather than retrying at once (the hand-off row's watching floor).
    pub(crate) watch: Option<etcd_client::WatchClient>,
}

impl EtcdFloor {
    /// Connects to the comma-separated `endpoints` and grants the lease;
    /// `watching` makes the watching floor.
    pub(crate) async fn connect(endpoints: &str, watching: bool) -> Result<EtcdFloor, Error> {
        let endpoints: Vec<&str> = endpoints.split(',').collect();
        let client = etcd_client::Client::connect(&endpoints, None).await?;
        // Longer than any run: the floor never renews.
        let lease = client.lease_client().grant(3_600, None).await?.id();
        Ok(EtcdFloor {
            kv: client.kv_client(),
            lease,
            watch: watching.then(|| client.watch_client()),
        })
    }

    /// Acquires `key`, retried at once while held (or, watching, once the
    /// key is deleted); returns the token.
    pub(crate) async fn acquire(&self, key: &str) -> Result<String, Error> {
        use etcd_client::{Compare, CompareOp, EventType, PutOptions, Txn, TxnOp, WatchOptions};
        let token = format!("{:032x}", rand_u128());
        let key = format!("locks/{key}");
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.as_str(),
                token.as_str(),
                Some(PutOptions::new().with_lease(self.lease)),
            )])
            .or_else([TxnOp::get(key.as_str(), None)]);
        loop {
            let answer = self.kv.clone().txn(txn.clone()).await?;
            if answer.succeeded() {
                return Ok(token);
            }
            let Some(watch) = &self.watch else {
                continue;
            };
            // From the revision after the refusal: no deletion is missed.
            let after = answer.header().map_or(0, |header| header.revision()) + 1;
            let options = WatchOptions::new().with_start_revision(after);
            let mut events = watch.clone().watch(key.as_str(), Some(options)).await?;
            while let Some(message) = events.message().await? {
                let deleted = message
                    .events()
                    .iter()
                    .any(|event| event.event_type() == EventType::Delete);
                if deleted {
                    break;
                }
            }
        }
    }

    pub(crate) async fn release(&self, key: &str, token: &str) -> Result<(), Error> {
        use etcd_client::{Compare, CompareOp, Txn, TxnOp};
        let key = format!("locks/{key}");
        let txn = Txn::new()
            .when([Compare::value(key.as_str(), CompareOp::Equal, token)])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        self.kv.clone().txn(txn).await?;
        Ok(())
    }
}

/// A PostgreSQL session with the floor's two statements prepared.
pub(crate) struct PgFloor {
    pub(crate) client: tokio_postgres::Client,
    pub(crate) acquire: tokio_postgres::Statement,
    pub(crate) release: tokio_postgres::Statement,
}

impl PgFloor {
    pub(crate) async fn connect(url: &str) -> Result<PgFloor, Error> {
        let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        client
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS floor_leases (id text PRIMARY KEY, token text NOT NULL,
                     fencing bigint NOT NULL, expires_at timestamptz NOT NULL);
                 CREATE SEQUENCE IF NOT EXISTS floor_fencing;",
            )
            .await?;
        let acquire = client
            .prepare(
                "INSERT INTO floor_leases AS l (id, token, fencing, expires_at)
                 VALUES ($1, $2, nextval('floor_fencing'), clock_timestamp() + $3::bigint * interval '1 millisecond')
                 ON CONFLICT (id) DO UPDATE SET token = excluded.token, fencing = excluded.fencing,
                     expires_at = excluded.expires_at
                 WHERE l.expires_at <= clock_timestamp()
                 RETURNING fencing",
            )
            .await?;
        let release = client
            .prepare("DELETE FROM floor_leases WHERE id = $1 AND token = $2")
            .await?;
        Ok(PgFloor {
            client,
            acquire,
            release,
        })
    }

    /// Acquires `key`, retried at once while held; returns the token.
    pub(crate) async fn acquire(&self, key: &str) -> Result<String, Error> {
        let token = format!("{:032x}", rand_u128());
        let ttl = TTL.as_millis() as i64;
        loop {
            let rows = self
                .client
                .query(&self.acquire, &[&key, &token, &ttl])
                .await?;
            if !rows.is_empty() {
                return Ok(token);
            }
        }
    }

    pub(crate) async fn release(&self, key: &str, token: &str) -> Result<(), Error> {
        self.client.execute(&self.release, &[&key, &token]).await?;
        Ok(())
    }
}

/// The MySQL floor: the library's statements by hand, on a pool as large
/// as the library's (8 connections): the insert-or-take-over of a lease
/// row, its fencing value drawn in the same statement, retried at once
/// while held, and an owner-checked release that keeps the row free (as
/// the library's does, so that a key's fencing values only grow).
pub(crate) struct MySqlFloor {
    pub(crate) pool: mysql_async::Pool,
}

impl MySqlFloor {
    const ACQUIRE: &str = "INSERT INTO floor_leases (id, token, fencing, expires_at)
        VALUES (UNHEX(SHA2(?, 256)), ?, LAST_INSERT_ID(1), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
        ON DUPLICATE KEY UPDATE
            fencing = IF(expires_at <= UTC_TIMESTAMP(6), LAST_INSERT_ID(fencing + 1),
                         fencing + 0 * LAST_INSERT_ID(0)),
            token = IF(expires_at <= UTC_TIMESTAMP(6), ?, token),
            expires_at = IF(token = ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, expires_at)";
    const RELEASE: &str =
        "UPDATE floor_leases SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND
        WHERE id = UNHEX(SHA2(?, 256)) AND token = ? AND expires_at > UTC_TIMESTAMP(6)";

    /// A pool like the library's: 1 to 8 connections over TCP, kept a
    /// minute when idle, not reset when returned.
    pub(crate) fn pool(url: &str) -> Result<mysql_async::Pool, Error> {
        let opts = mysql_async::OptsBuilder::from_opts(mysql_async::Opts::from_url(url)?)
            .prefer_socket(false)
            .pool_opts(
                mysql_async::PoolOpts::default()
                    .with_constraints(mysql_async::PoolConstraints::new(1, 8).expect("1 <= 8"))
                    .with_inactive_connection_ttl(Duration::from_secs(60))
                    .with_reset_connection(false),
            );
        Ok(mysql_async::Pool::new(opts))
    }

    pub(crate) async fn connect(url: &str) -> Result<MySqlFloor, Error> {
        use mysql_async::prelude::Queryable;
        let pool = Self::pool(url)?;
        pool.get_conn()
            .await?
            .query_drop(
                "CREATE TABLE IF NOT EXISTS floor_leases (id BINARY(32) PRIMARY KEY,
                     token VARBINARY(40) NOT NULL, fencing BIGINT UNSIGNED NOT NULL,
                     expires_at DATETIME(6) NOT NULL) ENGINE=InnoDB",
            )
            .await?;
        Ok(MySqlFloor { pool })
    }

    /// Acquires `key`, retried at once while held; returns the token.
    pub(crate) async fn acquire(&self, key: &str) -> Result<String, Error> {
        use mysql_async::prelude::Queryable;
        let token = format!("{:032x}", rand_u128());
        let ttl = TTL.as_micros() as u64;
        loop {
            let mut conn = self.pool.get_conn().await?;
            match conn
                .exec_drop(Self::ACQUIRE, (key, &token, ttl, &token, &token, ttl))
                .await
            {
                // Two first inserts of one key can deadlock: the server
                // rolls one back, and it is held, as the library reads it.
                Err(mysql_async::Error::Server(err)) if err.code == 1213 => continue,
                other => other?,
            }
            if conn.last_insert_id().is_some_and(|id| id > 0) {
                return Ok(token);
            }
        }
    }

    pub(crate) async fn release(&self, key: &str, token: &str) -> Result<(), Error> {
        use mysql_async::prelude::Queryable;
        let mut conn = self.pool.get_conn().await?;
        conn.exec_drop(Self::RELEASE, (key, token)).await?;
        Ok(())
    }
}

pub(crate) static RELEASE: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0",
    )
});

/// The floor's acquire: `SET key token NX PX ttl`, retried at once while
/// held; returns the token.
pub(crate) async fn floor_acquire(
    conn: &mut MultiplexedConnection,
    key: &str,
) -> Result<String, Error> {
    let token = format!("{:032x}", rand_u128());
    loop {
        let set: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(TTL.as_millis() as u64)
            .query_async(conn)
            .await?;
        if set.is_some() {
            return Ok(token);
        }
    }
}

/// The floor's release: the owner-checked delete script.
pub(crate) async fn floor_release(
    conn: &mut MultiplexedConnection,
    key: &str,
    token: &str,
) -> Result<(), Error> {
    let _: i64 = RELEASE.key(key).arg(token).invoke_async(conn).await?;
    Ok(())
}
