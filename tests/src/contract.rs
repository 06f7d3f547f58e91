//! The contract every [`Store`] must keep, as public test functions, and
//! [`backend_contract!`](crate::backend_contract) to expand them into one
//! module of tests per store.
//!
//! Each case reads the store's [`Capabilities`]: a case (or the part of one)
//! that needs something the store does not declare says so on stderr and
//! checks nothing else, so a skipped check is visible in the test output.

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::store::{
    Acquire, AcquireRequest, Capabilities, HandOver, Lease, LockToken, LossSignal, Store,
};

/// A long lease: never expires during a case.
const TTL: Duration = Duration::from_secs(10);

/// Two clients of one store (two "processes"), and whatever keeps the store
/// alive (a server) until the case ends.
pub struct Clients {
    /// The first client.
    pub a: Arc<dyn Store>,
    /// A second client of the same store.
    pub b: Arc<dyn Store>,
    _keep: Box<dyn Any + Send>,
}

impl Clients {
    /// Two clients of one store; `keep` lives as long as they are used.
    pub fn new(a: Arc<dyn Store>, b: Arc<dyn Store>, keep: impl Any + Send) -> Self {
        Clients {
            a,
            b,
            _keep: Box::new(keep),
        }
    }

    fn caps(&self) -> &Capabilities {
        self.a.capabilities()
    }

    /// Says on stderr that `what` is not checked, and why.
    fn skip(&self, case: &str, what: &str) {
        eprintln!(
            "contract `{case}` on the {} store: {what} not checked (not declared in its capabilities)",
            self.caps().store
        );
    }
}

impl std::fmt::Debug for Clients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Clients")
            .field("a", &self.a)
            .field("b", &self.b)
            .finish_non_exhaustive()
    }
}

/// One attempt by `token`; panics on a store error.
async fn attempt(backend: &Arc<dyn Store>, key: &str, token: LockToken, ttl: Duration) -> Acquire {
    attempt_with(backend, key, token, ttl, &LossSignal::new()).await
}

async fn attempt_with(
    backend: &Arc<dyn Store>,
    key: &str,
    token: LockToken,
    ttl: Duration,
    loss: &LossSignal,
) -> Acquire {
    let request = AcquireRequest::new(key, token, ttl, loss);
    backend.acquire(request).await.expect("acquire")
}

/// The new fencing token of a hand-over that moved the lease (nobody else
/// waits in these tests, so a store that queues waiters hands over too).
fn moved(handed: HandOver) -> u64 {
    match handed {
        HandOver::Moved { fencing } => fencing,
        other => panic!("not handed over: {other:?}"),
    }
}

/// The lease and fencing token of a granted attempt.
fn granted(answer: Acquire) -> (Box<dyn Lease>, u64) {
    match answer {
        Acquire::Acquired { fencing, lease } => (lease, fencing),
        other => panic!("expected the lease, got {other:?}"),
    }
}

/// The remaining time of a refused attempt.
fn refused(answer: Acquire) -> Option<Duration> {
    match answer {
        Acquire::Held { remaining } => remaining,
        other => panic!("expected Held, got {other:?}"),
    }
}

/// A short ttl the store honours, for cases that wait for expiry.
fn short_ttl(caps: &Capabilities) -> Duration {
    caps.min_ttl.max(Duration::from_millis(50))
}

/// Only one holder at a time; a repeated attempt by the holder's token gets
/// the same answer; a refusal says how long the lease has left.
pub async fn acquire_is_exclusive(store: &Clients) {
    let key = crate::unique_key("contract");
    let (a, b) = (LockToken::random(), LockToken::random());
    let (mut lease, first) = granted(attempt(&store.a, &key, a, TTL).await);
    let left = refused(attempt(&store.b, &key, b, TTL).await);
    if store.caps().remaining_time {
        let left = left.expect("the store declares remaining-time answers");
        assert!(left <= TTL && left > TTL / 2, "{left:?}");
    } else {
        store.skip("acquire_is_exclusive", "the remaining time");
    }
    // The same token again (a retried request) gets the same answer.
    let (_, again) = granted(attempt(&store.a, &key, a, TTL).await);
    assert_eq!(again, first);
    refused(attempt(&store.b, &key, b, TTL).await);
    assert!(lease.release(Duration::ZERO).await.unwrap());
}

