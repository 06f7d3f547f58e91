//! The acquire loop: checks the options against the store, queues locally,
//! then contends in the store until the lease is ours, the caller gives up,
//! or (skip mode) the first refusal.
//!
//! A waiter sleeps until a release notification or its retry time, whichever
//! comes first: notifications can be missed, so the timer is always there.
//! An attempt the caller gives up on after its request may have reached the
//! store (a timeout, a cancellation, an error) is abandoned in the store, so
//! no lease is left behind that nobody holds.

use std::cell::RefCell;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::{Instant, sleep_until, timeout_at};
use tracing::Span;

use crate::error::LockError;
use crate::local_queue::{Grant, Leased, LocalQueues, LocalTurn, QueueMember};
use crate::options::{LockOptions, Mode};
use crate::store::{
    Acquire, AcquireRequest, Capabilities, Claim, Lease, LockToken, LossSignal, ReleaseWatch,
    Reply, Store, StoreErrorKind,
};
use crate::telemetry::Labels;

/// The longest a waiter sleeps between attempts when no release arrives.
pub(crate) const MAX_RETRY_DELAY: Duration = Duration::from_secs(5);

/// How many grants in a row a call in skip mode gives back for arriving
/// after their lease ran out and failing a renewal in time (a store slower
/// than the ttl, for a moment) before it fails with `LockError::Store`; a
/// waiter asks again while its wait lasts.
const LATE_GRANTS_SKIPPING: u32 = 3;

/// The delay before the next attempt when the holder's remaining time is
/// unknown.
const UNKNOWN_HOLD_DELAY: Duration = Duration::from_millis(50);

/// What one lock needs of its registry: the loop reads the store, the
/// local queues and the capabilities; the guard it leads to also the
/// registry's identity and namespace.
pub(crate) struct Parts<'a> {
    pub(crate) store: &'a Arc<dyn Store>,
    pub(crate) local: &'a LocalQueues,
    pub(crate) capabilities: &'a Capabilities,
    /// The identity of the registry taking the lock: its shared state,
    /// weakly. It tells registries apart for re-entrancy (its address) and
    /// for the per-thread renewers.
    pub(crate) registry: &'a Weak<dyn Send + Sync>,
    /// The namespace's length in the full key.
    pub(crate) prefix_len: usize,
    /// The lock's `distributed_lock` span.
    pub(crate) span: &'a Span,
    /// The lock's metric labels.
    pub(crate) labels: Labels,
}

/// A lease that is ours, and this process's turn at its key.
pub(crate) type Granted = (Grant, LocalTurn);

/// A lock's key with the registry's namespace in front: the caller's own
/// text when there is no namespace, else built once. The guard shares the
/// local queue's copy, so a key with a queue is not copied again; only a
/// claim that does not queue (a share) takes a copy of a given text.
#[derive(Clone, Debug)]
pub(crate) enum FullKey<'a> {
    Given(&'a str),
    Shared(Arc<str>),
}

impl FullKey<'_> {
    /// The key, shared: copied if it was only given.
    pub(crate) fn to_shared(&self) -> Arc<str> {
        match self {
            FullKey::Given(key) => Arc::from(*key),
            FullKey::Shared(key) => key.clone(),
        }
    }
}

impl std::ops::Deref for FullKey<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        match self {
            FullKey::Given(key) => key,
            FullKey::Shared(key) => key,
        }
    }
}

impl Parts<'_> {
    /// The address of the registry's identity: how a task's frames name
    /// the registry that took a key.
    pub(crate) fn registry_id(&self) -> usize {
        self.registry.as_ptr() as *const () as usize
    }
}

/// Whether this call can take `handed` up: a lease the store answered
/// always; a hold passed on as it is only when the call's own hold would
/// be renewed the same way (no end but its release) and records nothing
/// in a span, which the carried hold's renewal and listener do not name.
fn takes_over(handed: &Grant, opts: &LockOptions, parts: &Parts<'_>) -> bool {
    match handed.lease {
        Leased::Store(..) => true,
        Leased::Carried(_) => opts.renews_without_end() && parts.span.is_none(),
    }
}

