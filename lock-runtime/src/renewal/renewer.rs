//! One timer slab of leases per worker thread and registry, served by one
//! task that renews what is due.

use std::cell::RefCell;
#[cfg(test)]
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};

use super::{Due, Entry, act, lock};
use crate::store::LossHome;
use crate::store::common::slots;

/// How long the renewer task keeps waking on its own while idle, so that
/// locks taken meanwhile need not wake it.
pub(super) const IDLE_PERIOD: Duration = Duration::from_secs(1);

/// A slab of leases with their timers, served by one task.
pub(crate) struct Renewer {
    pub(super) state: Mutex<Slab>,
    wake: Arc<Notify>,
    /// Told each time an entry taken out of the slab to be acted on is
    /// given back (see [`Taken`](super::Taken)): what a release waiting for
    /// a renewal in flight waits on.
    pub(super) returned: Notify,
    /// How many times a lock woke the task.
    #[cfg(test)]
    pub(super) wakes: std::sync::atomic::AtomicUsize,
    /// How many leases a released lease's renewal was used again for.
    #[cfg(test)]
    pub(super) reuses: std::sync::atomic::AtomicUsize,
}

/// The slab of leases a renewer looks after, each with a timer of its own,
/// which it frees when released.
#[derive(Default)]
pub(super) struct Slab {
    /// The leases looked after, by timer id; `None` where free.
    pub(super) timers: Vec<Option<Timer>>,
    /// The free timers.
    free: Vec<usize>,
    /// When the task will look at the slab next on its own; `None` while it
    /// sleeps until woken.
    planned: Option<Instant>,
    task: Option<JoinHandle<()>>,
    /// How many times the task looked at the slab.
    #[cfg(test)]
    pub(super) looks: usize,
}

/// A lease in the slab.
pub(super) struct Timer {
    pub(super) entry: Arc<Entry>,
    /// When to act on it; `None` while its renewal is in flight.
    pub(super) due: Option<Due>,
}

impl Slab {
    /// Takes the entries due at `now` (their renewals will be in flight);
    /// the earliest due of the rest.
    fn take_due(&mut self, now: Instant) -> (Vec<(usize, Arc<Entry>)>, Option<Instant>) {
        #[cfg(test)]
        {
            self.looks += 1;
        }
        let mut ready = Vec::new();
        let mut next: Option<Instant> = None;
        for (id, timer) in self.timers.iter_mut().enumerate() {
            let Some(timer) = timer else { continue };
            match timer.due {
                Some(due) if due.at <= now + due.early_by => {
                    timer.due = None;
                    ready.push((id, timer.entry.clone()));
                }
                Some(due) => next = Some(next.map_or(due.at, |next| next.min(due.at))),
                None => {}
            }
        }
        // Give back what a burst of locks left free at the end.
        let len = self.timers.len();
        while self.timers.last().is_some_and(Option::is_none) {
            self.timers.pop();
        }
        if self.timers.len() < len {
            let len = self.timers.len();
            self.free.retain(|&id| id < len);
        }
        (ready, next)
    }
}

impl Drop for Renewer {
    fn drop(&mut self) {
        // Let the task see that the renewer is gone, and end.
        self.wake.notify_one();
    }
}

/// A registry's identity (its shared state, weakly: the renewers do not
/// keep it alive).
type RegistryId = Weak<dyn Send + Sync>;

thread_local! {
    /// This thread's renewers, one per registry.
    static RENEWERS: RefCell<Vec<(RegistryId, Arc<Renewer>)>> = const { RefCell::new(Vec::new()) };
}

impl Renewer {
    /// This thread's renewer for the registry whose identity is `owner`.
    pub(super) fn for_this_thread(owner: &RegistryId) -> Arc<Renewer> {
        RENEWERS.with(|renewers| {
            let mut renewers = renewers.borrow_mut();
            if let Some((_, renewer)) = renewers
                .iter()
                .find(|(registry, _)| std::ptr::addr_eq(registry.as_ptr(), owner.as_ptr()))
            {
                return renewer.clone();
            }
            // A new registry on this thread: the renewers of registries
            // gone since go now (their tasks end with them).
            renewers.retain(|(registry, _)| registry.strong_count() > 0);
            let renewer = Arc::new(Renewer {
                state: Mutex::default(),
                wake: Arc::new(Notify::new()),
                returned: Notify::new(),
                #[cfg(test)]
                wakes: Default::default(),
                #[cfg(test)]
                reuses: Default::default(),
            });
            renewers.push((owner.clone(), renewer.clone()));
            renewer
        })
    }

