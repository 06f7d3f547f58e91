//! ZooKeeper: a FIFO queue of ephemeral sequential nodes per key, the
//! lowest holding the lock, czxid fencing, and the session for liveness.
//!
//! # How a lock is kept
//!
//! A key is a container node under the store's root (default `/locks`),
//! its name the key with every byte outside `[A-Za-z0-9_.:-]` written as
//! `%XX`, so no key can reach another key's node. Each attempt is an
//! ephemeral sequential child named after its token (`<token>-<sequence>`).
//!
//! - **Acquire** is one transaction, no read: our child's create and an
//!   empty `setData` on the key's node, whose stat (taken in the same
//!   transaction) counts the children. Every child already there has a
//!   lower sequence, so ours holds the lock exactly when it is alone. A
//!   refused attempt in skip mode deletes its child; in wait mode the child
//!   keeps its place in the queue, and the next attempt with the same token
//!   finds it by its name (also after a create whose reply was lost) and
//!   reads the queue, unless the waiter's watch already knows ours heads it.
//! - **Fencing** is the czxid of our child: the zxid of its creation,
//!   cluster-wide and strictly increasing, and lower for every child queued
//!   before ours, so the next holder always has a larger one.
//! - **Waiting** watches only the child just before ours (no herd): its
//!   deletion (a release, an expired session, a waiter that left) wakes us
//!   to look again. If that child headed the queue, ours heads it now (no
//!   child can join ahead of ours), so the hand-off costs no round trip.
//! - **Liveness** is the session: a crashed holder's children vanish when
//!   the ensemble expires its session. A live holder's lock also ends at
//!   its ttl unless renewed: the store deletes its child then itself. The
//!   ttl may not exceed the session timeout, so a holder never believes in
//!   a lock whose session the ensemble may already have expired. An expired
//!   session is pushed to every holder (body cancelled, `Lost`).
//! - **Release** deletes our child; `hold_at_least` deletes it later (if
//!   the session dies first, it goes with it). Deletions asked for while
//!   one is in flight go together, as one transaction (a group commit).

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use zookeeper_client::{
    Acls, Client, CreateMode, Error as ZkError, MultiWriteError, MultiWriteResult, SessionState,
    Stat,
};

use super::{
    Acquire, AcquireRequest, BoxFuture, Capabilities, FencingPromise, HandOver, Lease, LeaseInfo,
    LockToken, LossSignal, ReleaseWatch, SafetyMargin, Store,
};
use crate::error::BackendError;
use crate::store::support::queue::Place;

mod deletions;

/// Configures and connects a [`ZooKeeperStore`].
#[derive(Debug)]
pub struct ZooKeeperStoreBuilder {
    connect_string: String,
    chroot: Option<String>,
    digest: Option<Digest>,
    root: String,
    session_timeout: Duration,
    connection_timeout: Duration,
    response_timeout: Duration,
}

/// Digest credentials (`user:password`); never shown.
#[derive(Clone)]
struct Digest {
    user: String,
    credentials: Vec<u8>,
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({}:<redacted>)", self.user)
    }
}

