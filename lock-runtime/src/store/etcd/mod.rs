//! etcd: leases and revision fencing, for locks that must stay correct when
//! a server dies (Raft-replicated, linearizable).
//!
//! # How a lock is kept
//!
//! A lock is a queue of entries under the key's own range (the store's
//! prefix, default `locks/`, the key with `%` and NUL escaped, then a NUL):
//! each contender's entry holds its token, is attached to an etcd lease of
//! the lock's ttl and is named by that lease (see `entry_for`). The entry
//! created first holds the lock; the others wait in creation order, across
//! processes.
//! This is etcd's own recipe (`client/v3/concurrency`). A crashed holder or
//! waiter stops renewing; etcd expires its lease and deletes its entry.
//!
//! - **Acquire** is one transaction: `If` the key's range is empty `Then
//!   Put(entry)`. Else, in skip mode, `Get(first entry)`: a skipping caller
//!   never queues nor takes the lock from a queued waiter; in wait mode,
//!   `Put(entry), Get(entry), Get(first entry)`: ours heads the queue or
//!   waits in it. A waiter that asks again with the entry it has sends,
//!   as that `Else`, a nested `If` its entry does not exist `Then
//!   Put(entry), Get(first entry) Else Get(entry), Get(first entry)`, so
//!   an entry that is there is never written again. (A first attempt's
//!   entry is named by a lease nobody else uses, so it cannot be there;
//!   the flat form spares etcd the nested transaction.) The fencing
//!   token is our entry's create revision: cluster-wide, and strictly
//!   increasing from holder to holder (an entry created later is always
//!   served later), kept by every member while a quorum lives.
//! - **Hand-off takes no round trip**: a waiter lists the queue and follows
//!   the deletions after the listing on its key's shared watch (see
//!   `queues.rs`), and knows it holds the lock as soon as the last entry
//!   ahead of it is deleted; the runtime's next attempt is answered from
//!   that. A waiter keeps its
//!   entry's lease alive as it asks again (every quarter of the cluster's
//!   shortest lease), and gives its entry up when it stops waiting.
//! - **Leases are prepared ahead** so the common path is that one round
//!   trip: a released lock's lease, still fresh, waits in a small pool per
//!   ttl for the next acquire with the same ttl, and only the first acquire
//!   of a ttl (or one after a long hold) grants a new lease first. Such a
//!   lease is counted from when it was last granted or renewed, not from the
//!   acquire ([`Lease::started_at`]), so the runtime never believes in more
//!   of it than etcd does.
//! - **Losses are pushed**: an entry held for a moment is watched for a
//!   deletion its holder did not make (a revoked or expired lease, a deleted
//!   entry), which cancels the body at once (see `held.rs`).
//! - **Renew** sends a keep-alive for the lease and checks, in the same round
//!   trip, that the entry still holds our token: a revoked lease, an expired
//!   one or an entry deleted under the holder is a lost lock, and the body
//!   is cancelled.
//! - **Release** deletes the entry if it holds our token. `hold_at_least`
//!   moves the entry to a new lease of what is left instead (an entry keeps
//!   its place in the queue when it is written again).
//! - **A hand-over** within a process replaces the holder's entry by a new
//!   one in one transaction, only while nobody queues behind it: then the
//!   process's next task takes its turn behind the other processes'.
//!
//! # Ttls
//!
//! etcd counts leases in whole seconds and raises a ttl below its minimum
//! (1.5 election timeouts: 2 s at default settings) to it. The store asks
//! the cluster its minimum when it connects, declares whole seconds from
//! that minimum in its [`Capabilities`], and refuses other ttls with
//! `InvalidOptions`: a lock never believes in a shorter or longer lease
//! than etcd's. A `hold_at_least` is rounded up to whole seconds.
//!
//! # TLS
//!
//! With the `etcd-tls` feature, [`EtcdStoreBuilder::tls_ca`] turns TLS on
//! (rustls, through the etcd client), [`EtcdStoreBuilder::tls_identity`]
//! presents a client certificate and [`EtcdStoreBuilder::tls_domain`]
//! names the certificates' host when it is not the endpoints'.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, KeyValue, KvClient, LeaseClient,
    PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse, TxnResponse, WatchClient,
};
use tokio::sync::{broadcast, watch};
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::{
    Acquire, AcquireRequest, BoxFuture, Capabilities, FencingPromise, HandOver, Lease, LeaseInfo,
    LockToken, LossSignal, ReleaseWatch, SafetyMargin, Store,
};

use crate::error::BackendError;
use crate::store::support::queue::Place;

mod held;
mod queues;

use held::HeldKeys;
use queues::{Deletion, WatchedQueues};

/// The most unused leases kept per ttl.
const MAX_SPARES: usize = 256;

/// How long a watch that broke waits before it resumes.
const WATCH_RETRY: Duration = Duration::from_millis(100);

/// How long a call no member could take waits before it is sent again.
const RETRY: Duration = Duration::from_millis(10);

/// Configures and connects an [`EtcdStore`].
pub struct EtcdStoreBuilder {
    endpoints: Vec<String>,
    prefix: String,
    user: Option<(String, String)>,
    response_timeout: Duration,
    connection_timeout: Duration,
    #[cfg(feature = "etcd-tls")]
    tls: Option<Tls>,
}

/// The TLS settings of [`EtcdStoreBuilder::tls_ca`] and its siblings.
#[cfg(feature = "etcd-tls")]
#[derive(Default)]
struct Tls {
    options: etcd_client::TlsOptions,
    has_ca: bool,
    has_identity: bool,
}

impl EtcdStoreBuilder {
    /// The prefix of every lock's key in etcd (default `locks/`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Authenticates as `name` (etcd's user/password authentication).
    pub fn user(mut self, name: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((name.into(), password.into()));
        self
    }

    /// How long one call may take before it fails (default 2 s).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How long connecting to an endpoint may take (default 2 s).
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// Connects over TLS, and trusts the members' certificates if the CA
    /// certificate in `ca_pem` (PEM; call again for several) signed them.
    /// Endpoints are then `https://host:port` (or `host:port`). Feature
    /// `etcd-tls` (rustls, through the etcd client).
    #[cfg(feature = "etcd-tls")]
    pub fn tls_ca(mut self, ca_pem: impl AsRef<[u8]>) -> Self {
        let tls = self.tls.get_or_insert_with(Tls::default);
        let ca = etcd_client::Certificate::from_pem(ca_pem);
        tls.options = std::mem::take(&mut tls.options).ca_certificate(ca);
        tls.has_ca = true;
        self
    }

