//! The attribute over Redis in one process: the global registry points at
//! one server that this single test owns (so it is killed when the test
//! ends), and each scenario below runs against it in turn.

use std::time::{Duration, Instant};

use lock_runtime::{LockError, LockRegistry, distributed_lock};
use lock_tests::attribute::{an_ended_body_frees_its_key_at_once, enter_then};
use lock_tests::{RedisServer, unique_key};
use redis::Commands;
use tokio::sync::oneshot;

#[distributed_lock(key = "{key}", ttl = "600ms")]
async fn long_body(key: &str, entered: oneshot::Sender<()>) -> &'static str {
    entered.send(()).unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    "finished"
}

/// Told of the loss rather than cancelled: says so on `undone` after an
/// `.await` past the loss.
#[distributed_lock(key = "{key}", ttl = "600ms", on_lost = "notify")]
async fn notified_body(key: &str, entered: oneshot::Sender<()>, undone: oneshot::Sender<()>) {
    entered.send(()).unwrap();
    lock_runtime::lost().await;
    tokio::task::yield_now().await;
    undone.send(()).unwrap();
}

#[distributed_lock(key = "{key}", mode = "skip", ttl = "30s")]
async fn skip_job(key: &str) -> u8 {
    1
}

/// The Redis name of the lock on `key` (no namespace, no special bytes).
fn lock_name(key: &str) -> String {
    format!("lock:{{{key}}}")
}

/// Removes the lease under a running body (as FLUSHALL or a stray DEL would):
/// the watchdog's next renewal is refused, the body is cancelled and the
/// call returns `Lost`, within about a third of the ttl.
async fn lease_removed_under_the_body(server: &RedisServer, flush: bool) {
    let key = unique_key("removed");
    let (entered_tx, entered_rx) = oneshot::channel();
    let call = tokio::spawn({
        let key = key.clone();
        async move { long_body(&key, entered_tx).await }
    });
    entered_rx.await.unwrap();
    let mut conn = server.connection();
    let removed_at = Instant::now();
    if flush {
        let () = redis::cmd("FLUSHALL").query(&mut conn).unwrap();
    } else {
        let removed: i64 = conn.del(lock_name(&key)).unwrap();
        assert_eq!(removed, 1);
    }
    match call.await.unwrap() {
        Err(LockError::Lost { key: lost }) => assert_eq!(lost, key),
        other => panic!("expected Lost, got {other:?}"),
    }
    let noticed = removed_at.elapsed();
    // Renewals run every 200 ms; allow scheduling slack, far below the 30 s body.
    assert!(
        noticed < Duration::from_millis(450),
        "noticed after {noticed:?}"
    );
}

/// As [`lease_removed_under_the_body`], for a body under
/// `on_lost = "notify"`: the renewal's refusal reaches the body through
/// `lost()`, it finishes its step, and the call still returns `Lost`.
async fn lease_removed_under_a_notified_body(server: &RedisServer) {
    let key = unique_key("notified");
    let (entered_tx, entered_rx) = oneshot::channel();
    let (undone_tx, undone_rx) = oneshot::channel();
    let call = tokio::spawn({
        let key = key.clone();
        async move { notified_body(&key, entered_tx, undone_tx).await }
    });
    entered_rx.await.unwrap();
    let removed: i64 = server.connection().del(lock_name(&key)).unwrap();
    assert_eq!(removed, 1);
    match call.await.unwrap() {
        Err(LockError::Lost { key: lost }) => assert_eq!(lost, key),
        other => panic!("expected Lost, got {other:?}"),
    }
    undone_rx.await.expect("the body ran on past the loss");
}

/// How long until the key is gone from Redis after `since`.
async fn freed_after(server: &RedisServer, key: &str, since: Instant) -> Duration {
    let mut conn = server.connection();
    loop {
        let exists: bool = conn.exists(lock_name(key)).unwrap();
        if !exists {
            return since.elapsed();
        }
        assert!(
            since.elapsed() < Duration::from_secs(5),
            "lock never released"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn skip_while_held(server: &RedisServer) {
    let key = unique_key("skip");
    let (entered_tx, entered_rx) = oneshot::channel();
    let holder = tokio::spawn({
        let key = key.clone();
        async move { enter_then(&key, entered_tx, None, None).await }
    });
    entered_rx.await.unwrap();
    assert_eq!(skip_job(&key).await.unwrap(), None);
    holder.abort();
    let _ = holder.await;
    freed_after(server, &key, Instant::now()).await;
    // The release on drop runs in a spawned task: it deletes the key, then
    // lets go of this process's queue for it. Wait for both.
    let registry = lock_runtime::registry().unwrap();
    let since = Instant::now();
    while registry.local_keys() > 0 {
        assert!(
            since.elapsed() < Duration::from_secs(5),
            "local queue never freed"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(skip_job(&key).await.unwrap(), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_over_redis() {
    let server = RedisServer::new();
    lock_runtime::init(LockRegistry::redis(&server.url()).await.unwrap()).unwrap();
    lease_removed_under_the_body(&server, false).await;
    lease_removed_under_the_body(&server, true).await;
    lease_removed_under_a_notified_body(&server).await;
    let mut conn = server.connection();
    let mut entries =
        async |key: &str| usize::from(conn.exists::<_, bool>(lock_name(key)).unwrap());
    an_ended_body_frees_its_key_at_once(false, &mut entries).await;
    an_ended_body_frees_its_key_at_once(true, &mut entries).await;
    skip_while_held(&server).await;
}
