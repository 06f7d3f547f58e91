//! The contract every store implements, and the small types it speaks.
//!
//! The registry, the waiting strategy, the renewal, re-entrancy and the guard
//! are written once on top of it. A store implements two traits:
//!
//! - [`Store`], the store itself: it says what it can do
//!   ([`Capabilities`]), takes leases ([`acquire`](Store::acquire)),
//!   reports releases ([`watch`](Store::watch)), and cleans up after an
//!   acquire the caller gave up on ([`abandon`](Store::abandon)).
//! - [`Lease`], the handle an acquire returns: it owns whatever the store
//!   keeps per holder (a token, a lease id, a node path, a pinned connection,
//!   per-node grants) and renews, releases and hands over that one lease.
//!
//! Stores of two kinds fit it. Lease stores (memory, Redis, a database
//! table) keep a ttl per lock that the runtime renews. Session stores (etcd
//! leases, ZooKeeper sessions) keep liveness in a session the client keeps
//! alive; when it dies they raise the lease's [`LossSignal`], and the runtime
//! cancels the body exactly as when a renewal fails.
//!
//! Nothing assumes that release notifications are never missed: every
//! waiter also retries on a timer.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

mod capabilities;
mod claim;
mod loss;
mod request;
pub(crate) mod ticks;
mod token;
mod watch;

pub(crate) mod common;

#[cfg(feature = "etcd")]
pub mod etcd;
pub mod memory;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redis")]
pub mod redlock;
#[cfg(feature = "testkit")]
pub mod testkit;
#[cfg(feature = "zookeeper")]
pub mod zookeeper;

pub use crate::error::{StoreError, StoreErrorKind};
pub use capabilities::{Capabilities, FencingPromise, SafetyMargin};
pub use claim::{Claim, ClaimMismatch, Meeting};
pub use loss::LossSignal;
pub(crate) use loss::{Deadline, LossHome};
pub use request::{Acquire, AcquireRequest, HandOver, Hints, LeaseInfo};
pub use token::LockToken;
pub use watch::ReleaseWatch;

/// The longest key a registry accepts, in bytes, its namespace not
/// included. Every store keeps keys this long (with the namespace before
/// them) distinct.
pub const MAX_KEY_LEN: usize = 64 * 1024;

/// A boxed, sendable future: what the contract's methods return, so the
/// traits stay object-safe and the registry can hold an `Arc<dyn Store>`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the contract's methods return: the store's answer, or its error,
/// either known at once ([`Reply::ready`]: nothing is allocated, as for a
/// store in this process) or later ([`Reply::new`]: a boxed future, as for
/// a round trip).
///
/// # Examples
///
/// ```
/// use lock_runtime::store::{Reply, StoreError};
///
/// fn at_once(held: bool) -> Reply<'static, bool> {
///     Reply::ready(Ok(held))
/// }
///
/// fn later(held: bool) -> Reply<'static, bool> {
///     Reply::new(async move {
///         tokio::task::yield_now().await;
///         Ok::<_, StoreError>(held)
///     })
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), StoreError> {
/// assert!(at_once(true).await?);
/// assert!(!later(false).await?);
/// # Ok(())
/// # }
/// ```
#[must_use = "a reply does nothing unless it is awaited"]
pub struct Reply<'a, T>(Answer<'a, T>);

enum Answer<'a, T> {
    /// Known at once; taken by the first poll.
    Ready(Option<Result<T, StoreError>>),
    Later(BoxFuture<'a, Result<T, StoreError>>),
}

impl<'a, T> Reply<'a, T> {
    /// An answer known now: awaiting it returns it at once.
    pub fn ready(answer: Result<T, StoreError>) -> Self {
        Reply(Answer::Ready(Some(answer)))
    }

    /// Whether the answer is known already: awaiting it takes no time.
    pub(crate) fn is_ready(&self) -> bool {
        matches!(self.0, Answer::Ready(_))
    }

    /// The answer, if it is known already (it is then taken: the reply is
    /// spent); `None`, and the reply left to be awaited, if not.
    pub(crate) fn take_ready(&mut self) -> Option<Result<T, StoreError>> {
        match &mut self.0 {
            Answer::Ready(answer) => answer.take(),
            Answer::Later(_) => None,
        }
    }

    /// An answer `future` will give.
    pub fn new(future: impl Future<Output = Result<T, StoreError>> + Send + 'a) -> Self {
        Reply(Answer::Later(Box::pin(future)))
    }
}

impl<'a, T> From<BoxFuture<'a, Result<T, StoreError>>> for Reply<'a, T> {
    fn from(future: BoxFuture<'a, Result<T, StoreError>>) -> Self {
        Reply(Answer::Later(future))
    }
}

