//! A worker process for the multi-process tests. It prints one event per
//! line on stdout (`acquired fencing=3 at_ms=…`), which the test reads.
//!
//! Usage: `lock-worker SCENARIO LOCK_URL KEY [ARGS…]`, where `LOCK_URL` is
//! a Redis URL, several (Redlock), or a PostgreSQL one; the shared data of
//! the scenarios lives in Redis (`LOCK_WORKER_DATA_URL`, else `LOCK_URL`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::{
    Access, LockError, LockOptions, LockRegistry, distributed_lock, fencing_token,
    fencing_token_for,
};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// One purchase: a non-atomic read, pause, write of the stock level.
async fn sell_one(conn: &mut MultiplexedConnection, item: &str) -> redis::RedisResult<Option<i64>> {
    let level: i64 = conn.get(format!("oversell:{item}:level")).await?;
    if level <= 0 {
        return Ok(None);
    }
    tokio::time::sleep(Duration::from_millis(2)).await;
    let () = conn
        .set(format!("oversell:{item}:level"), level - 1)
        .await?;
    let _: i64 = conn.rpush(format!("oversell:{item}:sold"), level).await?;
    Ok(Some(level))
}

#[distributed_lock(key = "stock:{item}", ttl = "10s")]
async fn buy(conn: &mut MultiplexedConnection, item: &str) -> redis::RedisResult<Option<i64>> {
    sell_one(conn, item).await
}

/// Moves `amount` from account `from` to `to` of the bank `bank`: a
/// non-atomic read, pause, write of both balances, under both accounts'
/// locks, with an overlap detector per account.
#[distributed_lock(keys = ["acct:{bank}:{from}", "acct:{bank}:{to}"], ttl = "10s")]
async fn transfer(
    conn: &mut MultiplexedConnection,
    bank: &str,
    from: u32,
    to: u32,
    amount: i64,
) -> redis::RedisResult<()> {
    for account in [from, to] {
        let inside: i64 = conn
            .incr(format!("bank:{bank}:inside:{account}"), 1)
            .await?;
        if inside != 1 {
            let _: i64 = conn
                .rpush(
                    format!("bank:{bank}:overlaps"),
                    format!("account {account}"),
                )
                .await?;
        }
    }
    let balance = |account: u32| format!("bank:{bank}:balance:{account}");
    let a: i64 = conn.get(balance(from)).await?;
    let b: i64 = conn.get(balance(to)).await?;
    tokio::time::sleep(Duration::from_millis(1)).await;
    let () = conn.set(balance(from), a - amount).await?;
    let () = conn.set(balance(to), b + amount).await?;
    for account in [from, to] {
        let _: i64 = conn
            .decr(format!("bank:{bank}:inside:{account}"), 1)
            .await?;
    }
    Ok(())
}

/// The fencing token of the lock on `key` (the innermost when `None`) this
/// task holds through the attribute, read as a careful body reads it:
/// again while the store cannot be reached (Redis issues it at the first
/// read). `None` once the lease is known lost: the body has no token to
/// write with, and stops.
async fn token_of(key: Option<&str>) -> Option<u64> {
    loop {
        let read = match key {
            Some(key) => fencing_token_for(key).await,
            None => fencing_token().await,
        };
        match read {
            Ok(token) => return Some(token),
            Err(LockError::Store { .. }) => tokio::time::sleep(Duration::from_millis(5)).await,
            Err(_) => return None,
        }
    }
}

async fn hold(hold: Duration) {
    println!(
        "acquired fencing={} at_ms={}",
        fencing_token().await.unwrap_or(0),
        now_ms()
    );
    tokio::time::sleep(hold).await;
    println!("releasing at_ms={}", now_ms());
}

#[distributed_lock(key = "{key}", ttl = "1s")]
async fn hold_1s(key: &str, duration: Duration) {
    let _ = key;
    hold(duration).await;
}

#[distributed_lock(key = "{key}", ttl = "3s")]
async fn hold_3s(key: &str, duration: Duration) {
    let _ = key;
    hold(duration).await;
}

#[distributed_lock(key = "{key}", ttl = "30s")]
async fn hold_30s(key: &str, duration: Duration) {
    let _ = key;
    hold(duration).await;
}

#[distributed_lock(key = "{key}", ttl = "500ms", watchdog = false)]
async fn hold_unrenewed(key: &str, duration: Duration) {
    let _ = key;
    hold(duration).await;
}

#[distributed_lock(key = "{key}", mode = "skip", ttl = "10s")]
async fn run_once(key: &str) {
    println!("ran at_ms={}", now_ms());
}

#[distributed_lock(key = "{key}", ttl = "10s")]
async fn record_fencing(conn: &mut MultiplexedConnection, key: &str) -> redis::RedisResult<u64> {
    let token = fencing_token().await.unwrap_or(0);
    let _: i64 = conn.rpush(format!("fence:{key}"), token).await?;
    Ok(token)
}

