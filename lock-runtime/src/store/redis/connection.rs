//! The command connection of a Redis store: to one server, to the nodes of
//! a Redis Cluster, or to the master that a set of Sentinels names, found
//! again after a failover.
//!
//! The `redis` crate's own Sentinel client finds the master once; it does not
//! follow a failover. This connection follows the Sentinels' guidelines for
//! clients: it asks them for the master, connects, checks the server says it
//! is a master (`ROLE`) and that they still name it, and uses that
//! connection until a command on it fails in a way a failover explains (the
//! master refused or dropped the connection, answered `READONLY` because it
//! was demoted, or did not answer); the next command then asks the Sentinels
//! again. The connection is never reopened to the same address behind the
//! Sentinels' back: a failed master restarted after the failover says it is
//! a master until they demote it, and locks taken there would not be seen
//! by anyone on the real one. Nor is it kept once they name another: a
//! master they moved away from while it was up (a failover they were asked
//! for, or one they started on a false alarm) takes writes without an
//! error until they demote it, seconds later, so every [`SCAN_EVERY`] a
//! task asks a Sentinel which master it names and drops a connection to
//! any other; holders' next renewals then reach the master everyone else
//! uses.

use std::fmt;
use std::pin::pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use ::redis::aio::{ConnectionLike, MultiplexedConnection};
use ::redis::cluster::ClusterClientBuilder;
use ::redis::cluster_async::ClusterConnection;
use ::redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
use ::redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use ::redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionAddr, Pipeline, RedisError, RedisFuture,
    RedisResult, Value,
};
use tokio::sync::Mutex as AsyncMutex;
use tokio::time::Instant;

use super::deadlines::Deadlines;
use super::owner_checks::{self, Checks, OwnerChecks};
use super::scripts;
use super::server::{Live, Server};
use super::urls::{SentinelUrl, cluster_nodes};
use crate::error::StoreError;
use crate::store::common::lock;

/// The shortest pause between two questions to the Sentinels.
const RESOLVE_EVERY: Duration = Duration::from_millis(100);

/// How often a Sentinel group's connection asks which master the
/// Sentinels name, to leave one they moved away from (as Redisson's
/// Sentinel scan does, every second by default).
const SCAN_EVERY: Duration = Duration::from_secs(1);

/// The connection a [`RedisStore`](super::RedisStore) sends its commands
/// on: to one server (`redis://`), to a Redis Cluster
/// (`redis+cluster://`), or to the current master of a Sentinel group
/// (`redis+sentinel://`); each over TLS with a `rediss` scheme. Cheap to
/// clone; clones share it.
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
    /// This handle's copy of [`Shared::server`]'s connection.
    Server(Live),
    Cluster(ClusterConnection),
}

struct Shared {
    /// A Sentinel group's connection to its current master (`None` until
    /// it is found, and again once a command on it failed in a way a
    /// failover explains), and the client of the server, of the current
    /// master, or of a cluster's first node (which the subscriber uses: the
    /// cluster bus carries every node's publications).
    current: Mutex<(Option<MultiplexedConnection>, Client)>,
    /// Set for a Sentinel group.
    sentinel: Option<Sentinel>,
    /// The store's owner-checked commands, detected again on each new
    /// master.
    checks: Arc<Checks>,
    /// The response timeout of the commands to a server or a Sentinel
    /// group's master (a cluster's connection keeps its own).
    deadlines: Arc<Deadlines>,
    /// Set for one server: the connection in use.
    server: Option<Server>,
}

struct Sentinel {
    /// Held while the master is looked for, so callers wait for one look.
    client: AsyncMutex<SentinelClient>,
    /// The master's name, as the Sentinels know it.
    master: String,
    config: AsyncConnectionConfig,
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
    pub(super) async fn client(&self) -> Result<Client, StoreError> {
        Ok(match self {
            Source::Client(client) => (**client).clone(),
            Source::Connection(connection) => connection.client(),
        })
    }
}

