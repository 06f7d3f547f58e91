//! The contract every store implements, and the small types it speaks.
//!
//! The registry, the waiting strategy, the renewal, re-entrancy and the guard
//! are written once on top of it. A store implements two traits:
//!
//! - [`Backend`], the store itself: it says what it can do
//!   ([`Capabilities`]), takes leases ([`acquire`](Backend::acquire)),
//!   reports releases ([`watch`](Backend::watch)), and cleans up after an
//!   acquire the caller gave up on ([`abandon`](Backend::abandon)).
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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{Notify, watch};

use crate::error::BackendError;

#[cfg(feature = "etcd")]
pub mod etcd;
pub mod memory;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redis")]
pub mod redlock;
#[cfg(feature = "zookeeper")]
pub mod zookeeper;

/// Where a waiter's node or entry stands in a store's queue, as the
/// waiter's watch knows it (ZooKeeper, etcd). None can join ahead of ours
/// (sequences and revisions only grow), so this stays true until one ahead
/// of ours goes, or ours does.
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    /// Read the queue to know.
    Unknown,
    /// First: every one ahead of ours was deleted, or a listing found ours
    /// first.
    Head,
    /// Behind one that is still there (its deletion is watched).
    Behind,
}

/// A boxed, sendable future: what the contract's methods return, so the
/// traits stay object-safe and the registry can hold an `Arc<dyn Backend>`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The random 128-bit value that identifies one holder of one lease.
///
/// Only the holder knows it, so only the holder can renew or release. Its
/// high 64 bits are drawn once per process and its low 64 bits for each
/// token, so a token read back from a store tells whether a lease is held
/// by this process ([`is_from_this_process`](Self::is_from_this_process))
/// without any bookkeeping on the lock path.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LockToken(u128);

/// This process's half of every token it draws.
static PROCESS_BITS: once_cell::sync::Lazy<u64> = once_cell::sync::Lazy::new(rand::random);

impl LockToken {
    /// Draws a new token: this process's 64 bits and 64 fresh ones from the
    /// thread's cryptographically seeded RNG.
    pub fn random() -> Self {
        let process = u128::from(*PROCESS_BITS) << 64;
        LockToken(process | u128::from(rand::random::<u64>()))
    }

    /// A token of the given value, as read back from a store.
    pub const fn from_u128(value: u128) -> Self {
        LockToken(value)
    }

    /// The token as a number.
    pub fn as_u128(self) -> u128 {
        self.0
    }

    /// Whether [`random`](Self::random) drew this token in this process.
    pub fn is_from_this_process(self) -> bool {
        (self.0 >> 64) as u64 == *PROCESS_BITS
    }
}

impl std::str::FromStr for LockToken {
    type Err = BackendError;

    /// Parses the 32 hex digits of [`Display`](fmt::Display).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.len() != 32 {
            return Err(format!("a lock token has 32 hex digits, not {:?}", text).into());
        }
        u128::from_str_radix(text, 16)
            .map(LockToken)
            .map_err(|_| format!("a lock token has 32 hex digits, not {text:?}").into())
    }
}

impl LockToken {
    /// The 32 lowercase hex digits stores keep, without formatting
    /// machinery or an allocation (they are sent with every call).
    pub(crate) fn hex(self) -> [u8; 32] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 32];
        for (i, digit) in out.iter_mut().enumerate() {
            let nibble = (self.0 >> (124 - 4 * i)) & 0xf;
            *digit = DIGITS[nibble as usize];
        }
        out
    }
}

impl fmt::Display for LockToken {
    /// Formats as 32 lowercase hex digits, the form stores keep.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = self.hex();
        // Hex digits are ASCII.
        f.write_str(std::str::from_utf8(&hex).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for LockToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockToken({self})")
    }
}

