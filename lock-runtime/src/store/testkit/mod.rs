//! The contract every [`Store`] must keep, as public test functions, and
//! [`store_contract!`](crate::store_contract) to expand them into one
//! module of tests per store: run it against a store of your own (feature
//! `testkit`, in your dev-dependencies) as this crate runs it against its
//! six.
//!
//! ```ignore
//! async fn my_store() -> Clients {
//!     let server = MyServer::start();
//!     let url = server.url();
//!     Clients::connect(server, async || MyStore::connect(&url).await).await
//! }
//!
//! lock_runtime::store_contract!(my_store_contract, my_store, skip: [
//!     shares_hold_together_and_an_exclusive_claim_alone,
//!     a_semaphore_admits_up_to_its_limit,
//! ]);
//! ```
//!
//! Some cases check an ability a store may lack (a linger, shares, permits,
//! pushed losses, increasing fencing tokens, a hand-over that moves the
//! lease): [`SKIPPABLE`]. A store's module lists the ones it lacks; each
//! is generated as a test that the store indeed lacks that ability, and
//! `the_skipped_cases_are_the_missing_abilities` checks the list against
//! what the store declares and does, both ways. A skippable case run on a
//! store that lacks its ability fails.

use std::any::Any;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use super::{
    Acquire, AcquireRequest, Capabilities, Claim, HandOver, Lease, LockToken, LossSignal, Meeting,
    Store,
};

mod cases;
#[macro_use]
mod expand;

pub use cases::*;

/// A key no other case uses: `prefix`, then a random token.
fn unique_key(prefix: &str) -> String {
    format!("{prefix}:{}", LockToken::random())
}

/// Runs one case on a runtime of its own, as `#[tokio::test]` does; what
/// [`store_contract!`](crate::store_contract) expands each case to.
#[doc(hidden)]
pub fn run<F: std::future::Future>(case: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime for the case")
        .block_on(case)
}

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

    /// Two clients made by `connect`, of the store `keep` keeps alive.
    pub async fn connect<S: Store, E: std::fmt::Debug>(
        keep: impl Any + Send,
        connect: impl AsyncFn() -> Result<S, E>,
    ) -> Self {
        let a = connect().await.expect("the first client connects");
        let b = connect().await.expect("the second client connects");
        Clients::new(Arc::new(a), Arc::new(b), keep)
    }

    fn caps(&self) -> &Capabilities {
        self.a.capabilities()
    }

    /// Fails the case unless the store has what `case` needs.
    async fn needs(&self, case: &str) {
        assert!(
            applies(case, self).await,
            "the {} store lacks what `{case}` checks: list the case among its skips",
            self.caps().store
        );
    }
}

/// Every case of the contract, as `store_contract!` expands them (both
/// made from the one list in `__contract_cases!`).
pub const CASES: &[&str] = &__contract_cases!(names);

/// The cases that check an ability a store may lack.
pub const SKIPPABLE: [&str; 11] = [
    "a_lingering_release_keeps_the_lease_that_long",
    "fencing_tokens_increase_across_holders",
    "a_hand_over_moves_the_lease_to_a_new_token",
    "a_forced_release_is_pushed_to_the_holder",
    "shares_hold_together_and_an_exclusive_claim_alone",
    "a_semaphore_admits_up_to_its_limit",
    "a_watch_fires_on_release_and_only_then",
    "each_permit_expires_renews_and_fences_alone",
    "a_handed_over_permit_keeps_its_place",
    "a_forced_release_frees_every_share",
    "a_waiting_exclusive_claim_stops_new_shares",
];

/// Whether the store has the ability `case` checks (always, for a case
/// that is not [skippable](SKIPPABLE)). Read from the capabilities, except
/// for a hand-over, which a store without one answers by releasing.
pub async fn applies(case: &str, store: &Clients) -> bool {
    let caps = store.caps();
    match case {
        "a_lingering_release_keeps_the_lease_that_long" => caps.linger,
        "fencing_tokens_increase_across_holders" => caps.fencing.increasing,
        "a_forced_release_is_pushed_to_the_holder" => caps.pushes_loss,
        "shares_hold_together_and_an_exclusive_claim_alone" => caps.shares,
        "a_semaphore_admits_up_to_its_limit"
        | "each_permit_expires_renews_and_fences_alone"
        | "a_handed_over_permit_keeps_its_place" => caps.permits,
        "a_forced_release_frees_every_share" | "a_waiting_exclusive_claim_stops_new_shares" => {
            caps.shares
        }
        "a_watch_fires_on_release_and_only_then" => caps.release_poll.is_none(),
        "a_hand_over_moves_the_lease_to_a_new_token" => {
            let key = unique_key("contract");
            let (mut lease, _) = granted(attempt(&store.a, &key, LockToken::random(), TTL).await);
            match lease.hand_over(tokio::time::Instant::now()).await.unwrap() {
                HandOver::Moved { .. } => {
                    assert!(lease.release(Duration::ZERO).await.unwrap());
                    true
                }
                HandOver::Released => {
                    // Released, as the default does: the key is free.
                    let (mut next, _) =
                        granted(attempt(&store.b, &key, LockToken::random(), TTL).await);
                    assert!(!lease.renew().await.unwrap(), "released, yet renewed");
                    assert!(next.release(Duration::ZERO).await.unwrap());
                    false
                }
                HandOver::Lost => panic!("a held lease was lost in its hand-over"),
            }
        }
        _ => true,
    }
}

