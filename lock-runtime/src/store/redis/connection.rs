//! The command connection of a Redis store: to one server, or to the master
//! that a set of Sentinels names, found again after a failover.
//!
//! The `redis` crate's own Sentinel client finds the master once; it does not
//! follow a failover. This connection asks the Sentinels again whenever a
//! command fails in a way a failover explains (the master refused or dropped
//! the connection, answered `READONLY` because it was demoted, or did not
//! answer), and moves to the new master when they name one.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use ::redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use ::redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use ::redis::{Client, Cmd, ConnectionAddr, Pipeline, RedisError, RedisFuture, Value};
use tokio::sync::Mutex as AsyncMutex;
use tokio::time::Instant;

use crate::error::BackendError;

/// The shortest pause between two questions to the Sentinels.
const RESOLVE_EVERY: Duration = Duration::from_millis(100);

/// The connection a [`RedisStore`](super::RedisStore) sends its commands
/// on: to one server (`redis://`), or to the current master of a Sentinel
/// group (`redis+sentinel://`). Cheap to clone; clones share it.
#[derive(Clone)]
pub struct RedisConnection {
    /// The plain server's connection, used directly: no lock, no second
    /// future on the path of every command. Without its client, whose
    /// strings a clone would copy: every command clones the connection.
    direct: Option<ConnectionManager>,
    shared: Arc<Shared>,
}

struct Shared {
    /// The connection to the server, or to the current master.
    current: Mutex<(ConnectionManager, Client)>,
    /// Set for a Sentinel group.
    sentinel: Option<Sentinel>,
}

struct Sentinel {
    client: AsyncMutex<SentinelClient>,
    config: ConnectionManagerConfig,
    timeout: Duration,
    last_asked: Mutex<Option<Instant>>,
}

/// Where the subscriber connects: a given client, or the command
/// connection's current server.
pub(super) enum Source {
    Client(Box<Client>),
    Connection(RedisConnection),
}

impl Source {
    pub(super) async fn client(&self) -> Result<Client, BackendError> {
        Ok(match self {
            Source::Client(client) => (**client).clone(),
            Source::Connection(connection) => connection.current().1,
        })
    }
}

/// The certificates a `rediss://` connection trusts and shows: the
/// system's roots and no client certificate unless set.
#[derive(Clone, Default)]
pub(super) struct TlsSettings {
    /// PEM: the CA (or CAs) the server's certificate must chain to.
    pub(super) ca: Option<Vec<u8>>,
    /// PEM: the client's certificate chain and private key.
    pub(super) identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsSettings {
    /// Whether anything other than the defaults is set.
    pub(super) fn is_set(&self) -> bool {
        self.ca.is_some() || self.identity.is_some()
    }

    /// A client for the server at `url` with these settings.
    pub(super) fn client(&self, url: &str) -> Result<Client, RedisError> {
        #[cfg(feature = "redis-tls")]
        if url.starts_with("rediss://") {
            // rustls needs a process-wide provider; one the application
            // installed stays.
            if rustls::crypto::CryptoProvider::get_default().is_none() {
                let _ = rustls::crypto::ring::default_provider().install_default();
            }
            if self.is_set() {
                let certificates = ::redis::TlsCertificates {
                    client_tls: self.identity.clone().map(|(client_cert, client_key)| {
                        ::redis::ClientTlsConfig {
                            client_cert,
                            client_key,
                        }
                    }),
                    root_cert: self.ca.clone(),
                };
                return Client::build_with_tls(url, certificates);
            }
        }
        Client::open(url)
    }
}

impl fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Certificates and keys are never printed.
        f.debug_struct("TlsSettings")
            .field("ca", &self.ca.is_some())
            .field("identity", &self.identity.is_some())
            .finish()
    }
}

