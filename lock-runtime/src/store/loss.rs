//! The signal that one lease is lost.

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Notify;
use tokio::time::Instant;

use super::ticks;

/// The signal that one lease is lost.
///
/// The runtime makes one per acquire and hands it to the store in the
/// [`AcquireRequest`](super::AcquireRequest). Whoever learns first that the lease is gone raises
/// it: the runtime's renewal (a renewal refused or too late), or the store
/// itself (a session expired, a lease revoked). Raising it cancels the body
/// that holds the lease (or, under [`OnLost::Notify`](crate::OnLost::Notify),
/// tells it), and the call then returns
/// [`LockError::Lost`](crate::LockError::Lost). Cheap to clone; clones
/// share the signal.
#[derive(Clone)]
pub struct LossSignal {
    /// Always there but while the signal is dropped, which moves it out.
    shared: Option<Arc<LossShared>>,
}

struct LossShared {
    raised: AtomicBool,
    notify: Notify,
    /// When the holder stops counting on the lease, in [`ticks`]
    /// ([`ticks::NEVER`]: no deadline): looked at whenever the holder's
    /// task wakes (see [`LossSignal::raised`]), so an atomic, not a lock.
    deadline: AtomicI64,
    /// Why the lease is lost at its deadline (a [`Deadline`]); read only
    /// then.
    deadline_reason: AtomicU8,
    /// Told once when the signal is raised; the runtime's holder of the lease.
    listener: Mutex<Option<Weak<dyn LossListener>>>,
    /// Whether `listener` holds one: set and cleared under its lock, read
    /// without it once nobody else can see the signal.
    listening: AtomicBool,
}

/// Reacts when a lease is lost (the runtime's guard state).
pub(crate) trait LossListener: Send + Sync {
    fn lease_lost(&self, reason: &'static str);
}

impl Default for LossShared {
    fn default() -> Self {
        LossShared {
            raised: AtomicBool::new(false),
            notify: Notify::new(),
            deadline: AtomicI64::new(ticks::NEVER),
            deadline_reason: AtomicU8::new(Deadline::Late as u8),
            listener: Mutex::new(None),
            listening: AtomicBool::new(false),
        }
    }
}

impl LossShared {
    /// Makes a signal nobody else can see, with no listener, as new.
    fn reset(&self) {
        self.raised.store(false, Ordering::Relaxed);
        self.deadline.store(ticks::NEVER, Ordering::Relaxed);
        self.deadline_reason
            .store(Deadline::Late as u8, Ordering::Relaxed);
    }
}

/// Why a holder stops counting on its lease at a deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Deadline {
    /// The renewal did not get through before the lease ran out.
    Late,
    /// `max_hold` was reached.
    MaxHold,
    /// The ttl passed with the watchdog off.
    Ttl,
}

impl Deadline {
    /// The loss's reason, as logs and metrics name it.
    pub(crate) const fn reason(self) -> &'static str {
        match self {
            Deadline::Late => "no renewal got through before the lease ran out",
            Deadline::MaxHold => "max_hold reached",
            Deadline::Ttl => "ttl passed with the watchdog off",
        }
    }

    fn from_u8(value: u8) -> Deadline {
        match value {
            v if v == Deadline::MaxHold as u8 => Deadline::MaxHold,
            v if v == Deadline::Ttl as u8 => Deadline::Ttl,
            _ => Deadline::Late,
        }
    }
}

impl LossSignal {
    /// A signal not raised yet.
    ///
    /// The last clone of a signal, when dropped, leaves its allocation to
    /// the next signal made on that thread, reset: a lock and release in
    /// a loop makes no new one.
    pub fn new() -> Self {
        let shared = match SPARE.try_with(Cell::take).ok().flatten() {
            // Unique when it was kept, with no listener, and nobody could
            // see it since: plain stores make it new.
            Some(shared) => {
                shared.reset();
                shared
            }
            None => Arc::default(),
        };
        LossSignal {
            shared: Some(shared),
        }
    }

    #[inline]
    fn shared(&self) -> &LossShared {
        self.shared
            .as_deref()
            .expect("a loss signal is emptied only by its drop")
    }

    /// Says the lease is lost, for `reason` (logged). Idempotent.
    pub fn raise(&self, reason: &'static str) {
        if self.shared().raised.swap(true, Ordering::SeqCst) {
            return;
        }
        // The holder first: once woken, a body's task may end and drop it
        // before the listener would be told.
        self.tell_listener(reason);
        self.shared().notify.notify_waiters();
    }

    /// Whether the signal was raised.
    #[inline]
    pub fn is_raised(&self) -> bool {
        self.shared().raised.load(Ordering::SeqCst)
    }

