//! One Redis (or anything that speaks to one through the `redis` crate).
//!
//! # Protocol
//!
//! - Acquire is one script, one round trip: `SET key token NX PX ttl`, and on
//!   success `INCR` of the key's fencing counter; when the key is held, the
//!   holder's `PTTL`. It returns a handle that keeps the lock's Redis name
//!   and token.
//! - Renew and release are owner-checked scripts (`GET` = token, then
//!   `PEXPIRE` / `DEL`); never a bare `DEL` or `EXPIRE`. Release publishes a
//!   wake-up on the key's channel; a release that must linger
//!   (`hold_at_least`) shortens the lease instead. A hand-over within the
//!   process moves the lease to a new token and increments the counter, in
//!   one script.
//! - The holder gives up 10 ms plus 0.2 % of the ttl before Redis can expire
//!   the lease: the margin covers clock-rate drift between this host and the
//!   server, the timer's granularity and the time to cancel the body.
//! - Scripts run by `EVALSHA`, and are loaded again after `SCRIPT FLUSH` or a
//!   server restart (`NOSCRIPT`).
//!
//! # Keys
//!
//! A lock on `stock:7` uses the Redis key `lock:{stock:7}`, its fencing
//! counter `lock:{stock:7}:fence` and the channel `lock:{stock:7}:released`.
//! The part between the braces is a hash tag, so on Redis Cluster all of them
//! live in one slot and the scripts work. `%`, `{` and `}` in the lock key are
//! written as `%25`, `%7B` and `%7D`, so a key can neither end the hash tag
//! nor be made to collide with another key's counter; any other bytes
//! (colons, unicode) are kept as they are.
//!
//! # Fencing counters
//!
//! Each key that was ever locked keeps its counter, so tokens strictly
//! increase across holders, processes and lease expiry. A counter costs about
//! 50 bytes of Redis memory plus its name (the lock key plus 13 bytes):
//! `MEMORY USAGE` reports 72 bytes for the counter of `stock:12345`. With many short-lived
//! distinct keys, bound that with [`Fencing::ExpireAfter`] (tokens then
//! increase as long as a key is locked again within that time) or turn the
//! counters off with [`Fencing::Off`] (tokens are then always 0).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use ::redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, PubSubSink, PubSubStream,
};
use ::redis::{Client, Script};
use futures_util::StreamExt;
use once_cell::sync::Lazy;
use tokio::sync::{Mutex as AsyncMutex, watch};
use tokio::task::AbortHandle;

use super::{
    Acquire, AcquireRequest, Backend, BoxFuture, Capabilities, FencingPromise, Lease, LockToken,
    ReleaseWatch, SafetyMargin,
};
use crate::error::{BackendError, LockError};
use crate::registry::LockRegistry;

impl LockRegistry {
    /// A registry over one Redis server (`redis://[:password@]host:port[/db]`),
    /// with the [`RedisBackend`] defaults.
    ///
    /// # Errors
    ///
    /// [`LockError::Backend`] naming the URL (password redacted) when the URL
    /// is invalid or the server cannot be reached or refuses the credentials.
    pub async fn redis(url: &str) -> Result<LockRegistry, LockError> {
        let backend = RedisBackend::builder(url)
            .connect()
            .await
            .map_err(|source| LockError::Backend {
                key: redact(url),
                action: "connect to",
                source,
            })?;
        Ok(LockRegistry::from_backend(Arc::new(backend)))
    }
}

/// `KEYS`: lock, counter. `ARGV`: token, ttl ms, fencing mode (0 off, -1
/// forever, else the counter's expiry in ms).
/// Returns `{1, fencing}` when acquired, `{0, pttl}` when held. Idempotent:
/// run again by the same token (a retry after a dropped reply), it answers
/// as the first run did, so a retry cannot lock the caller out.
const ACQUIRE: &str = r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local mode = tonumber(ARGV[3])
  if mode == 0 then return {1, 0} end
  local fencing = redis.call('INCR', KEYS[2])
  if mode > 0 then redis.call('PEXPIRE', KEYS[2], mode) end
  return {1, fencing}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(redis.call('GET', KEYS[2]) or '0')}
