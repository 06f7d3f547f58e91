//! Keeps leases alive while they are held, and says when one is lost.
//!
//! Renews every `ttl / 3` (as Redisson's `RenewalTask` does). A renewal that
//! is refused, or that cannot get through before the lease runs out, marks
//! the lease lost; so does `max_hold`. With the renewal off the lease is
//! marked lost when its `ttl` (less the store's safety margin) has passed.
//!
//! # No task per lock
//!
//! Most critical sections end long before their first renewal is due, so a
//! lock must not pay for a task of its own. Each worker thread keeps one
//! [`Renewer`] per registry: a slab of timers served by one task on that
//! thread's runtime (so a paused test clock is the clock it uses). Taking a
//! lock puts an entry in a free timer of the renewer's slab, releasing frees
//! the timer: no ordered map, no hashing, and neither wakes the task unless
//! the entry is due before the task's next planned wake-up. The task, when
//! it wakes, looks at every entry (as many as locks held on this thread)
//! and plans its next wake-up at the earliest due. Only a renewal that is
//! actually due spawns a task, for its round trip.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::time::{Instant, timeout_at};

use crate::store::ticks;
use crate::store::{Deadline, Reply};
use crate::telemetry::reason;

/// The lease a renewal looks after: renews it, and hears its verdict.
pub(crate) trait Renewable: Send + Sync {
    /// The key, for logs.
    fn key(&self) -> &str;
    /// Extends the lease in the store. `Ok(false)` when it is no longer ours.
    fn renew(&self) -> Reply<'_, bool>;
    /// The lease is lost, for `reason`.
    fn lose(&self, reason: &'static str);
    /// The holder stops counting on the lease at `at` (in [`ticks`]), for
    /// `why`, unless told a later time first.
    fn ends_at(&self, at: i64, why: Deadline);
    /// The lock's span, the parent of the renewal's events.
    fn span(&self) -> &tracing::Span;
    /// A renewal did not extend the lease (counted).
    fn renewal_failed(&self);
    /// Whether the loss signal at `signal` ([`LossSignal::addr`](crate::store::LossSignal::addr))
    /// is this lease's.
    fn has_signal(&self, signal: usize) -> bool;
    /// The lease's loss signal was raised, for `reason`: the holder is
    /// told, by the raise (see [`Renewal::hear_losses`]). Maybe twice.
    fn lease_lost(&self, reason: &'static str);
}

/// When and how one lease is renewed.
pub(crate) struct Schedule {
    pub(crate) ttl: Duration,
    /// How long after a grant (or renewal) is sent the lease can be counted
    /// on: the ttl less the store's safety margin.
    pub(crate) valid_for: Duration,
    /// Whether to renew at all (`watchdog`).
    pub(crate) renew: bool,
    pub(crate) max_hold: Option<Duration>,
    /// When the lease started (see `Grant::started_at`): it surely ends
    /// no later than `ttl` after it.
    pub(crate) started_at: Instant,
}

/// A renewal may run this fraction of its interval early, with others due
/// about then: the task wakes once for a batch of them, not once per lease.
const EARLY_FRACTION: u32 = 16;

/// When an entry is due, and how much earlier it may be acted on: a
/// renewal may run a little early, a deadline (the ttl passed with the
/// watchdog off, `max_hold`, the lease running out) may not.
#[derive(Clone, Copy, Debug)]
struct Due {
    at: Instant,
    early_by: Duration,
}

impl Due {
    fn exact(at: Instant) -> Due {
        Due {
            at,
            early_by: Duration::ZERO,
        }
    }
}

/// One lease in a renewer's slab, and its holder's state (`R`), in one
/// allocation that the holder and the renewer share.
pub(crate) struct Entry<R: ?Sized = dyn Renewable> {
    schedule: Schedule,
    /// Set when the guard releases: no more renewals, no verdicts.
    stopped: AtomicBool,
    /// Until when the lease is known valid (local clock, margin
    /// deducted), in [`ticks`].
    valid_until: AtomicI64,
    lease: R,
}

impl<R: ?Sized> Entry<R> {
    /// The holder's state.
    pub(crate) fn held(&self) -> &R {
        &self.lease
    }
}

impl<R: Renewable + ?Sized> Entry<R> {
    fn interval(&self) -> Duration {
        (self.schedule.ttl / 3).max(Duration::from_millis(1))
    }

    fn stop_at(&self) -> Option<Instant> {
        self.schedule
            .max_hold
            .map(|max_hold| self.schedule.started_at + max_hold)
    }

    fn valid_until(&self) -> Instant {
        ticks::instant(self.valid_until.load(Ordering::Acquire))
    }

    fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// When to act next, after a renewal (or the acquire) at `base` that
    /// made the lease valid until `valid_until`.
    fn next_due(&self, base: Instant, valid_until: Instant) -> Due {
        if !self.schedule.renew {
            return Due::exact(valid_until);
        }
        let next = base + self.interval();
        match self.stop_at() {
            Some(stop_at) if next >= stop_at => Due::exact(stop_at.min(valid_until)),
            _ if next >= valid_until => Due::exact(valid_until),
            _ => Due {
                at: next,
                early_by: self.interval() / EARLY_FRACTION,
            },
        }
    }

    fn lose(&self, reason: &'static str) {
        if !self.is_stopped() {
            self.lease.lose(reason);
        }
    }

    /// Makes the lease valid until `valid_until`, and tells the holder
    /// when it stops counting on it: then, or when `max_hold` passes if
    /// that is sooner.
    fn set_valid_until(&self, valid_until: Instant) {
        // Encoded once, for the renewal and the holder.
        let until = ticks::of(valid_until);
        self.valid_until.store(until, Ordering::Release);
        let ends = if self.schedule.renew {
            Deadline::Late
        } else {
            Deadline::Ttl
        };
        match self.stop_at() {
            Some(stop_at) if stop_at <= valid_until => {
                self.lease.ends_at(ticks::of(stop_at), Deadline::MaxHold);
            }
            _ => self.lease.ends_at(until, ends),
        }
    }
}

mod renewer;
#[cfg(test)]
mod tests;

use renewer::Renewer;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section here is a single update: consistent after a panic.
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}
/// An entry taken out of the slab to be acted on. Dropping it gives the
/// entry back and tells a release waiting for the holder's state to be its
/// own alone ([`Renewal::take_held`]).
struct Taken {
    renewer: Arc<Renewer>,
    entry: Option<Arc<Entry>>,
}

impl std::ops::Deref for Taken {
    type Target = Entry;

