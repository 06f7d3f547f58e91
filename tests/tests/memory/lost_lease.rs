//! A lease lost under a running body: cancelled at its next `.await` (the
//! default), or with `on_lost = "notify"` left to run to its end, told by
//! `lock_runtime::lost()`, the call still ending in `Lost` (or, with
//! `errors = "into"`, the body's own error). The memory store pushes a
//! forced release to the holder at once, so each loss here is immediate.

use std::sync::Mutex;
use std::time::Duration;

use lock_runtime::{LockError, LockOptions, LockRegistry, OnLost, distributed_lock};
use lock_tests::unique_key;
use tokio::sync::oneshot;

/// Where a body got to.
#[derive(Default)]
struct Steps(Mutex<Vec<&'static str>>);

impl Steps {
    fn push(&self, step: &'static str) {
        self.0.lock().unwrap().push(step);
    }

    fn taken(&self) -> Vec<&'static str> {
        self.0.lock().unwrap().clone()
    }
}

/// Says it is in (and whether its lease is lost yet), waits for the loss,
/// then takes a step that needs an `.await` (the undo).
async fn wait_for_loss_then_undo(entered: oneshot::Sender<bool>, steps: &Steps) {
    entered.send(lock_runtime::is_lost()).unwrap();
    lock_runtime::lost().await;
    steps.push("saw the loss");
    assert!(lock_runtime::is_lost());
    tokio::task::yield_now().await;
    steps.push("undid the step");
}

#[distributed_lock(key = "export:{k}", registry = locks, on_lost = "notify")]
async fn notified(locks: &LockRegistry, k: &str, entered: oneshot::Sender<bool>, steps: &Steps) {
    wait_for_loss_then_undo(entered, steps).await;
}

#[distributed_lock(key = "export:{k}", registry = locks, on_lost = "cancel")]
async fn cancelled(locks: &LockRegistry, k: &str, entered: oneshot::Sender<bool>, steps: &Steps) {
    wait_for_loss_then_undo(entered, steps).await;
}

/// Runs `call` until it is inside its body, frees `key` as an operator
/// would, and returns the call's result.
async fn lose_lease_under<T>(
    locks: &LockRegistry,
    key: &str,
    call: impl Future<Output = T>,
    entered: oneshot::Receiver<bool>,
) -> T {
    let lose = async {
        let lost_before = entered.await.unwrap();
        assert!(!lost_before, "is_lost() before the loss");
        assert!(locks.force_release(key).await.unwrap());
    };
    let (result, ()) =
        tokio::time::timeout(Duration::from_secs(5), async { tokio::join!(call, lose) })
            .await
            .expect("the call ended after the loss");
    result
}

#[tokio::test]
async fn a_notified_body_runs_on_past_the_loss_and_the_call_is_lost() {
    let locks = LockRegistry::memory();
    let k = unique_key("notify");
    let steps = Steps::default();
    let (tx, rx) = oneshot::channel();
    let key = format!("export:{k}");
    let result = lose_lease_under(&locks, &key, notified(&locks, &k, tx, &steps), rx).await;
    match result {
        Err(LockError::Lost { key: lost }) => assert_eq!(lost, key),
        other => panic!("expected Lost, got {other:?}"),
    }
    assert_eq!(steps.taken(), ["saw the loss", "undid the step"]);
    assert_eq!(locks.local_keys(), 0, "nothing left held");
}

#[tokio::test]
async fn by_default_the_body_is_cancelled_at_the_loss() {
    let locks = LockRegistry::memory();
    let k = unique_key("cancel");
    let steps = Steps::default();
    let (tx, rx) = oneshot::channel();
    let key = format!("export:{k}");
    let result = lose_lease_under(&locks, &key, cancelled(&locks, &k, tx, &steps), rx).await;
    assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");
    assert!(steps.taken().is_empty(), "cancelled: {:?}", steps.taken());
}

#[derive(Debug, PartialEq)]
enum ExportError {
    RolledBack,
    Lock(String),
}

impl From<LockError> for ExportError {
    fn from(error: LockError) -> Self {
        ExportError::Lock(error.to_string())
    }
}

/// With `errors = "into"`: after the loss the body undoes its step and
/// returns its own error (`undo`), or returns `Ok` regardless.
#[distributed_lock(key = "export:{k}", registry = locks, on_lost = "notify", errors = "into")]
async fn fallible(
    locks: &LockRegistry,
    k: &str,
    entered: oneshot::Sender<bool>,
    undo: bool,
) -> Result<u32, ExportError> {
    entered.send(false).unwrap();
    lock_runtime::lost().await;
    if undo {
        Err(ExportError::RolledBack)
    } else {
        Ok(7)
    }
}

