//! Read shares and semaphore permits: children in the key's queue, as a
//! mutex's, whose names say what they claim; who holds follows from their
//! sequence, as in Curator's recipes.

use std::num::NonZeroU32;

use super::ZooKeeperStore;
use super::lease::ZooKeeperLease;
use super::shared::Child;
use crate::error::BackendError;
use crate::store::support::claims::{fits_behind, holding};
use crate::store::support::queue::Place;
use crate::store::{Acquire, AcquireRequest, Claim};

/// What a child's name says after its token and `-`, before its sequence:
/// nothing for an exclusive claim, `s-` for a share, `p<limit>-` for a
/// permit.
pub(super) fn tag(claim: Claim) -> String {
    match claim {
        Claim::Exclusive => String::new(),
        Claim::Shared => "s-".to_owned(),
        Claim::Permit { limit } => format!("p{limit}-"),
    }
}

/// What the child named `name` (`<token>-[<tag>-]<sequence>`) claims.
pub(super) fn claim_of(name: &str) -> Claim {
    let mut parts = name.split('-');
    let (_, tag, _) = (parts.next(), parts.next(), parts.next());
    match tag {
        Some("s") => Claim::Shared,
        Some(tag) => tag
            .strip_prefix('p')
            .and_then(|limit| limit.parse().ok())
            .and_then(NonZeroU32::new)
            .map_or(Claim::Exclusive, Claim::permits),
        None => Claim::Exclusive,
    }
}

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
        let Some((child, first)) = found else {
            return Err("our lock node vanished twice in a row".into());
        };
        let verdict = if first {
            Ok(true)
        } else if placed == Some(Place::Behind) {
            Ok(false)
        } else {
            let queue = shared.queue(&parent).await?;
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
