//! Semaphores and read-write locks (rows 21-24, 29-30): 16 tasks on one key, a
//! semaphore of 4, and a read-write lock taken for reading 9 times in 10;
//! lock-runtime beside each store's floor and distributed-lock where it
//! has the lock type.

use distributed_lock_core::traits::{
    DistributedReaderWriterLock, DistributedSemaphore, LockHandle, ReaderWriterLockProvider,
    SemaphoreProvider,
};
use lock_runtime::Access;
use std::future::Future;

use super::*;

/// How many tasks share the key.
const TASKS: usize = 16;

/// The semaphore's limit.
const PERMITS: u32 = 4;

/// One section of a claim scenario: a permit of [`PERMITS`], or a read (or
/// every tenth, a write).
#[derive(Clone, Copy)]
enum Want {
    Permit,
    Read,
    Write,
}

/// A contender for the claim rows.
#[derive(Clone)]
enum ClaimLib {
    Ours(LockRegistry),
    /// Redis without a library: a sorted set of holders by expiry (and a
    /// writer's string key), one script per attempt retried at once while
    /// refused, `ZREM` or an owner-checked `DEL` to release.
    RedisFloor(MultiplexedConnection),
    /// PostgreSQL without a library: lock-runtime's claim and unclaim
    /// functions called directly, a plain insert-or-take-over for a
    /// writer, retried at once while refused.
    PgFloor(Arc<tokio_postgres::Client>),
    /// MySQL without a library: lock-runtime's claim and unclaim procedures
    /// called directly, a plain insert-or-take-over for a writer, retried
    /// at once while refused, on a pool as large as the library's.
    MySqlFloor(mysql_async::Pool),
    PeerRedis(Arc<distributed_lock_redis::RedisLockProvider>),
    PeerPostgres(Arc<distributed_lock_postgres::PostgresLockProvider>),
    PeerMySql(Arc<distributed_lock_mysql::MySqlLockProvider>),
}

/// The MySQL floor's writer: takes the key's lease row over when it has
/// expired (a row of shares or permits ends with its last holder).
const MYSQL_WRITE: &str = "INSERT INTO lock_leases (id, lock_key, token, fencing, expires_at)
    VALUES (UNHEX(SHA2(?, 256)), ?, ?, LAST_INSERT_ID(1), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)
    ON DUPLICATE KEY UPDATE
        fencing = IF(expires_at <= UTC_TIMESTAMP(6), LAST_INSERT_ID(fencing + 1),
                     fencing + 0 * LAST_INSERT_ID(0)),
        token = IF(expires_at <= UTC_TIMESTAMP(6), VALUES(token), token),
        expires_at = IF(token = VALUES(token), VALUES(expires_at), expires_at)";

static REDIS_CLAIM: std::sync::LazyLock<redis::Script> = std::sync::LazyLock::new(|| {
    redis::Script::new(
        "local t = redis.call('TIME')
         local now = t[1] * 1000 + math.floor(t[2] / 1000)
         redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
         if ARGV[2] == 'w' then
           if redis.call('ZCARD', KEYS[1]) > 0 then return 0 end
           if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[3]) then return 1 end
           return 0
         end
         if ARGV[2] == 'r' then
           if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
         elseif redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then
           return 0
         end
         redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
         return 1",
    )
});

impl ClaimLib {
    async fn make(name: &str, url: &str) -> Result<ClaimLib, Error> {
        Ok(match name {
            "lock-runtime" if url.starts_with("redis") => {
                ClaimLib::Ours(LockRegistry::redis(url).await?)
            }
            "lock-runtime" if url.starts_with("mysql") => {
                ClaimLib::Ours(LockRegistry::mysql(url).await?)
            }
            "lock-runtime" => ClaimLib::Ours(LockRegistry::postgres(url).await?),
            "floor" if url.starts_with("redis") => ClaimLib::RedisFloor(
                redis::Client::open(url)?
                    .get_multiplexed_async_connection()
                    .await?,
            ),
            "floor" if url.starts_with("mysql") => {
                // The procedures and table are lock-runtime's, made by it.
                drop(LockRegistry::mysql(url).await?);
                ClaimLib::MySqlFloor(crate::floors::MySqlFloor::pool(url)?)
            }
            "floor" => {
                // The functions and table are lock-runtime's, made by it.
                drop(LockRegistry::postgres(url).await?);
                let (client, connection) =
                    tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
                tokio::spawn(connection);
                ClaimLib::PgFloor(Arc::new(client))
            }
            "distributed-lock" if url.starts_with("redis") => ClaimLib::PeerRedis(Arc::new(
                distributed_lock_redis::RedisLockProvider::builder()
                    .url(url)
                    .build()
                    .await?,
            )),
            // Its read-write lock reads the key's state on a second pooled
            // connection while its transaction holds one: on its default
            // pool (10) 16 tasks wait on each other until the pool times
            // out, so it gets two connections per task.
            "distributed-lock" if url.starts_with("mysql") => ClaimLib::PeerMySql(Arc::new(
                distributed_lock_mysql::MySqlLockProvider::builder()
                    .pool(
                        sqlx::mysql::MySqlPoolOptions::new()
                            .max_connections(2 * TASKS as u32 + 2)
                            .connect(url)
                            .await?,
                    )
                    .build()
                    .await?,
            )),
            "distributed-lock" => ClaimLib::PeerPostgres(Arc::new(
                distributed_lock_postgres::PostgresLockProvider::builder()
                    .connection_string(url)
                    .build()
                    .await?,
            )),
            other => return Err(format!("no claim contender `{other}`").into()),
        })
    }

