//! The guard of a held lock: the store's lease handle, this process's turn
//! at the key and the lease's renewal. Releases on `release().await`, or on
//! drop.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::sync::OnceCell;
use tokio::time::Instant;
use tracing::{Instrument, Span};

use crate::acquire::Parts;
use crate::error::LockError;
use crate::local_queue::{Grant, Leased, LocalTurn, PassedOn, next_in_chain};
use crate::options::LockOptions;
use crate::options::{Access, permits_of};
use crate::renewal::{Entry, Fill, Renewable, Renewal, Schedule, Spare};
use crate::store::{Claim, Deadline, HandOver, Lease, LossSignal, Reply, StoreError};
use crate::telemetry::{self, Labels};

/// A held lock. Renewed in the background (unless the watchdog is off)
/// until it is released.
///
/// The main path is [`release`](Self::release), which reports whether the
/// lease was still held.
///
/// # Cancellation
///
/// Dropping the guard releases the lock too: `Drop` spawns the release on the
/// current Tokio runtime, so the next holder need not wait for the TTL. If no
/// runtime is running (the process is shutting down), nothing can be sent and
/// the lease ends when its TTL passes, as for a crashed process.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard {
    held: Option<Holding>,
}

struct Holding {
    registry: usize,
    /// How the lease holds its key.
    claim: Claim,
    ttl: Duration,
    /// `hold_at_least` counted from when the grant reached this process:
    /// never earlier than the key was taken.
    hold_until: Option<Instant>,
    /// Hand-overs in a row that led to this lease, as [`next_in_chain`]
    /// counts them.
    chain: u32,
    /// Whether the whole hold may be passed on as it is to the next task
    /// queued in this process ([`Holding::pass_on_held`]): the lease is
    /// renewed with no end but its release (the watchdog on, no
    /// `max_hold`), and the lock was contended (a lock taken at once does
    /// not look for waiters before its release, which costs a lock).
    passes: bool,
    /// Whether the lease answered a fencing token at once when this hold
    /// was first passed on ([`Holding::pass_on_held`]): later passes leave
    /// each next holder's token to its first read.
    tokens_at_once: bool,
    /// The lease's renewal, and the state the guard shares with it and
    /// the loss signal: one allocation.
    renewal: Renewal<State>,
}

/// How many released leases' renewals a thread keeps for its next locks.
const SPARES_KEPT: usize = 8;

thread_local! {
    /// The renewals of the last leases released on this thread (up to
    /// [`SPARES_KEPT`]), with their holders' state: the next locks', each
    /// without an allocation, however many tasks of the thread release
    /// between two locks.
    static SPARES: RefCell<Vec<Spare<State>>> = const { RefCell::new(Vec::new()) };

    /// The box the last hold taken over on this thread came in, empty:
    /// the next hold this thread passes on goes in it, without an
    /// allocation.
    static CARRIER: Cell<Option<Box<Carried>>> = const { Cell::new(None) };
}

/// What the guard shares with the renewal and the loss signal.
struct State {
    /// The full key, and where the user's key starts in it.
    full_key: Arc<str>,
    prefix_len: usize,
    /// The store's handle: renewed through `&self` by the renewal, taken
    /// out by the release or the hand-over once nothing else shares the
    /// state ([`Renewal::take_held`]).
    lease: Option<Box<dyn Lease>>,
    /// The fencing token.
    fencing: Fencing,
    loss: LossSignal,
    /// The current holder: its turn and what its hold is recorded under.
    /// Written by a task taking a passed-on hold over (see
    /// [`Holding::pass_on_held`]), read when a loss is told.
    holder: Mutex<Holder>,
    /// The lock's span, until the release (a passed-on hold has none).
    span: Span,
    /// Whether the current hold's end (a release, a hand-over, a loss)
    /// was recorded: once, whichever comes first.
    ended: AtomicBool,
}

/// The task holding a lease, of those that may hold it in turn.
struct Holder {
    /// This process's turn at the key. Given back as soon as the lease is
    /// known lost, so the process's other tasks are not held up by a guard
    /// that no longer holds anything; otherwise at release.
    turn: Option<LocalTurn>,
    labels: Labels,
    /// When the hold began, for the hold time.
    started_at: Instant,
}