    fn deref(&self) -> &Entry {
        // `entry` is emptied only by `drop`.
        self.entry
            .as_deref()
            .expect("a taken entry is given back once")
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        drop(self.entry.take());
        self.renewer.returned.notify_waiters();
    }
}

/// An entry is due: lose it, or renew it in a task of its own.
fn act(renewer: &Arc<Renewer>, id: usize, entry: Arc<Entry>) {
    let entry = Taken {
        renewer: renewer.clone(),
        entry: Some(entry),
    };
    if entry.is_stopped() {
        return;
    }
    let now = Instant::now();
    if !entry.schedule.renew {
        return entry.lose(reason::TTL);
    }
    if entry.stop_at().is_some_and(|stop_at| now >= stop_at) {
        return entry.lose(reason::MAX_HOLD);
    }
    if now >= entry.valid_until() {
        return entry.lose(reason::LATE);
    }
    tokio::spawn(async move {
        let sent_at = Instant::now();
        let renewal = entry.lease.renew();
        let outcome = timeout_at(entry.valid_until(), renewal).await;
        if entry.is_stopped() {
            return;
        }
        match outcome {
            Ok(Ok(true)) => {
                tracing::trace!(parent: entry.lease.span(), key = entry.lease.key(), "lease renewed");
                let valid_until = sent_at + entry.schedule.valid_for;
                entry.set_valid_until(valid_until);
                let due = entry.next_due(sent_at, valid_until);
                entry.renewer.schedule(id, &entry, due);
            }
            Ok(Ok(false)) => {
                entry.lease.renewal_failed();
                entry.lose(reason::REFUSED);
            }
            Ok(Err(error)) => {
                entry.lease.renewal_failed();
                tracing::warn!(parent: entry.lease.span(), key = entry.lease.key(), %error, "lease renewal failed; retrying");
                let retry =
                    Due::exact((Instant::now() + entry.interval() / 4).min(entry.valid_until()));
                entry.renewer.schedule(id, &entry, retry);
            }
            Err(_) => {
                entry.lease.renewal_failed();
                entry.lose(reason::LATE);
            }
        }
    });
}

/// A holder's state to be: made into a new entry's, or written over the
/// old state of a spare one (see [`Renewal::start`]), which it may keep
/// parts of.
pub(crate) trait Fill<R> {
    /// The state, for a new entry.
    fn into_new(self) -> R;
    /// The state, written over a released lease's `old`.
    fn fill(self, old: &mut R);
}

impl<R> Fill<R> for R {
    fn into_new(self) -> R {
        self
    }

