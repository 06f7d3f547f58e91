//! When a job fires: instants every replica computes alike from the
//! schedule alone.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// When a [`Job`](super::Job) fires. Every replica computes the same
/// instants from the schedule alone, without talking to the others: a
/// fire is named by its instant, not by when a replica's clock saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schedule {
    kind: Kind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    Every {
        period: Duration,
        offset: Duration,
    },
    #[cfg(feature = "cron")]
    Cron {
        expression: String,
        /// The parsed expression, or the parser's complaint.
        parsed: Result<Box<croner::Cron>, String>,
    },
}

impl Schedule {
    /// Fires at every whole multiple of `period` since the Unix epoch
    /// (UTC): `every(1 h)` on the hour, `every(24 h)` at midnight UTC.
    /// [`offset`](Self::offset) moves them. A period of zero is refused
    /// when the job starts.
    pub fn every(period: Duration) -> Schedule {
        Schedule {
            kind: Kind::Every {
                period,
                offset: Duration::ZERO,
            },
        }
    }

    /// Fires at the instants the cron `expression` names, in UTC (every
    /// replica must read it alike, whatever its time zone): five fields
    /// (minute, hour, day of month, month, day of week), or six with
    /// seconds first, in the dialect of the `croner` crate
    /// (`"0 3 * * *"`: 03:00 UTC daily; `"*/30 * * * * *"`: every 30 s).
    /// An expression that does not parse is refused, with the parser's
    /// reason, when the job starts. Feature `cron`.
    #[cfg(feature = "cron")]
    pub fn cron(expression: &str) -> Schedule {
        use std::str::FromStr;
        let parsed = croner::Cron::from_str(expression)
            .map(Box::new)
            .map_err(|err| err.to_string());
        Schedule {
            kind: Kind::Cron {
                expression: expression.to_owned(),
                parsed,
            },
        }
    }

    /// Moves every fire of an [`every`](Self::every) schedule `offset`
    /// later (taken modulo the period): `every(24 h).offset(2 h)` fires at
    /// 02:00 UTC. A cron schedule is left as it is.
    pub fn offset(mut self, by: Duration) -> Schedule {
        match &mut self.kind {
            Kind::Every { offset, .. } => *offset = by,
            #[cfg(feature = "cron")]
            Kind::Cron { .. } => {}
        }
        self
    }

    /// The period between two fires of an [`every`](Self::every)
    /// schedule; `None` for a cron schedule, whose gaps vary.
    pub fn period(&self) -> Option<Duration> {
        match &self.kind {
            Kind::Every { period, .. } => Some(*period),
            #[cfg(feature = "cron")]
            Kind::Cron { .. } => None,
        }
    }

    /// What is wrong with the schedule, if anything.
    pub(super) fn check(&self) -> Result<(), String> {
        match &self.kind {
            Kind::Every { period, .. } if *period < Duration::from_millis(1) => Err(format!(
                "a schedule's period must be at least 1 ms, not {period:?}"
            )),
            Kind::Every { .. } => Ok(()),
            #[cfg(feature = "cron")]
            Kind::Cron { expression, parsed } => match parsed {
                Ok(_) => Ok(()),
                Err(why) => Err(format!("invalid cron expression {expression:?}: {why}")),
            },
        }
    }

    /// The first fire strictly after `at` (for a cron expression that
    /// never fires again, or does not parse, a time far past any use).
    pub fn next_after(&self, at: SystemTime) -> SystemTime {
        match &self.kind {
            Kind::Every { period, offset } => every_next_after(*period, *offset, at),
            #[cfg(feature = "cron")]
            Kind::Cron { parsed, .. } => {
                let never = UNIX_EPOCH + Duration::from_secs(1 << 40);
                let Ok(cron) = parsed else { return never };
                let from = chrono::DateTime::<chrono::Utc>::from(at);
                cron.find_next_occurrence(&from, false)
                    .map_or(never, SystemTime::from)
            }
        }
    }
}

impl Schedule {
    /// The fire nearest `at`, before or after it: the fire a scheduler
    /// that calls at each fire, a little early or late, is calling for.
    pub fn nearest(&self, at: SystemTime) -> SystemTime {
        let next = self.next_after(at);
        let previous = self.last_at_or_before(at);
        let ahead = next.duration_since(at).unwrap_or_default();
        let behind = at.duration_since(previous).unwrap_or(Duration::MAX);
        if behind <= ahead { previous } else { next }
    }

    /// The last fire at or before `at` (the epoch when there is none).
    fn last_at_or_before(&self, at: SystemTime) -> SystemTime {
        match &self.kind {
            Kind::Every { period, .. } => {
                let next = self.next_after(at);
                next.checked_sub(*period).unwrap_or(UNIX_EPOCH)
            }
            #[cfg(feature = "cron")]
            Kind::Cron { parsed, .. } => {
                let Ok(cron) = parsed else { return UNIX_EPOCH };
                let from = chrono::DateTime::<chrono::Utc>::from(at);
                cron.find_previous_occurrence(&from, true)
                    .map_or(UNIX_EPOCH, SystemTime::from)
            }
        }
    }
}

/// The first fire of `every(period).offset(offset)` strictly after `at`.
fn every_next_after(period: Duration, offset: Duration, at: SystemTime) -> SystemTime {
    let period = period.as_nanos().max(1);
    let offset = offset.as_nanos() % period;
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

    #[cfg(feature = "cron")]
    #[test]
    fn a_cron_schedule_fires_at_its_instants_in_utc() {
        // 2023-11-14T22:13:20Z.
        let now = at(1_700_000_000_000);
        let nightly = Schedule::cron("0 3 * * *");
        assert_eq!(nightly.check(), Ok(()));
        // 2023-11-15T03:00:00Z, then a day later.
        assert_eq!(nightly.next_after(now), at(1_700_017_200_000));
        assert_eq!(
            nightly.next_after(at(1_700_017_200_000)),
            at(1_700_103_600_000)
        );
        let seconds = Schedule::cron("*/30 * * * * *");
        assert_eq!(seconds.next_after(now), at(1_700_000_010_000));
        assert_eq!(seconds.period(), None);
    }

    #[cfg(feature = "cron")]
    #[test]
    fn a_bad_cron_expression_is_refused_with_the_reason() {
        let err = Schedule::cron("61 * * * *").check().unwrap_err();
        assert!(
            err.starts_with("invalid cron expression \"61 * * * *\": "),
            "{err}"
        );
    }

    #[test]
    fn the_nearest_fire_is_before_or_after() {
        let every = Schedule::every(Duration::from_millis(500));
        assert_eq!(every.nearest(at(1_000)), at(1_000));
        assert_eq!(every.nearest(at(1_020)), at(1_000));
        assert_eq!(every.nearest(at(1_480)), at(1_500));
        assert_eq!(every.nearest(at(1_250)), at(1_000));
    }

    #[test]
    fn a_zero_period_is_refused() {
        let err = Schedule::every(Duration::ZERO).check().unwrap_err();
        assert!(err.contains("at least 1 ms"), "{err}");
    }
}
