//! One Redis (or anything that speaks to one through the `redis` crate).
//!
//! # Protocol
//!
//! - Acquire is one script, one round trip: `SET key token NX PX ttl`, and on
//!   success `INCR` of the key's fencing counter; when the key is held, the
//!   holder's `PTTL`; on success it also issues the fencing token (below).
//!   It returns a handle that keeps the lock's Redis name and token.
//! - Renew and release are owner-checked scripts (`GET` = token, then
//!   `PEXPIRE` / `DEL`); never a bare `DEL` or `EXPIRE`. Release publishes a
//!   wake-up on the key's channel; a release that must linger
//!   (`hold_at_least`) shortens the lease instead. A hand-over within the
//!   process moves the lease to a new token and issues a new fencing token,
//!   in one script.
//! - The holder gives up 10 ms plus 0.2 % of the ttl before Redis can expire
//!   the lease: the margin covers clock-rate drift between this host and the
//!   server, the timer's granularity and the time to cancel the body.
//! - Scripts run by `EVALSHA`, and are loaded again after `SCRIPT FLUSH` or a
//!   server restart (`NOSCRIPT`).
//!
//! # Fair mode
//!
//! By default, whoever asks first after a release gets the lock, and a
//! process that holds a key hands it to its own next task without a
//! release. With [`RedisBackendBuilder::fair`], waiters get a key in the
//! order they first asked for it, across processes (within a process, the
//! local queue already orders tasks):
//!
//! - A refused waiter's token joins the key's queue (a list, with a hash of
//!   each token's deadline), and every later attempt of the waiter moves its
//!   deadline to a grant timeout from then. Waiters ask again every third of
//!   the grant timeout, so a live waiter never misses its deadline, and a
//!   waiter whose process died is dropped once its deadline passes.
//! - A release does not free the key: in the same script it gives it to the
//!   first live waiter's token for the grant timeout, issues that waiter's
//!   fencing token, and publishes the granted token. The waiter's next
//!   attempt (on the notification, or on its timer) claims the lease for its
//!   own ttl. A waiter that died after its last attempt holds the key up
//!   for at most the grant timeout.
//! - A key that is free with a live waiter queued (its holder's lease
//!   expired rather than being released) is taken only by the queue's head.
//!   A skip-mode attempt takes a key only when it is free and nobody waits;
//!   it never queues.
//! - A waiter that stops waiting (a `wait_timeout`, a cancellation) takes
//!   its token out of the queue, or passes its grant on if it had one.
//! - The holder's next task in its process gets the lease by a hand-over
//!   only while nobody waits in the store's queue; otherwise the hand-over
//!   script releases the key to the queue's head instead, and that task
//!   queues in the store behind the other processes' waiters.
//!
//! It costs two more keys per contended lock (`:queue`, `:waiters`, which
//! expire three grant timeouts after the last waiter's attempt).
//!
//! # Keys
//!
//! A lock on `stock:7` uses the Redis key `lock:{stock:7}`, its fencing
//! counter `lock:{stock:7}:fence` and the channel `lock:{stock:7}:released`
//! (in fair mode also `lock:{stock:7}:queue` and `lock:{stock:7}:waiters`).
//! The part between the braces is a hash tag, so on Redis Cluster all of them
//! live in one slot and the scripts work. `%`, `{` and `}` in the lock key are
//! written as `%25`, `%7B` and `%7D`, so a key can neither end the hash tag
//! nor be made to collide with another key's counter; any other bytes
//! (colons, unicode) are kept as they are.
//!
//! # Fencing tokens
//!
//! A token is the server's clock in microseconds (`TIME`, read inside the
//! acquire or hand-over script), or one more than the key's last token if
//! that is larger. The last token is kept in a counter next to the lock that
//! expires with the lease ([`Fencing::ExpireAfter`] keeps it longer), so
//! no per-key state is left once a key is free.
//!
//! **The promise:** tokens strictly increase per key, across holders,
//! processes and lease expiry, **and after the server lost data** it was
//! allowed to lose (a restart without persistence, `FLUSHALL`, a failover to
//! a replica that missed the last writes), as long as the server's clock
//! does not step back by more than the time between two grants of the key
//! (after a failover: as long as the new master's clock is not behind the
//! old one's by more than the failover took). Tokens are large (about
//! 1.8 × 10¹⁵ in 2026) and not dense. [`Fencing::Off`] turns them off
//! (always 0).

