//! What a store says it can do, and what its fencing tokens promise.

use std::time::Duration;

use super::Claim;

/// What a store can do, checked against every lock's options before the
/// first attempt: an option the store cannot honour is an
/// [`InvalidOptions`](crate::LockError::InvalidOptions) error naming the
/// store and the reason, never silently changed.
///
/// The fields are of two kinds. Limits and abilities the runtime acts on:
/// the ttl bounds, [`linger`](Self::linger), the [claims](Self::shares) a
/// store serves, [`waiter_queue`](Self::waiter_queue) and the
/// [`margin`](Self::margin). Promises the runtime does not act on but users
/// may read (through [`LockRegistry::store`](crate::LockRegistry::store)):
/// [`pushes_loss`](Self::pushes_loss) and [`fencing`](Self::fencing). The
/// contract suite checks both kinds against what the store does.
///
/// Built with [`Capabilities::new`] and the `with_*` methods, one per
/// ability, so stores outside this crate can describe themselves too.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// The store's name in messages: "memory", "redis", "redlock", ...
    pub store: &'static str,
    /// The shortest ttl the store can honour.
    pub min_ttl: Duration,
    /// The unit the store counts ttls in; a ttl must be a whole number of
    /// them. Lingers (`hold_at_least`) are not: they are kept to the
    /// millisecond on every store (see [`Lease::release`](super::Lease::release)).
    pub ttl_granularity: Duration,
    /// The longest ttl the store can honour, if it has a limit (ZooKeeper:
    /// the session timeout).
    pub max_ttl: Option<Duration>,
    /// Whether a release can keep the lease for a while: a linger, what is
    /// left of the lock's `hold_at_least` when its body ends early (see
    /// [`Lease::release`](super::Lease::release)).
    pub linger: bool,
    /// Whether the store serves [`Claim::Shared`]: many holders of a key
    /// at once, none of them alongside an exclusive holder.
    pub shares: bool,
    /// Whether the store serves [`Claim::Permit`]: up to a limit of
    /// holders of a key at once.
    pub permits: bool,
    /// Whether the store raises a lease's [`LossSignal`](super::LossSignal)
    /// by itself (a session expired, a lease revoked, a lock forcibly
    /// released), so a holder learns of a loss at once rather than at its
    /// next renewal.
    pub pushes_loss: bool,
    /// Whether a refused attempt of a waiter (one that
    /// [waits](super::Hints::waits)) keeps a place for its token in a
    /// queue in the store, and if so how often the waiter must ask again to
    /// keep it: the runtime's waiters then never sleep longer between
    /// attempts. A waiter that stops waiting without the lock (a timeout, a
    /// cancellation) gives its place up through [`Store::abandon`](super::Store::abandon), so no
    /// release is granted to it.
    pub waiter_queue: Option<Duration>,
    /// Set when the store cannot tell watchers of releases (its
    /// [`watch`](super::Store::watch) never fires): how often a waiter must
    /// ask again instead. The runtime's waiters never sleep longer between
    /// attempts.
    pub release_poll: Option<Duration>,
    /// How long before the store can expire a lease the holder gives up.
    pub margin: SafetyMargin,
    /// What the fencing tokens promise.
    pub fencing: FencingPromise,
}

impl Capabilities {
    /// A store that honours exclusive claims and ttls from 1 ms in whole
    /// milliseconds, with no linger, no shares or permits, no pushed losses,
    /// no fencing promise, and the safety margin of a store on another
    /// machine ([`SafetyMargin::NETWORKED`]): change what yours does better.
    /// A store that keeps time by the holder's own clock (in the same
    /// process) says so with [`with_shared_clock`](Self::with_shared_clock).
    pub const fn new(store: &'static str) -> Self {
        Capabilities {
            store,
            min_ttl: Duration::from_millis(1),
            ttl_granularity: Duration::from_millis(1),
            max_ttl: None,
            linger: false,
            shares: false,
            permits: false,
            pushes_loss: false,
            waiter_queue: None,
            release_poll: None,
            margin: SafetyMargin::NETWORKED,
            fencing: FencingPromise::NONE,
        }
    }

    /// Says that the store counts leases by the holder's own clock (it
    /// lives in the holder's process): the margin then covers only the
    /// timer's granularity and the time to cancel a body
    /// ([`SafetyMargin::SHARED_CLOCK`]).
    pub const fn with_shared_clock(mut self) -> Self {
        self.margin = SafetyMargin::SHARED_CLOCK;
        self
    }

    /// Sets the shortest ttl and the unit ttls are counted in.
    pub const fn with_ttl(mut self, min: Duration, granularity: Duration) -> Self {
        self.min_ttl = min;
        self.ttl_granularity = granularity;
        self
    }

    /// Sets the longest ttl the store can honour.
    pub const fn with_max_ttl(mut self, max: Duration) -> Self {
        self.max_ttl = Some(max);
        self
    }

