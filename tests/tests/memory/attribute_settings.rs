//! The attribute with run-time settings: durations from `Duration`
//! expressions and `registry = expr`. This binary never initialises the
//! global registry, so every lock here goes through the one named.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use lock_runtime::{LockError, LockOptions, LockRegistry, distributed_lock};

struct Shop {
    locks: LockRegistry,
    ttl: Duration,
    wait: Duration,
    inside: AtomicUsize,
    most: AtomicUsize,
}

impl Shop {
    fn new(locks: LockRegistry) -> Shop {
        Shop {
            locks,
            ttl: Duration::from_secs(5),
            wait: Duration::from_secs(5),
            inside: AtomicUsize::new(0),
            most: AtomicUsize::new(0),
        }
    }

    #[distributed_lock(key = "stock:{item}", ttl = self.ttl, wait_timeout = self.wait, registry = self.locks)]
    async fn buy(&self, item: u64) -> u64 {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(5)).await;
        self.inside.fetch_sub(1, Ordering::SeqCst);
        item
    }

    #[distributed_lock(key = "stock:{item}", mode = "skip", ttl = self.ttl, registry = &self.locks)]
    async fn try_buy(&self, item: u64) -> u64 {
        item
    }
}

#[distributed_lock(key = "job", registry = locks, ttl = ttl)]
async fn job(locks: &LockRegistry, ttl: Duration) -> &'static str {
    "ran"
}

#[distributed_lock(key = "job", ttl = Duration::from_secs(1), hold_at_least = hold, registry = locks)]
async fn held_job(locks: Arc<LockRegistry>, hold: Duration) {}

/// The named registry is used (the global one was never set up), and the
/// lock still excludes: eight concurrent buyers of one item, one at a time.
async fn a_named_registry_locks_without_the_global_one(locks: LockRegistry) {
    let shop = Arc::new(Shop::new(locks));
    let buyers: Vec<_> = (0..8)
        .map(|_| {
            let shop = shop.clone();
            tokio::spawn(async move { shop.buy(7).await })
        })
        .collect();
    for buyer in buyers {
        assert_eq!(buyer.await.unwrap().unwrap(), 7);
    }
    assert_eq!(shop.most.load(Ordering::SeqCst), 1);
}

/// Two registries in one process are two lock spaces: a key held in one is
/// free in the other, and held for the one it was taken in.
#[tokio::test]
async fn two_registries_in_one_process_are_apart() {
    let (a, b) = (
        Shop::new(LockRegistry::memory()),
        Shop::new(LockRegistry::memory()),
    );
    let held = a
        .locks
        .lock("stock:1", LockOptions::default())
        .await
        .unwrap();
    assert_eq!(a.try_buy(1).await.unwrap(), None, "held in a");
    assert_eq!(b.try_buy(1).await.unwrap(), Some(1), "free in b");
    held.release().await.unwrap();
    assert_eq!(a.try_buy(1).await.unwrap(), Some(1));
}

/// Durations from run-time values are checked when the call runs: a zero
/// ttl, or a hold longer than the ttl, is `InvalidOptions` naming the key,
/// and nothing is left held.
async fn senseless_run_time_durations_are_invalid_options(locks: LockRegistry) {
    assert_eq!(job(&locks, Duration::from_secs(1)).await.unwrap(), "ran");
    let err = job(&locks, Duration::ZERO).await.unwrap_err();
    assert!(matches!(err, LockError::InvalidOptions { .. }), "{err:?}");
    assert!(err.to_string().contains("job"), "{err}");
    let locks = Arc::new(locks);
    let err = held_job(locks.clone(), Duration::from_secs(2))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("hold_at_least"), "{err}");
    // Nothing held: the key is free.
    let free = locks.try_lock("job", LockOptions::default()).await.unwrap();
    assert!(free.is_some());
}

lock_tests::on_memory_and_redis!(
    a_named_registry_locks_without_the_global_one,
    senseless_run_time_durations_are_invalid_options
);

#[distributed_lock(key = "report:{day}", fencing = false, registry = locks)]
async fn unfenced_report(locks: &LockRegistry, day: u32) -> Option<u64> {
    lock_runtime::fencing_token().await.ok()
}

#[distributed_lock(key = "report:{day}", registry = locks)]
async fn fenced_report(locks: &LockRegistry, day: u32) -> Option<u64> {
    lock_runtime::fencing_token().await.ok()
}

/// `fencing = false`: the body's token is 0 (the store's, if it made one,
/// is not promised); the same key's fenced locks keep theirs, and the
/// manual API's `fencing(false)` does the same.
#[tokio::test]
async fn fencing_false_gives_the_body_a_zero_token() {
    let locks = LockRegistry::memory();
    assert_eq!(unfenced_report(&locks, 1).await.unwrap(), Some(0));
    let fenced = fenced_report(&locks, 1)
        .await
        .unwrap()
        .expect("in the body");
    assert!(fenced > 0);
    assert_eq!(unfenced_report(&locks, 1).await.unwrap(), Some(0));
    let guard = locks
        .lock("report:2", LockOptions::default().fencing(false))
        .await
        .unwrap();
    assert_eq!(guard.fencing_token().await.unwrap(), 0);
    guard.release().await.unwrap();
}

#[distributed_lock(key = "ledger:{day}", registry = locks)]
async fn waiting_entry(
    locks: &LockRegistry,
    day: u32,
    entered: tokio::sync::oneshot::Sender<Option<u64>>,
    go_on: tokio::sync::oneshot::Receiver<()>,
) -> (Option<u64>, Option<u64>) {
    let _ = entered.send(lock_runtime::fencing_token().await.ok());
    // A task spawned from the body is another task: no lock of its own.
    let spawned = tokio::spawn(async { lock_runtime::fencing_token().await.ok() })
        .await
        .unwrap();
    let _ = go_on.await;
    (lock_runtime::fencing_token().await.ok(), spawned)
}

/// The locks a body holds are its task's alone: while the body waits, the
/// other tasks on its thread (one thread here) see none, nor does a task
/// it spawns, and the body sees its own again when it runs on; once the
/// call returns, nothing is held.
#[tokio::test(flavor = "current_thread")]
async fn a_bodys_locks_are_its_tasks_alone() {
    let locks = LockRegistry::memory();
    let (entered_tx, entered) = tokio::sync::oneshot::channel();
    let (go_on, go_on_rx) = tokio::sync::oneshot::channel();
    let call = tokio::spawn({
        let locks = locks.clone();
        async move { waiting_entry(&locks, 1, entered_tx, go_on_rx).await }
    });
    let token = entered.await.unwrap().expect("the body sees its lock");
    // The body is waiting: this task runs on the same thread.
    assert!(matches!(
        lock_runtime::fencing_token().await,
        Err(LockError::NotHeld { key: None })
    ));
    assert!(matches!(
        lock_runtime::fencing_token_for("ledger:1").await,
        Err(LockError::NotHeld { key: Some(key) }) if key == "ledger:1"
    ));
    assert!(!lock_runtime::is_lost());
    go_on.send(()).unwrap();
    let (again, spawned) = call.await.unwrap().unwrap();
    assert_eq!(again, Some(token));
    assert_eq!(spawned, None);
    assert!(lock_runtime::fencing_token().await.is_err());
}
