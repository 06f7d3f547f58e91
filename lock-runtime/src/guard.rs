//! The guard of a held lock: releases on `release().await`, or on drop.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::time::Instant;

use crate::backend::LockToken;
use crate::registry::{Baton, LocalPermit, LockRegistry, MAX_HAND_OVERS};
use crate::watchdog::{Lease, LeaseSignal, Watch};
use crate::{LockError, LockOptions};

/// A held lock. Renewed in the background by the watchdog (unless turned
/// off) until it is released.
///
/// The main path is [`release`](Self::release), which reports whether the
/// lease was still held.
///
/// # Cancellation
///
/// Dropping the guard releases the lock too: `Drop` spawns the release on the
/// current Tokio runtime, so the next holder need not wait for the TTL. If no
/// runtime is running (the process is shutting down), nothing can be sent and
/// the lease ends when its TTL passes, as for a crashed process.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard {
    held: Option<Held>,
}

struct Held {
    registry: LockRegistry,
    key: String,
    token: LockToken,
    fencing: u64,
    acquired_at: Instant,
    hold_at_least: Option<Duration>,
    ttl: Duration,
    /// Hand-overs in a row that led to this lease.
    chain: u32,
    full_key: String,
    lease: Arc<LeaseSignal>,
    watchdog: Watch,
    /// This process's turn at the key. Given back as soon as the lease is
    /// known lost, so the process's other tasks are not held up by a guard
    /// that no longer holds anything; otherwise at release.
    permit: Arc<Mutex<Option<LocalPermit>>>,
}

impl LockGuard {
    pub(crate) fn new(
        registry: LockRegistry,
        key: &str,
        token: LockToken,
        fencing: u64,
        acquired_at: Instant,
        opts: &LockOptions,
        permit: LocalPermit,
    ) -> LockGuard {
        let lease = Arc::new(LeaseSignal::default());
        let full_key = permit.key().to_owned();
        let permit = Arc::new(Mutex::new(Some(permit)));
        let on_lost = {
            let permit = permit.clone();
            move || drop(take_permit(&permit))
        };
        let watchdog = Watch::start(
            registry.renewal_owner(),
            Lease {
                backend: registry.backend().clone(),
                key: key.to_owned(),
                full_key: full_key.clone(),
                token,
                ttl: opts.ttl_millis(),
                renew: opts.watchdog,
                max_hold: opts.max_hold,
                acquired_at,
            },
            lease.clone(),
            on_lost,
        );
        LockGuard {
            held: Some(Held {
                registry,
                key: key.to_owned(),
                token,
                fencing,
                acquired_at,
                hold_at_least: opts.hold_at_least,
                ttl: opts.ttl_millis(),
                chain: 0,
                full_key,
                lease,
                watchdog,
                permit,
            }),
        }
    }

    /// Records that this lease came through `chain` hand-overs in a row.
    pub(crate) fn with_chain(mut self, chain: u32) -> Self {
        if let Some(held) = self.held.as_mut() {
            held.chain = chain;
        }
        self
    }

    fn held(&self) -> &Held {
        // `held` is taken only by `release` and `drop`, which consume the guard.
        self.held.as_ref().expect("LockGuard used after release")
    }

    /// The key this lock was taken on, without the namespace.
    pub fn key(&self) -> &str {
        &self.held().key
    }

    /// The fencing token of this lease: larger than that of every earlier
    /// holder of the key. Pass it to storage that should refuse writes from
    /// a holder whose lease has since been lost.
    pub fn fencing_token(&self) -> u64 {
        self.held().fencing
    }

    /// `false` once the lease is known to be lost: a renewal was refused or
    /// did not get through in time, `max_hold` passed, or (watchdog off) the
    /// ttl passed.
    pub fn is_held(&self) -> bool {
        !self.held().lease.is_lost()
    }

    /// Completes when the lease is known to be lost.
    pub(crate) async fn lost(&self) {
        self.held().lease.lost().await;
    }

    /// The registry and key, for the re-entrancy record.
    pub(crate) fn owner(&self) -> (usize, &str) {
        let held = self.held();
        (held.registry.id(), &held.full_key)
    }

