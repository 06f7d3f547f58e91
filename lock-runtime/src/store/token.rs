//! The token that names one holder of one lease.

use std::fmt;

use crate::error::StoreError;

/// The random 128-bit value that identifies one holder of one lease.
///
/// Only the holder knows it, so only the holder can renew or release. Its
/// high 64 bits are drawn once per process and its low 64 bits for each
/// token, so a token read back from a store tells whether a lease is held
/// by this process ([`is_from_this_process`](Self::is_from_this_process))
/// without any bookkeeping on the lock path.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LockToken(u128);

/// This process's half of every token it draws.
static PROCESS_BITS: once_cell::sync::Lazy<u64> = once_cell::sync::Lazy::new(rand::random);

impl LockToken {
    /// Draws a new token: this process's 64 bits and 64 fresh ones from the
    /// thread's cryptographically seeded RNG.
    pub fn random() -> Self {
        let process = u128::from(*PROCESS_BITS) << 64;
        LockToken(process | u128::from(rand::random::<u64>()))
    }

    /// A token of the given value, as read back from a store.
    pub const fn from_u128(value: u128) -> Self {
        LockToken(value)
    }

    /// The token as a number.
    pub fn as_u128(self) -> u128 {
        self.0
    }

    /// Whether [`random`](Self::random) drew this token in this process.
    pub fn is_from_this_process(self) -> bool {
        (self.0 >> 64) as u64 == *PROCESS_BITS
    }
}

impl std::str::FromStr for LockToken {
    type Err = StoreError;

    /// Parses the 32 hex digits of [`Display`](fmt::Display).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.len() != 32 {
            return Err(format!("a lock token has 32 hex digits, not {:?}", text).into());
        }
        u128::from_str_radix(text, 16)
            .map(LockToken)
            .map_err(|_| format!("a lock token has 32 hex digits, not {text:?}").into())
    }
}

impl LockToken {
    /// The 32 lowercase hex digits stores keep, without formatting
    /// machinery or an allocation (they are sent with every call).
    pub(crate) fn hex(self) -> [u8; 32] {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut out = [0u8; 32];
        for (i, digit) in out.iter_mut().enumerate() {
            let nibble = (self.0 >> (124 - 4 * i)) & 0xf;
            *digit = DIGITS[nibble as usize];
        }
        out
    }
}

impl fmt::Display for LockToken {
    /// Formats as 32 lowercase hex digits, the form stores keep.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hex = self.hex();
        // Hex digits are ASCII.
        f.write_str(std::str::from_utf8(&hex).map_err(|_| fmt::Error)?)
    }
}

impl fmt::Debug for LockToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockToken({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::LockToken;

    /// The hand-written digits are `{:032x}`'s, and parse back.
    #[test]
    fn tokens_are_32_hex_digits_that_parse_back() {
        for value in [0, 1, 0xabc, u128::MAX, u128::MAX / 3, 1 << 127] {
            let token = LockToken(value);
            let shown = token.to_string();
            assert_eq!(shown, format!("{value:032x}"));
            assert_eq!(shown.parse::<LockToken>().unwrap(), token);
        }
        let drawn = LockToken::random();
        assert_eq!(drawn.to_string().parse::<LockToken>().unwrap(), drawn);
    }
}
