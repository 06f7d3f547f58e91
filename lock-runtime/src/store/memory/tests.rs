//! The memory store's shares and permits: the shape every store's
//! semaphores and read-write locks take.

use std::num::NonZeroU32;
use std::time::Duration;

use super::MemoryStore;
use crate::store::{Acquire, AcquireRequest, Claim, Lease, LockToken, LossSignal, Store};

const TTL: Duration = Duration::from_secs(10);

fn permits(limit: u32) -> Claim {
    Claim::permits(NonZeroU32::new(limit).expect("a limit of at least 1"))
}

/// One attempt: the lease and fencing token, or how long until a retry.
async fn attempt(
    store: &MemoryStore,
    key: &str,
    token: LockToken,
    claim: Claim,
    waits: bool,
) -> Result<(Box<dyn Lease>, u64), Option<Duration>> {
    attempt_with(store, key, token, claim, waits, TTL, &LossSignal::new()).await
}

async fn attempt_with(
    store: &MemoryStore,
    key: &str,
    token: LockToken,
    claim: Claim,
    waits: bool,
    ttl: Duration,
    loss: &LossSignal,
) -> Result<(Box<dyn Lease>, u64), Option<Duration>> {
    let request = AcquireRequest::new(key, token, ttl, loss)
        .claiming(claim)
        .waiting(waits);
    match store.acquire(request).await.expect("a fitting claim") {
        Acquire::Acquired { fencing, lease } => Ok((
            lease,
            fencing.expect("the memory store issues tokens with the grant"),
        )),
        Acquire::Held { remaining } => Err(remaining),
    }
}

async fn take(store: &MemoryStore, key: &str, claim: Claim) -> (Box<dyn Lease>, u64) {
    attempt(store, key, LockToken::random(), claim, false)
        .await
        .expect("granted")
}

/// A writer that waits for `key` behind its shares, refused once.
async fn writer_waits(store: &MemoryStore, key: &str) -> LockToken {
    let writer = LockToken::random();
    let answer = attempt(store, key, writer, Claim::Exclusive, true).await;
    assert!(answer.is_err(), "the writer got in among the shares");
    writer
}

async fn refused(store: &MemoryStore, key: &str, claim: Claim) -> Duration {
    match attempt(store, key, LockToken::random(), claim, false).await {
        Err(remaining) => remaining.expect("the memory store counts leases"),
        Ok((_, fencing)) => panic!("granted {claim} with fencing {fencing}"),
    }
}

#[test]
fn one_permit_is_the_exclusive_claim() {
    assert_eq!(permits(1), Claim::Exclusive);
    assert_eq!(permits(1).limit(), NonZeroU32::new(1));
    assert_eq!(permits(3).limit(), NonZeroU32::new(3));
    assert_eq!(Claim::Shared.limit(), None);
}

#[tokio::test]
async fn a_semaphore_admits_up_to_its_limit_with_increasing_tokens() {
    let store = MemoryStore::new();
    let mut held = Vec::new();
    let mut last = 0;
    for _ in 0..3 {
        let (lease, fencing) = take(&store, "sem", permits(3)).await;
        assert!(fencing > last, "{last} then {fencing}");
        last = fencing;
        held.push(lease);
    }
    let left = refused(&store, "sem", permits(3)).await;
    assert!(left <= TTL && left > TTL / 2, "{left:?}");
    assert!(held[1].release(Duration::ZERO).await.unwrap());
    let (_fourth, fencing) = take(&store, "sem", permits(3)).await;
    assert!(fencing > last);
    refused(&store, "sem", permits(3)).await;
    // A retried request by a holder's token gets the same answer.
    let token = LockToken::random();
    assert!(held[0].release(Duration::ZERO).await.unwrap());
    let (_, first) = attempt(&store, "sem", token, permits(3), false)
        .await
        .expect("granted");
    let (_, again) = attempt(&store, "sem", token, permits(3), false)
        .await
        .expect("the same answer");
    assert_eq!(first, again);
}

#[tokio::test]
async fn a_claim_that_does_not_fit_the_key_is_an_error_naming_both() {
    let store = MemoryStore::new();
    let (_held, _) = take(&store, "sem", permits(3)).await;
    for (claim, named) in [
        (permits(4), "4 permits"),
        (Claim::Exclusive, "1 permit"),
        (Claim::Shared, "a read lock"),
    ] {
        let loss = LossSignal::new();
        let request = AcquireRequest::new("sem", LockToken::random(), TTL, &loss).claiming(claim);
        let error = store.acquire(request).await.expect_err("a mismatch");
        let message = error.to_string();
        assert!(
            message.contains("3 permits") && message.contains(named),
            "{message}"
        );
    }
    let (_shared, _) = take(&store, "rw", Claim::Shared).await;
    let loss = LossSignal::new();
    let request = AcquireRequest::new("rw", LockToken::random(), TTL, &loss).claiming(permits(2));
    assert!(store.acquire(request).await.is_err());
}

