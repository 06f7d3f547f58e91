//! The holder gives up first: a holder whose traffic to its store is
//! black-holed by a proxy has its work cancelled before the store grants
//! the key to anyone else, however the others retry. Redis, PostgreSQL and
//! etcd.
//!
//! Both sides are timed on this machine's wall clock, which the servers on
//! loopback share: the holder's cancellation when its work sees the loss,
//! the competitor's grant by the server's own clock (a Redis token is the
//! server's `TIME` in microseconds; a PostgreSQL row expires its ttl after
//! the grant; etcd's grant no earlier than the winning request was sent).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::store::{Acquire, AcquireRequest, Lease, LockToken, LossSignal, Store};
use lock_runtime::{LockOptions, LockRegistry};
use lock_tests::{EtcdCluster, PostgresServer, Proxy, RedisServer, unique_key};
use tokio::sync::Mutex;

const TRIALS: usize = 32;

/// The competitors' lease length.
const TTL: Duration = Duration::from_secs(10);

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

/// The lease a competitor won.
struct Won {
    fencing: u64,
    lease: Box<dyn Lease>,
    /// When the winning request was sent (wall clock, µs): the store
    /// granted it no earlier.
    sent_us: u128,
}

/// One attempt by a competitor; the lease if it won.
async fn attempt(backend: &Arc<dyn Store>, key: &str) -> Result<Won, Option<Duration>> {
    let (token, loss) = (LockToken::random(), LossSignal::new());
    let request = AcquireRequest::new(key, token, TTL, &loss);
    let sent_us = now_us();
    match backend.acquire(request).await.unwrap() {
        Acquire::Acquired { fencing, lease } => Ok(Won {
            fencing,
            lease,
            sent_us,
        }),
        Acquire::Held { remaining } => Err(remaining),
        _ => unreachable!("the contract has two answers"),
    }
}

/// A competitor that, while the key is held, sleeps exactly the holder's
/// remaining time (the store's own answer) before asking again.
async fn at_expiry(backend: Arc<dyn Store>, key: String) -> Won {
    loop {
        match attempt(&backend, &key).await {
            Ok(won) => return won,
            Err(remaining) => {
                tokio::time::sleep(remaining.unwrap_or(Duration::from_millis(1))).await
            }
        }
    }
}

/// A competitor that tries again after random pauses of up to 3 ms.
async fn at_random(backend: Arc<dyn Store>, key: String) -> Won {
    loop {
        tokio::time::sleep(Duration::from_micros(rand::random_range(0..3_000))).await;
        if let Ok(won) = attempt(&backend, &key).await {
            return won;
        }
    }
}

/// Runs `trials` trials with ttls from `ttls_ms` in turn: `connect(url)`
/// makes a registry; `direct` is the
/// store's URL, `proxied(port)` the same through a proxy on `port`;
/// `granted_at(key, fencing, sent)` is when, in microseconds of the wall
/// clock, the store granted `key` to the competitor that won with `fencing`
/// by a request sent at `sent`.
async fn partitions<C, CF, G, GF>(
    store: &str,
    upstream: u16,
    direct: &str,
    proxied: impl Fn(u16) -> String,
    connect: C,
    granted_at: G,
    (ttls_ms, trials): ([u64; 4], usize),
) where
    C: Fn(String) -> CF,
    CF: Future<Output = LockRegistry>,
    G: Fn(String, u64, u128) -> GF,
    GF: Future<Output = u128>,
{
    let mut smallest = u128::MAX;
    for trial in 0..trials {
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
                *cancelled.lock().await = Some(now_us());
                drop(guard);
            }
        });
        let (a, b) = (
            connect(direct.to_owned()).await,
            connect(direct.to_owned()).await,
        );
        // Cut the holder off at a different point of its renewal cycle
        // each time: this wait is the scenario, not a synchronisation.
        tokio::time::sleep(ttl * (trial as u32 % 5) / 4).await;
        proxy.black_hole();
        let mut won = tokio::select! {
            won = at_expiry(a.store().clone(), key.clone()) => won,
            won = at_random(b.store().clone(), key.clone()) => won,
        };
        let granted = granted_at(key.clone(), won.fencing, won.sent_us).await;
        won.lease.release(Duration::ZERO).await.unwrap();
        work.await.unwrap();
        let cancelled = cancelled
            .lock()
            .await
            .expect("the holder's work was cancelled");
        assert!(
            cancelled < granted,
            "{store} trial {trial} (ttl {ttl:?}): the store granted the key {} µs before the holder gave up",
            cancelled - granted
        );
        smallest = smallest.min(granted - cancelled);
        drop(proxy);
    }
    eprintln!(
        "{store}: {trials} partitions, every holder gave up first; smallest margin {:.2} ms",
        smallest as f64 / 1000.0
    );
}

/// One test, so the two stores' trials do not load the machine together.
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
        ([60, 100, 200, 400], TRIALS),
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
        // The winner's row expires its ttl after the grant.
        |key, _fencing, _sent| {
            let expires = postgres.psql(&format!(
                "SELECT (extract(epoch FROM expires_at) * 1000000)::bigint FROM lock_leases \
                 WHERE key = convert_to('{}', 'UTF8')",
                key.replace('\'', "''")
            ));
            async move { expires.parse::<u128>().expect("the winner's row") - TTL.as_micros() }
        },
        ([100, 200, 300, 400], TRIALS),
    )
    .await;
}

/// etcd counts leases in seconds: fewer, longer trials. Its clock is not
/// readable from here, so the competitor's grant is timed, more strictly,
/// by when its winning request was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_etcd_holder_is_cancelled_before_anyone_else_is_granted_the_key() {
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
