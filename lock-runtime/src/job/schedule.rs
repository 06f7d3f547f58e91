//! When a job fires: instants every replica computes alike from the
//! schedule alone.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// When a [`Job`](super::Job) fires. Every replica computes the same
/// instants from the schedule alone, without talking to the others: a
/// fire is named by its instant, not by when a replica's clock saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    period: Duration,
    offset: Duration,
}

impl Schedule {
    /// Fires at every whole multiple of `period` since the Unix epoch
    /// (UTC): `every(1 h)` on the hour, `every(24 h)` at midnight UTC.
    /// [`offset`](Self::offset) moves them. A period of zero is refused
    /// when the job starts.
    pub fn every(period: Duration) -> Schedule {
        Schedule {
            period,
            offset: Duration::ZERO,
        }
    }

    /// Moves every fire `offset` later (taken modulo the period):
    /// `every(24 h).offset(2 h)` fires at 02:00 UTC.
    pub fn offset(mut self, offset: Duration) -> Schedule {
        self.offset = offset;
        self
    }

    /// The period between two fires.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// What is wrong with the schedule, if anything.
    pub(super) fn check(&self) -> Result<(), String> {
        if self.period < Duration::from_millis(1) {
            return Err(format!(
                "a schedule's period must be at least 1 ms, not {:?}",
                self.period
            ));
        }
        Ok(())
    }

    /// The first fire strictly after `at`.
    pub fn next_after(&self, at: SystemTime) -> SystemTime {
        let period = self.period.as_nanos().max(1);
        let offset = self.offset.as_nanos() % period;
        let since = at
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_nanos();
        // Fires are at n * period + offset; the first one above `since`.
        let next = if since < offset {
            offset
        } else {
            ((since - offset) / period + 1) * period + offset
        };
        UNIX_EPOCH + nanos(next)
    }
}

/// A count of nanoseconds as a duration, saturating.
fn nanos(n: u128) -> Duration {
    let secs = u64::try_from(n / 1_000_000_000).unwrap_or(u64::MAX);
    Duration::new(secs, (n % 1_000_000_000) as u32)
}

/// Milliseconds since the Unix epoch: how a fire is named in its key.
pub(super) fn epoch_millis(at: SystemTime) -> u128 {
    at.duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(ms)
    }

    #[test]
    fn fires_are_whole_periods_since_the_epoch() {
        let every = Schedule::every(Duration::from_millis(500));
        assert_eq!(every.next_after(at(0)), at(500));
        assert_eq!(every.next_after(at(499)), at(500));
        assert_eq!(every.next_after(at(500)), at(1000));
        assert_eq!(
            every.next_after(at(1_700_000_000_123)),
            at(1_700_000_000_500)
        );
    }

    #[test]
    fn an_offset_moves_every_fire() {
        let hourly = Schedule::every(Duration::from_secs(3600)).offset(Duration::from_secs(60));
        assert_eq!(hourly.next_after(at(0)), at(60_000));
        assert_eq!(hourly.next_after(at(60_000)), at(3_660_000));
        // An offset past the period is taken modulo it.
        let shifted = Schedule::every(Duration::from_secs(10)).offset(Duration::from_secs(12));
        assert_eq!(shifted.next_after(at(0)), at(2_000));
    }

    #[test]
    fn a_zero_period_is_refused() {
        let err = Schedule::every(Duration::ZERO).check().unwrap_err();
        assert!(err.contains("at least 1 ms"), "{err}");
    }
}