    /// Says that a release can keep the lease for a while (see
    /// [`linger`](Self::linger)).
    pub const fn with_linger(mut self) -> Self {
        self.linger = true;
        self
    }

    /// Says that the store serves shared claims (see [`shares`](Self::shares)).
    pub const fn with_shares(mut self) -> Self {
        self.shares = true;
        self
    }

    /// Says that the store serves permit claims (see [`permits`](Self::permits)).
    pub const fn with_permits(mut self) -> Self {
        self.permits = true;
        self
    }

    /// Says that the store raises lost leases' signals by itself (see
    /// [`pushes_loss`](Self::pushes_loss)).
    pub const fn with_pushed_losses(mut self) -> Self {
        self.pushes_loss = true;
        self
    }

    /// Says that waiters keep a place in a queue in the store by asking
    /// again at least every `poll` (see [`waiter_queue`](Self::waiter_queue)).
    pub const fn with_waiter_queue(mut self, poll: Duration) -> Self {
        self.waiter_queue = Some(poll);
        self
    }

    /// Says that the store's watches never fire, and waiters should ask
    /// again every `poll` (see [`release_poll`](Self::release_poll)).
    pub const fn with_polled_releases(mut self, poll: Duration) -> Self {
        self.release_poll = Some(poll);
        self
    }

    /// Sets the safety margin, for a store whose expiry needs more than
    /// [`SafetyMargin::NETWORKED`] (a clock-drift allowance of its own).
    pub const fn with_margin(mut self, margin: SafetyMargin) -> Self {
        self.margin = margin;
        self
    }

    /// Sets what the fencing tokens promise.
    pub const fn with_fencing(mut self, fencing: FencingPromise) -> Self {
        self.fencing = fencing;
        self
    }

    /// How long a lease of `ttl` can be counted on after its request was
    /// sent: the ttl less the safety margin.
    #[inline]
    pub fn valid_for(&self, ttl: Duration) -> Duration {
        ttl.saturating_sub(self.margin.of(ttl))
    }

    /// Checks a claim, a ttl and a linger against what the store can do;
    /// the error is the reason, to be shown with the key.
    pub fn check(
        &self,
        claim: Claim,
        ttl: Duration,
        hold_at_least: Option<Duration>,
    ) -> Result<(), String> {
        let store = self.store;
        match claim {
            Claim::Exclusive => {}
            Claim::Shared if !self.shares => {
                return Err(format!(
                    "the {store} store does not serve shared (read) locks"
                ));
            }
            Claim::Permit { limit } if !self.permits => {
                return Err(format!(
                    "the {store} store does not serve semaphores (asked for {limit} permits)"
                ));
            }
            Claim::Shared | Claim::Permit { .. } => {}
        }
        if ttl < self.min_ttl {
            return Err(format!(
                "ttl {ttl:?} is shorter than the {store} store's minimum {:?}",
                self.min_ttl
            ));
        }
        if let Some(max) = self.max_ttl
            && ttl > max
        {
            return Err(format!(
                "ttl {ttl:?} is longer than the {store} store allows ({max:?}, its session timeout): \
                 a holder could go on believing in a lock the store has already given up"
            ));
        }
        if !is_whole_number_of(ttl, self.ttl_granularity) {
            return Err(format!(
                "ttl {ttl:?} is not a whole number of {:?}, the unit the {store} store counts ttls in",
                self.ttl_granularity
            ));
        }
        let margin = self.margin.of(ttl);
        if margin * 2 > ttl {
            return Err(format!(
                "ttl {ttl:?} is too short for the {store} store's safety margin of {margin:?}; use at least {:?}",
                margin * 2
            ));
        }
        if hold_at_least.is_some() && !self.linger {
            return Err(format!(
                "hold_at_least needs a store that can keep a released lease for a while; the {store} store cannot"
            ));
        }
        Ok(())
    }
}

/// Whether `value` is a whole number of `unit`s (any value is, of a zero
/// unit).
fn is_whole_number_of(value: Duration, unit: Duration) -> bool {
    match (
        u64::try_from(value.as_nanos()),
        u64::try_from(unit.as_nanos()),
    ) {
        (Ok(_), Ok(0)) => true,
        (Ok(value), Ok(unit)) => value.is_multiple_of(unit),
        _ => value.as_nanos().is_multiple_of(unit.as_nanos().max(1)),
    }
}

/// How long before the store can expire a lease the runtime treats it as
/// ended: `fixed + ttl × parts_per_million / 1 000 000`.
///
/// It covers what separates the holder's clock from the store's expiry: the
/// rate at which the two clocks drift apart (the `ttl`-proportional part),
/// the timer granularity and the time it takes to cancel the body (the fixed
/// part). The holder counts its lease from when the request was *sent*, so
/// network latency only helps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SafetyMargin {
    /// The part that does not depend on the ttl.
    pub fixed: Duration,
    /// The part proportional to the ttl, in millionths of it.
    pub parts_per_million: u32,
}