/// When a lock call began, if anything needs it: a `wait_timeout` (its
/// deadline), the wait's metrics or the wait's debug events. Otherwise
/// `None`, and the clock is read only as each request is sent: a lock
/// taken up from a hand-over reads it not at all.
pub(crate) fn call_start(opts: &LockOptions) -> Option<Instant> {
    let timed = opts.wait_timeout.is_some()
        || cfg!(feature = "metrics")
        || tracing::enabled!(tracing::Level::DEBUG);
    timed.then(Instant::now)
}

/// Queues locally, then contends in the store: the lease and the turn,
/// for the caller to hold; `None` only in skip mode. `key` is the user's
/// key (for messages), `full_key` the namespaced one; `started` is when
/// the call began ([`call_start`]); the wait's events go to `wait`, and
/// `contended` is set when the key was found held.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn contend(
    parts: &Parts<'_>,
    key: &str,
    full_key: &FullKey<'_>,
    opts: &LockOptions,
    mode: Mode,
    started: Option<Instant>,
    contended: &mut bool,
    wait: &Span,
) -> Result<Option<Granted>, LockError> {
    let claim = opts.claim();
    check_served(parts, key, claim, opts)?;
    // `started` is known whenever there is a deadline.
    let deadline = opts
        .wait_timeout
        .zip(started)
        .map(|(timeout, started)| started + timeout);
    let timed_out = || LockError::Timeout {
        key: LockError::shown_key(key),
        waited: started.map_or(Duration::ZERO, |started| started.elapsed()),
    };
    // Tasks of this process queue for an exclusive claim, so one of them
    // contends in the store, and for a semaphore's permits, so as many as
    // it has; shares, which any number may hold, go to the store.
    let member = claim
        .limit()
        .and_then(|width| parts.local.join(full_key, width.get()));
    let turn = match member.map(QueueMember::try_lock) {
        None => LocalTurn::Unqueued(full_key.to_shared()),
        Some(Ok(turn)) => turn,
        Some(Err(member)) => {
            *contended = true;
            if mode == Mode::Skip {
                tracing::debug!(parent: wait, key, "lock held by other tasks of this process; skipping");
                return Ok(None);
            }
            // Not `within`: one future fewer around every local wait.
            let turn = match deadline {
                None => member.lock().await,
                Some(deadline) => timeout_at(deadline, member.lock())
                    .await
                    .map_err(|_| timed_out())?,
            };
            // The last holder released the key for others waiting for it:
            // the tasks its release woke get to run, and ask, first.
            if turn.others_first() {
                tokio::task::yield_now().await;
            }
            turn
        }
    };
    if let Some(mut handed) = turn.take_handed() {
        if handed.ttl == opts.ttl && !handed.is_lost() && takes_over(&handed, opts, parts) {
            if !opts.fencing {
                handed.fencing = Some(0);
            }
            tracing::debug!(
                parent: wait,
                key,
                fencing = handed.fencing,
                waited_ms = waited_ms(started),
                "lock handed over by the previous holder in this process"
            );
            return Ok(Some((handed, turn)));
        }
        // Handed over with another ttl (or lost meanwhile), or a hold
        // this call cannot take over as it is: give it back and take our
        // own.
        match handed.lease {
            Leased::Store(mut lease, _) => {
                lease
                    .release(Duration::ZERO)
                    .await
                    .map_err(|source| LockError::store(key, "release", source))?;
            }
            // Lost already, or released: nothing held is left either way.
            Leased::Carried(carried) => {
                if let Err(error @ LockError::Store { .. }) = carried.release().await {
                    return Err(error);
                }
            }
        }
    }
    let store = &**parts.store;
    let token = LockToken::random();
    let loss = LossSignal::new();
    // Not queued behind anyone: the first request goes out now, sent at
    // the call's start if that was read (else the clock is read now), and
    // a grant answered at once is taken without the loop below.
    let mut first = None;
    let first_sent = (!*contended).then(|| started.unwrap_or_else(Instant::now));
    if let Some(sent_at) = first_sent
        && let Some((lease, fencing)) = first_attempt(
            parts, &turn, token, &loss, opts, claim, mode, sent_at, &mut first,
        )
    {
        // Nothing borrowed is left (no answer to hand on).
        drop(first);
        acquired(wait, key, fencing, started);
        return Ok(Some((
            Grant::new(lease, loss, fencing, opts.ttl, sent_at),
            turn,
        )));
    }
    let queue_poll = parts.capabilities.waiter_queue;
    let mut watch: Option<ReleaseWatch> = None;
    // The stakes borrow `turn`: they end in this block, before it is
    // returned.
    let outcome = {
        // Moved in: the first answer borrows the turn and the loss signal
        // no longer than this block. Paired with its send time (there is
        // one whenever there is a first answer).
        let mut first = first.zip(first_sent);
        // A waiter's place in a store's queue: given up if the wait ends
        // without the lock.
        let mut place = (queue_poll.is_some() && mode == Mode::Wait)
            .then(|| Stake::new(parts.store, &turn, token));
        // Whether the store answered the last call: if not, undoing the
        // stakes would wait on it too.
        let mut answering = true;
        // Grants answered too late in a row (see `LATE_GRANTS_SKIPPING`).
        let mut late = 0;
        let outcome = 'attempts: loop {
            // An attempt given up (the deadline) or failed may still be
            // granted in the store: undone, before the call returns while
            // the store answers, in the background while it does not (the
            // undo would wait as long again; what it left ends with its
            // lease).
            let attempt = Stake::new(parts.store, &turn, token);
            let (reply, sent_at) = match first.take() {
                Some(first) => first,
                None => {
                    let sent_at = Instant::now();
                    let request = request(&turn, token, &loss, opts, claim, mode, *contended);
                    (store.acquire(request.sent_at(sent_at)), sent_at)
                }
            };
            // Not `within`: one future fewer around the common attempt.
            let answered_at_once = reply.is_ready();
            let answer = match deadline {
                None => Some(reply.await),
                Some(deadline) => timeout_at(deadline, reply).await.ok(),
            };
            let answer = match answer {
                Some(Ok(answer)) => answer,
                Some(Err(source)) => {
                    if source.kind() == StoreErrorKind::Unavailable {
                        answering = false;
                    } else {
                        attempt.undo().await;
                    }
                    break 'attempts Err(LockError::store(key, "acquire", source));
                }
                None => {
                    answering = false;
                    break 'attempts Err(timed_out());
                }
            };
            attempt.settle();
            let remaining = match answer {
                Acquire::Acquired { fencing, mut lease } => {
                    // A lease the store prepared ahead counts from then.
                    let mut started_at = lease.started_at().map_or(sent_at, |at| at.min(sent_at));
                    let valid_for = parts.capabilities.valid_for(opts.ttl);
                    // Answered as the call returned, for a lease that
                    // started with the request: nothing was waited for in
                    // which it could run out, so no clock read (a thread
                    // descheduled here is no later than one descheduled
                    // just after the check).
                    let took = if answered_at_once && started_at == sent_at {
                        Duration::ZERO
                    } else {
                        started_at.elapsed()
                    };
                    if took >= valid_for {
                        match Box::pin(keep_late_grant(&mut *lease, deadline, valid_for)).await {
                            None => {
                                answering = false;
                                break 'attempts Err(timed_out());
                            }
                            Some(Ok(renewed_at)) => started_at = renewed_at,
                            Some(Err(given_back)) => {
                                late += 1;
                                tracing::warn!(
                                    parent: wait,
                                    key,
                                    took_ms = took.as_millis() as u64,
                                    "the store granted the lock after its lease ran out, \
                                     and did not renew it in time; given back"
                                );
                                // A waiter asks again while its wait lasts.
                                if given_back && (mode == Mode::Wait || late < LATE_GRANTS_SKIPPING)
                                {
                                    continue;
                                }
                                break 'attempts Err(late_grants_error(key, took, opts.ttl, late));
                            }
                        }
                    }
                    place.take().into_iter().for_each(Stake::settle);
                    // Asked for none: whatever the store made is not promised.
                    let fencing = if opts.fencing { fencing } else { Some(0) };
                    acquired(wait, key, fencing, started);
                    break 'attempts Ok(Some((lease, fencing, started_at)));
                }
                Acquire::Held { remaining } => remaining,
            };
            *contended = true;
            if mode == Mode::Skip {
                tracing::debug!(parent: wait, key, "lock held elsewhere; skipping");
                break 'attempts Ok(None);
            }
            let Some(watch) = watch.as_mut() else {
                // Subscribe, then retry at once: a release that happened
                // between the attempt and the subscription is not missed.
                let Some(subscribed) = Box::pin(within(deadline, store.watch(turn.key()))).await
                else {
                    answering = false;
                    break 'attempts Err(timed_out());
                };
                let subscribed = match subscribed {
                    Ok(subscribed) => subscribed,
                    Err(source) => {
                        answering = source.kind() != StoreErrorKind::Unavailable;
                        break 'attempts Err(LockError::store(key, "watch", source));
                    }
                };
                watch = Some(subscribed);
                tracing::debug!(
                    parent: wait,
                    key,
                    remaining_ms = remaining.map(|r| r.as_millis() as u64),
                    "lock contended; waiting"
                );
                continue;
            };
            // A store that cannot announce releases is asked again as often
            // as it says, as one whose queue needs its waiters back.
            let poll = match (queue_poll, parts.capabilities.release_poll) {
                (Some(queue), Some(release)) => Some(queue.min(release)),
                (queue, release) => queue.or(release),
            };
            let mut wake = Instant::now() + retry_delay(remaining, poll);
            if let Some(deadline) = deadline {
                wake = wake.min(deadline);
            }
            Box::pin(released_or(watch, token, wake)).await;
            if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                break 'attempts Err(timed_out());
            }
        };
        // A waiter that leaves without the lock (timed out, failed) takes its
        // place in the store's queue with it before the call returns, while
        // the store answers; otherwise, and when the call is cancelled
        // meanwhile, it is undone in the background (`Stake`'s drop).
        if let Some(place) = place
            && answering
        {
            Box::pin(place.undo()).await;
        }
        outcome
    };
    let granted = outcome?.map(|(lease, fencing, started_at)| {
        (Grant::new(lease, loss, fencing, opts.ttl, started_at), turn)
    });
    Ok(granted)
}