    /// Presents this client certificate and its private key (PEM) to
    /// members started with `--client-cert-auth`. Needs [`tls_ca`](Self::tls_ca).
    #[cfg(feature = "etcd-tls")]
    pub fn tls_identity(mut self, cert_pem: impl AsRef<[u8]>, key_pem: impl AsRef<[u8]>) -> Self {
        let tls = self.tls.get_or_insert_with(Tls::default);
        let identity = etcd_client::Identity::from_pem(cert_pem, key_pem);
        tls.options = std::mem::take(&mut tls.options).identity(identity);
        tls.has_identity = true;
        self
    }

    /// The name the members' certificates must carry, when it is not the
    /// endpoints' host. Needs [`tls_ca`](Self::tls_ca).
    #[cfg(feature = "etcd-tls")]
    pub fn tls_domain(mut self, name: impl Into<String>) -> Self {
        let tls = self.tls.get_or_insert_with(Tls::default);
        tls.options = std::mem::take(&mut tls.options).domain_name(name);
        self
    }

    /// The endpoints' schemes against the TLS settings: a plain endpoint
    /// with TLS on, or an `https` one with it off, is a clear error rather
    /// than a handshake that fails later.
    fn check_schemes(&self) -> Result<(), BackendError> {
        #[cfg(feature = "etcd-tls")]
        let tls = match &self.tls {
            Some(tls) if !tls.has_ca => {
                return Err("etcd TLS needs the members' CA certificate: call `tls_ca`".into());
            }
            tls => tls.is_some(),
        };
        #[cfg(not(feature = "etcd-tls"))]
        let tls = false;
        for endpoint in &self.endpoints {
            if tls && endpoint.starts_with("http://") {
                return Err(format!(
                    "etcd endpoint {endpoint} is plain http, but TLS is configured: use https://"
                )
                .into());
            }
            if !tls && endpoint.starts_with("https://") {
                return Err(format!(
                    "etcd endpoint {endpoint} is https: give the members' CA certificate \
                     with `EtcdStoreBuilder::tls_ca` (feature `etcd-tls`)"
                )
                .into());
            }
        }
        Ok(())
    }

    /// Connects, and asks the cluster the shortest lease it grants.
    ///
    /// # Errors
    ///
    /// No endpoint given or none answers, refused credentials. Never
    /// contains the password.
    pub async fn connect(self) -> Result<EtcdStore, BackendError> {
        let shown = self.endpoints.join(",");
        if self.endpoints.is_empty() {
            return Err("no etcd endpoint given".into());
        }
        self.check_schemes()?;
        let mut options = ConnectOptions::new()
            .with_connect_timeout(self.connection_timeout)
            // Without a leader (quorum lost) calls fail at once instead of
            // waiting for one.
            .with_require_leader(true);
        if let Some((name, password)) = &self.user {
            options = options.with_user(name.as_str(), password.as_str());
        }
        let hint = self.missing_identity_hint();
        #[cfg(feature = "etcd-tls")]
        if let Some(tls) = self.tls {
            options = options.with_tls(tls.options);
        }
        let connect = Client::connect(&self.endpoints, Some(options));
        let client = within(self.response_timeout + self.connection_timeout, connect)
            .await
            .map_err(|err| format!("cannot connect to etcd at {shown}: {err}"))?;
        let store = Inner {
            kv: client.kv_client(),
            leases: client.lease_client(),
            watches: client.watch_client(),
            shared: Arc::new(Shared {
                spares: Mutex::default(),
                held: Arc::default(),
                queued: Mutex::default(),
                queues: Arc::default(),
            }),
            prefix: self.prefix,
            timeout: self.response_timeout,
            shown,
        };
        // The first call: with a lazy connection, a refused handshake or
        // an unreachable cluster shows here.
        let mut store = EtcdStore {
            inner: Arc::new(store),
            capabilities: capabilities(Duration::from_secs(1)),
        };
        let min_ttl = store.min_ttl().await.map_err(|err| {
            format!(
                "cannot connect to etcd at {}: {err}{hint}",
                store.inner.shown
            )
        })?;
        store.capabilities = capabilities(min_ttl);
        Ok(store)
    }
}

impl EtcdStoreBuilder {
    fn tls_on(&self) -> bool {
        #[cfg(feature = "etcd-tls")]
        return self.tls.is_some();
        #[cfg(not(feature = "etcd-tls"))]
        false
    }

    /// For a failed connection over TLS without a client certificate: a
    /// member that wants one ends the handshake with a bare "cancelled" or
    /// "transport error", so say what may be missing.
    fn missing_identity_hint(&self) -> &'static str {
        #[cfg(feature = "etcd-tls")]
        if self.tls.as_ref().is_some_and(|tls| !tls.has_identity) {
            return " (if the members ask for a client certificate, give one with `tls_identity`)";
        }
        ""
    }
}

impl fmt::Debug for EtcdStoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStoreBuilder")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("user", &self.user.as_ref().map(|(name, _)| name))
            .field("tls", &self.tls_on())
            .finish_non_exhaustive()
    }
}

/// What the etcd store can do, given the cluster's shortest lease.
fn capabilities(min_ttl: Duration) -> Capabilities {
    Capabilities::new("etcd")
        .with_ttl(min_ttl, Duration::from_secs(1))
        .with_features(true, true, true, true)
        // A waiter's entry lives on its lease, kept alive as it asks again.
        .with_waiter_queue(min_ttl.checked_div(4).unwrap_or_default())
        // The leader expires leases by its clock, counted from when it
        // received the grant or keep-alive (after we sent it); a new leader
        // extends every lease. Left: clock rate and timer slack.
        .with_margin(SafetyMargin::new(Duration::from_millis(10), 2_000))
        .with_fencing(FencingPromise::new(true, true, true))
}

/// The etcd store. Cheap to clone; clones share the connection and the
/// pool of prepared leases.
///
/// # Examples
///
/// ```no_run
/// use lock_runtime::{LockError, LockOptions, LockRegistry};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// let registry = LockRegistry::etcd(&["http://10.0.0.7:2379", "http://10.0.0.8:2379"]).await?;
/// let options = LockOptions::default().ttl(Duration::from_secs(10));
/// let guard = registry.lock("stock:7", options).await?;
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct EtcdStore {
    /// One allocation for every clone: a held lock keeps a clone, and
    /// cloning the clients themselves allocates.
    inner: Arc<Inner>,
    capabilities: Capabilities,
}

/// An [`EtcdStore`]'s clients and settings.
struct Inner {
    kv: KvClient,
    leases: LeaseClient,
    watches: WatchClient,
    shared: Arc<Shared>,
    prefix: String,
    timeout: Duration,
    shown: String,
}

