//! What each lock sends to the server, read from the server's own command
//! counts: the plain path without fencing, one round trip each way, a
//! release published only when someone waits, and the server's own
//! owner-checked commands where it has them (this machine's Redis 7.0 has
//! none: it is asked, says so, and gets scripts).

use std::time::Duration;

use lock_runtime::store::redis::{Fencing, OwnerChecks};
use lock_runtime::{LockOptions, LockRegistry, RedisStore};
use lock_tests::{RedisServer, lock_and_release, unique_key, wait_for_waiter, wait_until};
use redis::Commands;

use super::support::{
    assert_commands, calls_of, command_calls, errors, lock_in_task, registry, reset_stats,
};

/// What one unfenced lock and release send when nobody waits: `SET NX PX
/// GET`, and the release script (its `GET` and `DEL`), as the plain lock
/// of the benchmark's floor.
const PLAIN_LOCK: &[(&str, u64)] = &[("del", 1), ("evalsha", 1), ("get", 1), ("set", 1)];

/// Without fencing, an uncontended lock is the one command a plain lock
/// sends (`SET NX PX`, with `GET` to recognise a retried attempt), no
/// script; the release is one script call, as the floor's.
#[tokio::test]
async fn an_unfenced_lock_is_one_plain_set() {
    let server = RedisServer::new();
    let store = RedisStore::builder(&server.url())
        .fencing(Fencing::Off)
        .connect()
        .await
        .unwrap();
    let registry = LockRegistry::new(store);
    lock_and_release(&registry, &unique_key("warm")).await;
    reset_stats(&server);
    let guard = registry
        .lock(&unique_key("plain"), LockOptions::default())
        .await
        .unwrap();
    assert_eq!(guard.fencing_token().await.unwrap(), 0);
    guard.release().await.unwrap();
    assert_commands(&server, PLAIN_LOCK);
}

/// `LockOptions::fencing(false)` on a store with fencing: that lock is
/// one plain `SET`, its token 0, and fenced locks of the same key before
/// and after it keep their increasing tokens.
#[tokio::test]
async fn a_lock_without_fencing_on_a_fenced_store_is_one_plain_set() {
    let server = RedisServer::new();
    let registry = registry(&server).await;
    let key = unique_key("mixed");
    let first = registry.lock(&key, LockOptions::default()).await.unwrap();
    let before = first.fencing_token().await.unwrap();
    first.release().await.unwrap();
    reset_stats(&server);
    let plain = registry
        .lock(&key, LockOptions::default().fencing(false))
        .await
        .unwrap();
    assert_eq!(plain.fencing_token().await.unwrap(), 0);
    plain.release().await.unwrap();
    assert_commands(&server, PLAIN_LOCK);
    let after = registry.lock(&key, LockOptions::default()).await.unwrap();
    assert!(
        after.fencing_token().await.unwrap() > before,
        "{before} then {}",
        after.fencing_token().await.unwrap()
    );
    after.release().await.unwrap();
}

#[tokio::test]
async fn uncontended_lock_and_release_are_one_round_trip_each() {
    let server = RedisServer::new();
    let registry = registry(&server).await;
    // The first use loads the scripts (NOSCRIPT, then EVAL); measure after.
    lock_and_release(&registry, &unique_key("warm")).await;
    reset_stats(&server);
    let guard = registry
        .lock(&unique_key("rt"), LockOptions::default())
        .await
        .unwrap();
    guard.release().await.unwrap();
    // Two top-level commands: the plain SET NX (the token is issued only
    // when read), and the release script (GET, DEL; no PUBLISH, as nobody
    // waits).
    assert_commands(&server, PLAIN_LOCK);
    // A body that reads its token twice: one more round trip, the first
    // time, to the script that checks the holder (GET) and issues it
    // (TIME, and a SET .. GET of the fencing counter).
    reset_stats(&server);
    let guard = registry
        .lock(&unique_key("rt"), LockOptions::default())
        .await
        .unwrap();
    let token = guard.fencing_token().await.unwrap();
    assert_eq!(guard.fencing_token().await.unwrap(), token);
    guard.release().await.unwrap();
    assert_commands(
        &server,
        &[
            ("del", 1),
            ("evalsha", 2),
            ("get", 2),
            ("set", 2),
            ("time", 1),
        ],
    );
}