mod connection;
mod subscriber;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::{ConnectionLike, ConnectionManagerConfig};
use ::redis::{Client, Script};
use once_cell::sync::Lazy;

pub use connection::RedisConnection;
use connection::Source;
use subscriber::Subscriber;

use super::{
    Acquire, AcquireRequest, Backend, BoxFuture, Capabilities, FencingPromise, HandOver, Lease,
    LeaseInfo, LockToken, ReleaseWatch, SafetyMargin,
};
use crate::error::{BackendError, LockError, redact};
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
        Ok(LockRegistry::over(
            RedisBackend::builder(url).connect().await?,
        ))
    }
}

/// The Lua function that issues a fencing token: the server's clock in
/// microseconds, or one more than the key's last token if that is not
/// smaller (two grants in one microsecond, a clock stepped back a little).
/// The counter that remembers the last token lives `life` ms: as long as
/// the lease, or longer with [`Fencing::ExpireAfter`].
///
/// The common case is two calls and no arithmetic: the clock's digits are
/// joined as a string, swapped into the counter by `SET .. GET` (Redis
/// 6.2), and compared with the old value as digit strings (longer is
/// larger; equal lengths compare by bytes). A profile of 64 tasks on
/// distinct keys found the server saturated, and this function was the
/// largest part of its time per lock in the previous form (`GET`, numbers,
/// `string.format`, `SET`).
macro_rules! fence_fn {
    () => {
        r"
local function fence(counter, life)
  local t = redis.call('TIME')
  local token = t[1] .. string.sub('00000' .. t[2], -6)
  local last = redis.call('SET', counter, token, 'PX', life, 'GET')
  if last and (#last > #token or (#last == #token and last >= token)) then
    token = string.format('%.0f', tonumber(last) + 1)
    redis.call('SET', counter, token, 'PX', life)
  end
  return token
end
"
    };
}

/// `KEYS`: lock, counter. `ARGV`: token, ttl ms, the counter's life in ms
/// (0: no fencing).
/// Returns `{1, fencing}` when acquired (the token as a string of digits),
/// `{0, pttl}` when held. Idempotent: run again by the same token (a retry
/// after a dropped reply), it answers as the first run did, so a retry
/// cannot lock the caller out.
const ACQUIRE: &str = concat!(
    fence_fn!(),
    r"
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  if ARGV[3] == '0' then return {1, 0} end
  return {1, fence(KEYS[2], ARGV[3])}
end
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, redis.call('GET', KEYS[2]) or 0}
end
return {0, redis.call('PTTL', KEYS[1])}
"
);

/// The Lua functions of the fair mode: the server's clock in ms; the
/// first live waiter of a key's queue (the clock read only if there is
/// one); and the grant to that waiter (`KEYS` and `ARGV` as in
/// [`FAIR_RELEASE`] and [`FAIR_HAND_OVER`]). The queue is a list of tokens in
/// arrival order; a hash gives each queued token `"deadline life"` (its
/// deadline in server ms, and its fencing counter's life). Waiters
/// whose deadline passed are dropped from the head on the way.
macro_rules! queue_fn {
    () => {
        r"
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function head(queue, waiters)
  local now
  while true do
    local first = redis.call('LINDEX', queue, 0)
    if not first then return nil end
    now = now or now_ms()
    local entry = redis.call('HGET', waiters, first)
    if entry then
      local deadline, life = string.match(entry, '^(%d+) (%d+)$')
      if deadline and tonumber(deadline) >= now then return first, life end
      redis.call('HDEL', waiters, first)
    end
    redis.call('LPOP', queue)
  end
end
local function grant(first, life, timeout, channel)
  redis.call('LPOP', KEYS[3])
  redis.call('HDEL', KEYS[4], first)
  redis.call('SET', KEYS[1], first, 'PX', timeout)
  if life ~= '0' then fence(KEYS[2], life) end
  redis.call('PUBLISH', channel, first)
end
"
    };
}

