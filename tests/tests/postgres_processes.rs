//! Many real OS processes (`lock-worker`) locking through one PostgreSQL
//! server; the data they race on lives in a Redis server.

use std::time::{Duration, Instant};

use lock_tests::{PostgresServer, RedisServer, Worker, field, unique_key};
use redis::Commands;

const WORKER: &str = env!("CARGO_BIN_EXE_lock-worker");
const STARTUP: Duration = Duration::from_secs(10);

/// The lock server and the data server.
struct Servers {
    locks: PostgresServer,
    data: RedisServer,
}

impl Servers {
    fn new() -> Servers {
        Servers {
            locks: PostgresServer::new(),
            data: RedisServer::new(),
        }
    }

    fn worker(&self, scenario: &str, key: &str, extra: &[&str]) -> Worker {
        let (url, data) = (self.locks.url(), self.data.url());
        let mut args = vec![scenario, url.as_str(), key];
        args.extend_from_slice(extra);
        Worker::spawn_with_env(WORKER, &args, &[("LOCK_WORKER_DATA_URL", &data)])
    }

    /// Runs `processes` workers of 4 tasks against a stock of `stock`;
    /// returns the levels sold.
    fn sell(&self, scenario: &str, processes: usize, stock: i64) -> Vec<i64> {
        let item = unique_key("item");
        let mut conn = self.data.connection();
        let () = conn.set(format!("oversell:{item}:level"), stock).unwrap();
        let workers: Vec<_> = (0..processes)
            .map(|_| self.worker(scenario, &item, &["4"]))
            .collect();
        for worker in workers {
            let (status, lines) = worker.finish(Duration::from_secs(60));
            assert!(status.success(), "worker failed: {lines:?}");
        }
        let level: i64 = conn.get(format!("oversell:{item}:level")).unwrap();
        assert_eq!(level, 0, "stock left");
        conn.lrange(format!("oversell:{item}:sold"), 0, -1).unwrap()
    }
}

#[test]
fn four_processes_sell_exactly_the_stock() {
    let servers = Servers::new();
    let mut sold = servers.sell("oversell", 4, 40);
    sold.sort_unstable();
    assert_eq!(sold, (1..=40).collect::<Vec<_>>(), "each level sold once");
}

#[test]
fn without_the_lock_the_same_processes_oversell() {
    let servers = Servers::new();
    let sold = servers.sell("oversell-unlocked", 4, 40);
    assert!(sold.len() > 40, "expected an oversell, sold {}", sold.len());
}

#[test]
fn skip_mode_skips_while_another_process_runs_the_job() {
    let servers = Servers::new();
    let key = unique_key("job");
    let mut holder = servers.worker("hold-30s", &key, &["1500"]);
    holder.expect("acquired", STARTUP);
    let (status, lines) = servers.worker("skip", &key, &[]).finish(STARTUP);
    assert!(status.success());
    assert!(lines.iter().any(|l| l.starts_with("skipped")), "{lines:?}");
    holder.expect("released", STARTUP);
    let (_, lines) = servers.worker("skip", &key, &[]).finish(STARTUP);
    assert!(lines.iter().any(|l| l.starts_with("ran")), "{lines:?}");
}

#[test]
fn a_sigkilled_holder_blocks_others_for_at_most_its_ttl() {
    let servers = Servers::new();
    let key = unique_key("crash");
    let mut holder = servers.worker("hold-1s", &key, &["60000"]);
    holder.expect("acquired", STARTUP);
    let mut waiter = servers.worker("wait", &key, &[]);
    waiter.expect("ready", STARTUP);
    holder.kill();
    let killed_at = Instant::now();
    waiter.expect("acquired", Duration::from_secs(5));
    let blocked = killed_at.elapsed();
    assert!(
        blocked < Duration::from_millis(1300),
        "blocked {blocked:?} after SIGKILL"
    );
}

#[test]
fn fencing_tokens_strictly_increase_across_processes() {
    let servers = Servers::new();
    let key = unique_key("fence");
    let workers: Vec<_> = (0..4)
        .map(|_| servers.worker("fence", &key, &["25"]))
        .collect();
    for worker in workers {
        let (status, lines) = worker.finish(Duration::from_secs(60));
        assert!(status.success(), "{lines:?}");
    }
    // Appended under the lock, so list order is holding order.
    let tokens: Vec<u64> = servers
        .data
        .connection()
        .lrange(format!("fence:{key}"), 0, -1)
        .unwrap();
    assert_eq!(tokens.len(), 100);
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

#[test]
fn a_waiter_in_another_process_is_woken_by_the_release() {
    let servers = Servers::new();
    let key = unique_key("handoff");
    let mut holder = servers.worker("hold-30s", &key, &["1500"]);
    holder.expect("acquired", STARTUP);
    let mut waiter = servers.worker("wait", &key, &[]);
    waiter.expect("ready", STARTUP);
    let released: u128 = field(&holder.expect("releasing", STARTUP), "at_ms")
        .parse()
        .unwrap();
    let acquired: u128 = field(&waiter.expect("acquired", STARTUP), "at_ms")
        .parse()
        .unwrap();
    let handoff = acquired.saturating_sub(released);
    // ~29 s were left on the holder's lease: only NOTIFY explains this.
    assert!(handoff < 1000, "hand-off took {handoff} ms");
    eprintln!("cross-process hand-off on PostgreSQL: {handoff} ms");
}

#[test]
fn a_lease_row_deleted_under_a_running_body_cancels_it() {
    let servers = Servers::new();
    let key = unique_key("deleted");
    // A 1 s lease renewed every 333 ms, for a 5 s body.
    let mut holder = servers.worker("hold-1s", &key, &["5000"]);
    holder.expect("acquired", STARTUP);
    let deleted = servers
        .locks
        .psql("WITH d AS (DELETE FROM lock_leases RETURNING 1) SELECT count(*) FROM d");
    assert_eq!(deleted, "1");
    let deleted_at = Instant::now();
    let lost = holder.expect("error", STARTUP);
    assert!(lost.contains("was lost"), "{lost}");
    // Noticed at the next renewal.
    assert!(
        deleted_at.elapsed() < Duration::from_millis(900),
        "{:?}",
        deleted_at.elapsed()
    );
    let (status, lines) = holder.finish(STARTUP);
    assert!(status.success(), "{lines:?}");
    assert!(
        !lines.iter().any(|l| l.starts_with("releasing")),
        "body cancelled: {lines:?}"
    );
}