/// A release is published only when a waiter marked the key: not when
/// nobody waits, and when a waiter in another process was refused, also
/// after the holder's process handed the lease to a task of its own, whose
/// release then wakes that waiter long before the lease could expire.
#[tokio::test]
async fn a_release_is_published_only_when_someone_waits() {
    let server = RedisServer::new();
    let (here, there) = (registry(&server).await, registry(&server).await);
    let key = unique_key("published");
    let value =
        || -> Option<String> { server.connection().get(format!("lock:{{{key}}}")).unwrap() };
    lock_and_release(&here, &key).await;
    reset_stats(&server);
    lock_and_release(&here, &key).await;
    assert_eq!(
        calls_of(&command_calls(&server), "publish"),
        0,
        "nobody waits"
    );

    let first = here.lock(&key, LockOptions::default()).await.unwrap();
    let next_here = lock_in_task(&here, &key);
    wait_until("the next task queued locally", || {
        here.local_queue_len(&key) == 2
    })
    .await;
    let waiting = lock_in_task(&there, &key);
    wait_for_waiter(&server, &key).await;
    wait_until("the waiter marked the key", || {
        value().is_some_and(|v| v.ends_with('~'))
    })
    .await;
    reset_stats(&server);
    // Handed over within this process: the mark goes with the lease.
    first.release().await.unwrap();
    let next_here = next_here.await.unwrap();
    assert!(
        value().is_some_and(|v| v.ends_with('~')),
        "the mark was lost: {:?}",
        value()
    );
    assert_eq!(
        calls_of(&command_calls(&server), "publish"),
        0,
        "handed over, not released"
    );
    next_here.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the release woke the waiter (the lease had 30 s left)")
        .unwrap();
    assert_eq!(calls_of(&command_calls(&server), "publish"), 1);
    // The next holder's key is its own token again, unmarked.
    assert!(value().is_some_and(|v| !v.ends_with('~')), "{:?}", value());
    guard.release().await.unwrap();
}

/// A store that detects (the default) asks the server once at connect
/// which owner-checked commands it has. Redis 7.0 has neither `DELEX` nor
/// `DELIFEQ`: the store says it sends scripts, and a lock renewed and
/// released sends no command the server refuses.
#[tokio::test]
async fn redis_7_is_asked_and_gets_scripts() {
    let server = RedisServer::new();
    reset_stats(&server);
    let store = RedisStore::connect(&server.url()).await.unwrap();
    assert_eq!(store.owner_checks(), OwnerChecks::Scripts);
    assert_eq!(calls_of(&command_calls(&server), "command|info"), 1);
    assert!(
        format!("{store:?}").contains("owner_checks: Scripts"),
        "{store:?}"
    );
    let mut stats = server.connection();
    let before = errors(&mut stats);
    let registry = LockRegistry::new(store);
    let key = unique_key("detected");
    let guard = renewed_lock(&mut stats, &registry, &key).await;
    guard.release().await.unwrap();
    assert!(!stored(&mut stats, &key));
    assert_eq!(errors(&mut stats), before, "a command was refused");
}