/// Fair mode. `KEYS`: lock, counter, queue, waiters. `ARGV`: token, ttl
/// ms, the counter's life in ms (0: no fencing), 1 if the caller waits,
/// the grant timeout in ms.
/// Returns `{1, fencing}` when acquired: the key was free and nobody live
/// queued ahead of us, or a release granted it to our token (then this
/// claims it for the full ttl). Otherwise `{0, pttl}`, or `{0, -3}` when
/// the key is free but it is another waiter's turn; a caller that waits is
/// queued (or keeps its place), with its deadline moved to a grant timeout
/// from now. Idempotent, as [`ACQUIRE`] is.
const FAIR_ACQUIRE: &str = concat!(
    fence_fn!(),
    queue_fn!(),
    r"
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, redis.call('GET', KEYS[2]) or 0}
end
if not holder then
  local first = head(KEYS[3], KEYS[4])
  if not first or first == ARGV[1] then
    if first then
      redis.call('LPOP', KEYS[3])
      redis.call('HDEL', KEYS[4], first)
    end
    redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
    if ARGV[3] == '0' then return {1, 0} end
    return {1, fence(KEYS[2], ARGV[3])}
  end
end
if ARGV[4] == '1' then
  local grant = tonumber(ARGV[5])
  local entry = string.format('%.0f', now_ms() + grant) .. ' ' .. ARGV[3]
  if redis.call('HSET', KEYS[4], ARGV[1], entry) == 1 then
    redis.call('RPUSH', KEYS[3], ARGV[1])
  end
  redis.call('PEXPIRE', KEYS[3], 3 * grant)
  redis.call('PEXPIRE', KEYS[4], 3 * grant)
end
if not holder then return {0, -3} end
return {0, redis.call('PTTL', KEYS[1])}
"
);

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

/// Fair mode. `KEYS`: lock, counter, queue, waiters. `ARGV`: token, linger
/// ms, channel, grant timeout ms. Returns 1 when released (or shortened to
/// the linger). A release grants the lock to the first live waiter: the
/// key becomes its token's for the grant timeout (the waiter's next attempt
/// claims it for its ttl), and its fencing token is issued now; the
/// channel gets the granted token. Called by a token that does not hold the
/// key (a waiter giving up), it takes the token out of the queue.
const FAIR_RELEASE: &str = concat!(
    fence_fn!(),
    queue_fn!(),
    r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  if redis.call('HDEL', KEYS[4], ARGV[1]) == 1 then
    redis.call('LREM', KEYS[3], 1, ARGV[1])
  end
  return 0
end
if tonumber(ARGV[2]) > 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
local first, life = head(KEYS[3], KEYS[4])
if not first then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[3], '')
  return 1
end
grant(first, life, ARGV[4], ARGV[3])
return 1
"
);

/// `KEYS`: lock, counter. `ARGV`: token, ttl ms, the counter's life in ms
/// (0: no fencing), next token.
/// Moves our lease to the next holder in this process (its token, a full
/// ttl) and returns its fencing token; -1 when the lease is not ours.
const HAND_OVER: &str = concat!(
    fence_fn!(),
    r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[2])
if ARGV[3] == '0' then return 0 end
return fence(KEYS[2], ARGV[3])
"
);

/// Fair mode. `KEYS`: lock, counter, queue, waiters. `ARGV`: token, ttl ms,
/// the counter's life in ms (0: no fencing), next token, channel, grant
/// timeout ms.
/// As [`HAND_OVER`] while nobody is queued in the store; -2 when a live
/// waiter is, after releasing the lock to it as [`FAIR_RELEASE`] does.
const FAIR_HAND_OVER: &str = concat!(
    fence_fn!(),
    queue_fn!(),
    r"
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local first, life = head(KEYS[3], KEYS[4])
if first then
  grant(first, life, ARGV[6], ARGV[5])
  return -2
end
redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[2])
if ARGV[3] == '0' then return 0 end
return fence(KEYS[2], ARGV[3])
"
);

