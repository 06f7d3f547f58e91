//! The run-once scheduled job: K instances run the same job on the same
//! schedule, with clocks skewed by up to a second, and each fire must run
//! exactly once.
//!
//! ```sh
//! cargo run -p examples --example scheduled_job                       # 3 instances as tasks, in memory
//! cargo run -p examples --example scheduled_job -- --redis redis://127.0.0.1:6379 --instances 4
//! cargo run -p examples --example scheduled_job -- --postgres postgres://postgres@127.0.0.1/postgres
//! cargo run -p examples --features etcd --example scheduled_job -- --etcd 127.0.0.1:2379
//! cargo run -p examples --features zookeeper --example scheduled_job -- --zookeeper 127.0.0.1:2181
//! ```
//!
//! Each instance runs the job through `lock_runtime::job` (in a service,
//! `#[distributed_lock(job = "nightly-report", every = "24h")]` declares
//! the same; the example uses the runtime API to set each instance's clock
//! behind). A fire is named by its scheduled instant, so an instance whose
//! clock is a second behind finds the fire it is late for already taken,
//! and no lock timing (`hold_at_least`) has to be chosen to cover the skew.
//! Fires are 2 s apart; the job takes 100 ms.
//!
//! Options: `--instances K` (3), `--ticks N` (4), `--redis URL`,
//! `--postgres URL`, `--mysql URL`, `--etcd ENDPOINTS` or `--zookeeper
//! CONNECT` (the lock store, which also keeps the ledger; instances become
//! processes the example starts). Exits with status 1 if a fire ran other
//! than once.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use examples::{Error, STORE_FLAGS, StoreFlag};
use lock_runtime::job::{FireOutcome, Job, Schedule};
use redis::AsyncCommands;

/// Time between fires.
const PERIOD: Duration = Duration::from_secs(2);
/// The largest clock skew between instances.
const MAX_SKEW: Duration = Duration::from_secs(1);
/// How long one run of the job takes.
const JOB_TIME: Duration = Duration::from_millis(100);

#[derive(Clone, Debug)]
struct Args {
    instances: usize,
    ticks: u64,
    store: StoreFlag,
    /// In a process the example starts: its instance number, run id and start.
    instance: Option<(usize, String, u128)>,
}