/// A section of a semaphore of 3: counts who is inside in the data store
/// (which the lock does not protect) and records what each entry saw.
#[distributed_lock(key = "{key}", permits = 3, ttl = "10s")]
async fn permit_section(conn: &mut MultiplexedConnection, key: &str) -> redis::RedisResult<()> {
    let inside: i64 = conn.incr(format!("sem:{key}:inside"), 1).await?;
    let _: i64 = conn.rpush(format!("sem:{key}:seen"), inside).await?;
    tokio::time::sleep(Duration::from_millis(5)).await;
    let _: i64 = conn.decr(format!("sem:{key}:inside"), 1).await?;
    Ok(())
}

/// Holds one of two permits for `duration`, with a 1 s lease.
#[distributed_lock(key = "{key}", permits = 2, ttl = "1s")]
async fn hold_permit(key: &str, duration: Duration) {
    hold(duration).await;
}

/// A reader's section: counts the readers inside, records what each entry
/// saw, and any writer found inside.
#[distributed_lock(key = "{key}", access = "read", ttl = "10s")]
async fn read_section(conn: &mut MultiplexedConnection, key: &str) -> redis::RedisResult<()> {
    let token = fencing_token().await.unwrap_or(0);
    let _: i64 = conn
        .rpush(format!("rw:{key}:tokens"), format!("r{token}"))
        .await?;
    let readers: i64 = conn.incr(format!("rw:{key}:readers"), 1).await?;
    let writers: i64 = conn.get(format!("rw:{key}:writers")).await.unwrap_or(0);
    let _: i64 = conn.rpush(format!("rw:{key}:seen"), readers).await?;
    if writers != 0 {
        let _: i64 = conn.rpush(format!("rw:{key}:overlaps"), "writer").await?;
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    let _: i64 = conn.decr(format!("rw:{key}:readers"), 1).await?;
    Ok(())
}

/// A writer's section on a read-write lock: says how many readers it
/// found inside (there must be none) and when.
#[distributed_lock(key = "{key}", access = "write", ttl = "10s")]
async fn write_section(conn: &mut MultiplexedConnection, key: &str) -> redis::RedisResult<()> {
    let token = fencing_token().await.unwrap_or(0);
    let _: i64 = conn
        .rpush(format!("rw:{key}:tokens"), format!("w{token}"))
        .await?;
    let _: i64 = conn.incr(format!("rw:{key}:writers"), 1).await?;
    let readers: i64 = conn.get(format!("rw:{key}:readers")).await.unwrap_or(0);
    println!("wrote readers={readers} at_ms={}", now_ms());
    tokio::time::sleep(Duration::from_millis(5)).await;
    let _: i64 = conn.decr(format!("rw:{key}:writers"), 1).await?;
    Ok(())
}

/// Numbers this process's entries into the chaos section.
static ENTRIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A critical section that records entry and exit in the data store; an
/// entry that finds someone inside is an overlap.
///
/// Each entry adds an id of its own to a set and counts the set in one
/// script, and its exit removes the id. `entry` holds the id from before
/// the entry is sent until the exit is done: a body cancelled anywhere in
/// between (a lost lease) leaves it there for the caller to remove, which
/// is harmless if the entry never landed. (A counter, incremented and
/// decremented, leaked a mark when the body was cancelled with its
/// increment in flight, and every later entry then looked like an overlap.)
#[distributed_lock(key = "{key}", ttl = "1s", wait_timeout = "3s")]
async fn chaos_section(
    conn: &mut MultiplexedConnection,
    key: &str,
    entry: &std::sync::Mutex<Option<String>>,
) -> redis::RedisResult<()> {
    let Some(token) = token_of(None).await else {
        return Ok(());
    };
    let id = entry_id();
    *entry.lock().expect("entry") = Some(id.clone());
    let active = enter(conn, &format!("chaos:{key}:inside"), &id).await?;
    if active != 1 {
        let _: i64 = conn
            .rpush(
                format!("chaos:{key}:overlaps"),
                format!("token {token} found {active} inside"),
            )
            .await?;
    }
    let _: i64 = conn.rpush(format!("chaos:{key}:tokens"), token).await?;
    tokio::time::sleep(Duration::from_millis(3)).await;
    let _: i64 = conn.srem(format!("chaos:{key}:inside"), &id).await?;
    *entry.lock().expect("entry") = None;
    Ok(())
}

/// A name for one entry into a section, unique across processes.
fn entry_id() -> String {
    let n = ENTRIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{}-{n}", std::process::id())
}

/// Adds `id` to the set `inside` and says how many are in it now, in one
/// step: more than 1 is an overlap.
async fn enter(
    conn: &mut MultiplexedConnection,
    inside: &str,
    id: &str,
) -> redis::RedisResult<i64> {
    redis::Script::new("redis.call('SADD', KEYS[1], ARGV[1]) return redis.call('SCARD', KEYS[1])")
        .key(inside)
        .arg(id)
        .invoke_async(conn)
        .await
}

/// A section held across several renewals (a 1 s lease, renewed every
/// 333 ms, for 2.1 s), with an overlap detector: a holder whose lease the
/// store took from it while it renewed would get `Lost` or overlap. The
/// body marks itself inside as `id`; a body cancelled by a loss leaves
/// its mark, which its caller takes off (it no longer runs).
#[distributed_lock(key = "{key}", ttl = "1s", wait_timeout = "20s")]
async fn renewed_section(
    conn: &mut MultiplexedConnection,
    key: &str,
    id: &str,
) -> redis::RedisResult<()> {
    let inside = enter(conn, &format!("renewed:{key}:inside"), id).await?;
    if inside != 1 {
        let _: i64 = conn.rpush(format!("renewed:{key}:overlaps"), id).await?;
    }
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let _: i64 = conn.srem(format!("renewed:{key}:inside"), id).await?;
    Ok(())
}

/// One soak body: where it records, who it is, how many 5 ms steps it
/// takes, and the last moment it acted.
struct SoakBody<'a> {
    history: &'a lock_tests::history::Recorder,
    holder: &'a str,
    /// When the attempt that got the lock began.
    asked: u64,
    /// What it claims, as the history writes it: `x`, `s`, `p<N>`.
    claim: &'a str,
    steps: u32,
    last: &'a std::sync::Mutex<u64>,
}

