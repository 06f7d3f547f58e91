//! The in-process store: the same semantics as the others (expiry, owner
//! checks, fencing tokens, release notifications), no server.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::{Acquire, Backend, BoxFuture, LockToken, ReleaseWatch};
use crate::BackendError;

/// Below this many keys the table is never swept.
const SWEEP_FLOOR: usize = 1024;

/// An in-process lock store.
///
/// Clones share one table, so several registries built on clones of one
/// `MemoryBackend` contend for the same locks, as processes sharing one Redis
/// do. Expiry uses Tokio's clock, so tests with paused time run instantly.
///
/// Fencing tokens come from one counter per store: strictly increasing per
/// key (and across keys), with no per-key state to keep once a lock is free.
/// A key's entry is removed when it is released and nobody watches it;
/// entries of holders that vanished without releasing are swept once they
/// expire, when the table has doubled since the last sweep.
#[derive(Clone, Default)]
pub struct MemoryBackend {
    shared: Arc<Mutex<Table>>,
}

#[derive(Default)]
struct Table {
    slots: HashMap<String, Slot>,
    fencing: u64,
    sweep_at: usize,
}

#[derive(Clone, Copy)]
struct Holder {
    token: LockToken,
    expires: Instant,
    fencing: u64,
}

struct Slot {
    holder: Option<Holder>,
    /// Created by the first watcher: most locks are never waited for.
    released: Option<watch::Sender<()>>,
}

impl Slot {
    fn new() -> Self {
        Slot {
            holder: None,
            released: None,
        }
    }

    /// The holder, if its lease has not expired.
    fn live_holder(&self, now: Instant) -> Option<Holder> {
        self.holder.filter(|holder| holder.expires > now)
    }

    fn unused(&self, now: Instant) -> bool {
        self.live_holder(now).is_none() && self.watchers() == 0
    }

    fn watchers(&self) -> usize {
        self.released
            .as_ref()
            .map_or(0, watch::Sender::receiver_count)
    }
}

impl MemoryBackend {
    /// Creates an empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many keys have state: held, watched, or expired and not yet swept.
    pub fn tracked_keys(&self) -> usize {
        self.table().slots.len()
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        // The table stays consistent across a panic (every update is one
        // assignment), so a poisoned lock is still safe to use.
        self.shared
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    fn try_acquire(&self, key: &str, token: LockToken, ttl: Duration) -> Acquire {
        let now = Instant::now();
        let mut table = self.table();
        if let Some(slot) = table.slots.get_mut(key)
            && let Some(holder) = slot.live_holder(now)
        {
            if holder.token != token {
                return Acquire::Held {
                    remaining: Some(holder.expires - now),
                };
            }
            // The same token again (a retried request): the same answer.
            slot.holder = Some(Holder {
                expires: now + ttl,
                ..holder
            });
            return Acquire::Acquired {
                fencing: holder.fencing,
            };
        }
        table.sweep(now);
        table.fencing += 1;
        let fencing = table.fencing;
        let slot = match table.slots.get_mut(key) {
            Some(slot) => slot,
            None => table.slots.entry(key.to_owned()).or_insert_with(Slot::new),
        };
        slot.holder = Some(Holder {
            token,
            expires: now + ttl,
            fencing,
        });
        Acquire::Acquired { fencing }
    }

    fn renew_lease(&self, key: &str, token: LockToken, ttl: Duration) -> bool {
        let now = Instant::now();
        let mut table = self.table();
        match table.slots.get_mut(key) {
            Some(slot) => match slot.live_holder(now) {
                Some(holder) if holder.token == token => {
                    slot.holder = Some(Holder {
                        expires: now + ttl,
                        ..holder
                    });
                    true
                }
                _ => false,
            },
            None => false,
        }
    }

    fn release_lease(&self, key: &str, token: LockToken, linger: Duration) -> bool {
        let now = Instant::now();
        let mut table = self.table();
        let Some(slot) = table.slots.get_mut(key) else {
            return false;
        };
        let Some(holder) = slot.live_holder(now).filter(|holder| holder.token == token) else {
            return false;
        };
        if !linger.is_zero() {
            slot.holder = Some(Holder {
                expires: now + linger,
                ..holder
            });
            return true;
        }
        slot.holder = None;
        if slot.watchers() > 0 {
            if let Some(released) = &slot.released {
                released.send_replace(());
            }
        } else {
            table.slots.remove(key);
        }
        true
    }

    fn pass_on(&self, key: &str, token: LockToken, ttl: Duration) -> Option<u64> {
        let now = Instant::now();
        let mut table = self.table();
        table.fencing += 1;
        let fencing = table.fencing;
        let slot = table.slots.get_mut(key)?;
        let holder = slot
            .live_holder(now)
            .filter(|holder| holder.token == token)?;
        slot.holder = Some(Holder {
            expires: now + ttl,
            fencing,
            ..holder
        });
        Some(fencing)
    }

    fn subscribe(&self, key: &str) -> ReleaseWatch {
        let mut table = self.table();
        let slot = match table.slots.get_mut(key) {
            Some(slot) => slot,
            None => table.slots.entry(key.to_owned()).or_insert_with(Slot::new),
        };
        let rx = slot
            .released
            .get_or_insert_with(|| watch::Sender::new(()))
            .subscribe();
        let unwatch = Unwatch {
            store: self.clone(),
            key: key.to_owned(),
        };
        ReleaseWatch::new(rx, Some(Box::new(unwatch)))
    }
}

impl Table {
    /// Drops expired, unwatched slots once the table has doubled in size.
    fn sweep(&mut self, now: Instant) {
        if self.slots.len() < self.sweep_at.max(SWEEP_FLOOR) {
            return;
        }
        self.slots.retain(|_, slot| !slot.unused(now));
        self.sweep_at = self.slots.len() * 2;
    }
}

/// Frees the key's slot when its last watcher goes away.
struct Unwatch {
    store: MemoryBackend,
    key: String,
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

impl fmt::Debug for MemoryBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryBackend")
            .field("tracked_keys", &self.tracked_keys())
            .finish()
    }
}

impl Backend for MemoryBackend {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        token: LockToken,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Acquire, BackendError>> {
        Box::pin(async move { Ok(self.try_acquire(key, token, ttl)) })
    }

    fn renew<'a>(
        &'a self,
        key: &'a str,
        token: LockToken,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move { Ok(self.renew_lease(key, token, ttl)) })
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        token: LockToken,
        linger: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move { Ok(self.release_lease(key, token, linger)) })
    }

    fn supports_hand_over(&self) -> bool {
        true
    }

    fn hand_over<'a>(
        &'a self,
        key: &'a str,
        token: LockToken,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Option<u64>, BackendError>> {
        Box::pin(async move { Ok(self.pass_on(key, token, ttl)) })
    }

    fn watch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<ReleaseWatch, BackendError>> {
        Box::pin(async move { Ok(self.subscribe(key)) })
    }
}
