//! How the SQL stores' lease tables write a claim in a key's row, in place
//! of a token.

use std::num::NonZeroU32;

use crate::store::Claim;

/// A share or permit claim as the key's row holds it (`*shared`,
/// `*permits:N`), and its limit (0 for a share).
pub(crate) fn text(claim: Claim) -> (String, i32) {
    match claim {
        Claim::Permit { limit } => (
            format!("*permits:{limit}"),
            i32::try_from(limit.get()).unwrap_or(i32::MAX),
        ),
        _ => ("*shared".to_owned(), 0),
    }
}

/// The claim a key's row holds: a share or permit claim written by
/// [`text`], else (a holder's token) an exclusive one.
pub(crate) fn claim_of(held: &str) -> Claim {
    match held.strip_prefix("*permits:").map(str::parse) {
        Some(Ok(limit)) => NonZeroU32::new(limit).map_or(Claim::Exclusive, Claim::permits),
        _ if held == "*shared" => Claim::Shared,
        _ => Claim::Exclusive,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_are_read_back_as_written() {
        let three = Claim::permits(NonZeroU32::new(3).unwrap());
        for claim in [Claim::Shared, three] {
            assert_eq!(claim_of(&text(claim).0), claim);
        }
        assert_eq!(text(three).1, 3);
        assert_eq!(claim_of("0123abcd"), Claim::Exclusive);
    }
}
