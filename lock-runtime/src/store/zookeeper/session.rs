//! How to open a session (again after one expired), with the store's
//! credentials.

use std::fmt;
use std::time::Duration;

use zookeeper_client::{Acls, Client, CreateMode};

use crate::error::StoreError;

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
    pub(super) async fn open(&self) -> Result<Client, StoreError> {
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
    pub(super) fn confine(&self, client: Client) -> Result<Client, StoreError> {
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

/// Digest credentials (`user:password`); never shown.
#[derive(Clone)]
pub(super) struct Digest {
    pub(super) user: String,
    pub(super) credentials: Vec<u8>,
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({}:<redacted>)", self.user)
    }
}
