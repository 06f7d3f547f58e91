//! The command connection of a Redis store: to one server, to the nodes of
//! a Redis Cluster, or to the master that a set of Sentinels names, found
//! again after a failover.
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
use ::redis::cluster::ClusterClientBuilder;
use ::redis::cluster_async::ClusterConnection;
use ::redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use ::redis::{Client, Cmd, ConnectionAddr, Pipeline, RedisError, RedisFuture, Value};
use tokio::sync::Mutex as AsyncMutex;
use tokio::time::Instant;

use crate::error::BackendError;

/// The shortest pause between two questions to the Sentinels.
const RESOLVE_EVERY: Duration = Duration::from_millis(100);

/// The connection a [`RedisStore`](super::RedisStore) sends its commands
/// on: to one server (`redis://`), to a Redis Cluster
/// (`redis+cluster://`), or to the current master of a Sentinel group
/// (`redis+sentinel://`). Cheap to clone; clones share it.
#[derive(Clone)]
pub struct RedisConnection {
    /// The server's or the cluster's connection, used directly: no lock,
    /// no second future on the path of every command. `None` for a
    /// Sentinel group, whose master may change.
    direct: Option<Direct>,
    shared: Arc<Shared>,
}

/// A connection that never moves.
#[derive(Clone)]
enum Direct {
    Server(ConnectionManager),
    Cluster(ClusterConnection),
}

