//! A short soak of the in-process store (see `lock_tests::soak`): one
//! worker process of eight tasks, the store inside it, so no process is
//! killed, frozen or cut off; the tasks' own choices are the faults
//! (bodies past their leases with the watchdog off or a `max_hold`,
//! callers giving up mid-body). Every body checked.

use std::time::Duration;

use lock_tests::soak::Soak;

const WORKER: &str = env!("CARGO_BIN_EXE_lock-worker");

#[test]
fn eight_tasks_never_overlap_and_fence_in_order() {
    let report = Soak::new(WORKER, "memory", Duration::from_millis(200), 15)
        .workers(1, 8)
        .run("memory");
    assert!(report.history.grants.len() > 200, "no progress");
}
