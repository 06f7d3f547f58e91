//! Per-key state is freed when nobody holds or waits: many distinct keys
//! leave nothing behind, in the registry or in the store.

use lock_runtime::{LockRegistry, MemoryStore, distributed_lock};

#[distributed_lock(key = "growth:{id}", ttl = "5s")]
async fn touch(id: u64) -> u64 {
    tokio::task::yield_now().await;
    id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distinct_keys_leave_no_state_behind() {
    let store = MemoryStore::new();
    lock_runtime::init(LockRegistry::builder(store.clone()).build().unwrap()).unwrap();
    let registry = lock_runtime::registry().unwrap();
    const KEYS: u64 = 1_000_000;
    let mut tasks = Vec::new();
    for worker in 0..8 {
        tasks.push(tokio::spawn(async move {
            let mut sum = 0;
            for id in (worker..KEYS).step_by(8) {
                sum += touch(id).await.unwrap();
            }
            sum
        }));
    }
    let mut sum = 0;
    for task in tasks {
        sum += task.await.unwrap();
    }
    assert_eq!(sum, KEYS * (KEYS - 1) / 2, "every call ran");
    assert_eq!(registry.local_keys(), 0, "local queues freed");
    assert_eq!(store.tracked_keys(), 0, "store entries freed");
}