impl State {
    fn key(&self) -> &str {
        &self.full_key[self.prefix_len..]
    }

    fn holder(&self) -> MutexGuard<'_, Holder> {
        // Every update is one assignment: consistent after a panic.
        self.holder
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// The current holder, once the caller has the state alone.
    fn holder_alone(&mut self) -> &mut Holder {
        self.holder
            .get_mut()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Records the end of the hold, lost for `lost` if it was; only the
    /// first end counts (a release can race a loss). Whether this was it.
    fn ended(&self, lost: Option<&str>) -> bool {
        if self.ended.swap(true, Ordering::SeqCst) {
            return false;
        }
        let (labels, started_at) = {
            let holder = self.holder();
            (holder.labels, holder.started_at)
        };
        self.record_end(labels, started_at, lost);
        true
    }

    /// As [`ended`](Self::ended), from the release, which has the state to
    /// itself: nothing can race it.
    #[inline]
    fn ended_alone(&mut self, lost: Option<&str>) {
        if std::mem::replace(self.ended.get_mut(), true) {
            return;
        }
        let &mut Holder {
            labels, started_at, ..
        } = self.holder_alone();
        self.record_end(labels, started_at, lost);
    }

    fn record_end(&self, labels: Labels, started_at: Instant, lost: Option<&str>) {
        if let Some(reason) = lost {
            telemetry::lost(&self.span, labels, reason);
        }
        telemetry::hold_ended(labels, started_at);
    }

    /// Takes the turn out, if it is still here.
    fn take_turn(&self) -> Option<LocalTurn> {
        self.holder().turn.take()
    }

    /// The fencing token: the grant's, or issued by the lease at the first
    /// read (the others wait for that one; of two first reads of a hold
    /// taken over, each may issue one, and both get the first stored).
    async fn fencing_token(&self) -> Result<u64, LockError> {
        let issue = || async {
            let lease = match &self.lease {
                Some(lease) if !self.loss.is_raised() => lease,
                _ => return Err(LockError::lost(self.key())),
            };
            match lease.fencing_token().await {
                Ok(Some(token)) => Ok(token),
                Ok(None) => {
                    self.loss.raise(telemetry::reason::REFUSED);
                    Err(LockError::lost(self.key()))
                }
                Err(source) => Err(LockError::store(
                    self.key(),
                    "issue a fencing token for",
                    source,
                )),
            }
        };
        match &self.fencing {
            Fencing::Known(token) => match token.load(Ordering::Relaxed) {
                UNISSUED => {
                    let issued = issue().await?;
                    Ok(token
                        .compare_exchange(UNISSUED, issued, Ordering::Relaxed, Ordering::Relaxed)
                        .map_or_else(|stored| stored, |_| issued))
                }
                token => Ok(token),
            },
            Fencing::OnDemand(cell) => cell.get_or_try_init(issue).await.copied(),
        }
    }
}

/// In [`Fencing::Known`], a token not issued yet: no store's counter
/// reaches it.
const UNISSUED: u64 = u64::MAX;

/// A lease's fencing token: known from the grant, or issued by the lease
/// at the first read of a store that issues it on demand
/// ([`Lease::fencing_token`]), the other readers waiting for that one.
enum Fencing {
    /// Issued with the grant; a task taking a passed-on hold over writes
    /// its own token here before its guard exists, or [`UNISSUED`] for
    /// its first read to ask the lease.
    Known(AtomicU64),
    OnDemand(OnceCell<u64>),
}

impl Fencing {
    /// The grant's token, or a cell for the first read to fill.
    fn new(granted: Option<u64>) -> Fencing {
        match granted {
            Some(token) => Fencing::Known(AtomicU64::new(token)),
            None => Fencing::OnDemand(OnceCell::new()),
        }
    }

    /// The token, if known yet.
    fn get(&self) -> Option<u64> {
        match self {
            Fencing::Known(token) => Some(token.load(Ordering::Relaxed)).filter(|&t| t != UNISSUED),
            Fencing::OnDemand(cell) => cell.get().copied(),
        }
    }
}

impl Renewable for State {
    fn key(&self) -> &str {
        State::key(self)
    }

