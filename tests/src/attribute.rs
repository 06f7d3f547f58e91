//! The attribute's early exits, over whatever registry the test process
//! installed with `lock_runtime::init`: shared by the stores' attribute
//! tests, each of which reads its own store behind the registry's back.

use std::time::{Duration, Instant};

use lock_runtime::distributed_lock;
use tokio::sync::oneshot;

use crate::unique_key;

/// Sends the instant it is dropped: a body's locals drop when the body
/// ends, cancelled or unwinding, after any panic hook has run (which
/// prints a backtrace when `RUST_BACKTRACE` is set) and before the lock's
/// guard is dropped.
struct Ended(Option<oneshot::Sender<Instant>>);

impl Drop for Ended {
    fn drop(&mut self) {
        if let Some(ended) = self.0.take() {
            let _ = ended.send(Instant::now());
        }
    }
}

/// Tells `entered` it holds `key`, then panics once `panic` fires, or
/// without one waits until it is cancelled. `ended`, if given, gets the
/// instant the body ended.
#[distributed_lock(key = "{key}", ttl = "30s")]
pub async fn enter_then(
    key: &str,
    entered: oneshot::Sender<()>,
    panic: Option<oneshot::Receiver<()>>,
    ended: Option<oneshot::Sender<Instant>>,
) {
    let _ended = Ended(ended);
    entered.send(()).unwrap();
    if let Some(panic) = panic {
        panic.await.unwrap();
        panic!("body failed");
    }
    std::future::pending::<()>().await;
}

/// An annotated body holding a fresh key is cancelled (or, with `panic`,
/// panics): its key must be free within 500 ms, not when its 30 s ttl
/// runs out. The time counts from the body's end, not from the panic's
/// start: a panic hook printing a backtrace can take longer than that on a
/// busy machine. `entries(key)` counts the key's lock entries in the store
/// (one while the body runs, none once freed).
pub async fn an_ended_body_frees_its_key_at_once(
    panic: bool,
    mut entries: impl AsyncFnMut(&str) -> usize,
) {
    let key = unique_key(if panic { "panic" } else { "cancel" });
    let (entered_tx, entered_rx) = oneshot::channel();
    let (panic_tx, panic_rx) = oneshot::channel();
    let panic_rx = panic.then_some(panic_rx);
    let (ended_tx, ended_rx) = oneshot::channel();
    let call = tokio::spawn({
        let key = key.clone();
        async move { enter_then(&key, entered_tx, panic_rx, Some(ended_tx)).await }
    });
    entered_rx.await.unwrap();
    assert_eq!(
        entries(&key).await,
        1,
        "the key is held while the body runs"
    );
    if panic {
        panic_tx.send(()).unwrap();
        assert!(call.await.unwrap_err().is_panic());
    } else {
        call.abort();
        assert!(call.await.unwrap_err().is_cancelled());
    }
    let ended_at = ended_rx.await.expect("the body's locals were dropped");
    while entries(&key).await != 0 {
        assert!(
            ended_at.elapsed() < Duration::from_millis(500),
            "still held {:?} after the body ended; the ttl is 30 s",
            ended_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    eprintln!(
        "freed {:?} after the body {}",
        ended_at.elapsed(),
        if panic { "panicked" } else { "was cancelled" }
    );
}

/// Tells `entered` it holds `key`, then runs for 30 s, far past its
/// 600 ms ttl (renewed every 200 ms).
#[distributed_lock(key = "{key}", ttl = "600ms")]
pub async fn long_body(key: &str, entered: oneshot::Sender<()>) -> &'static str {
    entered.send(()).unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    "finished"
}

/// A running body's lease undone behind the store's back (`undo()`, once
/// `entries(key)` counted it): the next renewal finds nothing, the body is
/// cancelled and the call returns `Lost` naming the key, within 600 ms
/// (renewals run every 200 ms; far below the 30 s body).
pub async fn a_lease_undone_under_the_body_is_lost(
    mut entries: impl AsyncFnMut(&str) -> usize,
    undo: impl FnOnce(),
) {
    let key = unique_key("removed");
    let (entered_tx, entered_rx) = oneshot::channel();
    let call = tokio::spawn({
        let key = key.clone();
        async move { long_body(&key, entered_tx).await }
    });
    entered_rx.await.unwrap();
    let removed_at = Instant::now();
    assert_eq!(
        entries(&key).await,
        1,
        "the key is held while the body runs"
    );
    undo();
    match call.await.unwrap() {
        Err(lock_runtime::LockError::Lost { key: lost }) => assert_eq!(lost, key),
        other => panic!("expected Lost, got {other:?}"),
    }
    let noticed = removed_at.elapsed();
    assert!(
        noticed < Duration::from_millis(600),
        "noticed after {noticed:?}"
    );
}