/// Logs a lease the store granted to this call (not handed over), in the
/// call's `wait` span.
fn acquired(wait: &Span, key: &str, fencing: Option<u64>, started: Option<Instant>) {
    tracing::debug!(
        parent: wait,
        key,
        fencing,
        waited_ms = waited_ms(started),
        "lock acquired"
    );
}

/// How long the call has waited, in whole milliseconds, for its events:
/// `started` is known whenever they are listened to ([`call_start`]).
fn waited_ms(started: Option<Instant>) -> Option<u64> {
    started.map(|started| started.elapsed().as_millis() as u64)
}

/// The request of `token`'s attempt at `turn`'s key, but for when it is
/// sent.
#[allow(clippy::too_many_arguments)]
fn request<'a>(
    turn: &'a LocalTurn,
    token: LockToken,
    loss: &'a LossSignal,
    opts: &LockOptions,
    claim: Claim,
    mode: Mode,
    contended: bool,
) -> AcquireRequest<'a> {
    AcquireRequest::with_shared_key(turn.key(), token, opts.ttl, loss)
        .claiming(claim)
        .waiting(mode == Mode::Wait)
        .fencing(opts.fencing)
        .contended(contended)
}

/// The first attempt of a call not queued behind anyone, sent at
/// `sent_at` (when the call began, if that was read): the lease and its
/// fencing token when the store grants it at once (a store in this
/// process), the lease then counting from `sent_at`, with nothing waited
/// for in which it could run out, so good without another clock read.
/// Any other answer (refused, failed, answered later, a lease counted
/// from an earlier start) goes to `first`, for the attempt loop, which
/// treats every answer alike.
#[allow(clippy::too_many_arguments)]
fn first_attempt<'a>(
    parts: &'a Parts<'_>,
    turn: &'a LocalTurn,
    token: LockToken,
    loss: &'a LossSignal,
    opts: &LockOptions,
    claim: Claim,
    mode: Mode,
    sent_at: Instant,
    first: &mut Option<Reply<'a, Acquire>>,
) -> Option<(Box<dyn Lease>, Option<u64>)> {
    let request = request(turn, token, loss, opts, claim, mode, false).sent_at(sent_at);
    let store: &'a dyn Store = &**parts.store;
    let mut reply = store.acquire(request);
    let Some(answer) = reply.take_ready() else {
        *first = Some(reply);
        return None;
    };
    match answer {
        // A lease the store prepared ahead counts from then, and one with
        // no time to count on is given back: the loop's cases.
        Ok(Acquire::Acquired { fencing, lease })
            if lease.started_at().is_none_or(|at| at >= sent_at)
                && !parts.capabilities.valid_for(opts.ttl).is_zero() =>
        {
            // Asked for none: whatever the store made is not promised.
            Some((lease, if opts.fencing { fencing } else { Some(0) }))
        }
        answer => {
            *first = Some(Reply::ready(answer));
            None
        }
    }
}