#[tokio::test]
async fn a_notified_body_s_own_error_stands_and_its_ok_becomes_lost() {
    let locks = LockRegistry::memory();
    for undo in [true, false] {
        let k = unique_key("into");
        let (tx, rx) = oneshot::channel();
        let key = format!("export:{k}");
        let result = lose_lease_under(&locks, &key, fallible(&locks, &k, tx, undo), rx).await;
        if undo {
            assert_eq!(result, Err(ExportError::RolledBack));
        } else {
            match result {
                Err(ExportError::Lock(message)) => {
                    assert!(
                        message.contains("lost") && message.contains(&key),
                        "{message}"
                    )
                }
                other => panic!("expected the lock's Lost, got {other:?}"),
            }
        }
    }
}

#[distributed_lock(keys = ["acct:{a}", "acct:{b}"], registry = locks, on_lost = "notify")]
async fn notified_pair(
    locks: &LockRegistry,
    a: &str,
    b: &str,
    entered: oneshot::Sender<bool>,
    steps: &Steps,
) {
    wait_for_loss_then_undo(entered, steps).await;
}

#[tokio::test]
async fn with_several_keys_a_loss_on_one_is_told_and_the_other_is_freed() {
    let locks = LockRegistry::memory();
    let (a, b) = (unique_key("a"), unique_key("b"));
    let steps = Steps::default();
    let (tx, rx) = oneshot::channel();
    let lost_key = format!("acct:{b}");
    let call = notified_pair(&locks, &a, &b, tx, &steps);
    match lose_lease_under(&locks, &lost_key, call, rx).await {
        Err(LockError::Lost { key }) => assert_eq!(key, lost_key),
        other => panic!("expected Lost, got {other:?}"),
    }
    assert_eq!(steps.taken(), ["saw the loss", "undid the step"]);
    let other = locks
        .try_lock(&format!("acct:{a}"), LockOptions::default())
        .await
        .unwrap();
    assert!(other.is_some(), "the key not lost was released");
}

#[tokio::test]
async fn with_lock_runs_a_body_under_the_lock_and_honours_on_lost() {
    let locks = LockRegistry::memory();
    let key = unique_key("with");
    // Re-entrant, as the attribute: the nested call shares the lease.
    let (outer, inner) = locks
        .with_lock(&key, LockOptions::default(), async {
            let outer = lock_runtime::fencing_token().await.unwrap();
            let inner = locks
                .with_lock(&key, LockOptions::default(), async {
                    lock_runtime::fencing_token().await.unwrap()
                })
                .await
                .unwrap();
            (outer, inner)
        })
        .await
        .unwrap();
    assert_eq!(outer, inner);

    for on_lost in [OnLost::Cancel, OnLost::Notify] {
        let steps = Steps::default();
        let (tx, rx) = oneshot::channel();
        let opts = LockOptions::default().on_lost(on_lost);
        let call = locks.with_lock(&key, opts, wait_for_loss_then_undo(tx, &steps));
        let result = lose_lease_under(&locks, &key, call, rx).await;
        assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");
        let expected: &[&str] = match on_lost {
            OnLost::Cancel => &[],
            OnLost::Notify => &["saw the loss", "undid the step"],
        };
        assert_eq!(steps.taken(), expected, "{on_lost:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn outside_a_locked_body_nothing_is_lost() {
    assert!(!lock_runtime::is_lost());
    let waited = tokio::time::timeout(Duration::from_secs(3600), lock_runtime::lost()).await;
    assert!(waited.is_err(), "lost() completed with no lease held");
}

/// A runtime of one thread, which a task blocking it freezes whole, and
/// the steps a body records.
fn one_thread_and_steps() -> (tokio::runtime::Runtime, std::sync::Arc<Steps>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    (runtime, std::sync::Arc::new(Steps::default()))
}

/// A process frozen past its lease (here a task blocking the runtime's
/// only thread, as SIGSTOP would): the body, woken afterwards by something
/// other than a timer before the runtime's own timers have fired, is
/// cancelled before it runs on: its lease ended while it waited.
#[test]
fn a_body_woken_after_its_lease_ended_is_cancelled_before_it_runs_on() {
    let (runtime, steps) = one_thread_and_steps();
    let result = runtime.block_on(async {
        let locks = LockRegistry::memory();
        let (inside, entered) = oneshot::channel::<()>();
        let (wake, woken) = oneshot::channel::<()>();
        let options = LockOptions::default()
            .ttl(Duration::from_millis(100))
            .watchdog(false);
        let body_steps = steps.clone();
        let body = tokio::spawn(async move {
            locks
                .with_lock(&unique_key("frozen"), options, async {
                    let _ = inside.send(());
                    let _ = woken.await;
                    body_steps.push("ran on after the freeze");
                })
                .await
        });
        entered.await.unwrap();
        // Woken from another thread while the runtime's thread is frozen:
        // the wake is queued before the expired timers are looked at.
        tokio::spawn(async move {
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(150));
                let _ = wake.send(());
            });
            std::thread::sleep(Duration::from_millis(300));
        })
        .await
        .unwrap();
        body.await.unwrap()
    });
    assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");
    assert_eq!(steps.taken(), Vec::<&str>::new());
}

