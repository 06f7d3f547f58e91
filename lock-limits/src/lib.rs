//! The defaults, limits and rules of a lock's options, defined once: the
//! runtime applies them to `LockOptions`, and the `#[distributed_lock]`
//! attribute checks its literal arguments against them at compile time,
//! with the same messages. Use them through `lock-runtime`, which
//! re-exports what users need.

#![no_std]

use core::fmt;
use core::time::Duration;

/// The lease length when none is given: 30 s.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// The longest duration any option accepts: ten years. Longer values are
/// almost always a unit mistake, and they would overflow clocks.
pub const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 60 * 60);

/// The shortest lease: 1 ms.
pub const MIN_TTL: Duration = Duration::from_millis(1);

/// The values of one lock's options that the rules read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// The lease length.
    pub ttl: Duration,
    /// How long a call waits for the lock; `None`: as long as it takes.
    pub wait_timeout: Option<Duration>,
    /// The shortest hold, however soon the body ends.
    pub hold_at_least: Option<Duration>,
    /// The longest the watchdog renews the lease.
    pub max_hold: Option<Duration>,
    /// Whether the watchdog renews the lease while the body runs.
    pub watchdog: bool,
    /// How many holders the key admits (a semaphore); 1 is a mutex.
    pub permits: u32,
    /// A read lock: shared with other readers.
    pub read: bool,
    /// One attempt that never waits (skip mode, `try_lock`).
    pub single_attempt: bool,
}

/// A rule a lock's options break; its `Display` is the message both the
/// runtime's `InvalidOptions` error and the attribute's compile error give.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Problem {
    /// A duration longer than [`MAX_DURATION`].
    TooLong {
        /// The option's name.
        option: &'static str,
    },
    /// A lease shorter than [`MIN_TTL`].
    TtlTooShort {
        /// The lease length asked for.
        ttl: Duration,
    },
    /// `permits` of 0.
    NoPermits,
    /// A semaphore of more than one permit asked as a read lock.
    PermitsWithRead {
        /// The permits asked for.
        permits: u32,
    },
    /// A wait timeout on a single attempt, which never waits.
    WaitOnSingleAttempt,
    /// A minimum hold the lease would not last.
    HoldLongerThanTtl {
        /// The minimum hold.
        hold: Duration,
        /// The lease length.
        ttl: Duration,
    },
    /// A maximum hold with the watchdog off, which it would not limit.
    MaxHoldWithoutWatchdog,
    /// A maximum hold shorter than one lease.
    MaxHoldShorterThanTtl {
        /// The maximum hold.
        max_hold: Duration,
        /// The lease length.
        ttl: Duration,
    },
}

impl Problem {
    /// The option the problem is reported at: the attribute's argument
    /// (and the `LockOptions` method) of that name.
    pub const fn option(&self) -> &'static str {
        match self {
            Problem::TooLong { option } => option,
            Problem::TtlTooShort { .. } => "ttl",
            Problem::NoPermits | Problem::PermitsWithRead { .. } => "permits",
            Problem::WaitOnSingleAttempt => "wait_timeout",
            Problem::HoldLongerThanTtl { .. } => "hold_at_least",
            Problem::MaxHoldWithoutWatchdog | Problem::MaxHoldShorterThanTtl { .. } => "max_hold",
        }
    }
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::TooLong { option } => write!(
                f,
                "`{option}` is longer than ten years, the longest a duration may be"
            ),
            Problem::TtlTooShort { ttl } => {
                write!(f, "`ttl` {ttl:?} is shorter than {MIN_TTL:?}")
            }
            Problem::NoPermits => f.write_str("`permits` must be at least 1; 1 is a mutex"),
            Problem::PermitsWithRead { permits } => write!(
                f,
                "`permits` ({permits}) and read access cannot be combined: a key is a semaphore or a read-write lock"
            ),
            Problem::WaitOnSingleAttempt => f.write_str(
                "`wait_timeout` has no effect on a single attempt (skip mode, `try_lock`), which never waits",
            ),
            Problem::HoldLongerThanTtl { hold, ttl } => write!(
                f,
                "`hold_at_least` {hold:?} is longer than `ttl` {ttl:?}; the lease would expire before it"
            ),
            Problem::MaxHoldWithoutWatchdog => f.write_str(
                "`max_hold` limits the watchdog's renewals and has no effect with the watchdog off; the `ttl` already bounds the hold",
            ),
            Problem::MaxHoldShorterThanTtl { max_hold, ttl } => write!(
                f,
                "`max_hold` {max_hold:?} is shorter than `ttl` {ttl:?}; use a shorter `ttl` instead"
            ),
        }
    }
}