#[tokio::test]
async fn shares_hold_together_and_an_exclusive_claim_alone() {
    let store = MemoryStore::new();
    let (mut first, _) = take(&store, "rw", Claim::Shared).await;
    let (mut second, _) = take(&store, "rw", Claim::Shared).await;
    refused(&store, "rw", Claim::Exclusive).await;
    assert!(first.release(Duration::ZERO).await.unwrap());
    refused(&store, "rw", Claim::Exclusive).await;
    assert!(second.release(Duration::ZERO).await.unwrap());
    let (mut writer, _) = take(&store, "rw", Claim::Exclusive).await;
    refused(&store, "rw", Claim::Shared).await;
    refused(&store, "rw", Claim::Exclusive).await;
    assert!(writer.release(Duration::ZERO).await.unwrap());
    take(&store, "rw", Claim::Shared).await;
}

/// A stream of shares cannot starve an exclusive claim that waits: from its
/// first refusal no new share joins, and it is granted once the shares
/// held then are released.
#[tokio::test]
async fn a_waiting_exclusive_claim_holds_new_shares_off() {
    let store = MemoryStore::new();
    let (mut reader, _) = take(&store, "rw", Claim::Shared).await;
    let writer = writer_waits(&store, "rw").await;
    refused(&store, "rw", Claim::Shared).await;
    assert!(reader.release(Duration::ZERO).await.unwrap());
    let (mut writing, _) = attempt(&store, "rw", writer, Claim::Exclusive, true)
        .await
        .expect("the waiting writer's turn");
    refused(&store, "rw", Claim::Shared).await;
    assert!(writing.release(Duration::ZERO).await.unwrap());
    let (mut reader, _) = take(&store, "rw", Claim::Shared).await;
    // An exclusive claim that does not wait (skip mode) holds nothing off.
    assert!(
        attempt(&store, "rw", LockToken::random(), Claim::Exclusive, false)
            .await
            .is_err()
    );
    take(&store, "rw", Claim::Shared).await;
    assert!(reader.release(Duration::ZERO).await.unwrap());
}

/// A writer that gives up its wait lets shares in again.
#[tokio::test]
async fn an_abandoned_exclusive_wait_lets_shares_in() {
    let store = MemoryStore::new();
    let (_reader, _) = take(&store, "rw", Claim::Shared).await;
    let writer = writer_waits(&store, "rw").await;
    refused(&store, "rw", Claim::Shared).await;
    assert!(!store.abandon("rw", writer).await.unwrap(), "held nothing");
    take(&store, "rw", Claim::Shared).await;
}

#[tokio::test(start_paused = true)]
async fn a_crashed_holders_permit_comes_back_after_its_ttl() {
    let store = MemoryStore::new();
    let ttl = Duration::from_millis(100);
    let crashed = LossSignal::new();
    let (_kept, _) = take(&store, "sem", permits(2)).await;
    let _crashed = attempt_with(
        &store,
        "sem",
        LockToken::random(),
        permits(2),
        false,
        ttl,
        &crashed,
    )
    .await
    .expect("granted");
    let left = refused(&store, "sem", permits(2)).await;
    assert_eq!(left, ttl, "the soonest permit to come back");
    tokio::time::advance(ttl).await;
    take(&store, "sem", permits(2)).await;
    assert!(crashed.is_raised(), "the expired holder was told");
    refused(&store, "sem", permits(2)).await;
}

#[tokio::test]
async fn a_forced_release_frees_every_permit_and_tells_every_holder() {
    let store = MemoryStore::new();
    let losses = [LossSignal::new(), LossSignal::new()];
    let mut leases = Vec::new();
    for loss in &losses {
        let (lease, _) = attempt_with(
            &store,
            "sem",
            LockToken::random(),
            permits(2),
            false,
            TTL,
            loss,
        )
        .await
        .expect("granted");
        leases.push(lease);
    }
    assert!(store.force_release("sem").await.unwrap());
    assert!(losses.iter().all(LossSignal::is_raised));
    for lease in &mut leases {
        assert!(!lease.renew().await.unwrap(), "a forced-out permit renewed");
    }
    take(&store, "sem", permits(2)).await;
    take(&store, "sem", permits(2)).await;
}

#[tokio::test]
async fn a_released_key_keeps_its_slot_and_the_table_keeps_at_most_twice_what_is_in_use() {
    let store = MemoryStore::new();
    let (_held, _) = take(&store, "k:held", Claim::Exclusive).await;
    // A key locked and released again finds its own slot.
    for _ in 0..3 {
        let (mut lease, _) = take(&store, "k:again", Claim::Exclusive).await;
        assert!(lease.release(Duration::ZERO).await.unwrap());
    }
    assert_eq!(
        store.table().slots.len(),
        2,
        "the released key's slot stays"
    );
    assert_eq!(store.tracked_keys(), 1, "only the held key counts");
    // New keys, each locked once: the table is swept when it doubles, and
    // the swept slots' holder lists serve the keys after them.
    for i in 0..10 * super::SWEEP_FLOOR {
        let (mut lease, _) = take(&store, &format!("k:{i}"), Claim::Exclusive).await;
        assert!(lease.release(Duration::ZERO).await.unwrap());
    }
    {
        let table = store.table();
        assert!(
            table.slots.len() <= 2 * super::SWEEP_FLOOR,
            "{} slots",
            table.slots.len()
        );
        assert!(table.slots.len() + table.spare.len() <= 2 * super::SWEEP_FLOOR + 1);
    }
    assert_eq!(store.tracked_keys(), 1, "the held key's slot was kept");
    assert!(refused(&store, "k:held", Claim::Exclusive).await > Duration::ZERO);
}