/// Two clients race for one key many times: exactly one wins each round.
pub async fn racing_clients_never_both_win(store: &Clients) {
    let key = crate::unique_key("contract");
    for round in 0..40 {
        let (ta, tb) = (LockToken::random(), LockToken::random());
        let (ra, rb) = tokio::join!(
            attempt(&store.a, &key, ta, TTL),
            attempt(&store.b, &key, tb, TTL)
        );
        let mut winners: Vec<Box<dyn Lease>> = [ra, rb]
            .into_iter()
            .filter_map(|answer| match answer {
                Acquire::Acquired { lease, .. } => Some(lease),
                _ => None,
            })
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {} winners", winners.len());
        assert!(winners[0].release(Duration::ZERO).await.unwrap());
    }
}

/// An expired lease can be taken by another holder, with a larger fencing
/// token (where the store promises that), and its old handle can no longer
/// renew or release it.
pub async fn an_expired_lease_is_free_and_stale(store: &Clients) {
    let key = crate::unique_key("contract");
    let short = short_ttl(store.caps());
    let (mut stale, first) = granted(attempt(&store.a, &key, LockToken::random(), short).await);
    // Expiry is the thing under test: sleeping past it is the point.
    tokio::time::sleep(short * 3).await;
    assert!(!stale.renew().await.unwrap(), "expired lease renewed");
    let (mut lease, second) = granted(attempt(&store.b, &key, LockToken::random(), TTL).await);
    if store.caps().fencing.increasing {
        assert!(
            second > first,
            "fencing must grow across expiry: {first} then {second}"
        );
    }
    assert!(!stale.release(Duration::ZERO).await.unwrap());
    refused(attempt(&store.a, &key, LockToken::random(), TTL).await);
    assert!(lease.release(Duration::ZERO).await.unwrap());
}

/// Another token cannot undo the lease; the holder's renewal extends it;
/// a second release is refused.
pub async fn only_the_holder_renews_or_releases(store: &Clients) {
    let key = crate::unique_key("contract");
    let (owner, other) = (LockToken::random(), LockToken::random());
    let short = short_ttl(store.caps()) * 4;
    let (mut lease, _) = granted(attempt(&store.a, &key, owner, short).await);
    assert!(!store.b.abandon(&key, other).await.unwrap());
    refused(attempt(&store.b, &key, other, TTL).await);
    assert!(lease.renew().await.unwrap());
    let left = refused(attempt(&store.b, &key, other, TTL).await);
    if store.caps().remaining_time {
        let left = left.expect("remaining time");
        assert!(left > short / 2, "renewal extended the lease: {left:?}");
    } else {
        store.skip("only_the_holder_renews_or_releases", "the remaining time");
    }
    assert!(lease.release(Duration::ZERO).await.unwrap());
    assert!(
        !lease.release(Duration::ZERO).await.unwrap(),
        "released twice"
    );
    let (mut next, _) = granted(attempt(&store.b, &key, other, TTL).await);
    assert!(next.release(Duration::ZERO).await.unwrap());
}

/// A release with a linger keeps the lease for that long, then frees it.
pub async fn a_lingering_release_keeps_the_lease_that_long(store: &Clients) {
    if !store.caps().linger {
        return store.skip("a_lingering_release_keeps_the_lease_that_long", "linger");
    }
    let key = crate::unique_key("contract");
    let (mut lease, _) = granted(attempt(&store.a, &key, LockToken::random(), TTL).await);
    let linger = short_ttl(store.caps()) * 4;
    assert!(lease.release(linger).await.unwrap());
    let left = refused(attempt(&store.b, &key, LockToken::random(), TTL).await);
    if let Some(left) = left {
        assert!(left <= linger, "{left:?}");
    }
    tokio::time::sleep(linger * 2).await;
    let (mut next, _) = granted(attempt(&store.b, &key, LockToken::random(), TTL).await);
    assert!(next.release(Duration::ZERO).await.unwrap());
}

/// Fencing tokens strictly increase from one holder to the next, across
/// both clients, where the store promises that.
pub async fn fencing_tokens_increase_across_holders(store: &Clients) {
    if !store.caps().fencing.increasing {
        return store.skip("fencing_tokens_increase_across_holders", "fencing order");
    }
    let key = crate::unique_key("contract");
    let mut last = 0;
    for round in 0..20 {
        let client = if round % 2 == 0 { &store.a } else { &store.b };
        let (mut lease, next) = granted(attempt(client, &key, LockToken::random(), TTL).await);
        assert!(next > last, "{last} then {next}");
        last = next;
        assert!(lease.release(Duration::ZERO).await.unwrap());
    }
}

