//! One held lease row.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::Shared;
use super::sql::micros;
use crate::store::{HandOver, Lease, LockToken, Reply};

/// One lease: the key's row id and our token, and whether it is a share
/// or permit (a row of the holders' table) rather than the key's row.
pub(super) struct MySqlLease {
    pub(super) shared: Arc<Shared>,
    pub(super) id: [u8; 32],
    pub(super) token: LockToken,
    pub(super) ttl: Duration,
    pub(super) one_of_many: bool,
}

impl Lease for MySqlLease {
    fn renew(&self) -> Reply<'_, bool> {
        Reply::new(async move {
            if self.one_of_many {
                return self
                    .shared
                    .unclaim(&self.id, self.token, self.ttl, false)
                    .await;
            }
            self.shared.extend(&self.id, self.token, self.ttl).await
        })
    }

    fn release(&mut self, linger: Duration) -> Reply<'_, bool> {
        Reply::new(async move {
            if self.one_of_many {
                let release = linger.is_zero();
                return self
                    .shared
                    .unclaim(&self.id, self.token, linger, release)
                    .await;
            }
            if linger.is_zero() {
                return self.shared.release(&self.id, self.token).await;
            }
            let held = self.shared.extend(&self.id, self.token, linger).await?;
            if held {
                // Free once the linger ends.
                self.shared.freed_now(&self.id);
            }
            Ok(held)
        })
    }

    fn hand_over(&mut self, _sent_at: tokio::time::Instant) -> Reply<'_, HandOver> {
        Reply::new(async move {
            if self.one_of_many {
                // A share is not moved: released, the next holder claims anew.
                let released = self.release(Duration::ZERO).await?;
                return Ok(if released {
                    HandOver::Released
                } else {
                    HandOver::Lost
                });
            }
            let next = LockToken::random();
            let statement = &self.shared.statements.hand_over;
            let params = (
                next.to_string(),
                micros(self.ttl),
                &self.id[..],
                self.token.to_string(),
            );
            let fencing = self.shared.exec_id(statement, params).await?;
            if fencing.is_some() {
                self.token = next;
            }
            Ok(fencing.into())
        })
    }
}

impl fmt::Debug for MySqlLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlLease").finish_non_exhaustive()
    }
}
