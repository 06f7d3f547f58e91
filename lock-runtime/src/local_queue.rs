//! The local queue: one per key that tasks of this registry hold or wait
//! for, so that only as many tasks as the store could grant at once (one
//! for an exclusive claim, `limit` for a semaphore's permits) contend in
//! the store, the others waiting here in order; and both ends of the
//! in-process hand-over, which passes an exclusive lease along that queue.
//! A queue nobody is in stays for its key's next lock until the map has
//! doubled, so a key locked again costs one lookup and no allocation.
//!
//! A holder (of the key, or of one of a semaphore's permits) that releases
//! while other tasks of its process queue behind it asks the store to move
//! the lease to a new token ([`Lease::hand_over`]), one round trip instead
//! of a release and an acquire, and leaves the [`Grant`] for the next task,
//! which takes it up at the front of the queue. Where the lease issues the
//! next task's fencing token at once ([`Lease::fencing_token`]: the memory
//! store), the holder passes its whole hold on instead, lease, renewal and
//! loss signal as they are ([`Leased::Carried`]), and the store is asked
//! for nothing more. At most [`MAX_HAND_OVERS`] in a row while anyone
//! else may be waiting for the key, so they get their turn
//! ([`next_in_chain`]). A grant left behind for a waiter that went away is
//! released.

use std::any::Any;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::LockError;
use crate::store::common::keyed::{HashedKey, KeyHashing, KeyMap};
use crate::store::common::slots;
use crate::store::{HandOver, Lease, LossSignal};

/// How many times in a row a lease may be handed to the next task of this
/// process while others may be waiting for its key, before it is released
/// in the store so that they get their turn.
pub(crate) const MAX_HAND_OVERS: u32 = 8;

/// Whether `lease`, handed on `chain` times in a row, may be handed on
/// once more, and then the count its next holder carries: up to
/// [`MAX_HAND_OVERS`] times in a row; past that, only if nobody outside
/// this process's queue may be waiting for its key
/// ([`Lease::others_may_wait`]), the count then starting again, so that
/// one who comes later waits as long at most. `None`: the lease goes back
/// to the store.
pub(crate) fn next_in_chain(chain: u32, lease: &dyn Lease) -> Option<u32> {
    if chain < MAX_HAND_OVERS {
        Some(chain + 1)
    } else if !lease.others_may_wait() {
        Some(1)
    } else {
        None
    }
}

/// The local queues of one registry, by full key.
#[derive(Clone, Default)]
pub(crate) struct LocalQueues {
    map: Arc<Mutex<Queues>>,
    /// The map's hashing: each key is hashed once per lock.
    hashing: KeyHashing,
}

/// Below this many queues the map is never swept.
const SWEEP_FLOOR: usize = 1024;

#[derive(Default)]
struct Queues {
    /// The queues by key, those nobody holds or waits in included: a key
    /// taken again finds its queue in one lookup, and leaving it is a
    /// count. Idle ones are dropped when the map has doubled since the
    /// last sweep.
    map: KeyMap<Arc<KeyQueue>>,
    /// How many queues the map may hold before the next sweep.
    sweep_at: usize,
    /// The queues the last sweep dropped, idle, for new keys to take
    /// rather than allocate one each.
    spare: Vec<Arc<KeyQueue>>,
}

impl Queues {
    /// A queue for `key`, `width` tasks wide: the spare one if nobody
    /// else has it any more, else a new one.
    fn fresh(spare: &mut Vec<Arc<KeyQueue>>, key: &HashedKey, width: u32) -> Arc<KeyQueue> {
        let fresh = KeyQueue::new(key.clone(), width);
        match spare.pop() {
            Some(mut queue) => match Arc::get_mut(&mut queue) {
                Some(idle) => {
                    *idle = fresh;
                    queue
                }
                None => Arc::new(fresh),
            },
            None => Arc::new(fresh),
        }
    }

    /// Joins `queue` (in the map, whose lock the caller holds), made anew
    /// for `width` if it is idle and of another width; `None` if it is in
    /// use with another width.
    fn enter(
        queue: &mut Arc<KeyQueue>,
        spare: &mut Vec<Arc<KeyQueue>>,
        width: u32,
    ) -> Option<QueueMember> {
        if queue.width != width {
            // An idle queue of a claim of another width: the key is this
            // claim's now.
            if !queue.retire_if_idle() {
                return None;
            }
            *queue = Queues::fresh(spare, &queue.key, width);
        }
        // Counted under the map's lock, which a sweep holds.
        let ahead = queue.users.fetch_add(1, Ordering::AcqRel);
        Some(QueueMember::new(queue.clone(), ahead))
    }