    fn renew(&self) -> Reply<'_, bool> {
        match &self.lease {
            Some(lease) => lease.renew(),
            // Taken out by a release; the renewal is stopped and ignores this.
            None => Reply::ready(Ok(true)),
        }
    }

    fn lose(&self, reason: &'static str) {
        self.loss.raise(reason);
    }

    fn ends_at(&self, at: i64, why: Deadline) {
        self.loss.ends_at(at, why);
    }

    fn span(&self) -> &Span {
        &self.span
    }

    fn renewal_failed(&self) {
        telemetry::renewal_failed(self.holder().labels);
    }

    fn has_signal(&self, signal: usize) -> bool {
        self.loss.addr() == signal
    }

    /// Logged and recorded once (the hold's end); the turn goes back at
    /// once, so the process's other tasks are not held up by a guard that
    /// no longer holds anything.
    fn lease_lost(&self, reason: &'static str) {
        if self.ended(Some(reason)) {
            tracing::warn!(parent: &self.span, key = self.key(), reason, "lease lost");
        }
        drop(self.take_turn());
    }
}

/// A new holder's state, made from what the acquire has: written over a
/// spare one's in place where it can ([`Fill`]).
struct Fresh<'a> {
    parts: &'a Parts<'a>,
    loss: LossSignal,
    lease: Box<dyn Lease>,
    fencing: Option<u64>,
    started_at: Instant,
    turn: LocalTurn,
}

impl Fill<State> for Fresh<'_> {
    fn into_new(self) -> State {
        State {
            full_key: self.turn.key().clone(),
            prefix_len: self.parts.prefix_len,
            lease: Some(self.lease),
            fencing: Fencing::new(self.fencing),
            loss: self.loss,
            holder: Mutex::new(Holder {
                turn: Some(self.turn),
                labels: self.parts.labels,
                started_at: self.started_at,
            }),
            span: self.parts.span.clone(),
            ended: AtomicBool::new(false),
        }
    }

    fn fill(self, old: &mut State) {
        // Every field, so that a new one is not forgotten here.
        let State {
            full_key,
            prefix_len,
            lease,
            fencing,
            loss,
            holder,
            span,
            ended,
        } = old;
        // The same key as the last lock (the common case): its copy stays.
        if !Arc::ptr_eq(full_key, self.turn.key()) {
            *full_key = self.turn.key().clone();
        }
        *prefix_len = self.parts.prefix_len;
        *lease = Some(self.lease);
        *fencing = Fencing::new(self.fencing);
        *loss = self.loss;
        *holder
            .get_mut()
            .unwrap_or_else(|poison| poison.into_inner()) = Holder {
            turn: Some(self.turn),
            labels: self.parts.labels,
            started_at: self.started_at,
        };
        // No span while no subscriber listens: nothing to replace.
        if !(span.is_none() && self.parts.span.is_none()) {
            *span = self.parts.span.clone();
        }
        *ended.get_mut() = false;
    }
}

/// A held lock as its task's record of it reads it (re-entrancy,
/// [`fencing_token`](crate::fencing_token), [`lost`](crate::lost)): the
/// holder's state, shared. The frame of the body that took the lock holds
/// one, and so does a `fencing_token()` while it asks the store for a
/// token; both end with that body, before the guard's release, which
/// waits until nothing else shares the state.
#[derive(Clone)]
pub(crate) struct HeldView(Arc<Entry<State>>);

impl HeldView {
    /// The key with the registry's namespace.
    pub(crate) fn full_key(&self) -> &str {
        &self.0.held().full_key
    }

    /// The key as the caller gave it.
    pub(crate) fn key(&self) -> &str {
        self.0.held().key()
    }

    /// The full key, shared, and where the caller's key starts in it.
    pub(crate) fn shared_full_key(&self) -> (Arc<str>, usize) {
        let state = self.0.held();
        (state.full_key.clone(), state.prefix_len)
    }

    /// The lease's loss signal.
    pub(crate) fn loss(&self) -> &LossSignal {
        &self.0.held().loss
    }

    /// The lease's fencing token, as [`LockGuard::fencing_token`] reads it.
    pub(crate) async fn fencing_token(&self) -> Result<u64, LockError> {
        self.0.held().fencing_token().await
    }
}

impl fmt::Debug for HeldView {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("HeldView").field(&self.key()).finish()
    }
}

