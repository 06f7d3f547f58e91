//! The Redis store on a real Redis Cluster: by URL (`redis+cluster://`),
//! with replica acks and in fair mode, and over a connection the user made
//! (`RedisStore::with_connection`). A lock's keys share a hash tag, so its
//! scripts run on one node whatever the key.

use std::time::Duration;

use lock_runtime::store::redis::{Fencing, OwnerChecks};
use lock_runtime::{LockError, LockOptions, LockRegistry, RedisStore};
use lock_tests::{RedisCluster, is_held, measure_handoff, time_to_lock, unique_key, wait_until};
use redis::Commands;

use super::support::{calls_of, command_calls};

/// A registry over a cluster connection made by hand.
async fn hand_made_registry(cluster: &RedisCluster) -> LockRegistry {
    let urls = cluster.urls();
    let conn = redis::cluster::ClusterClient::new(urls.clone())
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    // Pub/sub messages are broadcast over the cluster bus: one node's
    // subscriber connection hears releases published on every node.
    let pubsub = redis::Client::open(urls[0].as_str()).unwrap();
    let store = RedisStore::with_connection(conn, pubsub, Fencing::PerKey);
    LockRegistry::builder(store).build().unwrap()
}

/// A connection that finds a key's node, for looking at the cluster.
fn cluster_connection(cluster: &RedisCluster) -> redis::cluster::ClusterConnection {
    redis::cluster::ClusterClient::new(cluster.urls())
        .unwrap()
        .get_connection()
        .unwrap()
}

