//! The error a store gives when a claim does not fit how its key is held.

use crate::store::Claim;

/// Says that a key held under `held` cannot be claimed as `asked`: every
/// caller of a key must use one kind of lock with one limit.
pub(crate) fn mismatch(held: Claim, asked: Claim) -> String {
    format!(
        "the key is held as {} and this call claims it as {}: every caller of a key must use one kind of lock with one limit",
        describe(held),
        describe(asked)
    )
}

/// How many of a queue's first entries (their claims, in arrival order)
/// hold its key, in a store that serves waiters in order (etcd,
/// ZooKeeper): the first, and behind it the shares that follow a share, or
/// the permits (up to the limit) that follow a permit. A writer queued
/// ahead of later shares keeps them out.
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
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

/// Whether `asked` may queue behind `ahead` at all: anything behind an
/// exclusive claim, shares behind shares, permits behind permits of the
/// same limit; else the [`mismatch`].
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
pub(crate) fn fits_behind(ahead: Claim, asked: Claim) -> Result<(), String> {
    match (ahead, asked) {
        (Claim::Exclusive, _) | (Claim::Shared, Claim::Shared) => Ok(()),
        (Claim::Permit { limit: a }, Claim::Permit { limit: b }) if a == b => Ok(()),
        (ahead, asked) => Err(mismatch(ahead, asked)),
    }
}

fn describe(claim: Claim) -> String {
    match claim {
        Claim::Exclusive => "a mutex or write lock (1 permit)".into(),
        Claim::Shared => "a read lock".into(),
        Claim::Permit { limit } => format!("a semaphore of {limit} permits"),
    }
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;

    #[test]
    fn a_mismatch_names_both_claims() {
        let three = Claim::permits(NonZeroU32::new(3).unwrap());
        let four = Claim::permits(NonZeroU32::new(4).unwrap());
        let said = mismatch(three, four);
        assert!(
            said.contains("a semaphore of 3 permits") && said.contains("a semaphore of 4 permits"),
            "{said}"
        );
        assert!(mismatch(Claim::Shared, three).contains("a read lock"));
    }

    #[cfg(any(feature = "etcd", feature = "zookeeper"))]
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
        assert_eq!(holding(&[two, x, two]), 1);
        assert!(fits_behind(x, s).is_ok() && fits_behind(s, s).is_ok());
        assert!(fits_behind(two, s).is_err() && fits_behind(s, two).is_err());
    }
}
