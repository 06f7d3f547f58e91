//! Scenarios every store runs through two registries (two clients of one
//! store, as two processes have): written once here, called from each
//! store's test binary.

use std::time::Duration;

use lock_runtime::{Access, LockError, LockOptions, LockRegistry};
use tokio::time::Instant;

use crate::unique_key;

/// How long a caller in these scenarios would wait: far longer than a
/// refusal takes, so an answer before it is not a timeout.
const PATIENCE: Duration = Duration::from_secs(5);

/// The leases' ttl: one every store allows (a ZooKeeper session may be
/// shorter than the default 30 s).
fn options() -> LockOptions {
    LockOptions::default().ttl(Duration::from_secs(10))
}

/// `hold_at_least` of 1 s, the body ending at once: the other client gets
/// the key no sooner than 1 s after it was taken, and within 750 ms after
/// that (no store rounds the hold up to a coarser unit: etcd's whole-second
/// leases made it 2 s and more).
pub async fn hold_at_least_ends_on_time(a: &LockRegistry, b: &LockRegistry) {
    let key = unique_key("hold");
    let hold = Duration::from_secs(1);
    let taken = Instant::now();
    let guard = a
        .try_lock(&key, options().hold_at_least(hold))
        .await
        .expect("try_lock")
        .expect("a free key");
    guard.release().await.expect("release");
    // Asked every 20 ms until granted: when it frees is the point.
    let freed = loop {
        if let Some(next) = b.try_lock(&key, options()).await.expect("try_lock") {
            let freed = taken.elapsed();
            next.release().await.expect("release");
            break freed;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(freed >= hold, "free {freed:?} into a hold of {hold:?}");
    let bound = hold + Duration::from_millis(750);
    assert!(freed < bound, "a hold of {hold:?} lasted {freed:?}");
}

/// A claim that does not fit how the key is held (the claim rule:
/// `Claim::meets`), asked by another client: `InvalidOptions` at once,
/// naming the key and both claims, whether it would wait or skip; the
/// holder is untouched, and once it releases the key takes the other claim.
/// The pairs: a semaphore of 3 against a mutex (the attribute's default)
/// both ways, against a read lock, and against a semaphore of 5.
pub async fn a_claim_of_another_kind_is_refused_at_once(a: &LockRegistry, b: &LockRegistry) {
    let mutex = options;
    let three = || options().permits(3);
    let pairs: [(LockOptions, LockOptions, &str, &str); 4] = [
        (three(), mutex(), "3 permits", "mutex"),
        (mutex(), three(), "mutex", "3 permits"),
        (
            three(),
            options().access(Access::Read),
            "3 permits",
            "read lock",
        ),
        (three(), options().permits(5), "3 permits", "5 permits"),
    ];
    for (held, asked, held_named, asked_named) in pairs {
        let key = unique_key("mismatch");
        let guard = a.lock(&key, held.clone()).await.expect("the first claim");
        let started = Instant::now();
        let waited = b.lock(&key, asked.clone().wait_timeout(PATIENCE)).await;
        let skipped = b.try_lock(&key, asked.clone()).await;
        let took = started.elapsed();
        for err in [waited.map(drop), skipped.map(drop)] {
            let err = err.expect_err("a claim of another kind");
            assert!(
                matches!(err, LockError::InvalidOptions { .. }),
                "{asked_named} against {held_named}: {err:?}"
            );
            let said = err.to_string();
            for named in [key.as_str(), held_named, asked_named] {
                assert!(
                    said.contains(named),
                    "{asked_named} against {held_named}: {said}"
                );
            }
        }
        // The bound under test: an answer, not a wait for `wait_timeout`.
        assert!(
            took < PATIENCE / 2,
            "{asked_named} against {held_named}: refused after {took:?}, not at once (wait_timeout {PATIENCE:?})"
        );
        assert!(
            guard.is_held(),
            "the holder lost its lease to a refused claim"
        );
        guard.release().await.expect("release");
        let other = b
            .lock(&key, asked.wait_timeout(PATIENCE))
            .await
            .expect("the key, free, takes the other claim");
        other.release().await.expect("release");
    }
}

/// A waiter that times out leaves nothing in the store when the call
/// returns: once the holder releases, the key is free (`inspect` finds no
/// holder) and another client takes it at once.
pub async fn a_waiter_that_times_out_leaves_nothing(a: &LockRegistry, b: &LockRegistry) {
    let key = unique_key("timeout");
    let holder = a.lock(&key, options()).await.expect("lock");
    let waited = b
        .lock(&key, options().wait_timeout(Duration::from_millis(300)))
        .await;
    assert!(
        matches!(waited, Err(LockError::Timeout { .. })),
        "{waited:?}"
    );
    holder.release().await.expect("release");
    let info = a.inspect(&key).await.expect("inspect");
    assert!(
        info.is_none(),
        "the timed-out waiter is still on the key: {info:?}"
    );
    let next = a
        .try_lock(&key, options())
        .await
        .expect("try_lock")
        .expect("the key is free once its holder released");
    next.release().await.expect("release");
}

/// A store whose one server is killed: a lock fails at once with `Store`
/// naming the key (within 3 s, not after its 5 s `wait_timeout`); once the
/// server is back, the same registry locks again within 10 s.
pub async fn a_down_server_gives_a_clear_error_quickly_and_recovers(
    server: &mut impl crate::StoreServer,
    registry: &LockRegistry,
) {
    let key = unique_key("down");
    crate::lock_and_release(registry, &key).await;
    server.kill();
    let started = Instant::now();
    let opts = LockOptions::default().wait_timeout(PATIENCE);
    let err = registry.lock(&key, opts.clone()).await.unwrap_err();
    assert!(matches!(err, LockError::Store { .. }), "{err:?}");
    assert!(err.to_string().contains(&key), "{err}");
    // The bound under test: a store error, not a wait for `wait_timeout`.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the down server's error took {:?}, over the 3 s bound",
        started.elapsed()
    );
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    let guard = loop {
        match registry.lock(&key, opts.clone()).await {
            Ok(guard) => break guard,
            Err(err) if Instant::now() < deadline => {
                assert!(matches!(err, LockError::Store { .. }), "{err:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(err) => panic!(
                "no recovery after the restart: {}",
                crate::error_chain(&err)
            ),
        }
    };
    guard.release().await.unwrap();
}