struct Shared {
    /// The connection to the server or to the current master, with its
    /// client (for a cluster: the client of its first node, which the
    /// subscriber uses: the cluster bus carries every node's publications).
    current: Mutex<(Option<ConnectionManager>, Client)>,
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
            Source::Connection(connection) => connection.client(),
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
                return Client::build_with_tls(url, self.certificates());
            }
        }
        Client::open(url)
    }

    /// The certificates, as the `redis` crate takes them.
    #[cfg(feature = "redis-tls")]
    fn certificates(&self) -> ::redis::TlsCertificates {
        ::redis::TlsCertificates {
            client_tls: self.identity.clone().map(|(client_cert, client_key)| {
                ::redis::ClientTlsConfig {
                    client_cert,
                    client_key,
                }
            }),
            root_cert: self.ca.clone(),
        }
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
    /// Connects to the server at `url`, to the cluster
    /// (`redis+cluster://`), or (`redis+sentinel://`) to the master the
    /// Sentinels name, and checks it answers `PING`.
    pub(super) async fn connect(
        url: &str,
        tls: &TlsSettings,
        config: ConnectionManagerConfig,
        cluster: ClusterSettings,
        timeout: Duration,
    ) -> Result<RedisConnection, BackendError> {
        if let Some(nodes) = cluster_nodes(url)? {
            return RedisConnection::cluster(nodes, tls, cluster, timeout).await;
        }
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
        let direct = sentinel.is_none().then(|| Direct::Server(conn.clone()));
        Ok(RedisConnection {
            direct,
            shared: Arc::new(Shared {
                current: Mutex::new((Some(conn), client)),
                sentinel,
            }),
        })
    }

    /// Connects to the cluster that `nodes` (`redis://` or `rediss://`
    /// URLs) belong to, and checks every primary answers `PING`.
    async fn cluster(
        nodes: Vec<String>,
        tls: &TlsSettings,
        config: ClusterSettings,
        timeout: Duration,
    ) -> Result<RedisConnection, BackendError> {
        let pubsub = tls.client(&nodes[0])?;
        let builder = ClusterClientBuilder::new(nodes)
            .connection_timeout(timeout)
            .response_timeout(config.response)
            .retries(config.retries);
        #[cfg(feature = "redis-tls")]
        let builder = match tls.is_set() {
            true => builder.certs(tls.certificates()),
            false => builder,
        };
        let client = builder.build()?;
        let mut conn = tokio::time::timeout(timeout * 2, client.get_async_connection())
            .await
            .map_err(|_| "no node of the cluster answered in time")??;
        ::redis::cmd("PING").query_async::<()>(&mut conn).await?;
        Ok(RedisConnection {
            direct: Some(Direct::Cluster(conn)),
            shared: Arc::new(Shared {
                current: Mutex::new((None, pubsub)),
                sentinel: None,
            }),
        })
    }

    fn current(&self) -> (Option<ConnectionManager>, Client) {
        lock(&self.shared.current).clone()
    }

    /// The client of the server, the current master or the cluster's first
    /// node.
    fn client(&self) -> Client {
        lock(&self.shared.current).1.clone()
    }

    /// The current master's connection (a Sentinel group's).
    fn master(&self) -> Result<ConnectionManager, RedisError> {
        self.current().0.ok_or_else(|| {
            RedisError::from((::redis::ErrorKind::Client, "no connection to the master"))
        })
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
        let was = self.client().get_connection_info().addr().to_string();
        if now == was {
            return;
        }
        match master
            .get_connection_manager_with_config(sentinel.config.clone())
            .await
        {
            Ok(conn) => {
                tracing::warn!(from = %was, to = %now, "Redis master changed; following the failover");
                *lock(&self.shared.current) = (Some(conn), master);
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
        // `match &mut self.direct { .., None => async { self .. } }` would
        // keep `self` borrowed on the `None` path too (the borrow checker's
        // known limit with conditional returns of borrows).
        #[allow(clippy::unnecessary_unwrap)]
        if self.direct.is_some() {
            return match self.direct.as_mut().expect("checked above") {
                Direct::Server(conn) => conn.req_packed_command(cmd),
                Direct::Cluster(conn) => conn.req_packed_command(cmd),
            };
        }
        Box::pin(async move {
            let result = match self.master() {
                Ok(mut conn) => conn.req_packed_command(cmd).await,
                Err(error) => Err(error),
            };
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
            return match self.direct.as_mut().expect("checked above") {
                Direct::Server(conn) => conn.req_packed_commands(pipeline, offset, count),
                Direct::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
            };
        }
        Box::pin(async move {
            let result = match self.master() {
                Ok(mut conn) => conn.req_packed_commands(pipeline, offset, count).await,
                Err(error) => Err(error),
            };
            if let Err(error) = &result {
                self.follow_failover(error).await;
            }
            result
        })
    }

    fn get_db(&self) -> i64 {
        match &self.direct {
            Some(Direct::Server(conn)) => conn.get_db(),
            Some(Direct::Cluster(conn)) => conn.get_db(),
            None => self.current().0.map_or(0, |conn| conn.get_db()),
        }
    }
}

impl fmt::Debug for RedisConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let server = self.client().get_connection_info().addr().to_string();
        f.debug_struct("RedisConnection")
            .field("server", &server)
            .field("cluster", &matches!(self.direct, Some(Direct::Cluster(_))))
            .field("sentinel", &self.shared.sentinel.is_some())
            .finish()
    }
}

/// The settings a cluster connection takes from the builder.
#[derive(Clone, Copy, Debug)]
pub(super) struct ClusterSettings {
    pub(super) response: Duration,
    pub(super) retries: u32,
}

/// The node URLs of `redis+cluster://[[user]:password@]host:port[,host:port...]`
/// (`rediss+cluster://` for TLS): `redis://[..@]host:port` each, the
/// credentials on every one. `None` for a URL of another scheme.
fn cluster_nodes(url: &str) -> Result<Option<Vec<String>>, BackendError> {
    let (scheme, rest) = if let Some(rest) = url.strip_prefix("redis+cluster://") {
        ("redis", rest)
    } else if let Some(rest) = url.strip_prefix("rediss+cluster://") {
        ("rediss", rest)
    } else {
        return Ok(None);
    };
    let invalid = |why: &str| -> BackendError {
        format!(
            "invalid Redis Cluster URL `{}`: {why}; expected redis+cluster://host:port[,host:port...]",
            crate::store::support::redact::redact(url)
        )
        .into()
    };
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.contains('/') {
        return Err(invalid("a path (a cluster has only database 0)"));
    }
    let (userinfo, hosts) = match rest.rsplit_once('@') {
        Some((userinfo, hosts)) => (format!("{userinfo}@"), hosts),
        None => (String::new(), rest),
    };
    hosts
        .split(',')
        .map(|host| {
            host_port(host, "node").map_err(|why| invalid(&why))?;
            Ok(format!("{scheme}://{userinfo}{host}"))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// The host and port of `host:port` in a URL's list of a `what` (a node,
/// a Sentinel), or what is wrong with it.
fn host_port<'a>(host: &'a str, what: &str) -> Result<(&'a str, u16), String> {
    let (name, port) = host
        .rsplit_once(':')
        .ok_or_else(|| format!("a {what} without a port"))?;
    if name.is_empty() {
        return Err(format!("a {what} without a host"));
    }
    let port = port
        .parse()
        .map_err(|_| "a port that is not a number".to_owned())?;
    Ok((name, port))
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
                let (name, port) = host_port(host, "Sentinel").map_err(|why| invalid(&why))?;
                Ok::<_, BackendError>(ConnectionAddr::Tcp(name.to_owned(), port))
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
    fn cluster_urls_name_every_node_with_the_credentials() {
        assert_eq!(
            cluster_nodes("redis+cluster://:pw@a:1,b:2/").unwrap(),
            Some(vec![
                "redis://:pw@a:1".to_owned(),
                "redis://:pw@b:2".to_owned()
            ])
        );
        assert_eq!(
            cluster_nodes("rediss+cluster://a:1").unwrap(),
            Some(vec!["rediss://a:1".to_owned()])
        );
        assert_eq!(cluster_nodes("redis://a:1").unwrap(), None);
        for bad in [
            "redis+cluster://:secret@a",
            "redis+cluster://:secret@a:1/2",
            "redis+cluster://:secret@:1",
            "redis+cluster://:secret@a:1,b:x",
        ] {
            let err = cluster_nodes(bad).unwrap_err().to_string();
            assert!(err.starts_with("invalid Redis Cluster URL"), "{err}");
            assert!(!err.contains("secret"), "{err}");
        }
    }

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