impl LockGuard {
    pub(crate) fn new(
        parts: &Parts<'_>,
        grant: Grant,
        opts: &LockOptions,
        turn: LocalTurn,
        waited: bool,
    ) -> LockGuard {
        let Grant {
            lease,
            fencing,
            started_at,
            chain,
            ..
        } = grant;
        let (lease, loss) = match lease {
            Leased::Store(lease, loss) => (lease, loss),
            Leased::Carried(carried) => {
                let taken = Taken {
                    fencing,
                    started_at,
                    chain,
                };
                return LockGuard::taken_over(parts, carried, taken, opts, turn);
            }
        };
        let caps = parts.capabilities;
        let state = Fresh {
            parts,
            loss,
            lease,
            fencing,
            started_at,
            turn,
        };
        let renewal = Renewal::start(
            parts.registry,
            Schedule {
                ttl: opts.ttl,
                valid_for: caps.valid_for(opts.ttl),
                renew: opts.watchdog,
                max_hold: opts.max_hold,
                started_at,
            },
            state,
            SPARES
                .try_with(|spares| spares.borrow_mut().pop())
                .ok()
                .flatten(),
        );
        if renewal.hear_losses(&renewal.held().loss) {
            renewal.held().lease_lost("lost before it was taken up");
        }
        LockGuard {
            held: Some(Holding {
                registry: parts.registry_id(),
                claim: opts.claim(),
                ttl: opts.ttl,
                hold_until: opts.hold_at_least.map(|hold| Instant::now() + hold),
                chain,
                // Tasks that queue behind this one are likely where it
                // had to wait itself.
                passes: waited && opts.renews_without_end(),
                tokens_at_once: false,
                renewal,
            }),
        }
    }

    /// The guard of a task taking over a hold passed on to it as it is
    /// ([`Holding::pass_on_held`]): the lease and its renewal (through
    /// which a loss is told) carry on; the turn, the fencing token and
    /// the hold's records are this task's.
    fn taken_over(
        parts: &Parts<'_>,
        carried: Box<dyn PassedOn>,
        taken: Taken,
        opts: &LockOptions,
        turn: LocalTurn,
    ) -> LockGuard {
        let mut carried = carried
            .into_any()
            .downcast::<Carried>()
            .expect("a hold is passed on only by a guard");
        let mut held = carried.take_holding();
        let _ = CARRIER.try_with(|spare| spare.set(Some(carried)));
        let state = held.state();
        if let Fencing::Known(token) = &state.fencing {
            token.store(taken.fencing.unwrap_or(UNISSUED), Ordering::Relaxed);
        }
        state.ended.store(false, Ordering::SeqCst);
        *state.holder() = Holder {
            turn: Some(turn),
            labels: parts.labels,
            started_at: taken.started_at,
        };
        // A loss raised since the hold was passed on found no turn to
        // give back: this one goes now.
        if state.loss.is_raised() {
            state.lease_lost("lost before it was taken up");
        }
        held.claim = opts.claim();
        held.hold_until = opts.hold_at_least.map(|hold| Instant::now() + hold);
        held.chain = taken.chain;
        held.passes = opts.renews_without_end();
        LockGuard { held: Some(held) }
    }

    fn held(&self) -> &Holding {
        // `held` is taken only by `release` and `drop`, which consume the guard.
        self.held.as_ref().expect("LockGuard used after release")
    }

    /// The key this lock was taken on, without the namespace.
    pub fn key(&self) -> &str {
        self.held().state().key()
    }

    /// The fencing token of this lease: larger than that of every earlier
    /// holder of the key (as far as the store promises; see
    /// [`FencingPromise`](crate::store::FencingPromise)). Pass it to
    /// storage that should refuse writes from a holder whose lease has since
    /// been lost.
    ///
    /// Most stores issue the token with the grant, and this answers at
    /// once. The Redis store's default lock issues it at the first read
    /// instead, in one round trip that checks the lease still holds the
    /// key (a lock whose body never reads its token then costs no
    /// token); later reads answer at once. So does the memory store for a
    /// lock passed on from another task of this process, answering at
    /// once.
    ///
    /// # Errors
    ///
    /// [`LockError::Lost`] if the lease is known lost, or the store found
    /// it no longer holds the key (which raises the loss);
    /// [`LockError::Store`] if the store could not be reached.
    pub async fn fencing_token(&self) -> Result<u64, LockError> {
        self.held().state().fencing_token().await
    }

