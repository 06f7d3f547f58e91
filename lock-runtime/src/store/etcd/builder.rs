//! Configuring and connecting an [`EtcdStore`]: endpoints, prefix,
//! credentials, timeouts and TLS.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

use super::calls::within;
use super::state::Shared;
use super::{EtcdStore, Inner, capabilities};
use crate::error::{LockError, StoreError};
use crate::store::common::connect::{self, Timeouts, timeout_setters};

/// Configures and connects an [`EtcdStore`].
pub struct EtcdStoreBuilder {
    endpoints: Vec<String>,
    prefix: String,
    user: Option<(String, String)>,
    timeouts: Timeouts,
    #[cfg(feature = "etcd-tls")]
    tls: Option<Tls>,
}

/// The TLS settings of [`EtcdStoreBuilder::tls_ca`] and its siblings.
#[cfg(feature = "etcd-tls")]
#[derive(Default)]
pub(super) struct Tls {
    options: etcd_client::TlsOptions,
    has_ca: bool,
    has_identity: bool,
}

impl EtcdStoreBuilder {
    timeout_setters!(call: "one call", "2 s"; connect: "2 s");

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
    fn check_schemes(&self) -> Result<(), StoreError> {
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
    /// [`LockError::InvalidSettings`] for no endpoint, or endpoints whose
    /// schemes contradict the TLS settings; [`LockError::Connect`] when no
    /// endpoint answers or the credentials are refused. Never contains the
    /// password.
    pub async fn connect(self) -> Result<EtcdStore, LockError> {
        let shown = self.endpoints.join(",");
        let settings = if self.endpoints.is_empty() {
            Err("no etcd endpoint given".into())
        } else {
            self.check_schemes()
        };
        if let Err(reason) = settings {
            return Err(LockError::InvalidSettings {
                store: "etcd",
                address: shown,
                reason: reason.to_string(),
            });
        }
        connect::opened("etcd", shown, self.open()).await
    }

    async fn open(self) -> Result<EtcdStore, StoreError> {
        let shown = self.endpoints.join(",");
        let mut options = ConnectOptions::new()
            .with_connect_timeout(self.timeouts.connection)
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
        let client = within(self.timeouts.response + self.timeouts.connection, connect)
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
            timeout: self.timeouts.response,
            shown,
        };
        // The first call: with a lazy connection, a refused handshake or
        // an unreachable cluster shows here.
        let mut store = EtcdStore {
            inner: Arc::new(store),
            min_ttl: Duration::from_secs(1),
            capabilities: capabilities(Duration::from_secs(1)),
        };
        let min_ttl = store.min_ttl().await.map_err(|err| {
            format!(
                "cannot connect to etcd at {}: {err}{hint}",
                store.inner.shown
            )
        })?;
        store.min_ttl = min_ttl;
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

impl EtcdStore {
    /// Starts configuring a store for the cluster at `endpoints`.
    pub fn builder(endpoints: &[&str]) -> EtcdStoreBuilder {
        EtcdStoreBuilder {
            endpoints: endpoints.iter().map(|e| (*e).to_owned()).collect(),
            prefix: "locks/".to_owned(),
            user: None,
            timeouts: Timeouts::new(Duration::from_secs(2), Duration::from_secs(2)),
            #[cfg(feature = "etcd-tls")]
            tls: None,
        }
    }

    /// Connects with the default settings: `EtcdStore::builder(endpoints).connect()`.
    ///
    /// # Errors
    ///
    /// As [`EtcdStoreBuilder::connect`].
    pub async fn connect(endpoints: &[&str]) -> Result<EtcdStore, LockError> {
        EtcdStore::builder(endpoints).connect().await
    }
}
