//! One held lease on one Redis.

use std::fmt;
use std::time::Duration;

use ::redis::aio::ConnectionLike;

use super::commands::Commands;
use crate::error::StoreError;
use crate::store::{HandOver, Lease, LockToken, Reply};

/// One lease on one Redis: the lock's Redis name and our token.
pub(super) struct RedisLease<C> {
    pub(super) commands: Commands<C>,
    pub(super) lock: Vec<u8>,
    pub(super) token: LockToken,
    pub(super) ttl: Duration,
    /// Whether it is an exclusive lease (not a share or a permit).
    pub(super) exclusive: bool,
    /// Whether its acquire knew the key to be in demand: its release and
    /// renewal then go by script, which wakes waiters in the same call.
    pub(super) contended: bool,
    /// Whether its fencing token is issued when the holder first reads it
    /// (and the next holder's after a hand-over too).
    pub(super) on_demand: bool,
}

impl<C> RedisLease<C> {
    /// Whether the server's own owner-checked commands may serve it.
    fn plain(&self) -> bool {
        self.exclusive && !self.contended
    }
}

impl<C> Lease for RedisLease<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn renew(&self) -> Reply<'_, bool> {
        Reply::new(
            self.commands
                .renew(&self.lock, self.token, self.ttl, self.plain()),
        )
    }

    fn release(&mut self, linger: Duration) -> Reply<'_, bool> {
        Reply::new(self.commands.release(
            &self.lock,
            self.token,
            linger,
            self.exclusive,
            self.plain(),
        ))
    }

    fn hand_over(&mut self, _sent_at: tokio::time::Instant) -> Reply<'_, HandOver> {
        Reply::new(async move {
            let next = LockToken::random();
            let handed = self
                .commands
                .hand_over(
                    &self.lock,
                    (self.token, next),
                    self.ttl,
                    (self.exclusive, self.on_demand),
                )
                .await?;
            if let HandOver::Moved { .. } = handed {
                self.token = next;
            }
            Ok(handed)
        })
    }

    fn fencing_token(&self) -> Reply<'_, Option<u64>> {
        if !self.on_demand {
            return Reply::ready(Err(StoreError::tokens_with_grant()));
        }
        Reply::new(self.commands.issue(&self.lock, self.token, self.ttl))
    }
}

impl<C> fmt::Debug for RedisLease<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLease")
            .field("lock", &String::from_utf8_lossy(&self.lock))
            .finish_non_exhaustive()
    }
}