/// Whether the registry's store serves `claim` with `opts`' ttl and
/// `hold_at_least` ([`Capabilities::check`]). Each thread remembers the
/// last ones that passed, and for which registry (held weakly, so its
/// address is no other registry's meanwhile): a call site that locks with
/// the same options again is not checked again.
fn check_served(
    parts: &Parts<'_>,
    key: &str,
    claim: Claim,
    opts: &LockOptions,
) -> Result<(), LockError> {
    type Served = (Weak<dyn Send + Sync>, Claim, Duration, Option<Duration>);
    thread_local! {
        static SERVED: RefCell<Option<Served>> = const { RefCell::new(None) };
    }
    let asked = (claim, opts.ttl, opts.hold_at_least);
    let known = SERVED.with_borrow(|served| {
        served.as_ref().is_some_and(|(registry, claim, ttl, hold)| {
            Weak::ptr_eq(registry, parts.registry) && (*claim, *ttl, *hold) == asked
        })
    });
    if known {
        return Ok(());
    }
    check_new_served(parts, key, claim, opts)?;
    SERVED.set(Some((
        parts.registry.clone(),
        claim,
        opts.ttl,
        opts.hold_at_least,
    )));
    Ok(())
}

/// [`Capabilities::check`] for options not seen on this thread just
/// before. Out of line: a call site locking with the same options again
/// does not run it.
#[cold]
#[inline(never)]
fn check_new_served(
    parts: &Parts<'_>,
    key: &str,
    claim: Claim,
    opts: &LockOptions,
) -> Result<(), LockError> {
    parts
        .capabilities
        .check(claim, opts.ttl, opts.hold_at_least)
        .map_err(|reason| LockError::invalid_options(key, reason))
}

