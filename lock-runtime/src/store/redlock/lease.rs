//! One Redlock lease: renewed and released on every node, counted while a
//! majority has it.

use std::fmt;
use std::sync::Mutex;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;

use super::{RedlockStore, on_node, tally};
use crate::store::redis::RedisStore;
use crate::store::{Lease, LockToken, Reply};

/// One Redlock lease: the key, our token, and until when a majority's grant
/// is known to stand (by the monotonic clock). Inside that window renewal
/// may take the lock again on nodes that lost it, and a release cannot
/// report a loss.
pub(super) struct RedlockLease {
    redlock: RedlockStore,
    key: String,
    token: LockToken,
    ttl: Duration,
    /// Moved on by each renewal, which has only `&self`.
    valid_until: Mutex<Instant>,
}

impl RedlockLease {
    /// `token`'s lease on `key` of `redlock`, for `ttl`, that a majority's
    /// grant keeps until `valid_until`.
    pub(super) fn new(
        redlock: RedlockStore,
        key: &str,
        token: LockToken,
        ttl: Duration,
        valid_until: Instant,
    ) -> Self {
        RedlockLease {
            redlock,
            key: key.to_owned(),
            token,
            ttl,
            valid_until: Mutex::new(valid_until),
        }
    }

    fn is_valid(&self) -> bool {
        *self.valid_until() > Instant::now()
    }

    fn valid_until(&self) -> std::sync::MutexGuard<'_, Instant> {
        // Only ever assigned whole: consistent after a panic.
        self.valid_until
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}

impl Lease for RedlockLease {
    fn renew(&self) -> Reply<'_, bool> {
        Reply::new(async move {
            let (key, token, ttl) = (self.key.as_str(), self.token, self.ttl);
            let redlock = &self.redlock;
            let started = Instant::now();
            let limit = redlock.node_timeout(ttl);
            let mut results = redlock
                .on_all(limit, |node| node.renew_token(key, token, ttl))
                .await;
            // Inside the validity window, while a majority still has it, no
            // one else can hold a majority, so taking the lock on nodes that
            // do not have it (down when it was acquired, or restarted) is
            // safe and keeps the majority wide. A lease a majority no longer
            // has (a forced release) is lost, never taken back.
            let (kept, _) = tally(&results);
            if self.is_valid() && kept >= redlock.quorum() {
                let retake = redlock
                    .nodes
                    .iter()
                    .zip(results.iter_mut())
                    .filter(|(_, r)| matches!(r, Ok(false)));
                join_all(retake.map(|(node, result)| async move {
                    let acquire = |node| RedisStore::try_acquire(node, key, token, ttl, false);
                    if let Ok(Ok(_)) = on_node(node, limit, &acquire).await {
                        *result = Ok(true);
                    }
                }))
                .await;
            }
            let (ours, not_ours) = tally(&results);
            let drift = redlock.drift(ttl);
            if ours >= redlock.quorum() && started.elapsed() + drift < ttl {
                *self.valid_until() = started + ttl - drift;
                return Ok(true);
            }
            let answered = ours + not_ours;
            if answered >= redlock.quorum() {
                return Ok(false);
            }
            Err(redlock.no_quorum("renew", answered, &results).into())
        })
    }

    fn release(&mut self, linger: Duration) -> Reply<'_, bool> {
        Reply::new(async move {
            let (key, token) = (self.key.as_str(), self.token);
            let redlock = &self.redlock;
            let was_valid = self.is_valid();
            let limit = redlock.node_timeout(linger.max(Duration::from_secs(1)));
            let results = redlock
                .on_all(limit, |node| node.release_token(key, token, linger))
                .await;
            // Whatever the answers, the handle no longer holds anything.
            *self.valid_until() = Instant::now();
            let (released, not_ours) = tally(&results);
            let answered = released + not_ours;
            // Inside the validity window the lease was ours even if only some
            // nodes still had it (those that never granted it, or restarted,
            // answer "not ours"); when none had it, it was taken from us.
            if released >= redlock.quorum() || (was_valid && released > 0) {
                return Ok(true);
            }
            if answered >= redlock.quorum() {
                return Ok(false);
            }
            Err(redlock.no_quorum("release", answered, &results).into())
        })
    }
}

impl fmt::Debug for RedlockLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockLease")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}
