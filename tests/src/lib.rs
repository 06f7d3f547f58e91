//! Test harness for the lock-runtime integration tests.
//!
//! A library, not a `mod support;`, so every test binary links the same
//! helpers without dead-code warnings.

#![warn(missing_docs, missing_debug_implementations)]

mod redis_server;
mod worker;

pub use redis_server::{RedisCluster, RedisServer, RedisServers};
pub use worker::{Worker, field};

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A key no other test (or earlier run against the same store) uses.
pub fn unique_key(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{prefix}:{}:{nanos:x}:{n}", std::process::id())
}

/// Expands the contract every [`Backend`](lock_runtime::Backend) must keep
/// into a module of tests: exclusive acquire, expiry, owner-checked renew and
/// release, lingering release, fencing order and release notifications.
///
/// `$make` is an async fn returning `(backend, keep_alive)`; `keep_alive`
/// (a server, say) is held until the test ends.
#[macro_export]
macro_rules! backend_contract {
    ($module:ident, $make:path) => {
        mod $module {
            use std::time::Duration;

            use lock_runtime::{Acquire, Backend, LockToken};

            use super::*;

            const TTL: Duration = Duration::from_secs(10);

            fn fencing(acquire: Acquire) -> u64 {
                match acquire {
                    Acquire::Acquired { fencing } => fencing,
                    other => panic!("expected to acquire, got {other:?}"),
                }
            }

            #[tokio::test]
            async fn acquire_is_exclusive_and_reports_the_remaining_lease() {
                let (backend, _keep) = $make().await;
                let key = $crate::unique_key("contract");
                let (a, b) = (LockToken::random(), LockToken::random());
                let first = fencing(backend.acquire(&key, a, TTL).await.unwrap());
                match backend.acquire(&key, b, TTL).await.unwrap() {
                    Acquire::Held {
                        remaining: Some(left),
                    } => {
                        assert!(left <= TTL && left > TTL / 2, "{left:?}")
                    }
                    other => panic!("expected Held, got {other:?}"),
                }
                // The same token again (a retried request) gets the same answer.
                assert_eq!(fencing(backend.acquire(&key, a, TTL).await.unwrap()), first);
                assert!(matches!(
                    backend.acquire(&key, b, TTL).await.unwrap(),
                    Acquire::Held { .. }
                ));
            }

            #[tokio::test]
            async fn an_expired_lease_can_be_taken_and_is_not_renewable() {
                let (backend, _keep) = $make().await;
                let key = $crate::unique_key("contract");
                let (a, b) = (LockToken::random(), LockToken::random());
                let short = Duration::from_millis(50);
                let first = fencing(backend.acquire(&key, a, short).await.unwrap());
                // Expiry is the thing under test: sleeping past it is the point.
                tokio::time::sleep(short * 3).await;
                assert!(
                    !backend.renew(&key, a, TTL).await.unwrap(),
                    "expired lease renewed"
                );
                let second = fencing(backend.acquire(&key, b, TTL).await.unwrap());
                assert!(
                    second > first,
                    "fencing must grow across expiry: {first} then {second}"
                );
                assert!(!backend.release(&key, a, Duration::ZERO).await.unwrap());
                assert!(matches!(
                    backend.acquire(&key, a, TTL).await.unwrap(),
                    Acquire::Held { .. }
                ));
            }

            #[tokio::test]
            async fn only_the_owner_renews_or_releases() {
                let (backend, _keep) = $make().await;
                let key = $crate::unique_key("contract");
                let (owner, other) = (LockToken::random(), LockToken::random());
                fencing(
                    backend
                        .acquire(&key, owner, Duration::from_millis(300))
                        .await
                        .unwrap(),
                );
                assert!(!backend.renew(&key, other, TTL).await.unwrap());
                assert!(!backend.release(&key, other, Duration::ZERO).await.unwrap());
                assert!(backend.renew(&key, owner, TTL).await.unwrap());
                match backend.acquire(&key, other, TTL).await.unwrap() {
                    Acquire::Held {
                        remaining: Some(left),
                    } => {
                        assert!(
                            left > Duration::from_secs(5),
                            "renewal extended the lease: {left:?}"
                        )
                    }
                    acquired => panic!("expected Held, got {acquired:?}"),
                }
                assert!(backend.release(&key, owner, Duration::ZERO).await.unwrap());
                assert!(
                    !backend.release(&key, owner, Duration::ZERO).await.unwrap(),
                    "released twice"
                );
                fencing(backend.acquire(&key, other, TTL).await.unwrap());
            }

            #[tokio::test]
            async fn release_with_linger_keeps_the_lease_that_long() {
                let (backend, _keep) = $make().await;
                let key = $crate::unique_key("contract");
                let (a, b) = (LockToken::random(), LockToken::random());
                fencing(backend.acquire(&key, a, TTL).await.unwrap());
                let linger = Duration::from_millis(200);
                assert!(backend.release(&key, a, linger).await.unwrap());
                match backend.acquire(&key, b, TTL).await.unwrap() {
                    Acquire::Held {
                        remaining: Some(left),
                    } => assert!(left <= linger, "{left:?}"),
                    other => panic!("expected Held while lingering, got {other:?}"),
                }
                tokio::time::sleep(linger * 2).await;
                fencing(backend.acquire(&key, b, TTL).await.unwrap());
            }

            #[tokio::test]
            async fn fencing_tokens_increase_across_holders() {
                let (backend, _keep) = $make().await;
                let key = $crate::unique_key("contract");
                let mut last = 0;
                for _ in 0..20 {
                    let token = LockToken::random();
                    let next = fencing(backend.acquire(&key, token, TTL).await.unwrap());
                    assert!(next > last, "{last} then {next}");
                    last = next;
                    assert!(backend.release(&key, token, Duration::ZERO).await.unwrap());
                }
            }

            #[tokio::test]
            async fn a_watch_made_before_the_release_sees_it() {
                let (backend, _keep) = $make().await;
                let key = $crate::unique_key("contract");
                let token = LockToken::random();
                fencing(backend.acquire(&key, token, TTL).await.unwrap());
                let mut watch = backend.watch(&key).await.unwrap();
                assert!(backend.release(&key, token, Duration::ZERO).await.unwrap());
                tokio::time::timeout(Duration::from_secs(5), watch.released())
                    .await
                    .expect("release notification");
            }
        }
    };
}