impl ZooKeeperStoreBuilder {
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
    /// grant another within its limits. A crashed holder's lock is free
    /// after it, and no lock's ttl may exceed it.
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// How long connecting may take before it fails (default 2 s).
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// How long one call may take before it fails (default 2 s).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Connects, creates the root if it is missing, and reads the session
    /// timeout the ensemble granted.
    ///
    /// # Errors
    ///
    /// No server answers, or the root cannot be created.
    pub async fn connect(self) -> Result<ZooKeeperStore, BackendError> {
        let shown = self.connect_string.clone();
        let (servers, chroot) = match self.connect_string.split_once('/') {
            Some((servers, path)) => (servers.to_owned(), Some(format!("/{path}"))),
            None => (self.connect_string.clone(), None),
        };
        let chroot = self.chroot.or(chroot).filter(|chroot| chroot != "/");
        for (what, path) in [("root", Some(&self.root)), ("chroot", chroot.as_ref())] {
            let Some(path) = path else {
                continue;
            };
            if !path.starts_with('/') || path.ends_with('/') || path.contains("//") {
                return Err(format!(
                    "the ZooKeeper {what} `{path}` must start with `/`, not end with one \
                     and have no empty segment"
                )
                .into());
            }
        }
        let settings = Session {
            servers,
            chroot,
            digest: self.digest,
            session_timeout: self.session_timeout,
            connection_timeout: self.connection_timeout,
            response_timeout: self.response_timeout,
        };
        // The chroot and the root, made from outside the chroot.
        let unconfined = settings.open().await?;
        let full_root = format!("{}{}", settings.chroot.as_deref().unwrap_or(""), self.root);
        let made = tokio::time::timeout(
            self.response_timeout,
            unconfined.mkdir(&full_root, &settings.directory()),
        )
        .await;
        match made {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                return Err(format!(
                    "cannot create the ZooKeeper root `{full_root}`: {}",
                    BackendError::from(Failed::Refused(err))
                )
                .into());
            }
            Err(_) => {
                return Err(format!(
                    "cannot create the ZooKeeper root `{full_root}`: {}",
                    BackendError::from(Failed::Timeout(self.response_timeout))
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
                timeout: self.response_timeout,
                held: Mutex::default(),
                created: Mutex::default(),
                deletions: deletions::Deletions::default(),
            }),
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

/// How to open a session, again after one expired.
#[derive(Debug)]
struct Session {
    /// The servers, without the chroot.
    servers: String,
    chroot: Option<String>,
    digest: Option<Digest>,
    session_timeout: Duration,
    connection_timeout: Duration,
    response_timeout: Duration,
}

impl Session {
    /// A session outside the chroot (see [`Session::confine`]).
    async fn open(&self) -> Result<Client, BackendError> {
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
    fn confine(&self, client: Client) -> Result<Client, BackendError> {
        match &self.chroot {
            None => Ok(client),
            Some(chroot) => client
                .chroot(chroot.as_str())
                .map_err(|_| format!("the ZooKeeper chroot `{chroot}` is not a valid path").into()),
        }
    }

    /// Who may touch our nodes: anyone, or with digest credentials only
    /// sessions holding the same ones.
    fn acls(&self) -> Acls<'static> {
        match self.digest {
            Some(_) => Acls::creator_all(),
            None => Acls::anyone_all(),
        }
    }

    /// How the chroot and the root are made.
    fn directory(&self) -> zookeeper_client::CreateOptions<'static> {
        CreateMode::Persistent.with_acls(self.acls())
    }
}

/// What the ZooKeeper store can do, given the session timeout granted.
fn capabilities(session_timeout: Duration) -> Capabilities {
    Capabilities::new("zookeeper")
        .with_ttl(Duration::from_millis(100), Duration::from_millis(1))
        .with_max_ttl(session_timeout)
        .with_features(true, false, false, true)
        // The holder counts its lock from before its request; the ensemble
        // expires a session no sooner than its timeout after it last heard
        // from the client, which is after that.
        .with_margin(SafetyMargin::new(Duration::from_millis(10), 2_000))
        .with_fencing(FencingPromise::new(true, true, true))
}

/// The ZooKeeper store. Cheap to clone; clones share the session.
#[derive(Clone)]
pub struct ZooKeeperStore {
    shared: Arc<Shared>,
    capabilities: Capabilities,
    shown: String,
}

impl fmt::Debug for ZooKeeperStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZooKeeperStore")
            .field("servers", &self.shown)
            .field("root", &self.shared.root)
            .field("session_timeout", &self.capabilities.max_ttl)
            .finish_non_exhaustive()
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
            connection_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(2),
        }
    }
}

/// What clones of one store share.
struct Shared {
    /// The current session; replaced when one expires.
    session: RwLock<Client>,
    settings: Session,
    root: String,
    timeout: Duration,
    /// The children held, by path: their loss signals, told when the
    /// session expires.
    held: Mutex<HashMap<Arc<str>, LossSignal>>,
    /// Our children, by token: created, or possibly created (a create
    /// whose reply was lost: `None` until found by name).
    created: Mutex<HashMap<LockToken, Option<Child>>>,
    deletions: deletions::Deletions,
}

