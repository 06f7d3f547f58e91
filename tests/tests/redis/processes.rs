//! Many real OS processes (`lock-worker`) sharing one `redis-server`.

use std::time::{Duration, Instant};

use lock_runtime::{LockOptions, LockRegistry};
use lock_tests::processes::{Processes, STARTUP};
use lock_tests::{RedisServer, process_scenarios, unique_key};
use redis::Commands;

const WORKER: &str = env!("CARGO_BIN_EXE_lock-worker");

fn lock_name(key: &str) -> String {
    format!("lock:{{{key}}}")
}

/// The processes of the scenarios every store passes, on one server that
/// also holds the data.
fn on(server: &RedisServer) -> Processes {
    Processes::new(WORKER, &server.url(), &server.url())
}

/// A fresh server, and the processes of the scenarios every store passes.
fn shared() -> (RedisServer, Processes) {
    let server = RedisServer::new();
    let processes = on(&server);
    (server, processes)
}

process_scenarios!(shared);
process_scenarios!(
    shared:
    a_semaphore_of_three_across_processes_is_reached_and_never_exceeded,
    a_sigkilled_permit_holder_frees_its_permit_within_its_ttl,
    readers_overlap_and_a_writer_gets_in_within_a_bound,
);

#[test]
fn another_process_holding_a_key_is_seen_and_can_be_freed() {
    let server = RedisServer::new();
    let url = server.url();
    on(&server).another_process_holding_a_key_is_seen_and_can_be_freed(async || {
        LockRegistry::redis(&url).await.expect("connect")
    });
}

#[test]
fn the_watchdog_keeps_a_1s_lease_through_a_3s_body_in_another_process() {
    let server = RedisServer::new();
    let key = unique_key("watchdog");
    let mut holder = on(&server).worker("hold-1s", &key, &["3000"]);
    holder.expect("acquired", STARTUP);
    let started = Instant::now();
    let mut conn = server.connection();
    for check in [1500, 2500] {
        std::thread::sleep(Duration::from_millis(check).saturating_sub(started.elapsed()));
        let pttl: i64 = conn.pttl(lock_name(&key)).unwrap();
        assert!(
            pttl > 0,
            "lease gone at ~{check} ms (pttl {pttl}) while the body runs"
        );
    }
    // Another process cannot take it meanwhile.
    let (_, lines) = on(&server).worker("skip", &key, &[]).finish(STARTUP);
    assert!(lines.iter().any(|l| l.starts_with("skipped")), "{lines:?}");
    holder.expect("released", STARTUP);
    let exists: bool = conn.exists(lock_name(&key)).unwrap();
    assert!(!exists, "freed after the body");
}

#[test]
fn an_expired_holder_gets_lost_and_leaves_the_next_process_lock_alone() {
    let server = RedisServer::new();
    let key = unique_key("expired");
    // A holds a 500 ms lease without the watchdog for a 3 s body.
    let mut first = on(&server).worker("hold-unrenewed", &key, &["3000"]);
    first.expect("acquired", STARTUP);
    // B waits, and takes the lock once A's lease has expired.
    let mut second = on(&server).worker("hold-30s", &key, &["2000"]);
    second.expect("acquired", STARTUP);
    let lost = first.expect("error", STARTUP);
    assert!(lost.contains("was lost"), "{lost}");
    let lines = first.finish_ok(STARTUP, "");
    assert!(
        !lines.iter().any(|l| l.starts_with("releasing")),
        "A's body was cancelled: {lines:?}"
    );
    // A's exit left B's lease in place.
    let pttl: i64 = server.connection().pttl(lock_name(&key)).unwrap();
    assert!(pttl > 20_000, "B's 30 s lease is intact (pttl {pttl})");
    second.expect("released", STARTUP);
}

/// The processes on `server` with the store in fair mode (a 500 ms grant
/// timeout), the data in the same server.
fn fair_on(server: &RedisServer) -> Processes {
    let url = server.url();
    Processes::new(WORKER, &format!("{url}?fair_grant_ms=500"), &url)
}

/// A fresh server, and the processes on it in fair mode.
fn fair() -> (RedisServer, Processes) {
    let server = RedisServer::new();
    let processes = fair_on(&server);
    (server, processes)
}

/// Every store's scenarios, in fair mode: exclusion, skip, expiry and
/// fencing hold with the queue as they do without it, for semaphores and
/// read-write locks too.
mod fair_mode {
    use super::*;

    process_scenarios!(
        fair:
        four_processes_sell_exactly_the_stock,
        opposite_transfers_across_processes_never_deadlock,
        skip_mode_skips_while_another_process_runs_the_job,
        a_sigkilled_holder_blocks_others_for_at_most_its_ttl,
        fencing_tokens_strictly_increase_across_processes,
        a_waiter_in_another_process_is_woken_by_the_release,
        a_semaphore_of_three_across_processes_is_reached_and_never_exceeded,
        a_sigkilled_permit_holder_frees_its_permit_within_its_ttl,
        readers_overlap_and_a_writer_gets_in_within_a_bound,
    );
}