/// What a store can do, checked against every lock's options before the
/// first attempt: an option the store cannot honour is an
/// [`InvalidOptions`](crate::LockError::InvalidOptions) error naming the
/// store and the reason, never silently changed.
///
/// Built with [`Capabilities::new`] and the `with_*` methods, so stores
/// outside this crate can describe themselves too.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// The store's name in messages: "memory", "redis", "redlock", ...
    pub store: &'static str,
    /// The shortest ttl the store can honour.
    pub min_ttl: Duration,
    /// The unit the store counts ttls in; a ttl must be a whole number of
    /// them. Lingers (`hold_at_least`) are rounded up to it.
    pub ttl_granularity: Duration,
    /// The longest ttl the store can honour, if it has a limit (ZooKeeper:
    /// the session timeout).
    pub max_ttl: Option<Duration>,
    /// Whether a release can keep the lease for a while (`hold_at_least`).
    pub linger: bool,
    /// Whether a refused acquire says how long the holder's lease has left.
    pub remaining_time: bool,
    /// Whether [`Lease::hand_over`] is implemented.
    pub hand_over: bool,
    /// Whether the store raises a lease's [`LossSignal`] by itself (a
    /// session expired, a lease revoked, a lock forcibly released), rather
    /// than only answering renewals.
    pub pushes_loss: bool,
    /// Whether a refused attempt of a waiter (one that
    /// [waits](AcquireRequest::waits)) keeps a place for its token in a
    /// queue in the store, and if so how often the waiter must ask again to
    /// keep it: the runtime's waiters then never sleep longer between
    /// attempts. A waiter that stops waiting without the lock (a timeout, a
    /// cancellation) gives its place up through [`Backend::abandon`], so no
    /// release is granted to it.
    pub waiter_queue: Option<Duration>,
    /// How long before the store can expire a lease the holder gives up.
    pub margin: SafetyMargin,
    /// What the fencing tokens promise.
    pub fencing: FencingPromise,
}

impl Capabilities {
    /// A store that honours ttls from 1 ms in whole milliseconds, with no
    /// linger, no remaining time, no hand-over, no pushed losses, a 2 ms
    /// safety margin and no fencing promise: change what yours does better.
    pub const fn new(store: &'static str) -> Self {
        Capabilities {
            store,
            min_ttl: Duration::from_millis(1),
            ttl_granularity: Duration::from_millis(1),
            max_ttl: None,
            linger: false,
            remaining_time: false,
            hand_over: false,
            pushes_loss: false,
            waiter_queue: None,
            margin: SafetyMargin::new(Duration::from_millis(2), 0),
            fencing: FencingPromise::NONE,
        }
    }

    /// Sets the shortest ttl and the unit ttls are counted in.
    pub const fn with_ttl(mut self, min: Duration, granularity: Duration) -> Self {
        self.min_ttl = min;
        self.ttl_granularity = granularity;
        self
    }

    /// Sets the longest ttl the store can honour.
    pub const fn with_max_ttl(mut self, max: Duration) -> Self {
        self.max_ttl = Some(max);
        self
    }

    /// Says which optional features the store has.
    pub const fn with_features(
        mut self,
        linger: bool,
        remaining_time: bool,
        hand_over: bool,
        pushes_loss: bool,
    ) -> Self {
        self.linger = linger;
        self.remaining_time = remaining_time;
        self.hand_over = hand_over;
        self.pushes_loss = pushes_loss;
        self
    }

    /// Says that waiters keep a place in a queue in the store by asking
    /// again at least every `poll` (see [`waiter_queue`](Self::waiter_queue)).
    pub const fn with_waiter_queue(mut self, poll: Duration) -> Self {
        self.waiter_queue = Some(poll);
        self
    }

    /// Sets the safety margin.
    pub const fn with_margin(mut self, margin: SafetyMargin) -> Self {
        self.margin = margin;
        self
    }

    /// Sets what the fencing tokens promise.
    pub const fn with_fencing(mut self, fencing: FencingPromise) -> Self {
        self.fencing = fencing;
        self
    }

    /// How long a lease of `ttl` can be counted on after its request was
    /// sent: the ttl less the safety margin.
    pub fn valid_for(&self, ttl: Duration) -> Duration {
        ttl.saturating_sub(self.margin.of(ttl))
    }