    /// The lease as its task's record of it reads it.
    pub(crate) fn view(&self) -> HeldView {
        HeldView(self.held().renewal.entry().clone())
    }

    /// How this lease holds its key: [`Access::Read`] for a read lock,
    /// [`Access::Write`] otherwise (a mutex, a writer, a semaphore permit).
    pub fn access(&self) -> Access {
        Access::of(self.held().claim)
    }

    /// For a semaphore, how many permits the key has (this lease holds one
    /// of them); `None` for a mutex or a read-write lock.
    pub fn permits(&self) -> Option<u32> {
        permits_of(self.held().claim)
    }

    /// How this lease holds its key.
    pub(crate) fn claim(&self) -> Claim {
        self.held().claim
    }

    /// `false` once the lease is known to be lost: a renewal was refused or
    /// did not get through in time, `max_hold` passed, (watchdog off) the
    /// ttl passed, or the store said so.
    pub fn is_held(&self) -> bool {
        !self.held().state().loss.is_raised()
    }

    /// Completes when the lease is known to be lost (see
    /// [`is_held`](Self::is_held)): select on it to stop work that must not
    /// outlive the lease, as the attribute does with the body.
    ///
    /// # Examples
    ///
    /// ```
    /// use lock_runtime::{LockOptions, LockRegistry};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// let registry = LockRegistry::memory();
    /// let guard = registry.lock("export", LockOptions::default()).await?;
    /// tokio::select! {
    ///     () = guard.lost() => eprintln!("lease lost: export abandoned"),
    ///     () = async { /* the export */ } => guard.release().await?,
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn lost(&self) {
        self.held().state().loss.raised().await;
    }

    /// Whether the lease is known lost, or its deadline has passed (which
    /// raises its loss): an atomic load and a clock read, for a check
    /// before each step of a body.
    pub(crate) fn lost_now(&self) -> bool {
        self.held().state().loss.lost_now()
    }

    /// The lease's loss signal.
    pub(crate) fn loss(&self) -> &LossSignal {
        &self.held().state().loss
    }

    /// The identity of the registry that took the lock.
    pub(crate) fn registry_id(&self) -> usize {
        self.held().registry
    }

    /// The full key and where the caller's key starts in it, to name the
    /// key once the guard is released.
    pub(crate) fn full_key(&self) -> (&Arc<str>, usize) {
        let state = self.held().state();
        (&state.full_key, state.prefix_len)
    }

    /// Releases the lock (or, with `hold_at_least`, shortens the lease to
    /// what remains of it) and wakes waiters.
    ///
    /// # Errors
    ///
    /// [`LockError::Lost`] if the lease had been lost before (expired or
    /// taken over: the other holder's lock is left alone);
    /// [`LockError::Store`] if the store could not be reached, in which
    /// case the lease ends when its TTL passes.
    pub async fn release(mut self) -> Result<(), LockError> {
        match self.held.take() {
            Some(held) => held.release().await,
            None => Ok(()),
        }
    }

    /// Releases the lock, keeping its lease `linger` from now (however
    /// long: a job's fire marks outlive any ttl); only on stores with a
    /// linger ([`Capabilities::linger`](crate::store::Capabilities::linger)).
    pub(crate) async fn release_lingering(mut self, linger: Duration) -> Result<(), LockError> {
        match self.held.take() {
            Some(mut held) => {
                held.hold_until = Some(Instant::now() + linger);
                held.release().await
            }
            None => Ok(()),
        }
    }

    /// The lock's `distributed_lock` span (from the wait to the release;
    /// see the crate's docs on observability): instrument work done under
    /// the lock with it to see that work inside the lock in traces.
    pub fn span(&self) -> &Span {
        &self.held().state().span
    }
}

impl Holding {
    #[inline]
    fn state(&self) -> &State {
        self.renewal.held()
    }

