//! Inner attributes stay at the top of the function.

use lock_runtime::{LockRegistry, distributed_lock};

#[distributed_lock(key = "inner")]
async fn inner_attrs() -> u32 {
    #![allow(unused_variables)]
    let unused = 1;
    2
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    lock_runtime::init(LockRegistry::memory()).unwrap();
    assert_eq!(inner_attrs().await.unwrap(), 2);
}