    /// Releases the lock (or, with `hold_at_least`, shortens the lease to
    /// what remains of it) and wakes waiters.
    ///
    /// # Errors
    ///
    /// [`LockError::Lost`] if the lease had been lost before (expired or
    /// taken over: the other holder's lock is left alone);
    /// [`LockError::Backend`] if the store could not be reached, in which
    /// case the lease ends when its TTL passes.
    pub async fn release(mut self) -> Result<(), LockError> {
        match self.held.take() {
            Some(held) => held.release().await,
            None => Ok(()),
        }
    }
}

impl Held {
    /// If another task of this process waits for the key, passes the lease
    /// to it in one round trip instead of releasing it (at most
    /// `MAX_HAND_OVERS` times in a row). `None` when it did not try.
    async fn try_hand_over(&self) -> Option<Result<(), LockError>> {
        let backend = self.registry.backend();
        if self.chain >= MAX_HAND_OVERS || !backend.supports_hand_over() {
            return None;
        }
        let permit = take_permit_if(&self.permit, LocalPermit::has_waiters)?;
        let sent_at = Instant::now();
        let result = match backend
            .hand_over(&self.full_key, self.token, self.ttl)
            .await
        {
            Ok(Some(fencing)) => {
                tracing::debug!(key = %self.key, fencing, "lock handed over within this process");
                permit.pass(Baton {
                    token: self.token,
                    fencing,
                    ttl: self.ttl,
                    sent_at,
                    chain: self.chain + 1,
                });
                return Some(Ok(()));
            }
            Ok(None) => Err(LockError::lost(&self.key)),
            Err(source) => Err(LockError::backend(&self.key, "release", source)),
        };
        drop(permit);
        Some(result)
    }

    async fn release(self) -> Result<(), LockError> {
        self.watchdog.stop();
        let was_held = !self.lease.is_lost();
        let linger = self
            .hold_at_least
            .map(|hold| hold.saturating_sub(self.acquired_at.elapsed()))
            .unwrap_or_default();
        // Stores count whole milliseconds: round a remainder up.
        let linger = Duration::from_millis(linger.as_micros().div_ceil(1000) as u64);
        if was_held
            && linger.is_zero()
            && let Some(result) = self.try_hand_over().await
        {
            return result;
        }
        let released = self
            .registry
            .backend()
            .release(&self.full_key, self.token, linger)
            .await;
        // The next local waiter goes ahead once the store has the release.
        drop(take_permit(&self.permit));
        match released {
            Ok(true) if was_held => {
                tracing::debug!(key = %self.key, linger_ms = linger.as_millis() as u64, "lock released");
                Ok(())
            }
            Ok(_) => {
                tracing::warn!(key = %self.key, "release found the lease lost; the current holder's lock was left alone");
                Err(LockError::lost(&self.key))
            }
            Err(source) => Err(LockError::backend(&self.key, "release", source)),
        }
    }
}

fn take_permit(permit: &Mutex<Option<LocalPermit>>) -> Option<LocalPermit> {
    take_permit_if(permit, |_| true)
}

/// Takes the permit out of its slot if `wanted` says so.
fn take_permit_if(
    permit: &Mutex<Option<LocalPermit>>,
    wanted: impl FnOnce(&LocalPermit) -> bool,
) -> Option<LocalPermit> {
    // `take` is the only operation: the slot is consistent after a panic.
    let mut slot = permit.lock().unwrap_or_else(|poison| poison.into_inner());
    if slot.as_ref().is_some_and(wanted) {
        slot.take()
    } else {
        None
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let Some(held) = self.held.take() else {
            return;
        };
        held.watchdog.stop();
        match Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let key = held.key.clone();
                    if let Err(error) = held.release().await {
                        tracing::debug!(%key, %error, "release on drop failed");
                    }
                });
            }
            Err(_) => {
                tracing::debug!(key = %held.key, "guard dropped outside a runtime; the lease ends at its ttl");
            }
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.held {
            Some(held) => f
                .debug_struct("LockGuard")
                .field("key", &held.key)
                .field("fencing_token", &held.fencing)
                .field("is_held", &!held.lease.is_lost())
                .finish(),
            None => f.write_str("LockGuard(released)"),
        }
    }
}
