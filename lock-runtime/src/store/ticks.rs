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
const LIMIT: u128 = i64::MAX as u128 - 1;

/// A tick count no instant reaches.
pub(crate) const NEVER: i64 = i64::MAX;

/// `at` in ticks. Saturates some 292 years either side of the origin.
pub(crate) fn of(at: Instant) -> i64 {
    let (at, origin) = (at.into_std(), origin());
    match at.checked_duration_since(origin) {
        Some(after) => after.as_nanos().min(LIMIT) as i64,
        None => -(origin.duration_since(at).as_nanos().min(LIMIT) as i64),
    }
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
    }
}
