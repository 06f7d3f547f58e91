//! The session: how to open one (again after one expired), and what its
//! end tells every holder.

use std::sync::Weak;
use std::time::Duration;

use zookeeper_client::{Acls, Client, CreateMode, SessionState};

use super::builder::Digest;
use super::shared::Shared;
use crate::error::BackendError;
use crate::store::LossSignal;

/// How to open a session, again after one expired.
#[derive(Debug)]
pub(super) struct Session {
    /// The servers, without the chroot.
    pub(super) servers: String,
    pub(super) chroot: Option<String>,
    pub(super) digest: Option<Digest>,
    pub(super) session_timeout: Duration,
    pub(super) connection_timeout: Duration,
    pub(super) response_timeout: Duration,
}

impl Session {
    /// A session outside the chroot (see [`Session::confine`]).
    pub(super) async fn open(&self) -> Result<Client, BackendError> {
        let shown = &self.servers;
        let within = self.connection_timeout + self.response_timeout;
        let mut connector = Client::connector()
            .with_session_timeout(self.session_timeout)
            .with_connection_timeout(self.connection_timeout);
        if let Some(digest) = &self.digest {
            connector = connector.with_auth("digest", &digest.credentials);
        }
        let connect = connector.connect(&self.servers);
        match tokio::time::timeout(within, connect).await {
            Ok(Ok(client)) => Ok(client),
            Ok(Err(err)) => Err(format!("cannot connect to ZooKeeper at {shown}: {err}").into()),
            Err(_) => Err(format!(
                "cannot connect to ZooKeeper at {shown}: no answer within {within:?}"
            )
            .into()),
        }
    }

    /// `client` confined to the chroot, if one is set.
    pub(super) fn confine(&self, client: Client) -> Result<Client, BackendError> {
        match &self.chroot {
            None => Ok(client),
            Some(chroot) => client
                .chroot(chroot.as_str())
                .map_err(|_| format!("the ZooKeeper chroot `{chroot}` is not a valid path").into()),
        }
    }

    /// Who may touch our nodes: anyone, or with digest credentials only
    /// sessions holding the same ones.
    pub(super) fn acls(&self) -> Acls<'static> {
        match self.digest {
            Some(_) => Acls::creator_all(),
            None => Acls::anyone_all(),
        }
    }

    /// How the chroot and the root are made.
    pub(super) fn directory(&self) -> zookeeper_client::CreateOptions<'static> {
        CreateMode::Persistent.with_acls(self.acls())
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