    /// Checks a ttl and a linger against what the store can do; the error is
    /// the reason, to be shown with the key.
    pub fn check(&self, ttl: Duration, hold_at_least: Option<Duration>) -> Result<(), String> {
        let store = self.store;
        if ttl < self.min_ttl {
            return Err(format!(
                "ttl {ttl:?} is shorter than the {store} store's minimum {:?}",
                self.min_ttl
            ));
        }
        if let Some(max) = self.max_ttl
            && ttl > max
        {
            return Err(format!(
                "ttl {ttl:?} is longer than the {store} store allows ({max:?}, its session timeout): \
                 a holder could go on believing in a lock the store has already given up"
            ));
        }
        let unit = self.ttl_granularity.as_nanos().max(1);
        if !ttl.as_nanos().is_multiple_of(unit) {
            return Err(format!(
                "ttl {ttl:?} is not a whole number of {:?}, the unit the {store} store counts ttls in",
                self.ttl_granularity
            ));
        }
        let margin = self.margin.of(ttl);
        if margin * 2 > ttl {
            return Err(format!(
                "ttl {ttl:?} is too short for the {store} store's safety margin of {margin:?}; use at least {:?}",
                margin * 2
            ));
        }
        if hold_at_least.is_some() && !self.linger {
            return Err(format!(
                "hold_at_least needs a store that can keep a released lease for a while; the {store} store cannot"
            ));
        }
        Ok(())
    }
}

/// How long before the store can expire a lease the runtime treats it as
/// ended: `fixed + ttl × parts_per_million / 1 000 000`.
///
/// It covers what separates the holder's clock from the store's expiry: the
/// rate at which the two clocks drift apart (the `ttl`-proportional part),
/// the timer granularity and the time it takes to cancel the body (the fixed
/// part). The holder counts its lease from when the request was *sent*, so
/// network latency only helps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SafetyMargin {
    /// The part that does not depend on the ttl.
    pub fixed: Duration,
    /// The part proportional to the ttl, in millionths of it.
    pub parts_per_million: u32,
}

impl SafetyMargin {
    /// A margin of `fixed` plus `parts_per_million` millionths of the ttl.
    pub const fn new(fixed: Duration, parts_per_million: u32) -> Self {
        SafetyMargin {
            fixed,
            parts_per_million,
        }
    }

    /// The margin for a lease of `ttl`.
    pub fn of(&self, ttl: Duration) -> Duration {
        let proportional = ttl.as_nanos() * u128::from(self.parts_per_million) / 1_000_000;
        self.fixed + Duration::from_nanos(u64::try_from(proportional).unwrap_or(u64::MAX))
    }
}

/// What a store's fencing tokens promise. The contract tests read it, and
/// check exactly what it claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FencingPromise {
    /// Tokens strictly increase per key, from one holder to the next.
    pub increasing: bool,
    /// They keep increasing when the store loses data it was allowed to
    /// lose (a restart without persistence, a failover to a replica that
    /// missed the last writes).
    pub survives_data_loss: bool,
    /// The store keeps no per-key fencing state once a key is free, so
    /// memory does not grow with the number of keys ever locked.
    pub bounded_memory: bool,
}

impl FencingPromise {
    /// No tokens (always 0).
    pub const NONE: FencingPromise = FencingPromise {
        increasing: false,
        survives_data_loss: false,
        bounded_memory: true,
    };

    /// A promise with the three properties given.
    pub const fn new(increasing: bool, survives_data_loss: bool, bounded_memory: bool) -> Self {
        FencingPromise {
            increasing,
            survives_data_loss,
            bounded_memory,
        }
    }
}

/// What a store knows of the lease on one key: the answer to
/// [`Backend::inspect`] when the key is held.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseInfo {
    /// The holder's token, when the store keeps one it can read back.
    pub token: Option<LockToken>,
    /// The holder's fencing token (0 from a store without fencing).
    pub fencing: u64,
    /// How long the lease has left, when the store counts it (a session
    /// store does not: the lease lasts as long as the holder's session).
    pub remaining: Option<Duration>,
}

impl LeaseInfo {
    /// A lease held by `token` with `fencing`, ending in `remaining`.
    pub fn new(token: Option<LockToken>, fencing: u64, remaining: Option<Duration>) -> Self {
        LeaseInfo {
            token,
            fencing,
            remaining,
        }
    }
}