end
return {0, redis.call('PTTL', KEYS[1])}
";

/// `KEYS`: lock. `ARGV`: token, ttl ms. Returns 1 when renewed.
const RENEW: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// `KEYS`: lock. `ARGV`: token, linger ms, channel. Returns 1 when released
/// (or shortened to the linger).
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if tonumber(ARGV[2]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[3], '')
return 1
";

/// `KEYS`: lock, counter. `ARGV`: token, ttl ms, fencing mode, next token.
/// Moves our lease to the next holder in this process (its token, a full
/// ttl) and returns its fencing token; -1 when the lease is not ours.
const HAND_OVER: &str = r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[2])
local mode = tonumber(ARGV[3])
if mode == 0 then return 0 end
local fencing = redis.call('INCR', KEYS[2])
if mode > 0 then redis.call('PEXPIRE', KEYS[2], mode) end
return fencing
";

/// `KEYS`: lock. `ARGV`: channel. Deletes the lock whoever holds it and
/// wakes waiters; returns 1 when there was one.
const FORCE_RELEASE: &str = r"
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
redis.call('PUBLISH', ARGV[1], '')
return 1
";

/// `KEYS`: counter. `ARGV`: floor. Raises the counter to at least the floor
/// (Redlock: every node learns the token just handed out).
const RAISE: &str = r"
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
if current < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end
return 1
";

static ACQUIRE_SCRIPT: Lazy<Script> = Lazy::new(|| Script::new(ACQUIRE));
static RAISE_SCRIPT: Lazy<Script> = Lazy::new(|| Script::new(RAISE));
static HAND_OVER_SCRIPT: Lazy<Script> = Lazy::new(|| Script::new(HAND_OVER));
static RENEW_SCRIPT: Lazy<Script> = Lazy::new(|| Script::new(RENEW));
static RELEASE_SCRIPT: Lazy<Script> = Lazy::new(|| Script::new(RELEASE));
static FORCE_RELEASE_SCRIPT: Lazy<Script> = Lazy::new(|| Script::new(FORCE_RELEASE));

/// What fencing counters cost and promise. See the [module docs](self).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fencing {
    /// One counter per key, kept forever: tokens strictly increase.
    #[default]
    PerKey,
    /// Counters expire this long after their key was last locked: tokens
    /// strictly increase as long as the key is locked again within it.
    ExpireAfter(Duration),
    /// No counters: every fencing token is 0.
    Off,
}

impl Fencing {
    /// What tokens promise in this mode.
    fn promise(self) -> FencingPromise {
        match self {
            Fencing::PerKey => FencingPromise::new(true, false, false),
            Fencing::ExpireAfter(_) => FencingPromise::new(true, false, true),
            Fencing::Off => FencingPromise::NONE,
        }
    }

    fn mode_arg(self) -> i64 {
        match self {
            Fencing::PerKey => -1,
            Fencing::Off => 0,
            Fencing::ExpireAfter(after) => {
                i64::try_from(after.as_millis()).unwrap_or(i64::MAX).max(1)
            }
        }
    }
}

/// Configures and connects a [`RedisBackend`].
#[derive(Debug)]
pub struct RedisBackendBuilder {
    url: String,
    fencing: Fencing,
    response_timeout: Duration,
    connection_timeout: Duration,
}

impl RedisBackendBuilder {
    /// How fencing counters are kept (default [`Fencing::PerKey`]).
    pub fn fencing(mut self, fencing: Fencing) -> Self {
        self.fencing = fencing;
        self
    }

