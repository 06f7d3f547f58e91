//! Per-lock options: lease length, waiting, watchdog, minimum and maximum hold.

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::HashSet;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::Duration;

use crate::error::LockError;
use crate::store::Claim;

pub use lock_limits::MAX_DURATION;

/// How one lock is taken and held.
///
/// `LockOptions::default()` is a 30 s lease renewed by the watchdog, waiting
/// forever, with no minimum and no maximum hold: the same defaults as the
/// attribute.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lock_runtime::LockOptions;
///
/// let opts = LockOptions::default()
///     .ttl(Duration::from_secs(10))
///     .wait_timeout(Duration::from_secs(2))
///     .max_hold(Duration::from_secs(60));
/// # let _ = opts;
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockOptions {
    pub(crate) ttl: Duration,
    pub(crate) wait_timeout: Option<Duration>,
    pub(crate) hold_at_least: Option<Duration>,
    pub(crate) watchdog: bool,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) name: Option<&'static str>,
    pub(crate) on_lost: OnLost,
    pub(crate) permits: u32,
    pub(crate) access: Access,
    pub(crate) fencing: bool,
}

/// How a lock is held on its key: alone, or as one of many readers. See
/// [`LockOptions::access`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Access {
    /// Alongside other readers of the key, never alongside a writer.
    Read,
    /// Alone: against readers and writers. The default, a mutex.
    #[default]
    Write,
}

impl Access {
    /// How a lease under `claim` holds its key: the one mapping back from
    /// a claim ([`LockOptions::claim`] is the one there).
    pub(crate) fn of(claim: Claim) -> Access {
        match claim {
            Claim::Shared => Access::Read,
            Claim::Exclusive | Claim::Permit { .. } => Access::Write,
        }
    }
}

/// For a lease under `claim`, how many permits its key has: the
/// semaphore's limit, `None` for a mutex or a read-write lock.
pub(crate) fn permits_of(claim: Claim) -> Option<u32> {
    match claim {
        Claim::Permit { limit } => Some(limit.get()),
        Claim::Exclusive | Claim::Shared => None,
    }
}

/// What happens to a body run by `#[distributed_lock]` when its lease is
/// lost (a renewal refused or too late, `max_hold` passed, the store's
/// session gone): see [`LockOptions::on_lost`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnLost {
    /// The body is cancelled (dropped) at its next `.await`; the call
    /// returns [`LockError::Lost`]. The default: work that is not covered
    /// by a lease stops.
    #[default]
    Cancel,
    /// The body runs on to its end and can learn of the loss from
    /// [`lost`](crate::lost) or [`is_lost`](crate::is_lost); the call then
    /// returns [`LockError::Lost`] all the same (with `errors = "into"`,
    /// the body's own error if it returns one). For a body that must
    /// finish or undo a step rather than stop halfway.
    Notify,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: lock_limits::DEFAULT_TTL,
            wait_timeout: None,
            hold_at_least: None,
            watchdog: true,
            max_hold: None,
            name: None,
            on_lost: OnLost::Cancel,
            permits: 1,
            access: Access::Write,
            fencing: true,
        }
    }
}

/// Whether the caller waits for the lock or makes one attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Wait,
    Skip,
}

impl Mode {
    /// As spans show it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Mode::Wait => "wait",
            Mode::Skip => "skip",
        }
    }
}

impl LockOptions {
    /// Sets the lease length. With the watchdog on, this bounds only how long
    /// a crashed holder blocks others; without it, how long the body may run.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Gives up waiting after `timeout` with [`LockError::Timeout`].
    /// Only for waiting calls ([`LockRegistry::lock`](crate::LockRegistry::lock)).
    pub fn wait_timeout(mut self, timeout: Duration) -> Self {
        self.wait_timeout = Some(timeout);
        self
    }

    /// Keeps the lease until at least `hold` after it was taken, even if it
    /// is released sooner: a second instance whose clock is behind then
    /// cannot run the same scheduled job again. The store frees the key
    /// then, to the millisecond and within a round trip, on every store
    /// (etcd's whole-second leases included); only if this process ends
    /// meanwhile does the store's own expiry end it, up to a second later
    /// on etcd.
    pub fn hold_at_least(mut self, hold: Duration) -> Self {
        self.hold_at_least = Some(hold);
        self
    }

    /// Turns the watchdog on (the default) or off. The watchdog renews the
    /// lease every `ttl / 3` while it is held.
    pub fn watchdog(mut self, on: bool) -> Self {
        self.watchdog = on;
        self
    }