impl SafetyMargin {
    /// The margin of a store on another machine, which expires leases by
    /// its own clock: 10 ms for timers and cancelling the body, and 0.2 %
    /// of the ttl for the two clocks' rates. The default.
    pub const NETWORKED: SafetyMargin = SafetyMargin::new(Duration::from_millis(10), 2_000);

    /// The margin of a store that expires leases by the holder's own clock
    /// (the memory store): 2 ms for timers and cancelling the body.
    pub const SHARED_CLOCK: SafetyMargin = SafetyMargin::new(Duration::from_millis(2), 0);

    /// A margin of `fixed` plus `parts_per_million` millionths of the ttl.
    pub const fn new(fixed: Duration, parts_per_million: u32) -> Self {
        SafetyMargin {
            fixed,
            parts_per_million,
        }
    }

    /// The margin for a lease of `ttl`.
    pub fn of(&self, ttl: Duration) -> Duration {
        let ppm = u64::from(self.parts_per_million);
        if ppm == 0 {
            return self.fixed;
        }
        // `nanos × ppm / 1 000 000`, rounded down, in 64 bits: whole
        // milliseconds and the rest apart.
        let nanos = u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX);
        let proportional = (nanos / 1_000_000)
            .saturating_mul(ppm)
            .saturating_add(nanos % 1_000_000 * ppm / 1_000_000);
        self.fixed
            .saturating_add(Duration::from_nanos(proportional))
    }
}

/// What a store's fencing tokens promise. The contract tests read it, and
/// check exactly what it claims.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct FencingPromise {
    /// Tokens strictly increase per key, from one holder to the next.
    pub increasing: bool,
    /// They keep increasing when the store loses data it was allowed to
    /// lose (a restart without persistence, a failover to a replica that
    /// missed the last writes).
    pub survives_data_loss: bool,
    /// The store keeps no per-key fencing state once a key is free, so
    /// memory does not grow with the number of keys ever locked.
    pub bounded_memory: bool,
}

impl FencingPromise {
    /// No tokens (always 0).
    pub const NONE: FencingPromise = FencingPromise {
        increasing: false,
        survives_data_loss: false,
        bounded_memory: true,
    };

    /// Tokens that strictly increase per key, kept in bounded memory, that
    /// may go back after a loss of data: change what yours does better.
    pub const INCREASING: FencingPromise = FencingPromise {
        increasing: true,
        ..FencingPromise::NONE
    };

    /// Says that the tokens keep increasing across a loss of data the store
    /// was allowed to lose (see
    /// [`survives_data_loss`](Self::survives_data_loss)).
    pub const fn surviving_data_loss(mut self) -> Self {
        self.survives_data_loss = true;
        self
    }

    /// Says that the store keeps per-key fencing state after a key is freed
    /// (see [`bounded_memory`](Self::bounded_memory)).
    pub const fn with_unbounded_memory(mut self) -> Self {
        self.bounded_memory = false;
        self
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{SafetyMargin, is_whole_number_of};

    /// The margin is `fixed + ttl × ppm / 1 000 000` rounded down, as
    /// 128-bit arithmetic gives it, up to the longest ttls.
    #[test]
    fn the_margin_is_the_exact_proportion_of_the_ttl() {
        let ttls = [
            Duration::ZERO,
            Duration::from_nanos(999_999),
            Duration::from_millis(30),
            Duration::from_nanos(30_000_123_457),
            Duration::from_secs(3600 * 24 * 365),
            Duration::from_nanos(u64::MAX),
        ];
        for ppm in [0, 1, 2_000, 999_999, 1_000_000, u32::MAX] {
            let margin = SafetyMargin::new(Duration::from_millis(10), ppm);
            for ttl in ttls {
                let exact = ttl.as_nanos() * u128::from(ppm) / 1_000_000;
                let expected = Duration::from_millis(10).saturating_add(Duration::from_nanos(
                    u64::try_from(exact).unwrap_or(u64::MAX),
                ));
                assert_eq!(margin.of(ttl), expected, "ttl {ttl:?}, {ppm} ppm");
            }
        }
    }

    #[test]
    fn whole_numbers_of_a_unit() {
        let ms = Duration::from_millis(1);
        assert!(is_whole_number_of(Duration::from_millis(30), ms));
        assert!(!is_whole_number_of(Duration::from_nanos(30_000_001), ms));
        assert!(is_whole_number_of(Duration::from_nanos(7), Duration::ZERO));
        assert!(is_whole_number_of(Duration::MAX, Duration::ZERO));
        assert!(!is_whole_number_of(Duration::MAX, ms));
        assert!(is_whole_number_of(
            Duration::from_secs(u64::MAX),
            Duration::from_secs(1)
        ));
    }
}