    /// How long a command may take before it fails (default 2 s). A command
    /// against a server that stopped answering fails after this long.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How long connecting may take before it fails (default 1 s).
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// Connects (one command connection, reconnected as needed; the
    /// subscriber connection is made on the first wait).
    ///
    /// # Errors
    ///
    /// The `redis` crate's error when the URL is invalid or the server cannot
    /// be reached or refuses the credentials. Never contains the password.
    pub async fn connect(self) -> Result<RedisBackend, BackendError> {
        let client = Client::open(self.url.as_str())?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.response_timeout))
            .set_connection_timeout(Some(self.connection_timeout))
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_secs(1));
        let mut conn = client.get_connection_manager_with_config(config).await?;
        // Surface a missing password or a wrong database now, not at the first lock.
        ::redis::cmd("PING").query_async::<()>(&mut conn).await?;
        let subscriber = Subscriber::new(client, self.connection_timeout);
        Ok(RedisBackend::new(
            Commands {
                conn,
                fencing: self.fencing,
            },
            subscriber,
            redact(&self.url),
        ))
    }
}

/// The Redis backend. Cheap to clone; clones share the connections.
///
/// # Examples
///
/// ```no_run
/// use lock_runtime::backend::redis::Fencing;
/// use lock_runtime::{LockError, LockOptions, LockRegistry, RedisBackend};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// // The registry the attribute uses, with defaults:
/// lock_runtime::init(LockRegistry::redis("redis://127.0.0.1:6379").await?)?;
///
/// // A configured one, for the manual API:
/// let backend = RedisBackend::builder("redis://:secret@10.0.0.5:6379/0")
///     .fencing(Fencing::Off)
///     .connect()
///     .await
///     .map_err(|source| LockError::Backend {
///         key: "redis://:***@10.0.0.5:6379/0".into(),
///         action: "connect to",
///         source,
///     })?;
/// let shop = LockRegistry::builder(backend).namespace("shop").build()?;
/// let guard = shop.lock("stock:7", LockOptions::default()).await?;
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisBackend<C = ConnectionManager> {
    commands: Commands<C>,
    subscriber: Arc<Subscriber>,
    shown_url: String,
    capabilities: Capabilities,
}

/// The command connection and the fencing mode: all a lease handle needs.
#[derive(Clone)]
struct Commands<C> {
    conn: C,
    fencing: Fencing,
}

impl RedisBackend {
    /// Starts configuring a backend for `url` (`redis://[:password@]host:port[/db]`,
    /// `rediss://` for TLS when the `redis` crate is built with it).
    pub fn builder(url: &str) -> RedisBackendBuilder {
        RedisBackendBuilder {
            url: url.to_owned(),
            fencing: Fencing::default(),
            response_timeout: Duration::from_secs(2),
            connection_timeout: Duration::from_secs(1),
        }
    }
}

impl<C> RedisBackend<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Uses any `redis` connection for commands (a cluster connection, say,
    /// from `redis::cluster_async`), and `pubsub` (a client of one node, or
    /// of the cluster's nodes) for release notifications.
    pub fn with_connection(conn: C, pubsub: Client, fencing: Fencing) -> Self {
        RedisBackend::new(
            Commands { conn, fencing },
            Subscriber::new(pubsub, Duration::from_secs(1)),
            "custom connection".into(),
        )
    }

    fn new(commands: Commands<C>, subscriber: Arc<Subscriber>, shown_url: String) -> Self {
        let capabilities = Capabilities::new("redis")
            .with_ttl(Duration::from_millis(50), Duration::from_millis(1))
            .with_features(true, true, true, false)
            .with_margin(SafetyMargin::new(Duration::from_millis(10), 2_000))
            .with_fencing(commands.fencing.promise());
        RedisBackend {
            commands,
            subscriber,
            shown_url,
            capabilities,
        }
    }
}

