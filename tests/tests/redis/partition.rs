//! A partitioned Redis holder gives up before anyone else is granted the
//! key (the scenario: `lock_tests::partition`).

use lock_runtime::LockRegistry;
use lock_tests::RedisServer;
use lock_tests::partition::partitions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_holder_is_cancelled_before_anyone_else_is_granted_the_key() {
    let redis = RedisServer::new();
    partitions(
        "redis",
        redis.port(),
        &redis.url(),
        |port| format!("redis://127.0.0.1:{port}"),
        |url| async move { LockRegistry::redis(&url).await.unwrap() },
        // A Redis fencing token is the server's clock at the grant.
        |_key, fencing, _sent| async move { u128::from(fencing) },
        ([60, 100, 200, 400], 32),
    )
    .await;
}