    /// Stops renewing after `max_hold`: the holder then loses the lease, so a
    /// hung but living holder cannot keep the lock forever.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Whether a body run under the lock by `#[distributed_lock]` is
    /// cancelled when the lease is lost (the default) or runs on to its end,
    /// told by [`lost`](crate::lost); the attribute's `on_lost = "cancel"
    /// | "notify"`. A guard from [`lock`](crate::LockRegistry::lock) cancels
    /// nothing: its owner watches [`LockGuard::lost`](crate::LockGuard::lost).
    pub fn on_lost(mut self, on_lost: OnLost) -> Self {
        self.on_lost = on_lost;
        self
    }

    /// Makes the key a semaphore: at most `permits` holders at once, across
    /// every process (1, the default, is a mutex). Every caller of a key
    /// must ask for the same number; one that asks for another gets an
    /// error naming both. Not with [`access`](Self::access)`(Access::Read)`.
    pub fn permits(mut self, permits: u32) -> Self {
        self.permits = permits;
        self
    }

    /// Makes the key a read-write lock: [`Access::Read`] holders run
    /// together, an [`Access::Write`] holder (the default) alone. A waiting
    /// writer stops new readers from joining, on the stores that queue
    /// waiters.
    pub fn access(mut self, access: Access) -> Self {
        self.access = access;
        self
    }

    /// Whether the lock has a fencing token (the default). Without one,
    /// [`LockGuard::fencing_token`](crate::LockGuard::fencing_token) and
    /// [`fencing_token`](crate::fencing_token) give 0 at once, and a store
    /// whose tokens cost work skips it: on Redis, whose default lock issues
    /// its token when the body first reads it, that read is then no round
    /// trip, and a contended, fair or shared lock's script makes none. For
    /// locks whose body writes nowhere a token could be checked (a
    /// scheduled job, a cache refresh).
    pub fn fencing(mut self, on: bool) -> Self {
        self.fencing = on;
        self
    }

    /// Whether a lease taken with these options is renewed with no end
    /// but its release (the watchdog on, no `max_hold`): such a hold may
    /// pass from task to task of a process as it is.
    pub(crate) fn renews_without_end(&self) -> bool {
        self.watchdog && self.max_hold.is_none()
    }

    /// What an acquire with these options claims on its key.
    pub(crate) fn claim(&self) -> Claim {
        match (self.access, NonZeroU32::new(self.permits)) {
            (Access::Read, _) => Claim::Shared,
            (Access::Write, Some(limit)) => Claim::permits(limit),
            // Refused by `validate`.
            (Access::Write, None) => Claim::Exclusive,
        }
    }

    /// Names the lock in metrics (the `lock` label): a fixed name such as
    /// `"stock"` for every `stock:{id}` key, so the label set stays
    /// bounded. Without one the label is `unnamed`; the attribute uses its
    /// key template.
    ///
    /// Any string will do (`"stock"`, or a `String` read from
    /// configuration); a name that is not `'static` is kept once for the
    /// life of the process, as its metrics are, so names should be few.
    pub fn name(mut self, name: impl Into<Cow<'static, str>>) -> Self {
        self.name = Some(match name.into() {
            Cow::Borrowed(name) => name,
            Cow::Owned(name) => interned(name),
        });
        self
    }

    /// Checks the options' rules (`lock_limits::check`, which the
    /// attribute applies to its literals too); the error names `key` and
    /// the rule broken. The rules read the values alone, so the last
    /// values that passed on this thread are not checked again: a call
    /// site that locks with the same options over and over pays for one
    /// comparison.
    pub(crate) fn validate(&self, key: &str, mode: Mode) -> Result<(), LockError> {
        thread_local! {
            static PASSED: Cell<Option<lock_limits::Options>> = const { Cell::new(None) };
        }
        let values = self.rule_values(mode);
        if PASSED.with(Cell::get) == Some(values) {
            return Ok(());
        }
        check_new(key, values)?;
        PASSED.with(|passed| passed.set(Some(values)));
        Ok(())
    }

    /// What the rules read, for calls in `mode`.
    pub(crate) const fn rule_values(&self, mode: Mode) -> lock_limits::Options {
        lock_limits::Options {
            ttl: self.ttl,
            wait_timeout: self.wait_timeout,
            hold_at_least: self.hold_at_least,
            max_hold: self.max_hold,
            watchdog: self.watchdog,
            permits: self.permits,
            read: matches!(self.access, Access::Read),
            single_attempt: matches!(mode, Mode::Skip),
        }
    }
}

