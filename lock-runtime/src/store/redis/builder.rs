//! Configuring and connecting a [`RedisStore`], and how its fencing tokens
//! are made.

use std::sync::Arc;
use std::time::Duration;

use super::RedisStore;
use super::commands::{Commands, Fencing, ReplicaAcks};
use super::connection::{RedisConnection, Settings, Source, TlsSettings};
use super::owner_checks::{Checks, OwnerChecks};
use super::subscriber::Subscriber;
use crate::error::{LockError, StoreError};
use crate::store::common::connect::{self, Timeouts, timeout_setters};
use crate::store::common::redact::redact;

/// Configures and connects a [`RedisStore`].
#[derive(Clone, Debug)]
pub struct RedisStoreBuilder {
    url: String,
    fencing: Fencing,
    timeouts: Timeouts,
    connection_retries: usize,
    replica_acks: Option<ReplicaAcks>,
    fair: Option<Duration>,
    tls: TlsSettings,
    owner_checks: OwnerChecks,
}

impl RedisStoreBuilder {
    timeout_setters!(call: "one command", "2 s"; connect: "1 s");

    /// How fencing counters are kept (default [`Fencing::PerKey`]).
    pub fn fencing(mut self, fencing: Fencing) -> Self {
        self.fencing = fencing;
        self
    }

    /// How many times a failed connection is tried again, from 50 ms apart
    /// and backing off (default 2): a server that refuses connections makes
    /// `connect`, and a command while the connection is down, fail after a
    /// few hundred milliseconds with the default, within a millisecond
    /// with 0.
    pub fn connection_retries(mut self, retries: usize) -> Self {
        self.connection_retries = retries;
        self
    }

    /// Makes every grant wait until `replicas` replicas have it (`WAIT`),
    /// at most `timeout`; a grant that fewer replicas confirm in time is
    /// undone and the acquire fails with [`LockError::Store`]. A failover
    /// right after a grant then cannot lose it, unless every confirming
    /// replica fails too (one more round trip per grant; see the [module
    /// docs](super#cluster-sentinel-and-replicas)). Off by default.
    /// `timeout` must be shorter than the
    /// [response timeout](Self::response_timeout), or `connect` refuses it.
    ///
    /// On a Redis Cluster, `WAIT` goes to every primary and the fewest
    /// acknowledgements count: each primary needs `replicas` replicas
    /// online for any grant to go out.
    pub fn replica_acks(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replica_acks = Some(ReplicaAcks { replicas, timeout });
        self
    }

    /// Fair mode: waiters get the lock in the order they first asked for
    /// it, across processes (see the [module docs](super#fair-mode)). A
    /// release grants the lock to the first waiter still alive; a waiter that
    /// does not claim its grant within `grant_timeout` (its process died or
    /// stalled) loses its turn, so a dead waiter holds the key up for at most
    /// that long. Waiters ask again every third of it to keep their place.
    /// Off by default (whoever asks first after a release gets the lock).
    /// `grant_timeout` must be at least 50 ms, or `connect` refuses it.
    pub fn fair(mut self, grant_timeout: Duration) -> Self {
        self.fair = Some(grant_timeout);
        self
    }

    /// Whether a lease nobody waits for is released and renewed by the
    /// server's own owner-checked commands (`DELEX`, `DELIFEQ`,
    /// `SET … IFEQ`) rather than a script (default
    /// [`OwnerChecks::Detect`]: when every server that takes writes has
    /// them). See [`OwnerChecks`].
    pub fn owner_checks(mut self, owner_checks: OwnerChecks) -> Self {
        self.owner_checks = owner_checks;
        self
    }

    tls_setters!("a `rediss://` server");

    /// Uses `tls` for a `rediss://` connection (a Redlock node's, say).
    pub(crate) fn with_tls(mut self, tls: TlsSettings) -> Self {
        self.tls = tls;
        self
    }

    /// Connects (one command connection, reconnected as needed; the
    /// subscriber connection is made on the first wait). For a
    /// `redis+sentinel://` URL, the connection goes to the master the
    /// Sentinels name, and follows it after a failover.
    ///
    /// # Errors
    ///
    /// [`LockError::Connect`] naming the URL (password redacted), as
    /// [`LockRegistry::redis`](crate::LockRegistry::redis) gives, when the URL is invalid or the server
    /// cannot be reached or refuses the credentials. Never contains the
    /// password.
    pub async fn connect(self) -> Result<RedisStore, LockError> {
        let shown = redact(&self.url);
        if let Err(reason) = self.check() {
            return Err(invalid_settings(shown, reason));
        }
        connect::opened("redis", shown, self.connect_store()).await
    }

    /// Whether the settings can work together: what makes them unusable.
    fn check(&self) -> Result<(), String> {
        check_tls(&self.url, self.tls.is_set(), cfg!(feature = "redis-tls"))?;
        if let Some(acks) = self.replica_acks
            && acks.timeout >= self.timeouts.response
        {
            // The reply would come too late: the grant's fate unknown, and
            // not undone.
            return Err(format!(
                "the replica_acks timeout ({:?}) must be shorter than the response timeout ({:?})",
                acks.timeout, self.timeouts.response
            ));
        }
        self.fair.map_or(Ok(()), check_grant_timeout)
    }