    fn fill(self, old: &mut R) {
        *old = self;
    }
}

/// The renewal of one held lease, with its holder's state; stopping it
/// (or dropping it) ends the renewal.
pub(crate) struct Renewal<R: Renewable + 'static> {
    id: usize,
    /// The renewer and the entry; taken out only by
    /// [`Renewal::into_spare`], which consumes the renewal.
    looked_after: Option<(Arc<Renewer>, Arc<Entry<R>>)>,
}

/// A released lease's renewal, kept to look after the next lease taken on
/// the same thread for the same registry: its allocation and its renewer
/// are used again ([`Renewal::start`]).
pub(crate) struct Spare<R: Renewable + 'static> {
    /// The address of the registry's identity the renewer serves.
    owner: usize,
    renewer: Arc<Renewer>,
    /// Shared by nobody: the holder took it back ([`Renewal::take_held`]).
    entry: Arc<Entry<R>>,
}

impl<R: Renewable + 'static> Renewal<R> {
    /// Starts looking after the lease whose holder's state `held` makes,
    /// on `schedule`; when it is lost, its [`Renewable::lose`] is called.
    /// `owner` identifies the registry. `spare`, a released lease's
    /// renewal kept for this, is used if it is this thread's and the same
    /// registry's (`held` then fills its holder's old state in place);
    /// otherwise it is dropped.
    pub(crate) fn start(
        owner: &Weak<dyn Send + Sync>,
        schedule: Schedule,
        held: impl Fill<R>,
        spare: Option<Spare<R>>,
    ) -> Renewal<R> {
        let started_at = schedule.started_at;
        let valid_until = started_at + schedule.valid_for;
        let owner_id = owner.as_ptr() as *const () as usize;
        let mut spare = spare.filter(|spare| spare.owner == owner_id);
        let reused = spare
            .as_mut()
            .and_then(|spare| Arc::get_mut(&mut spare.entry));
        let (renewer, entry) = match reused {
            Some(unshared) => {
                unshared.schedule = schedule;
                *unshared.stopped.get_mut() = false;
                held.fill(&mut unshared.lease);
                let Spare { renewer, entry, .. } = spare.expect("reused from a spare");
                #[cfg(test)]
                renewer.reuses.fetch_add(1, Ordering::SeqCst);
                (renewer, entry)
            }
            None => {
                let entry = Arc::new(Entry {
                    valid_until: AtomicI64::new(ticks::NEVER),
                    schedule,
                    stopped: AtomicBool::new(false),
                    lease: held.into_new(),
                });
                (Renewer::for_this_thread(owner), entry)
            }
        };
        entry.set_valid_until(valid_until);
        let due = entry.next_due(started_at, valid_until);
        let id = renewer.add(entry.clone(), due);
        Renewal {
            id,
            looked_after: Some((renewer, entry)),
        }
    }

    fn looked_after(&self) -> &(Arc<Renewer>, Arc<Entry<R>>) {
        self.looked_after
            .as_ref()
            .expect("a renewal's entry is taken out only by into_spare")
    }

    /// The holder's state.
    pub(crate) fn held(&self) -> &R {
        &self.entry().lease
    }

    /// The allocation the holder's state is in.
    pub(crate) fn entry(&self) -> &Arc<Entry<R>> {
        &self.looked_after().1
    }

    /// The renewal, stopped, to look after another lease
    /// ([`Renewal::start`]), its holder's state as `leave` leaves it (if
    /// given); `None` if a renewal in flight or a loss being told still
    /// shares its entry (see [`take_held`](Self::take_held)). `owner` is the
    /// address of the registry's identity given to `start`.
    pub(crate) fn into_spare(
        mut self,
        owner: usize,
        leave: Option<fn(&mut R)>,
    ) -> Option<Spare<R>> {
        self.stop();
        let (renewer, mut entry) = self.looked_after.take()?;
        match leave {
            Some(leave) => leave(&mut Arc::get_mut(&mut entry)?.lease),
            None if Arc::strong_count(&entry) > 1 => return None,
            None => {}
        }
        Some(Spare {
            owner,
            renewer,
            entry,
        })
    }

    /// Stops renewing, waits until no renewal in flight shares the
    /// holder's state any more, and gives it: the caller's alone, for the
    /// release or the hand-over, which must not overlap a renewal. The
    /// holder must have dropped every other reference to the entry first.
    pub(crate) async fn take_held(&mut self) -> &mut R {
        self.stop();
        debug_assert_eq!(
            Arc::weak_count(self.entry()),
            0,
            "no weak reference to the entry is left when the holder takes it"
        );
        // The common case: no renewal in flight, nothing to wait for. The
        // count is read, not claimed: once the slab has let the entry go
        // (`stop`), only a renewal in flight can share it, and one that
        // ends leaves it shared by nobody.
        while Arc::strong_count(self.entry()) > 1 {
            let returned = self.looked_after().0.returned.notified();
            let mut returned = std::pin::pin!(returned);
            // Registered before the check, so a give-back in between wakes it.
            returned.as_mut().enable();
            if Arc::strong_count(self.entry()) == 1 {
                break;
            }
            returned.await;
        }
        match self.held_mut() {
            Some(held) => held,
            None => unreachable!("the entry was found unshared, and nothing can share it since"),
        }
    }

    /// The holder's state, the caller's alone; `None` while something else
    /// shares it (a renewal in flight, a loss being told: see
    /// [`take_held`](Self::take_held)).
    pub(crate) fn held_mut(&mut self) -> Option<&mut R> {
        let (_, entry) = self.looked_after.as_mut()?;
        Arc::get_mut(entry).map(|entry| &mut entry.lease)
    }

    /// Makes the holder the one told when its lease's loss signal is
    /// raised: the raise finds it through this renewal's timer, as long as
    /// the renewal runs. Whether the signal was raised already, in which
    /// case the holder may not have been told: the caller tells it.
    pub(crate) fn hear_losses(&self, loss: &crate::store::LossSignal) -> bool {
        let (renewer, _) = self.looked_after();
        loss.home_at(renewer, self.id)
    }

    /// Stops renewing; no verdict is given after this.
    pub(crate) fn stop(&self) {
        let Some((renewer, entry)) = &self.looked_after else {
            return;
        };
        // Only the holder stops its entry: once it has, a look is enough
        // (a release stops, takes the state, then drops the renewal).
        if entry.stopped.load(Ordering::Relaxed) {
            return;
        }
        // A store, not a swap: only the holder writes it, once per lease.
        entry.stopped.store(true, Ordering::Release);
        renewer.remove(self.id);
    }
}

impl<R: Renewable + 'static> Drop for Renewal<R> {
    fn drop(&mut self) {
        self.stop();
    }
}