impl SoakBody<'_> {
    /// Says it began on each of `keys` (with each one's fencing token),
    /// then takes its steps, each noted as the last moment it acted. A
    /// body of several keys does not say when it asked (its wait on one
    /// key includes the others'), but that its leases may be held since.
    async fn run(&self, keys: &[String]) {
        use lock_tests::history::now_us;
        // Read before the body begins: one cancelled or lost on the way
        // (a round trip on Redis) never began, and says nothing here.
        let mut tokens = Vec::with_capacity(keys.len());
        for key in keys {
            match token_of(Some(key)).await {
                Some(token) => tokens.push(token),
                None => return,
            }
        }
        let start = now_us();
        *self.last.lock().expect("last") = start;
        for (key, token) in keys.iter().zip(tokens) {
            let asked = if keys.len() == 1 {
                format!(" asked_us={}", self.asked)
            } else {
                format!(" held_from_us={}", self.asked)
            };
            self.history.line(&format!(
                "start key={key} holder={} claim={} fencing={token}{asked} at_us={start}",
                self.holder, self.claim,
            ));
        }
        // Said when the body stops, before the release: run to its end,
        // or cancelled at an `.await` (the future dropped). A process
        // killed during the release, or before a cancelled call returns,
        // dies holding the lease, but no longer acting.
        let _done = Done { body: self, keys };
        for _ in 0..self.steps {
            tokio::time::sleep(Duration::from_millis(5)).await;
            *self.last.lock().expect("last") = now_us();
        }
    }
}

/// Writes a body's `done` lines (its last step) when dropped: at the
/// body's end, or when it is cancelled.
struct Done<'a, 'b> {
    body: &'a SoakBody<'b>,
    keys: &'a [String],
}

impl Drop for Done<'_, '_> {
    fn drop(&mut self) {
        let last = *self.body.last.lock().unwrap_or_else(|p| p.into_inner());
        for key in self.keys {
            self.body.history.line(&format!(
                "done key={key} holder={} at_us={last}",
                self.body.holder
            ));
        }
    }
}

/// The soak's lease length, from its arguments.
static SOAK_TTL: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();

fn soak_ttl() -> Duration {
    *SOAK_TTL.get().expect("the soak's ttl")
}

#[distributed_lock(key = "{key}", ttl = soak_ttl(), wait_timeout = soak_ttl() * 6)]
async fn soak_wait(key: &str, body: &SoakBody<'_>) {
    body.run(&[key.to_owned()]).await;
}

#[distributed_lock(key = "{key}", mode = "skip", ttl = soak_ttl())]
async fn soak_skip(key: &str, body: &SoakBody<'_>) {
    body.run(&[key.to_owned()]).await;
}

#[distributed_lock(keys = ["{a}", "{b}"], ttl = soak_ttl(), wait_timeout = soak_ttl() * 6)]
async fn soak_pair(a: &str, b: &str, body: &SoakBody<'_>) {
    body.run(&[a.to_owned(), b.to_owned()]).await;
}

/// One run of a scheduled job's fire: says in the data store when it
/// started (with how many runs of the job were inside then, itself
/// included) and ended, and takes `run` in between.
async fn job_run(
    conn: &mut MultiplexedConnection,
    job: &str,
    fire: &lock_runtime::job::Fire,
    run: Duration,
) -> redis::RedisResult<()> {
    let (fire, pid) = (epoch_ms(fire.at()), std::process::id());
    let id = format!("{fire}-{pid}");
    let (runs, inside) = (format!("jobs:{job}:runs"), format!("jobs:{job}:inside"));
    let count = enter(conn, &inside, &id).await?;
    let _: i64 = conn
        .rpush(&runs, format!("start {fire} {pid} {} {count}", now_ms()))
        .await?;
    tokio::time::sleep(run).await;
    let _: i64 = conn.srem(&inside, &id).await?;
    let _: i64 = conn
        .rpush(&runs, format!("end {fire} {pid} {}", now_ms()))
        .await?;
    Ok(())
}

