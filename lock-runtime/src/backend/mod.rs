//! The one trait every store implements, and the small types it speaks.
//!
//! The registry, the waiting strategy, the watchdog, re-entrancy and the
//! guard are written once on top of [`Backend`]; a store only has to take,
//! renew and release a lease atomically and say when a lease was released.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::sync::watch;

use crate::BackendError;

pub mod memory;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(feature = "redis")]
pub mod redlock;

/// A boxed, sendable future: what [`Backend`]'s methods return, so the trait
/// stays object-safe and the registry can hold an `Arc<dyn Backend>`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The random 128-bit value that identifies one holder of one lease.
///
/// Only the holder knows it, so only the holder can renew or release.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct LockToken(u128);

impl LockToken {
    /// Draws a new token from the thread's cryptographically seeded RNG.
    pub fn random() -> Self {
        LockToken(rand::random())
    }

    /// The token as a number.
    pub fn as_u128(self) -> u128 {
        self.0
    }
}

impl fmt::Display for LockToken {
    /// Formats as 32 lowercase hex digits, the form stores keep.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

impl fmt::Debug for LockToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockToken({self})")
    }
}

/// The answer to one acquire attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Acquire {
    /// The lease is ours; `fencing` is larger than every token handed out
    /// for this key before.
    Acquired {
        /// The fencing token of this lease.
        fencing: u64,
    },
    /// Someone else holds it; `remaining` is how long their lease has left,
    /// when the store knows.
    Held {
        /// The holder's remaining lease time.
        remaining: Option<Duration>,
    },
}

/// A subscription to release notifications for one key.
///
/// Created before an acquire attempt, it reports every release that happens
/// after its creation, so a release between a failed attempt and the wait is
/// never missed.
pub struct ReleaseWatch {
    rx: watch::Receiver<()>,
    // Dropped after `rx`: lets a backend free per-key state once unwatched.
    _hold: Option<Box<dyn Any + Send + Sync>>,
}

impl ReleaseWatch {
    /// Wraps a watch receiver that is bumped on each release of the key.
    /// `hold` is dropped with the subscription, after the receiver: a backend
    /// can use it to free its per-key state once nobody watches the key.
    pub fn new(rx: watch::Receiver<()>, hold: Option<Box<dyn Any + Send + Sync>>) -> Self {
        ReleaseWatch { rx, _hold: hold }
    }

    /// Completes at the next release after the previous call (or after the
    /// subscription was made). Never completes if the store stopped sending.
    pub async fn released(&mut self) {
        if self.rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl fmt::Debug for ReleaseWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReleaseWatch").finish_non_exhaustive()
    }
}

/// A lock store: takes, renews and releases leases atomically.
///
/// `key` is the full key, namespace included. Every method must be
/// owner-checked by `token`: a store never renews or deletes a lease that
/// another token holds.
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// Takes the lease if it is free (or expired), in one round trip, and
    /// returns a fencing token larger than any given for `key` before;
    /// otherwise returns the holder's remaining time.
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        token: LockToken,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Acquire, BackendError>>;

    /// Extends our lease to `ttl` from now. `Ok(false)` when the lease is no
    /// longer ours (expired or taken over).
    fn renew<'a>(
        &'a self,
        key: &'a str,
        token: LockToken,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>>;

    /// Releases our lease and wakes waiters; with a non-zero `linger`, keeps
    /// the lease for that much longer instead (for `hold_at_least`).
    /// `Ok(false)` when the lease was no longer ours.
    fn release<'a>(
        &'a self,
        key: &'a str,
        token: LockToken,
        linger: Duration,
    ) -> BoxFuture<'a, Result<bool, BackendError>>;

    /// Subscribes to release notifications for `key`.
    fn watch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<ReleaseWatch, BackendError>>;

    /// Whether [`hand_over`](Self::hand_over) is implemented.
    fn supports_hand_over(&self) -> bool {
        false
    }

    /// Passes our lease on to the next holder in this process without
    /// releasing it: extends it to `ttl` and returns a new fencing token
    /// (larger than every earlier one), in one round trip. `Ok(None)` when
    /// the lease is no longer ours. Only called when
    /// [`supports_hand_over`](Self::supports_hand_over) is true.
    fn hand_over<'a>(
        &'a self,
        key: &'a str,
        token: LockToken,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<Option<u64>, BackendError>> {
        let _ = (key, token, ttl);
        Box::pin(async { Err("this backend cannot hand a lease over".into()) })
    }

    /// How much of a `ttl` lease to treat as already gone, for clock drift
    /// between this process and the store(s). The holder's lease is taken to
    /// end at `sent + ttl - drift`, where `sent` is when the acquire or renew
    /// request was sent. Zero by default.
    fn clock_drift(&self, ttl: Duration) -> Duration {
        let _ = ttl;
        Duration::ZERO
    }

    /// The shortest `ttl` this store can honour; shorter ones are refused as
    /// invalid options. 1 ms by default.
    fn min_ttl(&self) -> Duration {
        Duration::from_millis(1)
    }
}
