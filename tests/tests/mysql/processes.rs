//! Many real OS processes (`lock-worker`) locking through one MariaDB
//! server; the data they race on lives in a Redis server.

use std::time::Duration;

use lock_runtime::LockRegistry;
use lock_tests::processes::{Processes, WithData};
use lock_tests::{MariaDbServer, process_scenarios};

const WORKER: &str = env!("CARGO_BIN_EXE_lock-worker");

/// Fresh servers, and the processes of the scenarios every store passes.
fn shared() -> (WithData<MariaDbServer>, Processes) {
    WithData::start(WORKER, MariaDbServer::new())
}

process_scenarios!(shared);
process_scenarios!(
    shared:
    a_semaphore_of_three_across_processes_is_reached_and_never_exceeded,
    a_sigkilled_permit_holder_frees_its_permit_within_its_ttl,
    readers_overlap_and_a_writer_gets_in_within_a_bound,
);

#[test]
fn another_process_holding_a_key_is_seen_and_can_be_freed() {
    let (servers, processes) = shared();
    let url = servers.locks.url();
    processes.another_process_holding_a_key_is_seen_and_can_be_freed(async || {
        LockRegistry::mysql(&url).await.expect("connect")
    });
}

#[test]
fn a_lease_row_deleted_under_a_running_body_cancels_it() {
    let (servers, processes) = shared();
    processes.a_lease_undone_under_a_running_body_cancels_it("deleted", |_key| {
        let deleted = servers.locks.sql(
            "DELETE FROM locks.lock_leases WHERE expires_at > UTC_TIMESTAMP(6); SELECT ROW_COUNT()",
        );
        assert_eq!(deleted, "1");
    });
}

lock_tests::job_scenarios!(shared);

#[test]
fn a_fire_due_while_the_server_restarts_runs_once_late() {
    let (mut servers, processes) = shared();
    processes.a_fire_due_in_a_store_outage_runs_once_late(Duration::from_secs(5), || {
        Some(servers.locks.restart())
    });
}
