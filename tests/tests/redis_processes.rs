//! Many real OS processes (`lock-worker`) sharing one `redis-server`.

use std::time::{Duration, Instant};

use lock_runtime::LockRegistry;
use lock_tests::processes::{Processes, STARTUP};
use lock_tests::{RedisServer, unique_key};
use redis::Commands;

const WORKER: &str = env!("CARGO_BIN_EXE_lock-worker");

fn lock_name(key: &str) -> String {
    format!("lock:{{{key}}}")
}

/// The scenarios every store passes, on one server that also holds the data.
fn shared(server: &RedisServer) -> Processes {
    Processes::new(WORKER, &server.url(), &server.url())
}

macro_rules! shared_scenarios {
    ($($scenario:ident),* $(,)?) => {
        $(
            #[test]
            fn $scenario() {
                let server = RedisServer::new();
                shared(&server).$scenario();
            }
        )*
    };
}

shared_scenarios!(
    four_processes_sell_exactly_the_stock,
    opposite_transfers_across_processes_never_deadlock,
    without_the_lock_the_same_processes_oversell,
    skip_mode_skips_while_another_process_runs_the_job,
    a_sigkilled_holder_blocks_others_for_at_most_its_ttl,
    fencing_tokens_strictly_increase_across_processes,
    a_waiter_in_another_process_is_woken_by_the_release,
);

#[test]
fn another_process_holding_a_key_is_seen_and_can_be_freed() {
    let server = RedisServer::new();
    let url = server.url();
    shared(&server).another_process_holding_a_key_is_seen_and_can_be_freed(async || {
        LockRegistry::redis(&url).await.expect("connect")
    });
}

#[test]
fn the_watchdog_keeps_a_1s_lease_through_a_3s_body_in_another_process() {
    let server = RedisServer::new();
    let key = unique_key("watchdog");
    let mut holder = shared(&server).worker("hold-1s", &key, &["3000"]);
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
    let (_, lines) = shared(&server).worker("skip", &key, &[]).finish(STARTUP);
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
    let mut first = shared(&server).worker("hold-unrenewed", &key, &["3000"]);
    first.expect("acquired", STARTUP);
    // B waits, and takes the lock once A's lease has expired.
    let mut second = shared(&server).worker("hold-30s", &key, &["2000"]);
    second.expect("acquired", STARTUP);
    let lost = first.expect("error", STARTUP);
    assert!(lost.contains("was lost"), "{lost}");
    let (status, lines) = first.finish(STARTUP);
    assert!(status.success(), "{lines:?}");
    assert!(
        !lines.iter().any(|l| l.starts_with("releasing")),
        "A's body was cancelled: {lines:?}"
    );
    // A's exit left B's lease in place.
    let pttl: i64 = server.connection().pttl(lock_name(&key)).unwrap();
    assert!(pttl > 20_000, "B's 30 s lease is intact (pttl {pttl})");
    second.expect("released", STARTUP);
}
