//! An acquire attempt, one transaction; and a waiter's attempt answered
//! from its queue's watch.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse};
use tokio::time::Instant;

use super::EtcdStore;
use super::calls::{gets, lease_gone, owned, revision};
use super::holders::claim_of;
use super::keys::{entry_for, first_of, queue_end};
use super::state::{Queued, Spare};
use crate::error::StoreError;
use crate::store::common::queue::Place;
use crate::store::{Acquire, AcquireRequest};

impl EtcdStore {
    /// An attempt by transaction (see the module's documentation).
    /// `known` is the entry a waiter asks again with, if any, in `queue`.
    pub(super) async fn attempt(
        &self,
        request: AcquireRequest<'_>,
        queue: Vec<u8>,
        secs: i64,
        mut known: Option<Queued>,
    ) -> Result<Acquire, StoreError> {
        let token = request.token.to_string();
        // A prepared lease (or a waiter's) may have expired meanwhile: then
        // once more with a new one.
        let mut tries = 0;
        let (spare, entry, answer, flat) = loop {
            tries += 1;
            // A first attempt's entry, named by a lease nobody else uses,
            // does not exist yet: it is put without looking.
            let flat = request.hints.waits && known.is_none();
            let (spare, entry) = match &known {
                Some(known) => (known.lease, known.entry.clone()),
                None => {
                    let spare = self.spare(secs, &queue).await?;
                    (spare, entry_for(&queue, spare.id, false))
                }
            };
            let build = || {
                let put = || {
                    let on_lease = PutOptions::new().with_lease(spare.id);
                    TxnOp::put(entry.clone(), token.clone(), Some(on_lease))
                };
                let first = || TxnOp::get(queue.clone(), Some(first_of(&queue)));
                // Nobody holds or waits: ours, as cheaply as a plain lock.
                let empty = Compare::create_revision(queue.clone(), CompareOp::Equal, 0)
                    .with_range(queue_end(&queue));
                if flat {
                    // Queue ours: put, then read it and the head (reads in
                    // a transaction see its earlier writes).
                    return Txn::new().when([empty]).and_then([put()]).or_else([
                        put(),
                        TxnOp::get(entry.clone(), None),
                        first(),
                    ]);
                }
                let otherwise = if request.hints.waits {
                    // Queue ours, or find it queued already.
                    TxnOp::txn(
                        Txn::new()
                            .when([Compare::create_revision(entry.clone(), CompareOp::Equal, 0)])
                            .and_then([put(), first()])
                            .or_else([TxnOp::get(entry.clone(), None), first()]),
                    )
                } else {
                    first()
                };
                Txn::new()
                    .when([empty])
                    .and_then([put()])
                    .or_else([otherwise])
            };
            match self.txn_built(build).await {
                Err(err) if tries < 2 && lease_gone(&err) => {
                    if known.take().is_some() {
                        self.inner.shared.queued().remove(&request.token);
                    }
                }
                answer => break (spare, entry, answer?, flat),
            }
        };
        // A waiter's answer is the nested transaction's, unless the queue
        // was empty.
        let nested = answer.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Txn(nested) => Some(nested),
            _ => None,
        });
        let (put, read) = match &nested {
            Some(nested) => (nested.succeeded(), gets(nested)),
            None => (answer.succeeded() || flat, gets(&answer)),
        };
        let holder = read.last().cloned().flatten();
        // The head of the queue holds the key: a semaphore's permit there
        // makes this exclusive claim a mismatch (`Claim::meets`).
        let misfit = holder
            .as_ref()
            .and_then(|head| request.claim.fits(claim_of(&queue, head.key())).err());
        if let Some(misfit) = misfit {
            self.inner.shared.queued().remove(&request.token);
            if put || known.is_some() {
                // Ours was queued: it leaves before the answer.
                let withdraw = Txn::new()
                    .when([owned(&entry, &token)])
                    .and_then([TxnOp::delete(entry.clone(), None)]);
                self.txn(&withdraw).await?;
            }
            if known.is_none() {
                self.inner.shared.give_back(secs, spare, &queue);
            }
            return Err(misfit.into());
        }
        if put {
            // Our entry's create revision: the transaction's, unless read
            // (a put that ran twice keeps the first one's).
            let created = read
                .iter()
                .flatten()
                .find(|kv| kv.key() == entry.as_slice())
                .map_or_else(
                    || i64::try_from(revision(&answer)).unwrap_or(i64::MAX),
                    KeyValue::create_revision,
                );
            let ours = Queued {
                queue,
                entry,
                created,
                lease: spare,
                secs,
                place: Place::Unknown,
            };
            match holder {
                Some(holder) if holder.key() != ours.entry => {
                    if holder.value() == token.as_bytes() {
                        // An earlier entry of ours heads the queue (an
                        // attempt by the same token whose answer was
                        // lost): drop the new one, take that one.
                        let drop_new = Txn::new()
                            .when([owned(&ours.entry, &token)])
                            .and_then([TxnOp::delete(ours.entry.clone(), None)]);
                        self.txn(&drop_new).await?;
                        self.inner.shared.give_back(secs, spare, &ours.queue);
                        return self.resume(&request, ours.queue, &holder, secs).await;
                    }
                    // Queued behind the holder (wait mode).
                    self.inner.shared.queued().insert(request.token, ours);
                    Ok(Acquire::Held { remaining: None })
                }
                _ => {
                    let lease = self.granted(ours, request.token, true, request.loss);
                    Ok(Acquire::Acquired {
                        fencing: Some(lease.created.max(0).unsigned_abs()),
                        lease: Box::new(lease),
                    })
                }
            }
        } else {
            if known.is_none() {
                self.inner.shared.give_back(secs, spare, &queue);
            }
            let Some(holder) = holder else {
                // Emptied between the compare and the read cannot happen in
                // one transaction; a key without entries is free.
                return Ok(Acquire::Held {
                    remaining: Some(Duration::ZERO),
                });
            };
            if holder.value() == token.as_bytes() {
                // Ours heads the queue: an earlier attempt whose answer was
                // lost, or a waiter whose watch has not told it yet.
                return self.resume(&request, queue, &holder, secs).await;
            }
            let Some(mine) = read
                .first()
                .cloned()
                .flatten()
                .filter(|_| request.hints.waits)
            else {
                return Ok(Acquire::Held {
                    remaining: self.remaining(holder.lease()).await?,
                });
            };
            if mine.value() != token.as_bytes() {
                return Err("etcd: a lease's lock entry holds another token".into());
            }
            // Still queued: keep our entry alive.
            let mut ours = Queued {
                queue,
                entry,
                created: mine.create_revision(),
                lease: spare,
                secs,
                place: known.map_or(Place::Unknown, |known| known.place),
            };
            self.inner
                .shared
                .queued()
                .insert(request.token, ours.clone());
            if !self.keep_queued(request.token, &mut ours).await? {
                // Its lease ended: queue again.
                return Box::pin(self.attempt(request, ours.queue, secs, None)).await;
            }
            Ok(Acquire::Held { remaining: None })
        }
    }

    /// The lock held by `holder`, an entry of ours (by `request`'s token),
    /// if its lease is still alive; it is extended now, so it counts from
    /// now.
    pub(super) async fn resume(
        &self,
        request: &AcquireRequest<'_>,
        queue: Vec<u8>,
        holder: &KeyValue,
        secs: i64,
    ) -> Result<Acquire, StoreError> {
        self.inner.shared.queued().remove(&request.token);
        let ours = Queued {
            queue,
            entry: holder.key().to_vec(),
            created: holder.create_revision(),
            lease: Spare {
                id: holder.lease(),
                fresh_at: Instant::now(),
            },
            secs,
            place: Place::Head,
        };
        let lease = self.granted(ours, request.token, false, request.loss);
        if lease.refresh().await? {
            return Ok(Acquire::Acquired {
                fencing: Some(lease.created.max(0).unsigned_abs()),
                lease: Box::new(lease),
            });
        }
        Ok(Acquire::Held {
            remaining: Some(Duration::ZERO),
        })
    }
}