/// What clones of one store share.
struct Shared {
    /// Unused leases by ttl in seconds, each with the key it was last used
    /// for ([`used_for`]).
    spares: Mutex<HashMap<i64, Vec<(Spare, u64)>>>,
    /// The keys held, watched so their loss is pushed to the holder.
    held: Arc<HeldKeys>,
    /// Our waiting entries, by token.
    queued: Mutex<HashMap<LockToken, Queued>>,
    /// The watches of the keys our waiters wait on.
    queues: Arc<WatchedQueues>,
}

/// A waiter's entry in a key's queue.
#[derive(Clone, Debug)]
struct Queued {
    /// The start of the key's range.
    queue: Vec<u8>,
    /// Our entry in it.
    entry: Vec<u8>,
    /// The entry's create revision: its place, and the fencing token once
    /// it holds the lock.
    created: i64,
    /// The lease the entry is attached to.
    lease: Spare,
    secs: i64,
    place: Place,
}

/// A lease nobody's key is attached to, and since when etcd counts it.
#[derive(Clone, Copy, Debug)]
struct Spare {
    id: i64,
    fresh_at: Instant,
}

impl Shared {
    /// An unused lease of `secs` granted or renewed less than a quarter of
    /// its ttl ago: a lock on it has at least three quarters of its ttl
    /// left, and the runtime renews it early.
    ///
    /// One last used for `queue` first: its entry then takes the name it
    /// had, so a key's range keeps few names (see [`entry_for`]).
    fn take(&self, secs: i64, queue: &[u8]) -> Option<Spare> {
        let mut spares = self.spares.lock().unwrap_or_else(|e| e.into_inner());
        let list = spares.get_mut(&secs)?;
        let fresh = Duration::from_secs(secs.unsigned_abs()) / 4;
        let last = used_for(queue);
        if let Some(at) = list.iter().rposition(|(_, used)| *used == last) {
            let (spare, _) = list.remove(at);
            if spare.fresh_at.elapsed() < fresh {
                return Some(spare);
            }
        }
        while let Some((spare, _)) = list.pop() {
            if spare.fresh_at.elapsed() < fresh {
                return Some(spare);
            }
            // Older ones are older still: let them all expire in etcd.
            list.clear();
        }
        None
    }

    fn queued(&self) -> std::sync::MutexGuard<'_, HashMap<LockToken, Queued>> {
        self.queued.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the place of our entries in `queue`: `place` for the one
    /// created at `created`, [`Place::Unknown`] for the others.
    fn place(&self, queue: &[u8], created: i64, place: Place) {
        for entry in self.queued().values_mut() {
            if entry.queue == queue {
                entry.place = if entry.created == created {
                    place
                } else {
                    Place::Unknown
                };
            }
        }
    }

    /// Keeps `spare`, last used for `queue`, for the next acquire of `secs`.
    fn give_back(&self, secs: i64, spare: Spare, queue: &[u8]) {
        let fresh = Duration::from_secs(secs.unsigned_abs()) / 4;
        if spare.fresh_at.elapsed() >= fresh {
            return;
        }
        let mut spares = self.spares.lock().unwrap_or_else(|e| e.into_inner());
        let list = spares.entry(secs).or_default();
        if list.len() < MAX_SPARES {
            list.push((spare, used_for(queue)));
        }
    }
}

impl EtcdStore {
    /// Starts configuring a store for the cluster at `endpoints`.
    pub fn builder(endpoints: &[&str]) -> EtcdStoreBuilder {
        EtcdStoreBuilder {
            endpoints: endpoints.iter().map(|e| (*e).to_owned()).collect(),
            prefix: "locks/".to_owned(),
            user: None,
            response_timeout: Duration::from_secs(2),
            connection_timeout: Duration::from_secs(2),
            #[cfg(feature = "etcd-tls")]
            tls: None,
        }
    }

    /// The shortest lease the cluster grants: ask for 1 s, see what it gave.
    async fn min_ttl(&self) -> Result<Duration, BackendError> {
        let granted = self
            .lease_call(|mut c| async move { c.grant(1, None).await })
            .await?;
        let id = granted.id();
        let _ = self
            .lease_call(|mut c| async move { c.revoke(id).await })
            .await;
        Ok(Duration::from_secs(granted.ttl().max(1).unsigned_abs()))
    }

    fn queue_of(&self, key: &str) -> Vec<u8> {
        queue_start(&self.inner.prefix, key)
    }

    /// Runs `txn` (see [`timed`](Self::timed)).
    async fn txn(&self, txn: &Txn) -> Result<TxnResponse, BackendError> {
        self.txn_built(|| txn.clone()).await
    }

    /// Runs the transaction `build` makes, made again only for a retry
    /// (the client takes it by value).
    async fn txn_built(&self, build: impl Fn() -> Txn) -> Result<TxnResponse, BackendError> {
        self.timed(|| {
            let (mut kv, txn) = (self.inner.kv.clone(), build());
            async move { kv.txn(txn).await }
        })
        .await
    }