/// A watch made before a release reports it; one made when nothing is
/// released stays quiet (while the holder renews and others are refused).
pub async fn a_watch_fires_on_release_and_only_then(store: &Clients) {
    let key = crate::unique_key("contract");
    let (mut lease, _) = granted(attempt(&store.a, &key, LockToken::random(), TTL).await);
    let mut watch = store.b.watch(&key).await.unwrap();
    refused(attempt(&store.b, &key, LockToken::random(), TTL).await);
    assert!(lease.renew().await.unwrap());
    // Nothing is released: the watch must stay quiet for this whole window.
    let quiet = tokio::time::timeout(Duration::from_millis(300), watch.released()).await;
    assert!(quiet.is_err(), "the watch fired without a release");
    assert!(lease.release(Duration::ZERO).await.unwrap());
    tokio::time::timeout(Duration::from_secs(5), watch.released())
        .await
        .expect("release notification");
}

/// A hand-over moves the lease to a new token with a larger fencing token:
/// the old token is refused from then on, the handle goes on as the new
/// holder.
pub async fn a_hand_over_moves_the_lease_to_a_new_token(store: &Clients) {
    if !store.caps().hand_over {
        return store.skip("a_hand_over_moves_the_lease_to_a_new_token", "hand-over");
    }
    let key = crate::unique_key("contract");
    let old = LockToken::random();
    let (mut lease, first) = granted(attempt(&store.a, &key, old, TTL).await);
    let second = moved(lease.hand_over().await.unwrap());
    if store.caps().fencing.increasing {
        assert!(second > first, "{first} then {second}");
    }
    assert!(
        !store.a.abandon(&key, old).await.unwrap(),
        "the old token still releases the handed-over lease"
    );
    refused(attempt(&store.b, &key, LockToken::random(), TTL).await);
    refused(attempt(&store.a, &key, old, TTL).await);
    assert!(lease.renew().await.unwrap());
    assert!(lease.release(Duration::ZERO).await.unwrap());
    let (mut next, _) = granted(attempt(&store.b, &key, LockToken::random(), TTL).await);
    assert!(next.release(Duration::ZERO).await.unwrap());
}

/// A forced release frees the key and wakes waiters; a store that pushes
/// losses raises the holder's loss signal; the holder's handle is refused.
pub async fn a_forced_release_frees_the_key_and_tells_the_holder(store: &Clients) {
    let key = crate::unique_key("contract");
    let loss = LossSignal::new();
    let (mut lease, _) =
        granted(attempt_with(&store.a, &key, LockToken::random(), TTL, &loss).await);
    let mut watch = store.b.watch(&key).await.unwrap();
    assert!(store.b.force_release(&key).await.unwrap());
    tokio::time::timeout(Duration::from_secs(5), watch.released())
        .await
        .expect("release notification");
    if store.caps().pushes_loss {
        tokio::time::timeout(Duration::from_secs(5), loss.raised())
            .await
            .expect("the store pushed the loss to the holder");
    } else {
        store.skip(
            "a_forced_release_frees_the_key_and_tells_the_holder",
            "a pushed loss",
        );
    }
    // Not even with the key free: a forced release is never undone.
    assert!(
        !lease.renew().await.unwrap(),
        "the forced-out holder took its lease back"
    );
    let (mut next, _) = granted(attempt(&store.b, &key, LockToken::random(), TTL).await);
    assert!(
        !lease.renew().await.unwrap(),
        "the forced-out holder renewed"
    );
    assert!(!lease.release(Duration::ZERO).await.unwrap());
    assert!(next.release(Duration::ZERO).await.unwrap());
    assert!(
        !store.b.force_release(&key).await.unwrap(),
        "nothing to free"
    );
}

