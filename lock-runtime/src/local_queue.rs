//! The local queue: one per key that tasks of this registry hold or wait
//! for, so that only the task at its front contends in the store; and both
//! ends of the in-process hand-over, which passes a lease along that queue.
//!
//! A holder that releases while other tasks of its process queue behind it
//! asks the store to move the lease to a new token ([`Lease::hand_over`]),
//! one round trip instead of a release and an acquire, and leaves it as a
//! [`Baton`] for the next task, which takes it up at the front of the queue.
//! At most [`MAX_HAND_OVERS`] in a row, so other processes get their turn.
//! A baton left behind by a waiter that went away is released.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};
use tokio::time::Instant;

use crate::backend::{Lease, LossSignal};
use crate::error::BackendError;

/// How many times in a row a lease may be handed to the next task of this
/// process before it is released in the store, so that other processes get
/// their turn.
pub(crate) const MAX_HAND_OVERS: u32 = 8;

/// The local queues of one registry, by full key.
#[derive(Clone, Default)]
pub(crate) struct LocalQueues {
    map: Arc<Mutex<HashMap<Arc<str>, Arc<Slot>>>>,
}

impl LocalQueues {
    /// Gets or creates the queue for `full_key`.
    pub(crate) fn slot(&self, full_key: &str) -> LocalSlot {
        let mut map = self.map();
        let (key, slot) = match map.get_key_value(full_key) {
            Some((key, slot)) => (key.clone(), slot.clone()),
            None => {
                let key: Arc<str> = full_key.into();
                let slot = Arc::new(Slot::default());
                map.insert(key.clone(), slot.clone());
                (key, slot)
            }
        };
        LocalSlot {
            queues: self.clone(),
            key,
            slot,
        }
    }

    /// How many keys have a queue.
    pub(crate) fn len(&self) -> usize {
        self.map().len()
    }

    /// How many tasks hold or wait for `full_key` in this registry.
    pub(crate) fn queued(&self, full_key: &str) -> usize {
        // The map's reference aside, each holder or waiter has one.
        self.map()
            .get(full_key)
            .map_or(0, |slot| Arc::strong_count(slot) - 1)
    }

    fn map(&self) -> MutexGuard<'_, HashMap<Arc<str>, Arc<Slot>>> {
        // Every update under this lock is a single map operation, so the map
        // is consistent even if a holder panicked.
        self.map.lock().unwrap_or_else(|poison| poison.into_inner())
    }
}

/// A lease handed over by the previous holder in this process, waiting for
/// the next one at the front of the local queue.
#[derive(Debug)]
pub(crate) struct Baton {
    pub(crate) lease: Box<dyn Lease>,
    pub(crate) loss: LossSignal,
    pub(crate) fencing: u64,
    pub(crate) ttl: Duration,
    /// When the hand-over request was sent: the lease is good for `ttl`
    /// from then.
    pub(crate) sent_at: Instant,
    /// How many hand-overs in a row led to this one.
    pub(crate) chain: u32,
}

/// One key's queue, and the lease handed along it.
#[derive(Default)]
struct Slot {
    queue: Arc<AsyncMutex<()>>,
    baton: Mutex<Option<Baton>>,
}

impl Slot {
    fn baton(&self) -> MutexGuard<'_, Option<Baton>> {
        // Only `take` and `replace`: consistent after a panic.
        self.baton
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}

/// A place in one key's queue; removes the queue from the map when the last
/// user goes away.
pub(crate) struct LocalSlot {
    queues: LocalQueues,
    key: Arc<str>,
    slot: Arc<Slot>,
}

impl LocalSlot {
    /// Waits for the front of the queue.
    pub(crate) async fn lock(self) -> LocalPermit {
        let guard = self.slot.queue.clone().lock_owned().await;
        LocalPermit { guard, slot: self }
    }

    /// The front of the queue if nobody is ahead; else the place back.
    pub(crate) fn try_lock(self) -> Result<LocalPermit, LocalSlot> {
        match self.slot.queue.clone().try_lock_owned() {
            Ok(guard) => Ok(LocalPermit { guard, slot: self }),
            Err(_) => Err(self),
        }
    }
}

impl Drop for LocalSlot {
    fn drop(&mut self) {
        let mut map = self.queues.map();
        // The map's reference and ours: nobody else holds or waits.
        if Arc::strong_count(&self.slot) != 2 {
            return;
        }
        map.remove(&self.key);
        drop(map);
        // A lease handed over to a waiter that then went away: release it
        // now rather than let it block other processes until its ttl.
        let Some(mut baton) = self.slot.baton().take() else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = baton.lease.release(Duration::ZERO).await;
            });
        }
    }
}

/// The front of one key's queue: held from there until the lease is
/// released (or handed over).
pub(crate) struct LocalPermit {
    // Dropped first: once the next local waiter goes ahead, this permit no
    // longer counts as one of the key's users, so the new holder's
    // `has_waiters` sees only real waiters (it once saw this permit, and
    // handed its lease over to nobody).
    slot: LocalSlot,
    guard: OwnedMutexGuard<()>,
}

impl LocalPermit {
    /// The full key, shared.
    pub(crate) fn key(&self) -> &Arc<str> {
        &self.slot.key
    }

    /// Whether other tasks of this process wait behind this permit.
    pub(crate) fn has_waiters(&self) -> bool {
        // The map and this permit's slot hold one reference each; every
        // waiter holds one more (its own slot).
        Arc::strong_count(&self.slot.slot) > 2
    }

    /// Takes up the lease the previous holder handed over, if any.
    pub(crate) fn take_baton(&self) -> Option<Baton> {
        self.slot.slot.baton().take()
    }

    /// Hands `lease` to the next task in the queue: the store moves it to a
    /// new token with a new fencing token, and this permit gives up its
    /// turn. `chain` counts the hand-overs that led to this lease.
    ///
    /// # Errors
    ///
    /// `Ok(false)` when the lease was no longer ours; the store's error when
    /// it failed. Either way the turn is given up and the lease dropped.
    pub(crate) async fn hand_over(
        self,
        mut lease: Box<dyn Lease>,
        loss: LossSignal,
        ttl: Duration,
        chain: u32,
    ) -> Result<bool, BackendError> {
        let sent_at = Instant::now();
        let Some(fencing) = lease.hand_over().await? else {
            return Ok(false);
        };
        tracing::debug!(key = %self.slot.key, fencing, "lock handed over within this process");
        *self.slot.slot.baton() = Some(Baton {
            lease,
            loss,
            fencing,
            ttl,
            sent_at,
            chain: chain + 1,
        });
        Ok(true)
    }
}

impl fmt::Debug for LocalPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let _ = &self.guard;
        f.debug_struct("LocalPermit")
            .field("key", &self.key())
            .finish()
    }
}
