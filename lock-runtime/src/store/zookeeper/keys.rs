//! A lock key as one node name, and what a child's name says it claims.

use std::num::NonZeroU32;
use std::time::Duration;

use crate::store::Claim;

/// [`encode_onto`] into a new string.
#[cfg(test)]
pub(super) fn encode(key: &str) -> String {
    let mut name = String::new();
    encode_onto(&mut name, key);
    name
}

/// Appends `key` to `name` as one node name: every byte outside
/// `[A-Za-z0-9_.:-]`, and a leading `.`, as `%XX`; so `/`, `.`, `..` and
/// control characters cannot escape into another node.
pub(super) fn encode_onto(name: &mut String, key: &str) {
    const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
    for (i, byte) in key.bytes().enumerate() {
        let plain = byte.is_ascii_alphanumeric()
            || matches!(byte, b'_' | b':' | b'-')
            || (byte == b'.' && i > 0);
        if plain {
            name.push(char::from(byte));
        } else {
            name.push('%');
            name.push(char::from(DIGITS[usize::from(byte >> 4)]));
            name.push(char::from(DIGITS[usize::from(byte & 0xf)]));
        }
    }
}

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

/// A child's data: its holder's ttl in milliseconds, in decimal, so that
/// others can tell when it is overdue.
pub(super) fn ttl_data(ttl: Duration) -> Vec<u8> {
    ttl.as_millis().to_string().into_bytes()
}

/// The ttl a child's data states; `None` for a child without one.
pub(super) fn ttl_of(data: &[u8]) -> Option<Duration> {
    let millis = std::str::from_utf8(data).ok()?.parse().ok()?;
    Some(Duration::from_millis(millis))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_become_one_node_name_each() {
        assert_eq!(encode("stock:7"), "stock:7");
        assert_eq!(encode("a/b"), "a%2Fb");
        assert_eq!(encode(".."), "%2E.");
        assert_eq!(encode("."), "%2E");
        assert_eq!(encode("x y%"), "x%20y%25");
        assert_eq!(encode("é"), "%C3%A9");
    }

    #[test]
    fn a_child_s_data_states_its_ttl() {
        let ttl = Duration::from_millis(2_500);
        assert_eq!(ttl_of(&ttl_data(ttl)), Some(ttl));
        assert_eq!(ttl_of(b""), None);
        assert_eq!(ttl_of(b"soon"), None);
    }
}
