//! etcd: leases and revision fencing, for locks that must stay correct when
//! a server dies (Raft-replicated, linearizable).
//!
//! # How a lock is kept
//!
//! A lock is one key (the registry's key under the store's prefix, default
//! `locks/`) whose value is the holder's token, attached to an etcd lease of
//! the lock's ttl. A crashed holder stops renewing; etcd expires the lease
//! and deletes the key with it.
//!
//! - **Acquire** is one transaction: `If create_revision(key) == 0 Then
//!   Put(key, token, lease) Else Get(key)`. Granted, the fencing token is the
//!   transaction's revision: cluster-wide, strictly increasing, kept by
//!   every member (it survives the loss of any minority of them). Refused,
//!   the holder's lease says how long it has left (one more call).
//! - **Leases are prepared ahead** so the common path is that one round
//!   trip: a released lock's lease, still fresh, waits in a small pool per
//!   ttl for the next acquire with the same ttl, and only the first acquire
//!   of a ttl (or one after a long hold) grants a new lease first. Such a
//!   lease is counted from when it was last granted or renewed, not from the
//!   acquire ([`Lease::started_at`]), so the runtime never believes in more
//!   of it than etcd does.
//! - **Losses are pushed**: a key held for a moment is watched for a
//!   deletion its holder did not make (a revoked or expired lease, a deleted
//!   key), which cancels the body at once (see `held.rs`).
//! - **Renew** sends a keep-alive for the lease and checks, in the same round
//!   trip, that the key still holds our token: a revoked lease, an expired
//!   one or a key deleted under the holder is a lost lock, and the body is
//!   cancelled.
//! - **Release** deletes the key if it holds our token. `hold_at_least`
//!   moves the key to a new lease of what is left instead.
//! - **Waiting** watches the key for its deletion (a release, an expiry, a
//!   revoked lease), created before the next attempt, so no release is
//!   missed; a watch that breaks resumes from the last revision it saw, and
//!   waiters retry on a timer as well.
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
//! With the `etcd-tls` feature, [`EtcdBackendBuilder::tls_ca`] turns TLS on
//! (rustls, through the etcd client), [`EtcdBackendBuilder::tls_identity`]
//! presents a client certificate and [`EtcdBackendBuilder::tls_domain`]
//! names the certificates' host when it is not the endpoints'.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, KvClient, LeaseClient, PutOptions, Txn,
    TxnOp, TxnOpResponse, TxnResponse, WatchClient, WatchOptions,
};
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::{
    Acquire, AcquireRequest, Backend, BoxFuture, Capabilities, FencingPromise, HandOver, Lease,
    LeaseInfo, LockToken, ReleaseWatch, SafetyMargin,
};
use crate::backend::LossSignal;
use crate::error::{BackendError, LockError};
use crate::registry::LockRegistry;

mod held;

use held::HeldKeys;

/// The most unused leases kept per ttl.
const MAX_SPARES: usize = 256;

/// How long a watch that broke waits before it resumes.
const WATCH_RETRY: Duration = Duration::from_millis(100);

/// How long a call no member could take waits before it is sent again.
const RETRY: Duration = Duration::from_millis(10);

impl LockRegistry {
    /// A registry over the etcd cluster at `endpoints`
    /// (`http://127.0.0.1:2379`, ...), with the [`EtcdBackend`] defaults.
    ///
    /// # Errors
    ///
    /// [`LockError::Backend`] naming the endpoints when none answers.
    pub async fn etcd(endpoints: &[&str]) -> Result<LockRegistry, LockError> {
        let backend = EtcdBackend::builder(endpoints).connect().await;
        LockRegistry::connected(&endpoints.join(","), backend)
    }
}

/// Configures and connects an [`EtcdBackend`].
pub struct EtcdBackendBuilder {
    endpoints: Vec<String>,
    prefix: String,
    user: Option<(String, String)>,
    response_timeout: Duration,
    connection_timeout: Duration,
    #[cfg(feature = "etcd-tls")]
    tls: Option<Tls>,
}