impl RedisConnection {
    /// Connects to the server at `url`, or (`redis+sentinel://`) to the
    /// master the Sentinels name, and checks it answers `PING`.
    pub(super) async fn connect(
        url: &str,
        tls: &TlsSettings,
        config: ConnectionManagerConfig,
        timeout: Duration,
    ) -> Result<RedisConnection, BackendError> {
        let (client, sentinel) = match SentinelUrl::parse(url)? {
            None => (tls.client(url)?, None),
            Some(spec) => {
                let mut builder = SentinelClientBuilder::new(
                    spec.sentinels,
                    &spec.master,
                    SentinelServerType::Master,
                )?
                .set_client_to_redis_db(spec.db);
                if let Some(password) = &spec.password {
                    builder = builder.set_client_to_redis_password(password);
                }
                if let Some(username) = &spec.username {
                    builder = builder.set_client_to_redis_username(username);
                }
                let mut sentinel = builder.build()?;
                let master = tokio::time::timeout(timeout * 2, sentinel.async_get_client())
                    .await
                    .map_err(|_| "no Sentinel named the master in time")??;
                let sentinel = Sentinel {
                    client: AsyncMutex::new(sentinel),
                    config: config.clone(),
                    timeout,
                    last_asked: Mutex::new(Some(Instant::now())),
                };
                (master, Some(sentinel))
            }
        };
        let mut conn = client.get_connection_manager_with_config(config).await?;
        // Surface a missing password or a wrong database now, not at the first lock.
        ::redis::cmd("PING").query_async::<()>(&mut conn).await?;
        let direct = sentinel.is_none().then(|| conn.clone());
        Ok(RedisConnection {
            direct,
            shared: Arc::new(Shared {
                current: Mutex::new((conn, client)),
                sentinel,
            }),
        })
    }

    fn current(&self) -> (ConnectionManager, Client) {
        lock(&self.shared.current).clone()
    }

    /// After an error a failover explains, asks the Sentinels for the master
    /// and moves there if it changed.
    async fn follow_failover(&self, error: &RedisError) {
        let Some(sentinel) = &self.shared.sentinel else {
            return;
        };

        if !suggests_failover(error) {
            return;
        }
        let mut client = sentinel.client.lock().await;
        {
            let mut last = lock(&sentinel.last_asked);
            if last.is_some_and(|at| at.elapsed() < RESOLVE_EVERY) {
                return;
            }
            *last = Some(Instant::now());
        }
        let master = match tokio::time::timeout(sentinel.timeout, client.async_get_client()).await {
            Ok(Ok(master)) => master,
            Ok(Err(error)) => {
                tracing::debug!(%error, "no Sentinel named a master yet");
                return;
            }
            Err(_) => return,
        };
        let now = master.get_connection_info().addr().to_string();
        let was = self.current().1.get_connection_info().addr().to_string();
        if now == was {
            return;
        }
        match master
            .get_connection_manager_with_config(sentinel.config.clone())
            .await
        {
            Ok(conn) => {
                tracing::warn!(from = %was, to = %now, "Redis master changed; following the failover");
                *lock(&self.shared.current) = (conn, master);
            }
            Err(error) => tracing::debug!(%error, master = %now, "cannot reach the new master yet"),
        }
    }
}

/// Whether a failover could explain `error`.
fn suggests_failover(error: &RedisError) -> bool {
    error.is_connection_refusal()
        || error.is_connection_dropped()
        || error.is_io_error()
        || error.is_timeout()
        || matches!(error.code(), Some("READONLY" | "MASTERDOWN"))
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section is one read or assignment: consistent after a panic.
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        // `if let Some(..) = &mut self.direct { return .. }` would keep
        // `self` borrowed on the other path too (the borrow checker's known
        // limit with conditional returns of borrows).
        #[allow(clippy::unnecessary_unwrap)]
        if self.direct.is_some() {
            let conn = self.direct.as_mut().expect("checked above");
            return conn.req_packed_command(cmd);
        }
        Box::pin(async move {
            let (mut conn, _) = self.current();
            let result = conn.req_packed_command(cmd).await;
            if let Err(error) = &result {
                self.follow_failover(error).await;
            }
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        // As in `req_packed_command`.
        #[allow(clippy::unnecessary_unwrap)]
        if self.direct.is_some() {
            let conn = self.direct.as_mut().expect("checked above");
            return conn.req_packed_commands(pipeline, offset, count);
        }
        Box::pin(async move {
            let (mut conn, _) = self.current();
            let result = conn.req_packed_commands(pipeline, offset, count).await;
            if let Err(error) = &result {
                self.follow_failover(error).await;
            }
            result
        })
    }

    fn get_db(&self) -> i64 {
        match &self.direct {
            Some(conn) => conn.get_db(),
            None => self.current().0.get_db(),
        }
    }
}

impl fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let server = self.current().1.get_connection_info().addr().to_string();
        f.debug_struct("RedisConnection")
            .field("server", &server)
            .field("sentinel", &self.shared.sentinel.is_some())
            .finish()
    }
}

