//! A partitioned etcd holder gives up before anyone else is granted the
//! key (the scenario: `lock_tests::partition`).

use lock_runtime::LockRegistry;
use lock_tests::EtcdCluster;
use lock_tests::partition::partitions;

/// etcd counts leases in seconds: fewer, longer trials. Its clock is not
/// readable from here, so the competitor's grant is timed, more strictly,
/// by when its winning request was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_holder_is_cancelled_before_anyone_else_is_granted_the_key() {
    let etcd = EtcdCluster::single();
    let connect = |endpoint: String| async move { LockRegistry::etcd(&[&endpoint]).await.unwrap() };
    partitions(
        "etcd",
        etcd.client_port(0),
        &etcd.endpoint(0),
        |port| format!("http://127.0.0.1:{port}"),
        connect,
        |_key, _fencing, sent| async move { sent },
        ([1_000, 2_000, 1_000, 3_000], 8),
    )
    .await;
}
