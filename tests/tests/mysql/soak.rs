//! A short soak on MariaDB (see `lock_tests::soak`): worker processes
//! killed, frozen and cut off (through proxies of their own) at random,
//! the server frozen past every lease, or killed and restarted (crash
//! recovery keeps the lease table), every body checked.

use std::time::Duration;

use lock_tests::MariaDbServer;
use lock_tests::soak::{Fault, Soak};

const WORKER: &str = env!("CARGO_BIN_EXE_lock-worker");

#[test]
fn workers_killed_frozen_and_cut_off_and_the_server_frozen_or_restarted_never_overlap_and_fence_in_order()
 {
    let mut server = MariaDbServer::new();
    let ttl = Duration::from_millis(500);
    let mut faults = 0;
    let soak = Soak::new(WORKER, &server.url(), ttl, 20)
        .through_proxies(vec![server.port()], |ports| {
            format!("mysql://root@127.0.0.1:{}/locks", ports[0])
        });
    let report = soak.run_with("mysql", &mut || {
        faults += 1;
        if faults % 2 == 1 {
            server.pause();
            std::thread::sleep(ttl * 2);
            server.resume();
            Some(Fault::kept("server-frozen"))
        } else {
            server.restart();
            Some(Fault::kept("restart"))
        }
    });
    assert!(report.history.grants.len() > 50, "no progress");
}
