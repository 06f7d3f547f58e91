//! Lock throughput and latency: lock-runtime beside the raw Redis floor,
//! rslock and distributed-lock, interleaved in one run against one
//! `redis-server` this program starts on a free loopback port (and the
//! PostgreSQL, etcd and ZooKeeper rows against servers it starts too).
//!
//! ```sh
//! cargo run --release --manifest-path bench/Cargo.toml            # full run: BENCHMARKS.md + BENCHMARKS.svg
//! cargo run --release --manifest-path bench/Cargo.toml -- --quick # under a minute, written to bench/target/
//! cargo run --release --manifest-path bench/Cargo.toml -- --store etcd   # one store's rows, printed
//! cargo run --release --manifest-path bench/Cargo.toml -- --profile floor,lock-runtime 3000 64 3
//! cargo run --release --manifest-path bench/Cargo.toml -- --profile-hand-over tokio-mutex,memory 50000 5
//! cargo run --release --manifest-path bench/Cargo.toml -- --profile-overhead tokio-mutex,memory,attribute 1000000 5
//! cargo run --release --manifest-path bench/Cargo.toml -- --probe-wake 400
//! cargo run --release --manifest-path bench/Cargo.toml -- --user-shape lock-runtime,rslock 30
//! cargo run --release --manifest-path bench/Cargo.toml -- --handoff lock-runtime,distributed-lock 200 3
//! cargo run --release --manifest-path bench/Cargo.toml -- --scaling      # BENCHMARKS-scaling.svg
//! ```
//!
//! Contenders:
//! - `floor`: `SET key token NX PX ttl`, retried at once while held, then an
//!   owner-checked delete script, on one multiplexed connection;
//! - `lock-runtime`: `LockRegistry::lock` + `LockGuard::release` (and the
//!   attribute in scenario 7); `lock-runtime-unfenced` the same on a store
//!   without fencing tokens (`Fencing::Off`: a plain `SET NX PX` per
//!   uncontended acquire), in rows 1-3;
//! - `rslock`: `LockManager::acquire_no_guard` + `unlock`, default retry
//!   settings, on the same server;
//! - `distributed-lock` (0.2): a lock made by its provider per key,
//!   `acquire(None)` + `release`, on Redis (rows 1-5; its acquire there is
//!   one attempt, so it is retried at once while held, as the floor is)
//!   and on PostgreSQL (its advisory locks, rows 9-12);
//! - for PostgreSQL (rows 9-12), MySQL (rows 25-28, on MariaDB), etcd (rows 13-16, one member) and
//!   ZooKeeper (rows 17-20, one server), each store's floor beside
//!   `lock-runtime` on it: the library's own acquire statement or
//!   transaction and an owner-checked delete, without the library (etcd's
//!   floor puts every key on one lease granted at start; ZooKeeper's
//!   creates an ephemeral node named after the key, retried at once while
//!   it exists, and deletes it). ZooKeeper runs on the JVM as its scripts
//!   deploy it (both compiler tiers, 1000 MB heap), not the tests'
//!   quick-starting one, and every store's contenders first run the
//!   distinct-key work once at 64 tasks, so a JIT has compiled their
//!   requests' paths before anything is measured.
//!
//! - rows 21-24 and 29-30: semaphores (4 permits) and read-write locks
//!   (90 % reads) on Redis, PostgreSQL and MySQL, 16 tasks on one key, beside each store's
//!   floor and distributed-lock's semaphore and read-write locks (see
//!   `claims.rs`).
//!
//! Every critical section does the same small fixed work (about 2 µs of
//! arithmetic).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lock_runtime::{LockOptions, LockRegistry, distributed_lock};
use lock_tests::RedisServer;
use redis::aio::MultiplexedConnection;

type Error = Box<dyn std::error::Error + Send + Sync>;

mod allocations;
mod claims;
mod contenders;
mod floors;
mod measure;
mod processes;
mod report;
mod scaling;
mod stores;
mod system;
mod wake;

use claims::*;