/// The number of waiters in the fair queue of `key`.
fn queued(conn: &mut redis::Connection, key: &str) -> usize {
    conn.llen(format!("{}:queue", lock_name(key))).unwrap()
}

/// In fair mode, the holder and three waiting processes: the waiters get
/// the lock in the order they queued, each from the release before it.
#[test]
fn fair_mode_gives_the_lock_to_waiting_processes_in_the_order_they_queued() {
    let server = RedisServer::new();
    let processes = fair_on(&server);
    let key = unique_key("fifo");
    let mut conn = server.connection();
    let acquired = processes.waiters_in_queue_order(&key, |n| queued(&mut conn, &key) == n);
    assert!(
        acquired.windows(2).all(|w| w[0] <= w[1]),
        "not in queue order (at_ms, fencing): {acquired:?}"
    );
    assert_eq!(queued(&mut conn, &key), 0, "the queue is empty");
}

/// In fair mode, a waiter SIGKILLed while queued ahead of another: the
/// release (made right after the kill) grants the lock to the dead waiter's
/// token, which never claims it, and the live waiter gets it once the grant
/// timeout (500 ms) has passed, at its next attempt: far sooner than any
/// lease's ttl (30 s).
#[test]
fn fair_mode_passes_over_a_dead_waiter_within_the_grant_timeout() {
    let server = RedisServer::new();
    let processes = fair_on(&server);
    let key = unique_key("dead-waiter");
    let mut conn = server.connection();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let holder = runtime.block_on(async {
        let backend = lock_runtime::RedisStore::builder(&server.url())
            .fair(Duration::from_millis(500))
            .connect()
            .await
            .unwrap();
        let registry = LockRegistry::builder(backend).build().unwrap();
        registry.lock(&key, LockOptions::default()).await.unwrap()
    });
    let mut dead = processes.worker("wait", &key, &[]);
    dead.expect("ready", STARTUP);
    lock_tests::wait_until_blocking("the first waiter queued", Duration::from_secs(5), || {
        queued(&mut conn, &key) == 1
    });
    let mut live = processes.worker("wait", &key, &[]);
    live.expect("ready", STARTUP);
    lock_tests::wait_until_blocking("the second waiter queued", Duration::from_secs(5), || {
        queued(&mut conn, &key) == 2
    });
    dead.kill();
    let released_at = now_ms();
    runtime.block_on(holder.release()).unwrap();
    let line = live.expect("acquired", Duration::from_secs(10));
    let acquired_at: u128 = lock_tests::field(&line, "at_ms").parse().unwrap();
    let gap = acquired_at.saturating_sub(released_at);
    println!("a dead waiter ahead delayed the next by {gap} ms");
    // Not before the dead waiter's grant ran out: the release did grant to
    // it (the live waiter would have claimed a grant of its own at once).
    assert!(
        gap >= 450,
        "the live waiter got the lock {gap} ms after the release"
    );
    // The grant timeout, then at most a third of it until the live
    // waiter's next attempt (plus its jitter), and slack for a slow machine.
    assert!(
        gap < 1500,
        "the live waiter waited {gap} ms after the release"
    );
    live.finish_ok(STARTUP, "");
}

fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// The scheduled-job scenarios (fault-free, and a killed runner with
/// frozen replicas) on one server (which also holds the data), on a
/// cluster of three primaries and on a Sentinel group; and a server
/// restarted with its data (append-only, fsynced) while a fire is due.
mod jobs {
    use super::*;
    use lock_tests::{RedisCluster, RedisSentinels};

    mod server {
        lock_tests::job_scenarios!(super::super::shared);
    }

    fn cluster() -> ((RedisCluster, RedisServer), Processes) {
        let (cluster, data) = (RedisCluster::spawn(3), RedisServer::new());
        let processes = Processes::new(WORKER, &cluster.url(), &data.url());
        ((cluster, data), processes)
    }

    mod cluster {
        lock_tests::job_scenarios!(super::cluster);
    }

    fn sentinel() -> ((RedisSentinels, RedisServer), Processes) {
        let (group, data) = (RedisSentinels::spawn(), RedisServer::new());
        let processes = Processes::new(WORKER, &group.url(), &data.url());
        ((group, data), processes)
    }

    mod sentinel {
        lock_tests::job_scenarios!(super::sentinel);
    }

    #[test]
    fn a_fire_due_while_the_server_restarts_runs_once_late() {
        let (mut server, data) = (RedisServer::persistent(), RedisServer::new());
        let processes = Processes::new(WORKER, &server.url(), &data.url());
        processes.a_fire_due_in_a_store_outage_runs_once_late(Duration::from_secs(2), || {
            Some(server.restart())
        });
    }

    #[test]
    fn a_task_held_at_least_1s_on_2s_ticks_runs_every_tick_once() {
        let (_server, processes) = shared();
        processes.a_task_held_at_least_1s_on_2s_ticks_runs_every_tick_once(6);
    }
}