impl<C> RedisBackend<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// One acquire attempt by `token`: the fencing token when granted, the
    /// holder's remaining time otherwise.
    pub(crate) async fn try_acquire(
        &self,
        key: &str,
        token: LockToken,
        ttl: Duration,
    ) -> Result<Result<u64, Option<Duration>>, BackendError> {
        self.commands.acquire(&lock_name(key), token, ttl).await
    }

    /// Renews `token`'s lease on `key` to `ttl`.
    pub(crate) async fn renew_token(
        &self,
        key: &str,
        token: LockToken,
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        self.commands.renew(&lock_name(key), token, ttl).await
    }

    /// Releases `token`'s lease on `key` (or shortens it to `linger`).
    pub(crate) async fn release_token(
        &self,
        key: &str,
        token: LockToken,
        linger: Duration,
    ) -> Result<bool, BackendError> {
        self.commands.release(&lock_name(key), token, linger).await
    }

    /// Raises `key`'s fencing counter to at least `floor`.
    pub(crate) async fn raise_fencing(&self, key: &str, floor: u64) -> Result<(), BackendError> {
        let mut script = RAISE_SCRIPT.key(suffixed(&lock_name(key), b":fence"));
        script.arg(floor);
        let _: i64 = invoke(&self.commands.conn, script, Retry::IfConnectionFailed).await?;
        Ok(())
    }
}

impl<C> Commands<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// An invocation of a script that takes the lock and counter keys and
    /// the token, ttl and fencing mode (acquire, hand-over).
    fn fenced<'s>(
        &self,
        script: &'s Script,
        lock: &[u8],
        token: LockToken,
        ttl: Duration,
    ) -> ::redis::ScriptInvocation<'s> {
        let mut invocation = script.key(lock);
        invocation
            .key(suffixed(lock, b":fence"))
            .arg(token.to_string())
            .arg(millis(ttl))
            .arg(self.fencing.mode_arg());
        invocation
    }

    async fn acquire(
        &self,
        lock: &[u8],
        token: LockToken,
        ttl: Duration,
    ) -> Result<Result<u64, Option<Duration>>, BackendError> {
        let script = self.fenced(&ACQUIRE_SCRIPT, lock, token, ttl);
        let (acquired, value): (i64, i64) =
            invoke(&self.conn, script, Retry::IfConnectionFailed).await?;
        Ok(if acquired == 1 {
            Ok(u64::try_from(value).unwrap_or(0))
        } else {
            Err(u64::try_from(value).ok().map(Duration::from_millis))
        })
    }

    async fn renew(
        &self,
        lock: &[u8],
        token: LockToken,
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        let mut script = RENEW_SCRIPT.key(lock);
        script.arg(token.to_string()).arg(millis(ttl));
        let renewed: i64 = invoke(&self.conn, script, Retry::IfConnectionFailed).await?;
        Ok(renewed == 1)
    }

    async fn release(
        &self,
        lock: &[u8],
        token: LockToken,
        linger: Duration,
    ) -> Result<bool, BackendError> {
        let mut script = RELEASE_SCRIPT.key(lock);
        script
            .arg(token.to_string())
            .arg(millis(linger))
            .arg(suffixed(lock, b":released"));
        let released: i64 = invoke(&self.conn, script, Retry::IfNeverSent).await?;
        Ok(released == 1)
    }

    async fn hand_over(
        &self,
        lock: &[u8],
        token: LockToken,
        next: LockToken,
        ttl: Duration,
    ) -> Result<Option<u64>, BackendError> {
        let mut script = self.fenced(&HAND_OVER_SCRIPT, lock, token, ttl);
        script.arg(next.to_string());
        // Not idempotent (it increments the counter): resent only if never sent.
        let fencing: i64 = invoke(&self.conn, script, Retry::IfNeverSent).await?;
        Ok(u64::try_from(fencing).ok())
    }
}

/// One lease on one Redis: the lock's Redis name and our token.
struct RedisLease<C> {
    commands: Commands<C>,
    lock: Vec<u8>,
    token: LockToken,
    ttl: Duration,
}

