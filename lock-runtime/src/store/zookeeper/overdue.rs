//! Overdue holders: a child that holds its key but has not been written
//! (created or touched) within its ttl and [`REAP_MARGIN`], by the
//! ensemble's clock, belongs to a holder that is gone (crashed, frozen,
//! cut off) while its session lives on. Others delete it, so a crashed
//! holder blocks the key for its ttl, not for the session timeout.
//!
//! Safety rests on three facts. A holder counts its lease from before the
//! write that set its child's `mtime`, so its lease ends before `mtime +
//! ttl`. A reaper deletes only after the ensemble's clock passed `mtime +
//! ttl + REAP_MARGIN`, judged by a clock reading it took from one of its
//! own writes (never ahead of the ensemble's). And the deletion is checked
//! against the version it read, so a renewal that lands first wins and
//! the reaper's deletion fails; a renewal that lands after finds no node,
//! and its holder learns it has lost the lock.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use zookeeper_client::Error as ZkError;

use super::keys::{claim_of, ttl_data, ttl_of};
use super::state::{Failed, Shared};
use crate::error::StoreError;
use crate::store::Claim;
use crate::store::common::queue::holding;

/// How long past its ttl, by the ensemble's clock, a holder's child is
/// left before others delete it: covers the skew between the clocks of
/// the ensemble's servers (a new leader stamps writes with its own) and
/// the drift of the holder's clock over its ttl.
pub(super) const REAP_MARGIN: Duration = Duration::from_secs(1);

impl Shared {
    /// Writes our child at `path` again (its ttl), so its `mtime` is the
    /// ensemble's now; `Ok(false)` if it is gone. A holder's lease counts
    /// from before this call.
    pub(super) async fn touch(&self, path: &str, ttl: Duration) -> Result<bool, StoreError> {
        let client = self.client();
        match self.call(client.set_data(path, &ttl_data(ttl), None)).await {
            Ok(stat) => {
                self.overdue.saw(stat.mtime);
                Ok(true)
            }
            Err(Failed::Refused(ZkError::NoNode)) => Ok(false),
            Err(err) => Err(err.into()),
        }
    }

    /// Deletes the holders of `parent` (not ours) that are overdue, once
    /// one could be: `queue` is the key's children sorted, if just read.
    /// Whether any was deleted. Between due times no request is made.
    pub(super) async fn reap_overdue(
        self: &Arc<Self>,
        parent: &str,
        queue: Option<Vec<String>>,
    ) -> Result<bool, StoreError> {
        if self
            .overdue
            .due(parent)
            .is_some_and(|at| at > Instant::now())
        {
            return Ok(false);
        }
        let queue = match queue {
            Some(queue) => queue,
            None => self.queue(parent).await?,
        };
        let claims: Vec<Claim> = queue.iter().map(|name| claim_of(name)).collect();
        let holders = &queue[..holding(&claims)];
        let Some(now) = self.overdue.now() else {
            return Ok(false);
        };
        let read_at = Instant::now();
        let mut next: Option<Instant> = None;
        let mut reaped = false;
        for name in holders {
            let path = format!("{parent}/{name}");
            if self.is_ours(&path) {
                continue;
            }
            let client = self.client();
            let (data, stat) = match self.call(client.get_data(&path)).await {
                Ok(read) => read,
                Err(Failed::Refused(ZkError::NoNode)) => continue,
                Err(err) => return Err(err.into()),
            };
            // A child with no ttl of its own is left to its session.
            let Some(ttl) = ttl_of(&data) else {
                continue;
            };
            let allowed = i64::try_from((ttl + REAP_MARGIN).as_millis()).unwrap_or(i64::MAX);
            let age = now.saturating_sub(stat.mtime);
            if age <= allowed {
                let left = Duration::from_millis(u64::try_from(allowed - age).unwrap_or(0));
                let at = read_at + left + Duration::from_millis(1);
                next = Some(next.map_or(at, |next| next.min(at)));
                continue;
            }
            let client = self.client();
            match self.call(client.delete(&path, Some(stat.version))).await {
                Ok(()) => {
                    tracing::info!(%path, age_ms = age, ttl_ms = ttl.as_millis() as u64,
                        "deleted an overdue lock node: its holder stopped renewing");
                    reaped = true;
                }
                // Renewed meanwhile, or gone: not ours to decide.
                Err(Failed::Refused(ZkError::BadVersion | ZkError::NoNode)) => {}
                Err(err) => return Err(err.into()),
            }
        }
        self.overdue
            .set_due(parent, if reaped { None } else { next });
        Ok(reaped)
    }

    /// Whether `path` is one of our children.
    fn is_ours(&self, path: &str) -> bool {
        self.held().contains_key(path)
            || self
                .created()
                .values()
                .flatten()
                .any(|child| child.path() == path)
    }
}