/// An acquire whose answer nobody took up is undone by its token, and only
/// by its token: the key is free at once, not after the ttl.
pub async fn an_abandoned_acquire_leaves_no_lease(store: &Clients) {
    let key = crate::unique_key("contract");
    let token = LockToken::random();
    // The answer is dropped unread, as when the caller gave up.
    drop(attempt(&store.a, &key, token, TTL).await);
    assert!(!store.a.abandon(&key, LockToken::random()).await.unwrap());
    refused(attempt(&store.b, &key, LockToken::random(), TTL).await);
    assert!(store.a.abandon(&key, token).await.unwrap());
    let (mut lease, _) = granted(attempt(&store.b, &key, LockToken::random(), TTL).await);
    assert!(
        !store.a.abandon(&key, token).await.unwrap(),
        "abandoned twice"
    );
    assert!(lease.release(Duration::ZERO).await.unwrap());
}

/// Inspection reports the live holder from either client (its token, its
/// fencing token, what its lease has left), follows a hand-over, and finds
/// the key free after a release or a forced release.
pub async fn inspect_reports_the_holder(store: &Clients) {
    let key = crate::unique_key("contract");
    assert_eq!(store.b.inspect(&key).await.unwrap(), None, "never taken");
    let token = LockToken::random();
    let (mut lease, fencing) = granted(attempt(&store.a, &key, token, TTL).await);
    for client in [&store.a, &store.b] {
        let info = client.inspect(&key).await.unwrap().expect("held");
        assert_eq!(info.token, Some(token), "{info:?}");
        assert_eq!(info.fencing, fencing, "{info:?}");
        match info.remaining {
            Some(left) => assert!(left <= TTL && left >= TTL / 2, "{info:?}"),
            None => assert!(
                !store.caps().remaining_time,
                "the store counts the remaining time but did not say it: {info:?}"
            ),
        }
    }
    if store.caps().hand_over {
        let next = moved(lease.hand_over().await.unwrap());
        let info = store.b.inspect(&key).await.unwrap().expect("held");
        assert_eq!(info.fencing, next, "{info:?}");
        let moved = info.token.expect("a token");
        assert_ne!(moved, token, "the hand-over moved the lease to a new token");
        assert!(moved.is_from_this_process());
    } else {
        store.skip("inspect_reports_the_holder", "inspection after a hand-over");
    }
    assert!(lease.release(Duration::ZERO).await.unwrap());
    assert_eq!(store.b.inspect(&key).await.unwrap(), None, "released");
    let (_stuck, _) = granted(attempt(&store.a, &key, LockToken::random(), TTL).await);
    assert!(store.b.inspect(&key).await.unwrap().is_some());
    assert!(store.b.force_release(&key).await.unwrap());
    assert_eq!(store.a.inspect(&key).await.unwrap(), None, "force-released");
}

/// The capabilities make sense together: a linger or margin no larger than
/// the shortest ttl, a ttl unit that divides it.
pub async fn the_capabilities_are_consistent(store: &Clients) {
    let caps = store.caps();
    assert_eq!(caps, store.b.capabilities(), "two clients, one store");
    assert!(!caps.store.is_empty());
    assert!(caps.ttl_granularity > Duration::ZERO);
    assert!(caps.check(caps.min_ttl, None).is_ok(), "{caps:?}");
    assert!(caps.check(caps.min_ttl / 2, None).is_err());
    assert!(caps.valid_for(TTL) < TTL, "a margin is kept: {caps:?}");
}

/// Expands the contract into a module of tests, one per case:
/// `backend_contract!(memory_contract, make)` where `make` is an async fn
/// returning a [`Clients`](crate::contract::Clients).
#[macro_export]
macro_rules! backend_contract {
    ($module:ident, $make:path) => {
        mod $module {
            use super::*;

            $crate::backend_contract!(@cases $make;
                acquire_is_exclusive,
                racing_clients_never_both_win,
                an_expired_lease_is_free_and_stale,
                only_the_holder_renews_or_releases,
                a_lingering_release_keeps_the_lease_that_long,
                fencing_tokens_increase_across_holders,
                a_watch_fires_on_release_and_only_then,
                a_hand_over_moves_the_lease_to_a_new_token,
                a_forced_release_frees_the_key_and_tells_the_holder,
                an_abandoned_acquire_leaves_no_lease,
                inspect_reports_the_holder,
                the_capabilities_are_consistent,
            );
        }
    };
    (@cases $make:path; $($case:ident,)*) => {
        $(
            #[tokio::test]
            async fn $case() {
                let store = $make().await;
                $crate::contract::$case(&store).await;
            }
        )*
    };
}
