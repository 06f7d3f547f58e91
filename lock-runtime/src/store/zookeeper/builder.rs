//! Configuring and connecting a [`ZooKeeperStore`]: servers, chroot, root
//! path, digest credentials and timeouts.

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use super::session::{Digest, Session};
use super::state::{Failed, Shared, watch_session};
use super::state::{deletions, dues};
use super::{ZooKeeperStore, capabilities};
use crate::error::{LockError, StoreError};
use crate::store::common::connect::{self, Timeouts, timeout_setters};

/// Configures and connects a [`ZooKeeperStore`].
#[derive(Debug)]
pub struct ZooKeeperStoreBuilder {
    connect_string: String,
    chroot: Option<String>,
    digest: Option<Digest>,
    root: String,
    session_timeout: Duration,
    timeouts: Timeouts,
}

impl ZooKeeperStoreBuilder {
    timeout_setters!(call: "one call", "2 s"; connect: "2 s");

    /// The node every key's queue lives under (default `/locks`).
    pub fn root(mut self, root: impl Into<String>) -> Self {
        self.root = root.into();
        self
    }

    /// Confines every node of the store under `chroot` (`/apps/orders`),
    /// which is created on connect if missing, as the root is. A connect
    /// string ending in a path (`host:2181/apps/orders`) sets it too; this
    /// replaces that.
    pub fn chroot(mut self, chroot: impl Into<String>) -> Self {
        self.chroot = Some(chroot.into());
        self
    }

    /// Authenticates the session with ZooKeeper's `digest` scheme as
    /// `user`, and creates every node with the `auth` ACL: only sessions
    /// with the same credentials may read, queue on or delete them. Give
    /// every process sharing the locks the same credentials. The password
    /// never appears in errors or `Debug` output.
    pub fn digest(mut self, user: &str, password: &str) -> Self {
        self.digest = Some(Digest {
            user: user.to_owned(),
            credentials: format!("{user}:{password}").into_bytes(),
        });
        self
    }

    /// The session timeout to ask for (default 30 s); the ensemble may
    /// grant another within its limits. No lock's ttl may exceed it. A
    /// crashed holder's lock is free after its ttl and 1 s whatever this
    /// is; its session ends after this.
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// Connects, creates the root if it is missing, and reads the session
    /// timeout the ensemble granted.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidSettings`] for a root or chroot that is not an
    /// absolute path; [`LockError::Connect`] when no server answers or the
    /// root cannot be created.
    pub async fn connect(self) -> Result<ZooKeeperStore, LockError> {
        let shown = self.connect_string.clone();
        if let Err(reason) = self.check_paths() {
            return Err(LockError::InvalidSettings {
                store: "zookeeper",
                address: shown,
                reason,
            });
        }
        connect::opened("zookeeper", shown, self.open()).await
    }

    /// The servers, and the chroot from the builder or the connect string.
    fn servers_and_chroot(&self) -> (String, Option<String>) {
        let (servers, chroot) = match self.connect_string.split_once('/') {
            Some((servers, path)) => (servers.to_owned(), Some(format!("/{path}"))),
            None => (self.connect_string.clone(), None),
        };
        let chroot = self
            .chroot
            .clone()
            .or(chroot)
            .filter(|chroot| chroot != "/");
        (servers, chroot)
    }

    /// Refuses a root or chroot that is not an absolute path.
    fn check_paths(&self) -> Result<(), String> {
        let (_, chroot) = self.servers_and_chroot();
        for (what, path) in [("root", Some(&self.root)), ("chroot", chroot.as_ref())] {
            let Some(path) = path else {
                continue;
            };
            if !path.starts_with('/') || path.ends_with('/') || path.contains("//") {
                return Err(format!(
                    "the ZooKeeper {what} `{path}` must start with `/`, not end with one \
                     and have no empty segment"
                ));
            }
        }
        Ok(())
    }

    async fn open(self) -> Result<ZooKeeperStore, StoreError> {
        let shown = self.connect_string.clone();
        let (servers, chroot) = self.servers_and_chroot();
        let settings = Session {
            servers,
            chroot,
            digest: self.digest,
            session_timeout: self.session_timeout,
            connection_timeout: self.timeouts.connection,
            response_timeout: self.timeouts.response,
        };
        // The chroot and the root, made from outside the chroot.
        let unconfined = settings.open().await?;
        let full_root = format!("{}{}", settings.chroot.as_deref().unwrap_or(""), self.root);
        let made = tokio::time::timeout(
            self.timeouts.response,
            unconfined.mkdir(&full_root, &settings.directory()),
        )
        .await;
        match made {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                return Err(format!(
                    "cannot create the ZooKeeper root `{full_root}`: {}",
                    StoreError::from(Failed::Refused(err))
                )
                .into());
            }
            Err(_) => {
                return Err(format!(
                    "cannot create the ZooKeeper root `{full_root}`: {}",
                    StoreError::from(Failed::Timeout(self.timeouts.response))
                )
                .into());
            }
        }
        let client = settings.confine(unconfined)?;
        let session_timeout = client.session_timeout();
        let store = ZooKeeperStore {
            shared: Arc::new(Shared {
                session: RwLock::new(client),
                settings,
                root: self.root,
                timeout: self.timeouts.response,
                held: Mutex::default(),
                created: Mutex::default(),
                deletions: deletions::Deletions::default(),
                overdue: dues::Dues::default(),
            }),
            session_timeout,
            capabilities: capabilities(session_timeout),
            shown,
        };
        tokio::spawn(watch_session(
            store.shared.client().state_watcher(),
            Arc::downgrade(&store.shared),
        ));
        Ok(store)
    }
}

impl ZooKeeperStore {
    /// Starts configuring a store for the ensemble at `connect_string`.
    pub fn builder(connect_string: &str) -> ZooKeeperStoreBuilder {
        ZooKeeperStoreBuilder {
            connect_string: connect_string.to_owned(),
            chroot: None,
            digest: None,
            root: "/locks".to_owned(),
            session_timeout: Duration::from_secs(30),
            timeouts: Timeouts::new(Duration::from_secs(2), Duration::from_secs(2)),
        }
    }

    /// Connects with the default settings: `ZooKeeperStore::builder(connect_string).connect()`.
    ///
    /// # Errors
    ///
    /// As [`ZooKeeperStoreBuilder::connect`].
    pub async fn connect(connect_string: &str) -> Result<ZooKeeperStore, LockError> {
        ZooKeeperStore::builder(connect_string).connect().await
    }
}
