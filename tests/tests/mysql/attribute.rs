//! The attribute over MySQL in one process: the global registry points at
//! one server this single test owns; each scenario runs against it in
//! turn.

use std::time::{Duration, Instant};

use lock_runtime::{LockError, LockRegistry, distributed_lock};
use lock_tests::attribute::an_ended_body_frees_its_key_at_once;
use lock_tests::{MariaDbServer, unique_key};
use tokio::sync::oneshot;

#[distributed_lock(key = "{key}", ttl = "600ms")]
async fn long_body(key: &str, entered: oneshot::Sender<()>) -> &'static str {
    entered.send(()).unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    "finished"
}

/// Live rows of `key`'s lease.
fn rows(server: &MariaDbServer, key: &str) -> String {
    let key: String = key.bytes().map(|b| format!("{b:02x}")).collect();
    server.sql(&format!(
        "SELECT COUNT(*) FROM locks.lock_leases WHERE lock_key = X'{key}' AND expires_at > UTC_TIMESTAMP(6)"
    ))
}

/// Deletes the lease row under a running body: the next renewal finds
/// nothing, the body is cancelled and the call returns `Lost`.
async fn row_deleted_under_the_body(server: &MariaDbServer) {
    let key = unique_key("removed");
    let (entered_tx, entered_rx) = oneshot::channel();
    let call = tokio::spawn({
        let key = key.clone();
        async move { long_body(&key, entered_tx).await }
    });
    entered_rx.await.unwrap();
    let removed_at = Instant::now();
    assert_eq!(rows(server, &key), "1");
    server.sql("DELETE FROM locks.lock_leases");
    match call.await.unwrap() {
        Err(LockError::Lost { key: lost }) => assert_eq!(lost, key),
        other => panic!("expected Lost, got {other:?}"),
    }
    let noticed = removed_at.elapsed();
    // Renewals run every 200 ms; allow slack, far below the 30 s body.
    assert!(
        noticed < Duration::from_millis(600),
        "noticed after {noticed:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_over_mysql() {
    let server = MariaDbServer::new();
    lock_runtime::init(LockRegistry::mysql(&server.url()).await.unwrap()).unwrap();
    row_deleted_under_the_body(&server).await;
    let mut entries = async |key: &str| rows(&server, key).parse::<usize>().unwrap();
    an_ended_body_frees_its_key_at_once(false, &mut entries).await;
    an_ended_body_frees_its_key_at_once(true, &mut entries).await;
}
