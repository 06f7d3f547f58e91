//! The expansion is clean under strict lints (thiserror's `test_lints.rs`).

#![deny(warnings, unused_qualifications, unreachable_code, unused_results, missing_docs)]

//! Crate docs, for `missing_docs`.

use lock_runtime::{LockRegistry, distributed_lock};

/// Documented, for `missing_docs`.
#[distributed_lock(key = "lint:{id}")]
pub async fn diverging_tail(id: u32) -> u32 {
    if id > 0 {
        return id;
    }
    panic!("zero")
}

/// Documented.
#[distributed_lock(key = "lint", mode = "skip")]
pub async fn unit() {}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    lock_runtime::init(LockRegistry::memory()).unwrap();
    assert_eq!(diverging_tail(1).await.unwrap(), 1);
    assert_eq!(unit().await.unwrap(), Some(()));
}
