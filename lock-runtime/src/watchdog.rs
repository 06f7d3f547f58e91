//! The task that keeps a lease alive while it is held, and says when it is
//! lost.
//!
//! Renews every `ttl / 3` (as Redisson's `RenewalTask` does). A renewal that
//! is refused, or that cannot get through before the lease runs out, marks
//! the lease lost; so does `max_hold`. With the watchdog off the task only
//! marks the lease lost when its `ttl` has passed.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::backend::{Backend, LockToken};

/// What the watchdog needs to know about one lease.
pub(crate) struct Lease {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) key: String,
    pub(crate) full_key: String,
    pub(crate) token: LockToken,
    pub(crate) ttl: Duration,
    pub(crate) renew: bool,
    pub(crate) max_hold: Option<Duration>,
    /// When the acquire request was sent: the lease surely ends no later
    /// than `ttl` after it.
    pub(crate) acquired_at: Instant,
}

/// Spawns the watchdog. When the lease is lost, `held` is set to `false`
/// and `on_lost` runs.
pub(crate) fn spawn(
    lease: Lease,
    held: watch::Sender<bool>,
    on_lost: impl FnOnce() + Send + 'static,
) -> AbortHandle {
    tokio::spawn(async move {
        let reason = watch_lease(&lease).await;
        tracing::warn!(key = %lease.key, reason, "lease lost");
        held.send_replace(false);
        on_lost();
    })
    .abort_handle()
}

/// Runs until the lease is lost; returns why.
async fn watch_lease(lease: &Lease) -> &'static str {
    // The lease as this process may count on it: the ttl less the store's drift.
    let valid_for = lease
        .ttl
        .saturating_sub(lease.backend.clock_drift(lease.ttl));
    let mut valid_until = lease.acquired_at + valid_for;
    if !lease.renew {
        sleep_until(valid_until).await;
        return "ttl passed with the watchdog off";
    }
    let interval = (lease.ttl / 3).max(Duration::from_millis(1));
    let stop_at = lease.max_hold.map(|max_hold| lease.acquired_at + max_hold);
    let mut next = lease.acquired_at + interval;
    loop {
        if let Some(stop_at) = stop_at.filter(|&stop_at| next >= stop_at) {
            sleep_until(stop_at.min(valid_until)).await;
            return "max_hold reached";
        }
        sleep_until(next).await;
        let sent_at = Instant::now();
        let renewal = lease.backend.renew(&lease.full_key, lease.token, lease.ttl);
        match timeout_at(valid_until, renewal).await {
            Ok(Ok(true)) => {
                tracing::trace!(key = %lease.key, "lease renewed");
                valid_until = sent_at + valid_for;
                next = sent_at + interval;
            }
            Ok(Ok(false)) => return "the store no longer has it (expired or taken over)",
            Ok(Err(error)) => {
                tracing::warn!(key = %lease.key, %error, "lease renewal failed; retrying");
                // Retry a few times before the lease runs out.
                next = (Instant::now() + interval / 4).min(valid_until);
                if next >= valid_until {
                    return "renewals failed until the lease ran out";
                }
            }
            Err(_) => return "no renewal got through before the lease ran out",
        }
    }
}