#[global_allocator]
static ALLOCATOR: allocations::Counting = allocations::Counting;
use contenders::*;
use floors::*;
use measure::*;
use processes::*;
use report::*;
use scaling::*;
use stores::*;
use system::*;
use wake::*;

const TTL: Duration = Duration::from_secs(30);

/// How many interleaved rounds the throughput rows of one process run
/// (Redis's 1-3, the memory store's, the other stores' uncontended and
/// distinct-key rows).
const ROUNDS: usize = 6;

/// The heading of `BENCHMARKS.md`'s hand-written part, which a full run
/// keeps (everything from it to the end) below the table it writes.
const KEPT_SECTION: &str = "## Where the time goes";

/// The grant timeout of the Redis store's fair mode in the bench.
const FAIR_GRANT_TIMEOUT: Duration = Duration::from_secs(1);

/// The fixed work inside every critical section. Never inlined: one copy
/// of its loop serves every contender, so none gains or loses by where its
/// own copy of the loop happens to be placed (a copy straddling a 64-byte
/// boundary ran 10 % slower than another on this machine's AMD cores).
#[inline(never)]
fn work() {
    let mut x = 0u64;
    for i in 0..2_000u64 {
        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
    }
    std::hint::black_box(x);
}

/// Rows 6a, 6b and 7: the memory store `mem` (the global registry's, which
/// the attribute uses) against `tokio::sync::Mutex`, and the attribute
/// against the manual API, `rounds` interleaved rounds each.
pub(crate) async fn memory_rows(
    mem: &Lib,
    scale: u64,
    rounds: usize,
) -> Result<Vec<Measured>, Error> {
    let mut rows = Vec::new();
    let tokio_mutex = Lib::TokioMutex(Arc::default());
    for (scenario, tasks, ops, hot) in [
        (
            "6a. memory store, 1 task uncontended",
            1usize,
            200_000 / scale,
            false,
        ),
        (
            "6b. memory store, 16 tasks one hot key",
            16,
            5_000 / scale,
            true,
        ),
    ] {
        let pair = [("tokio Mutex", &tokio_mutex), ("lock-runtime", mem)];
        rows.extend(interleaved(&pair, scenario, tasks, ops, hot, rounds).await?);
    }
    let pair = [
        ("manual API", mem),
        ("#[distributed_lock]", &Lib::Attribute),
    ];
    let scenario = "7. attribute vs manual (memory)";
    rows.extend(interleaved(&pair, scenario, 1, 200_000 / scale, false, rounds).await?);
    Ok(rows)
}

/// The memory contenders `names` lists (comma-separated: memory,
/// tokio-mutex, and attribute where `attribute` allows it), made for
/// `mode`; any other name is an error naming it.
async fn memory_contenders<'a>(
    mode: &str,
    names: &'a str,
    attribute: bool,
) -> Result<Vec<(&'a str, Lib)>, Error> {
    let mut libs = Vec::new();
    for name in names.split(',') {
        if !(matches!(name, "memory" | "tokio-mutex") || attribute && name == "attribute") {
            return Err(format!("{mode}: {name} is not one of its contenders").into());
        }
        libs.push((name, make_lib(name, "").await?));
    }
    Ok(libs)
}