    /// Runs a call on the lease service (see [`timed`](Self::timed)).
    async fn lease_call<T, F, Fut>(&self, call: F) -> Result<T, BackendError>
    where
        F: Fn(LeaseClient) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.timed(|| call(self.inner.leases.clone())).await
    }

    /// Runs one call within the response timeout, again while no member
    /// can take it (an endpoint that just died, an election, a connection
    /// that broke under the call): each of the
    /// store's calls may run twice (an acquire by the same token gets the
    /// same answer, a release or a renewal is owner-checked).
    async fn timed<T, F, Fut>(&self, mut call: F) -> Result<T, BackendError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = Instant::now() + self.inner.timeout;
        let mut refused = None;
        loop {
            match tokio::time::timeout_at(deadline, call()).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(err)) if undelivered(&err) && Instant::now() + RETRY < deadline => {
                    tracing::debug!(%err, "etcd: the call may not have arrived; again");
                    refused = Some(etcd_error(err));
                    tokio::time::sleep(RETRY).await;
                }
                Ok(Err(err)) => return Err(etcd_error(err)),
                Err(_) => {
                    let timeout = self.inner.timeout;
                    return Err(match refused {
                        Some(last) => format!("no answer from etcd within {timeout:?} ({last})"),
                        None => format!("no answer from etcd within {timeout:?}"),
                    }
                    .into());
                }
            }
        }
    }

    /// A new lease of `secs`, counted from before its request was sent.
    async fn grant(&self, secs: i64) -> Result<Spare, BackendError> {
        let fresh_at = Instant::now();
        let granted = self
            .lease_call(|mut c| async move { c.grant(secs, None).await })
            .await?;
        if granted.ttl() != secs {
            // Only if the cluster's minimum rose since we connected.
            let id = granted.id();
            let _ = self
                .lease_call(|mut c| async move { c.revoke(id).await })
                .await;
            return Err(format!(
                "etcd granted a {}s lease for a {secs}s ttl (its minimum changed?)",
                granted.ttl()
            )
            .into());
        }
        Ok(Spare {
            id: granted.id(),
            fresh_at,
        })
    }

    /// The holder's remaining time, rounded up to whole seconds as etcd
    /// rounds it down.
    async fn remaining(&self, lease: i64) -> Result<Option<Duration>, BackendError> {
        if lease == 0 {
            return Ok(None);
        }
        let left = self
            .lease_call(|mut c| async move { c.time_to_live(lease, None).await })
            .await?;
        Ok(Some(Duration::from_secs(
            (left.ttl() + 1).max(0).unsigned_abs(),
        )))
    }

    /// The lease of `token`'s entry, which holds the lock; its deletion by
    /// anyone else raises `loss`. Counted from `entry.lease.fresh_at` if
    /// `counted_from_grant`.
    fn granted(
        &self,
        entry: Queued,
        token: LockToken,
        counted_from_grant: bool,
        loss: &LossSignal,
    ) -> EtcdLease {
        let key = entry.entry;
        let opener = self.inner.prefix.as_bytes();
        let watch =
            self.inner
                .shared
                .held
                .hold(&self.inner.watches, opener, &key, entry.created, loss);
        EtcdLease {
            store: self.clone(),
            queue: entry.queue,
            key,
            token,
            secs: entry.secs,
            lease: entry.lease,
            created: entry.created,
            watch,
            loss: loss.clone(),
            counted_from_grant,
        }
    }

    /// The keys in `queue` with their create revisions, and the revision
    /// they were read at.
    async fn list(&self, queue: &[u8]) -> Result<(Vec<(Vec<u8>, i64)>, i64), BackendError> {
        let options = GetOptions::new()
            .with_range(queue_end(queue))
            .with_keys_only();
        let got = self.get(queue, options).await?;
        let at = got.header().map_or(0, |header| header.revision());
        let entries = got
            .kvs()
            .iter()
            .map(|kv| (kv.key().to_vec(), kv.create_revision()))
            .collect();
        Ok((entries, at))
    }

    /// The entries in `queue` that hold `token`.
    async fn entries_of(
        &self,
        queue: &[u8],
        token: LockToken,
    ) -> Result<Vec<Vec<u8>>, BackendError> {
        let got = self
            .get(queue, GetOptions::new().with_range(queue_end(queue)))
            .await?;
        let value = token.to_string();
        Ok(got
            .kvs()
            .iter()
            .filter(|kv| kv.value() == value.as_bytes())
            .map(|kv| kv.key().to_vec())
            .collect())
    }

    /// The first entry of `queue`: the holder's.
    async fn first(&self, queue: &[u8]) -> Result<Option<KeyValue>, BackendError> {
        let got = self.get(queue, first_of(queue)).await?;
        Ok(got.kvs().first().cloned())
    }

    /// Reads from `key` with `options` (see [`timed`](Self::timed)).
    async fn get(
        &self,
        key: &[u8],
        options: GetOptions,
    ) -> Result<etcd_client::GetResponse, BackendError> {
        self.timed(|| {
            let (mut kv, options) = (self.inner.kv.clone(), options.clone());
            async move { kv.get(key.to_vec(), Some(options)).await }
        })
        .await
    }

    /// Keeps `token`'s waiting entry alive if its lease was last renewed
    /// an eighth of the cluster's shortest lease ago or longer; `false` if
    /// the lease (and with it the entry) is gone.
    async fn keep_queued(
        &self,
        token: LockToken,
        entry: &mut Queued,
    ) -> Result<bool, BackendError> {
        let poll = self.capabilities.waiter_queue.unwrap_or_default();
        if entry.lease.fresh_at.elapsed() < poll / 2 {
            return Ok(true);
        }
        let sent_at = Instant::now();
        let id = entry.lease.id;
        match self
            .lease_call(|mut c| async move { c.keep_alive(id).await })
            .await
        {
            Ok(_) => {
                entry.lease.fresh_at = sent_at;
                if let Some(known) = self.inner.shared.queued().get_mut(&token) {
                    known.lease.fresh_at = sent_at;
                }
                Ok(true)
            }
            Err(err) if lease_gone(&err) => {
                self.inner.shared.queued().remove(&token);
                Ok(false)
            }
            Err(err) => Err(err),
        }
    }
}

/// The start of `key`'s range: `prefix`, the key with `%` and NUL escaped
/// (so no key's range holds another key's entries), and a NUL.
fn queue_start(prefix: &str, key: &str) -> Vec<u8> {
    let mut start = Vec::with_capacity(prefix.len() + key.len() + 1);
    start.extend_from_slice(prefix.as_bytes());
    for byte in key.bytes() {
        match byte {
            0 => start.extend_from_slice(b"%00"),
            b'%' => start.extend_from_slice(b"%25"),
            byte => start.push(byte),
        }
    }
    start.push(0);
    start
}

/// Which key a spare lease was last used for, as the pool notes it.
fn used_for(queue: &[u8]) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(queue)
}

/// The end of the range that starts at `queue` (exclusive).
fn queue_end(queue: &[u8]) -> Vec<u8> {
    let mut end = queue.to_vec();
    if let Some(last) = end.last_mut() {
        *last = 1;
    }
    end
}

/// The entry in `queue` of a lock on lease `lease`: named by the lease and
/// a digit that a hand-over flips, so that locks on a recycled lease reuse
/// the same two names. etcd keeps a deleted key in its index until the
/// history is compacted, and reads of a range visit every key it kept:
/// a fresh name per lock would slow each lock on a busy key down until
/// then.
fn entry_for(queue: &[u8], lease: i64, second: bool) -> Vec<u8> {
    let mut entry = queue.to_vec();
    entry.extend_from_slice(format!("{lease:016x}").as_bytes());
    entry.push(if second { b'1' } else { b'0' });
    entry
}

/// The other name of `entry`'s lease (see [`entry_for`]).
fn flipped(entry: &[u8]) -> Vec<u8> {
    let mut next = entry.to_vec();
    if let Some(last) = next.last_mut() {
        *last = if *last == b'0' { b'1' } else { b'0' };
    }
    next
}

/// Reads the entry of `queue` created first.
fn first_of(queue: &[u8]) -> GetOptions {
    GetOptions::new()
        .with_range(queue_end(queue))
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

/// Runs `call` within `timeout`; errors and timeouts as backend errors.
async fn within<T>(
    timeout: Duration,
    call: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, BackendError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(err)) => Err(etcd_error(err)),
        Err(_) => Err(format!("no answer from etcd within {timeout:?}").into()),
    }
}