/// The TLS settings of [`EtcdBackendBuilder::tls_ca`] and its siblings.
#[cfg(feature = "etcd-tls")]
#[derive(Default)]
struct Tls {
    options: etcd_client::TlsOptions,
    has_ca: bool,
    has_identity: bool,
}

impl EtcdBackendBuilder {
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
                     with `EtcdBackendBuilder::tls_ca` (feature `etcd-tls`)"
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
    pub async fn connect(self) -> Result<EtcdBackend, BackendError> {
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
        let mut store = EtcdBackend {
            kv: client.kv_client(),
            leases: client.lease_client(),
            watches: client.watch_client(),
            shared: Arc::new(Shared {
                spares: Mutex::default(),
                held: Arc::default(),
            }),
            capabilities: capabilities(Duration::from_secs(1)),
            prefix: self.prefix,
            timeout: self.response_timeout,
            shown,
        };
        // The first call: with a lazy connection, a refused handshake or
        // an unreachable cluster shows here.
        let min_ttl = store
            .min_ttl()
            .await
            .map_err(|err| format!("cannot connect to etcd at {}: {err}{hint}", store.shown))?;
        store.capabilities = capabilities(min_ttl);
        Ok(store)
    }
}

impl EtcdBackendBuilder {
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

impl fmt::Debug for EtcdBackendBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackendBuilder")
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
pub struct EtcdBackend {
    kv: KvClient,
    leases: LeaseClient,
    watches: WatchClient,
    shared: Arc<Shared>,
    capabilities: Capabilities,
    prefix: String,
    timeout: Duration,
    shown: String,
}

/// What clones of one store share.
struct Shared {
    /// Unused leases by ttl in seconds.
    spares: Mutex<HashMap<i64, Vec<Spare>>>,
    /// The keys held, watched so their loss is pushed to the holder.
    held: Arc<HeldKeys>,
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
    fn take(&self, secs: i64) -> Option<Spare> {
        let mut spares = self.spares.lock().unwrap_or_else(|e| e.into_inner());
        let list = spares.get_mut(&secs)?;
        let fresh = Duration::from_secs(secs.unsigned_abs()) / 4;
        while let Some(spare) = list.pop() {
            if spare.fresh_at.elapsed() < fresh {
                return Some(spare);
            }
            // Older ones are older still: let them all expire in etcd.
            list.clear();
        }
        None
    }