    /// One section on `key`; how long acquiring took.
    async fn section(&self, key: &str, want: Want) -> Result<Duration, Error> {
        let called = Instant::now();
        match self {
            ClaimLib::Ours(registry) => {
                let options = LockOptions::default().ttl(TTL);
                let options = match want {
                    Want::Permit => options.permits(PERMITS),
                    Want::Read => options.access(Access::Read),
                    Want::Write => options.access(Access::Write),
                };
                let guard = registry.lock(key, options).await?;
                let waited = called.elapsed();
                work();
                guard.release().await?;
                Ok(waited)
            }
            ClaimLib::RedisFloor(conn) => {
                let mut conn = conn.clone();
                let token = format!("{:032x}", rand_u128());
                let (set, writer) = (format!("{key}:holders"), format!("{key}:writer"));
                let mode = match want {
                    Want::Permit => PERMITS.to_string(),
                    Want::Read => "r".to_owned(),
                    Want::Write => "w".to_owned(),
                };
                loop {
                    let granted: i64 = REDIS_CLAIM
                        .key(&set)
                        .key(&writer)
                        .arg(&token)
                        .arg(&mode)
                        .arg(TTL.as_millis() as u64)
                        .invoke_async(&mut conn)
                        .await?;
                    if granted == 1 {
                        break;
                    }
                }
                let waited = called.elapsed();
                work();
                if let Want::Write = want {
                    let _: i64 = RELEASE
                        .key(&writer)
                        .arg(&token)
                        .invoke_async(&mut conn)
                        .await?;
                } else {
                    let _: i64 = redis::cmd("ZREM")
                        .arg(&set)
                        .arg(&token)
                        .query_async(&mut conn)
                        .await?;
                }
                Ok(waited)
            }
            ClaimLib::PgFloor(client) => {
                let token = format!("{:032x}", rand_u128());
                let id = key.as_bytes();
                let ttl = TTL.as_millis() as i64;
                if let Want::Write = want {
                    loop {
                        let rows = client
                            .query(
                                "INSERT INTO lock_leases AS l (id, key, token, fencing, expires_at)
                                 VALUES ($1, $1, $2, nextval('lock_leases_fencing'),
                                         clock_timestamp() + $3::bigint * interval '1 millisecond')
                                 ON CONFLICT (id) DO UPDATE SET token = excluded.token,
                                     fencing = excluded.fencing, expires_at = excluded.expires_at
                                 WHERE l.expires_at <= clock_timestamp()
                                 RETURNING fencing",
                                &[&id, &token, &ttl],
                            )
                            .await?;
                        if !rows.is_empty() {
                            break;
                        }
                    }
                    let waited = called.elapsed();
                    work();
                    client
                        .execute(
                            "DELETE FROM lock_leases WHERE id = $1 AND token = $2",
                            &[&id, &token],
                        )
                        .await?;
                    return Ok(waited);
                }
                let (claim, limit) = match want {
                    Want::Permit => (format!("*permits:{PERMITS}"), PERMITS as i32),
                    _ => ("*shared".to_owned(), 0),
                };
                loop {
                    let row = client
                        .query_one(
                            "SELECT answer FROM lock_leases_claim($1, $1, $2, $3, $4, $5, 0, false)",
                            &[&id, &token, &ttl, &claim, &limit],
                        )
                        .await?;
                    if row.get::<_, i32>(0) == 1 {
                        break;
                    }
                }
                let waited = called.elapsed();
                work();
                client
                    .execute(
                        "SELECT lock_leases_unclaim($1, $2, 0, true, 'lock_leases_released')",
                        &[&id, &token],
                    )
                    .await?;
                Ok(waited)
            }
            ClaimLib::MySqlFloor(pool) => {
                use mysql_async::prelude::Queryable;
                let token = format!("{:032x}", rand_u128());
                let ttl = TTL.as_micros() as u64;
                if let Want::Write = want {
                    loop {
                        let mut conn = pool.get_conn().await?;
                        match conn.exec_drop(MYSQL_WRITE, (key, key, &token, ttl)).await {
                            // Two first inserts of one key can deadlock: the
                            // server rolls one back, and it is held.
                            Err(mysql_async::Error::Server(err)) if err.code == 1213 => continue,
                            other => other?,
                        }
                        if conn.last_insert_id().is_some_and(|id| id > 0) {
                            break;
                        }
                    }
                    let waited = called.elapsed();
                    work();
                    pool.get_conn()
                        .await?
                        .exec_drop(
                            "DELETE FROM lock_leases WHERE id = UNHEX(SHA2(?, 256)) AND token = ?",
                            (key, &token),
                        )
                        .await?;
                    return Ok(waited);
                }
                let (claim, limit) = match want {
                    Want::Permit => (format!("*permits:{PERMITS}"), PERMITS),
                    _ => ("*shared".to_owned(), 0),
                };
                loop {
                    let mut conn = pool.get_conn().await?;
                    let answer: Option<(i32, u64, Option<Vec<u8>>)> = match conn
                        .exec_first(
                            "CALL lock_leases_claim_v2(UNHEX(SHA2(?, 256)), ?, ?, ?, ?, ?, 0)",
                            (key, key, &token, ttl, &claim, limit),
                        )
                        .await
                    {
                        Err(mysql_async::Error::Server(err)) if err.code == 1213 => continue,
                        other => other?,
                    };
                    if answer.is_some_and(|(answer, _, _)| answer == 1) {
                        break;
                    }
                }
                let waited = called.elapsed();
                work();
                let _: Option<i32> = pool
                    .get_conn()
                    .await?
                    .exec_first(
                        "CALL lock_leases_unclaim_v2(UNHEX(SHA2(?, 256)), ?, 0, 1)",
                        (key, &token),
                    )
                    .await?;
                Ok(waited)
            }
            ClaimLib::PeerRedis(_) | ClaimLib::PeerPostgres(_) | ClaimLib::PeerMySql(_) => {
                let handle = self.peer_acquire(key, want).await?;
                let waited = called.elapsed();
                work();
                handle.release().await?;
                Ok(waited)
            }
        }
    }
}