/// One of our children: its path (its key's node, `/`, its name), built
/// once and shared, and its creation zxid.
#[derive(Clone, Debug)]
struct Child {
    path: Arc<str>,
    /// Where the name starts in `path`.
    name_at: usize,
    czxid: i64,
    /// Where the waiter's watch last placed it in the queue.
    place: Place,
}

impl Child {
    fn new(parent: &str, name: &str, czxid: i64) -> Child {
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

    fn path(&self) -> &str {
        &self.path
    }

    fn parent(&self) -> &str {
        &self.path[..self.name_at - 1]
    }

    fn name(&self) -> &str {
        &self.path[self.name_at..]
    }
}

/// A call's failure: ZooKeeper's answer, or none in time.
#[derive(Debug)]
enum Failed {
    Refused(ZkError),
    Timeout(Duration),
}

impl From<Failed> for BackendError {
    fn from(failed: Failed) -> BackendError {
        match failed {
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
    fn client(&self) -> Client {
        self.session
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Runs one call within the response timeout.
    async fn call<T>(&self, call: impl Future<Output = Result<T, ZkError>>) -> Result<T, Failed> {
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(err)) => Err(Failed::Refused(err)),
            Err(_) => Err(Failed::Timeout(self.timeout)),
        }
    }

    /// The node of `key`'s queue.
    fn parent(&self, key: &str) -> String {
        let mut parent = String::with_capacity(self.root.len() + 1 + key.len());
        parent.push_str(&self.root);
        parent.push('/');
        encode_onto(&mut parent, key);
        parent
    }

    fn created(&self) -> std::sync::MutexGuard<'_, HashMap<LockToken, Option<Child>>> {
        self.created.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, LossSignal>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Our child for `token` under `parent` and whether it heads the
    /// queue; creates the child if we have none. `None` if ours was gone.
    async fn enqueue(
        self: &Arc<Self>,
        parent: &str,
        token: LockToken,
    ) -> Result<Option<(Child, bool)>, BackendError> {
        let known = self.created().get(&token).cloned();
        match known {
            Some(Some(child)) if child.place != Place::Unknown => {
                // Told by the waiter's watch: no round trip.
                let head = child.place == Place::Head;
                Ok(Some((child, head)))
            }
            Some(Some(child)) => {
                let queue = self.queue(parent).await?;
                if queue.iter().any(|name| name == child.name()) {
                    let first = queue.first().is_some_and(|name| name == child.name());
                    return Ok(Some((child, first)));
                }
                // Gone (expired at its ttl, deleted by an operator).
                self.created().remove(&token);
                Ok(None)
            }
            Some(None) => {
                // A create whose answer was lost: look for it by name.
                let queue = self.queue(parent).await?;
                let prefix = format!("{token}-");
                let Some(name) = queue.iter().find(|name| name.starts_with(&prefix)) else {
                    self.created().remove(&token);
                    return Box::pin(self.enqueue(parent, token)).await;
                };
                let path = format!("{parent}/{name}");
                let Some(stat) = self.call(self.client().check_stat(&path)).await? else {
                    self.created().remove(&token);
                    return Ok(None);
                };
                let child = Child::new(parent, name, stat.czxid);
                let first = queue.first() == Some(name);
                self.created().insert(token, Some(child.clone()));
                Ok(Some((child, first)))
            }
            None => {
                self.created().insert(token, None);
                let child = self.create(parent, token).await?;
                let created = match child {
                    Ok(pair) => pair,
                    Err(()) => {
                        // The key's node was missing: make it, once more.
                        self.make_parent(parent).await?;
                        self.create(parent, token)
                            .await?
                            .map_err(|()| format!("the node `{parent}` vanished twice"))?
                    }
                };
                self.created().insert(token, Some(created.0.clone()));
                Ok(Some(created))
            }
        }
    }

    /// Creates our child; returns it and whether it heads the queue, or
    /// `Err(())` when the key's node does not exist.
    ///
    /// One request, one transaction, and no read: the create and an empty
    /// `setData` on the key's node, whose returned stat is taken in the
    /// same transaction. Its child count says whether ours is the only
    /// child (every child already there has a lower sequence, so ours
    /// heads the queue exactly when it is alone), and its `mzxid` is the
    /// transaction's zxid, which is our child's czxid.
    ///
    /// A caller that stops waiting (a timeout while the ensemble is away, a
    /// cancelled attempt) leaves the outcome unknown: the child is then
    /// looked for and deleted once the queue can be read (see
    /// [`Shared::sweep`]), so no orphan blocks the queue for the rest of the
    /// session.
    async fn create(
        self: &Arc<Self>,
        parent: &str,
        token: LockToken,
    ) -> Result<Result<(Child, bool), ()>, BackendError> {
        let options = CreateMode::EphemeralSequential.with_acls(self.settings.acls());
        let hex = token.hex();
        let mut prefix = String::with_capacity(parent.len() + hex.len() + 2);
        prefix.push_str(parent);
        prefix.push('/');
        prefix.extend(hex.iter().map(|&digit| char::from(digit)));
        prefix.push('-');
        let client = self.client();
        let mut multi = client.new_multi_writer();
        multi
            .add_create(&prefix, &[], &options)
            .and_then(|()| multi.add_set_data(parent, &[], None))
            .map_err(|err| format!("ZooKeeper refused the lock node `{prefix}`: {err}"))?;
        let mut unknown = Unknown {
            shared: Some(self),
            parent,
            token,
        };
        let created = match tokio::time::timeout(self.timeout, multi.commit()).await {
            Ok(Ok(results)) => created(results).map_err(Failed::Refused),
            Ok(Err(
                MultiWriteError::OperationFailed { source, .. }
                | MultiWriteError::RequestFailed { source },
            )) => Err(Failed::Refused(source)),
            Err(_) => Err(Failed::Timeout(self.timeout)),
        };
        let settled = matches!(
            created,
            Ok(_)
                | Err(Failed::Refused(
                    ZkError::NoNode
                        | ZkError::NodeExists
                        | ZkError::NoAuth
                        | ZkError::InvalidAcl
                        | ZkError::BadArguments(_),
                ))
        );
        if settled {
            // Made, or refused for sure.
            unknown.shared = None;
        }
        drop(unknown);
        let (path, stat) = match created {
            Ok(answer) => answer,
            Err(Failed::Refused(ZkError::NoNode)) => return Ok(Err(())),
            Err(err) => return Err(err.into()),
        };
        let name = path.rsplit('/').next().unwrap_or_default();
        let child = Child::new(parent, name, stat.mzxid);
        Ok(Ok((child, stat.num_children == 1)))
    }

    /// Creates the key's node (a container: the ensemble removes it once
    /// it has no children left).
    async fn make_parent(&self, parent: &str) -> Result<(), BackendError> {
        let container = CreateMode::Container.with_acls(self.settings.acls());
        let client = self.client();
        let made = self.call(client.create(parent, &[], &container)).await;
        match made {
            Ok(_) | Err(Failed::Refused(ZkError::NodeExists)) => Ok(()),
            Err(err) => Err(err.into()),
        }
    }

    /// The key's children, sorted by sequence; empty if it has no node.
    async fn queue(&self, parent: &str) -> Result<Vec<String>, BackendError> {
        let client = self.client();
        match self.call(client.list_children(parent)).await {
            Ok(mut queue) => {
                sort(&mut queue);
                Ok(queue)
            }
            Err(Failed::Refused(ZkError::NoNode)) => Ok(Vec::new()),
            Err(err) => Err(err.into()),
        }
    }

    /// Deletes `path`, in one request with the deletions asked for
    /// meanwhile (see [`deletions`]); `Ok(false)` if it was gone.
    async fn delete(self: &Arc<Self>, path: &str) -> Result<bool, BackendError> {
        Ok(deletions::delete(self, path).await?)
    }

    /// Deletes our node at `path`, now or, if the ensemble does not answer,
    /// as soon as it does: a node left behind would hold its place in the
    /// queue (or the lock itself) for as long as the session lives, which
    /// outlasts a leader election or a lost connection. `Ok(false)` if it
    /// was gone. Retrying by path is safe: the name holds our token.
    async fn discard(self: &Arc<Self>, path: &str) -> Result<bool, BackendError> {
        let deleted = self.delete(path).await;
        if deleted.is_err() {
            self.discard_later(path.to_owned());
        }
        deleted
    }

    /// [`Shared::discard`] in the background, retrying until the ensemble
    /// answers.
    fn discard_later(self: &Arc<Self>, path: String) {
        self.retry(Duration::from_millis(50), move |store| {
            let path = path.clone();
            async move {
                let deleted = store.delete(&path).await;
                if let Err(err) = &deleted {
                    tracing::debug!(%path, %err, "lock node not deleted yet; retrying");
                }
                deleted.is_ok()
            }
        });
    }

    /// Runs `attempt` in the background, first after `pause`, then again
    /// after a pause that doubles up to 2 s, until it says it is done or the
    /// store is dropped. Bounded: a session outlives no ensemble outage
    /// forever, so the retries stop after some minutes. Also called from
    /// drops, perhaps outside the runtime: then it does nothing.
    fn retry<A, F>(self: &Arc<Self>, mut pause: Duration, mut attempt: A)
    where
        A: FnMut(Arc<Shared>) -> F + Send + 'static,
        F: Future<Output = bool> + Send,
    {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let shared = Arc::downgrade(self);
        runtime.spawn(async move {
            for _ in 0..300 {
                tokio::time::sleep(pause).await;
                let Some(store) = shared.upgrade() else {
                    return;
                };
                if attempt(store).await {
                    return;
                }
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        });
    }

    /// Drops our child for `token` (refused in skip mode, given up, or
    /// abandoned); `Ok(true)` if it was there.
    async fn withdraw(
        self: &Arc<Self>,
        parent: &str,
        token: LockToken,
    ) -> Result<bool, BackendError> {
        let known = self.created().remove(&token).flatten();
        let path = match known {
            Some(child) => child.path().to_owned(),
            None => {
                let prefix = format!("{token}-");
                let queue = match self.queue(parent).await {
                    Ok(queue) => queue,
                    Err(err) => {
                        // Our create may still be applied (the ensemble
                        // away, a reply lost): look again until we can.
                        self.sweep(parent, token);
                        return Err(err);
                    }
                };
                let Some(name) = queue.into_iter().find(|name| name.starts_with(&prefix)) else {
                    return Ok(false);
                };
                format!("{parent}/{name}")
            }
        };
        self.held().remove(path.as_str());
        self.discard(&path).await
    }

    /// Deletes `token`'s child under `parent` once the queue can be read
    /// again: a create whose outcome we could not learn. A listing answered
    /// after the create (one session answers in order) settles it; if the
    /// session ends first, the child went with it.
    fn sweep(self: &Arc<Self>, parent: &str, token: LockToken) {
        let parent = parent.to_owned();
        self.retry(Duration::from_millis(100), move |store| {
            let parent = parent.clone();
            async move {
                if store.created().contains_key(&token) {
                    return true; // asked for again: its attempt will find it
                }
                let Ok(queue) = store.queue(&parent).await else {
                    return false;
                };
                let prefix = format!("{token}-");
                if let Some(name) = queue.iter().find(|name| name.starts_with(&prefix)) {
                    let path = format!("{parent}/{name}");
                    tracing::debug!(%path, "deleting a lock node whose attempt was given up");
                    let _ = store.discard(&path).await;
                }
                true
            }
        });
    }
}

/// A create whose outcome is not known while this lives (its reply not in,
/// or lost): dropped so, it has the child looked for and deleted once the
/// queue can be read, unless the attempt asks for it again.
struct Unknown<'a> {
    shared: Option<&'a Arc<Shared>>,
    parent: &'a str,
    token: LockToken,
}

impl Drop for Unknown<'_> {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            shared.sweep(self.parent, self.token);
        }
    }
}

