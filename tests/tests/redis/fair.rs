//! Fair mode on one server: waiters served in the order they first asked,
//! across processes, shares and permits among them.

use std::sync::Arc;
use std::time::Duration;

use lock_runtime::store::testkit::Clients;
use lock_runtime::store_contract;
use lock_runtime::{LockError, LockOptions, LockRegistry, RedisStore};
use lock_tests::{RedisServer, unique_key, wait_until};
use redis::Commands;

use super::support::{calls_of, command_calls, lock_in_task, reset_stats};

/// Fair mode, with a grant timeout of `grant_ms`.
async fn fair_backend(server: &RedisServer, grant_ms: u64) -> RedisStore {
    RedisStore::builder(&server.url())
        .fair(Duration::from_millis(grant_ms))
        .connect()
        .await
        .unwrap()
}

/// A registry over its own fair-mode backend.
async fn fair_registry(server: &RedisServer, grant_ms: u64) -> LockRegistry {
    LockRegistry::builder(fair_backend(server, grant_ms).await)
        .build()
        .unwrap()
}

async fn redis_fair_store() -> Clients {
    let server = RedisServer::new();
    let (a, b) = (
        fair_backend(&server, 500).await,
        fair_backend(&server, 500).await,
    );
    Clients::new(Arc::new(a), Arc::new(b), server)
}

store_contract!(
    redis_fair_contract,
    redis_fair_store,
    skip: [
        a_forced_release_is_pushed_to_the_holder,
    ]
);

/// The waiters queued in fair mode on `key`.
fn fair_queue(server: &RedisServer, key: &str) -> Vec<String> {
    server
        .connection()
        .lrange(format!("lock:{{{key}}}:queue"), 0, -1)
        .unwrap()
}

#[tokio::test]
async fn fair_mode_refuses_a_grant_timeout_too_short_to_keep_a_place() {
    let secret = "s3cret-Pa55word";
    let server = RedisServer::with_password(secret);
    let url = format!("redis://:{secret}@127.0.0.1:{}", server.port());
    let err = RedisStore::builder(&url)
        .fair(Duration::from_millis(10))
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidSettings { .. }), "{err:?}");
    let shown = format!("{err} {err:?}");
    assert!(shown.contains("grant timeout (10ms)"), "{shown}");
    assert!(shown.contains("127.0.0.1"), "names the store: {shown}");
    assert!(!shown.contains(secret), "password leaked: {shown}");
}

/// A waiter that gives up (its `wait_timeout`) leaves the queue: the
/// holder's release then frees the key instead of granting it to nobody.
#[tokio::test]
async fn fair_mode_a_waiter_that_times_out_leaves_the_queue() {
    let server = RedisServer::new();
    let key = unique_key("fair-timeout");
    let holder = fair_registry(&server, 2000).await;
    let waiter = fair_registry(&server, 2000).await;
    let guard = holder.lock(&key, LockOptions::default()).await.unwrap();
    let opts = LockOptions::default().wait_timeout(Duration::from_millis(300));
    let err = waiter.lock(&key, opts).await.unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    wait_until("the waiter left the queue", || {
        fair_queue(&server, &key).is_empty()
    })
    .await;
    guard.release().await.unwrap();
    let left: bool = server
        .connection()
        .exists(format!("lock:{{{key}}}"))
        .unwrap();
    assert!(!left, "released, not granted");
    let again = waiter.try_lock(&key, LockOptions::default()).await.unwrap();
    assert!(again.is_some(), "the key is free for anyone");
}

/// With a waiter queued, a key found free (its holder's lease gone without
/// a release) is the waiter's: a skip-mode attempt does not take it, and
/// never queues; the waiter takes it at its next attempt.
#[tokio::test]
async fn fair_mode_a_skip_attempt_does_not_jump_the_queue() {
    let server = RedisServer::new();
    let key = unique_key("fair-skip");
    // A 3 s grant timeout: the waiter asks again once a second.
    let holder = fair_registry(&server, 3000).await;
    let waiter = fair_registry(&server, 3000).await;
    let skipper = fair_registry(&server, 3000).await;
    let guard = holder.lock(&key, LockOptions::default()).await.unwrap();
    let waiting = tokio::spawn({
        let key = key.clone();
        // The waiter keeps the key until the end, so the skipper can never
        // find it free after the waiter's turn either.
        async move { waiter.lock(&key, LockOptions::default()).await.unwrap() }
    });
    wait_until("the waiter queued", || fair_queue(&server, &key).len() == 1).await;
    let queued = fair_queue(&server, &key);
    // The lease vanishes as if it had expired: no release, no grant.
    let () = server.connection().del(format!("lock:{{{key}}}")).unwrap();
    let skipped = skipper
        .try_lock(&key, LockOptions::default())
        .await
        .unwrap();
    assert!(
        skipped.is_none(),
        "the skip attempt took a queued waiter's turn"
    );
    // The waiter may have taken the key by its own next attempt meanwhile
    // and left the queue; the skipper must never be in it.
    let now_queued = fair_queue(&server, &key);
    assert!(
        now_queued.iter().all(|entry| queued.contains(entry)),
        "only the waiter queued: {queued:?} then {now_queued:?}"
    );
    let taken = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .expect("the waiter took the key at its next attempt")
        .unwrap();
    taken.release().await.unwrap();
    drop(guard);
}