/// `KEYS`: lock. `ARGV`: channel. Deletes the lock whoever holds it and
/// wakes waiters; returns 1 when there was one.
const FORCE_RELEASE: &str = r"
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
redis.call('PUBLISH', ARGV[1], '')
return 1
";

/// `KEYS`: lock, counter. Returns `{token, pttl, last fencing token}`;
/// an empty token when the lock is free. Reads only.
const INSPECT: &str = r"
local token = redis.call('GET', KEYS[1])
if not token then return {'', -2, '0'} end
return {token, redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2]) or '0'}
";

/// `KEYS`: counter. `ARGV`: floor, life ms. Raises the counter to at least
/// the floor, for at least `life` (Redlock: every node learns the token just
/// handed out).
const RAISE: &str = r"
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local life = math.max(tonumber(ARGV[2]), redis.call('PTTL', KEYS[1]))
redis.call('SET', KEYS[1], string.format('%.0f', math.max(current, tonumber(ARGV[1]))), 'PX', life)
return 1
";

static ACQUIRE_SCRIPT: Lazy<Script> = Lazy::new(|| Script::new(ACQUIRE));
static RAISE_SCRIPT: Lazy<Script> = Lazy::new(|| Script::new(RAISE));
static HAND_OVER_SCRIPT: Lazy<Script> = Lazy::new(|| Script::new(HAND_OVER));
static RENEW_SCRIPT: Lazy<Script> = Lazy::new(|| Script::new(RENEW));
static RELEASE_SCRIPT: Lazy<Script> = Lazy::new(|| Script::new(RELEASE));
static FORCE_RELEASE_SCRIPT: Lazy<Script> = Lazy::new(|| Script::new(FORCE_RELEASE));
static INSPECT_SCRIPT: Lazy<Script> = Lazy::new(|| Script::new(INSPECT));
static FAIR_ACQUIRE_SCRIPT: Lazy<Script> = Lazy::new(|| Script::new(FAIR_ACQUIRE));
static FAIR_RELEASE_SCRIPT: Lazy<Script> = Lazy::new(|| Script::new(FAIR_RELEASE));
static FAIR_HAND_OVER_SCRIPT: Lazy<Script> = Lazy::new(|| Script::new(FAIR_HAND_OVER));

/// How fencing tokens are made. See the [module docs](self).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fencing {
    /// Tokens from the server's clock and a counter that lives as long as the
    /// lease: strictly increasing per key, after data loss too, with no
    /// per-key state left once the lease ends.
    #[default]
    PerKey,
    /// As [`PerKey`](Fencing::PerKey), with the counter kept at least this
    /// long after each grant: a longer guard against the server's clock
    /// being stepped back between two grants.
    ExpireAfter(Duration),
    /// No tokens: every fencing token is 0, and no counter is kept.
    Off,
}

impl Fencing {
    /// What tokens promise in this mode.
    fn promise(self) -> FencingPromise {
        match self {
            Fencing::PerKey | Fencing::ExpireAfter(_) => FencingPromise::new(true, true, true),
            Fencing::Off => FencingPromise::NONE,
        }
    }

