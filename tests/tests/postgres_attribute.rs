//! The attribute over PostgreSQL in one process: the global registry points
//! at one server this single test owns; each scenario runs against it in
//! turn.

use std::time::{Duration, Instant};

use lock_runtime::{LockError, LockRegistry, distributed_lock};
use lock_tests::{PostgresServer, unique_key};
use tokio::sync::oneshot;

#[distributed_lock(key = "{key}", ttl = "600ms")]
async fn long_body(key: &str, entered: oneshot::Sender<()>) -> &'static str {
    entered.send(()).unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    "finished"
}

#[distributed_lock(key = "{key}", ttl = "30s")]
async fn enter_then(key: &str, entered: oneshot::Sender<()>, panic: bool) {
    entered.send(()).unwrap();
    if panic {
        panic!("body failed");
    }
    std::future::pending::<()>().await;
}

/// Rows of `key`'s lease.
fn rows(server: &PostgresServer, key: &str) -> String {
    let key = key.replace('\'', "''");
    server.psql(&format!(
        "SELECT count(*) FROM lock_leases WHERE key = convert_to('{key}', 'UTF8')"
    ))
}

/// How long until `key`'s row is gone after `since`.
async fn freed_after(server: &PostgresServer, key: &str, since: Instant) -> Duration {
    lock_tests::wait_until("the row is deleted", || rows(server, key) == "0").await;
    since.elapsed()
}

/// Deletes the lease row under a running body: the next renewal finds
/// nothing, the body is cancelled and the call returns `Lost`.
async fn row_deleted_under_the_body(server: &PostgresServer) {
    let key = unique_key("removed");
    let (entered_tx, entered_rx) = oneshot::channel();
    let call = tokio::spawn({
        let key = key.clone();
        async move { long_body(&key, entered_tx).await }
    });
    entered_rx.await.unwrap();
    let removed_at = Instant::now();
    assert_eq!(rows(server, &key), "1");
    server.psql("DELETE FROM lock_leases");
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

async fn cancellation_and_panic_release_at_once(server: &PostgresServer, panic: bool) {
    let key = unique_key("exit");
    let (entered_tx, entered_rx) = oneshot::channel();
    let call = tokio::spawn({
        let key = key.clone();
        async move { enter_then(&key, entered_tx, panic).await }
    });
    entered_rx.await.unwrap();
    let ended_at = Instant::now();
    if panic {
        assert!(call.await.unwrap_err().is_panic());
    } else {
        call.abort();
        assert!(call.await.unwrap_err().is_cancelled());
    }
    let freed = freed_after(server, &key, ended_at).await;
    assert!(
        freed < Duration::from_millis(500),
        "freed {freed:?} after; ttl is 30s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_over_postgres() {
    let server = PostgresServer::new();
    lock_runtime::init(LockRegistry::postgres(&server.url()).await.unwrap()).unwrap();
    row_deleted_under_the_body(&server).await;
    cancellation_and_panic_release_at_once(&server, false).await;
    cancellation_and_panic_release_at_once(&server, true).await;
}
