//! The holder gives up first: a holder whose traffic to Redis is black-holed
//! by a proxy has its work cancelled before any other client can take the
//! key, however the others retry.

use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{LockOptions, LockRegistry};
use lock_tests::{Proxy, RedisServer, unique_key};
use redis::AsyncCommands;
use tokio::sync::Mutex;
use tokio::time::Instant;

/// Lease lengths the trials cycle through.
const TTLS_MS: [u64; 4] = [60, 100, 200, 400];
const TRIALS: usize = 32;

/// One attempt at `key`: when it was sent, if it won (the grant happened no
/// earlier than that).
async fn attempt(registry: &LockRegistry, key: &str) -> Option<Instant> {
    let sent = Instant::now();
    let guard = registry
        .try_lock(key, LockOptions::default())
        .await
        .unwrap()?;
    drop(guard);
    Some(sent)
}

/// A competitor that reads the lease's PTTL from Redis and tries again
/// exactly when it ends.
async fn at_expiry(
    registry: LockRegistry,
    key: String,
    mut conn: redis::aio::MultiplexedConnection,
) -> Instant {
    let name = format!("lock:{{{key}}}");
    loop {
        let pttl: i64 = conn.pttl(&name).await.unwrap_or(0);
        if pttl > 0 {
            tokio::time::sleep(Duration::from_millis(pttl as u64)).await;
        }
        if let Some(sent) = attempt(&registry, &key).await {
            return sent;
        }
    }
}

/// A competitor that tries again after random pauses of up to 3 ms.
async fn at_random(registry: LockRegistry, key: String) -> Instant {
    loop {
        tokio::time::sleep(Duration::from_micros(rand::random_range(0..3_000))).await;
        if let Some(sent) = attempt(&registry, &key).await {
            return sent;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_holder_is_cancelled_before_anyone_else_acquires() {
    let server = RedisServer::new();
    let client = redis::Client::open(server.url()).unwrap();
    let pttl_conn = client.get_multiplexed_async_connection().await.unwrap();
    let mut smallest = Duration::MAX;
    for trial in 0..TRIALS {
        let ttl = Duration::from_millis(TTLS_MS[trial % TTLS_MS.len()]);
        let proxy = Proxy::start(server.port());
        let holder = LockRegistry::redis(&proxy.redis_url()).await.unwrap();
        let key = unique_key("partition");
        let guard = holder
            .lock(&key, LockOptions::default().ttl(ttl))
            .await
            .unwrap();
        let cancelled = Arc::new(Mutex::new(None));
        // The holder's work runs until the guard says the lease is lost.
        let work = tokio::spawn({
            let cancelled = cancelled.clone();
            async move {
                guard.lost().await;
                *cancelled.lock().await = Some(Instant::now());
                drop(guard);
            }
        });
        // Cut the holder off at a different point of its renewal cycle
        // each time: this wait is the scenario, not a synchronisation.
        tokio::time::sleep(ttl * (trial as u32 % 5) / 4).await;
        proxy.black_hole();
        let (a, b) = (
            LockRegistry::redis(&server.url()).await.unwrap(),
            LockRegistry::redis(&server.url()).await.unwrap(),
        );
        let acquired = tokio::select! {
            sent = at_expiry(a, key.clone(), pttl_conn.clone()) => sent,
            sent = at_random(b, key.clone()) => sent,
        };
        work.await.unwrap();
        let cancelled = cancelled
            .lock()
            .await
            .expect("the holder's work was cancelled");
        assert!(
            cancelled < acquired,
            "trial {trial} (ttl {ttl:?}): another client acquired {:?} before the holder gave up",
            cancelled - acquired
        );
        smallest = smallest.min(acquired - cancelled);
        drop(proxy);
    }
    eprintln!("{TRIALS} partitions: every holder gave up first; smallest margin {smallest:?}");
}