/// Fair mode still hands a lease to the next task of the holder's process
/// while no other process waits: one script, no `DEL`.
#[tokio::test]
async fn fair_mode_hands_over_within_a_process_while_nobody_else_waits() {
    let server = RedisServer::new();
    let key = unique_key("fair-hand-over");
    let registry = fair_registry(&server, 2000).await;
    let first = registry.lock(&key, LockOptions::default()).await.unwrap();
    let next = lock_in_task(&registry, &key);
    wait_until("the next task queued locally", || {
        registry.local_queue_len(&key) == 2
    })
    .await;
    reset_stats(&server);
    let fencing = first.fencing_token().await.unwrap();
    first.release().await.unwrap();
    let next = next.await.unwrap();
    assert!(next.fencing_token().await.unwrap() > fencing);
    let calls = command_calls(&server);
    assert_eq!(
        calls_of(&calls, "del"),
        0,
        "released, not handed over: {calls:?}"
    );
    next.release().await.unwrap();
}

/// Fair mode: with another process's waiter queued in the store, the
/// holder's release goes to it, ahead of the holder's own next task, which
/// queued later in its process only.
#[tokio::test]
async fn fair_mode_serves_another_process_waiter_before_the_holder_own_next_task() {
    let server = RedisServer::new();
    let key = unique_key("fair-other-first");
    let here = fair_registry(&server, 2000).await;
    let there = fair_registry(&server, 2000).await;
    let first = here.lock(&key, LockOptions::default()).await.unwrap();
    let (order_tx, mut order) = tokio::sync::mpsc::unbounded_channel();
    let waiter = |registry: LockRegistry, who: &'static str| {
        let (key, order_tx) = (key.clone(), order_tx.clone());
        tokio::spawn(async move {
            let guard = registry.lock(&key, LockOptions::default()).await.unwrap();
            order_tx.send(who).unwrap();
            guard.release().await.unwrap();
        })
    };
    let remote = waiter(there, "other process");
    wait_until("the other process's waiter queued", || {
        fair_queue(&server, &key).len() == 1
    })
    .await;
    let local = waiter(here.clone(), "same process");
    wait_until("the next task queued locally", || {
        here.local_queue_len(&key) == 2
    })
    .await;
    first.release().await.unwrap();
    remote.await.unwrap();
    local.await.unwrap();
    let served: Vec<&str> = [order.recv().await.unwrap(), order.recv().await.unwrap()].into();
    assert_eq!(served, ["other process", "same process"]);
}

/// Fair mode serves shares and permits in arrival order with everyone
/// else: a reader that comes after a queued writer queues behind it, even
/// while readers hold; a release grants the writer, then the reader; a
/// freed permit goes to the first queued waiter, and a skip-mode attempt
/// never jumps the queue.
#[tokio::test]
async fn fair_mode_serves_shares_and_permits_in_arrival_order() {
    use lock_runtime::store::{
        Acquire, AcquireRequest, Claim, Lease, LockToken, LossSignal, Store,
    };
    let server = RedisServer::new();
    let store = fair_backend(&server, 500).await;
    let loss = LossSignal::new();
    let ttl = Duration::from_secs(10);
    let attempt = async |key: &str, token: LockToken, claim: Claim, waits: bool| {
        let request = AcquireRequest::new(key, token, ttl, &loss)
            .claiming(claim)
            .waiting(waits);
        store.acquire(request).await.unwrap()
    };
    let granted = |answer: Acquire| -> Box<dyn Lease> {
        match answer {
            Acquire::Acquired { lease, .. } => lease,
            other => panic!("expected the lease, got {other:?}"),
        }
    };
    let refused = |answer: Acquire| assert!(matches!(answer, Acquire::Held { .. }), "{answer:?}");
    let hex = |token: LockToken| token.to_string();

    let key = unique_key("fair-rw");
    let (first, writer, late) = (
        LockToken::random(),
        LockToken::random(),
        LockToken::random(),
    );
    let mut reader = granted(attempt(&key, first, Claim::Shared, false).await);
    refused(attempt(&key, writer, Claim::Exclusive, true).await);
    refused(attempt(&key, late, Claim::Shared, true).await);
    assert_eq!(fair_queue(&server, &key), [hex(writer), hex(late)]);
    refused(attempt(&key, LockToken::random(), Claim::Shared, false).await);
    assert!(reader.release(Duration::ZERO).await.unwrap());
    let mut write = granted(attempt(&key, writer, Claim::Exclusive, true).await);
    refused(attempt(&key, late, Claim::Shared, true).await);
    assert!(write.release(Duration::ZERO).await.unwrap());
    let mut read = granted(attempt(&key, late, Claim::Shared, true).await);
    assert!(read.release(Duration::ZERO).await.unwrap());
    assert!(fair_queue(&server, &key).is_empty());

    let key = unique_key("fair-permits");
    let two = Claim::permits(std::num::NonZeroU32::new(2).unwrap());
    let mut held: Vec<Box<dyn Lease>> = Vec::new();
    for _ in 0..2 {
        held.push(granted(
            attempt(&key, LockToken::random(), two, false).await,
        ));
    }
    let (third, fourth) = (LockToken::random(), LockToken::random());
    refused(attempt(&key, third, two, true).await);
    refused(attempt(&key, fourth, two, true).await);
    assert!(held[0].release(Duration::ZERO).await.unwrap());
    refused(attempt(&key, LockToken::random(), two, false).await);
    refused(attempt(&key, fourth, two, true).await);
    held[0] = granted(attempt(&key, third, two, true).await);
    assert_eq!(fair_queue(&server, &key), [hex(fourth)]);
    assert!(held[1].release(Duration::ZERO).await.unwrap());
    held[1] = granted(attempt(&key, fourth, two, true).await);
    for lease in &mut held {
        assert!(lease.release(Duration::ZERO).await.unwrap());
    }
}
