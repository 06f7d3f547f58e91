//! The in-process store: the same semantics as the others (expiry, owner
//! checks, fencing tokens, release notifications), no server.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::{
    Acquire, AcquireRequest, Capabilities, FencingPromise, HandOver, Lease, LeaseInfo, LockToken,
    LossSignal, ReleaseWatch, Reply, Store,
};
use crate::error::StoreError;
use crate::store::common::keyed::{HashedKey, KeyHashing, KeyMap};

mod slot;
#[cfg(test)]
mod tests;

use slot::{Admission, Holder, Slot};

/// Below this many keys the table is never swept.
const SWEEP_FLOOR: usize = 1024;

/// What the memory store can do. Its clock is the holder's clock, so the
/// margin covers only the timer's granularity and the time to cancel a body.
const CAPABILITIES: Capabilities = Capabilities::new("memory")
    .with_ttl(Duration::from_millis(10), Duration::from_millis(1))
    .with_linger()
    .with_shares()
    .with_permits()
    .with_pushed_losses()
    .with_shared_clock()
    .with_fencing(FencingPromise::INCREASING);

/// An in-process lock store.
///
/// Clones share one table, so several registries built on clones of one
/// `MemoryStore` contend for the same locks, as processes sharing one Redis
/// do. Expiry uses Tokio's clock, so tests with paused time run instantly.
///
/// Fencing tokens come from one counter per store: strictly increasing per
/// key (and across keys), with no per-key state to keep once a lock is free;
/// they start again from 1 in a new store. A released key's entry stays
/// for its next lock, so a key locked again costs one lookup each way; once
/// the table has doubled since the last sweep (and holds at least 1024
/// keys), the entries nobody holds, watches or waits for are dropped, those
/// of holders that vanished without releasing once their leases expired.
/// The table holds about twice the keys in use at most.
///
/// The store tells a holder at once when its lease is lost to
/// [`force_release`](Store::force_release) or, after it expired, to the
/// next holder.
#[derive(Clone, Default)]
pub struct MemoryStore {
    shared: Arc<Mutex<Table>>,
}

#[derive(Default)]
struct Table {
    slots: KeyMap<Slot>,
    /// How `slots` hashes keys: once per lock, the lease keeping the hash.
    hashing: KeyHashing,
    fencing: u64,
    sweep_at: usize,
    /// The holder lists of the slots the last sweep dropped, emptied: a
    /// new key's slot takes one rather than allocate one.
    spare: Vec<Vec<Holder>>,
}

impl MemoryStore {
    /// Creates an empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many keys are held, watched or waited for (the entries kept
    /// for keys nobody uses are not counted).
    pub fn tracked_keys(&self) -> usize {
        let now = Instant::now();
        self.table()
            .slots
            .values()
            .filter(|slot| !slot.unused(now))
            .count()
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        lock_table(&self.shared)
    }

    fn try_acquire(&self, request: &AcquireRequest<'_>) -> Result<Acquire, StoreError> {
        // The caller's clock is this store's: its reading saves one here.
        let now = request.hints.sent_at.unwrap_or_else(Instant::now);
        let mut guard = self.table();
        let table = &mut *guard;
        let lease = |key: HashedKey| -> Box<dyn Lease> {
            Box::new(MemoryLease {
                shared: self.shared.clone(),
                key,
                token: request.token,
                ttl: request.ttl,
            })
        };
        // The key hashed once, looked up borrowed; one lookup when it has
        // a slot, two when it has none.
        let probe = table.hashing.probe(request.key);
        let slot = match table.slots.get_mut(probe.as_dyn()) {
            Some(slot) => slot,
            None => {
                table.sweep(now);
                let holders = table.spare.pop().unwrap_or_default();
                let key = probe.with_owned(request.owned_key());
                table
                    .slots
                    .entry(key)
                    .or_insert_with_key(|key| Slot::new(key.clone(), holders))
            }
        };
        let admission = slot.admit(
            request.claim,
            request.token,
            request.hints.waits,
            request.ttl,
            now,
        )?;
        let expired = match admission {
            Admission::Refuse(remaining) => {
                return Ok(Acquire::Held {
                    remaining: Some(remaining),
                });
            }
            // The same token again (a retried request): the same answer.
            Admission::Again(index) => {
                let holder = slot.holder_mut(index);
                holder.expires = now + request.ttl;
                let fencing = holder.fencing;
                return Ok(Acquire::Acquired {
                    fencing: Some(fencing),
                    lease: lease(slot.key.clone()),
                });
            }
            Admission::Grant => {
                table.fencing += 1;
                let holder = Holder {
                    token: request.token,
                    claim: request.claim,
                    expires: now + request.ttl,
                    fencing: table.fencing,
                    loss: request.loss.clone(),
                };
                slot.grant(holder, now)
            }
        };
        let (key, fencing) = (slot.key.clone(), table.fencing);
        drop(guard);
        if let Some(expired) = expired {
            for previous in expired {
                previous.raise("the lease expired and another holder took the key");
            }
        }
        Ok(Acquire::Acquired {
            fencing: Some(fencing),
            lease: lease(key),
        })
    }

