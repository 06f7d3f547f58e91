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
}