// Neither state is pinned in place: the answer is moved out whole, the
// future is boxed.
impl<T> Unpin for Reply<'_, T> {}

impl<T> Future for Reply<'_, T> {
    type Output = Result<T, StoreError>;

    fn poll(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        match &mut self.get_mut().0 {
            Answer::Ready(answer) => std::task::Poll::Ready(
                answer
                    .take()
                    .expect("a ready `Reply` polled after it answered"),
            ),
            Answer::Later(future) => future.as_mut().poll(cx),
        }
    }
}

impl<T> fmt::Debug for Reply<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self.0 {
            Answer::Ready(_) => "Reply(ready)",
            Answer::Later(_) => "Reply(later)",
        })
    }
}

/// One held lease: the per-holder state a store keeps, and the operations
/// on it. Returned by [`Store::acquire`].
///
/// The runtime never calls two of these methods at once on one handle: a
/// renewal in flight has ended before `release` or `hand_over` is called.
/// Every operation is owner-checked: a handle never renews or deletes a
/// lease that another holder has since taken.
pub trait Lease: Send + Sync + fmt::Debug {
    /// Extends the lease to its ttl from now. `Ok(false)` when it is no
    /// longer ours (expired or taken over).
    ///
    /// Takes `&self`: the runtime renews from its background timers while
    /// the holder keeps the handle, with no lock around it. A store that
    /// must remember something of a renewal (when it was sent, say) keeps
    /// that in a cell or an atomic of its own.
    fn renew(&self) -> Reply<'_, bool>;

    /// Releases the lease and wakes waiters; with a non-zero `linger`, keeps
    /// it for that much longer instead (for `hold_at_least`, only asked of
    /// stores with [`Capabilities::linger`]), and ends it then, within the
    /// store's [`margin`](Capabilities::margin), however the store counts
    /// its ttls: a linger is never rounded up to a coarser unit. A store
    /// whose leases are coarser (etcd's whole seconds) ends it with a timer
    /// of its own, the coarser lease only ending it if this process does
    /// not live that long. `Ok(false)` when the lease was no longer ours.
    fn release(&mut self, linger: Duration) -> Reply<'_, bool>;

    /// Passes the lease to the next holder in this process without
    /// releasing it, in one round trip: the store moves it to a new token
    /// (the old one is refused from then on), extends it to its ttl, and
    /// returns a new fencing token larger than every earlier one
    /// ([`HandOver::Moved`]). The handle then stands for the new holder.
    /// [`HandOver::Lost`] when the lease is no longer ours;
    /// [`HandOver::Released`] when the store released it instead (a store
    /// that queues waiters, whose turn it is).
    ///
    /// `sent_at` is when the caller sent the hand-over, on this process's
    /// clock, as [`Hints::sent_at`] is for an acquire: the new holder
    /// counts the moved lease from then, and a store that shares the
    /// holder's clock may count it from then too, rather than read the
    /// clock (its lease then ends no later than it would have).
    ///
    /// Asked of exclusive leases and of semaphore permits, never of
    /// shares. A permit moves within the key's holders: the key stays as
    /// full as it was, and nobody waiting for a place is granted one.
    ///
    /// The default, for a store that cannot move a lease, releases it
    /// ([`HandOver::Released`], or [`HandOver::Lost`] when it was no longer
    /// ours): the next holder then acquires as usual, in more round trips.
    fn hand_over(&mut self, sent_at: tokio::time::Instant) -> Reply<'_, HandOver> {
        let _ = sent_at;
        Reply::new(async {
            let released = self.release(Duration::ZERO).await?;
            Ok(if released {
                HandOver::Released
            } else {
                HandOver::Lost
            })
        })
    }

    /// Issues this lease's fencing token now, for a lease granted (or
    /// handed over) without one (`fencing: None`): a token larger than
    /// every token issued for the key before, as [`FencingPromise`] says,
    /// issued only while this lease holds the key, in one step with
    /// checking that it does. `Ok(None)` when it no longer does. The runtime asks once per
    /// grant, the first time the holder reads its token (again only after
    /// an ask that failed: a second token is larger, and as good). Takes
    /// `&self`, as [`renew`](Self::renew) does: a renewal may be in flight
    /// at the same time.
    ///
    /// Issued while the lease holds the key, a late token orders writes as
    /// one issued with the grant would: no other holder can be granted
    /// between the grant and the issue, and a holder that lost the key
    /// gets none.
    ///
    /// The runtime also asks a lease whose token came with its grant, the
    /// first time it passes the lease to the next task of this process
    /// waiting for the key: a new token answered at once ([`Reply::ready`]:
    /// the memory store) lets it pass the whole hold on as it is (the
    /// lease, its renewal, its loss signal) instead of asking
    /// [`hand_over`](Self::hand_over) to move it, saving the hand-over's
    /// request; it passes the same lease on again without asking, each
    /// next task asking for its token at its first read, as above. An
    /// answer still to come is dropped unawaited; it, and any error, make
    /// the runtime hand over as usual.
    ///
    /// The default, for a store that issues every token with its grant,
    /// answers a misuse error, without an allocation. A store that wraps
    /// another store's leases forwards this, as it forwards
    /// [`renew`](Self::renew).
    fn fencing_token(&self) -> Reply<'_, Option<u64>> {
        Reply::ready(Err(StoreError::tokens_with_grant()))
    }

    /// Whether anyone outside this process's queue for the key may be
    /// waiting for it now, as far as the store can tell at once, without
    /// a request. The runtime hands a lease on along the tasks of this
    /// process that wait for its key at most eight times in a row while
    /// somebody else may be waiting, then releases it so that they get
    /// their turn; while nobody is, it keeps handing it on. Asked only
    /// when a hand-over would be the ninth or later in a row.
    ///
    /// The default, for a store that cannot tell at once: `true`. The
    /// memory store answers whether anyone watches the key for its
    /// release. A store that wraps another store's leases forwards this.
    fn others_may_wait(&self) -> bool {
        true
    }

    /// When the store started counting this lease's ttl, if that was before
    /// the acquire request was sent: a store that prepares leases ahead
    /// (etcd) says when it last granted or extended the one it used. The
    /// runtime counts the lease's validity and its renewals from the
    /// earlier of the two. `None` (the default): from the request. Asked
    /// again after a hand-over, counted from the hand-over's request.
    fn started_at(&self) -> Option<tokio::time::Instant> {
        None
    }
}

