//! A short soak on one Redis server (see `lock_tests::soak`): worker
//! processes killed and frozen at random, the server frozen, every body
//! checked; and the proof that the checker catches a broken release.

use std::time::Duration;

use lock_tests::RedisServer;
use lock_tests::soak::Soak;

const WORKER: &str = env!("CARGO_BIN_EXE_lock-worker");

/// Workers killed and frozen, and the server frozen past every lease (its
/// keys expire by its own clock meanwhile).
#[test]
fn workers_killed_and_frozen_and_the_server_frozen_never_overlap_and_fence_in_order() {
    let server = RedisServer::new();
    let ttl = Duration::from_millis(500);
    let report = Soak::new(WORKER, &server.url(), ttl, 20).run_with("redis", &mut || {
        server.pause();
        std::thread::sleep(ttl * 2);
        server.resume();
        Some("server-frozen")
    });
    assert!(report.history.grants.len() > 50, "no progress");
}

/// The checker bites: the same soak with leases that release without
/// checking the owner (a holder back from a freeze deletes its
/// successor's lock) is caught with overlapping bodies.
#[test]
fn a_release_that_does_not_check_the_owner_is_caught() {
    let server = RedisServer::new();
    let url = format!("careless+{}", server.url());
    let report = Soak::new(WORKER, &url, Duration::from_millis(500), 20).record("careless redis");
    let violations = report.history.violations(report.ended_us);
    eprintln!("the careless release, caught:\n{}", violations.join("\n"));
    assert!(
        violations.iter().any(|found| found.starts_with("overlap")),
        "seed {}: no overlap found; frozen {} times",
        report.seed,
        report.freezes
    );
}
