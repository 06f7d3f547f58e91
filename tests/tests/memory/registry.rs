//! The attribute end to end on the in-process backend: one global registry
//! for this test binary, a fresh key per test.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use lock_runtime::{LockError, LockOptions, LockRegistry, distributed_lock, fencing_token};
use lock_tests::{is_held, time_to_lock, unique_key};
use tokio::sync::oneshot;
use tokio::time::Instant;

fn setup() -> &'static LockRegistry {
    static INIT: Once = Once::new();
    INIT.call_once(|| lock_runtime::init(LockRegistry::memory()).unwrap());
    lock_runtime::registry().unwrap()
}

/// A stock counter updated by a non-atomic read, pause, write.
#[derive(Default)]
struct Stock {
    level: AtomicU64,
    sold: Mutex<Vec<u64>>,
}

impl Stock {
    fn new(level: u64) -> Arc<Stock> {
        Arc::new(Stock {
            level: AtomicU64::new(level),
            sold: Mutex::default(),
        })
    }

    /// Read, yield to every other task, write: oversells without a lock.
    async fn sell_one(&self) -> Option<u64> {
        let level = self.level.load(Ordering::SeqCst);
        if level == 0 {
            return None;
        }
        tokio::task::yield_now().await;
        self.level.store(level - 1, Ordering::SeqCst);
        self.sold.lock().unwrap().push(level);
        Some(level)
    }
}

#[distributed_lock(key = "stock:{item}", ttl = "5s")]
async fn buy(item: &str, stock: &Stock) -> Option<u64> {
    stock.sell_one().await
}

