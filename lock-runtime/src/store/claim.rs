//! What an acquire claims on its key, and the one rule that says which
//! claims share a key, which wait, and which are a mistake.

use std::fmt;
use std::num::NonZeroU32;

use crate::error::StoreError;

/// What an acquire claims on its key. A store says which claims it serves
/// in its [`Capabilities`](super::Capabilities); the runtime never asks a
/// store for one it does not serve.
///
/// A key is used one way by all its holders: as a read-write lock
/// (exclusive and shared claims; a mutex is its exclusive side) or as a
/// semaphore of one limit (permit claims; a mutex is also the semaphore of
/// one). [`Claim::meets`] is the rule every store keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Claim {
    /// The key alone: granted only when nobody holds it in any way. A
    /// mutex, the writer of a read-write lock, a semaphore of one permit.
    Exclusive,
    /// A share of the key: granted alongside other shares, never alongside
    /// an exclusive holder. The reader of a read-write lock. A store that
    /// queues waiters refuses new shares while an exclusive claim waits, so
    /// a stream of shares cannot starve it.
    Shared,
    /// One of `limit` permits: granted while fewer than `limit` hold the
    /// key. Made by [`Claim::permits`], never with a limit of 1 (that is
    /// [`Exclusive`](Claim::Exclusive)).
    Permit {
        /// How many may hold the key at once (at least 2).
        limit: NonZeroU32,
    },
}

/// How a claim meets a key held under another: see [`Claim::meets`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Meeting {
    /// Granted beside the holder: a share beside shares (unless an
    /// exclusive claim waits, in a store that queues or marks waiters), a
    /// permit beside permits of the same limit while fewer than the limit
    /// hold.
    Joins,
    /// Granted once the holder is gone: anything against an exclusive
    /// holder of a read-write lock, an exclusive claim against shares.
    Waits,
    /// Never granted while the key is held so: the two claims use the key
    /// as different kinds of lock. The store answers at once with a
    /// [`ClaimMismatch`] ([`StoreError::misuse`]) and leaves nothing
    /// behind; the caller gets `LockError::InvalidOptions`.
    Mismatch,
}

impl Claim {
    /// One of `limit` permits: [`Exclusive`](Claim::Exclusive) for a limit
    /// of 1, [`Permit`](Claim::Permit) above.
    pub const fn permits(limit: NonZeroU32) -> Claim {
        if limit.get() == 1 {
            Claim::Exclusive
        } else {
            Claim::Permit { limit }
        }
    }

    /// How many may hold the key at once under this claim, when it is
    /// bounded: 1 for an exclusive claim, the limit of a permit, `None` for
    /// a share.
    pub const fn limit(self) -> Option<NonZeroU32> {
        match self {
            Claim::Exclusive => Some(NonZeroU32::MIN),
            Claim::Shared => None,
            Claim::Permit { limit } => Some(limit),
        }
    }

    /// The claim rule: how this claim meets a key that a live lease holds
    /// under `held`. A free key grants every claim (and becomes the kind of
    /// lock its first claim makes it).
    ///
    /// | held \ asked | exclusive | shared | permits of N | permits of M |
    /// |---|---|---|---|---|
    /// | exclusive | waits | waits | mismatch | mismatch |
    /// | shared | waits | joins | mismatch | mismatch |
    /// | permits of N | mismatch | mismatch | joins (up to N) | mismatch |
    ///
    /// Every store keeps this table, whatever keeps its state: the memory
    /// store and the queues of etcd and ZooKeeper call this function; the
    /// Redis scripts and the PostgreSQL functions implement it and cite it;
    /// the contract suite walks every pair on every store.
    pub const fn meets(self, held: Claim) -> Meeting {
        match (held, self) {
            (Claim::Shared, Claim::Shared) => Meeting::Joins,
            (Claim::Exclusive | Claim::Shared, Claim::Exclusive | Claim::Shared) => Meeting::Waits,
            (Claim::Permit { limit: held }, Claim::Permit { limit: asked })
                if held.get() == asked.get() =>
            {
                Meeting::Joins
            }
            _ => Meeting::Mismatch,
        }
    }

    /// `Ok` when this claim may be asked of a key held under `held` (it
    /// [joins or waits](Claim::meets)); the [`ClaimMismatch`] otherwise.
    pub fn fits(self, held: Claim) -> Result<(), ClaimMismatch> {
        match self.meets(held) {
            Meeting::Mismatch => Err(ClaimMismatch { held, asked: self }),
            Meeting::Joins | Meeting::Waits => Ok(()),
        }
    }
}

impl fmt::Display for Claim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Claim::Exclusive => f.write_str("exclusive"),
            Claim::Shared => f.write_str("shared"),
            Claim::Permit { limit } => write!(f, "one of {limit} permits"),
        }
    }
}

/// A claim asked of a key held as another kind of lock ([`Meeting::Mismatch`]):
/// the error a store gives, as a [misuse](StoreError::misuse), naming both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClaimMismatch {
    /// How the key is held.
    pub held: Claim,
    /// What the refused call claimed.
    pub asked: Claim,
}

impl ClaimMismatch {
    /// The mismatch of `asked` against a key held under `held`.
    pub fn new(held: Claim, asked: Claim) -> Self {
        ClaimMismatch { held, asked }
    }
}

impl fmt::Display for ClaimMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the key is held as {} and this call claims it as {}: every caller of a key \
             must use one kind of lock with one limit",
            kind(self.held),
            kind(self.asked)
        )
    }
}

impl std::error::Error for ClaimMismatch {}

impl From<ClaimMismatch> for StoreError {
    fn from(mismatch: ClaimMismatch) -> Self {
        StoreError::misuse(mismatch)
    }
}

/// The kind of lock a claim makes of its key, for messages.
fn kind(claim: Claim) -> String {
    match claim {
        Claim::Exclusive => "a mutex or write lock (1 permit)".into(),
        Claim::Shared => "a read lock".into(),
        Claim::Permit { limit } => format!("a semaphore of {limit} permits"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn permits(n: u32) -> Claim {
        Claim::permits(NonZeroU32::new(n).unwrap())
    }

    #[test]
    fn the_rule_is_the_table() {
        let (x, s, three, four) = (Claim::Exclusive, Claim::Shared, permits(3), permits(4));
        use Meeting::{Joins, Mismatch, Waits};
        let table = [
            (x, [Waits, Waits, Mismatch, Mismatch]),
            (s, [Waits, Joins, Mismatch, Mismatch]),
            (three, [Mismatch, Mismatch, Joins, Mismatch]),
        ];
        for (held, row) in table {
            for (asked, expected) in [x, s, three, four].into_iter().zip(row) {
                assert_eq!(asked.meets(held), expected, "{asked} against {held}");
            }
        }
        assert_eq!(four.meets(four), Joins);
        assert_eq!(permits(1), x, "a semaphore of one is a mutex");
    }

    #[test]
    fn a_mismatch_names_both_claims() {
        let said = permits(4).fits(permits(3)).unwrap_err().to_string();
        assert!(
            said.contains("a semaphore of 3 permits") && said.contains("a semaphore of 4 permits"),
            "{said}"
        );
        let said = permits(3).fits(Claim::Exclusive).unwrap_err().to_string();
        assert!(said.contains("a mutex or write lock (1 permit)"), "{said}");
        let err = StoreError::from(ClaimMismatch::new(Claim::Shared, permits(3)));
        assert_eq!(err.kind(), crate::store::StoreErrorKind::Misuse);
        assert!(err.to_string().contains("a read lock"), "{err}");
    }
}