    /// Takes the idle queues out of the map once it has doubled since
    /// the last sweep, keeping them for new keys: a process that locks a
    /// new key each time reuses them, and holds at most twice the queues
    /// it uses at once.
    fn sweep(&mut self) {
        if self.map.len() < self.sweep_at.max(SWEEP_FLOOR) {
            return;
        }
        let spare = &mut self.spare;
        spare.clear();
        self.map.retain(|_, queue| {
            let idle = queue.retire_if_idle();
            if idle {
                spare.push(queue.clone());
            }
            !idle
        });
        self.sweep_at = self.map.len() * 2;
    }
}

impl LocalQueues {
    /// Gets or creates the queue for `full_key`, `width` tasks wide (how
    /// many may hold the key at once), and joins it; `None` when the key's
    /// queue is of another width (claims that do not match: the store
    /// answers them). A key with a queue (held, or locked before and not
    /// yet swept) is looked up as given; only a new one is copied.
    pub(crate) fn join(&self, full_key: &str, width: u32) -> Option<QueueMember> {
        if let Some(member) = self.join_last(full_key, width) {
            return Some(member);
        }
        let member = self.join_in_map(full_key, width)?;
        if let Some(queue) = &member.queue {
            LAST_JOINED.with(|last| {
                let Ok(mut last) = last.try_borrow_mut() else {
                    return;
                };
                match &mut *last {
                    // The same map: only the queue changes, and the map's
                    // weak count, which every thread shares, is left alone.
                    Some((map, last_queue))
                        if std::ptr::eq(map.as_ptr(), Arc::as_ptr(&self.map)) =>
                    {
                        *last_queue = queue.clone();
                    }
                    last => *last = Some((Arc::downgrade(&self.map), queue.clone())),
                }
            });
        }
        Some(member)
    }

    /// Joins the queue this thread last joined, without the map, if it is
    /// this registry's queue for `full_key` at `width` and still in the
    /// map.
    fn join_last(&self, full_key: &str, width: u32) -> Option<QueueMember> {
        LAST_JOINED.with(|last| {
            let last = last.try_borrow().ok()?;
            let (map, queue) = last.as_ref()?;
            if !std::ptr::eq(map.as_ptr(), Arc::as_ptr(&self.map))
                || queue.width != width
                || **queue.key.key() != *full_key
            {
                return None;
            }
            let ahead = queue.join_unlisted()?;
            Some(QueueMember::new(queue.clone(), ahead))
        })
    }

    /// Joins `full_key`'s queue through the map.
    fn join_in_map(&self, full_key: &str, width: u32) -> Option<QueueMember> {
        let probe = self.hashing.probe(full_key);
        let mut queues = self.queues();
        // Before the lookup, so a key's queue is looked up once; a sweep
        // that took this key's idle queue out is answered by a fresh one.
        queues.sweep();
        let Queues { map, spare, .. } = &mut *queues;
        if let Some(queue) = map.get_mut(probe.as_dyn()) {
            return Queues::enter(queue, spare, width);
        }
        let queue = map
            .entry(probe.to_owned_key())
            .or_insert_with_key(|key| Queues::fresh(spare, key, width));
        Queues::enter(queue, spare, width)
    }

    /// How many keys have a queue somebody holds or waits in.
    pub(crate) fn len(&self) -> usize {
        self.queues()
            .map
            .values()
            .filter(|queue| queue.users.load(Ordering::Relaxed) > 0)
            .count()
    }

    /// How many tasks hold or wait for `full_key` in this registry.
    pub(crate) fn queued(&self, full_key: &str) -> usize {
        let probe = self.hashing.probe(full_key);
        self.queues()
            .map
            .get(probe.as_dyn())
            .map_or(0, |queue| queue.users.load(Ordering::Relaxed))
    }

    fn queues(&self) -> MutexGuard<'_, Queues> {
        // Every update under this lock is a single map operation, so the map
        // is consistent even if a holder panicked.
        self.map.lock().unwrap_or_else(|poison| poison.into_inner())
    }
}

/// A lease the store granted (to an acquire, or by a hand-over), on its
/// way to the guard that will hold it.
#[derive(Debug)]
pub(crate) struct Grant {
    pub(crate) lease: Leased,
    /// The fencing token; `None` until the holder asks the lease for it
    /// ([`Lease::fencing_token`]).
    pub(crate) fencing: Option<u64>,
    pub(crate) ttl: Duration,
    /// When the lease started: when the request that granted (or last
    /// extended) it was sent, or earlier if the store says it started
    /// counting before ([`Lease::started_at`]). Good for `ttl` from then.
    pub(crate) started_at: Instant,
    /// How many hand-overs in a row led to it.
    pub(crate) chain: u32,
}

/// What a grant holds its key with.
#[derive(Debug)]
pub(crate) enum Leased {
    /// A lease the store answered (to an acquire, or moved by a
    /// hand-over), with the loss signal its holder is to hear.
    Store(Box<dyn Lease>, LossSignal),
    /// The previous task's whole hold, passed on as it is: its lease still
    /// renewed, its loss still heard.
    Carried(Box<dyn PassedOn>),
}

