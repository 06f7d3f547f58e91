//! Before `init`, annotated functions fail cleanly; `init` works once.

use lock_runtime::{LockError, LockRegistry, distributed_lock};

#[distributed_lock(key = "early")]
async fn early() -> u8 {
    1
}

#[tokio::test]
async fn not_initialized_then_initialized_once() {
    assert!(matches!(early().await, Err(LockError::NotInitialized)));
    assert!(matches!(
        lock_runtime::registry(),
        Err(LockError::NotInitialized)
    ));
    lock_runtime::init(LockRegistry::memory()).unwrap();
    assert_eq!(early().await.unwrap(), 1);
    let again = lock_runtime::init(LockRegistry::memory());
    assert!(matches!(again, Err(LockError::AlreadyInitialized)));
    assert_eq!(
        early().await.unwrap(),
        1,
        "the first registry stays in place"
    );
}
