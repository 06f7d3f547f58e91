//! One held child: its renewal, its release, and the watch that tells its
//! holder when someone else deletes it.

use std::fmt;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::state::{Child, Shared};
use crate::store::{Lease, LockToken, Reply};

/// How long a child is held before it is watched: a deletion its holder
/// did not make is pushed within this; shorter holds are never watched.
pub(super) const WATCH_AFTER: Duration = Duration::from_millis(100);

/// Tells the holder of `path` when someone else deletes it (an operator, a
/// forced release, a waiter that found it overdue), once it has been held for [`WATCH_AFTER`]. Runs in the
/// lease's task, beside [`expire`].
pub(super) async fn watch_held(shared: Weak<Shared>, path: Arc<str>) {
    tokio::time::sleep(WATCH_AFTER).await;
    loop {
        let watched = {
            let Some(store) = shared.upgrade() else {
                return;
            };
            if !store.held().contains_key(&path) {
                return;
            }
            let client = store.client();
            store.call(client.check_and_watch_stat(&path)).await
        };
        let deleted = match watched {
            Ok((None, _)) => true,
            Ok((Some(_), watcher)) => match watcher.changed().await.event_type {
                zookeeper_client::EventType::NodeDeleted => true,
                // Our own renewal: watch again.
                zookeeper_client::EventType::NodeDataChanged => continue,
                _ => false,
            },
            // The renewal checks the node anyway.
            Err(_) => false,
        };
        if !deleted {
            return;
        }
        let Some(store) = shared.upgrade() else {
            return;
        };
        let loss = store.held().remove(&path);
        if let Some(loss) = loss {
            loss.raise("its ZooKeeper node was deleted (overdue, a forced release, or by hand)");
        }
        return;
    }
}

/// A held child.
pub(super) struct ZooKeeperLease {
    pub(super) shared: Arc<Shared>,
    pub(super) token: LockToken,
    pub(super) child: Child,
    /// Until when the child stays without a renewal; the store deletes it
    /// then.
    pub(super) deadline: Arc<Mutex<Instant>>,
    pub(super) ttl: Duration,
    pub(super) expiry: tokio::task::AbortHandle,
}

impl fmt::Debug for ZooKeeperLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZooKeeperLease")
            .field("node", &self.child.path())
            .finish_non_exhaustive()
    }
}

impl ZooKeeperLease {
    pub(super) fn new(
        shared: Arc<Shared>,
        token: LockToken,
        child: Child,
        ttl: Duration,
        sent_at: Instant,
    ) -> Self {
        let deadline = Arc::new(Mutex::new(sent_at + ttl));
        let (weak, path, until) = (
            Arc::downgrade(&shared),
            child.path.clone(),
            deadline.clone(),
        );
        // One task per held child, ended by the release: the ttl and the
        // watch for a deletion by someone else.
        let expiry = tokio::spawn(async move {
            tokio::join!(
                expire(weak.clone(), token, path.clone(), until),
                watch_held(weak, path),
            );
        })
        .abort_handle();
        ZooKeeperLease {
            shared,
            token,
            child,
            deadline,
            ttl,
            expiry,
        }
    }

    /// Stops looking after the child; whether it was still held (not
    /// expired at its ttl, nor gone with its session or deleted).
    pub(super) fn forget(&self) -> bool {
        self.expiry.abort();
        self.shared.created().remove(&self.token);
        self.shared.held().remove(self.child.path()).is_some()
    }
}

impl Drop for ZooKeeperLease {
    fn drop(&mut self) {
        self.expiry.abort();
    }
}

/// Deletes a held child at its deadline unless renewed meanwhile.
pub(super) async fn expire(
    shared: Weak<Shared>,
    token: LockToken,
    path: Arc<str>,
    deadline: Arc<Mutex<Instant>>,
) {
    loop {
        let at = *deadline.lock().unwrap_or_else(|e| e.into_inner());
        tokio::time::sleep_until(at).await;
        let now = *deadline.lock().unwrap_or_else(|e| e.into_inner());
        if now > at {
            continue;
        }
        let Some(shared) = shared.upgrade() else {
            return;
        };
        shared.created().remove(&token);
        shared.held().remove(&path);
        if let Err(err) = shared.discard(&path).await {
            tracing::warn!(%path, %err, "could not delete an expired lock node yet; retrying");
        }
        return;
    }
}

impl Lease for ZooKeeperLease {
    /// Writes the child again: its `mtime`, which others judge it by, is
    /// now (see [`overdue`](super::overdue)).
    fn renew(&self) -> Reply<'_, bool> {
        Reply::new(async move {
            let sent_at = Instant::now();
            let path = self.child.path();
            let held = || self.shared.held().contains_key(path);
            if !held() {
                return Ok(false);
            }
            // The node's name is unique to this attempt: it exists only as
            // ours, and nobody else writes it.
            let ours = self.shared.touch(path, self.ttl).await? && held();
            if ours {
                *self.deadline.lock().unwrap_or_else(|e| e.into_inner()) = sent_at + self.ttl;
            }
            Ok(ours)
        })
    }

    fn release(&mut self, linger: Duration) -> Reply<'_, bool> {
        Reply::new(async move {
            let path = self.child.path.clone();
            if !self.forget() {
                // Lost already: no round trip to a store that may not
                // answer; the child, if left (a renewal that failed), is
                // deleted in the background.
                self.shared.discard_later(path.to_string());
                return Ok(false);
            }
            if linger.is_zero() {
                return self.shared.discard(&path).await;
            }
            // Deleted after `linger` whatever the check below says, so an
            // unanswered check leaves nothing behind.
            let shared = Arc::downgrade(&self.shared);
            let later = path.clone();
            tokio::spawn(async move {
                tokio::time::sleep(linger).await;
                if let Some(shared) = shared.upgrade() {
                    let _ = shared.discard(&later).await;
                }
            });
            let exists = self
                .shared
                .call(self.shared.client().check_stat(&path))
                .await?;
            if exists.is_none() {
                return Ok(false);
            }
            Ok(true)
        })
    }
}