impl<C> Lease for RedisLease<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn renew(&mut self) -> BoxFuture<'_, Result<bool, BackendError>> {
        Box::pin(self.commands.renew(&self.lock, self.token, self.ttl))
    }

    fn release(&mut self, linger: Duration) -> BoxFuture<'_, Result<bool, BackendError>> {
        Box::pin(self.commands.release(&self.lock, self.token, linger))
    }

    fn hand_over(&mut self) -> BoxFuture<'_, Result<Option<u64>, BackendError>> {
        Box::pin(async move {
            let next = LockToken::random();
            let fencing = self
                .commands
                .hand_over(&self.lock, self.token, next, self.ttl)
                .await?;
            if fencing.is_some() {
                self.token = next;
            }
            Ok(fencing)
        })
    }
}

impl<C> fmt::Debug for RedisLease<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLease")
            .field("lock", &String::from_utf8_lossy(&self.lock))
            .finish_non_exhaustive()
    }
}

/// Which failed calls may be sent once more at once.
#[derive(Clone, Copy)]
enum Retry {
    /// Idempotent scripts (acquire, renew): after any connection failure.
    IfConnectionFailed,
    /// Release: only when the command surely never reached the server.
    IfNeverSent,
}

impl Retry {
    fn allows(self, err: &::redis::RedisError) -> bool {
        match self {
            Retry::IfConnectionFailed => {
                err.is_connection_refusal() || err.is_connection_dropped() || err.is_io_error()
            }
            Retry::IfNeverSent => err.is_connection_refusal(),
        }
    }
}

/// Runs a script; after a connection failure that `retry` allows, once more
/// on the reconnected connection. A failed reconnect is reported to the first
/// caller after the server is back; the retry spares that caller the error.
async fn invoke<C, T>(
    conn: &C,
    script: ::redis::ScriptInvocation<'_>,
    retry: Retry,
) -> Result<T, ::redis::RedisError>
where
    C: ConnectionLike + Clone,
    T: ::redis::FromRedisValue,
{
    let mut conn = conn.clone();
    match script.invoke_async(&mut conn).await {
        Err(err) if retry.allows(&err) => script.invoke_async(&mut conn).await,
        other => other,
    }
}

/// `lock:{<escaped key>}`: the escaped key is the hash tag.
fn lock_name(key: &str) -> Vec<u8> {
    let mut name = Vec::with_capacity(key.len() + 16);
    name.extend_from_slice(b"lock:{");
    for byte in key.bytes() {
        match byte {
            b'%' => name.extend_from_slice(b"%25"),
            b'{' => name.extend_from_slice(b"%7B"),
            b'}' => name.extend_from_slice(b"%7D"),
            other => name.push(other),
        }
    }
    name.push(b'}');
    name
}

/// Another name of the same lock: its counter (`:fence`) or its release
/// channel (`:released`).
fn suffixed(lock: &[u8], suffix: &[u8]) -> Vec<u8> {
    let mut name = Vec::with_capacity(lock.len() + suffix.len());
    name.extend_from_slice(lock);
    name.extend_from_slice(suffix);
    name
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl<C> Backend for RedisBackend<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    fn acquire<'a>(
        &'a self,
        request: AcquireRequest<'a>,
    ) -> BoxFuture<'a, Result<Acquire, BackendError>> {
        Box::pin(async move {
            let lock = lock_name(request.key);
            let answer = self
                .commands
                .acquire(&lock, request.token, request.ttl)
                .await?;
            Ok(match answer {
                Ok(fencing) => Acquire::Acquired {
                    fencing,
                    lease: Box::new(RedisLease {
                        commands: self.commands.clone(),
                        lock,
                        token: request.token,
                        ttl: request.ttl,
                    }),
                },
                Err(remaining) => Acquire::Held { remaining },
            })
        })
    }

    fn abandon<'a>(
        &'a self,
        key: &'a str,
        token: LockToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(self.release_token(key, token, Duration::ZERO))
    }

    fn watch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<ReleaseWatch, BackendError>> {
        Box::pin(
            self.subscriber
                .watch(suffixed(&lock_name(key), b":released")),
        )
    }

    fn force_release<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let lock = lock_name(key);
            let mut script = FORCE_RELEASE_SCRIPT.key(&lock);
            script.arg(suffixed(&lock, b":released"));
            let deleted: i64 =
                invoke(&self.commands.conn, script, Retry::IfConnectionFailed).await?;
            Ok(deleted == 1)
        })
    }
}