/// `--profile-hand-over LIBS OPS [ROUNDS]`: the in-process hand-over
/// alone, without the multi-thread scheduler. On a current-thread
/// runtime, two tasks per contender lock one key `OPS` times each; the
/// section does the fixed work and yields once while it holds the lock,
/// so the other task is always queued and every lock is a hand-over.
/// Memory contenders only (memory, tokio-mutex); after one unmeasured
/// round, each round prints the time per section of each contender in
/// turn.
fn profile_hand_over(args: &[String]) -> Result<(), Error> {
    let [names, ops, rest @ ..] = args else {
        return Err("--profile-hand-over LIBS OPS [ROUNDS]".into());
    };
    let ops: u32 = ops.parse()?;
    // Two tasks' sections, each round: at least one, and countable.
    let sections = ops
        .checked_mul(2)
        .filter(|&sections| sections > 0)
        .ok_or("--profile-hand-over: OPS must be between 1 and 2^31 - 1")?;
    let rounds: usize = rest.first().map_or(Ok(3), |r| r.parse())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let libs = memory_contenders("--profile-hand-over", names, false).await?;
        for round in 0..=rounds {
            for (name, lib) in &libs {
                let started = Instant::now();
                let tasks: Vec<_> = (0..2)
                    .map(|_| {
                        let lib = lib.clone();
                        tokio::spawn(async move {
                            for _ in 0..ops {
                                let body = async {
                                    work();
                                    tokio::task::yield_now().await;
                                };
                                lib.with_lock("bench:hand-over", body).await?;
                            }
                            Ok::<(), Error>(())
                        })
                    })
                    .collect();
                for task in tasks {
                    task.await??;
                }
                if round > 0 {
                    let per_section = started.elapsed() / sections;
                    println!("{name}: {} ns per section", per_section.as_nanos());
                }
            }
        }
        Ok(())
    })
}

/// `--profile-overhead LIBS OPS [ROUNDS]`: what rows 6a and 7 add to the
/// fixed work, alone. On a current-thread runtime, one task per contender
/// (memory, tokio-mutex, attribute) locks one key `OPS` times with an
/// empty body, as the row's contenders do otherwise; after one unmeasured round, each
/// round prints the time per lock and release of each contender in turn.
fn profile_overhead(args: &[String]) -> Result<(), Error> {
    let [names, ops, rest @ ..] = args else {
        return Err("--profile-overhead LIBS OPS [ROUNDS]".into());
    };
    let ops: u32 = ops.parse()?;
    if ops == 0 {
        return Err("--profile-overhead: OPS must be at least 1".into());
    }
    let rounds: usize = rest.first().map_or(Ok(5), |r| r.parse())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let libs = memory_contenders("--profile-overhead", names, true).await?;
        for round in 0..=rounds {
            for (name, lib) in &libs {
                let started = Instant::now();
                for _ in 0..ops {
                    if let Lib::Attribute = lib {
                        contenders::attribute_empty("bench:overhead", Instant::now()).await?;
                    } else {
                        lib.with_lock("bench:overhead", async {}).await?;
                    }
                }
                if round > 0 {
                    let per_lock = started.elapsed() / ops;
                    println!("{name}: {} ns per lock", per_lock.as_nanos());
                }
            }
        }
        Ok(())
    })
}