/// Checks every rule, in the order the problems are listed; the first
/// broken one is the answer. A `const fn`, so options known at compile
/// time can be checked there.
pub const fn check(options: &Options) -> Result<(), Problem> {
    let durations = [
        ("ttl", Some(options.ttl)),
        ("wait_timeout", options.wait_timeout),
        ("hold_at_least", options.hold_at_least),
        ("max_hold", options.max_hold),
    ];
    let mut i = 0;
    while i < durations.len() {
        if let Err(problem) = within_limit(durations[i].0, durations[i].1) {
            return Err(problem);
        }
        i += 1;
    }
    if let Err(problem) = ttl_long_enough(options.ttl) {
        return Err(problem);
    }
    if let Err(problem) = permits_fit(options.permits, options.read) {
        return Err(problem);
    }
    if let Err(problem) = waits_only_when_waiting(options.single_attempt, options.wait_timeout) {
        return Err(problem);
    }
    if let Some(hold) = options.hold_at_least
        && let Err(problem) = hold_fits(hold, options.ttl)
    {
        return Err(problem);
    }
    if let Some(max_hold) = options.max_hold {
        if let Err(problem) = max_hold_has_a_watchdog(options.watchdog) {
            return Err(problem);
        }
        if let Err(problem) = max_hold_fits(max_hold, options.ttl) {
            return Err(problem);
        }
    }
    Ok(())
}

/// A duration option is at most [`MAX_DURATION`].
pub const fn within_limit(option: &'static str, value: Option<Duration>) -> Result<(), Problem> {
    match value {
        Some(value) if value.as_nanos() > MAX_DURATION.as_nanos() => {
            Err(Problem::TooLong { option })
        }
        _ => Ok(()),
    }
}

/// A lease is at least [`MIN_TTL`].
pub const fn ttl_long_enough(ttl: Duration) -> Result<(), Problem> {
    if ttl.as_nanos() < MIN_TTL.as_nanos() {
        Err(Problem::TtlTooShort { ttl })
    } else {
        Ok(())
    }
}

/// A key admits at least one holder, and a semaphore of several is not a
/// read lock.
pub const fn permits_fit(permits: u32, read: bool) -> Result<(), Problem> {
    if permits == 0 {
        Err(Problem::NoPermits)
    } else if permits > 1 && read {
        Err(Problem::PermitsWithRead { permits })
    } else {
        Ok(())
    }
}

/// A single attempt has no wait timeout.
pub const fn waits_only_when_waiting(
    single_attempt: bool,
    wait_timeout: Option<Duration>,
) -> Result<(), Problem> {
    if single_attempt && wait_timeout.is_some() {
        Err(Problem::WaitOnSingleAttempt)
    } else {
        Ok(())
    }
}

/// A minimum hold fits in one lease.
pub const fn hold_fits(hold: Duration, ttl: Duration) -> Result<(), Problem> {
    if hold.as_nanos() > ttl.as_nanos() {
        Err(Problem::HoldLongerThanTtl { hold, ttl })
    } else {
        Ok(())
    }
}

/// A maximum hold comes with the watchdog it limits.
pub const fn max_hold_has_a_watchdog(watchdog: bool) -> Result<(), Problem> {
    if watchdog {
        Ok(())
    } else {
        Err(Problem::MaxHoldWithoutWatchdog)
    }
}

/// A maximum hold is at least one lease.
pub const fn max_hold_fits(max_hold: Duration, ttl: Duration) -> Result<(), Problem> {
    if max_hold.as_nanos() < ttl.as_nanos() {
        Err(Problem::MaxHoldShorterThanTtl { max_hold, ttl })
    } else {
        Ok(())
    }
}