    /// The scripts' fencing argument for a lease of `ttl`: 0 for none,
    /// else how long the counter lives after a grant, in ms.
    fn counter_life(self, ttl: Duration) -> u64 {
        match self {
            Fencing::PerKey => millis(ttl).max(1),
            Fencing::Off => 0,
            Fencing::ExpireAfter(after) => millis(after.max(ttl)).max(1),
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
    connection_retries: usize,
    replica_acks: Option<ReplicaAcks>,
    fair: Option<Duration>,
}

/// How many replicas must have a grant before it is handed out (`WAIT`).
#[derive(Clone, Copy, Debug)]
struct ReplicaAcks {
    replicas: u32,
    timeout: Duration,
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

    /// How many times a failed connection is tried again, from 50 ms apart
    /// and backing off (default 2): a server that refuses connections makes
    /// `connect`, and a command while the connection is down, fail after a
    /// few hundred milliseconds with the default (0.27 s measured on a
    /// 2-core machine, 0.54 s on another), within a millisecond with 0.
    pub fn connection_retries(mut self, retries: usize) -> Self {
        self.connection_retries = retries;
        self
    }

    /// Makes every grant wait until `replicas` replicas have it (`WAIT`),
    /// at most `timeout`; a grant that fewer replicas confirm in time is
    /// undone and the acquire fails with [`LockError::Backend`]. A failover
    /// right after a grant then cannot lose it, unless every confirming
    /// replica fails too (see the README for what it costs). Off by default.
    /// `timeout` must be shorter than the
    /// [response timeout](Self::response_timeout), or `connect` refuses it.
    pub fn replica_acks(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replica_acks = Some(ReplicaAcks { replicas, timeout });
        self
    }

    /// Fair mode: waiters get the lock in the order they first asked for
    /// it, across processes (see the [module docs](self#fair-mode)). A
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

    /// Connects (one command connection, reconnected as needed; the
    /// subscriber connection is made on the first wait). For a
    /// `redis+sentinel://` URL, the connection goes to the master the
    /// Sentinels name, and follows it after a failover.
    ///
    /// # Errors
    ///
    /// [`LockError::Backend`] naming the URL (password redacted), as
    /// [`LockRegistry::redis`] gives, when the URL is invalid or the server
    /// cannot be reached or refuses the credentials. Never contains the
    /// password.
    pub async fn connect(self) -> Result<RedisBackend, LockError> {
        let shown = redact(&self.url);
        self.connect_backend()
            .await
            .map_err(|source| LockError::Backend {
                key: shown,
                action: "connect to",
                source,
            })
    }

    /// [`connect`](Self::connect), with the store's own error.
    pub(crate) async fn connect_backend(self) -> Result<RedisBackend, BackendError> {
        if let Some(acks) = self.replica_acks
            && acks.timeout >= self.response_timeout
        {
            // The reply would come too late: the grant's fate unknown, and
            // not undone.
            return Err(format!(
                "the replica_acks timeout ({:?}) must be shorter than the response timeout ({:?})",
                acks.timeout, self.response_timeout
            )
            .into());
        }
        if let Some(grant_timeout) = self.fair {
            check_grant_timeout(grant_timeout)?;
        }
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.response_timeout))
            .set_connection_timeout(Some(self.connection_timeout))
            .set_number_of_retries(self.connection_retries)
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_secs(1));
        let conn = RedisConnection::connect(&self.url, config, self.connection_timeout).await?;
        let subscriber = Subscriber::new(Source::Connection(conn.clone()), self.connection_timeout);
        Ok(RedisBackend::new(
            Commands {
                conn,
                fencing: self.fencing,
                replica_acks: self.replica_acks,
                fair: self.fair,
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
///     .await?;
/// let shop = LockRegistry::builder(backend).namespace("shop").build()?;
/// let guard = shop.lock("stock:7", LockOptions::default()).await?;
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisBackend<C = RedisConnection> {
    commands: Commands<C>,
    subscriber: Arc<Subscriber>,
    shown_url: String,
    capabilities: Capabilities,
}

/// The command connection and how grants are made: all a lease handle needs.
#[derive(Clone)]
struct Commands<C> {
    conn: C,
    fencing: Fencing,
    replica_acks: Option<ReplicaAcks>,
    /// Fair mode's grant timeout; `None` when not fair.
    fair: Option<Duration>,
}

impl RedisBackend {
    /// Starts configuring a backend for `url`: `redis://[:password@]host:port[/db]`
    /// for one server (`rediss://` for TLS when the `redis` crate is built
    /// with it), or `redis+sentinel://[:password@]host:port[,host:port...]/master-name[/db]`
    /// for the master of a Sentinel group (the password is the master's).
    pub fn builder(url: &str) -> RedisBackendBuilder {
        RedisBackendBuilder {
            url: url.to_owned(),
            fencing: Fencing::default(),
            response_timeout: Duration::from_secs(2),
            connection_timeout: Duration::from_secs(1),
            connection_retries: 2,
            replica_acks: None,
            fair: None,
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
            Commands {
                conn,
                fencing,
                replica_acks: None,
                fair: None,
            },
            Subscriber::new(Source::Client(pubsub), Duration::from_secs(1)),
            "custom connection".into(),
        )
    }

    /// This backend in fair mode, as [`RedisBackendBuilder::fair`] makes
    /// it: for a connection given to
    /// [`with_connection`](Self::with_connection) (a cluster's).
    ///
    /// # Errors
    ///
    /// [`LockError::Backend`] naming the store, when `grant_timeout` is
    /// shorter than 50 ms.
    pub fn fair(mut self, grant_timeout: Duration) -> Result<Self, LockError> {
        check_grant_timeout(grant_timeout).map_err(|source| LockError::Backend {
            key: self.shown_url.clone(),
            action: "use fair mode on",
            source,
        })?;
        self.commands.fair = Some(grant_timeout);
        Ok(RedisBackend::new(
            self.commands,
            self.subscriber,
            self.shown_url,
        ))
    }

    fn new(commands: Commands<C>, subscriber: Arc<Subscriber>, shown_url: String) -> Self {
        let capabilities = Capabilities::new("redis")
            .with_ttl(Duration::from_millis(50), Duration::from_millis(1))
            .with_features(true, true, true, false)
            .with_margin(SafetyMargin::new(Duration::from_millis(10), 2_000))
            .with_fencing(commands.fencing.promise());
        // A queued waiter asks again within a third of the grant timeout,
        // to keep its place with room to spare.
        let capabilities = match commands.fair {
            Some(grant_timeout) => capabilities.with_waiter_queue(grant_timeout / 3),
            None => capabilities,
        };
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
        self.commands
            .acquire(&lock_name(key), token, ttl, false)
            .await
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

    /// Raises `key`'s fencing counter to at least `floor`, kept for at least
    /// `life`.
    pub(crate) async fn raise_fencing(
        &self,
        key: &str,
        floor: u64,
        life: Duration,
    ) -> Result<(), BackendError> {
        let counter = suffixed(&lock_name(key), b":fence");
        let call = Call::new(&RAISE_SCRIPT, &[&counter])
            .arg(floor)
            .arg(millis(life));
        let _: i64 = invoke(&self.commands.conn, call, Retry::IfConnectionFailed).await?;
        Ok(())
    }
}

impl<C> Commands<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// An invocation of a script that takes the lock and counter keys (and
    /// in fair mode the queue's) and the token, ttl and fencing mode
    /// (acquire, hand-over).
    fn fenced<'s>(
        &self,
        script: &'s Script,
        lock: &[u8],
        token: LockToken,
        ttl: Duration,
    ) -> Call<'s> {
        self.with_keys(script, lock)
            .arg(&token.hex()[..])
            .arg(millis(ttl))
            .arg(self.fencing.counter_life(ttl))
    }

    /// A call of `script` with the lock's keys: the lock and its counter,
    /// and in fair mode its queue and the queue's deadlines.
    fn with_keys<'s>(&self, script: &'s Script, lock: &[u8]) -> Call<'s> {
        let counter = suffixed(lock, b":fence");
        if self.fair.is_none() {
            return Call::new(script, &[lock, &counter]);
        }
        let queue = suffixed(lock, b":queue");
        let waiters = suffixed(lock, b":waiters");
        Call::new(script, &[lock, &counter, &queue, &waiters])
    }

