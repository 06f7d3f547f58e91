//! The local queue: one per key that tasks of this registry hold or wait
//! for, so that only the task at its front contends in the store; and both
//! ends of the in-process hand-over, which passes a lease along that queue.
//!
//! A holder that releases while other tasks of its process queue behind it
//! asks the store to move the lease to a new token ([`Lease::hand_over`]),
//! one round trip instead of a release and an acquire, and leaves the
//! [`Grant`] for the next task, which takes it up at the front of the queue.
//! At most [`MAX_HAND_OVERS`] in a row, so other processes get their turn.
//! A grant left behind for a waiter that went away is released.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::error::StoreError;
use crate::store::support::keyed::{HashedKey, KeyHashing, KeyMap};
use crate::store::{HandOver, Lease, LossSignal};

/// How many times in a row a lease may be handed to the next task of this
/// process before it is released in the store, so that other processes get
/// their turn.
pub(crate) const MAX_HAND_OVERS: u32 = 8;

/// The local queues of one registry, by full key.
#[derive(Clone, Default)]
pub(crate) struct LocalQueues {
    map: Arc<Mutex<Queues>>,
    /// The map's hashing: each key is hashed once per lock.
    hashing: KeyHashing,
}

#[derive(Default)]
struct Queues {
    map: KeyMap<Arc<Slot>>,
    /// The queue the last key left behind, empty, for the next key to
    /// take rather than allocate one.
    spare: Option<Arc<Slot>>,
}

impl LocalQueues {
    /// Gets or creates the queue for `full_key`, and joins it.
    pub(crate) fn slot(&self, full_key: &Arc<str>) -> LocalSlot {
        let key = self.hashing.key(full_key.clone());
        let mut queues = self.queues();
        let Queues { map, spare } = &mut *queues;
        let slot = map
            .entry(key)
            .or_insert_with_key(|key| match spare.take() {
                Some(mut slot) => {
                    if let Some(empty) = Arc::get_mut(&mut slot) {
                        *empty = Slot::new(key.clone());
                    }
                    slot
                }
                None => Arc::new(Slot::new(key.clone())),
            })
            .clone();
        // Counted under the map's lock, as leaving is.
        slot.users.fetch_add(1, Ordering::Relaxed);
        drop(queues);
        LocalSlot {
            queues: self.clone(),
            slot: Some(slot),
        }
    }

    /// How many keys have a queue.
    pub(crate) fn len(&self) -> usize {
        self.queues().map.len()
    }

    /// How many tasks hold or wait for `full_key` in this registry.
    pub(crate) fn queued(&self, full_key: &str) -> usize {
        let key = self.hashing.key(full_key.into());
        self.queues()
            .map
            .get(&key)
            .map_or(0, |slot| slot.users.load(Ordering::Relaxed))
    }

    /// `slot`'s user leaves it; the last one removes it from the map,
    /// releases a lease handed over to a waiter that went away, and keeps
    /// the slot for the next key. The slot back while others stay in it.
    fn leave(&self, mut slot: Arc<Slot>) -> Option<Arc<Slot>> {
        let mut queues = self.queues();
        if slot.users.fetch_sub(1, Ordering::Relaxed) != 1 {
            return Some(slot);
        }
        queues.map.remove(&slot.key);
        // Rather than let it block other processes until its ttl.
        let handed = slot.handed().take();
        if Arc::get_mut(&mut slot).is_some() {
            queues.spare = Some(slot);
        }
        drop(queues);
        if let Some(mut handed) = handed
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move {
                let _ = handed.lease.release(Duration::ZERO).await;
            });
        }
        None
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
    pub(crate) lease: Box<dyn Lease>,
    pub(crate) loss: LossSignal,
    pub(crate) fencing: u64,
    pub(crate) ttl: Duration,
    /// When the request that granted (or last extended) it was sent: the
    /// lease is good for `ttl` from then.
    pub(crate) sent_at: Instant,
    /// How many hand-overs in a row led to it.
    pub(crate) chain: u32,
}

/// One key's queue, and the lease handed along it.
struct Slot {
    /// The full key, as the map holds it (with its hash, to leave it
    /// without hashing it again).
    key: HashedKey,
    /// The tasks that hold or wait for the key; changed under the map's
    /// lock, so the last one out removes the slot.
    users: AtomicUsize,
    /// The turn: one permit, taken by the front of the queue.
    queue: Semaphore,
    /// A lease handed over for the next holder, until it takes it up.
    handed: Mutex<Option<Grant>>,
}

impl Slot {
    fn new(key: HashedKey) -> Self {
        Slot {
            key,
            users: AtomicUsize::new(0),
            queue: Semaphore::new(1),
            handed: Mutex::new(None),
        }
    }

