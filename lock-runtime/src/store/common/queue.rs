//! Waiters queued in the store (etcd, ZooKeeper): who of the queue holds
//! the key, and where a waiter stands.

use crate::store::Claim;

/// Where a waiter's node or entry stands in a store's queue, as the
/// waiter's watch knows it (ZooKeeper, etcd). None can join ahead of ours
/// (sequences and revisions only grow), so this stays true until one ahead
/// of ours goes, or ours does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// Read the queue to know.
    Unknown,
    /// First: every one ahead of ours was deleted, or a listing found ours
    /// first.
    Head,
    /// Behind one that is still there (its deletion is watched).
    Behind,
}

/// How many of a queue's first entries (their claims, in arrival order)
/// hold its key, in a store that serves waiters in order (etcd,
/// ZooKeeper): the first, and behind it the shares that follow a share, or
/// the permits (up to the limit) that follow a permit: the claims that
/// [join](crate::store::Meeting::Joins) it. A writer queued ahead of later
/// shares keeps them out.
pub(crate) fn holding(claims: &[Claim]) -> usize {
    let Some(&first) = claims.first() else {
        return 0;
    };
    let joined = claims.iter().take_while(|&&claim| claim == first).count();
    match first {
        Claim::Exclusive => 1,
        Claim::Shared => joined,
        Claim::Permit { limit } => joined.min(limit.get() as usize),
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;

    #[test]
    fn the_front_of_a_queue_holds_as_its_claims_allow() {
        let (x, s) = (Claim::Exclusive, Claim::Shared);
        let two = Claim::permits(NonZeroU32::new(2).unwrap());
        assert_eq!(holding(&[]), 0);
        assert_eq!(holding(&[x, x]), 1);
        assert_eq!(
            holding(&[s, s, x, s]),
            2,
            "a writer waits, readers behind it too"
        );
        assert_eq!(holding(&[x, s, s]), 1);
        assert_eq!(holding(&[two, two, two]), 2);
    }
}