/// A whole hold passed on as it is from one task of this process to the
/// next: made and taken over by the guard. Dropped before a task takes it
/// over, it releases its lease, as a dropped guard does.
pub(crate) trait PassedOn: Send + fmt::Debug {
    /// Releases the lease, for a task that does not take the hold over
    /// (its options differ, or the lease was lost on the way).
    fn release(self: Box<Self>) -> Pin<Box<dyn Future<Output = Result<(), LockError>> + Send>>;

    /// The hold, for the guard to take over.
    fn into_any(self: Box<Self>) -> Box<dyn Any + Send>;

    /// Whether the hold's loss was raised on the way.
    fn is_lost(&self) -> bool;
}

impl Grant {
    /// A lease the store granted to an acquire (no hand-over before it).
    pub(crate) fn new(
        lease: Box<dyn Lease>,
        loss: LossSignal,
        fencing: Option<u64>,
        ttl: Duration,
        started_at: Instant,
    ) -> Grant {
        Grant {
            lease: Leased::Store(lease, loss),
            fencing,
            ttl,
            started_at,
            chain: 0,
        }
    }

    /// Whether the lease's loss was raised since it was granted.
    pub(crate) fn is_lost(&self) -> bool {
        match &self.lease {
            Leased::Store(_, loss) => loss.is_raised(),
            Leased::Carried(carried) => carried.is_lost(),
        }
    }
}

/// A queue joined through a map, and the map (weakly, so its address
/// names it while this is kept).
type Joined = (Weak<Mutex<Queues>>, Arc<KeyQueue>);

thread_local! {
    /// The queue this thread's last lock joined through its registry's
    /// map: a task that locks the same key again, the common case, joins
    /// it without the map's lock, hash and lookup.
    static LAST_JOINED: RefCell<Option<Joined>> = const { RefCell::new(None) };
}

/// One key's queue, and the lease handed along it.
struct KeyQueue {
    /// The full key, as the map holds it (with its hash, to leave it
    /// without hashing it again).
    key: HashedKey,
    /// How many of its tasks may hold the key at once (its turns), fixed
    /// by the task that made the queue.
    width: u32,
    /// The tasks that hold or wait for the key, which is also how the
    /// turns go: a task that joins with fewer than `width` ahead of it
    /// has a turn at once, and a holder that leaves with more than `width`
    /// in the queue passes its turn to a waiter ([`Waiting`]); so the
    /// uncontended lock and release are one count each. Joining counts
    /// under the map's lock (which a sweep holds), or through
    /// [`KeyQueue::join_unlisted`]; leaving without it.
    users: AtomicUsize,
    /// The waiters and the turns on their way to them: only a contended
    /// key takes this lock.
    waiting: Mutex<Waiting>,
    /// The leases handed over for the next holders, until they take them
    /// up: at most one per turn (`width`).
    handed: Mutex<Vec<Grant>>,
    /// Whether `handed` holds any: set under its lock, read without.
    has_handed: AtomicBool,
    /// Set by a holder whose release ended a chain of hand-overs for
    /// others waiting for the key: the next task to take the turn yields
    /// once, so that the waiters the release woke can go first
    /// ([`LocalTurn::others_first`]).
    others_first: AtomicBool,
    /// Set while the map takes the queue out (a sweep, or a claim of
    /// another width taking the key over), and for good once it has: a
    /// task joining without the map ([`KeyQueue::join_unlisted`]) counts
    /// itself in `users`, then looks here; the map sets this, then looks
    /// at `users`. Both in that order, sequentially consistent: one of
    /// them sees the other, so no task joins a queue the map has dropped.
    retired: AtomicBool,
}

impl KeyQueue {
    fn new(key: HashedKey, width: u32) -> Self {
        KeyQueue {
            key,
            width,
            users: AtomicUsize::new(0),
            waiting: Mutex::default(),
            handed: Mutex::new(Vec::new()),
            has_handed: AtomicBool::new(false),
            others_first: AtomicBool::new(false),
            retired: AtomicBool::new(false),
        }
    }

    /// Marks the queue taken out of the map if nobody is in it (the map's
    /// lock held); `false`, and the queue left as it was, if somebody is.
    fn retire_if_idle(&self) -> bool {
        self.retired.store(true, Ordering::SeqCst);
        if self.users.load(Ordering::SeqCst) == 0 {
            return true;
        }
        self.retired.store(false, Ordering::SeqCst);
        false
    }

    /// Counts a user in without the map's lock: how many were in it
    /// before; `None` (and counted out again) if the map has taken the
    /// queue out, or is taking it out now.
    fn join_unlisted(self: &Arc<Self>) -> Option<usize> {
        let ahead = self.users.fetch_add(1, Ordering::SeqCst);
        if !self.retired.load(Ordering::SeqCst) {
            return Some(ahead);
        }
        // Counted out as a member leaves, with the turn the count gave it
        // or as a waiter.
        if ahead < self.width as usize {
            self.leave_holding();
        } else {
            self.leave_waiting(None);
        }
        None
    }