/// Takes and releases `key` once (warms up scripts and connections).
pub async fn lock_and_release(registry: &lock_runtime::LockRegistry, key: &str) {
    let guard = registry
        .lock(key, lock_runtime::LockOptions::default())
        .await
        .expect("lock");
    guard.release().await.expect("release");
}

/// True when `registry` cannot take `key` right now: someone holds it.
pub async fn is_held(registry: &lock_runtime::LockRegistry, key: &str) -> bool {
    let attempt = registry
        .try_lock(key, lock_runtime::LockOptions::default())
        .await
        .expect("try_lock");
    match attempt {
        Some(guard) => {
            guard.release().await.expect("release");
            false
        }
        None => true,
    }
}

/// Measures a hand-off on Redis: `holder` holds `key`, `waiter` waits for it
/// in a task; once the waiter's subscription shows on `server` (`PUBSUB
/// NUMSUB`), the holder releases. Returns the time from the release call to
/// the waiter holding the lock.
pub async fn measure_handoff(
    holder: &lock_runtime::LockRegistry,
    waiter: lock_runtime::LockRegistry,
    key: &str,
    server: &RedisServer,
) -> std::time::Duration {
    use std::time::{Duration, Instant};
    let opts = lock_runtime::LockOptions::default;
    let held = holder.lock(key, opts()).await.expect("holder locks");
    let waiting = tokio::spawn({
        let key = key.to_owned();
        async move {
            let guard = waiter.lock(&key, opts()).await.expect("waiter locks");
            let at = Instant::now();
            guard.release().await.expect("waiter releases");
            at
        }
    });
    let channel = format!("lock:{{{key}}}:released");
    let since = Instant::now();
    loop {
        let counts: Vec<(String, u64)> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query(&mut server.connection())
            .expect("PUBSUB NUMSUB");
        if counts.first().is_some_and(|(_, n)| *n > 0) {
            break;
        }
        assert!(
            since.elapsed() < Duration::from_secs(5),
            "the waiter never subscribed"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let released_at = Instant::now();
    held.release().await.expect("holder releases");
    let acquired_at = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("waiter acquires within 10 s")
        .expect("waiter task");
    acquired_at - released_at
}