/// Keys spread over every node's slots, braces included.
fn spread_keys(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| format!("{}:{{x}}:{i}", unique_key("cluster")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_by_url_locks_across_slots() {
    let cluster = RedisCluster::spawn(3);
    let url = cluster.url();
    let (a, b) = (
        LockRegistry::redis(&url).await.unwrap(),
        LockRegistry::redis(&url).await.unwrap(),
    );
    let keys = spread_keys(30);
    let mut last_fencing = std::collections::HashMap::new();
    for round in 0..2 {
        let mut guards = Vec::new();
        for key in &keys {
            let guard = a.lock(key, LockOptions::default()).await.unwrap();
            if let Some(previous) =
                last_fencing.insert(key.clone(), guard.fencing_token().await.unwrap())
            {
                assert!(
                    guard.fencing_token().await.unwrap() > previous,
                    "round {round}, {key}"
                );
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

    // A store over a connection made by hand is the same lock.
    let hand_made = hand_made_registry(&cluster).await;
    for key in &keys[..5] {
        let guard = hand_made.lock(key, LockOptions::default()).await.unwrap();
        assert!(is_held(&a, key).await, "{key}");
        guard.release().await.unwrap();
        assert!(!is_held(&a, key).await, "{key}");
    }
}

/// `replica_acks` on a cluster: `WAIT` goes to every primary and the
/// fewest acks count, so a grant is handed out only once the key's
/// replica has it; asking for more replicas than a primary has undoes
/// every grant and refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_acks_on_a_cluster_wait_for_the_replicas() {
    let cluster = RedisCluster::spawn_with_replicas(3, 1);
    let url = cluster.url();
    let acked = RedisStore::builder(&url)
        .replica_acks(1, Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let locks = LockRegistry::new(acked);
    let keys = spread_keys(12);
    for key in &keys {
        let guard = locks.lock(key, LockOptions::default()).await.unwrap();
        guard.release().await.unwrap();
    }

    let strict = RedisStore::builder(&url)
        .replica_acks(2, Duration::from_millis(100))
        .connect()
        .await
        .unwrap();
    let strict = LockRegistry::new(strict);
    let err = strict
        .lock(&keys[0], LockOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Store { .. }), "{err:?}");
    let shown = lock_tests::error_chain(&err);
    assert!(shown.contains("of the 2 replicas required"), "{shown}");
    // The refused grant is undone (in the background): the key is free.
    let waited = time_to_lock(&locks, &keys[0]).await;
    assert!(waited < Duration::from_secs(1), "{waited:?}");
}

/// Fair mode by URL: waiters from three stores get the key in the order
/// they queued, on whichever node owns it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_mode_on_a_cluster_serves_waiters_in_order() {
    let cluster = RedisCluster::spawn(3);
    let url = cluster.url();
    let fair = async || {
        let store = RedisStore::builder(&url)
            .fair(Duration::from_millis(600))
            .connect()
            .await
            .unwrap();
        LockRegistry::new(store)
    };
    let holder = fair().await;
    let key = unique_key("fair");
    let held = holder.lock(&key, LockOptions::default()).await.unwrap();
    let queue = format!("lock:{{{key}}}:queue");
    let mut conn = cluster_connection(&cluster);
    let (order_tx, mut order_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for i in 0..3 {
        let (locks, key, order) = (fair().await, key.clone(), order_tx.clone());
        waiters.push(tokio::spawn(async move {
            let guard = locks.lock(&key, LockOptions::default()).await.unwrap();
            order.send(i).unwrap();
            guard.release().await.unwrap();
        }));
        wait_until("the waiter queued", || {
            let queued: Vec<String> = conn.lrange(&queue, 0, -1).unwrap();
            queued.len() == i + 1
        })
        .await;
    }
    held.release().await.unwrap();
    let mut order = Vec::new();
    for _ in 0..3 {
        order.push(order_rx.recv().await.unwrap());
    }
    assert_eq!(order, [0, 1, 2], "served in the order they queued");
    for waiter in waiters {
        waiter.await.unwrap();
    }
}

/// Semaphores and read locks by URL on a cluster: each key's sorted set
/// and its companions share the key's slot, on whichever node owns it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphores_and_read_locks_work_across_slots() {
    let cluster = RedisCluster::spawn(3);
    let url = cluster.url();
    let (a, b) = (
        LockRegistry::redis(&url).await.unwrap(),
        LockRegistry::redis(&url).await.unwrap(),
    );
    let two = || LockOptions::default().permits(2);
    let read = || LockOptions::default().access(lock_runtime::Access::Read);
    for key in spread_keys(9) {
        let first = a.lock(&key, two()).await.unwrap();
        let second = b.lock(&key, two()).await.unwrap();
        assert!(a.try_lock(&key, two()).await.unwrap().is_none(), "{key}");
        first.release().await.unwrap();
        second.release().await.unwrap();
        let reader = a.lock(&key, read()).await.unwrap();
        let other = b.lock(&key, read()).await.unwrap();
        assert!(other.fencing_token().await.unwrap() > reader.fencing_token().await.unwrap());
        assert!(
            b.try_lock(&key, LockOptions::default())
                .await
                .unwrap()
                .is_none(),
            "{key}"
        );
        reader.release().await.unwrap();
        other.release().await.unwrap();
        let writer = b.lock(&key, LockOptions::default()).await.unwrap();
        writer.release().await.unwrap();
    }
}

/// A store by URL asks every primary at connect which owner-checked
/// commands it has, and sends them only if all do: this machine's Redis
/// 7.0 has none, so scripts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_primary_is_asked_for_its_owner_checked_commands() {
    let cluster = RedisCluster::spawn(3);
    let asked = |i| calls_of(&command_calls(cluster.node(i)), "command|info");
    let before: Vec<u64> = (0..3).map(asked).collect();
    let store = RedisStore::connect(&cluster.url()).await.unwrap();
    assert_eq!(store.owner_checks(), OwnerChecks::Scripts);
    for (i, before) in before.into_iter().enumerate() {
        assert_eq!(asked(i) - before, 1, "node {i}");
    }
    let registry = LockRegistry::new(store);
    for key in spread_keys(6) {
        let guard = registry.lock(&key, LockOptions::default()).await.unwrap();
        guard.release().await.unwrap();
        assert!(!is_held(&registry, &key).await, "{key}");
    }
}
