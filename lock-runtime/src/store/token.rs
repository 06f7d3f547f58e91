//! The token that names one holder of one lease.

use std::cell::Cell;
use std::fmt;

use crate::error::StoreError;

/// The 128-bit value that identifies one holder of one lease.
///
/// Each holder is given its own (see [`random`](Self::random)), so only the
/// holder can renew or release. Its high 64 bits are drawn once per process and its low 64
/// bits are new for each token, so a token read back from a store tells
/// whether a lease is held by this process
/// ([`is_from_this_process`](Self::is_from_this_process)) without any
/// bookkeeping on the lock path.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LockToken(u128);

/// This process's half of every token it draws.
static PROCESS_BITS: once_cell::sync::Lazy<u64> = once_cell::sync::Lazy::new(rand::random);

thread_local! {
    /// The count this thread's tokens are made from: from a random start,
    /// drawn at the thread's first token (0 until then).
    static COUNT: Cell<u64> = const { Cell::new(0) };
}

/// A bijection of `u64` that scatters consecutive counts (the finalizer of
/// SplitMix64): distinct counts give distinct tokens that do not read as
/// a sequence.
fn scatter(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl LockToken {
    /// A new token: this process's 64 bits, and 64 that this thread never
    /// gave another token (a count from a random start, scattered), so two
    /// holders share one only if two threads' counts, each from a random
    /// point of 2^64, ran into each other; cheaper than drawing them from
    /// an RNG, and with no atomic read-modify-write on the lock path.
    pub fn random() -> Self {
        let low = COUNT.with(|count| {
            let mut next = count.get();
            if next == 0 {
                next = rand::random::<u64>() | 1;
            }
            count.set(next.wrapping_add(1));
            scatter(next)
        });
        LockToken((u128::from(*PROCESS_BITS) << 64) | u128::from(low))
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
        for (pair, byte) in out.chunks_exact_mut(2).zip(self.0.to_be_bytes()) {
            pair[0] = DIGITS[usize::from(byte >> 4)];
            pair[1] = DIGITS[usize::from(byte & 0xf)];
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

    /// Tokens drawn on several threads at once are all distinct, all of
    /// this process, and do not follow one another.
    #[test]
    fn tokens_are_never_drawn_twice() {
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| (0..10_000).map(|_| LockToken::random()).collect::<Vec<_>>())
            })
            .collect();
        let drawn: Vec<LockToken> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        let distinct: std::collections::HashSet<_> = drawn.iter().collect();
        assert_eq!(distinct.len(), drawn.len());
        assert!(drawn.iter().all(|token| token.is_from_this_process()));
        let (a, b) = (LockToken::random().0 as u64, LockToken::random().0 as u64);
        assert!(
            b.wrapping_sub(a) > 1 << 32,
            "consecutive tokens look consecutive"
        );
    }
}