/// The cases a store's module lists as skipped are exactly those whose
/// ability it lacks; the capabilities of a claim it lacks are refused
/// before any request, as the runtime checks them. Says how many cases of
/// the `contract` module run on the store and which are skipped, on the
/// test's standard error (written past the test harness's capture, so that
/// every run shows it).
pub async fn the_skipped_cases_are_the_missing_abilities(
    contract: &str,
    store: &Clients,
    skipped: &[&str],
) {
    let summary = format!(
        "{contract} ({} store): {} of {} cases run, skipped (the store lacks their ability): {}\n",
        store.caps().store,
        CASES.len() - skipped.len(),
        CASES.len(),
        if skipped.is_empty() {
            "none".to_owned()
        } else {
            skipped.join(", ")
        }
    );
    let _ = std::io::Write::write_all(&mut std::io::stderr(), summary.as_bytes());
    for case in skipped {
        assert!(SKIPPABLE.contains(case), "`{case}` is not a skippable case");
    }
    for case in SKIPPABLE {
        let lacks = !applies(case, store).await;
        assert_eq!(
            skipped.contains(&case),
            lacks,
            "the {} store {} `{case}`'s ability, yet the case is {}",
            store.caps().store,
            if lacks { "lacks" } else { "has" },
            if skipped.contains(&case) {
                "skipped"
            } else {
                "run"
            },
        );
    }
    let caps = store.caps();
    let three = Claim::permits(NonZeroU32::new(3).unwrap());
    assert_eq!(caps.check(Claim::Shared, TTL, None).is_ok(), caps.shares);
    assert_eq!(caps.check(three, TTL, None).is_ok(), caps.permits);
    assert_eq!(
        caps.check(Claim::Exclusive, TTL, Some(TTL)).is_ok(),
        caps.linger
    );
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
async fn attempt(store: &Arc<dyn Store>, key: &str, token: LockToken, ttl: Duration) -> Acquire {
    attempt_with(store, key, token, ttl, &LossSignal::new()).await
}

/// One attempt by a caller that waits if refused.
async fn waiting_attempt(
    store: &Arc<dyn Store>,
    key: &str,
    token: LockToken,
    ttl: Duration,
) -> Acquire {
    let loss = LossSignal::new();
    let request = AcquireRequest::new(key, token, ttl, &loss).waiting(true);
    store.acquire(request).await.expect("acquire")
}

async fn attempt_with(
    store: &Arc<dyn Store>,
    key: &str,
    token: LockToken,
    ttl: Duration,
    loss: &LossSignal,
) -> Acquire {
    let request = AcquireRequest::new(key, token, ttl, loss);
    store.acquire(request).await.expect("acquire")
}

/// One attempt claiming `claim`.
async fn claim(store: &Arc<dyn Store>, key: &str, claim: Claim) -> Acquire {
    let loss = LossSignal::new();
    let request = AcquireRequest::new(key, LockToken::random(), TTL, &loss).claiming(claim);
    store.acquire(request).await.expect("acquire")
}

/// The new fencing token of a hand-over that moved the lease (nobody else
/// waits in these tests, so a store that queues waiters hands over too).
fn moved(handed: HandOver) -> Option<u64> {
    match handed {
        HandOver::Moved { fencing } => fencing,
        other => panic!("not handed over: {other:?}"),
    }
}

/// The lease and fencing token of a granted attempt (`None`: issued on
/// demand, see [`token_of`]).
fn granted(answer: Acquire) -> (Box<dyn Lease>, Option<u64>) {
    match answer {
        Acquire::Acquired { fencing, lease } => (lease, fencing),
        other => panic!("expected the lease, got {other:?}"),
    }
}

/// The fencing token of a lease that holds its key: the one it was granted
/// with, or one it issues now.
async fn token_of(lease: &dyn Lease, granted: Option<u64>) -> u64 {
    match granted {
        Some(token) => token,
        None => lease
            .fencing_token()
            .await
            .expect("a token issued on demand")
            .expect("a lease that holds its key gets a token"),
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
