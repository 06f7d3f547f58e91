//! Read shares and semaphore permits: children in the key's queue, as a
//! mutex's, whose names say what they claim; who holds follows from their
//! sequence, as in Curator's recipes.

use super::ZooKeeperStore;
use super::keys::claim_of;
use super::lease::ZooKeeperLease;
use super::queue::Enqueued;
use super::shared::Child;
use crate::error::BackendError;
use crate::store::support::claims::{fits_behind, holding};
use crate::store::support::queue::Place;
use crate::store::{Acquire, AcquireRequest, Claim};

/// Whether the child at `at` of `queue` (sorted by sequence) holds the
/// key; the mismatch when a child ahead claims it another way.
pub(super) fn holds(queue: &[String], at: usize) -> Result<bool, String> {
    let claims: Vec<Claim> = queue.iter().map(|name| claim_of(name)).collect();
    let ours = claims[at];
    for &ahead in &claims[..at] {
        fits_behind(ahead, ours)?;
    }
    Ok(at < holding(&claims))
}

impl ZooKeeperStore {
    /// The children of `parent` that hold its key, in sequence order: the
    /// first, and the shares or permits that hold beside it.
    pub(super) async fn holders(&self, parent: &str) -> Result<Vec<String>, BackendError> {
        let mut queue = self.shared.queue(parent).await?;
        let claims: Vec<Claim> = queue.iter().map(|name| claim_of(name)).collect();
        queue.truncate(holding(&claims));
        Ok(queue)
    }

    /// An attempt at a share or permit: our child queued (or the one a
    /// waiter has), held if the children ahead allow it. Alone in the
    /// queue it is one request; behind others, a listing follows unless
    /// the waiter's watch knows where ours stands. In skip mode a refused
    /// child is deleted again; in wait mode it keeps its place.
    pub(super) async fn claim(
        &self,
        request: AcquireRequest<'_>,
        sent_at: tokio::time::Instant,
    ) -> Result<Acquire, BackendError> {
        let shared = &self.shared;
        let parent = shared.parent(request.key);
        let known = shared.created().get(&request.token).cloned().flatten();
        let placed = known.map(|child| child.place);
        let mut found = shared
            .enqueue(&parent, request.token, request.claim)
            .await?;
        if found.is_none() {
            found = shared
                .enqueue(&parent, request.token, request.claim)
                .await?;
        }
        let Some(Enqueued {
            child,
            first,
            queue,
        }) = found
        else {
            return Err("our lock node vanished twice in a row".into());
        };
        let verdict = if first {
            Ok(true)
        } else if placed == Some(Place::Behind) {
            Ok(false)
        } else {
            // The queue as enqueuing read it, if it did.
            let queue = match queue {
                Some(queue) => queue,
                None => shared.queue(&parent).await?,
            };
            match queue.iter().position(|name| name == child.name()) {
                Some(at) => holds(&queue, at),
                None => Ok(false),
            }
        };
        match verdict {
            Ok(true) => Ok(self.granted(request, child, sent_at)),
            Ok(false) if request.waits => Ok(Acquire::Held { remaining: None }),
            refused => {
                shared.withdraw(&parent, request.token).await?;
                refused?;
                Ok(Acquire::Held { remaining: None })
            }
        }
    }

    /// The lease of `child`, which holds the key for `request`.
    pub(super) fn granted(
        &self,
        request: AcquireRequest<'_>,
        child: Child,
        sent_at: tokio::time::Instant,
    ) -> Acquire {
        let shared = &self.shared;
        let fencing = u64::try_from(child.czxid).unwrap_or(0);
        shared
            .held()
            .insert(child.path.clone(), request.loss.clone());
        let lease = ZooKeeperLease::new(shared.clone(), request.token, child, request.ttl, sent_at);
        Acquire::Acquired {
            fencing,
            lease: Box::new(lease),
        }
    }
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
        assert!(holds(&permits, 3).unwrap_err().contains("3 permits"));
    }
}
