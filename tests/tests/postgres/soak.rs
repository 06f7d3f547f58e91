//! A short soak on PostgreSQL (see `lock_tests::soak`): worker processes
//! killed, frozen and cut off (through proxies of their own) at random,
//! the server killed and restarted (crash recovery keeps the lease table),
//! every body checked.

use std::time::Duration;

use lock_tests::PostgresServer;
use lock_tests::soak::{Fault, Soak};

const WORKER: &str = env!("CARGO_BIN_EXE_lock-worker");

#[test]
fn workers_killed_frozen_and_cut_off_and_the_server_restarted_never_overlap_and_fence_in_order() {
    let mut server = PostgresServer::new();
    let soak = Soak::new(WORKER, &server.url(), Duration::from_millis(500), 20)
        .through_proxies(vec![server.port()], |ports| {
            format!("postgres://postgres@127.0.0.1:{}/postgres", ports[0])
        });
    let report = soak.run_with("postgres", &mut || {
        server.restart();
        Some(Fault::kept("restart"))
    });
    assert!(report.history.grants.len() > 50, "no progress");
}