fn parse_args() -> Result<Args, Error> {
    let mut args = Args {
        instances: 3,
        ticks: 4,
        store: StoreFlag::Memory,
        instance: None,
    };
    args.store = examples::parse_flags("scheduled_job", |flag, value| {
        match flag {
            "--instances" => args.instances = value()?.parse()?,
            "--ticks" => args.ticks = value()?.parse()?,
            "--instance" => {
                let (i, run, start) = (value()?.parse()?, value()?, value()?.parse()?);
                args.instance = Some((i, run, start));
            }
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    if args.instances < 2 {
        return Err("--instances must be at least 2 for the job to be contended".into());
    }
    Ok(args)
}

/// Who ran and who skipped each tick.
#[derive(Clone)]
enum Ledger {
    Memory(Arc<Mutex<Vec<(u64, usize, bool)>>>),
    Redis(redis::aio::MultiplexedConnection, String),
    Postgres(Arc<tokio_postgres::Client>, String),
    /// Rows of `sched_ledger`, as on PostgreSQL.
    #[cfg(feature = "mysql")]
    MySql(mysql_async::Pool, String),
    /// One key per entry: `sched/{run}/ledger/{tick}/{instance}`, valued
    /// `ran` or `skipped`.
    #[cfg(feature = "etcd")]
    Etcd(Box<etcd_client::KvClient>, String),
    /// One node per entry: `/sched/{run}/{tick}-{instance}`, its data `ran`
    /// or `skipped`.
    #[cfg(feature = "zookeeper")]
    ZooKeeper(zookeeper_client::Client, String),
}

impl Ledger {
    async fn record(&self, tick: u64, instance: usize, ran: bool) -> Result<(), Error> {
        match self {
            Ledger::Memory(entries) => entries.lock().expect("ledger").push((tick, instance, ran)),
            Ledger::Redis(conn, run) => {
                let entry = format!("{tick} {instance} {}", if ran { "ran" } else { "skipped" });
                let _: u64 = conn
                    .clone()
                    .rpush(format!("sched:{run}:ledger"), entry)
                    .await?;
            }
            Ledger::Postgres(client, run) => {
                let (tick, instance) = (tick as i64, instance as i64);
                client
                    .execute(
                        "INSERT INTO sched_ledger (run, tick, instance, ran) VALUES ($1, $2, $3, $4)",
                        &[run, &tick, &instance, &ran],
                    )
                    .await?;
            }
            #[cfg(feature = "mysql")]
            Ledger::MySql(pool, run) => {
                use mysql_async::prelude::Queryable;
                pool.get_conn()
                    .await?
                    .exec_drop(
                        "INSERT INTO sched_ledger (run, tick, instance, ran) VALUES (?, ?, ?, ?)",
                        (run, tick, instance as u64, ran),
                    )
                    .await?;
            }
            #[cfg(feature = "etcd")]
            Ledger::Etcd(client, run) => {
                let key = format!("sched/{run}/ledger/{tick}/{instance}");
                let entry = if ran { "ran" } else { "skipped" };
                client.clone().put(key, entry, None).await?;
            }
            #[cfg(feature = "zookeeper")]
            Ledger::ZooKeeper(client, run) => {
                let entry = if ran { "ran" } else { "skipped" };
                let options = zookeeper_client::CreateMode::Persistent
                    .with_acls(zookeeper_client::Acls::anyone_all());
                let path = format!("/sched/{run}/{tick}-{instance}");
                client.create(&path, entry.as_bytes(), &options).await?;
            }
        }
        Ok(())
    }

    async fn entries(&self) -> Result<Vec<(u64, usize, bool)>, Error> {
        Ok(match self {
            Ledger::Memory(entries) => entries.lock().expect("ledger").clone(),
            Ledger::Redis(conn, run) => {
                let lines: Vec<String> = conn
                    .clone()
                    .lrange(format!("sched:{run}:ledger"), 0, -1)
                    .await?;
                let _: u64 = conn.clone().del(format!("sched:{run}:ledger")).await?;
                lines
                    .iter()
                    .filter_map(|line| {
                        let mut parts = line.split(' ');
                        let tick = parts.next()?.parse().ok()?;
                        let instance = parts.next()?.parse().ok()?;
                        Some((tick, instance, parts.next()? == "ran"))
                    })
                    .collect()
            }
            Ledger::Postgres(client, run) => {
                let rows = client
                    .query(
                        "DELETE FROM sched_ledger WHERE run = $1 RETURNING tick, instance, ran",
                        &[run],
                    )
                    .await?;
                let mut entries: Vec<(u64, usize, bool)> = rows
                    .iter()
                    .map(|row| {
                        let (tick, instance): (i64, i64) = (row.get(0), row.get(1));
                        (tick as u64, instance as usize, row.get(2))
                    })
                    .collect();
                entries.sort_unstable();
                entries
            }
            #[cfg(feature = "mysql")]
            Ledger::MySql(pool, run) => {
                use mysql_async::prelude::Queryable;
                let mut conn = pool.get_conn().await?;
                let rows: Vec<(u64, u64, bool)> = conn
                    .exec(
                        "SELECT tick, instance, ran FROM sched_ledger WHERE run = ?",
                        (run,),
                    )
                    .await?;
                conn.exec_drop("DELETE FROM sched_ledger WHERE run = ?", (run,))
                    .await?;
                let mut entries: Vec<(u64, usize, bool)> = rows
                    .into_iter()
                    .map(|(tick, instance, ran)| (tick, instance as usize, ran))
                    .collect();
                entries.sort_unstable();
                entries
            }
            #[cfg(feature = "etcd")]
            Ledger::Etcd(client, run) => {
                let prefix = format!("sched/{run}/ledger/");
                let all = etcd_client::DeleteOptions::new()
                    .with_prefix()
                    .with_prev_key();
                let deleted = client.clone().delete(prefix.as_str(), Some(all)).await?;
                let mut entries = Vec::new();
                for kv in deleted.prev_kvs() {
                    let key = kv.key_str()?.strip_prefix(&prefix).unwrap_or_default();
                    let (tick, instance) = key.split_once('/').ok_or("a malformed ledger key")?;
                    entries.push((tick.parse()?, instance.parse()?, kv.value_str()? == "ran"));
                }
                entries.sort_unstable();
                entries
            }
            #[cfg(feature = "zookeeper")]
            Ledger::ZooKeeper(client, run) => {
                let dir = format!("/sched/{run}");
                // A server reads from its own copy, which may trail the
                // leader's: the replicas wrote through other sessions.
                client.sync(&dir).await?;
                let mut entries = Vec::new();
                for name in client.list_children(&dir).await? {
                    let path = format!("{dir}/{name}");
                    let (data, _) = client.get_data(&path).await?;
                    client.delete(&path, None).await?;
                    let (tick, instance) = name.split_once('-').ok_or("a malformed ledger node")?;
                    entries.push((tick.parse()?, instance.parse()?, data == b"ran"));
                }
                client.delete(&dir, None).await?;
                entries.sort_unstable();
                entries
            }
        })
    }

    /// The ledger `args` asks for: in the lock store, or in memory.
    async fn open(args: &Args, run: &str) -> Result<Ledger, Error> {
        let run = run.to_owned();
        Ok(match &args.store {
            StoreFlag::Memory => Ledger::Memory(Arc::default()),
            StoreFlag::Redis(url) => {
                let conn = redis::Client::open(url.as_str())?
                    .get_multiplexed_async_connection()
                    .await?;
                Ledger::Redis(conn, run)
            }
            StoreFlag::Postgres(url) => {
                let (client, connection) =
                    tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
                tokio::spawn(connection);
                Ledger::Postgres(Arc::new(client), run)
            }
            #[cfg(feature = "mysql")]
            StoreFlag::MySql(_) => Ledger::MySql(args.store.mysql_pool()?, run),
            #[cfg(not(feature = "mysql"))]
            StoreFlag::MySql(_) => return Err(examples::WITHOUT_MYSQL.into()),
            #[cfg(feature = "etcd")]
            StoreFlag::Etcd(_) => Ledger::Etcd(args.store.etcd_kv().await?, run),
            #[cfg(not(feature = "etcd"))]
            StoreFlag::Etcd(_) => return Err(examples::WITHOUT_ETCD.into()),
            #[cfg(feature = "zookeeper")]
            StoreFlag::ZooKeeper(_) => {
                let client = args.store.zookeeper_client().await?;
                let options = zookeeper_client::CreateMode::Persistent
                    .with_acls(zookeeper_client::Acls::anyone_all());
                client.mkdir(&format!("/sched/{run}"), &options).await?;
                Ledger::ZooKeeper(client, run)
            }
            #[cfg(not(feature = "zookeeper"))]
            StoreFlag::ZooKeeper(_) => return Err(examples::WITHOUT_ZOOKEEPER.into()),
        })
    }
}

/// Instance `i`'s clock is behind by this much (evenly spread up to MAX_SKEW).
fn skew(i: usize, instances: usize) -> Duration {
    MAX_SKEW * i as u32 / (instances as u32 - 1)
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// One instance: runs the job `report:{run}` from `first_ms`, the first
/// fire, for `args.ticks` fires, its clock behind by its skew. Each fire
/// runs on the instance that takes it first; the others find it taken.
async fn instance(
    i: usize,
    args: Args,
    run: String,
    first_ms: u128,
    ledger: Ledger,
) -> Result<(), Error> {
    let skew = skew(i, args.instances);
    let first = UNIX_EPOCH + Duration::from_millis(first_ms as u64);
    let tick_of = move |fire: SystemTime| {
        let since = fire.duration_since(first).unwrap_or_default();
        since.as_millis() as u64 / PERIOD.as_millis() as u64 + 1
    };
    let taken: Arc<Mutex<Vec<u64>>> = Arc::default();
    let seen = Arc::clone(&taken);
    let job = Job::new(format!("report:{run}"), Schedule::every(PERIOD))
        .max_skew(MAX_SKEW)
        .replica(format!("#{i}"))
        .clock(move || SystemTime::now() - skew)
        .on_report(move |report| {
            let tick = tick_of(report.fire);
            let what = match &report.outcome {
                FireOutcome::Done => "ran the job".to_owned(),
                FireOutcome::TakenElsewhere => {
                    seen.lock().expect("taken").push(tick);
                    "found it taken: skipped".to_owned()
                }
                other => format!("{other:?}"),
            };
            println!(
                "  tick {tick}: instance #{i} (clock {} ms behind) {what}",
                skew.as_millis()
            );
        });
    // Started once this instance's clock reads half a period before the
    // first fire, and stopped half a period after the last.
    let half = PERIOD.as_millis() / 2;
    let start_at = first_ms - half + skew.as_millis();
    tokio::time::sleep(Duration::from_millis(
        start_at.saturating_sub(now_ms()) as u64
    ))
    .await;
    let body_ledger = ledger.clone();
    let handle = job.spawn(lock_runtime::registry()?, move |fire| {
        let ledger = body_ledger.clone();
        async move {
            tokio::time::sleep(JOB_TIME).await;
            ledger.record(tick_of(fire.at()), i, true).await
        }
    })?;
    let last_ms = first_ms + (args.ticks as u128 - 1) * PERIOD.as_millis();
    let stop_at = last_ms + half + skew.as_millis();
    tokio::time::sleep(Duration::from_millis(
        stop_at.saturating_sub(now_ms()) as u64
    ))
    .await;
    handle.stop().await;
    let taken = taken.lock().expect("taken").clone();
    for tick in taken {
        ledger.record(tick, i, false).await?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args = parse_args()?;
    lock_runtime::init(args.store.registry().await?)?;

    if let Some((i, run, start_ms)) = args.instance.clone() {
        let ledger = Ledger::open(&args, &run).await?;
        if let Ledger::Memory(_) = ledger {
            return Err(format!("--instance needs {STORE_FLAGS}").into());
        }
        return instance(i, args, run, start_ms, ledger).await;
    }

    let run = format!("{}-{}", std::process::id(), now_ms());
    let ledger = Ledger::open(&args, &run).await?;
    if let Ledger::Postgres(client, _) = &ledger {
        client
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS sched_ledger \
                 (run text NOT NULL, tick bigint NOT NULL, instance bigint NOT NULL, ran boolean NOT NULL)",
            )
            .await?;
    }
    #[cfg(feature = "mysql")]
    if let Ledger::MySql(pool, _) = &ledger {
        use mysql_async::prelude::Queryable;
        pool.get_conn()
            .await?
            .query_drop(
                "CREATE TABLE IF NOT EXISTS sched_ledger \
                 (run VARCHAR(64) NOT NULL, tick BIGINT UNSIGNED NOT NULL, instance BIGINT UNSIGNED NOT NULL, ran BOOLEAN NOT NULL)",
            )
            .await?;
    }
    // The first fire at least a second away, to leave the instances time
    // to start.
    let start_ms = Schedule::every(PERIOD)
        .next_after(SystemTime::now() + Duration::from_secs(1))
        .duration_since(UNIX_EPOCH)?
        .as_millis();
    println!(
        "scheduled job: {} instances ({}), {} ticks {} s apart, clocks behind by {}",
        args.instances,
        if args.store.is_shared() {
            format!("processes on {}", args.store.name())
        } else {
            "tasks in memory".to_owned()
        },
        args.ticks,
        PERIOD.as_secs(),
        (0..args.instances)
            .map(|i| format!("{} ms", skew(i, args.instances).as_millis()))
            .collect::<Vec<_>>()
            .join(", "),
    );
    if args.store.is_shared() {
        let exe = std::env::current_exe()?;
        let mut children = Vec::new();
        for i in 0..args.instances {
            let mut command = Command::new(&exe);
            command
                .args(["--instance", &i.to_string(), &run, &start_ms.to_string()])
                .args(args.store.args())
                .args(["--instances", &args.instances.to_string()])
                .args(["--ticks", &args.ticks.to_string()]);
            children.push(command.spawn()?);
        }
        for mut child in children {
            let status = tokio::task::spawn_blocking(move || child.wait()).await??;
            if !status.success() {
                return Err(format!("an instance failed: {status}").into());
            }
        }
    } else {
        let tasks: Vec<_> = (0..args.instances)
            .map(|i| {
                tokio::spawn(instance(
                    i,
                    args.clone(),
                    run.clone(),
                    start_ms,
                    ledger.clone(),
                ))
            })
            .collect();
        for task in tasks {
            task.await??;
        }
    }

    let mut ticks: BTreeMap<u64, (Vec<usize>, Vec<usize>)> = BTreeMap::new();
    for (tick, i, ran) in ledger.entries().await? {
        let entry = ticks.entry(tick).or_default();
        if ran {
            entry.0.push(i)
        } else {
            entry.1.push(i)
        }
    }
    println!("ledger:");
    let mut wrong = 0;
    for tick in 1..=args.ticks {
        let (mut ran, mut skipped) = ticks.remove(&tick).unwrap_or_default();
        ran.sort_unstable();
        skipped.sort_unstable();
        let list = |ids: &[usize]| {
            ids.iter()
                .map(|i| format!("#{i}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let verdict = if ran.len() == 1 { "once" } else { "WRONG" };
        if ran.len() != 1 {
            wrong += 1;
        }
        println!(
            "  tick {tick}: ran by {} ({verdict}); skipped by {}",
            if ran.is_empty() {
                "nobody".to_owned()
            } else {
                list(&ran)
            },
            if skipped.is_empty() {
                "nobody".to_owned()
            } else {
                list(&skipped)
            }
        );
    }
    if wrong > 0 {
        println!("FAILED: {wrong} tick(s) did not run exactly once.");
        std::process::exit(1);
    }
    println!("OK: every tick ran exactly once.");
    Ok(())
}