/// `--profile LIBS OPS [TASKS [ROUNDS [hot]]]`: scenario 1 (or 2 with
/// TASKS = 64; with `hot`, all tasks on one key, as in 3 and 6b)
/// for perf, callgrind or strace; the contenders (comma-separated) in turn
/// on one server, after one unmeasured round each at the same scale (so a
/// callgrind total counts every lock twice), each round printing its
/// throughput and this process's
/// CPU per lock (the client's: the server is a process of its own) and,
/// on Redis, the server's time inside commands per lock. Redis: floor, lock-runtime, raw (the
/// store through the `Store` trait alone), rslock; memory (scenario
/// 6a or 6b): memory, tokio-mutex, attribute (the global registry); PostgreSQL:
/// pg-floor, pg-lock-runtime, pg-raw (scenario 9 or 10, then
/// pg_stat_statements); MySQL: mysql-floor, mysql-lock-runtime, mysql-raw
/// (25 or 26); etcd: etcd-floor, etcd-lock-runtime, etcd-raw
/// (13 or 14); ZooKeeper: zk-floor, zk-lock-runtime, zk-raw (17 or 18).
async fn profile(args: &[String]) -> Result<(), Error> {
    let [names, ops, rest @ ..] = args else {
        return Err("--profile LIBS OPS [TASKS [ROUNDS [hot]]]".into());
    };
    let (mut redis, mut postgres, mut etcd, mut zookeeper) = (None, None, None, None);
    let mut mysql = None;
    let url = if names.starts_with("pg-") {
        postgres.insert(lock_tests::PostgresServer::new()).url()
    } else if names.starts_with("mysql-") {
        mysql.insert(lock_tests::MariaDbServer::new()).url()
    } else if names.starts_with("zk-") {
        zookeeper
            .insert(lock_tests::ZooKeeperEnsemble::single_deployed())
            .connect_string()
    } else if names.starts_with("etcd-") {
        etcd.insert(lock_tests::EtcdCluster::single())
            .endpoints()
            .join(",")
    } else {
        redis.insert(RedisServer::new()).url()
    };
    let ops: u64 = ops.parse()?;
    let tasks: usize = rest.first().map_or(Ok(1), |t| t.parse())?;
    let rounds: usize = rest.get(1).map_or(Ok(1), |r| r.parse())?;
    let hot = rest.get(2).is_some_and(|h| h == "hot");
    let mut libs = Vec::new();
    for name in names.split(',') {
        let lib = make_lib(name, &url).await?;
        run_tasks(&lib, "warm-up", name, tasks, ops, hot).await?;
        libs.push((name, lib));
    }
    for _ in 0..rounds {
        for (name, lib) in &libs {
            if let Some(server) = &redis {
                let () = redis::cmd("CONFIG")
                    .arg("RESETSTAT")
                    .query(&mut server.connection())?;
            }
            let (cpu, servers) = (cpu_time(), servers_cpu_time());
            let m = run_tasks(lib, "profile", name, tasks, ops, hot).await?;
            let locks = (ops * tasks as u64) as u32;
            let per_op = (cpu_time() - cpu) / locks;
            let servers = (servers_cpu_time() - servers) / locks;
            println!(
                "{name}: {:.0}/s, client CPU {:.1} µs per lock, server CPU {:.1} µs, wait p50 {}, {} allocations per lock",
                m.throughput(),
                per_op.as_secs_f64() * 1e6,
                servers.as_secs_f64() * 1e6,
                fmt_d(m.pct(50.0)),
                report::fmt_allocations(m.allocations),
            );
            if let Some(server) = &redis {
                println!("  {}", server_time_per_lock(server, locks)?);
            }
        }
    }
    drop((etcd, zookeeper, mysql));
    if let Some(postgres) = postgres {
        postgres.psql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
        println!(
            "{}",
            postgres.psql(
                "SELECT calls, round(mean_exec_time::numeric * 1000, 1) AS us, left(regexp_replace(query, '\\s+', ' ', 'g'), 70) FROM pg_stat_statements WHERE calls > 1000 ORDER BY calls DESC"
            )
        );
    }
    Ok(())
}

/// `--user-shape LIBS [PAIRS [SLICE_MS]]`: row 1b alone, on a server of its
/// own, the floor first and then the contenders (comma-separated), in
/// slices of 150 ms unless told, printed.
async fn user_shape(args: &[String]) -> Result<(), Error> {
    let [names, rest @ ..] = args else {
        return Err("--user-shape LIBS [PAIRS [SLICE_MS]]".into());
    };
    let pairs: usize = rest.first().map_or(Ok(30), |p| p.parse())?;
    let slice = Duration::from_millis(rest.get(1).map_or(Ok(150), |s| s.parse())?);
    let server = RedisServer::new();
    let url = server.url();
    let mut libs = Vec::new();
    for name in std::iter::once("floor").chain(names.split(',')) {
        libs.push((name, make_lib(name, &url).await?));
    }
    for (_, lib) in &libs {
        run_tasks(lib, "warm-up", "", 1, 200, false).await?;
    }
    let contenders: Vec<(&str, &Lib)> = libs.iter().map(|(n, l)| (*n, l)).collect();
    let scenario = "1b. 1 task, one key reused";
    for m in run_user_shape(&contenders, scenario, pairs, slice).await? {
        println!("{}", row_line(&m));
    }
    Ok(())
}