/// Our child's path and the key's node stat, from the results of the
/// create-and-touch transaction.
fn created(results: Vec<MultiWriteResult>) -> Result<(String, Stat), ZkError> {
    let mut path = None;
    let mut stat = None;
    for result in results {
        match result {
            MultiWriteResult::Create { path: made, .. } => path = Some(made),
            MultiWriteResult::SetData { stat: touched } => stat = Some(touched),
            _ => {}
        }
    }
    match (path, stat) {
        (Some(path), Some(stat)) => Ok((path, stat)),
        _ => Err(ZkError::UnexpectedError(
            "a lock node's transaction answered without its results".to_owned(),
        )),
    }
}

/// Sorts children by their sequence (the digits after the last `-`).
fn sort(queue: &mut [String]) {
    queue.sort_by_key(|name| sequence(name));
}

fn sequence(name: &str) -> i64 {
    name.rsplit('-')
        .next()
        .and_then(|digits| digits.parse().ok())
        .unwrap_or(i64::MAX)
}

/// [`encode_onto`] into a new string.
#[cfg(test)]
fn encode(key: &str) -> String {
    let mut name = String::new();
    encode_onto(&mut name, key);
    name
}

/// Appends `key` to `name` as one node name: every byte outside
/// `[A-Za-z0-9_.:-]`, and a leading `.`, as `%XX`; so `/`, `.`, `..` and
/// control characters cannot escape into another node.
fn encode_onto(name: &mut String, key: &str) {
    const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
    for (i, byte) in key.bytes().enumerate() {
        let plain = byte.is_ascii_alphanumeric()
            || matches!(byte, b'_' | b':' | b'-')
            || (byte == b'.' && i > 0);
        if plain {
            name.push(char::from(byte));
        } else {
            name.push('%');
            name.push(char::from(DIGITS[usize::from(byte >> 4)]));
            name.push(char::from(DIGITS[usize::from(byte & 0xf)]));
        }
    }
}