/// Checks option values not seen on this thread just before. Out of line:
/// a call site locking with the same options again does not run it.
#[cold]
#[inline(never)]
fn check_new(key: &str, values: lock_limits::Options) -> Result<(), LockError> {
    lock_limits::check(&values)
        .map_err(|problem| LockError::invalid_options(key, problem.to_string()))
}

/// `name` as a `'static` string: the same one for every equal name, kept
/// for the life of the process.
fn interned(name: String) -> &'static str {
    static NAMES: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
    let mut names = NAMES.lock().unwrap_or_else(|poison| poison.into_inner());
    let names = names.get_or_insert_with(HashSet::new);
    if let Some(&kept) = names.get(name.as_str()) {
        return kept;
    }
    let kept: &'static str = Box::leak(name.into_boxed_str());
    names.insert(kept);
    kept
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_name_may_be_any_string_and_equal_names_are_one() {
        let fixed = super::LockOptions::default().name("stock");
        assert_eq!(fixed.name, Some("stock"));
        let read = super::LockOptions::default().name(String::from("orders"));
        let again = super::LockOptions::default().name(format!("or{}", "ders"));
        let (read, again) = (read.name.unwrap(), again.name.unwrap());
        assert_eq!(read, "orders");
        assert!(std::ptr::eq(read, again), "one copy of an equal name");
    }

    use super::*;

    fn check(opts: LockOptions, mode: Mode) -> String {
        match opts.validate("k:1", mode) {
            Ok(()) => "ok".into(),
            Err(err) => err.to_string(),
        }
    }

    #[test]
    fn options_that_passed_are_remembered_and_others_still_checked() {
        let ttl = Duration::from_secs(10);
        let good = LockOptions::default().ttl(ttl).wait_timeout(ttl);
        assert_eq!(check(good.clone(), Mode::Wait), "ok");
        assert_eq!(check(good.clone(), Mode::Wait), "ok");
        // The same options in skip mode break a rule: the mode counts.
        assert!(check(good.clone(), Mode::Skip).contains("`wait_timeout` has no effect"));
        assert_eq!(check(good.clone(), Mode::Wait), "ok");
        // Options that failed are checked, and refused, every time.
        let bad = LockOptions::default().ttl(Duration::ZERO);
        for _ in 0..2 {
            assert!(check(bad.clone(), Mode::Wait).contains("shorter than 1ms"));
        }
        assert_eq!(check(good, Mode::Wait), "ok");
    }

    #[test]
    fn defaults_are_valid() {
        assert_eq!(check(LockOptions::default(), Mode::Wait), "ok");
        assert_eq!(check(LockOptions::default(), Mode::Skip), "ok");
    }

    #[test]
    fn out_of_range_durations_are_rejected() {
        let zero = check(LockOptions::default().ttl(Duration::ZERO), Mode::Wait);
        assert_eq!(
            zero,
            "invalid options for lock `k:1`: `ttl` 0ns is shorter than 1ms"
        );
        let huge = check(LockOptions::default().ttl(Duration::MAX), Mode::Wait);
        assert_eq!(
            huge,
            "invalid options for lock `k:1`: `ttl` is longer than ten years, the longest a duration may be"
        );
        let wait = check(
            LockOptions::default().wait_timeout(Duration::MAX),
            Mode::Wait,
        );
        assert!(
            wait.contains("`wait_timeout` is longer than ten years"),
            "{wait}"
        );
    }

    #[test]
    fn senseless_combinations_are_rejected() {
        let ttl = Duration::from_secs(10);
        let base = LockOptions::default().ttl(ttl);
        let skip_wait = check(base.clone().wait_timeout(ttl), Mode::Skip);
        assert!(
            skip_wait.contains("`wait_timeout` has no effect"),
            "{skip_wait}"
        );
        let hold = check(base.clone().hold_at_least(ttl * 2), Mode::Skip);
        assert!(
            hold.contains("`hold_at_least` 20s is longer than `ttl` 10s"),
            "{hold}"
        );
        let max = check(base.clone().max_hold(ttl / 2), Mode::Wait);
        assert!(
            max.contains("`max_hold` 5s is shorter than `ttl` 10s"),
            "{max}"
        );
        let no_dog = check(base.clone().watchdog(false).max_hold(ttl * 2), Mode::Wait);
        assert!(no_dog.contains("watchdog off"), "{no_dog}");
        assert_eq!(
            check(base.hold_at_least(ttl).max_hold(ttl), Mode::Wait),
            "ok"
        );
    }
}
