//! Instants as signed nanoseconds from one origin taken once per process,
//! so that a deadline another thread reads can sit in an atomic rather
//! than behind a lock.

use std::sync::OnceLock;
use std::time::Duration;

use tokio::time::Instant;

/// The origin, taken at the first use. Instants before it (a paused test
/// clock's start is never before, but nothing here relies on that) are
/// negative.
fn origin() -> std::time::Instant {
    static ORIGIN: OnceLock<std::time::Instant> = OnceLock::new();
    *ORIGIN.get_or_init(std::time::Instant::now)
}

/// The largest magnitude a tick count takes; `i64::MAX` is left for
/// "never" (see [`NEVER`]).
const LIMIT: i64 = i64::MAX - 1;

/// A tick count no instant reaches.
pub(crate) const NEVER: i64 = i64::MAX;

/// `at` in ticks. Saturates some 292 years either side of the origin.
#[inline]
pub(crate) fn of(at: Instant) -> i64 {
    let (at, origin) = (at.into_std(), origin());
    match at.checked_duration_since(origin) {
        Some(after) => nanos(after),
        None => -nanos(origin.duration_since(at)),
    }
}

/// `span` in nanoseconds, at most [`LIMIT`]: in `i64` arithmetic, which
/// is cheaper than `Duration::as_nanos`'s `u128`.
#[inline]
fn nanos(span: Duration) -> i64 {
    i64::try_from(span.as_secs())
        .ok()
        .and_then(|secs| secs.checked_mul(1_000_000_000))
        .and_then(|whole| whole.checked_add(i64::from(span.subsec_nanos())))
        .map_or(LIMIT, |nanos| nanos.min(LIMIT))
}

/// The instant `ticks` stands for ([`NEVER`] is far in the future, as
/// the clock goes).
pub(crate) fn instant(ticks: i64) -> Instant {
    let origin = Instant::from_std(origin());
    let magnitude = Duration::from_nanos(ticks.unsigned_abs());
    if ticks >= 0 {
        origin + magnitude
    } else {
        origin.checked_sub(magnitude).unwrap_or(origin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instant_survives_the_round_trip_either_side_of_the_origin() {
        let now = Instant::now();
        for at in [
            now,
            now + Duration::from_secs(3600),
            now - Duration::from_millis(5),
        ] {
            assert_eq!(instant(of(at)), at);
        }
        assert!(of(now) < of(now + Duration::from_nanos(1)));
        assert!(of(now + Duration::from_secs(3600)) < NEVER);
        assert_eq!(nanos(Duration::new(2, 5)), 2_000_000_005);
        assert_eq!(nanos(Duration::MAX), LIMIT);
        assert_eq!(
            nanos(Duration::from_secs(i64::MAX as u64 / 1_000_000_000 + 1)),
            LIMIT
        );
    }
}
