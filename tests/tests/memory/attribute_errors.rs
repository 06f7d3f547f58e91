//! `errors = "into"`: a body returning `Result<T, E>` keeps its error type;
//! the lock's own errors arrive converted by `E: From<LockError>`, in wait
//! mode as `Result<T, E>`, in skip mode as `Result<Option<T>, E>`.

use std::time::Duration;

use async_trait::async_trait;
use lock_runtime::{LockError, LockOptions, LockRegistry, distributed_lock};

#[derive(Debug, PartialEq)]
enum AppErr {
    OutOfStock,
    Lock(String),
}

impl From<LockError> for AppErr {
    fn from(err: LockError) -> AppErr {
        AppErr::Lock(err.to_string())
    }
}

#[distributed_lock(key = "stock:{item}", wait_timeout = "100ms", registry = locks, errors = "into")]
async fn buy(locks: &LockRegistry, item: u64, stock: u32) -> Result<u32, AppErr> {
    if stock == 0 {
        return Err(AppErr::OutOfStock);
    }
    Ok(stock - 1)
}

#[distributed_lock(key = "job", mode = "skip", registry = locks, errors = "into")]
async fn job(locks: &LockRegistry, fail: bool) -> Result<&'static str, AppErr> {
    if fail {
        Err(AppErr::OutOfStock)
    } else {
        Ok("ran")
    }
}

#[async_trait]
trait Jobs {
    async fn run(&self) -> Result<u8, AppErr>;
}

struct Worker {
    locks: LockRegistry,
}

#[async_trait]
impl Jobs for Worker {
    #[distributed_lock(key = "worker", registry = self.locks, errors = "into", wait_timeout = "100ms")]
    async fn run(&self) -> Result<u8, AppErr> {
        Ok(1)
    }
}

async fn wait_mode_returns_the_bodys_result_and_converts_lock_errors(locks: LockRegistry) {
    let left: Result<u32, AppErr> = buy(&locks, 1, 3).await;
    assert_eq!(left, Ok(2));
    assert_eq!(buy(&locks, 1, 0).await, Err(AppErr::OutOfStock));
    // Held elsewhere past the wait_timeout: the Timeout, converted.
    let held = locks.lock("stock:1", LockOptions::default()).await.unwrap();
    let Err(AppErr::Lock(message)) = buy(&locks, 1, 3).await else {
        panic!("expected the lock's timeout");
    };
    assert!(message.contains("stock:1"), "{message}");
    assert!(message.contains("timed out"), "{message}");
    held.release().await.unwrap();
}

async fn skip_mode_returns_an_option_inside_the_bodys_result(locks: LockRegistry) {
    let ran: Result<Option<&str>, AppErr> = job(&locks, false).await;
    assert_eq!(ran, Ok(Some("ran")));
    assert_eq!(job(&locks, true).await, Err(AppErr::OutOfStock));
    let held = locks.lock("job", LockOptions::default()).await.unwrap();
    assert_eq!(job(&locks, false).await, Ok(None));
    held.release().await.unwrap();
}

async fn async_trait_methods_keep_their_error_type_too(locks: LockRegistry) {
    let worker = Worker { locks };
    assert_eq!(worker.run().await, Ok(1));
    let held = worker
        .locks
        .lock("worker", LockOptions::default().ttl(Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(matches!(worker.run().await, Err(AppErr::Lock(_))));
    held.release().await.unwrap();
}

lock_tests::on_memory_and_redis!(
    wait_mode_returns_the_bodys_result_and_converts_lock_errors,
    skip_mode_returns_an_option_inside_the_bodys_result,
    async_trait_methods_keep_their_error_type_too
);
