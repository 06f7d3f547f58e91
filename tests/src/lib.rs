//! Test harness for the lock-runtime integration tests.
//!
//! A library, not a `mod support;`, so every test binary links the same
//! helpers without dead-code warnings.

#![warn(missing_docs, missing_debug_implementations)]

pub mod attribute;
pub mod careless;
mod certs;
mod etcd_server;
mod etcd_watch;
pub mod history;
mod mariadb_server;
pub mod partition;
mod postgres_server;
pub mod processes;
mod proxy;
mod redis_server;
pub mod scenarios;
mod sentinel_watch;
mod server_process;
pub mod soak;
mod warnings;
mod worker;
mod wrapped;
mod zookeeper_server;

pub use certs::TestCerts;
pub use etcd_server::{EtcdCluster, etcd_delete_lock, etcd_lock_entries, etcd_lock_range};
pub use etcd_watch::EtcdWatch;
pub use mariadb_server::MariaDbServer;
pub use postgres_server::{PgBouncer, PoolMode, PostgresServer};
pub use proxy::{Proxy, ProxySwitch};
pub use redis_server::{
    RedisCluster, RedisSentinels, RedisServer, RedisServers, RedisTlsServer, SENTINEL_MASTER,
};
pub use sentinel_watch::SentinelWatch;
pub use server_process::{StoreServer, servers_data_root};
pub use warnings::Warnings;
pub use worker::{Worker, field, sum_of_done};
pub use wrapped::Inner;
pub use zookeeper_server::ZooKeeperEnsemble;

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

/// An error and every source under it, as one line: `a: b: c`.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut shown = err.to_string();
    let mut source = err.source();
    while let Some(next) = source {
        shown.push_str(": ");
        shown.push_str(&next.to_string());
        source = next.source();
    }
    shown
}

/// Waits (at most 5 s) until a reader of `key` is refused, as it is once a
/// writer waits; a reader let in before then is let go at once.
pub async fn until_a_reader_is_refused(registry: &lock_runtime::LockRegistry, key: &str) {
    let read = || lock_runtime::LockOptions::default().access(lock_runtime::Access::Read);
    tokio::time::timeout(std::time::Duration::from_secs(5), async {
        while let Some(early) = registry.try_lock(key, read()).await.expect("try_lock") {
            early.release().await.expect("release");
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the waiting writer held new readers off");
}

/// The error of a connect refused for its settings, before anything was
/// sent (it must be [`LockError::InvalidSettings`](lock_runtime::LockError::InvalidSettings)), as shown.
pub async fn invalid_settings<S>(
    connecting: impl std::future::Future<Output = Result<S, lock_runtime::LockError>>,
) -> String {
    match connecting.await {
        Ok(_) => panic!("connected, where the settings had to be refused"),
        Err(err @ lock_runtime::LockError::InvalidSettings { .. }) => err.to_string(),
        Err(err) => panic!("expected InvalidSettings, got {err:?}"),
    }
}

/// The error of a connect that must fail, with its sources
/// ([`error_chain`]).
pub async fn connect_error<S>(
    connecting: impl std::future::Future<Output = Result<S, lock_runtime::LockError>>,
) -> String {
    match connecting.await {
        Ok(_) => panic!("connected, where the connect had to fail"),
        Err(err) => error_chain(&err),
    }
}

/// Takes and releases `key` once (warms up scripts and connections).
pub async fn lock_and_release(registry: &lock_runtime::LockRegistry, key: &str) {
    let guard = registry
        .lock(key, lock_runtime::LockOptions::default())
        .await
        .expect("lock");
    guard.release().await.expect("release");
}

/// How long until `registry` holds `key` (waiting at most 5 s), then
/// releases it: for checks that a key was freed at once, not after its ttl.
/// On Tokio's clock, so it works under a paused test clock too.
pub async fn time_to_lock(registry: &lock_runtime::LockRegistry, key: &str) -> std::time::Duration {
    let started = tokio::time::Instant::now();
    let opts = lock_runtime::LockOptions::default().wait_timeout(std::time::Duration::from_secs(5));
    let guard = registry.lock(key, opts).await.expect("lock within 5 s");
    let waited = started.elapsed();
    guard.release().await.expect("release");
    waited
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
    wait_for_waiter(server, key).await;
    let released_at = Instant::now();
    held.release().await.expect("holder releases");
    let acquired_at = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("waiter acquires within 10 s")
        .expect("waiter task");
    acquired_at - released_at
}

/// Polls `ready` every 2 ms until it holds; panics naming `what` after 5 s.
/// For conditions a test can observe but not be told of (a server's state).
pub async fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let since = std::time::Instant::now();
    while !ready() {
        assert!(
            since.elapsed() < std::time::Duration::from_secs(5),
            "gave up after 5 s waiting until {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}

/// The last `n` lines of `text` (a server's log, for a failure message).
pub fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Polls `ready` every 10 ms on this thread until it holds; panics after
/// `within`, naming `what`. For tests that drive real processes.
pub fn wait_until_blocking(
    what: &str,
    within: std::time::Duration,
    mut ready: impl FnMut() -> bool,
) {
    let since = std::time::Instant::now();
    while !ready() {
        assert!(
            since.elapsed() < within,
            "gave up after {within:?} waiting until {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Waits until a client subscribed to `key`'s release channel on `server`
/// (`PUBSUB NUMSUB`): from then on a waiter is known to be waiting.
pub async fn wait_for_waiter(server: &RedisServer, key: &str) {
    let channel = format!("lock:{{{key}}}:released");
    wait_until("a waiter subscribed", || {
        let counts: Vec<(String, u64)> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query(&mut server.connection())
            .expect("PUBSUB NUMSUB");
        counts.first().is_some_and(|(_, n)| *n > 0)
    })
    .await;
}

/// Expands each named `async fn NAME(locks: LockRegistry)` into two tests,
/// `memory::NAME` (an in-memory registry) and `redis::NAME` (a registry on
/// a Redis server of its own).
#[macro_export]
macro_rules! on_memory_and_redis {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    super::$name(::lock_runtime::LockRegistry::memory()).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let server = $crate::RedisServer::new();
                    let locks = ::lock_runtime::LockRegistry::redis(&server.url())
                        .await
                        .expect("connect to the test server");
                    super::$name(locks).await;
                }
            )*
        }
    };
}