/// The certificates a `rediss://` connection trusts and shows: the
/// system's roots and no client certificate unless set.
#[derive(Clone, Default)]
pub(crate) struct TlsSettings {
    /// PEM: the CA (or CAs) the server's certificate must chain to.
    pub(crate) ca: Option<Vec<u8>>,
    /// PEM: the client's certificate chain and private key.
    pub(crate) identity: Option<(Vec<u8>, Vec<u8>)>,
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
            crate::store::common::tls::install_crypto_provider();
            if self.is_set() {
                return Client::build_with_tls(url, self.certificates());
            }
        }
        Client::open(url)
    }

    /// A Sentinel client: TLS to the Sentinels and to the servers they
    /// name when `tls`, with these certificates for both.
    fn sentinel_client(
        &self,
        mut builder: SentinelClientBuilder,
        tls: bool,
    ) -> Result<SentinelClient, RedisError> {
        if tls {
            builder = builder.set_client_to_redis_tls_mode(::redis::TlsMode::Secure);
            #[cfg(feature = "redis-tls")]
            {
                crate::store::common::tls::install_crypto_provider();
                if self.is_set() {
                    builder = builder
                        .set_client_to_sentinel_certificates(self.certificates())
                        .set_client_to_redis_certificates(self.certificates());
                }
            }
        }
        builder.build()
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
    /// Sentinels name, and checks it answers `PING`. A `rediss` scheme is
    /// TLS to every server, with `tls`'s certificates. When `checks`
    /// detects, asks the server (each primary, each new master) which
    /// owner-checked commands it has.
    pub(super) async fn connect(
        url: &str,
        tls: &TlsSettings,
        settings: Settings,
        timeout: Duration,
        checks: Arc<Checks>,
    ) -> Result<RedisConnection, StoreError> {
        if let Some(nodes) = cluster_nodes(url)? {
            return RedisConnection::cluster(nodes, tls, settings, timeout, checks).await;
        }
        // Commands are bounded by `Deadlines`, not by a timer each.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(None);
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
                let mut sentinel = tls.sentinel_client(builder, spec.tls)?;
                let master = tokio::time::timeout(timeout * 2, sentinel.async_get_client())
                    .await
                    .map_err(|_| "no Sentinel named the master in time")??;
                let sentinel = Sentinel {
                    client: AsyncMutex::new(sentinel),
                    master: spec.master.clone(),
                    config: config.clone(),
                    timeout,
                    last_asked: Mutex::new(None),
                };
                (master, Some(sentinel))
            }
        };
        let deadlines = Deadlines::new(settings.response);
        if sentinel.is_some() {
            let connection = RedisConnection {
                direct: None,
                shared: Arc::new(Shared {
                    current: Mutex::new((None, client)),
                    sentinel,
                    checks,
                    deadlines,
                    server: None,
                }),
            };
            // Surfaces a missing password or a wrong database now, not at
            // the first lock.
            connection.master().await?;
            tokio::spawn(scan(Arc::downgrade(&connection.shared)));
            return Ok(connection);
        }
        let retries = usize::try_from(settings.retries).unwrap_or(usize::MAX);
        let (server, live) = Server::connect(client.clone(), config, retries).await?;
        let mut connection = RedisConnection {
            direct: Some(Direct::Server(live)),
            shared: Arc::new(Shared {
                current: Mutex::new((None, client)),
                sentinel: None,
                checks,
                deadlines,
                server: Some(server),
            }),
        };
        // Surface a missing password or a wrong database now, not at the first lock.
        connection
            .send(&::redis::cmd("PING"))
            .await?
            .extract_error()?;
        let mut asking = connection.clone();
        detect(&connection.shared.checks, || {
            owner_checks::QUESTION.query_async(&mut asking)
        })
        .await;
        scripts::load(&connection).await;
        Ok(connection)
    }

    /// Connects to the cluster that `nodes` (`redis://` or `rediss://`
    /// URLs) belong to, and checks every primary answers `PING`.
    async fn cluster(
        nodes: Vec<String>,
        tls: &TlsSettings,
        config: Settings,
        timeout: Duration,
        checks: Arc<Checks>,
    ) -> Result<RedisConnection, StoreError> {
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
        let primaries = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
        detect(&checks, || {
            conn.route_command(owner_checks::QUESTION.clone(), primaries)
        })
        .await;
        scripts::load(&conn).await;
        Ok(RedisConnection {
            direct: Some(Direct::Cluster(conn)),
            shared: Arc::new(Shared {
                current: Mutex::new((None, pubsub)),
                sentinel: None,
                checks,
                deadlines: Deadlines::new(config.response),
                server: None,
            }),
        })
    }

    /// A Sentinel group's connection to its master, if it has one.
    fn current(&self) -> Option<MultiplexedConnection> {
        lock(&self.shared.current).0.clone()
    }

    /// The client of the server, the current master or the cluster's first
    /// node.
    fn client(&self) -> Client {
        lock(&self.shared.current).1.clone()
    }

    /// A Sentinel group's connection to its current master: the one in use,
    /// or a new one to the master the Sentinels name, once it says it is a
    /// master and they still name it. The Sentinels are asked at most once
    /// per [`RESOLVE_EVERY`]; callers meanwhile wait for that answer.
    async fn master(&self) -> Result<MultiplexedConnection, RedisError> {
        if let Some(conn) = self.current() {
            return Ok(conn);
        }
        let Some(sentinel) = &self.shared.sentinel else {
            return Err(RedisError::from((
                ::redis::ErrorKind::Client,
                "no connection to the master",
            )));
        };
        let mut client = sentinel.client.lock().await;
        // Found by the caller that held the lock before.
        if let Some(conn) = self.current() {
            return Ok(conn);
        }
        let last = *lock(&sentinel.last_asked);
        if let Some(next) = last.map(|at| at + RESOLVE_EVERY) {
            tokio::time::sleep_until(next).await;
        }
        *lock(&sentinel.last_asked) = Some(Instant::now());
        let timed_out = || {
            RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no answer from the Sentinels or the master they name in time",
            ))
        };
        let master = tokio::time::timeout(sentinel.timeout, client.async_get_client())
            .await
            .map_err(|_| timed_out())??;
        let named = master.get_connection_info().addr().to_string();
        let mut conn = tokio::time::timeout(
            sentinel.timeout,
            master.get_multiplexed_async_connection_with_config(&sentinel.config),
        )
        .await
        .map_err(|_| timed_out())??;
        let deadlines = &self.shared.deadlines;
        let role: Vec<Value> = deadlines
            .bound(pin!(::redis::cmd("ROLE").query_async(&mut conn)))
            .await?;
        if !matches!(role.first(), Some(Value::BulkString(role)) if role == b"master") {
            return Err(RedisError::from((
                ::redis::ErrorKind::Client,
                "the server the Sentinels name is not a master yet",
                named,
            )));
        }
        // Asked again after the server said it is a master: a failed master
        // restarted after the Sentinels moved on says so too.
        let again = tokio::time::timeout(sentinel.timeout, client.async_get_client())
            .await
            .map_err(|_| timed_out())??;
        let now = again.get_connection_info().addr().to_string();
        if now != named {
            return Err(RedisError::from((
                ::redis::ErrorKind::Client,
                "the Sentinels named another master meanwhile",
                format!("{named}, then {now}"),
            )));
        }
        detect(&self.shared.checks, || {
            let mut conn = conn.clone();
            async move {
                let answer = pin!(owner_checks::QUESTION.query_async(&mut conn));
                deadlines.bound(answer).await
            }
        })
        .await;
        // A master that stops answering here is asked for again.
        let _ = tokio::time::timeout(deadlines.timeout(), scripts::load(&conn)).await;
        let was = self.client().get_connection_info().addr().to_string();
        if now != was {
            tracing::warn!(from = %was, to = %now, "Redis master changed; following the failover");
        }
        *lock(&self.shared.current) = (Some(conn.clone()), master);
        Ok(conn)
    }

    /// After an error a failover explains, drops the master's connection:
    /// the next command asks the Sentinels again.
    fn forget_master(&self, error: &RedisError) {
        if self.shared.sentinel.is_some() && suggests_failover(error) {
            lock(&self.shared.current).0 = None;
        }
    }
}