    async fn release(mut self) -> Result<(), LockError> {
        let linger = self.linger();
        let passing = if self.passes && linger.is_zero() {
            self.next_in_chain()
        } else {
            None
        };
        if let Some(chain) = passing {
            match self.pass_on_held(chain) {
                None => return Ok(()),
                Some(held) => self = held,
            }
        }
        let was_held = self.stop();
        let (chain, ttl) = (self.chain, self.ttl);
        // Waits for a renewal in flight or a loss being told, so neither
        // outlives the release; in the common case nothing shares the
        // state, and this is one look. The state is the release's alone
        // from here on.
        let state = self.renewal.take_held().await;
        let released = match state.take_lease(chain, linger, was_held) {
            Release::Gone => Ok(()),
            Release::Plain(mut lease, turn) => {
                let released = lease.release(linger).await;
                // The next local waiter goes ahead once the store has the
                // release.
                drop(turn);
                state.released(released, was_held, linger)
            }
            Release::ForOthers(mut lease, turn) => {
                let released = lease.release(linger).await;
                turn.give_up_for_others();
                state.released(released, was_held, linger)
            }
            Release::HandOver(turn, mut lease, next) => {
                let sent_at = Instant::now();
                let handed = lease.hand_over(sent_at).await;
                state.handed_over(turn, lease, next, ttl, sent_at, handed)
            }
        };
        self.keep_spare();
        released
    }

    /// Passes this hold on as it is (lease, renewal and loss signal) to
    /// the next task queued behind its turn, only if the lease answers a
    /// fencing token at once (the memory store): nothing is waited for. The
    /// first pass of a hold asks it for the next task's token, which is
    /// all the store is asked; later passes leave each next task's token
    /// to its first read ([`UNISSUED`]). Only a hold renewed
    /// with no end but its release, still held, with no linger, no span
    /// (the renewal's and the loss's events name the span of the
    /// hold's first task) and its token from the grant. The caller checks
    /// the rest ([`Holding::passes`], no linger, [`next_in_chain`], whose
    /// count is `chain`). This hold, untouched, when it is not passed on.
    fn pass_on_held(mut self, chain: u32) -> Option<Holding> {
        let taken = {
            let state = self.state();
            let passable = !state.loss.is_raised()
                && state.span.is_none()
                && matches!(state.fencing, Fencing::Known(_))
                && state.lease.is_some();
            let mut holder = passable.then(|| state.holder());
            match holder.as_mut() {
                Some(holder) if holder.turn.as_ref().is_some_and(LocalTurn::has_waiters) => holder
                    .turn
                    .take()
                    .map(|turn| (turn, holder.labels, holder.started_at)),
                _ => None,
            }
        };
        let Some((turn, labels, started_at)) = taken else {
            return Some(self);
        };
        let fencing = if self.tokens_at_once {
            None
        } else {
            // An answer that would take a request is dropped unsent.
            let issued =
                (self.state().lease.as_ref()).and_then(|lease| lease.fencing_token().take_ready());
            let Some(Ok(Some(fencing))) = issued else {
                // No token on demand at once (it came with the grant, or
                // takes a request), or the lease is lost: the turn goes
                // back, and the lease is handed over or released as usual.
                self.state().holder().turn = Some(turn);
                return Some(self);
            };
            self.tokens_at_once = true;
            Some(fencing)
        };
        let state = self.state();
        if !state.ended.swap(true, Ordering::SeqCst) {
            state.record_end(labels, started_at, None);
        }
        telemetry::handed_over(labels);
        // The next hold's start, read only where hold times are recorded.
        let next_start = if cfg!(feature = "metrics") {
            Instant::now()
        } else {
            started_at
        };
        let ttl = self.ttl;
        let carried = match CARRIER.try_with(Cell::take).ok().flatten() {
            Some(mut carrier) => {
                carrier.0 = Some(self);
                carrier
            }
            None => Box::new(Carried(Some(self))),
        };
        // A turn outside every queue has no waiters: it is never here.
        let _ = turn.pass_on(Grant {
            lease: Leased::Carried(carried),
            fencing,
            ttl,
            started_at: next_start,
            chain,
        });
        None
    }

    /// The count of the next holder if the lease may be handed on once
    /// more ([`next_in_chain`]).
    fn next_in_chain(&self) -> Option<u32> {
        let lease = self.state().lease.as_deref()?;
        next_in_chain(self.chain, lease)
    }

