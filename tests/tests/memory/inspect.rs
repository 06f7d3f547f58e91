//! Inspecting and freeing a lock through the registry: who holds a key,
//! with which fencing token and for how long, whether that is this
//! process, and an operator's forced release of a stuck holder. On memory
//! and Redis here; every store passes the same through the contract suite
//! and, across real processes, its process tests.

use std::time::Duration;

use lock_runtime::store::{Acquire, AcquireRequest, LockToken, LossSignal};
use lock_runtime::{LockError, LockOptions, LockRegistry};
use lock_tests::{on_memory_and_redis, unique_key};

const TTL: Duration = Duration::from_secs(10);

async fn a_held_key_is_seen_with_its_fencing_token_and_remaining_time(locks: LockRegistry) {
    let key = unique_key("inspect");
    assert_eq!(locks.inspect(&key).await.unwrap(), None, "never taken");
    let guard = locks
        .lock(&key, LockOptions::default().ttl(TTL))
        .await
        .unwrap();
    // Read first: a store that issues it on demand (Redis) shows the last
    // one issued for the key.
    let fencing = guard.fencing_token().await.unwrap();
    let info = locks.inspect(&key).await.unwrap().expect("held");
    assert!(info.held_by_this_process, "{info:?}");
    assert_eq!(info.fencing_token, fencing);
    let left = info.remaining.expect("both stores count the lease");
    assert!(left <= TTL && left > TTL / 2, "{info:?}");
    guard.release().await.unwrap();
    assert_eq!(locks.inspect(&key).await.unwrap(), None, "released");
}

/// A lease taken with a token another process drew (its high half differs)
/// is held, but not by this process.
async fn a_lease_of_another_process_is_not_ours(locks: LockRegistry) {
    let key = unique_key("inspect");
    let theirs = LockToken::from_u128(LockToken::random().as_u128() ^ (1 << 127));
    assert!(!theirs.is_from_this_process());
    let loss = LossSignal::new();
    let answer = locks
        .store()
        .acquire(AcquireRequest::new(&key, theirs, TTL, &loss))
        .await
        .unwrap();
    let Acquire::Acquired { fencing, lease } = answer else {
        panic!("not granted: {answer:?}");
    };
    let fencing = match fencing {
        Some(fencing) => fencing,
        None => lease.fencing_token().await.unwrap().expect("held"),
    };
    let info = locks.inspect(&key).await.unwrap().expect("held");
    assert!(!info.held_by_this_process, "{info:?}");
    assert_eq!(info.fencing_token, fencing);
    assert!(locks.force_release(&key).await.unwrap());
}

/// A holder stuck in its body: the operator frees the key, the next caller
/// gets it at once, and the stuck body is cancelled with `Lost` (memory at
/// once, Redis at the next renewal of its 1 s lease).
async fn a_forced_release_frees_a_stuck_key_and_cancels_its_holder(locks: LockRegistry) {
    let key = unique_key("stuck");
    let (started, mut running) = tokio::sync::oneshot::channel();
    let stuck = tokio::spawn({
        let (locks, key) = (locks.clone(), key.clone());
        async move {
            let guard = locks
                .lock(&key, LockOptions::default().ttl(Duration::from_secs(1)))
                .await
                .unwrap();
            let _ = started.send(guard.fencing_token().await.unwrap());
            tokio::select! {
                () = guard.lost() => "lost",
                () = std::future::pending::<()>() => "finished",
            }
        }
    });
    let stuck_fencing = (&mut running).await.expect("the holder started");
    let info = locks.inspect(&key).await.unwrap().expect("held");
    assert_eq!(info.fencing_token, stuck_fencing);
    assert!(locks.force_release(&key).await.unwrap());
    let outcome = tokio::time::timeout(Duration::from_secs(2), stuck)
        .await
        .expect("the stuck holder learned of the loss")
        .unwrap();
    assert_eq!(outcome, "lost");
    let next = locks
        .try_lock(&key, LockOptions::default())
        .await
        .unwrap()
        .expect("free after the forced release");
    assert!(next.fencing_token().await.unwrap() > stuck_fencing);
    let info = locks.inspect(&key).await.unwrap().expect("the next holder");
    assert_eq!(info.fencing_token, next.fencing_token().await.unwrap());
    next.release().await.unwrap();
    assert!(
        !locks.force_release(&key).await.unwrap(),
        "nothing left to free"
    );
}

async fn a_bad_key_is_an_error_naming_it(locks: LockRegistry) {
    let err = locks.inspect("").await.unwrap_err();
    assert!(matches!(err, LockError::InvalidKey { .. }), "{err}");
    let long = "k".repeat(lock_runtime::MAX_KEY_LEN + 1);
    let err = locks.inspect(&long).await.unwrap_err().to_string();
    assert!(err.contains("at most"), "{err}");
}

on_memory_and_redis!(
    a_held_key_is_seen_with_its_fencing_token_and_remaining_time,
    a_lease_of_another_process_is_not_ours,
    a_forced_release_frees_a_stuck_key_and_cancels_its_holder,
    a_bad_key_is_an_error_naming_it,
);
