//! One held entry and the lease it is attached to.

use std::fmt;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use tokio::time::Instant;

use super::EtcdStore;
use super::calls::{lease_gone, owned, revision, whole_seconds};
use super::keys::{flipped, queue_end};
use super::state::{Queued, Spare};
use crate::error::StoreError;
use crate::store::common::queue::Place;
use crate::store::{HandOver, Lease, LockToken, LossSignal, Reply};

/// One held entry and the lease it is attached to.
pub(super) struct EtcdLease {
    pub(super) store: EtcdStore,
    /// The start of the key's range.
    pub(super) queue: Vec<u8>,
    /// Our entry.
    pub(super) key: Vec<u8>,
    pub(super) token: LockToken,
    pub(super) secs: i64,
    /// The etcd lease the entry is on.
    pub(super) lease_id: i64,
    /// When that lease was last granted or kept alive: moved on by each
    /// renewal, which has only `&self`.
    pub(super) renewed_at: Mutex<Instant>,
    /// The entry's create revision: the fencing token.
    pub(super) created: i64,
    /// The watch that pushes the entry's loss ([`HeldKeys`]).
    pub(super) watch: i64,
    pub(super) loss: LossSignal,
    /// Whether the lease was granted or renewed before the acquire was sent.
    pub(super) counted_from_grant: bool,
    /// A read share or a permit: never moved by a hand-over.
    pub(super) one_of_many: bool,
}

impl Drop for EtcdLease {
    fn drop(&mut self) {
        self.store.inner.shared.held.forget(self.watch);
    }
}

impl EtcdLease {
    /// This lease, as a read share's or a permit's.
    pub(super) fn one_of_many(mut self) -> Self {
        self.one_of_many = true;
        self
    }

    /// The etcd lease, as fresh as its last keep-alive.
    fn spare(&self) -> Spare {
        Spare {
            id: self.lease_id,
            fresh_at: *self.renewed_at(),
        }
    }

    fn renewed_at(&self) -> MutexGuard<'_, Instant> {
        // Only ever assigned whole: consistent after a panic.
        self.renewed_at
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// A keep-alive of our lease, then, once it is answered, a check that
    /// the entry is still ours.
    ///
    /// The check comes second because a keep-alive is answered from the
    /// leader's own lease clock, without a quorum: a leader paused and
    /// deposed may answer it as it resumes while the cluster lets the
    /// lease expire (see the module docs). The check is a linearizable
    /// read: when it finds our entry, the cluster had not expired the
    /// lease when the keep-alive was answered, so nobody else can have
    /// been granted the key before ours. A lock granted through here (a
    /// waiter that reached the head of its queue) is thus granted before
    /// the next holder's, and its fencing token, the older, comes first.
    pub(super) async fn refresh(&self) -> Result<bool, StoreError> {
        let sent_at = Instant::now();
        let store = &self.store;
        let id = self.lease_id;
        match store
            .lease_call(|mut c| async move { c.keep_alive(id).await })
            .await
        {
            Ok(_) => {}
            Err(err) if lease_gone(&err) => return Ok(false),
            Err(err) => return Err(err),
        }
        let txn = Txn::new().when([owned(&self.key, &self.token.to_string())]);
        if !store.txn(&txn).await?.succeeded() {
            return Ok(false);
        }
        *self.renewed_at() = sent_at;
        Ok(true)
    }

    /// Replaces our entry by one for a new token, on the same lease, if
    /// nobody queues behind ours; else deletes ours. One transaction.
    pub(super) async fn move_or_release(&mut self) -> Result<HandOver, StoreError> {
        let store = self.store.clone();
        let token = self.token.to_string();
        let next = LockToken::random();
        let next_key = flipped(&self.key);
        // Every entry of the key was created no later than ours: ours is
        // alone (ours heads the queue, so none is older).
        let alone = Compare::create_revision(self.queue.clone(), CompareOp::Less, self.created + 1)
            .with_range(queue_end(&self.queue));
        let on_lease = PutOptions::new().with_lease(self.lease_id);
        let release = Txn::new()
            .when([owned(&self.key, &token)])
            .and_then([TxnOp::delete(self.key.clone(), None)]);
        let txn = Txn::new()
            .when([owned(&self.key, &token), alone])
            .and_then([
                TxnOp::delete(self.key.clone(), None),
                TxnOp::put(next_key.clone(), next.to_string(), Some(on_lease)),
            ])
            .or_else([TxnOp::txn(release)]);
        // Our own deletion is no loss.
        store.inner.shared.held.forget(self.watch);
        let sent_at = Instant::now();
        let id = self.lease_id;
        let (alive, answer) = tokio::join!(
            store.lease_call(|mut c| async move { c.keep_alive(id).await }),
            store.txn(&txn)
        );
        let answer = answer?;
        if !answer.succeeded() {
            let released = answer.op_responses().into_iter().any(|op| match op {
                TxnOpResponse::Txn(nested) => nested.succeeded(),
                _ => false,
            });
            if !released {
                return Ok(HandOver::Lost);
            }
            store
                .inner
                .shared
                .give_back(self.secs, self.spare(), &self.queue);
            return Ok(HandOver::Released);
        }
        // The new entry is on our lease, renewed with the move; if the
        // keep-alive failed, it counts from its last renewal.
        let renewed = alive.is_ok();
        if renewed {
            *self.renewed_at() = sent_at;
        }
        let created = i64::try_from(revision(&answer)).unwrap_or(i64::MAX);
        let entry = Queued {
            queue: self.queue.clone(),
            entry: next_key,
            created,
            lease: self.spare(),
            secs: self.secs,
            place: Place::Head,
        };
        let loss = self.loss.clone();
        *self = store.granted(entry, next, !renewed, &loss);
        Ok(HandOver::Moved {
            fencing: Some(revision(&answer)),
        })
    }
}

