//! A short soak on a three-server ZooKeeper ensemble (see
//! `lock_tests::soak`): worker processes killed, frozen and cut off
//! (through proxies of their own to every server) at random, past their
//! leases and within their 30 s sessions (overdue holders are taken over),
//! the leader frozen past every lease (the others elect another; it comes
//! back a follower) or killed and restarted, every body checked.

use std::time::Duration;

use lock_tests::ZooKeeperEnsemble;
use lock_tests::soak::{Fault, Soak};

const WORKER: &str = env!("CARGO_BIN_EXE_lock-worker");

#[test]
fn workers_killed_frozen_and_cut_off_and_the_leader_frozen_or_restarted_never_overlap_and_fence_in_order()
 {
    let mut ensemble = ZooKeeperEnsemble::spawn(3);
    let ttl = Duration::from_millis(500);
    let mut faults = 0;
    let servers = (0..ensemble.len())
        .map(|i| ensemble.client_port(i))
        .collect();
    // The overdue margin (1 s), and the waiter's look once due.
    let url = ensemble.worker_url(Duration::from_secs(30));
    let report = Soak::new(WORKER, &url, ttl, 20)
        .recovery(Duration::from_millis(1300))
        .through_proxies(servers, |ports| {
            let servers: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
            format!("zookeeper://{}?session_ms=30000", servers.join(","))
        })
        .run_with("zookeeper", &mut || {
            let leader = ensemble.leader()?;
            faults += 1;
            if faults % 2 == 1 {
                ensemble.pause(leader);
                std::thread::sleep(ttl * 4);
                ensemble.resume(leader);
                Some(Fault::kept("leader-frozen"))
            } else {
                if let Err(why) = ensemble.restart(leader) {
                    panic!("the ensemble did not recover from restarting server {leader}: {why}");
                }
                Some(Fault::kept("leader-restarted"))
            }
        });
    assert!(report.history.grants.len() > 50, "no progress");
}