/// The server's time inside each command (`INFO commandstats`) since the
/// last `CONFIG RESETSTAT`, per lock: what the network and event loop cost
/// is not in it, and a script's time (`evalsha`) includes the commands it
/// ran, which are listed too.
fn server_time_per_lock(server: &RedisServer, locks: u32) -> Result<String, Error> {
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.connection())?;
    let mut line = String::from("in commands, per lock:");
    for stat in stats.lines().filter_map(|l| l.strip_prefix("cmdstat_")) {
        let Some((name, fields)) = stat.split_once(':') else {
            continue;
        };
        let field = |key: &str| -> f64 {
            fields
                .split(',')
                .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0)
        };
        if name == "info" || name.starts_with("config") {
            continue;
        }
        let (calls, usec) = (field("calls"), field("usec"));
        let _ = write!(
            line,
            " {name} {:.2}x {:.2} µs;",
            calls / f64::from(locks),
            usec / f64::from(locks)
        );
    }
    // How many reads and writes of sockets the server made: the fewer per
    // lock, the more commands each of the client's writes carried.
    let stats: String = redis::cmd("INFO")
        .arg("stats")
        .query(&mut server.connection())?;
    for name in ["total_reads_processed", "total_writes_processed"] {
        let value = stats
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse::<f64>().ok());
        if let Some(value) = value {
            let _ = write!(line, " {name} {:.2};", value / f64::from(locks));
        }
    }
    Ok(line)
}