impl Lease for EtcdLease {
    fn renew(&self) -> Reply<'_, bool> {
        Reply::new(self.refresh())
    }

    fn release(&mut self, linger: Duration) -> Reply<'_, bool> {
        Reply::new(async move {
            let asked_at = Instant::now();
            let store = self.store.clone();
            let token = self.token.to_string();
            // Our own deletion (or move) is no loss.
            store.inner.shared.held.forget(self.watch);
            let keep = if linger.is_zero() {
                None
            } else {
                // What is left moves to a lease of its own, which expires;
                // at least the cluster's minimum, which it would grant anyway.
                let min = whole_seconds(store.min_ttl);
                Some(store.grant(whole_seconds(linger).max(min)).await?)
            };
            let build = || {
                let then = match keep {
                    None => TxnOp::delete(self.key.clone(), None),
                    Some(keep) => {
                        let options = PutOptions::new().with_lease(keep.id);
                        TxnOp::put(self.key.clone(), token.clone(), Some(options))
                    }
                };
                Txn::new().when([owned(&self.key, &token)]).and_then([then])
            };
            let answer = store.txn_built(build).await?;
            // A lingering entry keeps its name, which is our lease's: that
            // lease is not used again while the entry may live.
            if answer.succeeded() && linger.is_zero() {
                store
                    .inner
                    .shared
                    .give_back(self.secs, self.spare(), &self.queue);
            }
            if let Some(keep) = keep.filter(|_| answer.succeeded()) {
                // The linger ends on time, not when the whole-second lease
                // runs out: revoking the lease deletes the entry, the only
                // one on it. Failing that, the lease still ends it.
                tokio::spawn(async move {
                    tokio::time::sleep_until(asked_at + linger).await;
                    let id = keep.id;
                    let _ = store
                        .lease_call(|mut c| async move { c.revoke(id).await })
                        .await;
                });
            }
            Ok(answer.succeeded())
        })
    }

    fn hand_over(&mut self, _sent_at: tokio::time::Instant) -> Reply<'_, HandOver> {
        Reply::new(async move {
            if !self.one_of_many {
                return self.move_or_release().await;
            }
            // A share's entry is not moved: released, the next holder
            // claims anew.
            Ok(match self.release(Duration::ZERO).await? {
                true => HandOver::Released,
                false => HandOver::Lost,
            })
        })
    }

    fn started_at(&self) -> Option<Instant> {
        self.counted_from_grant.then(|| self.spare().fresh_at)
    }
}

impl fmt::Debug for EtcdLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLease")
            .field("lease", &self.lease_id)
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// The lease of `token`'s entry, which holds the lock; its deletion by
    /// anyone else raises `loss`. Counted from `entry.lease.fresh_at` if
    /// `counted_from_grant`.
    pub(super) fn granted(
        &self,
        entry: Queued,
        token: LockToken,
        counted_from_grant: bool,
        loss: &LossSignal,
    ) -> EtcdLease {
        let key = entry.entry;
        let opener = self.inner.prefix.as_bytes();
        let watch =
            self.inner
                .shared
                .held
                .hold(&self.inner.watches, opener, &key, entry.created, loss);
        EtcdLease {
            store: self.clone(),
            queue: entry.queue,
            key,
            token,
            secs: entry.secs,
            lease_id: entry.lease.id,
            renewed_at: Mutex::new(entry.lease.fresh_at),
            created: entry.created,
            watch,
            loss: loss.clone(),
            counted_from_grant,
            one_of_many: false,
        }
    }
}