    fn waiting(&self) -> MutexGuard<'_, Waiting> {
        // Every update under this lock leaves the counts consistent: safe
        // to use after a panic.
        self.waiting
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// A holder leaves, giving its turn up: to the first waiter if more
    /// than `width` were in the queue (one of them waits, or is about to).
    fn leave_holding(&self) {
        if self.count_out_holder() {
            self.pass_turn();
        }
    }

    /// Counts a holder out: whether its turn is to be passed on (more than
    /// `width` were in the queue).
    #[inline]
    fn count_out_holder(&self) -> bool {
        let before = self.users.fetch_sub(1, Ordering::AcqRel);
        if before == 1 {
            self.release_left_behind();
        }
        before > self.width as usize
    }

    /// Passes a turn, counted out already, on to the waiters.
    fn pass_turn(&self) {
        let woken = self.waiting().pass_turn();
        if let Some(waker) = woken {
            waker.wake();
        }
    }

    /// A waiter leaves without its turn (it gave up waiting, or skips):
    /// `waiter` is its place among the waiters, if it took one. If a turn
    /// was passed to it meanwhile, it leaves as a holder, passing the turn
    /// on.
    fn leave_waiting(&self, waiter: Option<usize>) {
        let mut waiting = self.waiting();
        if let Some(waiter) = waiter
            && waiting.unregister(waiter)
        {
            drop(waiting);
            return self.leave_holding();
        }
        // Under the lock, so the turn on its way is taken back before it
        // can reach anyone.
        let before = self.users.fetch_sub(1, Ordering::AcqRel);
        if before <= self.width as usize {
            // Everyone left in the queue can hold the key at once: the
            // turn that was on its way to this waiter is nobody's.
            waiting.take_back_turn();
        }
        drop(waiting);
        if before == 1 {
            self.release_left_behind();
        }
    }

    /// The last user has left: the leases handed over to waiters that went
    /// away are released.
    fn release_left_behind(&self) {
        while let Some(handed) = self.take_handed() {
            release_in_background(handed);
        }
    }

    /// Takes a free turn, if there is one, without waiting: the member
    /// that has it.
    fn try_turn(self: &Arc<Self>) -> Option<QueueMember> {
        let ahead = self.users.fetch_add(1, Ordering::AcqRel);
        if ahead < self.width as usize {
            return Some(QueueMember::new(self.clone(), ahead));
        }
        self.leave_waiting(None);
        None
    }

    fn handed(&self) -> MutexGuard<'_, Vec<Grant>> {
        // Only `push` and `pop`: consistent after a panic.
        self.handed
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// After a hand-over, or a waiter leaving without its turn: a lease
    /// handed over that no waiter can take up (a turn is free, so none is
    /// queued for it) is released, rather than kept from other processes
    /// until the queue empties (a semaphore's other holders may keep it in
    /// use). A turn freed at that moment by another holder's release can
    /// make it take a grant whose waiter has its turn already: that waiter
    /// then asks the store itself, a round trip more.
    fn release_stranded(self: &Arc<Self>) {
        if !self.has_handed.load(Ordering::Acquire) {
            return;
        }
        // Holding a free turn while it looks: a grant found then is
        // nobody's.
        let Some(_turn) = self.try_turn() else {
            return;
        };
        if let Some(handed) = self.take_handed() {
            release_in_background(handed);
        }
    }

    /// Leaves `grant` for the next turn.
    fn put_handed(&self, grant: Grant) {
        let mut handed = self.handed();
        handed.push(grant);
        self.has_handed.store(true, Ordering::Release);
    }

    /// A grant an earlier turn left, if any; the common case (none) takes
    /// no lock.
    #[inline]
    fn take_handed(&self) -> Option<Grant> {
        if !self.has_handed.load(Ordering::Acquire) {
            return None;
        }
        let mut handed = self.handed();
        let grant = handed.pop();
        self.has_handed.store(!handed.is_empty(), Ordering::Relaxed);
        grant
    }
}

/// The waiters of one key's queue, first come first served, and the turns
/// on their way to them. A holder that leaves with more than `width` in
/// the queue passes its turn here after its count; a waiter counted in
/// before that may not have taken its place yet, so the turn waits for it
/// (`pending`), and a waiter that leaves without its turn when everyone
/// left could hold the key takes back the turn on its way to it
/// (`pending`, or `owed` while the holder passing it has not got here).
#[derive(Default)]
struct Waiting {
    /// The places of the waiters with no turn yet, in order.
    order: VecDeque<usize>,
    places: Vec<Place>,
    /// Places free for the next waiters.
    free: Vec<usize>,
    /// Turns passed on with no waiter to take them yet: the next waiter
    /// takes one without waiting.
    pending: usize,
    /// Turns taken back before the holders passing them got here: as many
    /// of the next turns passed on are dropped.
    owed: usize,
}