/// One acquire attempt, as the runtime asks it of a store.
#[derive(Debug)]
#[non_exhaustive]
pub struct AcquireRequest<'a> {
    /// The full key, namespace included.
    pub key: &'a str,
    /// The would-be holder's token. An attempt is retried with the same
    /// token, and a store answers a repeat as it answered the first (so a
    /// retried request cannot lock its own sender out).
    pub token: LockToken,
    /// The lease length; already checked against [`Capabilities`].
    pub ttl: Duration,
    /// Raised by the store if it learns that the lease is lost; a store
    /// that [pushes losses](Capabilities::pushes_loss) keeps a clone in
    /// its handle.
    pub loss: &'a LossSignal,
    /// Whether the caller waits for a release if the key is held (wait
    /// mode), rather than giving up at once: a store whose release
    /// notifications cost something can send them only when someone waits.
    pub waits: bool,
    /// `key`, shared: a store that keeps the key can take a reference
    /// rather than a copy.
    pub(crate) shared_key: Option<&'a Arc<str>>,
}

impl<'a> AcquireRequest<'a> {
    /// An attempt at `key` by `token` for a lease of `ttl`.
    pub fn new(key: &'a str, token: LockToken, ttl: Duration, loss: &'a LossSignal) -> Self {
        AcquireRequest {
            key,
            token,
            ttl,
            loss,
            waits: false,
            shared_key: None,
        }
    }

    /// An attempt at the key `key` shares.
    pub(crate) fn shared(
        key: &'a Arc<str>,
        token: LockToken,
        ttl: Duration,
        loss: &'a LossSignal,
    ) -> Self {
        AcquireRequest {
            shared_key: Some(key),
            ..AcquireRequest::new(key, token, ttl, loss)
        }
    }

    /// Says whether the caller waits for a release if the key is held.
    pub fn waiting(mut self, waits: bool) -> Self {
        self.waits = waits;
        self
    }
}

/// The answer to one acquire attempt.
#[derive(Debug)]
#[non_exhaustive]
pub enum Acquire {
    /// The lease is ours.
    Acquired {
        /// The fencing token of this lease (see [`FencingPromise`]).
        fencing: u64,
        /// The handle that renews, releases or hands over this lease.
        lease: Box<dyn Lease>,
    },
    /// Someone else holds it.
    Held {
        /// How long their lease has left, when the store knows
        /// ([`Capabilities::remaining_time`]).
        remaining: Option<Duration>,
    },
}

/// What [`Lease::hand_over`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandOver {
    /// The lease is the next holder's now, with this fencing token.
    Moved {
        /// The next holder's fencing token.
        fencing: u64,
    },
    /// The lease was no longer ours: nothing was handed over.
    Lost,
    /// The store released the lease rather than hand it over: a waiter it
    /// queued (in another process) had its turn. The next holder in this
    /// process acquires in the store as usual.
    Released,
}

impl From<Option<u64>> for HandOver {
    /// `Some(fencing)`: moved with that token; `None`: lost.
    fn from(fencing: Option<u64>) -> Self {
        match fencing {
            Some(fencing) => HandOver::Moved { fencing },
            None => HandOver::Lost,
        }
    }
}

/// One held lease: the per-holder state a store keeps, and the operations
/// on it. Returned by [`Backend::acquire`].
///
/// The runtime never calls two of these methods at once on one handle.
/// Every operation is owner-checked: a handle never renews or deletes a
/// lease that another holder has since taken.
pub trait Lease: Send + Sync + fmt::Debug {
    /// Extends the lease to its ttl from now. `Ok(false)` when it is no
    /// longer ours (expired or taken over).
    fn renew(&mut self) -> BoxFuture<'_, Result<bool, BackendError>>;

    /// Releases the lease and wakes waiters; with a non-zero `linger`, keeps
    /// it for that much longer instead (for `hold_at_least`, only asked of
    /// stores with [`Capabilities::linger`]). `Ok(false)` when the lease was
    /// no longer ours.
    fn release(&mut self, linger: Duration) -> BoxFuture<'_, Result<bool, BackendError>>;

    /// Passes the lease to the next holder in this process without
    /// releasing it, in one round trip: the store moves it to a new token
    /// (the old one is refused from then on), extends it to its ttl, and
    /// returns a new fencing token larger than every earlier one
    /// ([`HandOver::Moved`]). The handle then stands for the new holder.
    /// [`HandOver::Lost`] when the lease is no longer ours;
    /// [`HandOver::Released`] when the store released it instead (a store
    /// that queues waiters, whose turn it is). Only asked of stores with
    /// [`Capabilities::hand_over`].
    fn hand_over(&mut self) -> BoxFuture<'_, Result<HandOver, BackendError>> {
        Box::pin(async { Err("this store cannot hand a lease over".into()) })
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
/// `key` is always the full key, namespace included.
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// What this store can do; the same value for the store's whole life.
    fn capabilities(&self) -> &Capabilities;