fn etcd_error(err: etcd_client::Error) -> BackendError {
    match err {
        etcd_client::Error::GRpcStatus(status) => format!(
            "etcd call failed: {} ({:?})",
            status.message(),
            status.code()
        )
        .into(),
        other => format!("etcd: {other}").into(),
    }
}

/// A call that may not have reached a member that could serve it: gRPC's
/// `UNAVAILABLE` (no member, no leader), or a connection that broke under
/// it (reset by a member's restart or a proxy: "transport error", or
/// `CANCELLED`, which the channel reports for a call queued on a
/// connection that closed; this client cancels none of its own calls).
fn undelivered(err: &etcd_client::Error) -> bool {
    const CANCELLED: i32 = 1;
    const UNKNOWN: i32 = 2;
    const UNAVAILABLE: i32 = 14;
    match err {
        etcd_client::Error::GRpcStatus(status) => match i32::from(status.code()) {
            CANCELLED | UNAVAILABLE => true,
            UNKNOWN => status.message().starts_with("transport error"),
            _ => false,
        },
        etcd_client::Error::TransportError(_) => true,
        _ => false,
    }
}

/// Whether `err` says a lease does not exist (expired or revoked).
fn lease_gone(err: &BackendError) -> bool {
    err.to_string().contains("lease not found")
}

/// `If value(key) == token`.
fn owned(key: &[u8], token: &str) -> Compare {
    Compare::value(key, CompareOp::Equal, token)
}

/// What each `Get` of a transaction read, in order (`None`: nothing).
fn gets(answer: &TxnResponse) -> Vec<Option<KeyValue>> {
    answer
        .op_responses()
        .into_iter()
        .filter_map(|op| match op {
            TxnOpResponse::Get(get) => Some(get.kvs().first().cloned()),
            _ => None,
        })
        .collect()
}

fn revision(answer: &TxnResponse) -> u64 {
    answer
        .header()
        .map_or(0, |header| header.revision().max(0).unsigned_abs())
}

fn whole_seconds(duration: Duration) -> i64 {
    let secs = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    i64::try_from(secs).unwrap_or(i64::MAX)
}

/// One held entry and the lease it is attached to.
struct EtcdLease {
    store: EtcdStore,
    /// The start of the key's range.
    queue: Vec<u8>,
    /// Our entry.
    key: Vec<u8>,
    token: LockToken,
    secs: i64,
    lease: Spare,
    /// The entry's create revision: the fencing token.
    created: i64,
    /// The watch that pushes the entry's loss ([`HeldKeys`]).
    watch: i64,
    loss: LossSignal,
    /// Whether the lease was granted or renewed before the acquire was sent.
    counted_from_grant: bool,
}

impl Drop for EtcdLease {
    fn drop(&mut self) {
        self.store.inner.shared.held.forget(self.watch);
    }
}

impl EtcdLease {
    /// A keep-alive of our lease and a check that the entry is still ours,
    /// sent together.
    async fn refresh(&mut self) -> Result<bool, BackendError> {
        let sent_at = Instant::now();
        let store = &self.store;
        let txn = Txn::new().when([owned(&self.key, &self.token.to_string())]);
        let id = self.lease.id;
        let (alive, ours) = tokio::join!(
            store.lease_call(|mut c| async move { c.keep_alive(id).await }),
            store.txn(&txn)
        );
        let ours = ours?;
        match alive {
            Ok(_) => {}
            Err(err) if lease_gone(&err) => return Ok(false),
            Err(err) => return Err(err),
        }
        if !ours.succeeded() {
            return Ok(false);
        }
        self.lease.fresh_at = sent_at;
        Ok(true)
    }

    /// Replaces our entry by one for a new token, on the same lease, if
    /// nobody queues behind ours; else deletes ours. One transaction.
    async fn move_or_release(&mut self) -> Result<HandOver, BackendError> {
        let store = self.store.clone();
        let token = self.token.to_string();
        let next = LockToken::random();
        let next_key = flipped(&self.key);
        // Every entry of the key was created no later than ours: ours is
        // alone (ours heads the queue, so none is older).
        let alone = Compare::create_revision(self.queue.clone(), CompareOp::Less, self.created + 1)
            .with_range(queue_end(&self.queue));
        let on_lease = PutOptions::new().with_lease(self.lease.id);
        let release = Txn::new()
            .when([owned(&self.key, &token)])
            .and_then([TxnOp::delete(self.key.clone(), None)]);
        let txn = Txn::new()
            .when([owned(&self.key, &token), alone])
            .and_then([
                TxnOp::delete(self.key.clone(), None),
                TxnOp::put(next_key.clone(), next.to_string(), Some(on_lease)),
            ])
            .or_else([TxnOp::txn(release)]);
        // Our own deletion is no loss.
        store.inner.shared.held.forget(self.watch);
        let sent_at = Instant::now();
        let id = self.lease.id;
        let (alive, answer) = tokio::join!(
            store.lease_call(|mut c| async move { c.keep_alive(id).await }),
            store.txn(&txn)
        );
        let answer = answer?;
        if !answer.succeeded() {
            let released = answer.op_responses().into_iter().any(|op| match op {
                TxnOpResponse::Txn(nested) => nested.succeeded(),
                _ => false,
            });
            if !released {
                return Ok(HandOver::Lost);
            }
            store
                .inner
                .shared
                .give_back(self.secs, self.lease, &self.queue);
            return Ok(HandOver::Released);
        }
        // The new entry is on our lease, renewed with the move; if the
        // keep-alive failed, it counts from its last renewal.
        let renewed = alive.is_ok();
        if renewed {
            self.lease.fresh_at = sent_at;
        }
        let created = i64::try_from(revision(&answer)).unwrap_or(i64::MAX);
        let entry = Queued {
            queue: self.queue.clone(),
            entry: next_key,
            created,
            lease: self.lease,
            secs: self.secs,
            place: Place::Head,
        };
        let loss = self.loss.clone();
        *self = store.granted(entry, next, !renewed, &loss);
        Ok(HandOver::Moved {
            fencing: revision(&answer),
        })
    }
}