    /// Completes once the signal is raised, or the lease's deadline (which
    /// the runtime's renewal keeps) has passed, which raises it. The
    /// deadline is looked at each time this is polled, not only when the
    /// renewal's timer fires: a task that wakes late (its process frozen,
    /// its thread blocked) learns that its lease ended before it runs on,
    /// whichever of its wake-ups comes first.
    pub async fn raised(&self) {
        loop {
            let notified = self.shared().notify.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before the check, so a raise in between is not missed.
            notified.as_mut().enable();
            let raised = std::future::poll_fn(|cx| {
                if self.lost_now() {
                    return std::task::Poll::Ready(true);
                }
                notified.as_mut().poll(cx).map(|()| false)
            })
            .await;
            if raised || self.is_raised() {
                return;
            }
        }
    }

    /// Sets when the holder stops counting on the lease (its ttl less the
    /// margin, or `max_hold`), in [`ticks`], and why it is lost then.
    pub(crate) fn ends_at(&self, at: i64, why: Deadline) {
        // The reason first: a reader that sees the new deadline passed
        // (`Acquire`) sees its reason too.
        self.shared()
            .deadline_reason
            .store(why as u8, Ordering::Relaxed);
        self.shared().deadline.store(at, Ordering::Release);
    }

    /// Whether the signal is raised, raising it first if its deadline has
    /// passed.
    pub(crate) fn lost_now(&self) -> bool {
        self.is_raised() || self.past_deadline()
    }

    /// Raises the signal if its deadline has passed; whether it did. One
    /// atomic load and a clock read.
    fn past_deadline(&self) -> bool {
        let deadline = self.shared().deadline.load(Ordering::Acquire);
        if deadline == ticks::NEVER || ticks::of(Instant::now()) < deadline {
            return false;
        }
        let why = Deadline::from_u8(self.shared().deadline_reason.load(Ordering::Relaxed));
        self.raise(why.reason());
        true
    }

    /// Completes once any of `signals` is raised; never, if there are
    /// none.
    pub(crate) async fn any_raised(signals: &[LossSignal]) {
        if signals.is_empty() {
            return std::future::pending().await;
        }
        let mut waits: Vec<_> = signals
            .iter()
            .map(|signal| Box::pin(signal.raised()))
            .collect();
        std::future::poll_fn(|cx| {
            if waits
                .iter_mut()
                .any(|wait| wait.as_mut().poll(cx).is_ready())
            {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        })
        .await
    }

    /// Makes `listener` the one told when the signal is raised (at once if
    /// it already was), in place of any earlier one.
    pub(crate) fn listen(&self, listener: Weak<dyn LossListener>) {
        let mut slot = self.listener();
        *slot = Some(listener);
        self.shared().listening.store(true, Ordering::Relaxed);
        drop(slot);
        if self.is_raised() {
            self.tell_listener("lost before it was taken up");
        }
    }

    /// Drops the listener, if it was not told yet; returns once a telling
    /// in progress has ended, so the listener is not referred to from here
    /// any more.
    pub(crate) fn unlisten(&self) {
        let listener = self.take_listener(&mut self.listener());
        drop(listener);
    }

    /// Tells the listener (once), holding the lock meanwhile: `unlisten`
    /// waits for it.
    fn tell_listener(&self, reason: &'static str) {
        let mut slot = self.listener();
        if let Some(listener) = self
            .take_listener(&mut slot)
            .and_then(|weak| weak.upgrade())
        {
            listener.lease_lost(reason);
        }
    }

    /// Takes the listener out of `slot`, the listener's lock held.
    fn take_listener(
        &self,
        slot: &mut Option<Weak<dyn LossListener>>,
    ) -> Option<Weak<dyn LossListener>> {
        self.shared().listening.store(false, Ordering::Relaxed);
        slot.take()
    }

    fn listener(&self) -> std::sync::MutexGuard<'_, Option<Weak<dyn LossListener>>> {
        // One assignment or `take` per use: consistent after a panic.
        self.shared()
            .listener
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}

thread_local! {
    /// The allocation of the last signal dropped on this thread, for the
    /// next one.
    static SPARE: Cell<Option<Arc<LossShared>>> = const { Cell::new(None) };
}

impl Drop for LossSignal {
    fn drop(&mut self) {
        let Some(shared) = self.shared.take() else {
            return;
        };
        // The last clone: nobody else can see the signal any more (no weak
        // references to it are ever made), so it can start over as
        // another lease's, if nothing listens to it.
        if Arc::strong_count(&shared) == 1 {
            // What the other clones did before they were dropped (their
            // count's release) is seen from here on.
            std::sync::atomic::fence(Ordering::Acquire);
            if !shared.listening.load(Ordering::Relaxed) {
                let _ = SPARE.try_with(|spare| spare.set(Some(shared)));
            }
        }
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
