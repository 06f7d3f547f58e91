//! What clones of one store share: the session (and the watch that tells
//! every holder when it ends), the children we created and hold, and the
//! deletions in flight.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use zookeeper_client::{Client, Error as ZkError, SessionState};

use super::keys::encode_onto;
use super::session::Session;

pub(super) mod deletions;
pub(super) mod dues;
use crate::error::StoreError;
use crate::store::common::queue::Place;
use crate::store::{LockToken, LossSignal};

/// What clones of one store share.
pub(super) struct Shared {
    /// The current session; replaced when one expires.
    pub(super) session: RwLock<Client>,
    pub(super) settings: Session,
    pub(super) root: String,
    pub(super) timeout: Duration,
    /// The children held, by path: their loss signals, told when the
    /// session expires.
    pub(super) held: Mutex<HashMap<Arc<str>, LossSignal>>,
    /// Our children, by token: created, or possibly created (a create
    /// whose reply was lost: `None` until found by name).
    pub(super) created: Mutex<HashMap<LockToken, Option<Child>>>,
    pub(super) deletions: deletions::Deletions,
    pub(super) overdue: dues::Dues,
}

/// One of our children: its path (its key's node, `/`, its name), built
/// once and shared, and its creation zxid.
#[derive(Clone, Debug)]
pub(super) struct Child {
    pub(super) path: Arc<str>,
    /// Where the name starts in `path`.
    pub(super) name_at: usize,
    pub(super) czxid: i64,
    /// Where the waiter's watch last placed it in the queue.
    pub(super) place: Place,
}

impl Child {
    pub(super) fn new(parent: &str, name: &str, czxid: i64) -> Child {
        let mut path = String::with_capacity(parent.len() + 1 + name.len());
        path.push_str(parent);
        path.push('/');
        path.push_str(name);
        Child {
            path: path.into(),
            name_at: parent.len() + 1,
            czxid,
            place: Place::Unknown,
        }
    }

    pub(super) fn path(&self) -> &str {
        &self.path
    }

    pub(super) fn parent(&self) -> &str {
        &self.path[..self.name_at - 1]
    }

    pub(super) fn name(&self) -> &str {
        &self.path[self.name_at..]
    }
}

/// A call's failure: ZooKeeper's answer, or none in time.
#[derive(Debug)]
pub(super) enum Failed {
    Refused(ZkError),
    Timeout(Duration),
}

/// A call whose connection broke under it (reset, closed, silent): the
/// client connects to another server and the session lives on, so the
/// call may or may not have been carried out, and may be made again.
#[derive(Debug)]
pub(super) struct Disconnected(ZkError);

impl std::fmt::Display for Disconnected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ZooKeeper: {}", self.0)
    }
}

impl std::error::Error for Disconnected {}

/// Whether `err` is a [`Disconnected`] call.
pub(super) fn disconnected(err: &StoreError) -> bool {
    err.get_ref().downcast_ref::<Disconnected>().is_some()
}

impl From<Failed> for StoreError {
    fn from(failed: Failed) -> StoreError {
        match failed {
            // The client's own: the connection was lost (`ConnectionLoss`)
            // or failed under the call (an I/O error, no answer within the
            // connection timeout).
            Failed::Refused(err @ (ZkError::ConnectionLoss | ZkError::Custom(_))) => {
                StoreError::unavailable(Disconnected(err))
            }
            Failed::Refused(ZkError::NoAuth) => "ZooKeeper refused access (not authorized): \
                 the lock nodes' ACL admits other credentials than this session's \
                 (see the builder's `digest`)"
                .into(),
            Failed::Refused(err) => format!("ZooKeeper: {err}").into(),
            Failed::Timeout(timeout) => {
                format!("no answer from ZooKeeper within {timeout:?}").into()
            }
        }
    }
}

impl Shared {
    /// The current session's client (clones share the session, and send
    /// their requests in call order).
    pub(super) fn client(&self) -> Client {
        self.session
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Runs one call within the response timeout.
    pub(super) async fn call<T>(
        &self,
        call: impl Future<Output = Result<T, ZkError>>,
    ) -> Result<T, Failed> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(err)) => Err(Failed::Refused(err)),
            Err(_) => Err(Failed::Timeout(self.timeout)),
        }
    }

    /// The node of `key`'s queue.
    pub(super) fn parent(&self, key: &str) -> String {
        let mut parent = String::with_capacity(self.root.len() + 1 + key.len());
        parent.push_str(&self.root);
        parent.push('/');
        encode_onto(&mut parent, key);
        parent
    }

    pub(super) fn created(&self) -> std::sync::MutexGuard<'_, HashMap<LockToken, Option<Child>>> {
        self.created.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forgets where the waiter's watch placed our child for `token`: the
    /// queue changed under it.
    pub(super) fn unplace(&self, token: LockToken) {
        if let Some(Some(child)) = self.created().get_mut(&token) {
            child.place = Place::Unknown;
        }
    }

    pub(super) fn held(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, LossSignal>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Tells every holder when the session ends (expired, closed, refused),
/// and opens a new one, until the store is dropped.
pub(super) async fn watch_session(
    mut states: zookeeper_client::StateWatcher,
    shared: Weak<Shared>,
) {
    loop {
        let state = states.changed().await;
        if !matches!(
            state,
            SessionState::Expired | SessionState::Closed | SessionState::AuthFailed
        ) {
            continue;
        }
        let Some(store) = shared.upgrade() else {
            return;
        };
        // Every child of that session is gone with it.
        store.created().clear();
        let held: Vec<LossSignal> = store.held().drain().map(|(_, loss)| loss).collect();
        for loss in held {
            loss.raise("the ZooKeeper session expired");
        }
        tracing::warn!(servers = %store.settings.servers, ?state, "ZooKeeper session ended; opening a new one");
        drop(store);
        let mut pause = Duration::from_millis(100);
        loop {
            let Some(store) = shared.upgrade() else {
                return;
            };
            match store
                .settings
                .open()
                .await
                .and_then(|client| store.settings.confine(client))
            {
                Ok(client) => {
                    states = client.state_watcher();
                    *store.session.write().unwrap_or_else(|e| e.into_inner()) = client;
                    break;
                }
                Err(err) => {
                    tracing::warn!(%err, "no new ZooKeeper session yet");
                    drop(store);
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
            }
        }
    }
}