fn epoch_ms(at: SystemTime) -> u128 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis())
}

/// The `job` scenario: this replica runs the jobs `specs` names
/// (`suffix:overlap:run_ms,...`, each the job `NAME-suffix`) every
/// `period` with leases of `ttl`, its clock `offset_ms` off, for
/// `seconds`; prints each report.
async fn run_jobs(
    name: &str,
    period: Duration,
    offset_ms: i64,
    seconds: u64,
    specs: &str,
    ttl: Duration,
    data: &redis::Client,
) -> Result<(), LockError> {
    use lock_runtime::job::{Fire, Job, Overlap, Schedule};
    let registry = lock_runtime::registry()?;
    let conn = connection(data).await;
    let offset = Duration::from_millis(offset_ms.unsigned_abs());
    let mut handles = Vec::new();
    for spec in specs.split(',') {
        let parts: Vec<&str> = spec.split(':').collect();
        let [suffix, overlap, run_ms] = parts[..] else {
            panic!("a job spec is suffix:overlap:run_ms, not {spec}");
        };
        let overlap = match overlap {
            "allow" => Overlap::Allow,
            "skip" => Overlap::Skip,
            "wait" => Overlap::Wait,
            other => panic!("unknown overlap {other}"),
        };
        let run = Duration::from_millis(run_ms.parse().expect("run ms"));
        let job_name = format!("{name}-{suffix}");
        let job = Job::new(job_name.clone(), Schedule::every(period))
            .overlap(overlap)
            .ttl(ttl)
            .max_skew(Duration::from_secs(1))
            .replica(std::process::id().to_string())
            .clock(move || {
                if offset_ms < 0 {
                    SystemTime::now() - offset
                } else {
                    SystemTime::now() + offset
                }
            })
            .on_report(|report| {
                println!(
                    "report job={} fire={} replica={} outcome={}",
                    report.job,
                    epoch_ms(report.fire),
                    report.replica,
                    report.outcome.label()
                );
            });
        let conn = conn.clone();
        let job_name: std::sync::Arc<str> = job_name.into();
        handles.push(job.spawn(registry, move |fire: Fire| {
            let (mut conn, job_name) = (conn.clone(), job_name.clone());
            async move { job_run(&mut conn, &job_name, &fire, run).await }
        })?);
    }
    println!("started at_ms={}", now_ms());
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    println!("stopping at_ms={}", now_ms());
    for handle in handles {
        handle.stop().await;
    }
    println!("done");
    Ok(())
}

/// A ShedLock-style scheduled task: one fixed key, skip mode, held at
/// least 1 s.
#[distributed_lock(key = "{key}", mode = "skip", ttl = "30s", hold_at_least = "1s")]
async fn tick(conn: &mut MultiplexedConnection, key: &str, tick: u128) -> redis::RedisResult<()> {
    let _: i64 = conn
        .rpush(
            format!("ticks:{key}:runs"),
            format!("{tick} {}", std::process::id()),
        )
        .await?;
    Ok(())
}