/// `token`'s stake in the store, given up there (abandoned) if dropped
/// before it is settled: an attempt in flight, whose request may be
/// granted after the caller stopped listening (a timeout, a cancellation,
/// an error), or a waiter's place in a store's queue, when the wait ends
/// without the lock.
struct Stake<'a> {
    store: &'a Arc<dyn Store>,
    turn: &'a LocalTurn,
    token: LockToken,
    settled: bool,
}

impl<'a> Stake<'a> {
    fn new(store: &'a Arc<dyn Store>, turn: &'a LocalTurn, token: LockToken) -> Self {
        Stake {
            store,
            turn,
            token,
            settled: false,
        }
    }

    /// The stake needs no undoing: the attempt was answered, the waiter got
    /// the lock.
    fn settle(mut self) {
        self.settled = true;
    }

    /// Gives the stake up now, and returns once the store has answered.
    async fn undo(mut self) {
        self.settled = true;
        abandon(self.store.clone(), self.turn.key().clone(), self.token).await;
    }
}

impl Drop for Stake<'_> {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, key) = (self.store.clone(), self.turn.key().clone());
        runtime.spawn(abandon(store, key, self.token));
    }
}

/// Abandons `token`'s acquire of `key` in `store` (see [`Store::abandon`]);
/// a failure is logged: a lease it may have got ends at its ttl.
async fn abandon(store: Arc<dyn Store>, key: Arc<str>, token: LockToken) {
    match store.abandon(&key, token).await {
        Ok(true) => tracing::debug!(%key, "released a lease granted after its caller gave up"),
        Ok(false) => {}
        Err(error) => {
            tracing::debug!(%key, %error, "could not abandon an acquire; a lease it may have got ends at its ttl")
        }
    }
}