/// A permit, read or write lock held through distributed-lock.
enum PeerClaim {
    Permit(distributed_lock_redis::semaphore::RedisSemaphoreHandle),
    RedisRead(distributed_lock_redis::rw_lock::RedisReadLockHandle),
    RedisWrite(distributed_lock_redis::rw_lock::RedisWriteLockHandle),
    PgRead(distributed_lock_postgres::rw_lock::PostgresReadLockHandle),
    PgWrite(distributed_lock_postgres::rw_lock::PostgresWriteLockHandle),
    MySqlRead(distributed_lock_mysql::rw_lock::MySqlReadLockHandle),
    MySqlWrite(distributed_lock_mysql::rw_lock::MySqlWriteLockHandle),
}

impl PeerClaim {
    async fn release(self) -> Result<(), Error> {
        match self {
            PeerClaim::Permit(handle) => handle.release().await?,
            PeerClaim::RedisRead(handle) => handle.release().await?,
            PeerClaim::RedisWrite(handle) => handle.release().await?,
            PeerClaim::PgRead(handle) => handle.release().await?,
            PeerClaim::PgWrite(handle) => handle.release().await?,
            PeerClaim::MySqlRead(handle) => handle.release().await?,
            PeerClaim::MySqlWrite(handle) => handle.release().await?,
        }
        Ok(())
    }
}

/// Retries `attempt` at once while it times out: distributed-lock's Redis
/// acquire without a timeout is one attempt (a held key is `Timeout`), as
/// its mutex row retries it.
async fn at_once<T, F>(mut attempt: impl FnMut() -> F) -> Result<T, Error>
where
    F: Future<Output = distributed_lock_core::error::LockResult<T>>,
{
    loop {
        match attempt().await {
            Err(distributed_lock_core::error::LockError::Timeout(_)) => continue,
            other => return Ok(other?),
        }
    }
}