impl<C> fmt::Debug for RedisBackend<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("url", &self.shown_url)
            .field("fencing", &self.commands.fencing)
            .finish_non_exhaustive()
    }
}

/// The URL with any password replaced by `***`, for logs and `Debug`.
pub(crate) fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|at| at + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => {
            let user = rest[..at].split(':').next().unwrap_or_default();
            format!("{}{user}:***{}", &url[..scheme_end], &rest[at..])
        }
        None => url.to_owned(),
    }
}

/// The one subscriber connection of a backend: per-key channels subscribed
/// while someone waits on the key, and a task that dispatches messages.
struct Subscriber {
    client: Client,
    connect_timeout: Duration,
    state: Mutex<SubscriberState>,
    /// Serialises SUBSCRIBE/UNSUBSCRIBE, so an unsubscribe of a channel
    /// nobody watches can never overtake a new watcher's subscribe.
    ops: AsyncMutex<()>,
}

#[derive(Default)]
struct SubscriberState {
    channels: HashMap<Vec<u8>, watch::Sender<()>>,
    sink: Option<PubSubSink>,
    /// The dispatch task, stopped when the backend goes away.
    dispatcher: Option<AbortHandle>,
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        if let Some(dispatcher) = self.state().dispatcher.take() {
            dispatcher.abort();
        }
    }
}

impl Subscriber {
    fn new(client: Client, connect_timeout: Duration) -> Arc<Self> {
        Arc::new(Subscriber {
            client,
            connect_timeout,
            state: Mutex::default(),
            ops: AsyncMutex::new(()),
        })
    }

    fn state(&self) -> MutexGuard<'_, SubscriberState> {
        // Each update is one map or field assignment: consistent after a panic.
        self.state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Subscribes to `channel` and returns once Redis confirmed it.
    async fn watch(self: &Arc<Self>, channel: Vec<u8>) -> Result<ReleaseWatch, BackendError> {
        let rx = self
            .state()
            .channels
            .entry(channel.clone())
            .or_insert_with(|| watch::Sender::new(()))
            .subscribe();
        // From here on, dropping (on error or cancellation) unwatches.
        let unwatch = Unwatch {
            subscriber: Arc::downgrade(self),
            channel: channel.clone(),
        };
        let _serial = self.ops.lock().await;
        let mut sink = self.sink().await?;
        sink.subscribe(&channel).await?;
        Ok(ReleaseWatch::new(rx, Some(Box::new(unwatch))))
    }

    /// The current subscriber connection, connecting if there is none.
    /// Called with `ops` held, so only one caller connects.
    async fn sink(self: &Arc<Self>) -> Result<PubSubSink, BackendError> {
        if let Some(sink) = self.state().sink.clone() {
            return Ok(sink);
        }
        let (sink, stream) = self.connect().await?;
        let dispatcher = tokio::spawn(dispatch(Arc::downgrade(self), stream)).abort_handle();
        let mut state = self.state();
        state.sink = Some(sink.clone());
        if let Some(previous) = state.dispatcher.replace(dispatcher) {
            previous.abort();
        }
        Ok(sink)
    }

    async fn connect(&self) -> Result<(PubSubSink, PubSubStream), BackendError> {
        let pubsub = tokio::time::timeout(self.connect_timeout, self.client.get_async_pubsub())
            .await
            .map_err(|_| "timed out connecting the subscriber connection")??;
        Ok(pubsub.split())
    }

