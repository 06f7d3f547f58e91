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
//! [`Renewer`] per registry: a timer queue served by one task on that
//! thread's runtime (so a paused test clock is the clock it uses). Taking a
//! lock puts an entry in a free place of the queue's slab, releasing frees
//! the place: no ordered map, no hashing, and neither wakes the task unless
//! the entry is due before the task's next planned wake-up. The task, when
//! it wakes, looks at every entry (as many as locks held on this thread)
//! and plans its next wake-up at the earliest due. Only a renewal that is
//! actually due spawns a task, for its round trip.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::error::BackendError;
use crate::store::BoxFuture;
use crate::telemetry::reason;

/// How long the renewer task keeps waking on its own while idle, so that
/// locks taken meanwhile need not wake it.
const IDLE_LINGER: Duration = Duration::from_secs(1);

/// The lease a renewal looks after: renews it, and hears its verdict.
pub(crate) trait Renewable: Send + Sync {
    /// The key, for logs.
    fn key(&self) -> &str;
    /// Extends the lease in the store. `Ok(false)` when it is no longer ours.
    fn renew(&self) -> BoxFuture<'_, Result<bool, BackendError>>;
    /// The lease is lost, for `reason`.
    fn lose(&self, reason: &'static str);
    /// The lock's span, the parent of the renewal's events.
    fn span(&self) -> &tracing::Span;
    /// A renewal did not extend the lease (counted).
    fn renewal_failed(&self);
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
    /// When the acquire request was sent: the lease surely ends no later
    /// than `ttl` after it.
    pub(crate) acquired_at: Instant,
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

/// One lease in a renewer's queue.
struct Entry {
    schedule: Schedule,
    lease: Arc<dyn Renewable>,
    /// Set when the guard releases: no more renewals, no verdicts.
    stopped: AtomicBool,
    /// Until when the lease is known valid (local clock, margin deducted).
    valid_until: Mutex<Instant>,
}

impl Entry {
    fn interval(&self) -> Duration {
        (self.schedule.ttl / 3).max(Duration::from_millis(1))
    }

    fn stop_at(&self) -> Option<Instant> {
        self.schedule
            .max_hold
            .map(|max_hold| self.schedule.acquired_at + max_hold)
    }

    fn valid_until(&self) -> Instant {
        *lock(&self.valid_until)
    }

    fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// When to act next, after a renewal (or the acquire) at `base`.
    fn next_due(&self, base: Instant) -> Due {
        let valid_until = self.valid_until();
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
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section here is a single update: consistent after a panic.
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// A timer queue of leases, served by one task.
pub(crate) struct Renewer {
    state: Mutex<Queue>,
    wake: Arc<Notify>,
    /// How many times a lock woke the task.
    #[cfg(test)]
    wakes: std::sync::atomic::AtomicUsize,
}

#[derive(Default)]
struct Queue {
    /// The leases looked after, by id (the place); `None` where free.
    places: Vec<Option<Queued>>,
    /// The free places.
    free: Vec<usize>,
    /// When the task will look at the queue next on its own; `None` while it
    /// sleeps until woken.
    planned: Option<Instant>,
    task: Option<JoinHandle<()>>,
    /// How many times the task looked at the queue.
    #[cfg(test)]
    looks: usize,
}

/// A lease in its place.
struct Queued {
    entry: Arc<Entry>,
    /// When to act on it; `None` while its renewal is in flight.
    due: Option<Due>,
}

impl Queue {
    /// Takes the entries due at `now` (their renewals will be in flight);
    /// the earliest due of the rest.
    fn take_due(&mut self, now: Instant) -> (Vec<(usize, Arc<Entry>)>, Option<Instant>) {
        #[cfg(test)]
        {
            self.looks += 1;
        }
        let mut ready = Vec::new();
        let mut next: Option<Instant> = None;
        for (id, place) in self.places.iter_mut().enumerate() {
            let Some(queued) = place else { continue };
            match queued.due {
                Some(due) if due.at <= now + due.early_by => {
                    queued.due = None;
                    ready.push((id, queued.entry.clone()));
                }
                Some(due) => next = Some(next.map_or(due.at, |next| next.min(due.at))),
                None => {}
            }
        }
        // Give back what a burst of locks left free at the end.
        let len = self.places.len();
        while self.places.last().is_some_and(Option::is_none) {
            self.places.pop();
        }
        if self.places.len() < len {
            let len = self.places.len();
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

thread_local! {
    /// This thread's renewers, one per registry (told apart by `owner`).
    static RENEWERS: RefCell<Vec<(Weak<()>, Arc<Renewer>)>> = const { RefCell::new(Vec::new()) };
}

impl Renewer {
    /// This thread's renewer for the registry whose liveness `owner` tracks.
    fn for_this_thread(owner: &Arc<()>) -> Arc<Renewer> {
        RENEWERS.with(|renewers| {
            let mut renewers = renewers.borrow_mut();
            renewers.retain(|(registry, _)| registry.strong_count() > 0);
            if let Some((_, renewer)) = renewers.iter().find(|(registry, _)| {
                registry
                    .upgrade()
                    .is_some_and(|registry| Arc::ptr_eq(&registry, owner))
            }) {
                return renewer.clone();
            }
            let renewer = Arc::new(Renewer {
                state: Mutex::default(),
                wake: Arc::new(Notify::new()),
                #[cfg(test)]
                wakes: Default::default(),
            });
            renewers.push((Arc::downgrade(owner), renewer.clone()));
            renewer
        })
    }

    /// Gives `entry` a place, due at `due`; its id.
    fn add(self: &Arc<Self>, entry: Arc<Entry>, due: Due) -> usize {
        let mut queue = lock(&self.state);
        let queued = Some(Queued {
            entry,
            due: Some(due),
        });
        let id = match queue.free.pop() {
            Some(id) => {
                queue.places[id] = queued;
                id
            }
            None => {
                queue.places.push(queued);
                queue.places.len() - 1
            }
        };
        self.plan(&mut queue, due.at);
        id
    }

    /// Makes the entry in place `id` due at `due` (after a renewal).
    fn schedule(self: &Arc<Self>, id: usize, entry: &Entry, due: Due) {
        let mut queue = lock(&self.state);
        // Stopped (its place freed) under this lock: then the place may be
        // another lease's.
        if entry.is_stopped() {
            return;
        }
        if let Some(Some(queued)) = queue.places.get_mut(id) {
            queued.due = Some(due);
        }
        self.plan(&mut queue, due.at);
    }

    /// Wakes the task if it would look later than `due`.
    fn plan(self: &Arc<Self>, queue: &mut Queue, due: Instant) {
        // A task from a runtime that has shut down is gone: start another.
        let alive = queue.task.as_ref().is_some_and(|task| !task.is_finished());
        if !alive {
            queue.planned = Some(due);
            queue.task = Some(tokio::spawn(serve(Arc::downgrade(self), self.wake.clone())));
        } else if queue.planned.is_none_or(|planned| due < planned) {
            queue.planned = Some(due);
            #[cfg(test)]
            self.wakes.fetch_add(1, Ordering::SeqCst);
            self.wake.notify_one();
        }
    }

    /// Frees place `id`.
    fn remove(&self, id: usize) {
        let mut queue = lock(&self.state);
        if let Some(place) = queue.places.get_mut(id)
            && place.take().is_some()
        {
            queue.free.push(id);
        }
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
            let mut queue = lock(&strong.state);
            let (ready, next) = queue.take_due(now);
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
                    (now < since + IDLE_LINGER).then(|| now + IDLE_LINGER / 4)
                }
            };
            queue.planned = next;
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

/// An entry is due: lose it, or renew it in a task of its own.
fn act(renewer: &Arc<Renewer>, id: usize, entry: Arc<Entry>) {
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
    let renewer = renewer.clone();
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
                *lock(&entry.valid_until) = sent_at + entry.schedule.valid_for;
                let due = entry.next_due(sent_at);
                renewer.schedule(id, &entry, due);
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
                renewer.schedule(id, &entry, retry);
            }
            Err(_) => {
                entry.lease.renewal_failed();
                entry.lose(reason::LATE);
            }
        }
    });
}

/// The renewal of one held lease; stopping it (or dropping it) ends it.
pub(crate) struct Renewal {
    renewer: Arc<Renewer>,
    id: usize,
    entry: Arc<Entry>,
}

impl Renewal {
    /// Starts looking after `lease` on `schedule`; when it is lost, its
    /// [`Renewable::lose`] is called. `owner` identifies the registry.
    pub(crate) fn start(owner: &Arc<()>, schedule: Schedule, lease: Arc<dyn Renewable>) -> Renewal {
        let renewer = Renewer::for_this_thread(owner);
        let acquired_at = schedule.acquired_at;
        let entry = Arc::new(Entry {
            valid_until: Mutex::new(acquired_at + schedule.valid_for),
            schedule,
            lease,
            stopped: AtomicBool::new(false),
        });
        let due = entry.next_due(acquired_at);
        let id = renewer.add(entry.clone(), due);
        Renewal { renewer, id, entry }
    }

    /// Stops renewing; no verdict is given after this.
    pub(crate) fn stop(&self) {
        if !self.entry.stopped.swap(true, Ordering::SeqCst) {
            self.renewer.remove(self.id);
        }
    }
}

impl Drop for Renewal {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lease that is always renewed, counting its renewals and losses.
    struct Held {
        span: tracing::Span,
        renewals: Arc<std::sync::atomic::AtomicUsize>,
        losses: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Default for Held {
        fn default() -> Self {
            Held {
                span: tracing::Span::none(),
                renewals: Arc::default(),
                losses: Arc::default(),
            }
        }
    }

    impl Renewable for Held {
        fn key(&self) -> &str {
            "k"
        }

        fn renew(&self) -> BoxFuture<'_, Result<bool, BackendError>> {
            self.renewals.fetch_add(1, Ordering::SeqCst);
            Box::pin(async { Ok(true) })
        }

        fn lose(&self, _: &'static str) {
            self.losses.fetch_add(1, Ordering::SeqCst);
        }

        fn span(&self) -> &tracing::Span {
            &self.span
        }

        fn renewal_failed(&self) {}
    }

    /// A 30 s lease taken now, renewed every 10 s.
    fn schedule() -> Schedule {
        Schedule {
            ttl: Duration::from_secs(30),
            valid_for: Duration::from_secs(29),
            renew: true,
            max_hold: None,
            acquired_at: Instant::now(),
        }
    }

    fn hold(owner: &Arc<()>) -> Renewal {
        Renewal::start(owner, schedule(), Arc::new(Held::default()))
    }

    /// Short locks taken after the renewer went idle wake its task once,
    /// not once each (each wake-up costs thread wake-ups on a multi-thread
    /// runtime: two futex calls per lock, before this was fixed).
    #[tokio::test(start_paused = true)]
    async fn short_locks_after_an_idle_spell_wake_the_task_once() {
        let owner = Arc::new(());
        let first = hold(&owner);
        let renewer = first.renewer.clone();
        first.stop();
        drop(first);
        // Idle for longer than the task lingers.
        tokio::time::sleep(IDLE_LINGER * 3).await;
        let before = renewer.wakes.load(Ordering::SeqCst);
        for _ in 0..100 {
            let lock = hold(&owner);
            lock.stop();
            drop(lock);
            // The task runs after the release (on a multi-thread runtime,
            // on another thread meanwhile), and finds the queue empty.
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let wakes = renewer.wakes.load(Ordering::SeqCst) - before;
        assert!(wakes <= 1, "{wakes} wake-ups for 100 short locks");
    }

    /// Places freed by releases are taken again, the task renews what is
    /// still held (and only that), and the places a burst left free at the
    /// end of the slab are given back when the task next looks.
    #[tokio::test(start_paused = true)]
    async fn freed_places_are_taken_again_and_a_burst_gives_them_back() {
        let owner = Arc::new(());
        let burst: Vec<Renewal> = (0..64).map(|_| hold(&owner)).collect();
        let renewer = burst[0].renewer.clone();
        let places = || lock(&renewer.state).places.len();
        assert_eq!(places(), 64);
        for renewal in &burst[1..] {
            renewal.stop();
        }
        // Freed places are taken again before the slab grows.
        let again = hold(&owner);
        assert_eq!(places(), 64, "a freed place was taken");
        again.stop();
        drop(again);
        // The first lock is still held: the task renews it at ttl / 3,
        // and gives back the free places past it.
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert_eq!(places(), 1, "the burst's places were given back");
        let held = lock(&renewer.state).places[0]
            .as_ref()
            .and_then(|queued| queued.due)
            .expect("the held lock is queued again after its renewal");
        assert!(held.at > Instant::now(), "its next renewal is ahead");
        drop(burst);
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert_eq!(places(), 0);
    }

    /// Many leases taken at different times: the task renews them in
    /// batches (each may go a sixteenth of its interval early), so it looks
    /// at the queue a few times per interval, not once per lease (each look
    /// reads every place), and every lease is still renewed in time.
    #[tokio::test(start_paused = true)]
    async fn many_leases_are_renewed_in_batches() {
        let owner = Arc::new(());
        let held = Held::default();
        let (renewals, losses) = (held.renewals.clone(), held.losses.clone());
        let held: Arc<dyn Renewable> = Arc::new(held);
        let mut leases = Vec::new();
        for _ in 0..1_000 {
            leases.push(Renewal::start(&owner, schedule(), held.clone()));
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let renewer = leases[0].renewer.clone();
        let before = lock(&renewer.state).looks;
        // Three intervals: every lease is due three times.
        tokio::time::sleep(Duration::from_secs(30)).await;
        let looks = lock(&renewer.state).looks - before;
        let renewed = renewals.load(Ordering::SeqCst);
        assert!(renewed >= 3 * 1_000, "{renewed} renewals of 1000 leases");
        assert_eq!(losses.load(Ordering::SeqCst), 0, "a lease was lost");
        assert!(looks <= 60, "the task looked {looks} times");
        for lease in &leases {
            lease.stop();
        }
    }
}
