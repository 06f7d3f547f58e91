//! The holder gives up first: a holder whose traffic to its store is
//! black-holed by a proxy has its work cancelled before any other client
//! can take the key, however the others retry. Redis and PostgreSQL.

use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{
    Acquire, AcquireRequest, Backend, LockOptions, LockRegistry, LockToken, LossSignal,
};
use lock_tests::{PostgresServer, Proxy, RedisServer, unique_key};
use tokio::sync::Mutex;
use tokio::time::Instant;

const TRIALS: usize = 32;

/// A competitor that asks the store directly and, while the key is held,
/// sleeps exactly the holder's remaining time (the store's own answer)
/// before asking again. Returns when its winning attempt was sent (the
/// grant happened no earlier).
async fn at_expiry(backend: Arc<dyn Backend>, key: String) -> Instant {
    let (token, loss) = (LockToken::random(), LossSignal::new());
    loop {
        let sent = Instant::now();
        let request = AcquireRequest::new(&key, token, Duration::from_secs(10), &loss);
        match backend.acquire(request).await.unwrap() {
            Acquire::Acquired { mut lease, .. } => {
                let _ = lease.release(Duration::ZERO).await;
                return sent;
            }
            Acquire::Held { remaining } => {
                tokio::time::sleep(remaining.unwrap_or(Duration::from_millis(1))).await;
            }
            _ => unreachable!("the contract has two answers"),
        }
    }
}

/// A competitor that tries again after random pauses of up to 3 ms.
async fn at_random(registry: LockRegistry, key: String) -> Instant {
    loop {
        tokio::time::sleep(Duration::from_micros(rand::random_range(0..3_000))).await;
        let sent = Instant::now();
        if let Some(guard) = registry
            .try_lock(&key, LockOptions::default())
            .await
            .unwrap()
        {
            drop(guard);
            return sent;
        }
    }
}

/// Runs the trials: `connect(url)` makes a registry; `direct` is the
/// store's URL, `proxied(port)` the same through a proxy on `port`.
async fn partitions<F, Fut>(
    store: &str,
    upstream: u16,
    direct: &str,
    proxied: impl Fn(u16) -> String,
    connect: F,
    ttls_ms: [u64; 4],
) where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = LockRegistry>,
{
    let mut smallest = Duration::MAX;
    for trial in 0..TRIALS {
        let ttl = Duration::from_millis(ttls_ms[trial % ttls_ms.len()]);
        let proxy = Proxy::start(upstream);
        let holder = connect(proxied(proxy.port())).await;
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
            connect(direct.to_owned()).await,
            connect(direct.to_owned()).await,
        );
        let acquired = tokio::select! {
            sent = at_expiry(a.backend().clone(), key.clone()) => sent,
            sent = at_random(b, key.clone()) => sent,
        };
        work.await.unwrap();
        let cancelled = cancelled
            .lock()
            .await
            .expect("the holder's work was cancelled");
        assert!(
            cancelled < acquired,
            "{store} trial {trial} (ttl {ttl:?}): another client acquired {:?} before the holder gave up",
            cancelled - acquired
        );
        smallest = smallest.min(acquired - cancelled);
        drop(proxy);
    }
    eprintln!(
        "{store}: {TRIALS} partitions, every holder gave up first; smallest margin {smallest:?}"
    );
}

/// One test, so the two stores' trials do not load the machine together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_holder_is_cancelled_before_anyone_else_acquires() {
    let redis = RedisServer::new();
    partitions(
        "redis",
        redis.port(),
        &redis.url(),
        |port| format!("redis://127.0.0.1:{port}"),
        |url| async move { LockRegistry::redis(&url).await.unwrap() },
        [60, 100, 200, 400],
    )
    .await;
    drop(redis);
    let postgres = PostgresServer::new();
    partitions(
        "postgres",
        postgres.port(),
        &postgres.url(),
        |port| format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        |url| async move { LockRegistry::postgres(&url).await.unwrap() },
        [100, 200, 300, 400],
    )
    .await;
}
