//! One held lease row.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::statements::Shared;
use super::table::{millis, turn};
use crate::store::{HandOver, Lease, LockToken, Reply};

/// One lease: the key's row id and our token, and whether it is a share
/// or permit (a row of the holders' table) rather than the key's row.
pub(super) struct PostgresLease {
    pub(super) shared: Arc<Shared>,
    pub(super) id: Vec<u8>,
    pub(super) token: LockToken,
    pub(super) ttl: Duration,
    pub(super) one_of_many: bool,
}

impl Lease for PostgresLease {
    fn renew(&self) -> Reply<'_, bool> {
        Reply::new(async move {
            if self.one_of_many {
                let ttl = millis(self.ttl);
                return self.shared.unclaim(&self.id, self.token, ttl, false).await;
            }
            let (token, ttl) = (self.token.to_string(), millis(self.ttl));
            let changed = self
                .shared
                .execute(&self.id, |s| &s.extend, &[&self.id, &token, &ttl])
                .await?;
            Ok(changed == 1)
        })
    }

    fn release(&mut self, linger: Duration) -> Reply<'_, bool> {
        if self.one_of_many {
            let release = linger.is_zero();
            return Reply::new(
                self.shared
                    .unclaim(&self.id, self.token, millis(linger), release),
            );
        }
        Reply::new(self.shared.release(&self.id, self.token, linger))
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
            let (token, next_text, ttl) =
                (self.token.to_string(), next.to_string(), millis(self.ttl));
            let row = self
                .shared
                .query_opt(
                    &self.id,
                    |s| &s.hand_over,
                    &[&self.id, &token, &next_text, &ttl, &turn(&self.id)],
                )
                .await?;
            let fencing: Option<i64> = row.map(|row| row.get(0));
            if fencing.is_some() {
                self.token = next;
            }
            Ok(fencing.map(|f| u64::try_from(f).unwrap_or(0)).into())
        })
    }
}

impl fmt::Debug for PostgresLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLease").finish_non_exhaustive()
    }
}
