//! Semaphores and read-write locks on one Redis, between two registries
//! (two processes' worth of connections): the key becomes a sorted set of
//! holders; readers overlap and a writer runs alone, a waiting writer
//! holds new readers off, a semaphore is reached and never exceeded, a
//! reader that stops renewing frees its share, and the key keeps one kind.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use lock_runtime::{Access, LockError, LockOptions, LockRegistry};
use lock_tests::{RedisServer, unique_key};
use tokio::sync::Barrier;

async fn two_registries(server: &RedisServer) -> (LockRegistry, LockRegistry) {
    (
        LockRegistry::redis(&server.url()).await.unwrap(),
        LockRegistry::redis(&server.url()).await.unwrap(),
    )
}

fn read() -> LockOptions {
    LockOptions::default().access(Access::Read)
}

/// How many are inside, and the most ever seen at once.
#[derive(Default)]
struct Inside {
    now: AtomicUsize,
    most: AtomicUsize,
}

impl Inside {
    async fn meet(&self, gate: &Barrier) {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        gate.wait().await;
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Six tasks over two registries share a semaphore of 3: three at a time
/// meet inside (so the limit is reached), never a fourth.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_of_three_is_reached_and_never_exceeded() {
    let server = RedisServer::new();
    let (a, b) = two_registries(&server).await;
    let key = unique_key("sem");
    let (inside, gate) = (Inside::default(), Barrier::new(3));
    let calls = (0..6).map(|i| {
        let locks = if i % 2 == 0 { &a } else { &b };
        locks.with_lock(&key, LockOptions::default().permits(3), inside.meet(&gate))
    });
    let results = tokio::time::timeout(Duration::from_secs(10), join_all(calls))
        .await
        .expect("three at a time met inside");
    assert!(results.into_iter().all(|result| result.is_ok()));
    assert_eq!(inside.most.load(Ordering::SeqCst), 3);
}

/// Readers from both registries hold the key together; a writer is kept
/// out, and once it waits a new reader is kept out too; the writer gets
/// the key when the readers leave, woken by their release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_and_a_waiting_writer_holds_new_readers_off() {
    let server = RedisServer::new();
    let (a, b) = two_registries(&server).await;
    let key = unique_key("rw");
    let first = a.lock(&key, read()).await.unwrap();
    let second = b.lock(&key, read()).await.unwrap();
    assert!(first.fencing_token().await.unwrap() < second.fencing_token().await.unwrap());
    let info = a.inspect(&key).await.unwrap().expect("held");
    assert_eq!(
        (info.access, info.permits, info.holders),
        (Access::Read, None, 2)
    );
    assert!(
        b.try_lock(&key, LockOptions::default())
            .await
            .unwrap()
            .is_none()
    );

    let writer = tokio::spawn({
        let (b, key) = (b.clone(), key.clone());
        async move {
            let guard = b.lock(&key, LockOptions::default()).await.unwrap();
            (Instant::now(), guard)
        }
    });
    lock_tests::until_a_reader_is_refused(&a, &key).await;
    first.release().await.unwrap();
    let released = Instant::now();
    second.release().await.unwrap();
    let (granted_at, writer) = tokio::time::timeout(Duration::from_secs(5), writer)
        .await
        .expect("the writer got the key")
        .unwrap();
    let waited = granted_at - released;
    assert!(
        waited < Duration::from_secs(1),
        "woken, not polled: {waited:?}"
    );
    assert!(writer.fencing_token().await.unwrap() > 0);
    assert!(a.try_lock(&key, read()).await.unwrap().is_none());
    writer.release().await.unwrap();
    // The writer's mark outlives its grant by 50 ms at most.
    let started = Instant::now();
    let again = a.lock(&key, read()).await.unwrap();
    let waited = started.elapsed();
    assert!(waited < Duration::from_millis(300), "{waited:?}");
    again.release().await.unwrap();
}

/// A reader that stops renewing (its watchdog off, its ttl passed) frees
/// its share: a writer gets the key without anyone releasing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_that_is_not_renewed_expires() {
    let server = RedisServer::new();
    let (a, b) = two_registries(&server).await;
    let key = unique_key("expire");
    let ttl = Duration::from_millis(300);
    let reader = a.lock(&key, read().ttl(ttl).watchdog(false)).await.unwrap();
    let started = Instant::now();
    let writer = b.lock(&key, LockOptions::default()).await.unwrap();
    let waited = started.elapsed();
    assert!(waited < ttl + Duration::from_secs(1), "{waited:?}");
    assert!(!reader.is_held());
    assert!(matches!(
        reader.release().await,
        Err(LockError::Lost { .. })
    ));
    writer.release().await.unwrap();
}

/// A key is a semaphore of one limit, or a read-write lock: a call that
/// claims it otherwise while it is held gets an error naming both.
#[tokio::test]
async fn a_key_keeps_one_kind_of_lock_while_held() {
    let server = RedisServer::new();
    let (a, b) = two_registries(&server).await;
    let key = unique_key("kind");
    let three = a
        .lock(&key, LockOptions::default().permits(3))
        .await
        .unwrap();
    let info = b.inspect(&key).await.unwrap().expect("held");
    assert_eq!(
        (info.access, info.permits, info.holders),
        (Access::Write, Some(3), 1)
    );
    for (opts, asked) in [
        (
            LockOptions::default().permits(4),
            "a semaphore of 4 permits",
        ),
        (read(), "a read lock"),
    ] {
        let err = b.try_lock(&key, opts).await.unwrap_err();
        let shown = lock_tests::error_chain(&err);
        assert!(
            shown.contains("a semaphore of 3 permits") && shown.contains(asked),
            "{shown}"
        );
    }
    three.release().await.unwrap();
    let reader = b.lock(&key, read()).await.unwrap();
    reader.release().await.unwrap();
}

/// An operator's `force_release` frees every permit of a key at once:
/// each holder learns of the loss at its next renewal, and the key takes
/// new holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_release_frees_every_permit_and_tells_every_holder() {
    let server = RedisServer::new();
    let (a, b) = two_registries(&server).await;
    let key = unique_key("forced");
    let opts = || {
        LockOptions::default()
            .permits(2)
            .ttl(Duration::from_millis(600))
    };
    let (first, second) = (
        a.lock(&key, opts()).await.unwrap(),
        b.lock(&key, opts()).await.unwrap(),
    );
    assert!(a.force_release(&key).await.unwrap());
    tokio::time::timeout(Duration::from_secs(2), async {
        first.lost().await;
        second.lost().await;
    })
    .await
    .expect("both holders told within a renewal");
    let (again, other) = (
        a.try_lock(&key, opts()).await.unwrap(),
        b.try_lock(&key, opts()).await.unwrap(),
    );
    assert!(
        again.is_some() && other.is_some(),
        "both permits free again"
    );
}

/// A claim of another kind (a semaphore against a mutex, both ways, a read
/// lock, another limit) is `InvalidOptions` at once; a timed-out waiter
/// leaves nothing behind; a `hold_at_least` ends on time.
#[tokio::test]
async fn the_claim_rule_and_a_timed_out_waiter_through_the_registry() {
    let server = RedisServer::new();
    let (a, b) = two_registries(&server).await;
    lock_tests::scenarios::a_claim_of_another_kind_is_refused_at_once(&a, &b).await;
    lock_tests::scenarios::a_waiter_that_times_out_leaves_nothing(&a, &b).await;
    lock_tests::scenarios::hold_at_least_ends_on_time(&a, &b).await;
}
