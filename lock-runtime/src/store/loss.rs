//! The signal that one lease is lost.

use std::cell::Cell;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU8, AtomicUsize, Ordering};
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
    /// Where a raise finds the holder to tell ([`LossHome`]): changed
    /// under this lock (rarely: the signal's allocation is used again by
    /// the next lock of its thread, whose home is mostly the same), read
    /// under it by a raise.
    home: Mutex<Option<Weak<dyn LossHome>>>,
    /// The address `home` points to, to see without the lock that it is
    /// the same.
    home_addr: AtomicUsize,
    /// The holder's place in `home`.
    home_place: AtomicUsize,
}

/// Where the holder of a lease is told that the lease is lost: the
/// runtime's renewer that looks after it, which finds the holder in the
/// place it gave the lease and checks that the lease there is still the
/// one whose signal was raised.
pub(crate) trait LossHome: Send + Sync {
    /// Tells the holder in `place` that its lease is lost, for `reason`,
    /// if its loss signal is the one at `signal` ([`LossSignal::addr`]);
    /// returns once it was told.
    fn tell(&self, place: usize, signal: usize, reason: &'static str);
}

impl Default for LossShared {
    fn default() -> Self {
        LossShared {
            raised: AtomicBool::new(false),
            notify: Notify::new(),
            deadline: AtomicI64::new(ticks::NEVER),
            deadline_reason: AtomicU8::new(Deadline::Late as u8),
            home: Mutex::new(None),
            home_addr: AtomicUsize::new(0),
            home_place: AtomicUsize::new(0),
        }
    }
}

impl LossShared {
    /// Makes a signal nobody else can see as new (its home stays: a raise
    /// finds no holder there whose signal this is until the next one
    /// makes it its own).
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
            // Unique when it was kept, and nobody could see it since:
            // plain stores make it new.
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
        // before it would be told.
        self.tell_home(reason);
        self.shared().notify.notify_waiters();
    }

    /// The signal's identity while it lives: what a [`LossHome`] compares.
    pub(crate) fn addr(&self) -> usize {
        std::ptr::from_ref(self.shared()) as usize
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

    /// Makes the holder in `place` of `home` the one told when the
    /// signal is raised ([`LossHome::tell`]), in place of any before it;
    /// whether it was raised already, in which case the holder may not
    /// have been told (the caller tells it: it may then be told twice).
    pub(crate) fn home_at<H: LossHome + 'static>(&self, home: &Arc<H>, place: usize) -> bool {
        let shared = self.shared();
        let addr = Arc::as_ptr(home) as *const () as usize;
        if shared.home_addr.load(Ordering::Relaxed) != addr {
            let home: Weak<dyn LossHome> = Arc::downgrade(home) as Weak<dyn LossHome>;
            *self.home() = Some(home);
            shared.home_addr.store(addr, Ordering::Relaxed);
        }
        // Then the raise's flag, both sequentially consistent, as the raise
        // sets its flag and then reads the place: one of the two sees the
        // other, so the holder is told by the raise, or by the caller.
        shared.home_place.store(place, Ordering::SeqCst);
        self.is_raised()
    }

    /// Tells the holder at the signal's home, if it has one.
    fn tell_home(&self, reason: &'static str) {
        // The place first: a home set before it was stored is seen with it.
        let place = self.shared().home_place.load(Ordering::SeqCst);
        let home = self.home().as_ref().and_then(Weak::upgrade);
        if let Some(home) = home {
            home.tell(place, self.addr(), reason);
        }
    }

    fn home(&self) -> std::sync::MutexGuard<'_, Option<Weak<dyn LossHome>>> {
        // One assignment or read per use: consistent after a panic.
        self.shared()
            .home
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
        // another lease's.
        if Arc::strong_count(&shared) == 1 {
            // What the other clones did before they were dropped (their
            // count's release) is seen from here on.
            std::sync::atomic::fence(Ordering::Acquire);
            let _ = SPARE.try_with(|spare| spare.set(Some(shared)));
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