/// A waiter's place.
enum Place {
    Free,
    /// Waiting, to be woken with this.
    Waiting(Waker),
    /// Its turn was passed to it.
    Turn,
}

impl Waiting {
    /// A turn passed on by a holder that left: to the first waiter (its
    /// waker, to wake once the lock is let go), kept for the next one, or
    /// dropped if it was taken back.
    fn pass_turn(&mut self) -> Option<Waker> {
        if self.owed > 0 {
            self.owed -= 1;
            return None;
        }
        let Some(first) = self.order.pop_front() else {
            self.pending += 1;
            return None;
        };
        match std::mem::replace(&mut self.places[first], Place::Turn) {
            Place::Waiting(waker) => Some(waker),
            Place::Free | Place::Turn => unreachable!("only waiting places are in order"),
        }
    }

    /// A waiter left without its turn when its turn was on its way.
    fn take_back_turn(&mut self) {
        if self.pending > 0 {
            self.pending -= 1;
        } else {
            self.owed += 1;
        }
    }

    /// Whether the waiter at `place` has its turn, taking a place (or
    /// updating its waker) if not; `place` is the waiter's, once it has
    /// one. A turn is taken at once while one waits for a waiter
    /// (`pending`): then nobody is in order before it.
    fn poll_turn(&mut self, place: &mut Option<usize>, waker: &Waker) -> bool {
        let Some(at) = *place else {
            if self.pending > 0 {
                self.pending -= 1;
                return true;
            }
            let waiting = Place::Waiting(waker.clone());
            let at = slots::put(&mut self.places, &mut self.free, waiting);
            self.order.push_back(at);
            *place = Some(at);
            return false;
        };
        match &mut self.places[at] {
            Place::Turn => {
                self.places[at] = Place::Free;
                self.free.push(at);
                *place = None;
                true
            }
            Place::Waiting(known) => {
                if !known.will_wake(waker) {
                    *known = waker.clone();
                }
                false
            }
            Place::Free => unreachable!("a waiter's place is freed only as it leaves it"),
        }
    }

    /// A waiter leaves its place: whether its turn had been passed to it.
    fn unregister(&mut self, at: usize) -> bool {
        let had_turn = match std::mem::replace(&mut self.places[at], Place::Free) {
            Place::Turn => true,
            Place::Waiting(_) => {
                self.order.retain(|&waiting| waiting != at);
                false
            }
            Place::Free => unreachable!("a waiter's place is freed only as it leaves it"),
        };
        self.free.push(at);
        had_turn
    }
}

/// Releases a grant nobody takes up, rather than let it keep other
/// processes out until its ttl.
fn release_in_background(grant: Grant) {
    match grant.lease {
        Leased::Store(mut lease, _) => {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = lease.release(Duration::ZERO).await;
                });
            }
        }
        // Releases itself as it is dropped.
        Leased::Carried(carried) => drop(carried),
    }
}

/// A task in one key's queue, with its turn or waiting for it; leaves
/// it when dropped.
pub(crate) struct QueueMember {
    /// The queue; `None` once the member has left it (a turn's, on its
    /// drop).
    queue: Option<Arc<KeyQueue>>,
    /// Whether it has a turn: it joined with fewer than the queue's width
    /// ahead of it, or a holder passed it one.
    has_turn: bool,
    /// Its place among the waiters, while it has one.
    place: Option<usize>,
}

impl QueueMember {
    /// A member that joined `queue` with `ahead` users in it before.
    fn new(queue: Arc<KeyQueue>, ahead: usize) -> QueueMember {
        QueueMember {
            has_turn: ahead < queue.width as usize,
            queue: Some(queue),
            place: None,
        }
    }

    fn queue(&self) -> &KeyQueue {
        // Taken only by `leave`, on the way out.
        self.queue
            .as_deref()
            .expect("a local queue used after it left")
    }

    /// Waits for the front of the queue.
    pub(crate) async fn lock(mut self) -> LocalTurn {
        // Dropped while waiting, `self` leaves the queue, passing on a turn
        // passed to it meanwhile.
        if !self.has_turn {
            std::future::poll_fn(|cx| self.poll_turn(cx)).await;
        }
        LocalTurn::Queued(self)
    }