impl Lease for EtcdLease {
    fn renew(&mut self) -> BoxFuture<'_, Result<bool, BackendError>> {
        Box::pin(self.refresh())
    }

    fn release(&mut self, linger: Duration) -> BoxFuture<'_, Result<bool, BackendError>> {
        Box::pin(async move {
            let store = self.store.clone();
            let token = self.token.to_string();
            // Our own deletion (or move) is no loss.
            store.inner.shared.held.forget(self.watch);
            let keep = if linger.is_zero() {
                None
            } else {
                // What is left moves to a lease of its own, which expires;
                // at least the cluster's minimum, which it would grant anyway.
                let min = whole_seconds(store.capabilities.min_ttl);
                Some(store.grant(whole_seconds(linger).max(min)).await?)
            };
            let build = || {
                let then = match keep {
                    None => TxnOp::delete(self.key.clone(), None),
                    Some(keep) => {
                        let options = PutOptions::new().with_lease(keep.id);
                        TxnOp::put(self.key.clone(), token.clone(), Some(options))
                    }
                };
                Txn::new().when([owned(&self.key, &token)]).and_then([then])
            };
            let answer = store.txn_built(build).await?;
            // A lingering entry keeps its name, which is our lease's: that
            // lease is not used again while the entry may live.
            if answer.succeeded() && linger.is_zero() {
                store
                    .inner
                    .shared
                    .give_back(self.secs, self.lease, &self.queue);
            }
            Ok(answer.succeeded())
        })
    }

    fn hand_over(&mut self) -> BoxFuture<'_, Result<HandOver, BackendError>> {
        Box::pin(self.move_or_release())
    }

    fn started_at(&self) -> Option<Instant> {
        self.counted_from_grant.then_some(self.lease.fresh_at)
    }
}

impl fmt::Debug for EtcdLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLease")
            .field("lease", &self.lease.id)
            .finish_non_exhaustive()
    }
}

impl Store for EtcdStore {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    fn acquire<'a>(
        &'a self,
        request: AcquireRequest<'a>,
    ) -> BoxFuture<'a, Result<Acquire, BackendError>> {
        Box::pin(async move {
            let queue = self.queue_of(request.key);
            let secs = whole_seconds(request.ttl);
            // A waiter asks again with the entry it has.
            let mut known = self.inner.shared.queued().get(&request.token).cloned();
            known = known.filter(|e| e.queue == queue);
            let placed = |e: &Queued, place| e.secs == secs && e.place == place;
            let fresh = |e: &Queued| e.lease.fresh_at.elapsed() < request.ttl / 2;
            // Told by the waiter's watch: no round trip.
            if let Some(entry) = known.take_if(|e| placed(e, Place::Head) && fresh(e)) {
                self.inner.shared.queued().remove(&request.token);
                let lease = self.granted(entry, request.token, true, request.loss);
                return Ok(Acquire::Acquired {
                    fencing: lease.created.max(0).unsigned_abs(),
                    lease: Box::new(lease),
                });
            }
            if let Some(entry) = known.as_mut().filter(|e| placed(e, Place::Behind)) {
                if self.keep_queued(request.token, entry).await? {
                    return Ok(Acquire::Held { remaining: None });
                }
                // Its lease ended (and it is forgotten): queue again.
                known = None;
            }
            self.attempt(request, queue, secs, known).await
        })
    }

    fn abandon<'a>(
        &'a self,
        key: &'a str,
        token: LockToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let queue = self.queue_of(key);
            let waiting = self.inner.shared.queued().remove(&token);
            let entries = match &waiting {
                Some(waiting) => vec![waiting.entry.clone()],
                // Not known here (an attempt whose answer was lost): look
                // for the token among the entries.
                None => self.entries_of(&queue, token).await?,
            };
            let mut held = false;
            for entry in entries {
                let value = token.to_string();
                let txn = Txn::new().when([owned(&entry, &value)]).and_then([
                    TxnOp::get(queue.clone(), Some(first_of(&queue))),
                    TxnOp::delete(entry.clone(), None),
                ]);
                let answer = self.txn(&txn).await?;
                if !answer.succeeded() {
                    continue;
                }
                let first = gets(&answer).into_iter().next().flatten();
                held |= first.is_some_and(|first| first.key() == entry.as_slice());
                if let Some(waiting) = &waiting {
                    self.inner
                        .shared
                        .give_back(waiting.secs, waiting.lease, &queue);
                }
            }
            Ok(held)
        })
    }

    fn watch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<ReleaseWatch, BackendError>> {
        Box::pin(async move {
            let queue = self.queue_of(key);
            let (tx, rx) = watch::channel(());
            let (placed, first) = tokio::sync::oneshot::channel();
            let task = tokio::spawn(follow(self.clone(), queue, tx, placed));
            let task = AbortOnDrop(task.abort_handle());
            // The first placement (a listing, and the watch from it), so
            // no deletion after this returns is missed, and the attempt
            // that follows needs no round trip.
            match tokio::time::timeout(self.inner.timeout, first).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(err))) => return Err(err),
                Ok(Err(_)) => return Err("the etcd watch ended at once".into()),
                Err(_) => {
                    let timeout = self.inner.timeout;
                    return Err(format!("no answer from etcd within {timeout:?}").into());
                }
            }
            Ok(ReleaseWatch::new(rx, Some(Box::new(task))))
        })
    }

    fn force_release<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let queue = self.queue_of(key);
            let Some(holder) = self.first(&queue).await? else {
                return Ok(false);
            };
            let created = holder.create_revision();
            let txn = Txn::new()
                .when([Compare::create_revision(
                    holder.key(),
                    CompareOp::Equal,
                    created,
                )])
                .and_then([TxnOp::delete(holder.key(), None)]);
            Ok(self.txn(&txn).await?.succeeded())
        })
    }

    /// The first entry of the key's queue holds the holder's token, and its
    /// create revision is the holder's fencing token; the remaining time is
    /// what etcd says of its lease, in whole seconds rounded down.
    fn inspect<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<LeaseInfo>, BackendError>> {
        Box::pin(async move {
            let queue = self.queue_of(key);
            let Some(holder) = self.first(&queue).await? else {
                return Ok(None);
            };
            let lease = holder.lease();
            let remaining = if lease == 0 {
                None
            } else {
                let left = self
                    .lease_call(|mut c| async move { c.time_to_live(lease, None).await })
                    .await?;
                // -1: the lease ended between the two reads.
                if left.ttl() < 0 {
                    return Ok(None);
                }
                Some(Duration::from_secs(left.ttl().unsigned_abs()))
            };
            let token = std::str::from_utf8(holder.value())
                .ok()
                .and_then(|value| value.parse().ok());
            let fencing = holder.create_revision().max(0).unsigned_abs();
            Ok(Some(LeaseInfo::new(token, fencing, remaining)))
        })
    }
}