    /// [`connect`](Self::connect), with the store's own error.
    pub(crate) async fn connect_store(self) -> Result<RedisStore, StoreError> {
        self.check()?;
        let settings = Settings {
            response: self.timeouts.response,
            retries: u32::try_from(self.connection_retries).unwrap_or(u32::MAX),
        };
        let checks = Arc::new(Checks::new(self.owner_checks));
        let conn = RedisConnection::connect(
            &self.url,
            &self.tls,
            settings,
            self.timeouts.connection,
            checks.clone(),
        )
        .await?;
        let subscriber =
            Subscriber::new(Source::Connection(conn.clone()), self.timeouts.connection);
        Ok(RedisStore::new(
            Commands {
                conn,
                fencing: self.fencing,
                replica_acks: self.replica_acks,
                fair: self.fair,
                checks,
            },
            subscriber,
            redact(&self.url),
        ))
    }
}

/// The `tls_ca` and `tls_identity` setters of a builder whose `tls` field
/// is a [`TlsSettings`], for `$whom` (as the docs name the servers).
macro_rules! tls_setters {
    ($whom:literal) => {
        #[doc = concat!("Trusts the CA (or CAs) in `ca_pem` for the certificate of ", $whom, ", in place of the system's roots: for a private CA or a self-signed server. A server's certificate must name the host of its URL.")]
        #[cfg(feature = "redis-tls")]
        pub fn tls_ca(mut self, ca_pem: impl AsRef<[u8]>) -> Self {
            self.tls.ca = Some(ca_pem.as_ref().to_vec());
            self
        }

        #[doc = concat!("Shows the certificate chain `cert_pem` with its private key `key_pem` to ", $whom, " when it asks for client certificates (`tls-auth-clients yes`).")]
        #[cfg(feature = "redis-tls")]
        pub fn tls_identity(mut self, cert_pem: impl AsRef<[u8]>, key_pem: impl AsRef<[u8]>) -> Self {
            self.tls.identity = Some((cert_pem.as_ref().to_vec(), key_pem.as_ref().to_vec()));
            self
        }
    };
}

pub(crate) use tls_setters;

/// Refuses a `rediss://` URL without the TLS feature (`built_with_tls`),
/// and certificates (`certificates`) the URL would not use.
fn check_tls(url: &str, certificates: bool, built_with_tls: bool) -> Result<(), String> {
    let tls_url = ["rediss://", "rediss+cluster://", "rediss+sentinel://"]
        .iter()
        .any(|scheme| url.starts_with(scheme));
    if tls_url && !built_with_tls {
        return Err(
            "a rediss:// URL needs lock-runtime's `redis-tls` feature (TLS through rustls)"
                .to_owned(),
        );
    }
    if certificates && !tls_url {
        return Err(
            "TLS certificates are set but the URL is not rediss:// (nor rediss+cluster://, rediss+sentinel://): the connection would not use them"
                .to_owned(),
        );
    }
    Ok(())
}

/// Refuses a fair mode's grant timeout too short for waiters to keep their
/// place.
pub(super) fn check_grant_timeout(grant_timeout: Duration) -> Result<(), String> {
    if grant_timeout < Duration::from_millis(50) {
        return Err(format!(
            "the fair mode's grant timeout ({grant_timeout:?}) must be at least 50 ms"
        ));
    }
    Ok(())
}

/// Settings of the Redis store at `address` that cannot work, for `reason`.
pub(super) fn invalid_settings(address: String, reason: String) -> LockError {
    LockError::InvalidSettings {
        store: "redis",
        address,
        reason,
    }
}

impl RedisStore {
    /// Starts configuring a store for `url`: `redis://[:password@]host:port[/db]`
    /// for one server (`rediss://` for TLS, with the `redis-tls` feature; see
    /// the [module docs](super#tls)),
    /// `redis+cluster://[:password@]host:port[,host:port...]` for a Redis
    /// Cluster (any of its nodes; `rediss+cluster://` for TLS), or `redis+sentinel://[:password@]host:port[,host:port...]/master-name[/db]`
    /// for the master of a Sentinel group (the password is the master's;
    /// `rediss+sentinel://` for TLS to the Sentinels and the master, with
    /// the same certificates).
    pub fn builder(url: &str) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url: url.to_owned(),
            fencing: Fencing::default(),
            timeouts: Timeouts::new(Duration::from_secs(2), Duration::from_secs(1)),
            connection_retries: 2,
            replica_acks: None,
            fair: None,
            tls: TlsSettings::default(),
            owner_checks: OwnerChecks::default(),
        }
    }

    /// Connects with the default settings: `RedisStore::builder(url).connect()`.
    ///
    /// # Errors
    ///
    /// As [`RedisStoreBuilder::connect`].
    pub async fn connect(url: &str) -> Result<RedisStore, LockError> {
        RedisStore::builder(url).connect().await
    }
}

#[cfg(test)]
mod tests {
    use super::check_tls;

    #[test]
    fn tls_needs_the_feature_and_certificates_need_tls() {
        let tls = "rediss://127.0.0.1:6380";
        let plain = "redis://127.0.0.1:6379";
        assert!(check_tls(tls, false, true).is_ok());
        assert!(check_tls(tls, true, true).is_ok());
        assert!(check_tls("rediss+cluster://a:1,b:2", true, true).is_ok());
        assert!(check_tls("rediss+cluster://a:1", false, false).is_err());
        assert!(check_tls(plain, false, false).is_ok());
        let no_feature = check_tls(tls, false, false).unwrap_err();
        assert!(no_feature.contains("`redis-tls` feature"), "{no_feature}");
        let unused = check_tls(plain, true, true).unwrap_err();
        assert!(unused.contains("not rediss://"), "{unused}");
        let sentinel = "rediss+sentinel://127.0.0.1:26379/main";
        assert!(check_tls(sentinel, true, true).is_ok());
        assert!(check_tls(sentinel, false, false).is_err());
        let plain_sentinel = check_tls("redis+sentinel://127.0.0.1:26379/main", true, true);
        assert!(plain_sentinel.unwrap_err().contains("not rediss://"));
    }
}
