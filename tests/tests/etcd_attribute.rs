//! The attribute over etcd in one process: the global registry points at
//! one member this single test owns. A body cancelled or panicking frees
//! its key at once (the 30 s lease is not waited out).

use std::time::{Duration, Instant};

use lock_runtime::{LockRegistry, distributed_lock};
use lock_tests::{EtcdCluster, unique_key};
use tokio::sync::oneshot;

#[distributed_lock(key = "{key}", ttl = "30s")]
async fn enter_then(key: &str, entered: oneshot::Sender<()>, panic: bool) {
    entered.send(()).unwrap();
    if panic {
        panic!("body failed");
    }
    std::future::pending::<()>().await;
}

async fn cancellation_and_panic_release_at_once(client: &mut etcd_client::Client, panic: bool) {
    let key = unique_key("exit");
    let (entered_tx, entered_rx) = oneshot::channel();
    let call = tokio::spawn({
        let key = key.clone();
        async move { enter_then(&key, entered_tx, panic).await }
    });
    entered_rx.await.unwrap();
    let held = lock_tests::etcd_lock_entries(client, &key).await;
    assert_eq!(held.len(), 1, "the key is held while the body runs");
    let ended_at = Instant::now();
    if panic {
        assert!(call.await.unwrap_err().is_panic());
    } else {
        call.abort();
        assert!(call.await.unwrap_err().is_cancelled());
    }
    loop {
        if lock_tests::etcd_lock_entries(client, &key).await.is_empty() {
            break;
        }
        assert!(
            ended_at.elapsed() < Duration::from_millis(500),
            "still held {:?} after the body ended; the ttl is 30 s",
            ended_at.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    eprintln!(
        "freed {:?} after the body {}",
        ended_at.elapsed(),
        if panic { "panicked" } else { "was cancelled" }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_over_etcd() {
    let cluster = EtcdCluster::single();
    let endpoint = cluster.endpoint(0);
    lock_runtime::init(LockRegistry::etcd(&[&endpoint]).await.unwrap()).unwrap();
    let mut client = etcd_client::Client::connect([&endpoint], None)
        .await
        .unwrap();
    cancellation_and_panic_release_at_once(&mut client, false).await;
    cancellation_and_panic_release_at_once(&mut client, true).await;
}
