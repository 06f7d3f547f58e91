//! A short soak on a three-member etcd cluster (see `lock_tests::soak`):
//! worker processes killed, frozen and cut off (through proxies of their
//! own to every member) at random, the leader frozen past every lease (the
//! others elect another; it comes back a follower) or killed and
//! restarted, every body checked. Elections and stalls the cluster makes
//! by itself are watched for and written down as its faults.
//! etcd counts leases in whole seconds: 1 s leases.

use std::time::Duration;

use lock_tests::EtcdCluster;
use lock_tests::soak::{Fault, Soak};

const WORKER: &str = env!("CARGO_BIN_EXE_lock-worker");

#[test]
fn workers_killed_frozen_and_cut_off_and_the_leader_frozen_or_restarted_never_overlap_and_fence_in_order()
 {
    let mut cluster = EtcdCluster::spawn(3);
    let ttl = Duration::from_secs(1);
    let mut faults = 0;
    let members = (0..cluster.len()).map(|i| cluster.client_port(i)).collect();
    // Leases expire in whole seconds: up to 1 s past their ttl.
    // Elections and stalls the cluster makes by itself on a loaded
    // machine are its faults too.
    let watch = cluster.watch(ttl);
    let soak = Soak::new(WORKER, &cluster.worker_url(), ttl, 25)
        .recovery(Duration::from_millis(1300))
        .watched(watch)
        .through_proxies(members, |ports| {
            let members: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
            format!("etcd://{}", members.join(","))
        });
    let report = soak.run_with("etcd", &mut || {
        let leader = cluster.leader()?;
        faults += 1;
        if faults % 2 == 1 {
            cluster.pause(leader);
            std::thread::sleep(ttl * 2);
            cluster.resume(leader);
            // Deposed meanwhile, it may still answer keep-alives as it
            // resumes, until it learns it was deposed (see the store's
            // docs): leases lost, up to a lease after.
            Some(Fault::lossy_lingering("leader-frozen", ttl))
        } else {
            assert!(
                cluster.restart(leader),
                "the cluster did not recover; the restarted server's log ends:\n{}",
                lock_tests::last_lines(&cluster.log(leader), 40)
            );
            Some(Fault::kept("leader-restarted"))
        }
    });
    assert!(report.history.grants.len() > 30, "no progress");
}
