//! A short soak on PostgreSQL (see `lock_tests::soak`): worker processes
//! killed and frozen at random, the server killed and restarted (crash
//! recovery keeps the lease table), every body checked.

use std::time::Duration;

use lock_tests::PostgresServer;
use lock_tests::soak::Soak;

const WORKER: &str = env!("CARGO_BIN_EXE_lock-worker");

#[test]
fn workers_killed_and_frozen_and_the_server_restarted_never_overlap_and_fence_in_order() {
    let mut server = PostgresServer::new();
    let soak = Soak::new(WORKER, &server.url(), Duration::from_millis(500), 20);
    let report = soak.run_with("postgres", &mut || {
        server.restart();
        Some("restart")
    });
    assert!(report.history.grants.len() > 50, "no progress");
}