    /// Takes the lease if it is free (or expired); otherwise says it is held.
    fn acquire<'a>(
        &'a self,
        request: AcquireRequest<'a>,
    ) -> BoxFuture<'a, Result<Acquire, BackendError>>;

    /// Undoes an acquire whose answer the caller did not wait for (a
    /// timeout, a cancellation, an error after the request may have
    /// reached the store): releases `key` if `token` holds it. `Ok(true)`
    /// when it did. A store that [queues waiters](Capabilities::waiter_queue)
    /// also takes `token` out of the queue.
    fn abandon<'a>(
        &'a self,
        key: &'a str,
        token: LockToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>>;

    /// Subscribes to release notifications for `key`.
    fn watch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<ReleaseWatch, BackendError>>;

    /// Deletes the lease on `key` whoever holds it, and wakes waiters: an
    /// operator's way out of a stuck lock. It breaks mutual exclusion if the
    /// holder is still running; that holder learns of the loss when the
    /// store pushes it or at its next renewal. `Ok(true)` when a lease was
    /// deleted.
    fn force_release<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, BackendError>>;

    /// Who holds `key` right now, as the store sees it: `None` when it is
    /// free (never taken, released, or expired). A read only: it changes
    /// nothing and wakes no one. The default says the store cannot tell.
    fn inspect<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<LeaseInfo>, BackendError>> {
        let _ = key;
        Box::pin(async { Err("this store cannot inspect its locks".into()) })
    }
}

/// A subscription to release notifications for one key.
///
/// Created before an acquire attempt, it reports every release that happens
/// after its creation, so a release between a failed attempt and the wait is
/// not missed when the store delivers it. Stores may still miss some (a
/// dropped connection): waiters retry on a timer as well.
pub struct ReleaseWatch {
    rx: Notices,
    // Dropped after `rx`: lets a store free per-key state once unwatched.
    _hold: Option<Box<dyn Send + Sync>>,
}

/// What a store sends on each release.
enum Notices {
    /// Only that there was one.
    Released(watch::Receiver<()>),
    /// The token the release granted the key to, if any.
    Granted(watch::Receiver<Option<LockToken>>),
}

impl ReleaseWatch {
    /// Wraps a watch receiver that is bumped on each release of the key.
    /// `hold` is dropped with the subscription, after the receiver: a store
    /// can use it to free its per-key state once nobody watches the key.
    pub fn new(rx: watch::Receiver<()>, hold: Option<Box<dyn Send + Sync>>) -> Self {
        ReleaseWatch {
            rx: Notices::Released(rx),
            _hold: hold,
        }
    }

    /// As [`new`](Self::new), for a store whose release may grant the key
    /// to a queued waiter: each notice carries the token granted (`None`
    /// when the key was only freed), so other waiters need not try.
    pub fn granting(
        rx: watch::Receiver<Option<LockToken>>,
        hold: Option<Box<dyn Send + Sync>>,
    ) -> Self {
        ReleaseWatch {
            rx: Notices::Granted(rx),
            _hold: hold,
        }
    }

    /// Completes at the next release after the previous call (or after the
    /// subscription was made). Never completes if the store stopped sending.
    pub async fn released(&mut self) {
        let changed = match &mut self.rx {
            Notices::Released(rx) => rx.changed().await,
            Notices::Granted(rx) => rx.changed().await,
        };
        if changed.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Completes at the next release that `token` may act on: one that
    /// freed the key or granted it to `token`, not one that granted it to
    /// another waiter.
    pub async fn released_for(&mut self, token: LockToken) {
        loop {
            self.released().await;
            let granted = match &mut self.rx {
                Notices::Released(_) => None,
                Notices::Granted(rx) => *rx.borrow_and_update(),
            };
            if granted.is_none_or(|granted| granted == token) {
                return;
            }
        }
    }
}

impl fmt::Debug for ReleaseWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReleaseWatch").finish_non_exhaustive()
    }
}