    fn give_back(&self, secs: i64, spare: Spare) {
        let fresh = Duration::from_secs(secs.unsigned_abs()) / 4;
        if spare.fresh_at.elapsed() >= fresh {
            return;
        }
        let mut spares = self.spares.lock().unwrap_or_else(|e| e.into_inner());
        let list = spares.entry(secs).or_default();
        if list.len() < MAX_SPARES {
            list.push(spare);
        }
    }
}

impl EtcdBackend {
    /// Starts configuring a store for the cluster at `endpoints`.
    pub fn builder(endpoints: &[&str]) -> EtcdBackendBuilder {
        EtcdBackendBuilder {
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

    fn key(&self, key: &str) -> Vec<u8> {
        let mut full = Vec::with_capacity(self.prefix.len() + key.len());
        full.extend_from_slice(self.prefix.as_bytes());
        full.extend_from_slice(key.as_bytes());
        full
    }

    /// Runs `txn` (see [`timed`](Self::timed)).
    async fn txn(&self, txn: &Txn) -> Result<TxnResponse, BackendError> {
        self.timed(|| {
            let (mut kv, txn) = (self.kv.clone(), txn.clone());
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
        self.timed(|| call(self.leases.clone())).await
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
        let deadline = Instant::now() + self.timeout;
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
                    let timeout = self.timeout;
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

    /// The handle of `key`, granted at revision `granted`; its deletion by
    /// anyone else raises `loss`.
    fn lease(
        &self,
        key: Vec<u8>,
        token: LockToken,
        secs: i64,
        spare: Spare,
        granted: i64,
        loss: &LossSignal,
    ) -> EtcdLease {
        let opener = self.prefix.as_bytes();
        let watch = self
            .shared
            .held
            .hold(&self.watches, opener, &key, granted, loss);
        EtcdLease {
            store: self.clone(),
            key,
            token,
            secs,
            lease: spare,
            watch,
            counted_from_grant: true,
        }
    }
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
    err.to_string().contains("requested lease not found")
}

/// `If value(key) == token`.
fn owned(key: &[u8], token: &str) -> Compare {
    Compare::value(key, CompareOp::Equal, token)
}

/// The key's current entry in a refused transaction's `Get`.
fn holder(answer: &TxnResponse) -> Option<etcd_client::KeyValue> {
    answer.op_responses().into_iter().find_map(|op| match op {
        TxnOpResponse::Get(get) => get.kvs().first().cloned(),
        _ => None,
    })
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

/// One held key and the lease it is attached to.
struct EtcdLease {
    store: EtcdBackend,
    key: Vec<u8>,
    token: LockToken,
    secs: i64,
    lease: Spare,
    /// The watch that pushes the key's loss ([`HeldKeys`]).
    watch: i64,
    /// Whether the lease was granted before the acquire was sent.
    counted_from_grant: bool,
}

impl Drop for EtcdLease {
    fn drop(&mut self) {
        self.store.shared.held.forget(self.watch);
    }
}

impl EtcdLease {
    /// A keep-alive of our lease and a check that the key is still ours,
    /// sent together; `Some(fencing)` after moving the key to `next`.
    async fn refresh(&mut self, next: Option<LockToken>) -> Result<Option<u64>, BackendError> {
        let sent_at = Instant::now();
        let store = &self.store;
        let token = self.token.to_string();
        let mut txn = Txn::new().when([owned(&self.key, &token)]);
        if let Some(next) = next {
            let options = PutOptions::new().with_lease(self.lease.id);
            txn = txn.and_then([TxnOp::put(
                self.key.clone(),
                next.to_string(),
                Some(options),
            )]);
        }
        let id = self.lease.id;
        let (alive, ours) = tokio::join!(
            store.lease_call(|mut c| async move { c.keep_alive(id).await }),
            store.txn(&txn)
        );
        let ours = ours?;
        match alive {
            Ok(_) => {}
            Err(err) if err.to_string().contains("lease not found") => return Ok(None),
            Err(err) => return Err(err),
        }
        if !ours.succeeded() {
            return Ok(None);
        }
        self.lease.fresh_at = sent_at;
        if let Some(next) = next {
            self.token = next;
        }
        Ok(Some(revision(&ours)))
    }
}

impl Lease for EtcdLease {
    fn renew(&mut self) -> BoxFuture<'_, Result<bool, BackendError>> {
        Box::pin(async move { Ok(self.refresh(None).await?.is_some()) })
    }

    fn release(&mut self, linger: Duration) -> BoxFuture<'_, Result<bool, BackendError>> {
        Box::pin(async move {
            let store = self.store.clone();
            let token = self.token.to_string();
            // Our own deletion (or move) is no loss.
            store.shared.held.forget(self.watch);
            let then = if linger.is_zero() {
                TxnOp::delete(self.key.clone(), None)
            } else {
                // What is left moves to a lease of its own, which expires;
                // at least the cluster's minimum, which it would grant anyway.
                let min = whole_seconds(store.capabilities.min_ttl);
                let keep = store.grant(whole_seconds(linger).max(min)).await?;
                let options = PutOptions::new().with_lease(keep.id);
                TxnOp::put(self.key.clone(), token.clone(), Some(options))
            };
            let txn = Txn::new().when([owned(&self.key, &token)]).and_then([then]);
            let answer = store.txn(&txn).await?;
            if answer.succeeded() {
                store.shared.give_back(self.secs, self.lease);
            }
            Ok(answer.succeeded())
        })
    }

    fn hand_over(&mut self) -> BoxFuture<'_, Result<HandOver, BackendError>> {
        Box::pin(async move {
            let fencing = self.refresh(Some(LockToken::random())).await?;
            self.counted_from_grant = false;
            Ok(fencing.into())
        })
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

impl Backend for EtcdBackend {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    fn acquire<'a>(
        &'a self,
        request: AcquireRequest<'a>,
    ) -> BoxFuture<'a, Result<Acquire, BackendError>> {
        Box::pin(async move {
            let key = self.key(request.key);
            let token = request.token.to_string();
            let secs = whole_seconds(request.ttl);
            // A prepared lease may have expired meanwhile: then once more
            // with a new one.
            let mut attempts = 0;
            let (spare, answer) = loop {
                attempts += 1;
                let spare = match self.shared.take(secs) {
                    Some(spare) => spare,
                    None => self.grant(secs).await?,
                };
                let options = PutOptions::new().with_lease(spare.id);
                let txn = Txn::new()
                    .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(key.clone(), token.clone(), Some(options))])
                    .or_else([TxnOp::get(key.clone(), None)]);
                match self.txn(&txn).await {
                    Err(err) if attempts < 2 && lease_gone(&err) => continue,
                    answer => break (spare, answer?),
                }
            };
            if answer.succeeded() {
                let fencing = revision(&answer);
                let granted = i64::try_from(fencing).unwrap_or(i64::MAX);
                let lease = self.lease(key, request.token, secs, spare, granted, request.loss);
                return Ok(Acquire::Acquired {
                    fencing,
                    lease: Box::new(lease),
                });
            }
            self.shared.give_back(secs, spare);
            let Some(holder) = holder(&answer) else {
                // Deleted between the compare and the get cannot happen
                // in one transaction; a key without an entry is free.
                return Ok(Acquire::Held {
                    remaining: Some(Duration::ZERO),
                });
            };
            if holder.value() == token.as_bytes() {
                // Our own earlier attempt, whose answer was lost: the same
                // grant. Its lease is extended now, so it counts from now.
                let spare = Spare {
                    id: holder.lease(),
                    fresh_at: Instant::now(),
                };
                let granted = holder.mod_revision();
                let mut lease = self.lease(key, request.token, secs, spare, granted, request.loss);
                lease.counted_from_grant = false;
                if lease.refresh(None).await?.is_some() {
                    return Ok(Acquire::Acquired {
                        fencing: holder.mod_revision().max(0).unsigned_abs(),
                        lease: Box::new(lease),
                    });
                }
                return Ok(Acquire::Held {
                    remaining: Some(Duration::ZERO),
                });
            }
            Ok(Acquire::Held {
                remaining: self.remaining(holder.lease()).await?,
            })
        })
    }

    fn abandon<'a>(
        &'a self,
        key: &'a str,
        token: LockToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let key = self.key(key);
            let txn = Txn::new()
                .when([owned(&key, &token.to_string())])
                .and_then([TxnOp::delete(key.clone(), None)]);
            let answer = self.txn(&txn).await?;
            Ok(answer.succeeded())
        })
    }

    fn watch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<ReleaseWatch, BackendError>> {
        Box::pin(async move {
            let key = self.key(key);
            let (tx, rx) = watch::channel(());
            // Created (acknowledged by etcd) before we return: every
            // deletion after this is reported.
            let stream = self.open_watch(&key, None).await?;
            let task = tokio::spawn(follow(self.clone(), key, stream, tx));
            Ok(ReleaseWatch::new(
                rx,
                Some(Box::new(AbortOnDrop(task.abort_handle()))),
            ))
        })
    }

    fn force_release<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let key = self.key(key);
            let deleted = self
                .timed(|| {
                    let (mut kv, key) = (self.kv.clone(), key.clone());
                    async move { kv.delete(key, None).await }
                })
                .await?;
            Ok(deleted.deleted() > 0)
        })
    }

    /// The key's value is the holder's token and its last modification the
    /// holder's fencing token; the remaining time is what etcd says of the
    /// key's lease, in whole seconds rounded down.
    fn inspect<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<LeaseInfo>, BackendError>> {
        Box::pin(async move {
            let key = self.key(key);
            let got = self
                .timed(|| {
                    let (mut kv, key) = (self.kv.clone(), key.clone());
                    async move { kv.get(key, None).await }
                })
                .await?;
            let Some(holder) = got.kvs().first() else {
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
            let fencing = holder.mod_revision().max(0).unsigned_abs();
            Ok(Some(LeaseInfo::new(token, fencing, remaining)))
        })
    }
}