/// A lease handed over in this process to the next waiting task, which
/// runs only after its process froze past that lease (here a task
/// blocking the runtime's only thread): the waiter's body is cancelled
/// before its first step. Unlike a grant from the store, which the
/// acquire finds valid in the same poll that starts the body, a handed
/// lease may have waited for its taker, so its first poll reads the clock.
#[test]
fn a_lease_handed_over_to_a_task_that_runs_after_it_ended_is_not_run_under() {
    let (runtime, steps) = one_thread_and_steps();
    let (first, second) = runtime.block_on(async {
        let locks = LockRegistry::memory();
        let key = unique_key("handed-frozen");
        let options = LockOptions::default()
            // Long enough that the holder, on a busy machine, releases
            // well within it.
            .ttl(Duration::from_secs(1))
            .watchdog(false);
        let (inside, entered) = oneshot::channel::<()>();
        let (go, released) = oneshot::channel::<()>();
        let holder = tokio::spawn({
            let (locks, key, options) = (locks.clone(), key.clone(), options.clone());
            async move {
                locks
                    .with_lock(&key, options, async {
                        let _ = inside.send(());
                        let _ = released.await;
                        // Queued before the waiter is woken by the
                        // hand-over at this body's release.
                        tokio::spawn(async {
                            std::thread::sleep(Duration::from_millis(1500));
                        });
                    })
                    .await
            }
        });
        entered.await.unwrap();
        let waiter = tokio::spawn({
            let (locks, key, steps) = (locks.clone(), key.clone(), steps.clone());
            async move {
                locks
                    .with_lock(&key, options, async move {
                        steps.push("ran under the handed lease");
                    })
                    .await
            }
        });
        while locks.local_queue_len(&key) < 2 {
            tokio::task::yield_now().await;
        }
        go.send(()).unwrap();
        (holder.await.unwrap(), waiter.await.unwrap())
    });
    assert!(first.is_ok(), "{first:?}");
    assert!(matches!(second, Err(LockError::Lost { .. })), "{second:?}");
    assert_eq!(steps.taken(), Vec::<&str>::new());
}

/// A store that answers at once, but whose process pauses (here: its
/// thread blocks) for `pause` as it hands back each grant: the grant is
/// past its lease before the caller's code runs on.
#[derive(Debug)]
struct PausingAtGrant {
    inner: lock_runtime::MemoryStore,
    pause: Duration,
}

impl lock_runtime::store::Store for PausingAtGrant {
    lock_tests::forward_store_to!(inner);

    fn acquire<'a>(
        &'a self,
        request: lock_runtime::store::AcquireRequest<'a>,
    ) -> lock_runtime::store::Reply<'a, lock_runtime::store::Acquire> {
        let reply = self.inner.acquire(request);
        // The process stops right as the answer comes back (a SIGSTOP, a
        // host pausing the machine): nothing of it runs meanwhile.
        std::thread::sleep(self.pause);
        reply
    }
}

/// A body whose process paused between the grant and the body's first
/// step, past the lease, does not begin: the call is `Lost`. (The pause
/// falls where no `.await` is: the store answered at once, and the
/// runtime goes from its answer to the body's first poll in one poll of
/// the task.)
#[tokio::test]
async fn a_body_does_not_begin_after_a_pause_past_its_lease() {
    let ttl = Duration::from_millis(50);
    let registry = LockRegistry::new(PausingAtGrant {
        inner: lock_runtime::MemoryStore::new(),
        pause: ttl * 3,
    });
    let key = unique_key("paused-at-grant");
    let began = std::sync::atomic::AtomicBool::new(false);
    let outcome = registry
        .with_lock(&key, LockOptions::default().ttl(ttl), async {
            began.store(true, std::sync::atomic::Ordering::SeqCst);
        })
        .await;
    assert!(
        !began.load(std::sync::atomic::Ordering::SeqCst),
        "the body began on a lease that had ended"
    );
    assert!(
        matches!(outcome, Err(LockError::Lost { .. })),
        "{outcome:?}"
    );
}