/// How long a child is held before it is watched: a deletion its holder
/// did not make is pushed within this; shorter holds are never watched.
const WATCH_AFTER: Duration = Duration::from_millis(100);

/// Tells the holder of `path` when someone else deletes it (an operator, a
/// forced release), once it has been held for [`WATCH_AFTER`]. Runs in the
/// lease's task, beside [`expire`].
async fn watch_held(shared: Weak<Shared>, path: Arc<str>) {
    tokio::time::sleep(WATCH_AFTER).await;
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
        Ok((Some(_), watcher)) => {
            let event = watcher.changed().await;
            event.event_type == zookeeper_client::EventType::NodeDeleted
        }
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
        loss.raise("its ZooKeeper node was deleted (a forced release, or by hand)");
    }
}

/// Tells every holder when the session ends (expired, closed, refused),
/// and opens a new one, until the store is dropped.
async fn watch_session(mut states: zookeeper_client::StateWatcher, shared: Weak<Shared>) {
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

/// A held child.
struct ZooKeeperLease {
    shared: Arc<Shared>,
    token: LockToken,
    child: Child,
    /// Until when the child stays without a renewal; the store deletes it
    /// then.
    deadline: Arc<Mutex<Instant>>,
    ttl: Duration,
    expiry: tokio::task::AbortHandle,
}

impl fmt::Debug for ZooKeeperLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZooKeeperLease")
            .field("node", &self.child.path())
            .finish_non_exhaustive()
    }
}

