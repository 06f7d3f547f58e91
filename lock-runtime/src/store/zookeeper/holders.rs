//! Read shares and semaphore permits: children in the key's queue, as a
//! mutex's, whose names say what they claim; who holds follows from their
//! sequence, as in Curator's recipes.

use tokio::time::Instant;

use super::ZooKeeperStore;
use super::keys::claim_of;
use super::lease::ZooKeeperLease;
use super::queue::Enqueued;
use crate::error::StoreError;
use crate::store::common::queue::{Place, holding};
use crate::store::{Acquire, AcquireRequest, Claim, ClaimMismatch};

/// Whether the child at `at` of `queue` (sorted by sequence) holds the
/// key; the mismatch when a child ahead claims it as another kind of lock
/// ([`Claim::meets`]).
pub(super) fn holds(queue: &[String], at: usize) -> Result<bool, ClaimMismatch> {
    let claims: Vec<Claim> = queue.iter().map(|name| claim_of(name)).collect();
    let ours = claims[at];
    for &ahead in &claims[..at] {
        ours.fits(ahead)?;
    }
    Ok(at < holding(&claims))
}

impl ZooKeeperStore {
    /// One acquire of `request` on `parent`'s queue (see the module docs),
    /// once more after a holder ahead was found overdue and deleted, or
    /// ours found gone at its grant.
    pub(super) async fn attempt_acquire(
        &self,
        parent: &str,
        request: &AcquireRequest<'_>,
    ) -> Result<Acquire, StoreError> {
        let shared = &self.shared;
        for _ in 0..3 {
            let sent_at = Instant::now();
            match self.attempt(parent, request).await? {
                Attempt::Holds(found) => {
                    if let Some(granted) = self.grant(request, found, sent_at).await? {
                        return Ok(granted);
                    }
                }
                Attempt::Behind(queue) => {
                    if !shared.reap_overdue(parent, queue).await? {
                        break;
                    }
                    shared.unplace(request.token);
                }
            }
        }
        if !request.hints.waits {
            shared.withdraw(parent, request.token).await?;
        }
        Ok(Acquire::Held { remaining: None })
    }

    /// The children of `parent` that hold its key, in sequence order: the
    /// first, and the shares or permits that hold beside it.
    pub(super) async fn holders(&self, parent: &str) -> Result<Vec<String>, StoreError> {
        let mut queue = self.shared.queue(parent).await?;
        let claims: Vec<Claim> = queue.iter().map(|name| claim_of(name)).collect();
        queue.truncate(holding(&claims));
        Ok(queue)
    }

    /// One look at `parent`'s queue for `request`: our child queued (or
    /// the one a waiter has), and whether it holds. Alone in the queue it
    /// is one request; behind others, the queue is read unless the
    /// waiter's watch knows where ours stands (its first look checked it).
    /// A child queued behind another kind of lock is withdrawn, and the
    /// answer is the mismatch naming both.
    pub(super) async fn attempt(
        &self,
        parent: &str,
        request: &AcquireRequest<'_>,
    ) -> Result<Attempt, StoreError> {
        let shared = &self.shared;
        let (token, asked) = (request.token, (request.claim, request.ttl));
        let known = shared.created().get(&token).cloned().flatten();
        let placed = known.map(|child| child.place);
        let mut found = shared.enqueue(parent, token, asked).await?;
        if found.is_none() {
            // Ours was gone: queue again.
            found = shared.enqueue(parent, token, asked).await?;
        }
        let Some(mut found) = found else {
            return Err("our lock node vanished twice in a row".into());
        };
        if found.first {
            return Ok(Attempt::Holds(found));
        }
        if placed == Some(Place::Behind) {
            return Ok(Attempt::Behind(found.queue));
        }
        // The queue as enqueuing read it, if it did.
        let queue = match found.queue.take() {
            Some(queue) => queue,
            None => shared.queue(parent).await?,
        };
        let verdict = match queue.iter().position(|name| name == found.child.name()) {
            Some(at) => holds(&queue, at),
            None => Ok(false),
        };
        match verdict {
            Ok(true) => Ok(Attempt::Holds(found)),
            Ok(false) => Ok(Attempt::Behind(Some(queue))),
            Err(mismatch) => {
                shared.withdraw(parent, token).await?;
                Err(mismatch.into())
            }
        }
    }

    /// The lease of `found`, which holds the key for `request`. A child
    /// not created by this attempt (it waited) is written first, so its
    /// lease counts from now for others too (see [`overdue`](super::overdue));
    /// `None` if it was gone by then (found overdue while its holder was
    /// away).
    pub(super) async fn grant(
        &self,
        request: &AcquireRequest<'_>,
        found: Enqueued,
        mut sent_at: tokio::time::Instant,
    ) -> Result<Option<Acquire>, StoreError> {
        let shared = &self.shared;
        let child = found.child;
        if !found.fresh {
            sent_at = tokio::time::Instant::now();
            if !shared.touch(child.path(), request.ttl).await? {
                shared.created().remove(&request.token);
                return Ok(None);
            }
        }
        let fencing = u64::try_from(child.czxid).unwrap_or(0);
        shared
            .held()
            .insert(child.path.clone(), request.loss.clone());
        let lease = ZooKeeperLease::new(shared.clone(), request.token, child, request.ttl, sent_at);
        Ok(Some(Acquire::Acquired {
            fencing: Some(fencing),
            lease: Box::new(lease),
        }))
    }
}

/// What one look at a key's queue found for an attempt.
pub(super) enum Attempt {
    /// Our child holds the key.
    Holds(Enqueued),
    /// Our child is behind others; the queue, if it was read.
    Behind(Option<Vec<String>>),
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::super::keys::tag;
    use super::*;

    #[test]
    fn a_child_s_name_says_what_it_claims() {
        let three = Claim::permits(NonZeroU32::new(3).unwrap());
        for claim in [Claim::Exclusive, Claim::Shared, three] {
            let name = format!("00ff-{}0000000007", tag(claim));
            assert_eq!(claim_of(&name), claim, "{name}");
        }
    }

    #[test]
    fn a_child_holds_as_the_children_ahead_allow() {
        let queue: Vec<String> = ["a-s-1", "b-s-2", "c-3", "d-s-4"]
            .iter()
            .map(|name| name.to_string())
            .collect();
        assert_eq!(holds(&queue, 1), Ok(true));
        assert_eq!(holds(&queue, 3), Ok(false), "a writer queued ahead");
        let permits: Vec<String> = ["a-p2-1", "b-p2-2", "c-p2-3", "d-p3-4"]
            .iter()
            .map(|name| name.to_string())
            .collect();
        assert_eq!(holds(&permits, 1), Ok(true));
        assert_eq!(holds(&permits, 2), Ok(false));
        assert!(
            holds(&permits, 3)
                .unwrap_err()
                .to_string()
                .contains("3 permits")
        );
        let mixed: Vec<String> = ["a-p2-1", "b-2", "c-s-3"]
            .iter()
            .map(|name| name.to_string())
            .collect();
        assert!(holds(&mixed, 1).is_err(), "a mutex behind permits");
        assert!(holds(&mixed, 2).is_err(), "a share behind permits");
    }
}