/// A Sentinel group's scan: every [`SCAN_EVERY`], while the store lives,
/// asks a Sentinel which master it names, and drops the connection in use
/// if it is to another server (the next command asks them all again, and
/// checks). A Sentinel that does not answer is left for the next one.
async fn scan(shared: Weak<Shared>) {
    let mut asking: Option<MultiplexedConnection> = None;
    loop {
        tokio::time::sleep(SCAN_EVERY).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let Some(sentinel) = &shared.sentinel else {
            return;
        };
        // Nothing to leave while no connection is in use: the next
        // command asks the Sentinels anyway.
        let used = {
            let current = lock(&shared.current);
            current.0.as_ref().and_then(|_| address(&current.1))
        };
        let Some(used) = used else {
            continue;
        };
        let named = tokio::time::timeout(sentinel.timeout, sentinel.named(&mut asking)).await;
        let Ok(Ok(Some(named))) = named else {
            asking = None;
            continue;
        };
        if used != named {
            let mut current = lock(&shared.current);
            // Unless a command already moved it meanwhile.
            if address(&current.1).is_some_and(|now| now != named) {
                tracing::warn!(master = %format!("{}:{}", named.0, named.1),
                    "the Sentinels name another Redis master; leaving the one in use");
                current.0 = None;
            }
        }
    }
}

impl Sentinel {
    /// The address of the master a Sentinel names, on `asking` (opened to
    /// the first Sentinel that answers, when `None`).
    async fn named(
        &self,
        asking: &mut Option<MultiplexedConnection>,
    ) -> Result<Option<(String, u16)>, RedisError> {
        let conn = match asking {
            Some(conn) => conn,
            None => {
                let client = self.client.lock().await.async_get_sentinel_client().await?;
                asking.insert(
                    client
                        .get_multiplexed_async_connection_with_config(&self.config)
                        .await?,
                )
            }
        };
        let named: Option<(String, u16)> = ::redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.master)
            .query_async(conn)
            .await?;
        Ok(named)
    }
}

