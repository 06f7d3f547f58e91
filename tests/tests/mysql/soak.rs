//! A short soak on MariaDB (see `lock_tests::soak`): worker processes
//! killed, frozen and cut off (through proxies of their own) at random,
//! the server frozen past every lease, or killed and restarted (crash
//! recovery keeps the lease table), every body checked.

use lock_tests::MariaDbServer;
use lock_tests::soak::one_server_frozen_or_restarted;

const WORKER: &str = env!("CARGO_BIN_EXE_lock-worker");

#[test]
fn workers_killed_frozen_and_cut_off_and_the_server_frozen_or_restarted_never_overlap_and_fence_in_order()
 {
    one_server_frozen_or_restarted(WORKER, "mysql", &mut MariaDbServer::new());
}