impl EtcdStore {
    /// An attempt by transaction (see the module's documentation).
    /// `known` is the entry a waiter asks again with, if any, in `queue`.
    async fn attempt(
        &self,
        request: AcquireRequest<'_>,
        queue: Vec<u8>,
        secs: i64,
        mut known: Option<Queued>,
    ) -> Result<Acquire, BackendError> {
        let token = request.token.to_string();
        // A prepared lease (or a waiter's) may have expired meanwhile: then
        // once more with a new one.
        let mut tries = 0;
        let (spare, entry, answer, flat) = loop {
            tries += 1;
            // A first attempt's entry, named by a lease nobody else uses,
            // does not exist yet: it is put without looking.
            let flat = request.waits && known.is_none();
            let (spare, entry) = match &known {
                Some(known) => (known.lease, known.entry.clone()),
                None => {
                    let spare = match self.inner.shared.take(secs, &queue) {
                        Some(spare) => spare,
                        None => self.grant(secs).await?,
                    };
                    (spare, entry_for(&queue, spare.id, false))
                }
            };
            let build = || {
                let put = || {
                    let on_lease = PutOptions::new().with_lease(spare.id);
                    TxnOp::put(entry.clone(), token.clone(), Some(on_lease))
                };
                let first = || TxnOp::get(queue.clone(), Some(first_of(&queue)));
                // Nobody holds or waits: ours, as cheaply as a plain lock.
                let empty = Compare::create_revision(queue.clone(), CompareOp::Equal, 0)
                    .with_range(queue_end(&queue));
                if flat {
                    // Queue ours: put, then read it and the head (reads in
                    // a transaction see its earlier writes).
                    return Txn::new().when([empty]).and_then([put()]).or_else([
                        put(),
                        TxnOp::get(entry.clone(), None),
                        first(),
                    ]);
                }
                let otherwise = if request.waits {
                    // Queue ours, or find it queued already.
                    TxnOp::txn(
                        Txn::new()
                            .when([Compare::create_revision(entry.clone(), CompareOp::Equal, 0)])
                            .and_then([put(), first()])
                            .or_else([TxnOp::get(entry.clone(), None), first()]),
                    )
                } else {
                    first()
                };
                Txn::new()
                    .when([empty])
                    .and_then([put()])
                    .or_else([otherwise])
            };
            match self.txn_built(build).await {
                Err(err) if tries < 2 && lease_gone(&err) => {
                    if known.take().is_some() {
                        self.inner.shared.queued().remove(&request.token);
                    }
                }
                answer => break (spare, entry, answer?, flat),
            }
        };
        // A waiter's answer is the nested transaction's, unless the queue
        // was empty.
        let nested = answer.op_responses().into_iter().find_map(|op| match op {
            TxnOpResponse::Txn(nested) => Some(nested),
            _ => None,
        });
        let (put, read) = match &nested {
            Some(nested) => (nested.succeeded(), gets(nested)),
            None => (answer.succeeded() || flat, gets(&answer)),
        };
        let holder = read.last().cloned().flatten();
        if put {
            // Our entry's create revision: the transaction's, unless read
            // (a put that ran twice keeps the first one's).
            let created = read
                .iter()
                .flatten()
                .find(|kv| kv.key() == entry.as_slice())
                .map_or_else(
                    || i64::try_from(revision(&answer)).unwrap_or(i64::MAX),
                    KeyValue::create_revision,
                );
            let ours = Queued {
                queue,
                entry,
                created,
                lease: spare,
                secs,
                place: Place::Unknown,
            };
            match holder {
                Some(holder) if holder.key() != ours.entry => {
                    if holder.value() == token.as_bytes() {
                        // An earlier entry of ours heads the queue (an
                        // attempt by the same token whose answer was
                        // lost): drop the new one, take that one.
                        let drop_new = Txn::new()
                            .when([owned(&ours.entry, &token)])
                            .and_then([TxnOp::delete(ours.entry.clone(), None)]);
                        self.txn(&drop_new).await?;
                        self.inner.shared.give_back(secs, spare, &ours.queue);
                        return self.resume(&request, ours.queue, &holder, secs).await;
                    }
                    // Queued behind the holder (wait mode).
                    self.inner.shared.queued().insert(request.token, ours);
                    Ok(Acquire::Held { remaining: None })
                }
                _ => {
                    let lease = self.granted(ours, request.token, true, request.loss);
                    Ok(Acquire::Acquired {
                        fencing: lease.created.max(0).unsigned_abs(),
                        lease: Box::new(lease),
                    })
                }
            }
        } else {
            if known.is_none() {
                self.inner.shared.give_back(secs, spare, &queue);
            }
            let Some(holder) = holder else {
                // Emptied between the compare and the read cannot happen in
                // one transaction; a key without entries is free.
                return Ok(Acquire::Held {
                    remaining: Some(Duration::ZERO),
                });
            };
            if holder.value() == token.as_bytes() {
                // Ours heads the queue: an earlier attempt whose answer was
                // lost, or a waiter whose watch has not told it yet.
                return self.resume(&request, queue, &holder, secs).await;
            }
            let Some(mine) = read.first().cloned().flatten().filter(|_| request.waits) else {
                return Ok(Acquire::Held {
                    remaining: self.remaining(holder.lease()).await?,
                });
            };
            if mine.value() != token.as_bytes() {
                return Err("etcd: a lease's lock entry holds another token".into());
            }
            // Still queued: keep our entry alive.
            let mut ours = Queued {
                queue,
                entry,
                created: mine.create_revision(),
                lease: spare,
                secs,
                place: known.map_or(Place::Unknown, |known| known.place),
            };
            self.inner
                .shared
                .queued()
                .insert(request.token, ours.clone());
            if !self.keep_queued(request.token, &mut ours).await? {
                // Its lease ended: queue again.
                return Box::pin(self.attempt(request, ours.queue, secs, None)).await;
            }
            Ok(Acquire::Held { remaining: None })
        }
    }

    /// The lock held by `holder`, an entry of ours (by `request`'s token),
    /// if its lease is still alive; it is extended now, so it counts from
    /// now.
    async fn resume(
        &self,
        request: &AcquireRequest<'_>,
        queue: Vec<u8>,
        holder: &KeyValue,
        secs: i64,
    ) -> Result<Acquire, BackendError> {
        self.inner.shared.queued().remove(&request.token);
        let ours = Queued {
            queue,
            entry: holder.key().to_vec(),
            created: holder.create_revision(),
            lease: Spare {
                id: holder.lease(),
                fresh_at: Instant::now(),
            },
            secs,
            place: Place::Head,
        };
        let mut lease = self.granted(ours, request.token, false, request.loss);
        if lease.refresh().await? {
            return Ok(Acquire::Acquired {
                fencing: lease.created.max(0).unsigned_abs(),
                lease: Box::new(lease),
            });
        }
        Ok(Acquire::Held {
            remaining: Some(Duration::ZERO),
        })
    }
}