    async fn acquire(
        &self,
        lock: &[u8],
        token: LockToken,
        ttl: Duration,
        waits: bool,
    ) -> Result<Result<u64, Option<Duration>>, BackendError> {
        let call = match self.fair {
            None => self.fenced(&ACQUIRE_SCRIPT, lock, token, ttl),
            Some(grant_timeout) => self
                .fenced(&FAIR_ACQUIRE_SCRIPT, lock, token, ttl)
                .arg(u8::from(waits))
                .arg(millis(grant_timeout)),
        };
        let (acquired, value): (i64, ::redis::Value) =
            invoke(&self.conn, call, Retry::IfConnectionFailed).await?;
        let value = integer(&value)?;
        if acquired != 1 {
            // -1: no expiry (set by hand); -3 (fair mode): the key is free,
            // but it is another waiter's turn.
            return Ok(Err(u64::try_from(value).ok().map(Duration::from_millis)));
        }
        self.replicated().await?;
        Ok(Ok(u64::try_from(value).unwrap_or(0)))
    }

    /// With [`RedisBackendBuilder::replica_acks`], waits until enough
    /// replicas have every write sent on this connection so far (the grant
    /// just made among them).
    async fn replicated(&self) -> Result<(), BackendError> {
        let Some(acks) = self.replica_acks else {
            return Ok(());
        };
        let mut conn = self.conn.clone();
        let acked: u32 = ::redis::cmd("WAIT")
            .arg(acks.replicas)
            .arg(millis(acks.timeout).max(1))
            .query_async(&mut conn)
            .await?;
        if acked < acks.replicas {
            return Err(format!(
                "the grant reached {acked} of the {} replicas required within {:?}",
                acks.replicas, acks.timeout
            )
            .into());
        }
        Ok(())
    }