    /// Wakes every watcher: used when notifications may have been missed.
    fn wake_all(&self) {
        for sender in self.state().channels.values() {
            sender.send_replace(());
        }
    }
}

/// Reads messages until the connection ends, then reconnects and
/// resubscribes while anyone watches; stops when the backend is dropped.
async fn dispatch(subscriber: Weak<Subscriber>, mut stream: PubSubStream) {
    loop {
        while let Some(msg) = stream.next().await {
            let Some(subscriber) = subscriber.upgrade() else {
                return;
            };
            let state = subscriber.state();
            if let Some(sender) = state.channels.get(msg.get_channel_name().as_bytes()) {
                sender.send_replace(());
            }
        }
        let Some(strong) = subscriber.upgrade() else {
            return;
        };
        tracing::warn!(
            "lock subscriber connection lost; waiters fall back to lease expiry until it is back"
        );
        strong.state().sink = None;
        // Releases may have been missed: let every waiter try again now.
        strong.wake_all();
        drop(strong);
        match resubscribe(&subscriber).await {
            Some(next) => stream = next,
            None => return,
        }
    }
}

/// Reconnects with backoff and subscribes every watched channel again.
/// `None` when the backend is gone, or nobody is watching any more (the next
/// watcher then connects).
async fn resubscribe(subscriber: &Weak<Subscriber>) -> Option<PubSubStream> {
    let mut delay = Duration::from_millis(50);
    loop {
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
        let strong = subscriber.upgrade()?;
        let _serial = strong.ops.lock().await;
        let channels: Vec<Vec<u8>> = strong.state().channels.keys().cloned().collect();
        if channels.is_empty() {
            return None;
        }
        let Ok((mut sink, stream)) = strong.connect().await else {
            continue;
        };
        if sink.subscribe(&channels).await.is_err() {
            continue;
        }
        strong.state().sink = Some(sink);
        tracing::info!(
            channels = channels.len(),
            "lock subscriber connection restored"
        );
        strong.wake_all();
        return Some(stream);
    }
}

/// Drops the channel (and unsubscribes) when its last watcher goes away.
struct Unwatch {
    subscriber: Weak<Subscriber>,
    channel: Vec<u8>,
}

impl Drop for Unwatch {
    fn drop(&mut self) {
        let Some(subscriber) = self.subscriber.upgrade() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let channel = std::mem::take(&mut self.channel);
        runtime.spawn(async move {
            let _serial = subscriber.ops.lock().await;
            let sink = {
                let mut state = subscriber.state();
                match state.channels.get(&channel) {
                    Some(sender) if sender.receiver_count() == 0 => {
                        state.channels.remove(&channel);
                        state.sink.clone()
                    }
                    // Watched again meanwhile (or already gone): keep it.
                    _ => None,
                }
            };
            let Some(mut sink) = sink else { return };
            if let Err(error) = sink.unsubscribe(&channel).await {
                tracing::debug!(%error, "unsubscribe failed");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn braces_and_percent_are_escaped_so_keys_cannot_collide() {
        assert_eq!(lock_name("stock:7"), b"lock:{stock:7}");
        assert_eq!(lock_name("a}b{c%"), b"lock:{a%7Db%7Bc%25}");
        // A key that spells another key's counter stays a different name.
        let counter = suffixed(&lock_name("k"), b":fence");
        assert_eq!(counter, b"lock:{k}:fence");
        assert_ne!(lock_name("k}:fence"), counter);
        assert_ne!(lock_name("%7D"), lock_name("}"));
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact("redis://:hunter2@127.0.0.1:6379/0"),
            "redis://:***@127.0.0.1:6379/0"
        );
        assert_eq!(
            redact("redis://app:hunter2@host/1"),
            "redis://app:***@host/1"
        );
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert_eq!(redact("not a url"), "not a url");
    }
}
