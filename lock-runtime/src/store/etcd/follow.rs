//! A waiter following its key's queue on the shared watch.

use std::collections::{HashMap, HashSet};

use tokio::sync::{broadcast, watch};
use tokio::task::AbortHandle;

use super::holders;
use super::queues::Deletion;
use super::{EtcdStore, WATCH_RETRY};
use crate::error::StoreError;
use crate::store::Claim;
use crate::store::common::queue::Place;

/// Follows `queue` for a waiter until nobody listens, on the key's shared
/// watch ([`queues`]): lists the queue once the watch is open, and applies
/// the deletions after the listing. Our entry heads the queue once every
/// entry created before it is deleted; that is noted in its [`Place`] and
/// reported on `tx`, as is the deletion of our own entry (and, for a share
/// or permit, which may hold behind others, every deletion ahead of it). With no entry of
/// ours, every deletion is reported. A reset or lagging watch lists the
/// queue again. `placed` is told once the first listing is made (or what
/// failed).
pub(super) async fn follow(
    store: EtcdStore,
    queue: Vec<u8>,
    tx: watch::Sender<()>,
    placed: tokio::sync::oneshot::Sender<Result<(), StoreError>>,
) {
    let mut placed = Some(placed);
    let mut subscription = store
        .inner
        .shared
        .queues
        .subscribe(&store.inner.watches, &queue);
    loop {
        let listed = async {
            let timeout = store.inner.timeout;
            tokio::time::timeout(timeout, subscription.opened())
                .await
                .map_err(|_| format!("no answer from etcd within {timeout:?}"))?;
            store.list(&queue).await
        }
        .await;
        let (entries, at) = match listed {
            Ok(listed) => listed,
            Err(err) => {
                if let Some(placed) = placed.take() {
                    let _ = placed.send(Err(err));
                    return;
                }
                tracing::debug!(%err, "etcd queue: listing again failed");
                tokio::time::sleep(WATCH_RETRY).await;
                continue;
            }
        };
        // Ours: the earliest of our entries still there.
        let ours: HashMap<Vec<u8>, i64> = store
            .inner
            .shared
            .queued()
            .iter()
            .filter(|(_, entry)| entry.queue == queue)
            .map(|(_, entry)| (entry.entry.clone(), entry.created))
            .collect();
        let mine = entries
            .iter()
            .filter(|(key, created)| ours.get(key) == Some(created))
            .min_by_key(|(_, created)| *created)
            .cloned();
        let mut ahead: HashSet<Vec<u8>> = match &mine {
            Some((_, created)) => entries
                .iter()
                .filter(|(_, at)| at < created)
                .map(|(key, _)| key.clone())
                .collect(),
            None => HashSet::new(),
        };
        match &mine {
            Some((_, created)) if ahead.is_empty() => {
                store.inner.shared.place(&queue, *created, Place::Head);
            }
            Some((_, created)) => store.inner.shared.place(&queue, *created, Place::Behind),
            None => store.inner.shared.place(&queue, 0, Place::Unknown),
        }
        match placed.take() {
            Some(placed) => {
                let _ = placed.send(Ok(()));
            }
            // Wake the waiter to look: a listing after the first may
            // follow changes nobody reported.
            None => {
                tx.send_replace(());
            }
        }
        // Apply deletions until ours goes or the queue must be listed again.
        loop {
            let deleted = match subscription.deletions.recv().await {
                Ok(Deletion::Deleted { entry, revision }) if revision > at => entry,
                // Already in the listing.
                Ok(Deletion::Deleted { .. }) => continue,
                Ok(Deletion::Reset) | Err(broadcast::error::RecvError::Lagged(_)) => break,
                Err(broadcast::error::RecvError::Closed) => {
                    subscription = store
                        .inner
                        .shared
                        .queues
                        .subscribe(&store.inner.watches, &queue);
                    break;
                }
            };
            match &mine {
                None => {
                    // Wake the waiter; list again, to find an entry it
                    // may have made meanwhile.
                    tx.send_replace(());
                    break;
                }
                Some((ours, _)) if *ours == deleted => {
                    // Ours is gone (its lease ended, or it was deleted):
                    // the waiter queues again.
                    store.inner.shared.place(&queue, 0, Place::Unknown);
                    tx.send_replace(());
                    break;
                }
                Some((ours, created)) => {
                    if !ahead.remove(&deleted) {
                        continue;
                    }
                    if ahead.is_empty() {
                        store.inner.shared.place(&queue, *created, Place::Head);
                        tx.send_replace(());
                    } else if holders::claim_of(&queue, ours) != Claim::Exclusive {
                        // A share or permit may hold behind others: look.
                        tx.send_replace(());
                    }
                }
            }
        }
        if tx.is_closed() {
            return;
        }
    }
}

/// Aborts a task when the subscription it serves is dropped.
pub(super) struct AbortOnDrop(pub(super) AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