impl ZooKeeperLease {
    fn new(
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
    fn forget(&self) -> bool {
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
async fn expire(
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
    fn renew(&mut self) -> BoxFuture<'_, Result<bool, BackendError>> {
        Box::pin(async move {
            let sent_at = Instant::now();
            let path = self.child.path();
            let held = || self.shared.held().contains_key(path);
            if !held() {
                return Ok(false);
            }
            let stat = self
                .shared
                .call(self.shared.client().check_stat(path))
                .await?;
            let ours = stat.is_some_and(|stat| {
                stat.ephemeral_owner == self.shared.client().session_id().0
                    && stat.czxid == self.child.czxid
            });
            let ours = ours && held();
            if ours {
                *self.deadline.lock().unwrap_or_else(|e| e.into_inner()) = sent_at + self.ttl;
            }
            Ok(ours)
        })
    }

    fn release(&mut self, linger: Duration) -> BoxFuture<'_, Result<bool, BackendError>> {
        Box::pin(async move {
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

    fn hand_over(&mut self) -> BoxFuture<'_, Result<HandOver, BackendError>> {
        Box::pin(async { Err("the ZooKeeper store does not hand leases over".into()) })
    }
}

impl Store for ZooKeeperStore {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    fn acquire<'a>(
        &'a self,
        request: AcquireRequest<'a>,
    ) -> BoxFuture<'a, Result<Acquire, BackendError>> {
        Box::pin(async move {
            let sent_at = Instant::now();
            let shared = &self.shared;
            let parent = shared.parent(request.key);
            let mut found = shared.enqueue(&parent, request.token).await?;
            if found.is_none() {
                // Ours was gone: queue again.
                found = shared.enqueue(&parent, request.token).await?;
            }
            let Some((child, first)) = found else {
                return Err("our lock node vanished twice in a row".into());
            };
            if first {
                let fencing = u64::try_from(child.czxid).unwrap_or(0);
                shared
                    .held()
                    .insert(child.path.clone(), request.loss.clone());
                let lease =
                    ZooKeeperLease::new(shared.clone(), request.token, child, request.ttl, sent_at);
                return Ok(Acquire::Acquired {
                    fencing,
                    lease: Box::new(lease),
                });
            }
            if !request.waits {
                shared.withdraw(&parent, request.token).await?;
            }
            Ok(Acquire::Held { remaining: None })
        })
    }

    fn abandon<'a>(
        &'a self,
        key: &'a str,
        token: LockToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let parent = self.shared.parent(key);
            // Granted to an attempt nobody heard: its child is held.
            let known = self.shared.created().get(&token).cloned().flatten();
            let holds = known.is_some_and(|child| self.shared.held().contains_key(child.path()));
            // First, even while the ensemble is away: a create still in
            // flight is then deleted when it lands.
            let withdrew = self.shared.withdraw(&parent, token).await?;
            Ok(holds && withdrew)
        })
    }

    fn watch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<ReleaseWatch, BackendError>> {
        Box::pin(async move {
            let parent = self.shared.parent(key);
            let (tx, rx) = watch::channel(());
            let (placed, first) = tokio::sync::oneshot::channel();
            let task = tokio::spawn(follow(
                Arc::downgrade(&self.shared),
                parent.clone(),
                tx,
                placed,
            ));
            // The first placement (a listing and the watch on the child
            // ahead), so the attempt that follows needs no round trip.
            let _ = tokio::time::timeout(self.shared.timeout, first).await;
            // Our queued child, if the caller leaves it waiting: dropped
            // with the watch, it leaves the queue unless it got the lock.
            let leave = LeaveQueue {
                shared: Arc::downgrade(&self.shared),
                parent,
                task: task.abort_handle(),
            };
            Ok(ReleaseWatch::new(rx, Some(Box::new(leave))))
        })
    }

    fn force_release<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let parent = self.shared.parent(key);
            let queue = self.shared.queue(&parent).await?;
            let Some(holder) = queue.first() else {
                return Ok(false);
            };
            self.shared.delete(&format!("{parent}/{holder}")).await
        })
    }

    /// The head of the key's queue: its name starts with the holder's
    /// token, its czxid is the fencing token. The remaining time is not
    /// known outside the holder (the lock lasts while its session does and
    /// its holder renews it).
    fn inspect<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<LeaseInfo>, BackendError>> {
        Box::pin(async move {
            let parent = self.shared.parent(key);
            // The head may leave between the listing and its stat: look again.
            for _ in 0..3 {
                let queue = self.shared.queue(&parent).await?;
                let Some(head) = queue.first() else {
                    return Ok(None);
                };
                let path = format!("{parent}/{head}");
                let stat = self
                    .shared
                    .call(self.shared.client().check_stat(&path))
                    .await?;
                if let Some(stat) = stat {
                    let token = head
                        .split_once('-')
                        .and_then(|(token, _)| token.parse().ok());
                    let fencing = stat.czxid.max(0).unsigned_abs();
                    return Ok(Some(LeaseInfo::new(token, fencing, None)));
                }
            }
            Err("ZooKeeper: the head of the lock's queue kept changing while it was read".into())
        })
    }
}

