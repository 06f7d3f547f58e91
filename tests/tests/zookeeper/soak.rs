//! A short soak on a three-server ZooKeeper ensemble (see
//! `lock_tests::soak`): worker processes killed and frozen at random (past
//! their leases, within their 30 s sessions: overdue holders are taken
//! over), every body checked.

use std::time::Duration;

use lock_tests::ZooKeeperEnsemble;
use lock_tests::soak::Soak;

const WORKER: &str = env!("CARGO_BIN_EXE_lock-worker");

#[test]
fn workers_killed_and_frozen_at_random_never_overlap_and_fence_in_order() {
    let ensemble = ZooKeeperEnsemble::spawn(3);
    let url = ensemble.worker_url(Duration::from_secs(30));
    // The overdue margin (1 s), and the waiter's look once due.
    let report = Soak::new(WORKER, &url, Duration::from_millis(500), 20)
        .recovery(Duration::from_millis(1300))
        .run("zookeeper");
    assert!(report.history.grants.len() > 50, "no progress");
}