    fn poll_turn(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let queue = self
            .queue
            .as_deref()
            .expect("a local queue used after it left");
        if queue.waiting().poll_turn(&mut self.place, cx.waker()) {
            self.has_turn = true;
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// The front of the queue if nobody is ahead; else the member back.
    #[inline]
    pub(crate) fn try_lock(self) -> Result<LocalTurn, QueueMember> {
        if self.has_turn {
            Ok(LocalTurn::Queued(self))
        } else {
            Err(self)
        }
    }

    /// Leaves the queue, giving up its turn or its place among the
    /// waiters; the queue back, and whether the member had its turn,
    /// unless it had left already.
    fn leave(&mut self) -> Option<(Arc<KeyQueue>, bool)> {
        let queue = self.queue.take()?;
        if self.has_turn {
            queue.leave_holding();
        } else {
            queue.leave_waiting(self.place.take());
        }
        Some((queue, self.has_turn))
    }
}

impl Drop for QueueMember {
    fn drop(&mut self) {
        // Still in the queue (a turn's member has left by now): it leaves
        // with its turn or its place among the waiters. One that never had
        // its turn may leave a lease handed over for it stranded.
        if let Some((queue, false)) = self.leave() {
            queue.release_stranded();
        }
    }
}

/// The front of one key's queue: held from there until the lease is
/// released (or handed over). A claim many may hold at once (a share, a
/// permit of a semaphore) does not queue: its turn is outside every queue,
/// and the store alone decides.
pub(crate) enum LocalTurn {
    /// At the front of its key's queue, whose key it reads.
    Queued(QueueMember),
    /// Outside every queue, with its full key.
    Unqueued(Arc<str>),
}

impl Drop for LocalTurn {
    fn drop(&mut self) {
        self.give_up();
    }
}

impl LocalTurn {
    /// Leaves the queue and gives the turn back; the queue, unless the
    /// turn was given up already (or is outside every queue).
    fn give_up(&mut self) -> Option<Arc<KeyQueue>> {
        // Leaves before the next local waiter goes ahead, so the new
        // holder's `has_waiters` counts only real waiters, not this turn
        // (it would hand its lease over to nobody). The turn goes back
        // also when nobody waits: the queue stays for the key's next lock.
        let LocalTurn::Queued(member) = self else {
            return None;
        };
        member.leave().map(|(queue, _)| queue)
    }

    /// The queue this turn is at the front of, if any.
    fn member(&self) -> Option<&QueueMember> {
        match self {
            LocalTurn::Queued(member) => Some(member),
            LocalTurn::Unqueued(_) => None,
        }
    }

    /// The full key, shared.
    #[inline]
    pub(crate) fn key(&self) -> &Arc<str> {
        match self {
            LocalTurn::Queued(member) => member.queue().key.key(),
            LocalTurn::Unqueued(key) => key,
        }
    }

    /// Whether other tasks of this process wait behind this turn (more
    /// are in the queue than it has turns), one of whom a hand-over can
    /// go to.
    #[inline]
    pub(crate) fn has_waiters(&self) -> bool {
        self.member().is_some_and(|member| {
            let queue = member.queue();
            queue.users.load(Ordering::Relaxed) > queue.width as usize
        })
    }

    /// Gives the turn up after a release in the store that ended a chain
    /// of hand-overs because others may be waiting for the key
    /// ([`next_in_chain`]): the next task of this process to take the turn
    /// yields once, so that they can go first.
    pub(crate) fn give_up_for_others(self) {
        if let Some(member) = self.member() {
            member.queue().others_first.store(true, Ordering::Release);
        }
    }

    /// Whether the task taking this turn, which waited for it, is to
    /// yield once first, for others waiting for the key
    /// ([`LocalTurn::give_up_for_others`]): only the first task after such
    /// a release.
    #[inline]
    pub(crate) fn others_first(&self) -> bool {
        self.member().is_some_and(|member| {
            let flag = &member.queue().others_first;
            flag.load(Ordering::Acquire) && flag.swap(false, Ordering::AcqRel)
        })
    }

    /// Takes up the lease the previous holder handed over, if any.
    #[inline]
    pub(crate) fn take_handed(&self) -> Option<Grant> {
        self.member()?.queue().take_handed()
    }

    /// Leaves `grant`, a lease the store has just moved to a new token
    /// for the next holder ([`Lease::hand_over`]), for the next task in
    /// the queue, and gives this turn up: [`HandOver::Moved`] with the
    /// grant's fencing token. A turn outside every queue has nobody to
    /// pass it to (it is never asked: it has no waiters): the grant is
    /// dropped, and the answer is [`HandOver::Released`].
    pub(crate) fn pass_on(mut self, grant: Grant) -> HandOver {
        let fencing = grant.fencing;
        tracing::debug!(key = %self.key(), fencing, "lock handed over within this process");
        let Some(member) = self.member() else {
            return HandOver::Released;
        };
        member.queue().put_handed(grant);
        // The turn goes to the next waiter, unless the one this was for
        // gave up while the store moved the lease and none is left.
        if let Some(queue) = self.give_up() {
            queue.release_stranded();
        }
        HandOver::Moved { fencing }
    }
}

impl fmt::Debug for LocalTurn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalTurn")
            .field("key", &self.key())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: usize) -> Arc<str> {
        format!("k:{i}").into()
    }