impl ClaimLib {
    async fn peer_acquire(&self, key: &str, want: Want) -> Result<PeerClaim, Error> {
        Ok(match (self, want) {
            (ClaimLib::PeerRedis(provider), Want::Permit) => {
                let semaphore = provider.create_semaphore(key, PERMITS);
                PeerClaim::Permit(at_once(|| semaphore.acquire(None)).await?)
            }
            (ClaimLib::PeerRedis(provider), Want::Read) => {
                let lock = provider.create_reader_writer_lock(key);
                PeerClaim::RedisRead(at_once(|| lock.acquire_read(None)).await?)
            }
            (ClaimLib::PeerRedis(provider), Want::Write) => {
                let lock = provider.create_reader_writer_lock(key);
                PeerClaim::RedisWrite(at_once(|| lock.acquire_write(None)).await?)
            }
            (ClaimLib::PeerPostgres(provider), Want::Write) => {
                let lock = provider.create_reader_writer_lock(key);
                PeerClaim::PgWrite(at_once(|| lock.acquire_write(None)).await?)
            }
            (ClaimLib::PeerPostgres(provider), _) => {
                let lock = provider.create_reader_writer_lock(key);
                PeerClaim::PgRead(at_once(|| lock.acquire_read(None)).await?)
            }
            (ClaimLib::PeerMySql(provider), Want::Write) => {
                let lock = provider.create_reader_writer_lock(key);
                PeerClaim::MySqlWrite(at_once(|| lock.acquire_write(None)).await?)
            }
            (ClaimLib::PeerMySql(provider), _) => {
                let lock = provider.create_reader_writer_lock(key);
                PeerClaim::MySqlRead(at_once(|| lock.acquire_read(None)).await?)
            }
            _ => return Err("not distributed-lock".into()),
        })
    }
}

/// [`TASKS`] tasks of `ops` sections each on one fresh key: permits, or
/// reads with every tenth section a write.
async fn run_claims(
    lib: &ClaimLib,
    scenario: &str,
    name: &str,
    semaphore: bool,
    ops: u64,
) -> Result<Measured, Error> {
    let key = format!("bench:{}:claims", rand_u128() as u32);
    measure_tasks(scenario, name, TASKS, ops, |task| {
        let (lib, key) = (lib.clone(), key.clone());
        async move {
            let mut waits = Vec::with_capacity(ops as usize);
            for op in 0..ops {
                let want = match (semaphore, (op as usize + task) % 10) {
                    (true, _) => Want::Permit,
                    (false, 0) => Want::Write,
                    (false, _) => Want::Read,
                };
                waits.push(lib.section(&key, want).await?);
            }
            Ok(waits)
        }
    })
    .await
}

/// The semaphore and read-write rows of one store (`Redis`, `PostgreSQL`
/// or `MySQL`), numbered from `first`; each contender twice,
/// interleaved, keeping its faster run.
pub(crate) async fn claim_rows(
    store: &str,
    url: &str,
    first: usize,
    quick: bool,
) -> Result<Vec<Measured>, Error> {
    let scale = if quick { 10 } else { 1 };
    let ops = if store == "Redis" { 500 } else { 100 } / scale;
    let mut contenders = Vec::new();
    for name in ["floor", "lock-runtime", "distributed-lock"] {
        contenders.push((name, ClaimLib::make(name, url).await?));
    }
    let mut rows = Vec::new();
    for (at, semaphore, what) in [
        (
            first,
            true,
            format!("semaphore of {PERMITS}, {TASKS} tasks, one key"),
        ),
        (
            first + 1,
            false,
            format!("read-write lock, {TASKS} tasks, 90 % reads"),
        ),
    ] {
        let scenario = format!("{at}. {store}: {what}");
        let mut best: HashMap<&str, Measured> = HashMap::new();
        for _ in 0..2 {
            for (name, lib) in &contenders {
                // distributed-lock has no semaphore on PostgreSQL or MySQL.
                if semaphore && matches!(lib, ClaimLib::PeerPostgres(_) | ClaimLib::PeerMySql(_)) {
                    continue;
                }
                let m = run_claims(lib, &scenario, name, semaphore, ops).await?;
                if best
                    .get(name)
                    .is_none_or(|b| m.throughput() > b.throughput())
                {
                    best.insert(name, m);
                }
            }
        }
        for (name, _) in &contenders {
            rows.extend(best.remove(name));
        }
    }
    Ok(rows)
}