    /// Stops the renewal, and with it the telling of a loss (the release
    /// tells of one from here on); whether the lease was still held then.
    fn stop(&self) -> bool {
        self.renewal.stop();
        !self.state().loss.is_raised()
    }

    /// Keeps the released lease's renewal, with its holder's state, for
    /// this thread's next lock: the lease and the turn are gone already,
    /// a span ends now.
    fn keep_spare(self) {
        let leave = (!self.state().span.is_none())
            .then_some((|state| state.span = Span::none()) as fn(&mut State));
        if let Some(spare) = self.renewal.into_spare(self.registry, leave) {
            let over = SPARES.try_with(|spares| {
                let mut spares = spares.borrow_mut();
                if spares.len() < SPARES_KEPT {
                    spares.push(spare);
                    return None;
                }
                Some(spare)
            });
            // Dropped once the thread's spares are let go.
            drop(over);
        }
    }

    /// What is left of `hold_at_least`, rounded up to the millisecond
    /// (the finest unit a store counts in).
    #[inline]
    fn linger(&self) -> Duration {
        let Some(until) = self.hold_until else {
            return Duration::ZERO;
        };
        let left = until.saturating_duration_since(Instant::now());
        let millis = u64::try_from(left.as_nanos().div_ceil(1_000_000)).unwrap_or(u64::MAX);
        Duration::from_millis(millis)
    }
}

/// The end of a release, once it has the holder's state alone.
impl State {
    /// The lease out of the holder's state, which is the release's alone
    /// (no renewal in flight, no loss being told), with how it is to be
    /// released; `chain` is the hold's count of hand-overs in a row.
    fn take_lease(&mut self, chain: u32, linger: Duration, was_held: bool) -> Release {
        let Some(lease) = self.lease.take() else {
            return Release::Gone;
        };
        let turn = self.holder_alone().turn.take();
        match turn {
            Some(turn) if was_held && linger.is_zero() && turn.has_waiters() => {
                match next_in_chain(chain, &*lease) {
                    Some(next) => Release::HandOver(turn, lease, next),
                    None => Release::ForOthers(lease, turn),
                }
            }
            turn => Release::Plain(lease, turn),
        }
    }

    /// What the store's answer to the release (`linger` kept) means for
    /// the caller, logged and recorded.
    fn released(
        &mut self,
        released: Result<bool, StoreError>,
        was_held: bool,
        linger: Duration,
    ) -> Result<(), LockError> {
        match released {
            Ok(true) if was_held => {
                let linger_ms = linger.as_millis() as u64;
                tracing::debug!(parent: &self.span, key = self.key(), linger_ms, "lock released");
                self.ended_alone(None);
                Ok(())
            }
            // Known lost before the release (its deadline passed, a
            // renewal failed), though the store still had it: released,
            // and still reported lost, since the body ran past its lease.
            Ok(true) => {
                tracing::warn!(
                    parent: &self.span,
                    key = self.key(),
                    "the lease was known lost before the release; the store still had it and released it"
                );
                Err(LockError::lost(self.key()))
            }
            Ok(false) => {
                if was_held {
                    self.ended_alone(Some(telemetry::reason::RELEASE));
                }
                tracing::warn!(
                    parent: &self.span,
                    key = self.key(),
                    "release found the lease lost; the current holder's lock was left alone"
                );
                Err(LockError::lost(self.key()))
            }
            Err(source) => Err(LockError::store(self.key(), "release", source)),
        }
    }