    #[test]
    fn an_idle_queue_stays_for_its_key_and_the_map_keeps_at_most_twice_what_is_in_use() {
        let queues = LocalQueues::default();
        let held = queues.join(&key(0), 1).expect("a queue").try_lock().ok();
        assert!(held.is_some(), "nobody is ahead");
        // A key locked and released again finds its own queue.
        for _ in 0..3 {
            let turn = queues.join(&key(1), 1).unwrap().try_lock().ok().unwrap();
            drop(turn);
        }
        let first = queues.queues().map.len();
        assert_eq!(first, 2, "the idle queue stays");
        assert_eq!(queues.len(), 1, "only the held key counts");
        // New keys, each locked once: the map is swept when it doubles,
        // and the swept queues serve the keys after them.
        for i in 2..10 * SWEEP_FLOOR {
            drop(queues.join(&key(i), 1).unwrap().try_lock().ok().unwrap());
        }
        let inner = queues.queues();
        assert!(
            inner.map.len() <= 2 * SWEEP_FLOOR,
            "{} queues",
            inner.map.len()
        );
        assert!(inner.map.len() + inner.spare.len() <= 2 * SWEEP_FLOOR + 1);
        drop(inner);
        assert_eq!(queues.len(), 1);
        assert_eq!(queues.queued(&key(0)), 1, "the held key's queue was kept");
        drop(held);
        assert_eq!(queues.len(), 0);
    }