/// Ends a watch: stops its task, and takes our waiting children (not the
/// held ones) out of the key's queue.
struct LeaveQueue {
    shared: Weak<Shared>,
    parent: String,
    task: tokio::task::AbortHandle,
}

impl Drop for LeaveQueue {
    fn drop(&mut self) {
        self.task.abort();
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let waiting: Vec<(LockToken, String)> = {
            let held = shared.held();
            shared
                .created()
                .iter()
                .filter_map(|(token, child)| {
                    let child = child.as_ref()?;
                    (child.parent() == self.parent && !held.contains_key(child.path()))
                        .then(|| (*token, child.path().to_owned()))
                })
                .collect()
        };
        if waiting.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            for (token, path) in waiting {
                shared.created().remove(&token);
                let _ = shared.discard(&path).await;
            }
        });
    }
}

/// Reports the releases a waiter on `parent` cares about: the deletion of
/// the child just before ours (or, with no child of ours, of the holder's),
/// and keeps our child's [`Place`] up to date. `placed` is told once the
/// first placement is made.
async fn follow(
    shared: Weak<Shared>,
    parent: String,
    tx: watch::Sender<()>,
    placed: tokio::sync::oneshot::Sender<()>,
) {
    let mut placed = Some(placed);
    // Sets the place of our child named `name`.
    let place = |shared: &Weak<Shared>, name: Option<&String>, place: Place| {
        let (Some(name), Some(store)) = (name, shared.upgrade()) else {
            return;
        };
        for child in store.created().values_mut().flatten() {
            if child.parent() == parent && child.name() == name {
                child.place = place;
            }
        }
    };
    loop {
        let Some(store) = shared.upgrade() else {
            return;
        };
        let ours: Vec<String> = store
            .created()
            .values()
            .filter_map(|child| child.as_ref())
            .filter(|child| child.parent() == parent)
            .map(|child| child.name().to_owned())
            .collect();
        let queue = match store.queue(&parent).await {
            Ok(queue) => queue,
            Err(_) => {
                drop(store);
                placed.take().map(|placed| placed.send(()));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let mine = queue.iter().position(|name| ours.contains(name));
        let name = mine.map(|at| &queue[at]);
        let target = match mine {
            Some(0) => None,
            Some(at) => queue.get(at - 1).cloned(),
            None => queue.first().cloned(),
        };
        let Some(target) = target else {
            // Nothing ahead of us: look again.
            place(&shared, name, Place::Head);
            placed.take().map(|placed| placed.send(()));
            tx.send_replace(());
            drop(store);
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let path = format!("{parent}/{target}");
        let client = store.client();
        let watched = store.call(client.check_and_watch_stat(&path)).await;
        drop(store);
        // Ours is second: once the head is deleted, ours heads the queue.
        let after = if mine == Some(1) {
            Place::Head
        } else {
            Place::Unknown
        };
        match watched {
            Ok((None, _)) => {
                place(&shared, name, after);
                placed.take().map(|placed| placed.send(()));
                tx.send_replace(());
            }
            Ok((Some(_), watcher)) => {
                place(&shared, name, Place::Behind);
                placed.take().map(|placed| placed.send(()));
                let event = watcher.changed().await;
                let deleted = event.event_type == zookeeper_client::EventType::NodeDeleted;
                place(&shared, name, if deleted { after } else { Place::Unknown });
                tx.send_replace(());
            }
            Err(_) => {
                place(&shared, name, Place::Unknown);
                placed.take().map(|placed| placed.send(()));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_become_one_node_name_each() {
        assert_eq!(encode("stock:7"), "stock:7");
        assert_eq!(encode("a/b"), "a%2Fb");
        assert_eq!(encode(".."), "%2E.");
        assert_eq!(encode("."), "%2E");
        assert_eq!(encode("x y%"), "x%20y%25");
        assert_eq!(encode("é"), "%C3%A9");
    }

    #[test]
    fn children_sort_by_sequence() {
        let mut queue = vec![
            "b-0000000010".to_owned(),
            "a-0000000002".to_owned(),
            "c-0000000009".to_owned(),
        ];
        sort(&mut queue);
        assert_eq!(queue, ["a-0000000002", "c-0000000009", "b-0000000010"]);
    }
}
