//! The attribute's early exits, over whatever registry the test process
//! installed with `lock_runtime::init`: shared by the stores' attribute
//! tests, each of which reads its own store behind the registry's back.

use std::time::{Duration, Instant};

use lock_runtime::distributed_lock;
use tokio::sync::oneshot;

use crate::unique_key;

/// Tells `entered` it holds `key`, then panics once `panic` fires, or
/// without one waits until it is cancelled.
#[distributed_lock(key = "{key}", ttl = "30s")]
pub async fn enter_then(
    key: &str,
    entered: oneshot::Sender<()>,
    panic: Option<oneshot::Receiver<()>>,
) {
    entered.send(()).unwrap();
    if let Some(panic) = panic {
        panic.await.unwrap();
        panic!("body failed");
    }
    std::future::pending::<()>().await;
}

/// An annotated body holding a fresh key is cancelled (or, with `panic`,
/// panics): its key must be free within 500 ms, not when its 30 s ttl
/// runs out. `entries(key)` counts the key's lock entries in the store
/// (one while the body runs, none once freed).
pub async fn an_ended_body_frees_its_key_at_once(
    panic: bool,
    mut entries: impl AsyncFnMut(&str) -> usize,
) {
    let key = unique_key(if panic { "panic" } else { "cancel" });
    let (entered_tx, entered_rx) = oneshot::channel();
    let (panic_tx, panic_rx) = oneshot::channel();
    let call = tokio::spawn({
        let key = key.clone();
        async move { enter_then(&key, entered_tx, panic.then_some(panic_rx)).await }
    });
    entered_rx.await.unwrap();
    assert_eq!(
        entries(&key).await,
        1,
        "the key is held while the body runs"
    );
    let ended_at = Instant::now();
    if panic {
        panic_tx.send(()).unwrap();
        assert!(call.await.unwrap_err().is_panic());
    } else {
        call.abort();
        assert!(call.await.unwrap_err().is_cancelled());
    }
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