/// With `checks` detecting, sets them from the answer `ask` gets to
/// [`owner_checks::QUESTION`]; scripts if it gets none (`COMMAND`
/// refused, say).
async fn detect<F>(checks: &Checks, ask: impl FnOnce() -> F)
where
    F: Future<Output = Result<Value, RedisError>>,
{
    if !checks.detects() {
        return;
    }
    let offered = match ask().await {
        Ok(answer) => owner_checks::offered(&answer),
        Err(error) => {
            tracing::debug!(%error, "the Redis server did not say which owner-checked commands it has; using scripts");
            OwnerChecks::Scripts
        }
    };
    checks.set(offered);
}

/// The host and port of a server's client.
fn address(client: &Client) -> Option<(String, u16)> {
    match client.get_connection_info().addr() {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            Some((host.clone(), *port))
        }
        _ => None,
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

impl RedisConnection {
    /// Sends `cmd` and returns its reply. On one server's connection the
    /// command's future is awaited in place, not boxed as every
    /// [`ConnectionLike`] call's is: a command costs one allocation the
    /// size of that future less.
    pub(super) async fn send(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        let shared = &*self.shared;
        let (Some(Direct::Server(live)), Some(server)) = (&mut self.direct, &shared.server) else {
            return self.req_packed_command(cmd).await;
        };
        if !server.is_current(live) {
            *live = server.current().await?;
        }
        let answer = shared
            .deadlines
            .bound(pin!(live.conn.send_packed_command(cmd)))
            .await;
        if let Err(err) = &answer {
            server.failed(live, err);
        }
        answer
    }

    /// [`send`](Self::send) for a pipeline.
    async fn send_pipeline(
        &mut self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let shared = &*self.shared;
        let (Some(Direct::Server(live)), Some(server)) = (&mut self.direct, &shared.server) else {
            return self.req_packed_commands(pipeline, offset, count).await;
        };
        if !server.is_current(live) {
            *live = server.current().await?;
        }
        let answer = {
            let answer = pin!(live.conn.send_packed_commands(pipeline, offset, count));
            shared.deadlines.bound(answer).await
        };
        if let Err(err) = &answer {
            server.failed(live, err);
        }
        answer
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        // `match &mut self.direct { .., _ => async { self .. } }` would
        // keep `self` borrowed on the other paths too (the borrow checker's
        // known limit with conditional returns of borrows).
        match &self.direct {
            Some(Direct::Server(_)) => Box::pin(self.send(cmd)),
            Some(Direct::Cluster(_)) => {
                let Some(Direct::Cluster(conn)) = &mut self.direct else {
                    unreachable!("matched a cluster's connection above");
                };
                conn.req_packed_command(cmd)
            }
            None => Box::pin(async move {
                let result = match self.master().await {
                    Ok(mut conn) => {
                        let deadlines = &self.shared.deadlines;
                        deadlines.bound(pin!(conn.send_packed_command(cmd))).await
                    }
                    Err(error) => Err(error),
                };
                if let Err(error) = &result {
                    self.forget_master(error);
                }
                result
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        // As in `req_packed_command`.
        match &self.direct {
            Some(Direct::Server(_)) => Box::pin(self.send_pipeline(pipeline, offset, count)),
            Some(Direct::Cluster(_)) => {
                let Some(Direct::Cluster(conn)) = &mut self.direct else {
                    unreachable!("matched a cluster's connection above");
                };
                conn.req_packed_commands(pipeline, offset, count)
            }
            None => Box::pin(async move {
                let result = match self.master().await {
                    Ok(mut conn) => {
                        let deadlines = &self.shared.deadlines;
                        let answer = pin!(conn.send_packed_commands(pipeline, offset, count));
                        deadlines.bound(answer).await
                    }
                    Err(error) => Err(error),
                };
                if let Err(error) = &result {
                    self.forget_master(error);
                }
                result
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.direct {
            Some(Direct::Server(live)) => live.conn.get_db(),
            Some(Direct::Cluster(conn)) => conn.get_db(),
            None => self.current().map_or(0, |conn| conn.get_db()),
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

/// The settings a connection takes from the builder.
#[derive(Clone, Copy, Debug)]
pub(super) struct Settings {
    /// How long a command may wait for its answer.
    pub(super) response: Duration,
    /// The store's `connection_retries`: how many more times connecting
    /// is tried after it fails (and how many times a cluster's connection
    /// sends a command again).
    pub(super) retries: u32,
}