    /// What the store answered (`handed`) to the hand-over of `lease`
    /// sent at `sent_at`: a lease it moved goes, for `ttl`, to the next
    /// task queued behind `turn` in this process, the `chain`th hand-over
    /// in a row
    /// ([`next_in_chain`]); the answer, logged and recorded,
    /// for the caller. Whatever it was, the turn is given up, and the
    /// lease dropped unless it was moved.
    fn handed_over(
        &mut self,
        turn: LocalTurn,
        lease: Box<dyn Lease>,
        chain: u32,
        ttl: Duration,
        sent_at: Instant,
        handed: Result<HandOver, StoreError>,
    ) -> Result<(), LockError> {
        let handed = handed.map(|handed| match handed {
            HandOver::Moved { fencing } => {
                // A lease the store could not renew with the move counts
                // from its last renewal.
                let started_at = lease.started_at().map_or(sent_at, |at| at.min(sent_at));
                turn.pass_on(Grant {
                    lease: Leased::Store(lease, self.loss.clone()),
                    fencing,
                    ttl,
                    started_at,
                    chain,
                })
            }
            other => other,
        });
        match handed {
            Ok(HandOver::Moved { .. }) => {
                telemetry::handed_over(self.holder_alone().labels);
                self.ended_alone(None);
                Ok(())
            }
            Ok(HandOver::Released) => {
                tracing::debug!(
                    parent: &self.span,
                    key = self.key(),
                    "lock released rather than handed over (the store cannot move it, or a waiter it queued had its turn)"
                );
                self.ended_alone(None);
                Ok(())
            }
            Ok(HandOver::Lost) => {
                self.ended_alone(Some(telemetry::reason::RELEASE));
                Err(LockError::lost(self.key()))
            }
            Err(source) => Err(LockError::store(self.key(), "release", source)),
        }
    }
}

/// What a task taking a passed-on hold over makes its own.
struct Taken {
    fencing: Option<u64>,
    started_at: Instant,
    chain: u32,
}

/// A hold passed on as it is, on its way through the key's queue to the
/// next task ([`Holding::pass_on_held`]). Dropped before a task takes it
/// over (the task gave up meanwhile), it releases the lease as a dropped
/// guard does.
struct Carried(Option<Holding>);

impl Carried {
    /// The hold, leaving the box empty.
    fn take_holding(&mut self) -> Holding {
        self.0.take().expect("a carried hold is taken over once")
    }
}

impl PassedOn for Carried {
    fn release(
        mut self: Box<Self>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), LockError>> + Send>> {
        let held = self.take_holding();
        Box::pin(held.release())
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any + Send> {
        self
    }

    fn is_lost(&self) -> bool {
        self.0
            .as_ref()
            .is_none_or(|held| held.state().loss.is_raised())
    }
}

impl Drop for Carried {
    fn drop(&mut self) {
        if let Some(held) = self.0.take() {
            held.release_on_drop();
        }
    }
}

impl fmt::Debug for Carried {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut carried = f.debug_struct("Carried");
        if let Some(held) = &self.0 {
            carried.field("key", &held.state().key());
        }
        carried.finish_non_exhaustive()
    }
}

/// How a release goes, once the lease is out of the holder's state.
enum Release {
    /// Released before (nothing left to do).
    Gone,
    /// Released in the store; the turn (if still here) given up after.
    Plain(Box<dyn Lease>, Option<LocalTurn>),
    /// Handed over to the next task queued behind the turn, the
    /// hand-over counting as the given one in a row.
    HandOver(LocalTurn, Box<dyn Lease>, u32),
    /// Released in the store at the end of a chain of hand-overs, others
    /// perhaps waiting for the key; the turn given up after, the next
    /// task of this process yielding once so that they can go first.
    ForOthers(Box<dyn Lease>, LocalTurn),
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        // Released already: the common case, with nothing to do.
        if let Some(held) = self.held.take() {
            held.release_on_drop();
        }
    }
}

impl Holding {
    /// The release of a guard dropped while held: spawned on the current
    /// runtime. Out of line: a released guard's drop stays short.
    #[cold]
    #[inline(never)]
    fn release_on_drop(self) {
        self.renewal.stop();
        match Handle::try_current() {
            Ok(runtime) => {
                let span = self.state().span.clone();
                runtime.spawn(
                    async move {
                        if let Err(error) = self.release().await {
                            tracing::debug!(%error, "release on drop failed");
                        }
                    }
                    .instrument(span),
                );
            }
            Err(_) => {
                tracing::debug!(
                    key = self.state().key(),
                    "guard dropped outside a runtime; the lease ends at its ttl"
                );
            }
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.held {
            Some(held) => f
                .debug_struct("LockGuard")
                .field("key", &held.state().key())
                .field("fencing_token", &held.state().fencing.get())
                .field("is_held", &!held.state().loss.is_raised())
                .finish(),
            None => f.write_str("LockGuard(released)"),
        }
    }
}
