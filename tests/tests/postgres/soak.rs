//! A short soak on PostgreSQL (see `lock_tests::soak`): worker processes
//! killed and frozen at random, every body checked.

use std::time::Duration;

use lock_tests::PostgresServer;
use lock_tests::soak::Soak;

const WORKER: &str = env!("CARGO_BIN_EXE_lock-worker");

#[test]
fn workers_killed_and_frozen_at_random_never_overlap_and_fence_in_order() {
    let server = PostgresServer::new();
    let report = Soak::new(WORKER, &server.url(), Duration::from_millis(500), 20).run("postgres");
    assert!(report.history.grants.len() > 50, "no progress");
}