/// Follows `queue` for a waiter until nobody listens, on the key's shared
/// watch ([`queues`]): lists the queue once the watch is open, and applies
/// the deletions after the listing. Our entry heads the queue once every
/// entry created before it is deleted; that is noted in its [`Place`] and
/// reported on `tx`, as is the deletion of our own entry. With no entry of
/// ours, every deletion is reported. A reset or lagging watch lists the
/// queue again. `placed` is told once the first listing is made (or what
/// failed).
async fn follow(
    store: EtcdStore,
    queue: Vec<u8>,
    tx: watch::Sender<()>,
    placed: tokio::sync::oneshot::Sender<Result<(), BackendError>>,
) {
    let mut placed = Some(placed);
    let mut subscription = store
        .inner
        .shared
        .queues
        .subscribe(&store.inner.watches, &queue);
    loop {
        let listed = async {
            let timeout = store.inner.timeout;
            tokio::time::timeout(timeout, subscription.opened())
                .await
                .map_err(|_| format!("no answer from etcd within {timeout:?}"))?;
            store.list(&queue).await
        }
        .await;
        let (entries, at) = match listed {
            Ok(listed) => listed,
            Err(err) => {
                if let Some(placed) = placed.take() {
                    let _ = placed.send(Err(err));
                    return;
                }
                tracing::debug!(%err, "etcd queue: listing again failed");
                tokio::time::sleep(WATCH_RETRY).await;
                continue;
            }
        };
        // Ours: the earliest of our entries still there.
        let ours: HashMap<Vec<u8>, i64> = store
            .inner
            .shared
            .queued()
            .iter()
            .filter(|(_, entry)| entry.queue == queue)
            .map(|(_, entry)| (entry.entry.clone(), entry.created))
            .collect();
        let mine = entries
            .iter()
            .filter(|(key, created)| ours.get(key) == Some(created))
            .min_by_key(|(_, created)| *created)
            .cloned();
        let mut ahead: HashSet<Vec<u8>> = match &mine {
            Some((_, created)) => entries
                .iter()
                .filter(|(_, at)| at < created)
                .map(|(key, _)| key.clone())
                .collect(),
            None => HashSet::new(),
        };
        match &mine {
            Some((_, created)) if ahead.is_empty() => {
                store.inner.shared.place(&queue, *created, Place::Head);
            }
            Some((_, created)) => store.inner.shared.place(&queue, *created, Place::Behind),
            None => store.inner.shared.place(&queue, 0, Place::Unknown),
        }
        match placed.take() {
            Some(placed) => {
                let _ = placed.send(Ok(()));
            }
            // Wake the waiter to look: a listing after the first may
            // follow changes nobody reported.
            None => {
                tx.send_replace(());
            }
        }
        // Apply deletions until ours goes or the queue must be listed again.
        loop {
            let deleted = match subscription.deletions.recv().await {
                Ok(Deletion::Deleted { entry, revision }) if revision > at => entry,
                // Already in the listing.
                Ok(Deletion::Deleted { .. }) => continue,
                Ok(Deletion::Reset) | Err(broadcast::error::RecvError::Lagged(_)) => break,
                Err(broadcast::error::RecvError::Closed) => {
                    subscription = store
                        .inner
                        .shared
                        .queues
                        .subscribe(&store.inner.watches, &queue);
                    break;
                }
            };
            match &mine {
                None => {
                    // Wake the waiter; list again, to find an entry it
                    // may have made meanwhile.
                    tx.send_replace(());
                    break;
                }
                Some((ours, _)) if *ours == deleted => {
                    // Ours is gone (its lease ended, or it was deleted):
                    // the waiter queues again.
                    store.inner.shared.place(&queue, 0, Place::Unknown);
                    tx.send_replace(());
                    break;
                }
                Some((_, created)) => {
                    if ahead.remove(&deleted) && ahead.is_empty() {
                        store.inner.shared.place(&queue, *created, Place::Head);
                        tx.send_replace(());
                    }
                }
            }
        }
        if tx.is_closed() {
            return;
        }
    }
}

/// Aborts a task when the subscription it serves is dropped.
struct AbortOnDrop(AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.inner.shown)
            .field("prefix", &self.inner.prefix)
            .field("min_ttl", &self.capabilities.min_ttl)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_key_s_range_holds_another_key_s_entries() {
        let keys = ["k", "k\0x", "k%00x", "k%2500x", "k/x", "kx", ""];
        for a in keys {
            let (start, end) = (
                queue_start("locks/", a),
                queue_end(&queue_start("locks/", a)),
            );
            for b in keys.iter().filter(|b| **b != a) {
                let entry = entry_for(&queue_start("locks/", b), 7, false);
                assert!(
                    !(start <= entry && entry < end),
                    "{b:?}'s entry is in {a:?}'s range"
                );
            }
            let own = entry_for(&start, 7, false);
            assert!(start <= own && own < end);
            assert!(start <= flipped(&own) && flipped(&own) < end);
            assert_ne!(flipped(&own), own);
            assert_eq!(flipped(&flipped(&own)), own);
        }
    }

    #[test]
    fn lingers_round_up_to_whole_seconds() {
        assert_eq!(whole_seconds(Duration::from_secs(2)), 2);
        assert_eq!(whole_seconds(Duration::from_millis(2001)), 3);
        assert_eq!(whole_seconds(Duration::from_millis(1)), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn only_fresh_spare_leases_are_reused() {
        let shared = Shared {
            spares: Mutex::default(),
            held: Arc::default(),
            queued: Mutex::default(),
            queues: Arc::default(),
        };
        let at = Instant::now();
        let spare = |id| Spare { id, fresh_at: at };
        shared.give_back(4, spare(1), b"a");
        tokio::time::advance(Duration::from_millis(999)).await;
        assert_eq!(shared.take(4, b"b").map(|s| s.id), Some(1));
        shared.give_back(4, spare(1), b"a");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(shared.take(4, b"a").is_none(), "a quarter of the ttl old");
        assert!(shared.take(8, b"a").is_none());
    }

    #[test]
    fn a_key_gets_back_the_lease_it_used_last() {
        let shared = Shared {
            spares: Mutex::default(),
            held: Arc::default(),
            queued: Mutex::default(),
            queues: Arc::default(),
        };
        let spare = |id| Spare {
            id,
            fresh_at: Instant::now(),
        };
        shared.give_back(4, spare(1), b"a");
        shared.give_back(4, spare(2), b"b");
        shared.give_back(4, spare(3), b"c");
        assert_eq!(shared.take(4, b"a").map(|s| s.id), Some(1));
        assert_eq!(
            shared.take(4, b"z").map(|s| s.id),
            Some(3),
            "else the last given back"
        );
        assert_eq!(shared.take(4, b"b").map(|s| s.id), Some(2));
        assert!(shared.take(4, b"a").is_none());
    }
}