    fn subscribe(&self, key: &str) -> ReleaseWatch {
        let mut table = self.table();
        let key = table.key(key);
        let rx = table.slot_or_insert(&key).subscribe();
        let unwatch = Unwatch {
            store: self.clone(),
            key,
        };
        ReleaseWatch::new(rx, Some(Box::new(unwatch)))
    }
}

fn lock_table(shared: &Mutex<Table>) -> MutexGuard<'_, Table> {
    // The table stays consistent across a panic (every update is one
    // assignment), so a poisoned lock is still safe to use.
    shared.lock().unwrap_or_else(|poison| poison.into_inner())
}

impl Table {
    /// The slot of `key`, made if there is none.
    fn slot_or_insert(&mut self, key: &HashedKey) -> &mut Slot {
        let spare = &mut self.spare;
        self.slots
            .entry(key.clone())
            .or_insert_with_key(|key| Slot::new(key.clone(), spare.pop().unwrap_or_default()))
    }

    /// `key` as the table hashes it (for the calls that name a key rather
    /// than hold a lease on it).
    fn key(&self, key: &str) -> HashedKey {
        self.hashing.key(key.into())
    }

    fn next_fencing(&mut self) -> u64 {
        self.fencing += 1;
        self.fencing
    }

    /// Removes the live leases on `key` (only `token`'s, when given) and
    /// wakes watchers; each removed holder's loss signal goes to `removed`.
    /// Returns how many were removed.
    fn remove(
        &mut self,
        key: &HashedKey,
        token: Option<LockToken>,
        now: Instant,
        removed: impl FnMut(LossSignal),
    ) -> usize {
        // The slot stays, for the key's next lock (see `sweep`).
        let Some(slot) = self.slots.get_mut(key) else {
            return 0;
        };
        let count = slot.remove(token, now, removed);
        if let Some(token) = token {
            slot.stop_waiting(token);
        }
        count
    }

    /// Drops the slots nobody uses once the table has doubled since the
    /// last sweep, keeping their holder lists for new keys.
    fn sweep(&mut self, now: Instant) {
        if self.slots.len() < self.sweep_at.max(SWEEP_FLOOR) {
            return;
        }
        let spare = &mut self.spare;
        spare.clear();
        self.slots.retain(|_, slot| {
            let unused = slot.unused(now);
            if unused {
                spare.push(slot.take_holders());
            }
            !unused
        });
        self.sweep_at = self.slots.len() * 2;
    }
}

/// One lease in the memory store.
struct MemoryLease {
    shared: Arc<Mutex<Table>>,
    key: HashedKey,
    token: LockToken,
    ttl: Duration,
}

impl MemoryLease {
    /// Runs `f` on the table and our holder entry, if the lease is still ours.
    fn with_holder<T>(&self, f: impl FnOnce(&mut Holder, Instant) -> T) -> Option<T> {
        let now = Instant::now();
        let mut table = lock_table(&self.shared);
        let holder = table.slots.get_mut(&self.key)?.owned_by(self.token, now)?;
        Some(f(holder, now))
    }
}