/// Told to send `DELEX` to a server without it (Redis 7.0), the store
/// releases the lease by script after the server's refusal, and sends
/// scripts from then on: one refusal in all, every lease released. A
/// lease whose acquire found the key in demand goes by script from the
/// start, so that its release wakes the waiters in the same call: it
/// meets no refusal.
#[tokio::test]
async fn a_refused_release_falls_back_to_the_script_for_good() {
    let server = RedisServer::new();
    let forced = || async {
        RedisStore::builder(&server.url())
            .owner_checks(OwnerChecks::Delex)
            .connect()
            .await
            .unwrap()
    };
    reset_stats(&server);
    let (here, there) = (forced().await, forced().await);
    assert_eq!(
        calls_of(&command_calls(&server), "command|info"),
        0,
        "asked"
    );
    assert_eq!(here.owner_checks(), OwnerChecks::Delex);
    let (here_store, there_store) = (here.clone(), there.clone());
    let (here, there) = (LockRegistry::new(here), LockRegistry::new(there));
    let key = unique_key("forced");

    // Contended: `there` waits while `here` holds, and gets the key.
    let first = here.lock(&key, LockOptions::default()).await.unwrap();
    let waiting = lock_in_task(&there, &key);
    wait_for_waiter(&server, &key).await;
    let mut stats = server.connection();
    let before = errors(&mut stats);
    let refusals = |stats: &mut redis::Connection| errors(stats) - before;
    first.release().await.unwrap();
    assert_eq!(refusals(&mut stats), 1);
    assert_eq!(here_store.owner_checks(), OwnerChecks::Scripts);
    let second = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the release by script woke the waiter")
        .unwrap();
    second.release().await.unwrap();
    assert_eq!(refusals(&mut stats), 1, "the contended lease tried DELEX");
    assert_eq!(there_store.owner_checks(), OwnerChecks::Delex);
    assert!(!stored(&mut stats, &key));

    // Uncontended, on each store: one more refusal for `there`, none for
    // `here`, which sends scripts now.
    lock_and_release(&there, &key).await;
    assert_eq!(refusals(&mut stats), 2);
    assert_eq!(there_store.owner_checks(), OwnerChecks::Scripts);
    lock_and_release(&here, &key).await;
    lock_and_release(&there, &key).await;
    assert_eq!(refusals(&mut stats), 2);
    assert!(!stored(&mut stats, &key));
}

/// Told to send `SET … IFEQ` (with `DELIFEQ`) to a server without it, the
/// store renews the lease by script after the server's refusal (a syntax
/// error, which leaves the key as it was): the lease outlives its ttl
/// several times over.
#[tokio::test]
async fn a_refused_renewal_falls_back_to_the_script() {
    let server = RedisServer::new();
    let store = RedisStore::builder(&server.url())
        .owner_checks(OwnerChecks::Delifeq)
        .connect()
        .await
        .unwrap();
    let mut stats = server.connection();
    let before = errors(&mut stats);
    let registry = LockRegistry::new(store.clone());
    let key = unique_key("renewed");
    let guard = renewed_lock(&mut stats, &registry, &key).await;
    assert_eq!(store.owner_checks(), OwnerChecks::Scripts);
    assert_eq!(errors(&mut stats) - before, 1);
    guard.release().await.unwrap();
    assert!(!stored(&mut stats, &key));
    assert_eq!(errors(&mut stats) - before, 1);
}

/// Takes `key` for 300 ms leases and holds it until it was renewed past
/// three of them: the guard still holds it, and so does the server
/// (asked on `stats`).
async fn renewed_lock(
    stats: &mut redis::Connection,
    registry: &LockRegistry,
    key: &str,
) -> lock_runtime::LockGuard {
    let ttl = Duration::from_millis(300);
    let guard = registry
        .lock(key, LockOptions::default().ttl(ttl))
        .await
        .unwrap();
    // Time itself is what is tested: the lease must outlive its ttl.
    tokio::time::sleep(ttl * 3).await;
    assert!(guard.is_held(), "the lease was lost");
    assert!(stored(stats, key), "the server let the lease expire");
    guard
}

/// Whether the server has `key`'s lock, asked on `conn`.
fn stored(conn: &mut redis::Connection, key: &str) -> bool {
    conn.exists(format!("lock:{{{key}}}")).unwrap()
}