/// `--handoff LIBS [ROUNDS] [REPEATS]`: row 5 alone, the floor and each
/// of `LIBS` (comma-separated) in turn, `REPEATS` times (default 3), with
/// the median hand-off in round trips.
async fn handoff_only(args: &[String]) -> Result<(), Error> {
    let [names, rest @ ..] = args else {
        return Err("--handoff LIBS [ROUNDS] [REPEATS]".into());
    };
    let rounds: u64 = rest.first().map_or(Ok(200), |r| r.parse())?;
    let repeats: usize = rest.get(1).map_or(Ok(3), |r| r.parse())?;
    let server = RedisServer::new();
    let url = server.url();
    let conn = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let rtt = round_trip(&conn).await?;
    println!("round trip (PING p50): {}", fmt_d(rtt));
    for _ in 0..repeats {
        for name in std::iter::once("floor").chain(names.split(',')) {
            let name = name.to_owned();
            let m = tokio::task::spawn_blocking({
                let url = url.clone();
                move || run_handoff("5. hand-off", &name, &url, rounds)
            })
            .await??;
            if m.waits.is_empty() {
                println!("{}", row_line(&m));
                continue;
            }
            let in_rtt = m.pct(50.0).as_secs_f64() / rtt.as_secs_f64();
            println!("{}  ({in_rtt:.1} RTT)", row_line(&m));
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--worker") {
        return worker(&args[1..]).await;
    }
    if args.first().map(String::as_str) == Some("--profile") {
        return profile(&args[1..]).await;
    }
    if args.first().map(String::as_str) == Some("--profile-hand-over") {
        let args = args[1..].to_vec();
        return tokio::task::spawn_blocking(move || profile_hand_over(&args)).await?;
    }
    if args.first().map(String::as_str) == Some("--profile-overhead") {
        let args = args[1..].to_vec();
        return tokio::task::spawn_blocking(move || profile_overhead(&args)).await?;
    }
    if args.first().map(String::as_str) == Some("--probe-wake") {
        return probe_wake(&args[1..]).await;
    }
    if args.first().map(String::as_str) == Some("--user-shape") {
        return user_shape(&args[1..]).await;
    }
    if args.first().map(String::as_str) == Some("--handoff") {
        return handoff_only(&args[1..]).await;
    }
    let quick = args.iter().any(|a| a == "--quick");
    if args.first().map(String::as_str) == Some("--scaling") {
        let only = args[1..].iter().find(|a| *a != "--quick");
        return scaling(quick, only.map(String::as_str)).await;
    }
    if args.first().map(String::as_str) == Some("--store") {
        // `--store postgres|mysql|etcd|zookeeper|claims [--quick]`: that store's
        // rows alone, printed, not written.
        return one_store(args.get(1).map_or("", String::as_str), quick).await;
    }
    let scale = if quick { 10 } else { 1 };

    let server = RedisServer::new();
    let url = server.url();
    let conn = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    let floor = Lib::Floor(conn.clone());
    let ours = make_lib("lock-runtime", &url).await?;
    let fair = make_lib("lock-runtime-fair", &url).await?;
    let unfenced = make_lib("lock-runtime-unfenced", &url).await?;
    let rslock = make_lib("rslock", &url).await?;
    let peer = make_lib("distributed-lock", &url).await?;
    let memory = LockRegistry::memory();
    lock_runtime::init(memory.clone())?;
    let contenders = [
        ("floor", &floor),
        ("lock-runtime", &ours),
        ("lock-runtime-unfenced", &unfenced),
        ("lock-runtime-fair", &fair),
        ("rslock", &rslock),
        ("distributed-lock", &peer),
    ];

    let rtt = round_trip(&conn).await?;
    println!("round trip (PING p50): {}", fmt_d(rtt));
    // Warm up connections and scripts.
    for (_, lib) in contenders {
        run_tasks(lib, "warm-up", "", 1, 200, false).await?;
    }

    let mut results: Vec<Measured> = Vec::new();
    let mut push = |m: Measured| {
        println!("{}", row_line(&m));
        results.push(m);
    };

    // Interleaved rounds, each contender's best kept and its median ratio
    // to the floor beside it: one run of 64 tasks on two cores moves by a
    // fifth from one run to the next.
    let rounds = if quick { 2 } else { ROUNDS };
    let scenarios: [(&str, usize, u64, bool); 3] = [
        ("1. 1 task, uncontended", 1, 20_000 / scale, false),
        ("2. 64 tasks, distinct keys", 64, 1_000 / scale, false),
        ("3. 16 tasks, one hot key", 16, 500 / scale, true),
    ];
    for (scenario, tasks, ops, hot) in scenarios {
        for m in interleaved(&contenders, scenario, tasks, ops, hot, rounds).await? {
            push(m);
        }
    }
    // The user's shape: contenders[0] is the floor.
    let user = [
        ("floor", &floor),
        ("lock-runtime", &ours),
        ("lock-runtime-unfenced", &unfenced),
        ("rslock", &rslock),
    ];
    let pairs = if quick { 6 } else { 30 };
    for m in run_user_shape(
        &user,
        "1b. 1 task, one key reused (interleaved 150 ms slices)",
        pairs,
        Duration::from_millis(150),
    )
    .await?
    {
        push(m);
    }
    for (name, _) in contenders {
        let ops = 500 / scale;
        let m = tokio::task::spawn_blocking({
            let url = url.clone();
            move || run_processes("4. 4 processes x 4 tasks, one hot key", name, &url, ops)
        })
        .await??;
        push(m);
    }
    for name in [
        "floor",
        "lock-runtime",
        "lock-runtime-fair",
        "rslock",
        "distributed-lock",
    ] {
        let rounds = if quick { 30 } else { 200 };
        let m = tokio::task::spawn_blocking({
            let url = url.clone();
            move || {
                run_handoff(
                    "5. hand-off: release in A to acquire in waiting B",
                    name,
                    &url,
                    rounds,
                )
            }
        })
        .await??;
        push(m);
    }
    let mem = Lib::Ours(memory.clone());
    for m in memory_rows(&mem, scale, rounds).await? {
        push(m);
    }
    push(run_growth(&mem, "lock-runtime (memory)", 1_000_000).await?);
    push(
        run_growth(
            &ours,
            "lock-runtime (redis)",
            if quick { 20_000 } else { 200_000 },
        )
        .await?,
    );

    // PostgreSQL and etcd: the library beside each store's floor.
    let mut store_round_trips = Vec::new();
    let postgres = lock_tests::PostgresServer::new();
    let (rows, pg_rtt) = store_rows(&POSTGRES, &postgres.url(), quick).await?;
    rows.into_iter().for_each(&mut push);
    // Semaphores and read-write locks on Redis and PostgreSQL (MySQL's below).
    let claims = [
        claim_rows("Redis", &url, 21, quick).await?,
        claim_rows("PostgreSQL", &postgres.url(), 23, quick).await?,
    ];
    claims.into_iter().flatten().for_each(&mut push);
    store_round_trips.push(format!("PostgreSQL: `SELECT 1` p50 {}", fmt_d(pg_rtt)));
    drop(postgres);
    let mysql = lock_tests::MariaDbServer::new();
    let (rows, mysql_rtt) = store_rows(&MYSQL, &mysql.url(), quick).await?;
    rows.into_iter().for_each(&mut push);
    claim_rows("MySQL", &mysql.url(), 29, quick)
        .await?
        .into_iter()
        .for_each(&mut push);
    store_round_trips.push(format!(
        "MySQL (MariaDB): `SELECT 1` p50 {}",
        fmt_d(mysql_rtt)
    ));
    drop(mysql);
    let etcd = lock_tests::EtcdCluster::single();
    let (rows, etcd_rtt) = store_rows(&ETCD, &etcd.endpoints().join(","), quick).await?;
    rows.into_iter().for_each(&mut push);
    store_round_trips.push(format!("etcd, one member: a `put` p50 {}", fmt_d(etcd_rtt)));
    drop(etcd);
    let zookeeper = lock_tests::ZooKeeperEnsemble::single_deployed();
    let (rows, zk_rtt) = store_rows(&ZOOKEEPER, &zookeeper.connect_string(), quick).await?;
    rows.into_iter().for_each(&mut push);
    store_round_trips.push(format!(
        "ZooKeeper, one server: a `setData` p50 {}",
        fmt_d(zk_rtt)
    ));
    drop(zookeeper);

    // The table.
    let floor_of = |scenario: &str| {
        results
            .iter()
            .find(|m| {
                m.scenario == scenario
                    && (m.lib == "floor" || m.lib == "tokio Mutex" || m.lib == "manual API")
            })
            .map(Measured::throughput)
    };
    let mut table = String::new();
    writeln!(
        table,
        "| scenario | library | sections/s | wait p50 | wait p99 | wait max | vs floor | allocations per section |"
    )?;
    writeln!(table, "|---|---|---:|---:|---:|---:|---:|---:|")?;
    for m in &results {
        let (rate, ratio) = match &m.note {
            Some(note) if m.scenario.contains("hand-off") && !m.waits.is_empty() => {
                let round_trip = m.round_trip.unwrap_or(rtt);
                (
                    note.clone(),
                    format!(
                        "{:.1} RTT (p50)",
                        m.pct(50.0).as_secs_f64() / round_trip.as_secs_f64()
                    ),
                )
            }
            Some(note) => (note.clone(), String::new()),
            None => {
                let ratio = floor_of(&m.scenario).map_or(String::new(), |f| {
                    match m.paired.filter(|_| m.lib != "floor") {
                        Some(paired) => format!(
                            "{:.2}x (paired {paired:.2}x{})",
                            m.throughput() / f,
                            measure::rounds_range(&m.rounds)
                        ),
                        None => format!("{:.2}x", m.throughput() / f),
                    }
                });
                (format!("{:.0}", m.throughput()), ratio)
            }
        };
        let waits = |d: Duration| {
            if m.waits.is_empty() {
                "-".to_owned()
            } else {
                fmt_d(d)
            }
        };
        writeln!(
            table,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            m.scenario,
            m.lib,
            rate,
            waits(m.pct(50.0)),
            waits(m.pct(99.0)),
            waits(m.waits.last().copied().unwrap_or_default()),
            ratio,
            report::fmt_allocations(m.allocations),
        )?;
    }
    let uncontended_floor = floor_of("1. 1 task, uncontended").unwrap_or(0.0);
    let mut report = String::new();
    writeln!(report, "# Benchmarks\n")?;
    writeln!(report, "Machine: {}.\n", machine())?;
    writeln!(
        report,
        "Mode: {}. Round trip (PING p50): {}. Uncontended floor: {:.0} sections/s. \
         Each critical section does ~2 µs of fixed work. Scenarios 1-3, 6a, 6b, 7, 9, 10, 13, 14, 17, 18, 25 and 26 ran in \
         {} rounds, each contender's round in {} slices run in turn with the other contenders' slices, keeping each contender's best round, \
         and \"paired\" is the median over those rounds of its throughput over the floor's in the same round \
         (in row 1b, over its 30 interleaved 150 ms slices: one task of this multi-thread runtime locking one key over and over with default options, as a user's handler would), \
         \"rounds\" the lowest and highest of those ratios (the run's output lists them round by round). \"vs floor\" is throughput over the floor's in the same \
         scenario (the raw `SET NX PX` + owner-checked delete; `tokio::sync::Mutex` for the memory \
         store; the manual API for the attribute; for PostgreSQL the same insert-or-take-over statement and an \
         owner-checked delete, no library; for MySQL (MariaDB) an insert-or-take-over statement that draws the fencing value as the library's does (without the library's refusal answer and writer mark) and an owner-checked release that keeps the row free, as the library's does, retried at once while held, on a pool of the library's size (8), no library; for etcd the plainest etcd lock, a put-if-absent transaction on the key and a lease granted once, \
         and an owner-checked delete, no library (the library queues an entry per contender instead), retried at once while the key is held (and in the hand-off row \
         also the watching floor: retried once a watch opened after the refusal sees the key deleted, as the library waits); for ZooKeeper an ephemeral node created and deleted, no \
         library; in the semaphore and read-write rows, for PostgreSQL and MySQL the library's own claim functions or procedures called directly \
         and a plain insert-or-take-over for a writer, for Redis a sorted set of holders by expiry, each retried at once while refused); for hand-offs it is the median in round trips ({}). lock-runtime-unfenced is the Redis store without fencing tokens (`Fencing::Off`: \
         a plain `SET NX PX GET` per uncontended acquire, no script); lock-runtime-fair is the Redis \
         store in fair mode (waiters queued in the store, a release grants to the first; grant timeout {:?}). \
         Other libraries: rslock 0.10 (Redis), \
         distributed-lock 0.2 (Redis through fred; PostgreSQL advisory locks through sqlx; MySQL `GET_LOCK` through sqlx, \
         with an hour's timeout, since its default wait, `GET_LOCK(name, -1)`, is refused by MariaDB; its MySQL read-write lock on a pool of 34, \
         as it reads state on a second connection beside its transaction's and its default pool of 10 runs dry at 16 tasks), each with its \
         defaults otherwise, locking and releasing the same keys.\n",
        if quick {
            "--quick (figures are rough)"
        } else {
            "full"
        },
        fmt_d(rtt),
        uncontended_floor,
        if quick {
            "two (six for the other stores)"
        } else {
            "six"
        },
        measure::SLICES,
        store_round_trips.join("; "),
        FAIR_GRANT_TIMEOUT
    )?;
    report.push_str(&table);
    report.push_str("\nWait-time distributions: `BENCHMARKS.svg`.\n");
    println!("\n{table}");

    let (md, svg) = if quick {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target");
        std::fs::create_dir_all(&dir)?;
        (
            dir.join("BENCHMARKS-quick.md"),
            dir.join("BENCHMARKS-quick.svg"),
        )
    } else {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        (root.join("BENCHMARKS.md"), root.join("BENCHMARKS.svg"))
    };
    // The hand-written account below the table (profiles, what was tried)
    // outlives the run that regenerates the table.
    if let Ok(previous) = std::fs::read_to_string(&md)
        && let Some(at) = previous.find(KEPT_SECTION)
    {
        report.push('\n');
        report.push_str(&previous[at..]);
    }
    std::fs::write(&md, report)?;
    let panel = |prefix: &str| {
        results
            .iter()
            .filter(|m| m.scenario.starts_with(prefix))
            .collect::<Vec<_>>()
    };
    chart(
        &svg,
        &[
            ("16 tasks, one hot key", panel("3.")),
            ("4 processes x 4 tasks, one hot key", panel("4.")),
        ],
    )?;
    println!("wrote {} and {}", md.display(), svg.display());
    Ok(())
}