    async fn renew(
        &self,
        lock: &[u8],
        token: LockToken,
        ttl: Duration,
    ) -> Result<bool, BackendError> {
        let call = Call::new(&RENEW_SCRIPT, &[lock])
            .arg(&token.hex()[..])
            .arg(millis(ttl));
        let renewed: i64 = invoke(&self.conn, call, Retry::IfConnectionFailed).await?;
        Ok(renewed == 1)
    }

    async fn release(
        &self,
        lock: &[u8],
        token: LockToken,
        linger: Duration,
    ) -> Result<bool, BackendError> {
        let channel = suffixed(lock, b":released");
        let call = match self.fair {
            None => Call::new(&RELEASE_SCRIPT, &[lock])
                .arg(&token.hex()[..])
                .arg(millis(linger))
                .arg(channel),
            Some(grant_timeout) => self
                .with_keys(&FAIR_RELEASE_SCRIPT, lock)
                .arg(&token.hex()[..])
                .arg(millis(linger))
                .arg(channel)
                .arg(millis(grant_timeout)),
        };
        let released: i64 = invoke(&self.conn, call, Retry::IfNeverSent).await?;
        Ok(released == 1)
    }

    async fn hand_over(
        &self,
        lock: &[u8],
        token: LockToken,
        next: LockToken,
        ttl: Duration,
    ) -> Result<HandOver, BackendError> {
        let call = match self.fair {
            None => self
                .fenced(&HAND_OVER_SCRIPT, lock, token, ttl)
                .arg(&next.hex()[..]),
            // Handed over only while no other process waits in the queue.
            Some(grant_timeout) => self
                .fenced(&FAIR_HAND_OVER_SCRIPT, lock, token, ttl)
                .arg(&next.hex()[..])
                .arg(suffixed(lock, b":released"))
                .arg(millis(grant_timeout)),
        };
        // Not idempotent (it issues a new token): resent only if never sent.
        let fencing: ::redis::Value = invoke(&self.conn, call, Retry::IfNeverSent).await?;
        Ok(match integer(&fencing)? {
            -2 => HandOver::Released,
            fencing => {
                let handed = HandOver::from(u64::try_from(fencing).ok());
                if let HandOver::Moved { .. } = handed {
                    self.replicated().await?;
                }
                handed
            }
        })
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

    fn hand_over(&mut self) -> BoxFuture<'_, Result<HandOver, BackendError>> {
        Box::pin(async move {
            let next = LockToken::random();
            let handed = self
                .commands
                .hand_over(&self.lock, self.token, next, self.ttl)
                .await?;
            if let HandOver::Moved { .. } = handed {
                self.token = next;
            }
            Ok(handed)
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
            // A response timeout is an I/O error too, but the server may
            // still be working on the command: resending it would hold the
            // caller for another timeout.
            Retry::IfConnectionFailed => {
                (err.is_connection_refusal() || err.is_connection_dropped() || err.is_io_error())
                    && !err.is_timeout()
            }
            Retry::IfNeverSent => err.is_connection_refusal(),
        }
    }
}

/// A script call written straight into one `EVALSHA` command, with no
/// buffer per key or argument. (`ScriptInvocation` copies each into a
/// vector of its own, then all of them into the command: a profile of 64
/// tasks on distinct keys found those allocations among the largest of the
/// client's costs per lock.)
struct Call<'s> {
    script: &'s Script,
    cmd: ::redis::Cmd,
}