/// A lock store.
///
/// # The rules every store keeps
///
/// 1. **A retried acquire gets the same answer.** The runtime sends an
///    attempt again with the same [token](AcquireRequest::token) when its
///    answer was lost (a dropped connection, a timeout): a store that
///    granted the first must grant the repeat (the same lease, its ttl
///    counted again from now, the same fencing token), so a retry never
///    locks its own sender out.
/// 2. **One claim rule.** Whether a claim is granted, waits or is a
///    mismatch follows [`Claim::meets`]; a mismatch is answered at once
///    with the [`ClaimMismatch`] and leaves nothing on the key.
/// 3. **Only the owner renews or releases**, by its token: a lease that
///    expired and was taken by another is never touched by its old handle
///    ([`Lease`]).
/// 4. **The store expires a lease no sooner than its ttl after the request
///    was sent**, give or take the [margin](Capabilities::margin) it
///    declares; the runtime gives the lease up first.
/// 5. **An error says its kind** ([`StoreError`]): unavailable (the same
///    call may succeed later), misuse (never will), lost.
///
/// The contract suite, `store::testkit` (feature `testkit`), checks each
/// rule on a store.
///
/// `key` is always the full key, namespace included.
pub trait Store: Send + Sync + fmt::Debug + 'static {
    /// What this store can do; the same value for the store's whole life.
    fn capabilities(&self) -> &Capabilities;

    /// Takes a lease for the request's [claim](AcquireRequest::claim) if the
    /// key allows it (free, expired, or held in a way the claim may join);
    /// otherwise says it is held.
    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> Reply<'a, Acquire>;

    /// Undoes an acquire whose answer the caller did not wait for (a
    /// timeout, a cancellation, an error after the request may have
    /// reached the store): releases `key` if `token` holds it. `Ok(true)`
    /// when it did. A store that [queues waiters](Capabilities::waiter_queue)
    /// also takes `token` out of the queue.
    fn abandon<'a>(&'a self, key: &'a str, token: LockToken) -> Reply<'a, bool>;

    /// Subscribes to release notifications for `key`. A store may announce
    /// only the releases of holders a [waiting](AcquireRequest::waiting)
    /// attempt was refused by (Redis does): a waiter subscribes, then
    /// attempts again before it waits.
    fn watch<'a>(&'a self, key: &'a str) -> Reply<'a, ReleaseWatch>;

    /// Deletes the lease on `key` whoever holds it, and wakes waiters: an
    /// operator's way out of a stuck lock. It breaks mutual exclusion if the
    /// holder is still running; that holder learns of the loss when the
    /// store pushes it or at its next renewal. `Ok(true)` when a lease was
    /// deleted.
    fn force_release<'a>(&'a self, key: &'a str) -> Reply<'a, bool>;

    /// Who holds `key` right now, as the store sees it: `None` when it is
    /// free (never taken, released, or expired). A read only: it changes
    /// nothing and wakes no one.
    fn inspect<'a>(&'a self, key: &'a str) -> Reply<'a, Option<LeaseInfo>>;
}