impl Lease for MemoryLease {
    fn renew(&self) -> Reply<'_, bool> {
        let ttl = self.ttl;
        let renewed = self
            .with_holder(|holder, now| holder.expires = now + ttl)
            .is_some();
        Reply::ready(Ok(renewed))
    }

    fn release(&mut self, linger: Duration) -> Reply<'_, bool> {
        let released = if linger.is_zero() {
            let now = Instant::now();
            // Our own signal: nobody to tell.
            lock_table(&self.shared).remove(&self.key, Some(self.token), now, drop) > 0
        } else {
            self.with_holder(|holder, now| holder.expires = now + linger)
                .is_some()
        };
        Reply::ready(Ok(released))
    }

    fn hand_over(&mut self, sent_at: Instant) -> Reply<'_, HandOver> {
        // The holder's clock: the lease counts from when the hand-over was
        // sent, as the holder counts it.
        let now = sent_at;
        let next = LockToken::random();
        let mut table = lock_table(&self.shared);
        let fencing = table.next_fencing();
        let handed = table
            .slots
            .get_mut(&self.key)
            .and_then(|slot| slot.owned_by(self.token, now))
            .map(|holder| {
                holder.token = next;
                holder.expires = now + self.ttl;
                holder.fencing = fencing;
            });
        drop(table);
        if handed.is_some() {
            self.token = next;
        }
        let answer = handed.map(|()| fencing).into();
        Reply::ready(Ok(answer))
    }

    /// A new token, larger than every one issued before, while the lease
    /// holds its key: the token of the next task of this process that
    /// takes the lease over as it is. Answered at once.
    fn fencing_token(&self) -> Reply<'_, Option<u64>> {
        let now = Instant::now();
        let mut table = lock_table(&self.shared);
        let fencing = table.fencing + 1;
        let issued = table
            .slots
            .get_mut(&self.key)
            .and_then(|slot| slot.owned_by(self.token, now))
            .map(|holder| holder.fencing = fencing)
            .is_some();
        if issued {
            table.fencing = fencing;
        }
        Reply::ready(Ok(issued.then_some(fencing)))
    }

    /// Whether anyone watches the key for its release: every waiter does,
    /// from its first refusal until its wait ends.
    fn others_may_wait(&self) -> bool {
        lock_table(&self.shared)
            .slots
            .get(&self.key)
            .is_some_and(Slot::watched)
    }
}

impl fmt::Debug for MemoryLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryLease")
            .field("key", self.key.key())
            .finish_non_exhaustive()
    }
}

/// Frees the key's slot when its last watcher goes away.
struct Unwatch {
    store: MemoryStore,
    key: HashedKey,
}

impl Drop for Unwatch {
    fn drop(&mut self) {
        let now = Instant::now();
        let mut table = self.store.table();
        if table
            .slots
            .get(&self.key)
            .is_some_and(|slot| slot.unused(now))
        {
            table.slots.remove(&self.key);
        }
    }
}

impl fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStore")
            .field("tracked_keys", &self.tracked_keys())
            .finish()
    }
}

impl Store for MemoryStore {
    fn capabilities(&self) -> &Capabilities {
        &CAPABILITIES
    }

    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> Reply<'a, Acquire> {
        Reply::ready(self.try_acquire(&request))
    }

    fn abandon<'a>(&'a self, key: &'a str, token: LockToken) -> Reply<'a, bool> {
        Reply::new(async move {
            let now = Instant::now();
            let mut table = self.table();
            let key = table.key(key);
            Ok(table.remove(&key, Some(token), now, drop) > 0)
        })
    }

    fn watch<'a>(&'a self, key: &'a str) -> Reply<'a, ReleaseWatch> {
        Reply::ready(Ok(self.subscribe(key)))
    }

    fn force_release<'a>(&'a self, key: &'a str) -> Reply<'a, bool> {
        Reply::new(async move {
            let now = Instant::now();
            let mut table = self.table();
            let key = table.key(key);
            let mut removed = Vec::new();
            table.remove(&key, None, now, |loss| removed.push(loss));
            drop(table);
            for loss in &removed {
                loss.raise("the lock was force-released");
            }
            Ok(!removed.is_empty())
        })
    }

    fn inspect<'a>(&'a self, key: &'a str) -> Reply<'a, Option<LeaseInfo>> {
        Reply::new(async move {
            let now = Instant::now();
            let mut table = self.table();
            let key = table.key(key);
            let Some(slot) = table.slots.get_mut(&key) else {
                return Ok(None);
            };
            let holders = slot.live_holders(now);
            let info = slot.live_holder(now).map(|holder| {
                LeaseInfo::new(
                    Some(holder.token),
                    holder.fencing,
                    Some(holder.expires - now),
                )
                .with_holders(holder.claim, holders)
            });
            Ok(info)
        })
    }
}