    fn handed(&self) -> MutexGuard<'_, Option<Grant>> {
        // Only `take` and `replace`: consistent after a panic.
        self.handed
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}

/// A place in one key's queue; leaves it when dropped.
pub(crate) struct LocalSlot {
    queues: LocalQueues,
    /// The queue; `None` once this place has left it (a permit's, on its
    /// drop).
    slot: Option<Arc<Slot>>,
}

impl LocalSlot {
    fn slot(&self) -> &Slot {
        // Taken only by `leave`, on the way out.
        self.slot
            .as_deref()
            .expect("a local slot used after it left")
    }

    /// Waits for the front of the queue.
    pub(crate) async fn lock(self) -> LocalPermit {
        // Dropped while waiting, `self` leaves the queue; the semaphore is
        // never closed.
        if let Ok(turn) = self.slot().queue.acquire().await {
            turn.forget();
        }
        LocalPermit::queued(self)
    }

    /// The front of the queue if nobody is ahead; else the place back.
    pub(crate) fn try_lock(self) -> Result<LocalPermit, LocalSlot> {
        let Ok(turn) = self.slot().queue.try_acquire() else {
            return Err(self);
        };
        turn.forget();
        Ok(LocalPermit::queued(self))
    }

    /// Leaves the queue; the queue back while others stay in it.
    fn leave(&mut self) -> Option<Arc<Slot>> {
        self.queues.leave(self.slot.take()?)
    }
}

impl Drop for LocalSlot {
    fn drop(&mut self) {
        self.leave();
    }
}

/// The front of one key's queue: held from there until the lease is
/// released (or handed over). A claim many may hold at once (a share, a
/// permit) does not queue: its permit is outside every queue, and the
/// store alone decides.
pub(crate) struct LocalPermit {
    slot: Option<LocalSlot>,
    key: Arc<str>,
}

impl Drop for LocalPermit {
    fn drop(&mut self) {
        // Leaves before the next local waiter goes ahead, so the new
        // holder's `has_waiters` counts only real waiters, not this permit
        // (it would hand its lease over to nobody).
        if let Some(slot) = &mut self.slot {
            // The last one out leaves nobody to go ahead.
            if let Some(queue) = slot.leave() {
                queue.queue.add_permits(1);
            }
        }
    }
}

impl LocalPermit {
    /// A permit outside every queue, for a claim many may hold at once.
    pub(crate) fn unqueued(full_key: Arc<str>) -> LocalPermit {
        LocalPermit {
            slot: None,
            key: full_key,
        }
    }

    fn queued(slot: LocalSlot) -> LocalPermit {
        LocalPermit {
            key: slot.slot().key.key().clone(),
            slot: Some(slot),
        }
    }

    /// The full key, shared.
    pub(crate) fn key(&self) -> &Arc<str> {
        &self.key
    }

    /// Whether other tasks of this process wait behind this permit.
    pub(crate) fn has_waiters(&self) -> bool {
        self.slot
            .as_ref()
            .is_some_and(|slot| slot.slot().users.load(Ordering::Relaxed) > 1)
    }

    /// Takes up the lease the previous holder handed over, if any.
    pub(crate) fn take_handed(&self) -> Option<Grant> {
        self.slot.as_ref()?.slot().handed().take()
    }

    /// Hands `lease` to the next task in the queue: the store moves it to a
    /// new token with a new fencing token, and this permit gives up its
    /// turn. `chain` counts the hand-overs that led to this lease.
    ///
    /// # Errors
    ///
    /// The store's error when it failed. Whatever the outcome (moved, lost,
    /// released by the store instead), the turn is given up, and the lease
    /// dropped unless it was moved.
    pub(crate) async fn hand_over(
        self,
        Grant {
            mut lease,
            loss,
            ttl,
            chain,
            ..
        }: Grant,
    ) -> Result<HandOver, StoreError> {
        let sent_at = Instant::now();
        let handed = lease.hand_over().await?;
        let HandOver::Moved { fencing } = handed else {
            return Ok(handed);
        };
        tracing::debug!(key = %self.key(), fencing, "lock handed over within this process");
        // A lease the store could not renew with the move counts from its
        // last renewal.
        let sent_at = lease.started_at().map_or(sent_at, |at| at.min(sent_at));
        let Some(slot) = &self.slot else {
            // Never asked of an unqueued permit, which has no waiters.
            return Ok(HandOver::Released);
        };
        *slot.slot().handed() = Some(Grant {
            lease,
            loss,
            fencing,
            ttl,
            sent_at,
            chain: chain + 1,
        });
        Ok(handed)
    }
}

impl fmt::Debug for LocalPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalPermit")
            .field("key", &self.key())
            .finish()
    }
}