    #[test]
    fn a_queue_the_map_dropped_is_not_joined_again_from_the_last_join() {
        let queues = LocalQueues::default();
        // This thread's last join is key 0's queue, now idle.
        drop(queues.join(&key(0), 1).unwrap().try_lock().ok().unwrap());
        // Another thread fills the map until sweeps drop key 0's queue.
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for i in 1..4 * SWEEP_FLOOR {
                    drop(queues.join(&key(i), 1).unwrap().try_lock().ok().unwrap());
                }
            });
        });
        assert_eq!(queues.queued(&key(0)), 0);
        let held = queues.join(&key(0), 1).unwrap().try_lock().ok().unwrap();
        // Joined through the map: the map's queue for the key counts it, so
        // another task of the registry queues behind it.
        assert_eq!(queues.queued(&key(0)), 1);
        assert!(queues.join(&key(0), 1).unwrap().try_lock().is_err());
        drop(held);
        // A key locked again joins its queue from the last join, counted
        // where the map sees it.
        let again = queues.join(&key(0), 1).unwrap().try_lock().ok().unwrap();
        assert_eq!(queues.queued(&key(0)), 1);
        drop(again);
        // Another width on an idle queue takes the key over in the map; the
        // old queue is not joined from the last join any more.
        let wide: Vec<_> = (0..2)
            .map(|_| queues.join(&key(0), 2).unwrap().try_lock().ok().unwrap())
            .collect();
        assert_eq!(queues.queued(&key(0)), 2);
        assert!(queues.join(&key(0), 1).is_none(), "busy at width 2");
        drop(wide);
    }

    #[test]
    fn an_idle_queue_takes_a_claim_of_another_width_and_a_busy_one_does_not() {
        let queues = LocalQueues::default();
        drop(queues.join(&key(0), 1).unwrap().try_lock().ok().unwrap());
        // Idle: the key is a semaphore of 3 now, its 3 turns free.
        let turns: Vec<_> = (0..3)
            .map(|_| queues.join(&key(0), 3).unwrap().try_lock().ok().unwrap())
            .collect();
        assert!(queues.join(&key(0), 3).unwrap().try_lock().is_err());
        // In use at width 3: a mutex's claim gets no queue (the store
        // answers the mismatch).
        assert!(queues.join(&key(0), 1).is_none());
        drop(turns);
        // Every turn came back: the idle queue is whole again.
        let again: Vec<_> = (0..3)
            .map(|_| queues.join(&key(0), 3).unwrap().try_lock().ok().unwrap())
            .collect();
        assert_eq!(queues.queued(&key(0)), 3);
        drop(again);
    }

    /// A holder counted out passes its turn on after a waiter that was
    /// counted behind it left without it: the turn is taken back then, and
    /// dropped when it arrives, so a task that took the free turn in
    /// between is not joined by another.
    #[test]
    fn a_turn_taken_back_before_it_is_passed_is_dropped_when_it_arrives() {
        let queues = LocalQueues::default();
        let mut first = queues.join("k", 1).unwrap();
        assert!(first.has_turn);
        let waiter = queues.join("k", 1).unwrap();
        assert!(!waiter.has_turn, "one ahead");
        // The holder is counted out; its turn is not passed on yet.
        let queue = first.queue.take().expect("in the queue");
        assert!(queue.count_out_holder(), "one waits behind it");
        // The waiter gives up: everyone left can hold the key, so the
        // turn on its way is owed back.
        drop(waiter);
        assert_eq!(queue.waiting().owed, 1);
        let taker = queues.join("k", 1).unwrap();
        assert!(taker.has_turn, "nobody ahead");
        let late = queues.join("k", 1).unwrap();
        assert!(!late.has_turn);
        // The turn arrives, and is dropped: the late waiter still waits.
        queue.pass_turn();
        let waker = std::task::Waker::noop();
        let mut late = late;
        assert!(
            !queue.waiting().poll_turn(&mut late.place, waker),
            "one holds the key"
        );
        let waiting = queue.waiting();
        assert_eq!((waiting.owed, waiting.pending), (0, 0));
        drop(waiting);
        // The holder's release passes the turn to it.
        drop(taker);
        assert!(
            queue.waiting().poll_turn(&mut late.place, waker),
            "its turn"
        );
        late.has_turn = true;
        drop(late);
        assert_eq!(queues.queued("k"), 0);
        let waiting = queue.waiting();
        assert_eq!((waiting.owed, waiting.pending), (0, 0));
    }

    /// Tasks on two threads join one key's queue, `width` wide, again and
    /// again: some take a turn only if one is free, some wait, some give up
    /// waiting after a random while (a turn may be passed to them as they
    /// do). Never more than `width` hold a turn at once, every task that
    /// waits to the end gets one, and once all have left the queue is
    /// idle, no turn left waiting for a waiter or owed.
    async fn turns_hold_under_churn(width: u32) {
        let queues = LocalQueues::default();
        let holding = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for task in 0..12_u64 {
            let (queues, holding, most) = (queues.clone(), holding.clone(), most.clone());
            tasks.push(tokio::spawn(async move {
                let mut turns = 0;
                for round in 0..1000_u64 {
                    let member = queues.join("k:churn", width).expect("one width");
                    // Counted in, then descheduled before it looks: turns
                    // are passed meanwhile.
                    tokio::task::yield_now().await;
                    let turn = match (task + round) % 3 {
                        0 => member.try_lock().ok(),
                        1 => Some(member.lock().await),
                        _ => {
                            let patience = Duration::from_micros(rand::random_range(0..1500));
                            tokio::time::timeout(patience, member.lock()).await.ok()
                        }
                    };
                    let Some(turn) = turn else {
                        continue;
                    };
                    let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    if round % 16 == 0 {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    } else {
                        tokio::task::yield_now().await;
                    }
                    holding.fetch_sub(1, Ordering::SeqCst);
                    drop(turn);
                    turns += 1;
                }
                turns
            }));
        }
        for task in tasks {
            assert!(task.await.expect("no panic") > 0, "every task got turns");
        }
        let most = most.load(Ordering::SeqCst);
        assert!(
            most <= width as usize,
            "{most} held a turn of {width} at once"
        );
        assert_eq!(queues.queued("k:churn"), 0, "everyone left");
        let queue = queues.join("k:churn", width).expect("the same queue");
        assert!(queue.has_turn, "an idle queue has a free turn");
        let waiting = queue.queue().waiting();
        assert_eq!(
            (waiting.pending, waiting.owed, waiting.order.len()),
            (0, 0, 0),
            "no turn kept for a waiter, none owed, nobody in order"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_mutex_queue_gives_one_turn_at_a_time_under_churn() {
        turns_hold_under_churn(1).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_semaphore_queue_gives_at_most_its_width_under_churn() {
        turns_hold_under_churn(3).await;
    }

    /// A lease that says whether others may wait as told, and counts the
    /// asks.
    #[derive(Debug)]
    struct Waited(bool, AtomicUsize);

    impl Lease for Waited {
        fn renew(&self) -> crate::store::Reply<'_, bool> {
            crate::store::Reply::ready(Ok(true))
        }

        fn release(&mut self, _linger: Duration) -> crate::store::Reply<'_, bool> {
            crate::store::Reply::ready(Ok(true))
        }

        fn others_may_wait(&self) -> bool {
            self.1.fetch_add(1, Ordering::Relaxed);
            self.0
        }
    }

    #[test]
    fn a_chain_goes_back_to_the_store_past_eight_only_while_others_may_wait() {
        let (waited, alone) = (
            Waited(true, Default::default()),
            Waited(false, Default::default()),
        );
        for chain in 0..MAX_HAND_OVERS {
            assert_eq!(next_in_chain(chain, &waited), Some(chain + 1));
            assert_eq!(next_in_chain(chain, &alone), Some(chain + 1));
        }
        let asked = |lease: &Waited| lease.1.load(Ordering::Relaxed);
        assert_eq!(
            (asked(&waited), asked(&alone)),
            (0, 0),
            "not asked within eight"
        );
        assert_eq!(next_in_chain(MAX_HAND_OVERS, &waited), None);
        // Nobody waits: the count starts again, so a waiter that comes
        // later waits eight hand-overs at most.
        assert_eq!(next_in_chain(MAX_HAND_OVERS, &alone), Some(1));
    }
}