/// The name of `err`'s variant, as the soak's history writes it.
fn error_kind(err: &LockError) -> String {
    let debug = format!("{err:?}");
    debug
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// A connection of its own to the data server.
async fn connection(data: &redis::Client) -> MultiplexedConnection {
    data.get_multiplexed_async_connection()
        .await
        .expect("data connection")
}

fn arg(args: &[String], i: usize, what: &str) -> String {
    args.get(i)
        .cloned()
        .unwrap_or_else(|| panic!("missing argument {i}: {what}"))
}

/// How long a worker keeps trying to reach its store at start-up: a
/// guard against a hang, not a bound under test (a cluster just started on
/// a busy machine may take seconds to answer its first call).
const CONNECT_PATIENCE: Duration = Duration::from_secs(30);

/// The registry over the store `url` names, tried again on
/// [`LockError::Connect`] (each failure said on stderr) until
/// [`CONNECT_PATIENCE`] has passed.
async fn connect(url: &str) -> Result<LockRegistry, LockError> {
    let deadline = tokio::time::Instant::now() + CONNECT_PATIENCE;
    loop {
        match open(url).await {
            Err(err @ LockError::Connect { .. }) if tokio::time::Instant::now() < deadline => {
                eprintln!("lock-worker: {err}; trying again");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            other => return other,
        }
    }
}

/// The registry over the store `url` names.
async fn open(url: &str) -> Result<LockRegistry, LockError> {
    // `memory`: this process's own store; several comma-separated URLs
    // (not a Cluster's or Sentinels'): Redlock over them; `postgres://`: the
    // PostgreSQL store, `mysql://`: the MySQL store, `etcd://host:port,host:port`: the etcd store,
    // `zookeeper://host:port,...?session_ms=N`: the ZooKeeper store (the
    // shared data then needs LOCK_WORKER_DATA_URL), `redis://…?fair_grant_ms=N`:
    // the Redis store in fair mode (the same), `careless+redis://…`: see
    // below.
    Ok(if url == "memory" {
        LockRegistry::memory()
    } else if url.starts_with("postgres://") {
        LockRegistry::postgres(url).await?
    } else if url.starts_with("mysql://") {
        LockRegistry::mysql(url).await?
    } else if let Some(server) = url.strip_prefix("careless+") {
        // `careless+redis://…`: the Redis store, its leases releasing
        // without checking the owner (a bug for the soak to catch).
        let store = lock_runtime::RedisStore::builder(server).connect().await?;
        let careless = lock_tests::careless::Careless(std::sync::Arc::new(store));
        LockRegistry::builder(careless).build()?
    } else if let Some(members) = url.strip_prefix("etcd://") {
        let endpoints: Vec<String> = members.split(',').map(|m| format!("http://{m}")).collect();
        let endpoints: Vec<&str> = endpoints.iter().map(String::as_str).collect();
        LockRegistry::etcd(&endpoints).await?
    } else if let Some(servers) = url.strip_prefix("zookeeper://") {
        // `zookeeper://host:port,host:port?session_ms=N`.
        let (servers, session) = servers
            .split_once("?session_ms=")
            .unwrap_or((servers, "30000"));
        let session = std::time::Duration::from_millis(session.parse().expect("session_ms"));
        let backend = lock_runtime::ZooKeeperStore::builder(servers)
            .session_timeout(session)
            .connect()
            .await?;
        LockRegistry::builder(backend).build()?
    } else if url.contains(',') && !url.contains("+cluster://") && !url.contains("+sentinel://") {
        let urls: Vec<&str> = url.split(',').collect();
        // The soaks' leases are short (500 ms), which makes the default
        // node timeout (a tenth of the ttl) 50 ms: a loaded machine stalls
        // a process that long, and then no node "answers". The timeout
        // only guards against a hung node here; 200 ms still leaves most
        // of the lease valid after a slow acquire.
        let store = lock_runtime::RedlockStore::builder(&urls)
            .node_timeout(Duration::from_millis(200))
            .connect()
            .await?;
        LockRegistry::new(store)
    } else if let Some((server, grant_ms)) = url.split_once("?fair_grant_ms=") {
        // `redis://host:port?fair_grant_ms=N`: the Redis store in fair mode.
        let grant = Duration::from_millis(grant_ms.parse().expect("fair_grant_ms"));
        let backend = lock_runtime::RedisStore::builder(server)
            .fair(grant)
            .connect()
            .await?;
        LockRegistry::builder(backend).build()?
    } else {
        LockRegistry::redis(url).await?
    })
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let args: Vec<String> = std::env::args().collect();
    let scenario = arg(&args, 1, "scenario");
    let url = arg(&args, 2, "redis url");
    let key = arg(&args, 3, "key");
    // Why a renewed holder lost its lock, not only that it did.
    let warnings = (scenario == "renewed").then(lock_tests::Warnings::install);
    let registry = connect(&url).await?;
    lock_runtime::init(registry)?;
    // Shared data lives in Redis: LOCK_WORKER_DATA_URL, else the (first)
    // lock server.
    let data_url = std::env::var("LOCK_WORKER_DATA_URL")
        .unwrap_or_else(|_| url.split(',').next().unwrap_or_default().to_owned());
    let data = redis::Client::open(data_url.as_str()).expect("url");
    println!("ready pid={}", std::process::id());
    match scenario.as_str() {
        "oversell" | "oversell-unlocked" => {
            let tasks: usize = arg(&args, 4, "tasks").parse().expect("tasks");
            let locked = scenario == "oversell";
            let mut handles = Vec::new();
            for _ in 0..tasks {
                let mut conn = connection(&data).await;
                let item = key.clone();
                handles.push(tokio::spawn(async move {
                    let mut sold = 0;
                    loop {
                        let outcome = if locked {
                            buy(&mut conn, &item).await.expect("lock")
                        } else {
                            sell_one(&mut conn, &item).await
                        };
                        match outcome.expect("redis data command") {
                            Some(_) => sold += 1,
                            None => break sold,
                        }
                    }
                }));
            }
            let mut sold = 0;
            for handle in handles {
                sold += handle.await.expect("task");
            }
            println!("done sold={sold}");
        }
        "transfer" => {
            // KEY is the bank; two tasks, each `count` transfers between
            // accounts 1 and 2, in alternating directions.
            let count: i64 = arg(&args, 4, "transfers").parse().expect("transfers");
            let mut handles = Vec::new();
            for task in 0..2 {
                let mut conn = connection(&data).await;
                let bank = key.clone();
                handles.push(tokio::spawn(async move {
                    for i in 0..count {
                        let (from, to) = if (i + task) % 2 == 0 { (1, 2) } else { (2, 1) };
                        transfer(&mut conn, &bank, from, to, i + 1)
                            .await
                            .expect("lock")
                            .expect("redis data command");
                    }
                }));
            }
            for handle in handles {
                handle.await.expect("task");
            }
            println!("done transfers={}", 2 * count);
        }
        "hold-1s" | "hold-3s" | "hold-30s" | "hold-unrenewed" => {
            let ms: u64 = arg(&args, 4, "hold ms").parse().expect("hold ms");
            let duration = Duration::from_millis(ms);
            let result = match scenario.as_str() {
                "hold-1s" => hold_1s(&key, duration).await,
                "hold-3s" => hold_3s(&key, duration).await,
                "hold-30s" => hold_30s(&key, duration).await,
                _ => hold_unrenewed(&key, duration).await,
            };
            match result {
                Ok(()) => println!("released at_ms={}", now_ms()),
                Err(err) => println!("error {err}"),
            }
        }
        "skip" => {
            if run_once(&key).await?.is_none() {
                println!("skipped at_ms={}", now_ms());
            }
        }
        "wait" => {
            let guard = lock_runtime::registry()?
                .lock(&key, lock_runtime::LockOptions::default())
                .await?;
            println!(
                "acquired fencing={} at_ms={}",
                guard.fencing_token().await?,
                now_ms()
            );
            guard.release().await?;
        }
        "soak" => {
            // TASKS (default 2) tasks lock `KEY-0`..`KEY-2` at random, in wait or skip
            // mode, and `KEY-p`, `KEY-r` and pairs of `KEY-m0`..`KEY-m2`,
            // for bodies of 0 to 1.6 ttls (renewed), and record every body
            // in the history file.
            let secs: u64 = arg(&args, 4, "seconds").parse().expect("seconds");
            let path = arg(&args, 5, "history file");
            let seed: u64 = arg(&args, 6, "seed").parse().expect("seed");
            let ttl_ms: u64 = arg(&args, 7, "ttl ms").parse().expect("ttl ms");
            let tasks: u64 = args.get(8).map_or(2, |tasks| tasks.parse().expect("tasks"));
            SOAK_TTL
                .set(Duration::from_millis(ttl_ms))
                .expect("one soak per process");
            let history =
                std::sync::Arc::new(lock_tests::history::Recorder::open(&path).expect("history"));
            let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
            // Semaphores and read-write locks where the store serves them
            // (not Redlock): else those keys are locked alone.
            let (permits, shares) = {
                let capabilities = lock_runtime::registry()?.store().capabilities();
                (capabilities.permits, capabilities.shares)
            };
            let mut handles = Vec::new();
            for task in 0..tasks {
                let (history, key) = (history.clone(), key.clone());
                // From the seed alone, so a run's choices can be replayed.
                let mut draws = lock_tests::soak::Draws(
                    (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (task + 1)).max(1),
                );
                handles.push(tokio::spawn(async move {
                    use lock_tests::history::now_us;
                    let pid = std::process::id();
                    for n in 0.. {
                        if tokio::time::Instant::now() >= deadline {
                            break;
                        }
                        // Mostly the attribute on three exclusive keys (wait
                        // and skip mode); otherwise options made at run time:
                        // the watchdog off, max_hold, hold_at_least, a
                        // semaphore of 2, a read-write lock; two of three
                        // other keys at once; or a call its caller gives up
                        // on, maybe mid-body.
                        let choice = draws.below(12);
                        let ttl = soak_ttl();
                        let mut options = LockOptions::default().ttl(ttl).wait_timeout(ttl * 6);
                        let (keys, claim) = match choice {
                            8 if permits => {
                                options = options.permits(2);
                                (vec![format!("{key}-p")], "p2")
                            }
                            9 if shares && draws.below(4) != 0 => {
                                options = options.access(Access::Read);
                                (vec![format!("{key}-r")], "s")
                            }
                            8 | 9 => (vec![format!("{key}-r")], "x"),
                            10 => {
                                let first = draws.below(3);
                                let second = (first + 1 + draws.below(2)) % 3;
                                let pair = [first, second].map(|i| format!("{key}-m{i}"));
                                (pair.to_vec(), "x")
                            }
                            _ => (vec![format!("{key}-{}", draws.below(3))], "x"),
                        };
                        match (choice, draws.below(3)) {
                            (7, 0) => options = options.watchdog(false),
                            (7, 1) => options = options.max_hold(ttl),
                            (7, _) => options = options.hold_at_least(ttl / 5),
                            _ => {}
                        }
                        let holder = format!("{pid}.{task}.{n}");
                        // 5 ms steps, up to 1.6 ttls.
                        let steps = u32::try_from(draws.below(ttl_ms * 8 / 25 + 1)).unwrap_or(0);
                        // A caller that gives up within 2 ttls.
                        let patience = Duration::from_millis(draws.below(ttl_ms * 2 + 1));
                        let last = std::sync::Mutex::new(0);
                        let asked = now_us();
                        let body = SoakBody {
                            history: &history,
                            holder: &holder,
                            asked,
                            claim,
                            steps,
                            last: &last,
                        };
                        let call = async {
                            match choice {
                                0 | 1 => soak_skip(&keys[0], &body).await,
                                2..=6 => soak_wait(&keys[0], &body).await.map(Some),
                                10 => soak_pair(&keys[0], &keys[1], &body).await.map(Some),
                                _ => match lock_runtime::registry() {
                                    Ok(registry) => registry
                                        .with_lock(&keys[0], options, body.run(&keys))
                                        .await
                                        .map(Some),
                                    Err(err) => Err(err),
                                },
                            }
                        };
                        let outcome = if choice == 11 {
                            tokio::time::timeout(patience, call).await.ok()
                        } else {
                            Some(call.await)
                        };
                        let last = *last.lock().expect("last");
                        let refused = |kind: &str| {
                            format!(
                                "{kind} key={} holder={holder} asked_us={asked} at_us={}",
                                keys[0],
                                now_us()
                            )
                        };
                        let lines: Vec<String> = match outcome {
                            None if last > 0 => keys
                                .iter()
                                .map(|key| {
                                    format!(
                                        "end key={key} holder={holder} at_us={last} outcome=cancelled"
                                    )
                                })
                                .collect(),
                            None => vec![refused("cancelled")],
                            Some(Ok(Some(()))) => keys
                                .iter()
                                .map(|key| {
                                    format!(
                                        "end key={key} holder={holder} at_us={last} outcome=released"
                                    )
                                })
                                .collect(),
                            Some(Ok(None)) => vec![refused("skipped")],
                            Some(Err(LockError::Lost { .. })) if last > 0 => keys
                                .iter()
                                .map(|key| {
                                    format!("end key={key} holder={holder} at_us={last} outcome=lost")
                                })
                                .collect(),
                            Some(Err(LockError::Timeout { .. })) => vec![refused("timeout")],
                            Some(Err(err)) if last > 0 => {
                                eprintln!("soak worker {pid}: {}", lock_tests::error_chain(&err));
                                let kind = error_kind(&err);
                                keys.iter()
                                    .map(|key| {
                                        format!(
                                            "end key={key} holder={holder} at_us={last} \
                                             outcome=error error={kind}"
                                        )
                                    })
                                    .collect()
                            }
                            Some(Err(err)) => {
                                eprintln!("soak worker {pid}: {}", lock_tests::error_chain(&err));
                                // The store away: not a hot loop of errors.
                                tokio::time::sleep(Duration::from_millis(20)).await;
                                vec![format!(
                                    "failed key={} holder={holder} error={} at_us={}",
                                    keys[0],
                                    error_kind(&err),
                                    now_us()
                                )]
                            }
                        };
                        for line in lines {
                            history.line(&line);
                        }
                    }
                }));
            }
            for handle in handles {
                handle.await.expect("task");
            }
            println!("done");
        }
        "job" => {
            // job URL NAME PERIOD_MS OFFSET_MS SECONDS SPECS TTL_MS
            let period = Duration::from_millis(arg(&args, 4, "period ms").parse().expect("ms"));
            let offset: i64 = arg(&args, 5, "clock offset ms").parse().expect("offset");
            let secs: u64 = arg(&args, 6, "seconds").parse().expect("seconds");
            let specs = arg(&args, 7, "job specs");
            let ttl = Duration::from_millis(arg(&args, 8, "ttl ms").parse().expect("ms"));
            run_jobs(&key, period, offset, secs, &specs, ttl, &data).await?;
        }
        "ticks" => {
            // ticks URL KEY PERIOD_MS FIRST_MS TICKS: at FIRST_MS and every
            // PERIOD_MS after, by the wall clock, the task `tick`.
            let period: u128 = arg(&args, 4, "period ms").parse().expect("ms");
            let first: u128 = arg(&args, 5, "first tick ms").parse().expect("ms");
            let ticks: u128 = arg(&args, 6, "ticks").parse().expect("ticks");
            let mut conn = connection(&data).await;
            let mut ran = 0;
            for n in 0..ticks {
                let at = first + n * period;
                let wait = at.saturating_sub(now_ms());
                tokio::time::sleep(Duration::from_millis(wait as u64)).await;
                if let Some(result) = tick(&mut conn, &key, at).await? {
                    result.expect("redis data command");
                    ran += 1;
                }
            }
            println!("done ran={ran}");
        }
        "wait-12s" => {
            let options =
                lock_runtime::LockOptions::default().wait_timeout(Duration::from_secs(12));
            let guard = lock_runtime::registry()?.lock(&key, options).await?;
            println!(
                "acquired fencing={} at_ms={}",
                guard.fencing_token().await?,
                now_ms()
            );
            guard.release().await?;
        }
        "renewed" => {
            // Two tasks, each on one of the keys `KEY-0`, `KEY-1`, in turn.
            let secs: u64 = arg(&args, 4, "seconds").parse().expect("seconds");
            let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
            let mut handles = Vec::new();
            for task in 0..2 {
                let mut conn = connection(&data).await;
                let key = format!("{key}-{task}");
                handles.push(tokio::spawn(async move {
                    let (mut entries, mut errors) = (0u64, 0u64);
                    while tokio::time::Instant::now() < deadline {
                        let id = entry_id();
                        match renewed_section(&mut conn, &key, &id).await {
                            Ok(result) => {
                                result.expect("data store");
                                entries += 1;
                            }
                            Err(err) => {
                                errors += 1;
                                eprintln!("renewed worker {}: {err}", std::process::id());
                                // A body cancelled inside left its mark.
                                let _: i64 = conn
                                    .srem(format!("renewed:{key}:inside"), &id)
                                    .await
                                    .expect("data store");
                            }
                        }
                    }
                    (entries, errors)
                }));
            }
            let (mut entries, mut errors) = (0, 0);
            for handle in handles {
                let (e, x) = handle.await.expect("task");
                entries += e;
                errors += x;
            }
            // The reasons: the store refused a renewal (the node was gone)
            // or saw the held node deleted, or no renewal got through in
            // time.
            let lost = warnings.expect("installed").lost();
            let count = |prefix: &str| -> u64 {
                lost.iter()
                    .filter(|(reason, _)| reason.starts_with(prefix))
                    .map(|(_, n)| n)
                    .sum()
            };
            let refused =
                count("the store no longer has it") + count("its ZooKeeper node was deleted");
            let late = count("no renewal got through");
            println!("done entries={entries} errors={errors} refused={refused} late={late}");
        }
        "semaphore" => {
            let tasks: usize = arg(&args, 4, "tasks").parse().expect("tasks");
            let rounds: usize = arg(&args, 5, "rounds").parse().expect("rounds");
            let mut handles = Vec::new();
            for _ in 0..tasks {
                let (data, key) = (data.clone(), key.clone());
                handles.push(tokio::spawn(async move {
                    let mut conn = connection(&data).await;
                    for _ in 0..rounds {
                        permit_section(&mut conn, &key)
                            .await?
                            .expect("redis data command");
                    }
                    Ok::<_, LockError>(())
                }));
            }
            for handle in handles {
                handle.await.expect("task")?;
            }
            println!("done");
        }
        "hold-permit" => {
            let ms: u64 = arg(&args, 4, "hold ms").parse().expect("hold ms");
            match hold_permit(&key, Duration::from_millis(ms)).await {
                Ok(()) => println!("released at_ms={}", now_ms()),
                Err(err) => println!("error {err}"),
            }
        }
        "read" => {
            let tasks: usize = arg(&args, 4, "tasks").parse().expect("tasks");
            let ms: u64 = arg(&args, 5, "run ms").parse().expect("run ms");
            let deadline = tokio::time::Instant::now() + Duration::from_millis(ms);
            let mut handles = Vec::new();
            for _ in 0..tasks {
                let (data, key) = (data.clone(), key.clone());
                handles.push(tokio::spawn(async move {
                    let mut conn = connection(&data).await;
                    let mut reads = 0u64;
                    while tokio::time::Instant::now() < deadline {
                        read_section(&mut conn, &key)
                            .await?
                            .expect("redis data command");
                        reads += 1;
                    }
                    Ok::<_, LockError>(reads)
                }));
            }
            let mut reads = 0;
            for handle in handles {
                reads += handle.await.expect("task")?;
            }
            println!("done reads={reads}");
        }
        "write" => {
            let mut conn = connection(&data).await;
            println!("asked at_ms={}", now_ms());
            write_section(&mut conn, &key)
                .await?
                .expect("redis data command");
        }
        "fence" => {
            let rounds: usize = arg(&args, 4, "rounds").parse().expect("rounds");
            let mut conn = connection(&data).await;
            for _ in 0..rounds {
                record_fencing(&mut conn, &key)
                    .await?
                    .expect("redis data command");
            }
            println!("done");
        }
        "chaos" => {
            let secs: u64 = arg(&args, 4, "seconds").parse().expect("seconds");
            let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
            let mut handles = Vec::new();
            for _ in 0..2 {
                let mut conn = connection(&data).await;
                let key = key.clone();
                handles.push(tokio::spawn(async move {
                    let (mut entries, mut errors) = (0u64, 0u64);
                    let entry = std::sync::Mutex::new(None);
                    while tokio::time::Instant::now() < deadline {
                        match chaos_section(&mut conn, &key, &entry).await {
                            Ok(result) => {
                                result.expect("data store");
                                entries += 1;
                            }
                            Err(err) => {
                                errors += 1;
                                let cause = std::error::Error::source(&err)
                                    .map(|source| format!(": {source}"))
                                    .unwrap_or_default();
                                eprintln!("chaos worker {}: {err}{cause}", std::process::id());
                                // A body cancelled by a lost lease: undo its
                                // entry, and count it if it had landed.
                                let started = entry.lock().expect("entry").take();
                                if let Some(id) = started {
                                    let removed: i64 = conn
                                        .srem(format!("chaos:{key}:inside"), &id)
                                        .await
                                        .expect("data store");
                                    if removed == 1 {
                                        let _: i64 = conn
                                            .rpush(format!("chaos:{key}:lost"), 1)
                                            .await
                                            .expect("data store");
                                    }
                                }
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                        }
                    }
                    (entries, errors)
                }));
            }
            let (mut entries, mut errors) = (0, 0);
            for handle in handles {
                let (e, x) = handle.await.expect("task");
                entries += e;
                errors += x;
            }
            println!("done entries={entries} errors={errors}");
        }
        other => panic!("unknown scenario {other}"),
    }
    Ok(())
}