impl<'s> Call<'s> {
    fn new(script: &'s Script, keys: &[&[u8]]) -> Self {
        let mut cmd = ::redis::Cmd::with_capacity(8, 160);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys.len());
        for key in keys {
            cmd.arg(*key);
        }
        Call { script, cmd }
    }

    fn arg(mut self, arg: impl ::redis::ToRedisArgs) -> Self {
        self.cmd.arg(arg);
        self
    }

    /// Sends the call; loads the script first if the server lacks it (a
    /// restart, `SCRIPT FLUSH`), then sends it again.
    async fn send<C, T>(&self, conn: &mut C) -> Result<T, ::redis::RedisError>
    where
        C: ConnectionLike,
        T: ::redis::FromRedisValue,
    {
        use ::redis::{ErrorKind, ServerErrorKind};
        match self.cmd.query_async(conn).await {
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.load_async(conn).await?;
                self.cmd.query_async(conn).await
            }
            other => other,
        }
    }
}

/// Runs a script; after a connection failure that `retry` allows, once more
/// on the reconnected connection. A failed reconnect is reported to the first
/// caller after the server is back; the retry spares that caller the error.
async fn invoke<C, T>(conn: &C, call: Call<'_>, retry: Retry) -> Result<T, ::redis::RedisError>
where
    C: ConnectionLike + Clone,
    T: ::redis::FromRedisValue,
{
    let mut conn = conn.clone();
    match call.send(&mut conn).await {
        Err(err) if retry.allows(&err) => call.send(&mut conn).await,
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

/// A script's number: an integer reply, or digits in a string (a fencing
/// token, which Lua would turn into a float).
fn integer(value: &::redis::Value) -> Result<i64, BackendError> {
    let parsed = match value {
        ::redis::Value::Int(n) => Some(*n),
        ::redis::Value::BulkString(digits) => std::str::from_utf8(digits)
            .ok()
            .and_then(|digits| digits.parse().ok()),
        _ => None,
    };
    parsed.ok_or_else(|| format!("a script answered {value:?} where a number was expected").into())
}

/// Refuses a fair mode's grant timeout too short for waiters to keep their
/// place.
fn check_grant_timeout(grant_timeout: Duration) -> Result<(), BackendError> {
    if grant_timeout < Duration::from_millis(50) {
        return Err(format!(
            "the fair mode's grant timeout ({grant_timeout:?}) must be at least 50 ms"
        )
        .into());
    }
    Ok(())
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
                .acquire(&lock, request.token, request.ttl, request.waits)
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
            let call =
                Call::new(&FORCE_RELEASE_SCRIPT, &[&lock]).arg(suffixed(&lock, b":released"));
            let deleted: i64 = invoke(&self.commands.conn, call, Retry::IfConnectionFailed).await?;
            Ok(deleted == 1)
        })
    }

    fn inspect<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<LeaseInfo>, BackendError>> {
        Box::pin(async move {
            let lock = lock_name(key);
            let call = Call::new(&INSPECT_SCRIPT, &[&lock, &suffixed(&lock, b":fence")]);
            let (token, pttl, fencing): (String, i64, String) =
                invoke(&self.commands.conn, call, Retry::IfConnectionFailed).await?;
            if token.is_empty() {
                return Ok(None);
            }
            // A value this store did not write (not a token) is still a holder.
            let token = token.parse().ok();
            // -1: no expiry (set by hand); -2: gone between the two reads.
            let remaining = u64::try_from(pttl).ok().map(Duration::from_millis);
            Ok(Some(LeaseInfo::new(
                token,
                fencing.parse().unwrap_or(0),
                remaining,
            )))
        })
    }
}

impl<C> fmt::Debug for RedisBackend<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("url", &self.shown_url)
            .field("fencing", &self.commands.fencing)
            .field("replica_acks", &self.commands.replica_acks)
            .field("fair", &self.commands.fair)
            .finish_non_exhaustive()
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
}
