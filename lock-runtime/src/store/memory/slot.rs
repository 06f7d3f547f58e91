//! One key of the memory store: its holders, and which claims they admit.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::store::common::keyed::HashedKey;
use crate::store::{Claim, ClaimMismatch, LockToken, LossSignal};

/// One lease on a key.
pub(super) struct Holder {
    pub(super) token: LockToken,
    pub(super) claim: Claim,
    pub(super) expires: Instant,
    pub(super) fencing: u64,
    pub(super) loss: LossSignal,
}

impl Holder {
    fn live(&self, now: Instant) -> bool {
        self.expires > now
    }
}

/// What a slot answers a claim.
pub(super) enum Admission {
    /// The token already holds the key (a retried request): its holder.
    Again(usize),
    /// The claim may be granted.
    Grant,
    /// The claim must wait this long at least, as far as the slot can tell.
    Refuse(Duration),
}

/// One key's state.
pub(super) struct Slot {
    /// The key and its hash, shared with the leases on it: found with the
    /// slot in one lookup.
    pub(super) key: HashedKey,
    /// The leases on the key, live or expired and not yet dropped: one for
    /// an exclusive claim, any number of shares or permits.
    holders: Vec<Holder>,
    /// An exclusive claim refused while it waits behind shares: no new
    /// share joins until it is granted, abandoned or stops asking (its
    /// deadline passes a ttl after its latest attempt).
    exclusive_waits: Option<(LockToken, Instant)>,
    /// Created by the first watcher: most locks are never waited for.
    released: Option<watch::Sender<()>>,
}

impl Slot {
    /// A slot with no holders yet; `holders` is an empty list whose room
    /// is reused.
    pub(super) fn new(key: HashedKey, holders: Vec<Holder>) -> Self {
        debug_assert!(holders.is_empty());
        Slot {
            key,
            holders,
            exclusive_waits: None,
            released: None,
        }
    }

    /// The first live holder (the only one of an exclusive claim).
    pub(super) fn live_holder(&mut self, now: Instant) -> Option<&mut Holder> {
        self.holders.iter_mut().find(|holder| holder.live(now))
    }

    /// How many leases on the key are live.
    pub(super) fn live_holders(&self, now: Instant) -> usize {
        self.holders
            .iter()
            .filter(|holder| holder.live(now))
            .count()
    }

    /// `token`'s holder, if its lease is live.
    pub(super) fn owned_by(&mut self, token: LockToken, now: Instant) -> Option<&mut Holder> {
        self.holders
            .iter_mut()
            .find(|holder| holder.token == token && holder.live(now))
    }

    pub(super) fn holder_mut(&mut self, index: usize) -> &mut Holder {
        &mut self.holders[index]
    }

    /// Whether `claim` by `token` may be granted now; the mismatch when
    /// the claim does not fit how the key is held ([`Claim::meets`]). A refused exclusive claim
    /// that `waits` behind shares holds new shares off until one `ttl`
    /// after the shares' leases end (it asks again by then).
    pub(super) fn admit(
        &mut self,
        claim: Claim,
        token: LockToken,
        waits: bool,
        ttl: Duration,
        now: Instant,
    ) -> Result<Admission, ClaimMismatch> {
        let mut live = 0u32;
        let (mut soonest, mut latest) = (None::<Instant>, None::<Instant>);
        let mut exclusive_held = None;
        for (index, holder) in self.holders.iter().enumerate() {
            if !holder.live(now) {
                continue;
            }
            if holder.token == token {
                return Ok(Admission::Again(index));
            }
            claim.fits(holder.claim)?;
            live += 1;
            soonest = Some(soonest.map_or(holder.expires, |at| at.min(holder.expires)));
            latest = Some(latest.map_or(holder.expires, |at| at.max(holder.expires)));
            if holder.claim == Claim::Exclusive {
                exclusive_held = Some(holder.expires);
            }
        }
        let blocked_until = match claim {
            Claim::Exclusive => {
                if waits && live > 0 && exclusive_held.is_none() {
                    let until = latest.unwrap_or(now) + ttl;
                    self.exclusive_waits = Some((token, until));
                }
                latest
            }
            Claim::Shared => exclusive_held.or_else(|| {
                self.exclusive_waits
                    .filter(|&(_, until)| until > now)
                    .map(|(_, until)| latest.unwrap_or(until))
            }),
            Claim::Permit { limit } => soonest.filter(|_| live >= limit.get()),
        };
        Ok(match blocked_until {
            Some(until) => Admission::Refuse(until - now),
            None => Admission::Grant,
        })
    }

    /// Adds a holder, dropping expired ones: their loss signals, to raise
    /// once the table is unlocked (none for a key nobody held: the common
    /// case, with nothing to look through).
    pub(super) fn grant(&mut self, holder: Holder, now: Instant) -> Option<Vec<LossSignal>> {
        let mut expired = None;
        if !self.holders.is_empty() {
            self.holders.retain(|held| {
                let live = held.live(now);
                if !live {
                    expired.get_or_insert_with(Vec::new).push(held.loss.clone());
                }
                live
            });
        }
        if holder.claim == Claim::Exclusive
            && self
                .exclusive_waits
                .is_some_and(|(token, _)| token == holder.token)
        {
            self.exclusive_waits = None;
        }
        self.holders.push(holder);
        expired
    }

    /// Forgets `token`'s wait for an exclusive turn.
    pub(super) fn stop_waiting(&mut self, token: LockToken) {
        if self
            .exclusive_waits
            .is_some_and(|(waiting, _)| waiting == token)
        {
            self.exclusive_waits = None;
        }
    }

    /// Removes the live leases of `token` (of everyone, when `None`) and
    /// wakes watchers; each removed holder's loss signal goes to `removed`.
    /// Returns how many were removed.
    pub(super) fn remove(
        &mut self,
        token: Option<LockToken>,
        now: Instant,
        mut removed: impl FnMut(LossSignal),
    ) -> usize {
        // The holders' order means nothing: a removed one's place takes
        // the last.
        let mut count = 0;
        let mut index = 0;
        while let Some(holder) = self.holders.get(index) {
            if holder.live(now) && token.is_none_or(|token| token == holder.token) {
                removed(self.holders.swap_remove(index).loss);
                count += 1;
            } else {
                index += 1;
            }
        }
        if count > 0
            && let Some(released) = &self.released
        {
            released.send_replace(());
        }
        count
    }

    /// Whether nothing needs the slot: no live lease, no watcher, no waiting
    /// exclusive claim.
    pub(super) fn unused(&self, now: Instant) -> bool {
        self.holders.iter().all(|holder| !holder.live(now))
            && self.watchers() == 0
            && self.exclusive_waits.is_none_or(|(_, until)| until <= now)
    }

    /// The slot's holder list, emptied, for another slot to reuse.
    pub(super) fn take_holders(&mut self) -> Vec<Holder> {
        let mut holders = std::mem::take(&mut self.holders);
        holders.clear();
        holders
    }

    /// Whether anyone watches the key for its release.
    pub(super) fn watched(&self) -> bool {
        self.watchers() > 0
    }

    fn watchers(&self) -> usize {
        self.released
            .as_ref()
            .map_or(0, watch::Sender::receiver_count)
    }

    /// A new subscription to the key's releases.
    pub(super) fn subscribe(&mut self) -> watch::Receiver<()> {
        self.released
            .get_or_insert_with(|| watch::Sender::new(()))
            .subscribe()
    }
}
