//! Many real OS processes (`lock-worker`) sharing one `redis-server`.

use std::time::{Duration, Instant};

use lock_tests::{RedisServer, Worker, field, unique_key};
use redis::Commands;

const WORKER: &str = env!("CARGO_BIN_EXE_lock-worker");
const STARTUP: Duration = Duration::from_secs(10);

fn worker(scenario: &str, server: &RedisServer, key: &str, extra: &[&str]) -> Worker {
    let url = server.url();
    let mut args = vec![scenario, url.as_str(), key];
    args.extend_from_slice(extra);
    Worker::spawn(WORKER, &args)
}

fn lock_name(key: &str) -> String {
    format!("lock:{{{key}}}")
}

/// Runs `processes` workers with 4 tasks each against a stock of `stock`;
/// returns the levels sold.
fn sell(server: &RedisServer, scenario: &str, processes: usize, stock: i64) -> Vec<i64> {
    let item = unique_key("item");
    let mut conn = server.connection();
    let () = conn.set(format!("oversell:{item}:level"), stock).unwrap();
    let workers: Vec<_> = (0..processes)
        .map(|_| worker(scenario, server, &item, &["4"]))
        .collect();
    for worker in workers {
        let (status, lines) = worker.finish(Duration::from_secs(60));
        assert!(status.success(), "worker failed: {lines:?}");
    }
    let level: i64 = conn.get(format!("oversell:{item}:level")).unwrap();
    assert_eq!(level, 0, "stock left");
    conn.lrange(format!("oversell:{item}:sold"), 0, -1).unwrap()
}

#[test]
fn four_processes_sell_exactly_the_stock() {
    let server = RedisServer::new();
    let mut sold = sell(&server, "oversell", 4, 40);
    sold.sort_unstable();
    assert_eq!(
        sold,
        (1..=40).collect::<Vec<_>>(),
        "each stock level sold exactly once"
    );
}

#[test]
fn without_the_lock_the_same_processes_oversell() {
    // The control: the read-modify-write really races across processes.
    let server = RedisServer::new();
    let sold = sell(&server, "oversell-unlocked", 4, 40);
    assert!(
        sold.len() > 40,
        "expected an oversell without the lock, sold {}",
        sold.len()
    );
}

#[test]
fn skip_mode_skips_while_another_process_runs_the_job() {
    let server = RedisServer::new();
    let key = unique_key("job");
    let mut holder = worker("hold-30s", &server, &key, &["1500"]);
    holder.expect("acquired", STARTUP);
    let (status, lines) = worker("skip", &server, &key, &[]).finish(STARTUP);
    assert!(status.success());
    assert!(lines.iter().any(|l| l.starts_with("skipped")), "{lines:?}");
    assert!(!lines.iter().any(|l| l.starts_with("ran")), "{lines:?}");
    holder.expect("released", STARTUP);
    let (status, lines) = worker("skip", &server, &key, &[]).finish(STARTUP);
    assert!(status.success());
    assert!(lines.iter().any(|l| l.starts_with("ran")), "{lines:?}");
}

#[test]
fn the_watchdog_keeps_a_1s_lease_through_a_3s_body_in_another_process() {
    let server = RedisServer::new();
    let key = unique_key("watchdog");
    let mut holder = worker("hold-1s", &server, &key, &["3000"]);
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
    let (_, lines) = worker("skip", &server, &key, &[]).finish(STARTUP);
    assert!(lines.iter().any(|l| l.starts_with("skipped")), "{lines:?}");
    holder.expect("released", STARTUP);
    let exists: bool = conn.exists(lock_name(&key)).unwrap();
    assert!(!exists, "freed after the body");
}

#[test]
fn a_sigkilled_holder_blocks_others_for_at_most_its_ttl() {
    let server = RedisServer::new();
    let key = unique_key("crash");
    let mut holder = worker("hold-1s", &server, &key, &["60000"]);
    holder.expect("acquired", STARTUP);
    let mut waiter = worker("wait", &server, &key, &[]);
    waiter.expect("ready", STARTUP);
    holder.kill();
    let killed_at = Instant::now();
    waiter.expect("acquired", Duration::from_secs(5));
    let blocked = killed_at.elapsed();
    // The lease had at most 1 s left; allow for the waiter's jitter.
    assert!(
        blocked < Duration::from_millis(1300),
        "blocked {blocked:?} after SIGKILL"
    );
}

#[test]
fn fencing_tokens_strictly_increase_across_processes() {
    let server = RedisServer::new();
    let key = unique_key("fence");
    let workers: Vec<_> = (0..4)
        .map(|_| worker("fence", &server, &key, &["25"]))
        .collect();
    for worker in workers {
        let (status, lines) = worker.finish(Duration::from_secs(60));
        assert!(status.success(), "{lines:?}");
    }
    // Appended under the lock, so list order is holding order.
    let tokens: Vec<u64> = server
        .connection()
        .lrange(format!("fence:{key}"), 0, -1)
        .unwrap();
    assert_eq!(tokens.len(), 100);
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

#[test]
fn a_waiter_in_another_process_is_woken_by_the_release() {
    let server = RedisServer::new();
    let key = unique_key("handoff");
    let mut holder = worker("hold-30s", &server, &key, &["1500"]);
    holder.expect("acquired", STARTUP);
    let mut waiter = worker("wait", &server, &key, &[]);
    waiter.expect("ready", STARTUP);
    let released: u128 = field(&holder.expect("releasing", STARTUP), "at_ms")
        .parse()
        .unwrap();
    let acquired: u128 = field(&waiter.expect("acquired", STARTUP), "at_ms")
        .parse()
        .unwrap();
    let handoff = acquired.saturating_sub(released);
    // The holder's 30 s lease had ~29 s left: waiting on its expiry would
    // take seconds (the retry is capped at 5 s). Only the release
    // notification explains a hand-off within a second.
    assert!(handoff < 1000, "hand-off took {handoff} ms");
    eprintln!("cross-process hand-off: {handoff} ms");
}

#[test]
fn an_expired_holder_gets_lost_and_leaves_the_next_process_lock_alone() {
    let server = RedisServer::new();
    let key = unique_key("expired");
    // A holds a 500 ms lease without the watchdog for a 3 s body.
    let mut first = worker("hold-unrenewed", &server, &key, &["3000"]);
    first.expect("acquired", STARTUP);
    // B waits, and takes the lock once A's lease has expired.
    let mut second = worker("hold-30s", &server, &key, &["2000"]);
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