/// `redis+sentinel://[[user]:password@]host:port[,host:port...]/master[/db]`.
#[derive(Debug, PartialEq)]
struct SentinelUrl {
    sentinels: Vec<ConnectionAddr>,
    master: String,
    db: i64,
    username: Option<String>,
    password: Option<String>,
}

impl SentinelUrl {
    /// `None` for a URL of another scheme.
    fn parse(url: &str) -> Result<Option<SentinelUrl>, BackendError> {
        let Some(rest) = url.strip_prefix("redis+sentinel://") else {
            return Ok(None);
        };
        let invalid = |why: &str| -> BackendError {
            format!(
                "invalid Sentinel URL `{}`: {why}; expected redis+sentinel://host:port[,host:port...]/master-name[/db]",
                crate::store::support::redact::redact(url)
            )
            .into()
        };
        let (authority, path) = rest
            .split_once('/')
            .ok_or_else(|| invalid("no master name"))?;
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(userinfo) => match userinfo.split_once(':') {
                Some((user, password)) => (
                    (!user.is_empty()).then(|| user.to_owned()),
                    Some(password.to_owned()),
                ),
                None => (Some(userinfo.to_owned()), None),
            },
        };
        let sentinels = hosts
            .split(',')
            .map(|host| {
                let (name, port) = host
                    .rsplit_once(':')
                    .ok_or_else(|| invalid("a Sentinel without a port"))?;
                let port = port
                    .parse()
                    .map_err(|_| invalid("a port that is not a number"))?;
                if name.is_empty() {
                    return Err(invalid("a Sentinel without a host"));
                }
                Ok(ConnectionAddr::Tcp(name.to_owned(), port))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (master, db) = match path.split_once('/') {
            Some((master, db)) => (
                master,
                db.parse()
                    .map_err(|_| invalid("a database that is not a number"))?,
            ),
            None => (path, 0),
        };
        if master.is_empty() {
            return Err(invalid("no master name"));
        }
        Ok(Some(SentinelUrl {
            sentinels,
            master: master.to_owned(),
            db,
            username,
            password,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_urls_name_hosts_master_database_and_password() {
        let url = SentinelUrl::parse("redis+sentinel://:pw@a:1,b:2/shop/3")
            .unwrap()
            .unwrap();
        assert_eq!(
            url,
            SentinelUrl {
                sentinels: vec![
                    ConnectionAddr::Tcp("a".into(), 1),
                    ConnectionAddr::Tcp("b".into(), 2)
                ],
                master: "shop".into(),
                db: 3,
                username: None,
                password: Some("pw".into()),
            }
        );
        assert!(SentinelUrl::parse("redis://a:1").unwrap().is_none());
        for bad in [
            "redis+sentinel://a:1",
            "redis+sentinel://a/shop",
            "redis+sentinel://a:x/shop",
            "redis+sentinel://a:1/",
            "redis+sentinel://:secret@a:1/shop/x",
        ] {
            let err = SentinelUrl::parse(bad).unwrap_err().to_string();
            assert!(err.starts_with("invalid Sentinel URL"), "{err}");
            assert!(!err.contains("secret"), "{err}");
        }
    }
}
