//! What clones of one store share: the pool of prepared leases and our
//! waiting entries.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::MAX_SPARES;
use super::held::HeldKeys;
use super::keys::used_for;
use super::queues::WatchedQueues;
use crate::store::LockToken;
use crate::store::common::queue::Place;

/// What clones of one store share.
pub(super) struct Shared {
    /// Unused leases by ttl in seconds, each with the key it was last used
    /// for ([`used_for`]).
    pub(super) spares: Mutex<HashMap<i64, Vec<(Spare, u64)>>>,
    /// The keys held, watched so their loss is pushed to the holder.
    pub(super) held: Arc<HeldKeys>,
    /// Our waiting entries, by token.
    pub(super) queued: Mutex<HashMap<LockToken, Queued>>,
    /// The watches of the keys our waiters wait on.
    pub(super) queues: Arc<WatchedQueues>,
}

/// A waiter's entry in a key's queue.
#[derive(Clone, Debug)]
pub(super) struct Queued {
    /// The start of the key's range.
    pub(super) queue: Vec<u8>,
    /// Our entry in it.
    pub(super) entry: Vec<u8>,
    /// The entry's create revision: its place, and the fencing token once
    /// it holds the lock.
    pub(super) created: i64,
    /// The lease the entry is attached to.
    pub(super) lease: Spare,
    pub(super) secs: i64,
    pub(super) place: Place,
}

/// A lease nobody's key is attached to, and since when etcd counts it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Spare {
    pub(super) id: i64,
    pub(super) fresh_at: Instant,
}

impl Shared {
    /// An unused lease of `secs` granted or renewed less than a quarter of
    /// its ttl ago: a lock on it has at least three quarters of its ttl
    /// left, and the runtime renews it early.
    ///
    /// One last used for `queue` first: its entry then takes the name it
    /// had, so a key's range keeps few names (see [`entry_for`]).
    pub(super) fn take(&self, secs: i64, queue: &[u8]) -> Option<Spare> {
        let mut spares = self.spares.lock().unwrap_or_else(|e| e.into_inner());
        let list = spares.get_mut(&secs)?;
        let fresh = Duration::from_secs(secs.unsigned_abs()) / 4;
        let last = used_for(queue);
        if let Some(at) = list.iter().rposition(|(_, used)| *used == last) {
            let (spare, _) = list.remove(at);
            if spare.fresh_at.elapsed() < fresh {
                return Some(spare);
            }
        }
        while let Some((spare, _)) = list.pop() {
            if spare.fresh_at.elapsed() < fresh {
                return Some(spare);
            }
            // Older ones are older still: let them all expire in etcd.
            list.clear();
        }
        None
    }

    pub(super) fn queued(&self) -> std::sync::MutexGuard<'_, HashMap<LockToken, Queued>> {
        self.queued.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the place of our entries in `queue`: `place` for the one
    /// created at `created`, [`Place::Unknown`] for the others.
    pub(super) fn place(&self, queue: &[u8], created: i64, place: Place) {
        for entry in self.queued().values_mut() {
            if entry.queue == queue {
                entry.place = if entry.created == created {
                    place
                } else {
                    Place::Unknown
                };
            }
        }
    }

    /// Keeps `spare`, last used for `queue`, for the next acquire of `secs`.
    pub(super) fn give_back(&self, secs: i64, spare: Spare, queue: &[u8]) {
        let fresh = Duration::from_secs(secs.unsigned_abs()) / 4;
        if spare.fresh_at.elapsed() >= fresh {
            return;
        }
        let mut spares = self.spares.lock().unwrap_or_else(|e| e.into_inner());
        let list = spares.entry(secs).or_default();
        if list.len() < MAX_SPARES {
            list.push((spare, used_for(queue)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn only_fresh_spare_leases_are_reused() {
        let shared = Shared {
            spares: Mutex::default(),
            held: Arc::default(),
            queued: Mutex::default(),
            queues: Arc::default(),
        };
        let at = Instant::now();
        let spare = |id| Spare { id, fresh_at: at };
        shared.give_back(4, spare(1), b"a");
        tokio::time::advance(Duration::from_millis(999)).await;
        assert_eq!(shared.take(4, b"b").map(|s| s.id), Some(1));
        shared.give_back(4, spare(1), b"a");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(shared.take(4, b"a").is_none(), "a quarter of the ttl old");
        assert!(shared.take(8, b"a").is_none());
    }

    #[test]
    fn a_key_gets_back_the_lease_it_used_last() {
        let shared = Shared {
            spares: Mutex::default(),
            held: Arc::default(),
            queued: Mutex::default(),
            queues: Arc::default(),
        };
        let spare = |id| Spare {
            id,
            fresh_at: Instant::now(),
        };
        shared.give_back(4, spare(1), b"a");
        shared.give_back(4, spare(2), b"b");
        shared.give_back(4, spare(3), b"c");
        assert_eq!(shared.take(4, b"a").map(|s| s.id), Some(1));
        assert_eq!(
            shared.take(4, b"z").map(|s| s.id),
            Some(3),
            "else the last given back"
        );
        assert_eq!(shared.take(4, b"b").map(|s| s.id), Some(2));
        assert!(shared.take(4, b"a").is_none());
    }
}