async fn sell_out(stock: Arc<Stock>, item: String, tasks: usize, locked: bool) {
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let (stock, item) = (stock.clone(), item.clone());
        handles.push(tokio::spawn(async move {
            loop {
                let sold = if locked {
                    buy(&item, &stock).await.unwrap()
                } else {
                    stock.sell_one().await
                };
                if sold.is_none() {
                    break;
                }
            }
        }));
    }
    for handle in handles {
        handle.await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_two_tasks_sell_exactly_the_stock() {
    setup();
    let stock = Stock::new(200);
    sell_out(stock.clone(), unique_key("oversell"), 32, true).await;
    let mut sold = stock.sold.lock().unwrap().clone();
    sold.sort_unstable();
    assert_eq!(stock.level.load(Ordering::SeqCst), 0);
    assert_eq!(
        sold,
        (1..=200).collect::<Vec<_>>(),
        "each level sold exactly once"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn the_same_sale_without_the_lock_oversells() {
    // The control for the test above: the race is real, so that test can fail.
    let stock = Stock::new(200);
    sell_out(stock.clone(), unique_key("oversell"), 32, false).await;
    let sold = stock.sold.lock().unwrap().len();
    assert!(
        sold > 200,
        "expected an oversell without the lock, sold {sold}"
    );
}

#[distributed_lock(key = "job:{name}", mode = "skip", ttl = "10s")]
async fn job(
    name: &str,
    entered: Option<oneshot::Sender<()>>,
    go: Option<oneshot::Receiver<()>>,
) -> u32 {
    if let Some(entered) = entered {
        entered.send(()).unwrap();
    }
    if let Some(go) = go {
        go.await.unwrap();
    }
    7
}

#[tokio::test]
async fn skip_returns_none_while_held_and_some_when_free() {
    setup();
    let name = unique_key("skip");
    let (entered_tx, entered_rx) = oneshot::channel();
    let (go_tx, go_rx) = oneshot::channel();
    let holder = {
        let name = name.clone();
        tokio::spawn(async move { job(&name, Some(entered_tx), Some(go_rx)).await })
    };
    entered_rx.await.unwrap();
    assert_eq!(job(&name, None, None).await.unwrap(), None, "held: skipped");
    go_tx.send(()).unwrap();
    assert_eq!(holder.await.unwrap().unwrap(), Some(7));
    assert_eq!(job(&name, None, None).await.unwrap(), Some(7), "free: ran");
}

#[distributed_lock(key = "timeout:{k}", wait_timeout = "100ms")]
async fn impatient(k: &str) {}

#[tokio::test(start_paused = true)]
async fn wait_timeout_gives_timeout() {
    let registry = setup();
    let k = unique_key("timeout");
    let guard = registry
        .lock(&format!("timeout:{k}"), LockOptions::default())
        .await
        .unwrap();
    let started = Instant::now();
    match impatient(&k).await {
        Err(LockError::Timeout { key, waited }) => {
            assert_eq!(key, format!("timeout:{k}"));
            assert!(waited >= Duration::from_millis(100), "{waited:?}");
            assert!(started.elapsed() < Duration::from_millis(150));
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    guard.release().await.unwrap();
    impatient(&k).await.unwrap();
}

#[distributed_lock(key = "renew:{k}", ttl = "200ms")]
async fn long_body(k: &str, body: Duration) -> &'static str {
    tokio::time::sleep(body).await;
    "done"
}

#[tokio::test(start_paused = true)]
async fn watchdog_keeps_a_short_lease_through_a_long_body() {
    let registry = setup();
    let k = unique_key("renew");
    let key = format!("renew:{k}");
    let body = {
        let k = k.clone();
        tokio::spawn(async move { long_body(&k, Duration::from_secs(1)).await })
    };
    for at in [300, 600, 900] {
        tokio::time::sleep_until(Instant::now() + Duration::from_millis(300)).await;
        let attempt = registry
            .try_lock(&key, LockOptions::default())
            .await
            .unwrap();
        assert!(
            attempt.is_none(),
            "lock free at ~{at}ms although the body runs"
        );
    }
    assert_eq!(body.await.unwrap().unwrap(), "done");
    assert!(
        registry
            .try_lock(&key, LockOptions::default())
            .await
            .unwrap()
            .is_some()
    );
}

#[distributed_lock(key = "nodog:{k}", ttl = "200ms", watchdog = false)]
async fn unrenewed(k: &str, body: Duration) {
    tokio::time::sleep(body).await;
}

#[tokio::test(start_paused = true)]
async fn expired_holder_without_watchdog_gets_lost_and_spares_the_next_holder() {
    let registry = setup();
    let k = unique_key("nodog");
    let key = format!("nodog:{k}");
    let started = Instant::now();
    let first = {
        let k = k.clone();
        tokio::spawn(async move { unrenewed(&k, Duration::from_secs(1)).await })
    };
    tokio::task::yield_now().await;
    // Waits for the first lease to run out, then holds the lock. The first
    // holder counts its lease as over one safety margin before the store
    // does, and releases it then.
    let second = registry.lock(&key, LockOptions::default()).await.unwrap();
    let ttl = Duration::from_millis(200);
    let margin = registry.store().capabilities().margin.of(ttl);
    assert!(started.elapsed() >= ttl - margin, "{:?}", started.elapsed());
    match first.await.unwrap() {
        Err(LockError::Lost { key: lost }) => assert_eq!(lost, key),
        other => panic!("expected Lost, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "the body was cancelled, not run out"
    );
    // The first holder's release did not free the second holder's lock.
    assert!(second.is_held());
    assert!(is_held(registry, &key).await);
    second.release().await.unwrap();
}

static MAX_HOLD_REACHED_END: AtomicU64 = AtomicU64::new(0);

#[distributed_lock(key = "maxhold:{k}", ttl = "100ms", max_hold = "300ms")]
async fn hung(k: &str) {
    tokio::time::sleep(Duration::from_secs(3600)).await;
    MAX_HOLD_REACHED_END.fetch_add(1, Ordering::SeqCst);
}

#[tokio::test(start_paused = true)]
async fn max_hold_cancels_the_body_and_returns_lost() {
    let registry = setup();
    let k = unique_key("maxhold");
    let started = Instant::now();
    match hung(&k).await {
        Err(LockError::Lost { .. }) => {}
        other => panic!("expected Lost, got {other:?}"),
    }
    let held_for = started.elapsed();
    assert!(
        held_for >= Duration::from_millis(300) && held_for < Duration::from_millis(400),
        "{held_for:?}"
    );
    assert_eq!(
        MAX_HOLD_REACHED_END.load(Ordering::SeqCst),
        0,
        "body was cancelled"
    );
    let key = format!("maxhold:{k}");
    assert!(
        registry
            .try_lock(&key, LockOptions::default())
            .await
            .unwrap()
            .is_some(),
        "released"
    );
}

#[tokio::test(start_paused = true)]
async fn a_loss_the_store_pushes_cancels_the_body_at_once() {
    let registry = setup();
    let k = unique_key("pushed");
    let key = format!("exit:{k}");
    let (entered_tx, entered_rx) = oneshot::channel();
    let call = tokio::spawn({
        let k = k.clone();
        async move { enter_then(&k, entered_tx, false).await }
    });
    entered_rx.await.unwrap();
    // The memory store pushes the loss to the holder when an operator frees
    // the lock: the body is cancelled then, not at its next renewal (10 s).
    let started = Instant::now();
    assert!(registry.force_release(&key).await.unwrap());
    match call.await.unwrap() {
        Err(LockError::Lost { key: lost }) => assert_eq!(lost, key),
        other => panic!("expected Lost, got {other:?}"),
    }
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "cancelled without waiting"
    );
}

#[distributed_lock(key = "exit:{k}", ttl = "30s")]
async fn enter_then(k: &str, entered: oneshot::Sender<()>, panic: bool) {
    entered.send(()).unwrap();
    if panic {
        panic!("body failed");
    }
    std::future::pending::<()>().await;
}

#[tokio::test(start_paused = true)]
async fn dropping_the_future_mid_body_releases_promptly() {
    let registry = setup();
    let k = unique_key("cancel");
    let (entered_tx, entered_rx) = oneshot::channel();
    let call = enter_then(&k, entered_tx, false);
    let caller = async {
        // The caller gives up after 50 ms and drops the call.
        let outcome = tokio::time::timeout(Duration::from_millis(50), call).await;
        assert!(outcome.is_err());
    };
    let (_, entered) = tokio::join!(caller, entered_rx);
    entered.unwrap();
    let waited = time_to_lock(registry, &format!("exit:{k}")).await;
    assert!(
        waited < Duration::from_millis(10),
        "reacquired after {waited:?}, ttl is 30s"
    );
}

#[tokio::test(start_paused = true)]
async fn a_panicking_body_releases_promptly() {
    let registry = setup();
    let k = unique_key("panic");
    let (entered_tx, entered_rx) = oneshot::channel();
    let task = {
        let k = k.clone();
        tokio::spawn(async move { enter_then(&k, entered_tx, true).await })
    };
    entered_rx.await.unwrap();
    assert!(task.await.unwrap_err().is_panic());
    let waited = time_to_lock(registry, &format!("exit:{k}")).await;
    assert!(
        waited < Duration::from_millis(10),
        "reacquired after {waited:?}, ttl is 30s"
    );
}

#[distributed_lock(key = "ledger:{k}")]
async fn outer(k: &str) -> (u64, u64) {
    let mine = fencing_token().await.unwrap();
    let nested = inner(k).await.unwrap();
    (mine, nested)
}

#[distributed_lock(key = "ledger:{k}", wait_timeout = "1s")]
async fn inner(k: &str) -> u64 {
    fencing_token().await.unwrap()
}

#[distributed_lock(key = "countdown:{k}", wait_timeout = "1s")]
async fn countdown(k: String, n: u32) -> u32 {
    if n == 0 {
        return 0;
    }
    Box::pin(countdown(k, n - 1)).await.unwrap() + 1
}

#[tokio::test]
async fn same_key_nested_calls_are_reentrant() {
    setup();
    let k = unique_key("reentrant");
    let (mine, nested) = outer(&k).await.unwrap();
    assert_eq!(mine, nested, "the nested call shares the outer lease");
    assert_eq!(countdown(k, 5).await.unwrap(), 5);
}

#[tokio::test]
async fn reentrancy_is_per_task_not_per_process() {
    let registry = setup();
    let k = unique_key("reentrant");
    let guard = registry
        .lock(&format!("ledger:{k}"), LockOptions::default())
        .await
        .unwrap();
    // Another task (not the holder) must wait, and times out.
    let other = tokio::spawn({
        let k = k.clone();
        async move { inner(&k).await }
    });
    tokio::time::pause();
    assert!(matches!(
        other.await.unwrap(),
        Err(LockError::Timeout { .. })
    ));
    guard.release().await.unwrap();
}

/// A nested call's future that outlives the body around it (polled once,
/// then handed out of the body) keeps nothing of the outer lease: the
/// outer call's release ends. Awaited afterwards, a re-entered call finds
/// no lease of its key around it, and a call on its own key still holds
/// that key until it ends.
#[tokio::test]
async fn a_nested_call_that_outlives_the_body_around_it_does_not_hold_up_its_release() {
    let registry = LockRegistry::memory();
    let k = unique_key("outlived");
    let (outer_key, own_key) = (format!("outer:{k}"), format!("own:{k}"));
    let (go_tx, go_rx) = tokio::sync::watch::channel(false);
    let wait_for_go = || {
        let mut go = go_rx.clone();
        async move { go.wait_for(|go| *go).await.map(|_| ()) }
    };
    let outer = registry.with_lock(&outer_key, LockOptions::default(), async {
        let again = registry.with_lock(&outer_key, LockOptions::default(), {
            let go = wait_for_go();
            async move {
                go.await.unwrap();
                fencing_token().await
            }
        });
        let own = registry.with_lock(&own_key, LockOptions::default(), {
            let go = wait_for_go();
            async move {
                go.await.unwrap();
                fencing_token().await
            }
        });
        let (mut again, mut own) = (Box::pin(again), Box::pin(own));
        // Each runs until its body waits, then leaves with the output.
        std::future::poll_fn(|cx| {
            assert!(again.as_mut().poll(cx).is_pending());
            assert!(own.as_mut().poll(cx).is_pending());
            std::task::Poll::Ready(())
        })
        .await;
        (again, own)
    });
    let (again, own) = tokio::time::timeout(Duration::from_secs(5), outer)
        .await
        .expect("the outer release ended")
        .unwrap();
    assert!(
        !is_held(&registry, &outer_key).await,
        "the outer lock was released"
    );
    assert!(
        is_held(&registry, &own_key).await,
        "the nested call still holds its key"
    );
    go_tx.send(true).unwrap();
    assert!(matches!(
        again.await.unwrap(),
        Err(LockError::NotHeld { key: None })
    ));
    assert!(own.await.unwrap().is_ok());
    assert!(!is_held(&registry, &own_key).await);
}

#[distributed_lock(key = "fence:{k}")]
async fn record_token(k: &str, seen: &Mutex<Vec<u64>>) {
    let token = fencing_token().await.unwrap();
    tokio::task::yield_now().await;
    seen.lock().unwrap().push(token);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fencing_tokens_strictly_increase() {
    setup();
    let k = unique_key("fence");
    let seen = Arc::new(Mutex::new(Vec::new()));
    let mut handles = Vec::new();
    for _ in 0..8 {
        let (k, seen) = (k.clone(), seen.clone());
        handles.push(tokio::spawn(async move {
            for _ in 0..25 {
                record_token(&k, &seen).await.unwrap();
            }
        }));
    }
    for handle in handles {
        handle.await.unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 200);
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "tokens in holding order must increase: {seen:?}"
    );
    assert!(
        matches!(fencing_token().await, Err(LockError::NotHeld { key: None })),
        "no token outside a locked body"
    );
}

#[distributed_lock(key = "{name}")]
async fn named(name: &str) {}

#[tokio::test]
async fn bad_runtime_keys_are_errors_not_panics() {
    setup();
    match named("").await {
        Err(LockError::InvalidKey { reason, .. }) => assert!(reason.contains("empty"), "{reason}"),
        other => panic!("expected InvalidKey, got {other:?}"),
    }
    let long = "x".repeat(lock_runtime::MAX_KEY_LEN + 1);
    let err = named(&long).await.unwrap_err();
    assert!(matches!(err, LockError::InvalidKey { .. }));
    assert!(
        err.to_string().len() < 400,
        "a long key is shortened in the message: {err}"
    );
}