/// The signal that one lease is lost.
///
/// The runtime makes one per acquire and hands it to the store in the
/// [`AcquireRequest`]. Whoever learns first that the lease is gone raises
/// it: the runtime's renewal (a renewal refused or too late), or the store
/// itself (a session expired, a lease revoked). Raising it cancels the body
/// that holds the lease, which then returns
/// [`LockError::Lost`](crate::LockError::Lost). Cheap to clone; clones
/// share the signal.
#[derive(Clone)]
pub struct LossSignal {
    shared: Arc<LossShared>,
}

#[derive(Default)]
struct LossShared {
    raised: AtomicBool,
    notify: Notify,
    /// Told once when the signal is raised; the runtime's holder of the lease.
    listener: Mutex<Option<Weak<dyn LossListener>>>,
}

/// Reacts when a lease is lost (the runtime's guard state).
pub(crate) trait LossListener: Send + Sync {
    fn lease_lost(&self, reason: &'static str);
}

impl LossSignal {
    /// A signal not raised yet.
    pub fn new() -> Self {
        LossSignal {
            shared: Arc::default(),
        }
    }

    /// Says the lease is lost, for `reason` (logged). Idempotent.
    pub fn raise(&self, reason: &'static str) {
        if self.shared.raised.swap(true, Ordering::SeqCst) {
            return;
        }
        // The holder first: once woken, a body's task may end and drop it
        // before the listener would be told.
        let listener = self.listener().take();
        if let Some(listener) = listener.and_then(|weak| weak.upgrade()) {
            listener.lease_lost(reason);
        }
        self.shared.notify.notify_waiters();
    }

    /// Whether the signal was raised.
    pub fn is_raised(&self) -> bool {
        self.shared.raised.load(Ordering::SeqCst)
    }

    /// Completes once the signal is raised.
    pub async fn raised(&self) {
        loop {
            let notified = self.shared.notify.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the check, so a raise in between is not missed.
            notified.as_mut().enable();
            if self.is_raised() {
                return;
            }
            notified.await;
        }
    }

    /// Makes `listener` the one told when the signal is raised (at once if
    /// it already was), in place of any earlier one.
    pub(crate) fn listen(&self, listener: Weak<dyn LossListener>) {
        *self.listener() = Some(listener);
        if self.is_raised() {
            let listener = self.listener().take();
            if let Some(listener) = listener.and_then(|weak| weak.upgrade()) {
                listener.lease_lost("lost before it was taken up");
            }
        }
    }

    fn listener(&self) -> std::sync::MutexGuard<'_, Option<Weak<dyn LossListener>>> {
        // One assignment or `take` per use: consistent after a panic.
        self.shared
            .listener
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}

impl Default for LossSignal {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for LossSignal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LossSignal")
            .field("raised", &self.is_raised())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::sync::watch;

    use super::{LockToken, ReleaseWatch};

    /// A notice that granted the key to another waiter leaves a waiter
    /// asleep; one that granted it to the waiter, or only freed it, wakes it.
    #[tokio::test]
    async fn a_waiter_wakes_for_its_own_grant_or_a_free_key_only() {
        let (tx, rx) = watch::channel(None);
        let mut watch = ReleaseWatch::granting(rx, None);
        let (ours, other) = (LockToken::random(), LockToken::random());
        tx.send_replace(Some(other));
        {
            let waiting = watch.released_for(ours);
            tokio::pin!(waiting);
            // A zero timeout polls the wait once: still asleep.
            let polled = tokio::time::timeout(Duration::ZERO, &mut waiting).await;
            assert!(polled.is_err(), "woken by another waiter's grant");
            tx.send_replace(Some(ours));
            tokio::time::timeout(Duration::from_secs(5), waiting)
                .await
                .expect("woken by its own grant");
        }
        tx.send_replace(None);
        tokio::time::timeout(Duration::from_secs(5), watch.released_for(ours))
            .await
            .expect("woken by a release that freed the key");
    }

    /// The hand-written digits are `{:032x}`'s, and parse back.
    #[test]
    fn tokens_are_32_hex_digits_that_parse_back() {
        for value in [0, 1, 0xabc, u128::MAX, u128::MAX / 3, 1 << 127] {
            let token = LockToken(value);
            let shown = token.to_string();
            assert_eq!(shown, format!("{value:032x}"));
            assert_eq!(shown.parse::<LockToken>().unwrap(), token);
        }
        let drawn = LockToken::random();
        assert_eq!(drawn.to_string().parse::<LockToken>().unwrap(), drawn);
    }
}