/// A grant answered after its lease ran out (`valid_for` from the
/// request), too late to be counted on: renewed at once, and kept, counted
/// from the renewal, if the store still has it and the renewal came in
/// time (`Ok(renewed_at)`); otherwise given back, before the token asks
/// again, since a release arriving after the next grant would end that one
/// (`Err(whether the store took it back)`). `None` when `deadline` came
/// first.
async fn keep_late_grant(
    lease: &mut dyn Lease,
    deadline: Option<Instant>,
    valid_for: Duration,
) -> Option<Result<Instant, bool>> {
    let renewed_at = Instant::now();
    let renewed = within(deadline, lease.renew()).await?;
    if matches!(renewed, Ok(true)) && renewed_at.elapsed() < valid_for {
        return Some(Ok(renewed_at));
    }
    let given_back = within(deadline, lease.release(Duration::ZERO)).await?;
    Some(Err(given_back.is_ok()))
}

/// The error of a call in skip mode whose last `late` grants in a row came
/// `took` after their request, past their lease (`ttl` less the margin),
/// and were given back.
fn late_grants_error(key: &str, took: Duration, ttl: Duration, late: u32) -> LockError {
    let why = format!(
        "the store granted the lock {took:?} after the request, when its lease (ttl {ttl:?} \
         less the store's margin) had run out, and did not renew it in time ({late} times \
         running); it was given back"
    );
    LockError::store(key, "acquire", why.into())
}

/// Waits until `watch` announces a release `token` may act on, or `wake`.
async fn released_or(watch: &mut ReleaseWatch, token: LockToken, wake: Instant) {
    tokio::select! {
        () = watch.released_for(token) => {}
        () = sleep_until(wake) => {}
    }
}

/// Runs `fut` until `deadline`; `None` if the deadline came first.
async fn within<F: std::future::Future>(deadline: Option<Instant>, fut: F) -> Option<F::Output> {
    match deadline {
        None => Some(fut.await),
        Some(deadline) => timeout_at(deadline, fut).await.ok(),
    }
}

/// When to try again without a release notification: when the holder's
/// lease says it ends, plus jitter so waiting processes do not all retry in
/// the same millisecond; never later than `MAX_RETRY_DELAY`. A waiter
/// queued in a store that needs it back every `queue_poll` comes back by
/// then (the jitter aside), and at that pace when the holder is unknown.
fn retry_delay(remaining: Option<Duration>, queue_poll: Option<Duration>) -> Duration {
    let base = match queue_poll {
        None => remaining.unwrap_or(UNKNOWN_HOLD_DELAY),
        Some(poll) => remaining.map_or(poll, |remaining| remaining.min(poll)),
    }
    .min(MAX_RETRY_DELAY);
    let spread = (base / 8).clamp(Duration::from_millis(1), Duration::from_millis(50));
    let jitter = rand::random_range(0..=spread.as_micros() as u64);
    base + Duration::from_micros(jitter)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `d` is `base` plus at most its jitter (an eighth, 1 to 50 ms).
    fn within_jitter(d: Duration, base: Duration) -> bool {
        let spread = (base / 8).clamp(Duration::from_millis(1), Duration::from_millis(50));
        d >= base && d <= base + spread
    }

    #[test]
    fn a_waiter_retries_when_the_lease_ends_or_a_queue_needs_it_back() {
        let ms = Duration::from_millis;
        // No queue: when the holder's lease ends, at most MAX_RETRY_DELAY.
        assert!(within_jitter(retry_delay(Some(ms(200)), None), ms(200)));
        assert!(within_jitter(
            retry_delay(Some(ms(30_000)), None),
            MAX_RETRY_DELAY
        ));
        assert!(within_jitter(retry_delay(None, None), UNKNOWN_HOLD_DELAY));
        // A queue that needs the waiter back every 300 ms: never later,
        // and at that pace when the holder is unknown.
        let poll = Some(ms(300));
        assert!(within_jitter(retry_delay(Some(ms(30_000)), poll), ms(300)));
        assert!(within_jitter(retry_delay(None, poll), ms(300)));
        assert!(within_jitter(retry_delay(Some(ms(20)), poll), ms(20)));
    }
}