    /// Gives `entry` a timer, due at `due`; its id.
    pub(super) fn add(self: &Arc<Self>, entry: Arc<Entry>, due: Due) -> usize {
        let mut slab = lock(&self.state);
        let timer = Some(Timer {
            entry,
            due: Some(due),
        });
        let Slab { timers, free, .. } = &mut *slab;
        let id = slots::put(timers, free, timer);
        self.plan(&mut slab, due.at);
        id
    }

    /// Makes the entry in timer `id` due at `due` (after a renewal).
    pub(super) fn schedule(self: &Arc<Self>, id: usize, entry: &Entry, due: Due) {
        let mut slab = lock(&self.state);
        // Stopped (its timer freed) under this lock: then the timer may be
        // another lease's.
        if entry.is_stopped() {
            return;
        }
        if let Some(Some(timer)) = slab.timers.get_mut(id) {
            timer.due = Some(due);
        }
        self.plan(&mut slab, due.at);
    }

    /// Wakes the task if it would look later than `due`.
    fn plan(self: &Arc<Self>, slab: &mut Slab, due: Instant) {
        // A task from a runtime that has shut down is gone: start another.
        let alive = slab.task.as_ref().is_some_and(|task| !task.is_finished());
        if !alive {
            slab.planned = Some(due);
            slab.task = Some(tokio::spawn(serve(Arc::downgrade(self), self.wake.clone())));
        } else if slab.planned.is_none_or(|planned| due < planned) {
            slab.planned = Some(due);
            #[cfg(test)]
            self.wakes.fetch_add(1, Ordering::SeqCst);
            self.wake.notify_one();
        }
    }

    /// Frees timer `id`.
    pub(super) fn remove(&self, id: usize) {
        let mut slab = lock(&self.state);
        if let Some(timer) = slab.timers.get_mut(id)
            && timer.take().is_some()
        {
            slab.free.push(id);
        }
    }
}

impl LossHome for Renewer {
    fn tell(&self, place: usize, signal: usize, reason: &'static str) {
        let entry = {
            let slab = lock(&self.state);
            match slab.timers.get(place) {
                Some(Some(timer))
                    if !timer.entry.is_stopped() && timer.entry.lease.has_signal(signal) =>
                {
                    timer.entry.clone()
                }
                // Released, or the place is another lease's now.
                _ => return,
            }
        };
        // Shared as a renewal in flight shares it: a release waiting for
        // the holder's state alone waits for this telling to end.
        let telling = Telling {
            renewer: self,
            entry: Some(entry),
        };
        if let Some(entry) = &telling.entry {
            entry.lease.lease_lost(reason);
        }
    }
}

/// An entry shared while its holder is told of a loss; gives it back as
/// [`Taken`](super::Taken) does.
struct Telling<'a> {
    renewer: &'a Renewer,
    entry: Option<Arc<Entry>>,
}

impl Drop for Telling<'_> {
    fn drop(&mut self) {
        drop(self.entry.take());
        self.renewer.returned.notify_waiters();
    }
}

/// The renewer's task: acts on due entries, then sleeps until the next one.
async fn serve(renewer: Weak<Renewer>, wake: Arc<Notify>) {
    let mut idle_since: Option<Instant> = None;
    // Whether a lock woke the task (rather than its own timer).
    let mut woken = false;
    loop {
        let Some(strong) = renewer.upgrade() else {
            return;
        };
        let now = Instant::now();
        let (ready, next) = {
            let mut slab = lock(&strong.state);
            let (ready, next) = slab.take_due(now);
            let next = match next {
                Some(due) => {
                    idle_since = None;
                    Some(due)
                }
                None => {
                    // A lock that woke the task counts as activity, even if
                    // it was released before the task looked: otherwise,
                    // once idle, every short lock would wake the task (two
                    // thread wake-ups per lock on a multi-thread runtime).
                    if woken {
                        idle_since = None;
                    }
                    let since = *idle_since.get_or_insert(now);
                    // Keep waking for a while, so locks taken meanwhile need
                    // not wake the task; then sleep until woken.
                    (now < since + IDLE_PERIOD).then(|| now + IDLE_PERIOD / 4)
                }
            };
            slab.planned = next;
            (ready, next)
        };
        for (id, entry) in ready {
            act(&strong, id, entry);
        }
        drop(strong);
        woken = match next {
            Some(next) => {
                tokio::select! {
                    () = sleep_until(next) => false,
                    () = wake.notified() => true,
                }
            }
            None => {
                wake.notified().await;
                true
            }
        };
    }
}
