//! The attribute over PostgreSQL in one process: the global registry points
//! at one server this single test owns; each scenario runs against it in
//! turn.

use std::time::{Duration, Instant};

use lock_runtime::{LockError, LockRegistry, distributed_lock};
use lock_tests::attribute::an_ended_body_frees_its_key_at_once;
use lock_tests::{PostgresServer, unique_key};
use tokio::sync::oneshot;

#[distributed_lock(key = "{key}", ttl = "600ms")]
async fn long_body(key: &str, entered: oneshot::Sender<()>) -> &'static str {
    entered.send(()).unwrap();
    tokio::time::sleep(Duration::from_secs(30)).await;
    "finished"
}

/// Rows of `key`'s lease.
fn rows(server: &PostgresServer, key: &str) -> String {
    let key = key.replace('\'', "''");
    server.psql(&format!(
        "SELECT count(*) FROM lock_leases WHERE key = convert_to('{key}', 'UTF8')"
    ))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_over_postgres() {
    let server = PostgresServer::new();
    lock_runtime::init(LockRegistry::postgres(&server.url()).await.unwrap()).unwrap();
    row_deleted_under_the_body(&server).await;
    let mut entries = async |key: &str| rows(&server, key).parse::<usize>().unwrap();
    an_ended_body_frees_its_key_at_once(false, &mut entries).await;
    an_ended_body_frees_its_key_at_once(true, &mut entries).await;
}