impl EtcdBackend {
    /// A watch of `key`'s deletions from `from` (default: from now),
    /// acknowledged; with the revision it starts after.
    async fn open_watch(
        &self,
        key: &[u8],
        from: Option<i64>,
    ) -> Result<(etcd_client::WatchStream, i64), BackendError> {
        let mut options = WatchOptions::new().with_filters([etcd_client::WatchFilterType::NoPut]);
        if let Some(from) = from {
            options = options.with_start_revision(from);
        }
        let mut stream = self
            .timed(|| {
                let (mut watches, options) = (self.watches.clone(), options.clone());
                async move { watches.watch(key.to_vec(), Some(options)).await }
            })
            .await?;
        let created = within(self.timeout, stream.message())
            .await?
            .ok_or("etcd closed the watch at once")?;
        let seen = created.header().map_or(0, |header| header.revision());
        Ok((stream, seen))
    }
}

/// Reports each deletion of `key` on `tx` until nobody listens; a broken
/// watch resumes after the last revision it saw.
async fn follow(
    store: EtcdBackend,
    key: Vec<u8>,
    opened: (etcd_client::WatchStream, i64),
    tx: watch::Sender<()>,
) {
    let (mut stream, mut seen) = opened;
    loop {
        // A broken stream (`Err`, `None`) resumes below.
        if let Ok(Some(answer)) = stream.message().await {
            if let Some(header) = answer.header() {
                seen = seen.max(header.revision());
            }
            let deleted = answer
                .events()
                .iter()
                .any(|event| event.event_type() == EventType::Delete);
            if deleted {
                tx.send_replace(());
            }
            if !answer.canceled() {
                continue;
            }
            if answer.compact_revision() > 0 {
                // What we missed is gone from history: wake the waiter to
                // look, and go on from the compaction.
                tx.send_replace(());
                seen = seen.max(answer.compact_revision() - 1);
            }
        }
        // Broken or cancelled: resume after what we saw.
        loop {
            if tx.is_closed() {
                return;
            }
            tokio::time::sleep(WATCH_RETRY).await;
            match store.open_watch(&key, Some(seen + 1)).await {
                Ok((resumed, _)) => {
                    stream = resumed;
                    break;
                }
                Err(error) => tracing::debug!(%error, "etcd watch: resuming failed"),
            }
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

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("endpoints", &self.shown)
            .field("prefix", &self.prefix)
            .field("min_ttl", &self.capabilities.min_ttl)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        };
        let at = Instant::now();
        shared.give_back(
            4,
            Spare {
                id: 1,
                fresh_at: at,
            },
        );
        tokio::time::advance(Duration::from_millis(999)).await;
        assert_eq!(shared.take(4).map(|s| s.id), Some(1));
        shared.give_back(
            4,
            Spare {
                id: 1,
                fresh_at: at,
            },
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(shared.take(4).is_none(), "a quarter of the ttl old");
        assert!(shared.take(8).is_none());
    }
}
