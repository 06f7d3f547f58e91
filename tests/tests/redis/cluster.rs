//! The Redis backend on a real 3-primary Redis Cluster: the scripts' two
//! keys share a hash tag, so they run on one node whatever the key.

use std::time::Duration;

use lock_runtime::store::redis::Fencing;
use lock_runtime::{LockOptions, LockRegistry, RedisStore};
use lock_tests::{RedisCluster, is_held, measure_handoff, unique_key};

async fn cluster_registry(cluster: &RedisCluster) -> LockRegistry {
    let urls = cluster.urls();
    let conn = redis::cluster::ClusterClient::new(urls.clone())
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    // Pub/sub messages are broadcast over the cluster bus: one node's
    // subscriber connection hears releases published on every node.
    let pubsub = redis::Client::open(urls[0].as_str()).unwrap();
    let backend = RedisStore::with_connection(conn, pubsub, Fencing::PerKey);
    LockRegistry::builder(backend).build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_work_on_a_redis_cluster_across_slots() {
    let cluster = RedisCluster::spawn(3);
    let (a, b) = (
        cluster_registry(&cluster).await,
        cluster_registry(&cluster).await,
    );
    // Keys spread over the slots of all three nodes, braces included.
    let keys: Vec<String> = (0..30)
        .map(|i| format!("{}:{{x}}:{i}", unique_key("cluster")))
        .collect();
    let mut last_fencing = std::collections::HashMap::new();
    for round in 0..2 {
        let mut guards = Vec::new();
        for key in &keys {
            let guard = a.lock(key, LockOptions::default()).await.unwrap();
            if let Some(previous) = last_fencing.insert(key.clone(), guard.fencing_token()) {
                assert!(guard.fencing_token() > previous, "round {round}, {key}");
            }
            guards.push(guard);
        }
        for key in &keys {
            assert!(is_held(&b, key).await, "{key} is exclusive");
        }
        for guard in guards {
            guard.release().await.unwrap();
        }
    }
    // A waiter on another registry is woken by the release (the lease had
    // 30 s left), published on whichever node owns the key's slot.
    let handoff =
        measure_handoff(&a, b.clone(), &unique_key("cluster-wake"), cluster.node(0)).await;
    assert!(handoff < Duration::from_secs(1), "{handoff:?}");
    // The cluster's nodes all took part.
    let mut used = 0;
    for i in 0..3 {
        let keys: i64 = redis::cmd("DBSIZE")
            .query(&mut cluster.node(i).connection())
            .unwrap();
        used += usize::from(keys > 0);
    }
    assert_eq!(used, 3, "fencing counters on every node");
}
