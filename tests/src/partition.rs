//! The holder gives up first: a holder whose traffic to its store is
//! black-holed by a proxy has its work cancelled before the store grants
//! the key to anyone else, however the others retry. Written once here,
//! run by each store's test binary with that store's way of timing a
//! grant.
//!
//! Both sides are timed on this machine's wall clock, which the servers on
//! loopback share: the holder's cancellation when its work sees the loss,
//! the competitor's grant as the store's test says (by the server's own
//! clock where it can be read).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::{Proxy, unique_key};
use lock_runtime::store::{Acquire, AcquireRequest, Lease, LockToken, LossSignal, Store};
use lock_runtime::{LockOptions, LockRegistry};
use tokio::sync::Mutex;

/// The competitors' lease length.
pub const TTL: Duration = Duration::from_secs(10);

/// Now, on the wall clock, in microseconds.
pub fn now_us() -> u128 {
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
        Acquire::Acquired { fencing, lease } => {
            let fencing = match fencing {
                Some(fencing) => fencing,
                // Issued on demand; none once the lease was lost already.
                None => match lease.fencing_token().await.unwrap() {
                    Some(fencing) => fencing,
                    None => return Err(None),
                },
            };
            Ok(Won {
                fencing,
                lease,
                sent_us,
            })
        }
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

/// Runs `trials` trials with ttls from `ttls_ms` in turn, on the store
/// listening on `upstream`: `connect(url)` makes a registry; `direct` is
/// the store's URL, `proxied(port)` the same through a proxy on `port`;
/// `granted_at(key, fencing, sent)` is when, in microseconds of the wall
/// clock, the store granted `key` to the competitor that won with `fencing`
/// by a request sent at `sent`.
pub async fn partitions<C, CF, G, GF>(
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
