//! One Redis (or anything that speaks to one through the `redis` crate).
//!
//! # Protocol
//!
//! - Acquire is one round trip: the plain `SET key token NX PX ttl GET`
//!   (its old value tells a retried attempt that it holds the key
//!   already). When the key is held it answers the holder's `PTTL`. It
//!   returns a handle that keeps the lock's Redis name and token.
//! - An exclusive lease's fencing token (below) is issued when the holder
//!   first reads it ([`LockGuard::fencing_token`](crate::LockGuard::fencing_token)),
//!   by a script that checks the lease still holds the key in the same
//!   step, one round trip: a lock whose body never reads its token costs
//!   no token, and a holder that lost the key gets `Lost`, not a token.
//!   No other holder can be granted between a grant and its token, so a
//!   late token orders writes as one issued with the grant would. Shares,
//!   permits and fair mode's grants are scripts anyway, and issue the
//!   token with the grant.
//! - Renew and release are owner-checked scripts (`GET` = token, then
//!   `PEXPIRE` / `DEL`); never a bare `DEL` or `EXPIRE`. A waiter refused
//!   by a lease marks its key (a `~` after the holder's token), and the
//!   release of a marked key publishes a wake-up on the key's channel; a
//!   release nobody waits for is a `GET` and a `DEL`, as a plain lock's. A
//!   release that must linger (`hold_at_least`) shortens the lease
//!   instead. A hand-over within the process moves the lease, and a
//!   waiter's mark, to a new token in one script; the next holder's
//!   fencing token is issued when it reads it.
//! - Where the server has owner-checked commands of its own (Redis 8.4's
//!   `DELEX key IFEQ token` and `SET key token IFEQ token PX ttl`, Valkey
//!   9's `DELIFEQ`), asked at connect ([`OwnerChecks`]), an exclusive
//!   lease is released and renewed by them: one command, no script. A
//!   release that finds the key marked by a waiter (the command answers
//!   0) runs the script too, a second round trip that wakes the waiter; a
//!   lease whose acquire found the key in demand goes to the script at
//!   once. Shares, permits and fair mode keep the scripts.
//! - The holder gives up 10 ms plus 0.2 % of the ttl before Redis can expire
//!   the lease: the margin covers clock-rate drift between this host and the
//!   server, the timer's granularity and the time to cancel the body.
//! - Scripts run by `EVALSHA`, and are loaded again after `SCRIPT FLUSH` or a
//!   server restart (`NOSCRIPT`).
//!
//! # Semaphores and read-write locks
//!
//! A key held by shares (readers) or permits is a sorted set of the
//! holders' tokens, scored by the server-clock millisecond each lease ends,
//! beside `:kind` (which claim it serves: `shared`, or the semaphore's
//! limit) and `:tokens` (each holder's fencing token). One script grants a
//! share or a permit (one round trip): it drops expired holders, refuses
//! while a writer holds the key (a string, as a mutex) or the limit is
//! reached, and issues the fencing token as for a mutex, so tokens increase
//! across every grant of the key. Renewal and release are the mutex's
//! scripts, which tell a sorted set from a string. A writer refused while
//! shares hold the key and that waits marks the key (`:writer`, kept while
//! it keeps asking): new shares are refused until it is served, so readers
//! cannot starve it; on a free key the mark is cut to 50 ms. A key serves
//! one claim while held: another is an error naming both. A permit whose
//! holder leaves while another task of its process waits moves to that
//! task's token in one script (its member of the set, its fencing token),
//! as an exclusive lease does: the key stays full, and no other process's
//! waiter is woken for it. In fair mode shares and permits queue with
//! everyone else (see below) and no mark is needed; a permit is then
//! released rather than handed over, so the queue has its turn.
//!
//! # Fair mode
//!
//! By default, whoever asks first after a release gets the lock, and a
//! process that holds a key hands it to its own next task without a
//! release. With [`RedisStoreBuilder::fair`], waiters get a key in the
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
//! - Shares and permits queue too, each entry saying what it claims. A
//!   share or permit is granted at once only when the key has room and
//!   nobody live is queued ahead; a release grants what it freed to the
//!   head of the queue: the whole key to a writer, or to the run of
//!   readers (or permits, up to the limit) at the head, each for the grant
//!   timeout and with its own fencing token and message. So readers queued
//!   behind a writer wait for it, and a writer behind readers gets the key
//!   when they are done: nobody is starved.
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
//! no per-key state is left once a key is free. The counter also names the
//! lease its token went to, so inspection reports a holder's own token, or
//! none while the default lock's holder has not read one.
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
//!
//! # TLS
//!
//! With the `redis-tls` feature, a `rediss://` URL connects over TLS
//! (rustls with ring; no OpenSSL), checking the server's certificate
//! against the system's roots, as managed services (ElastiCache with
//! in-transit encryption, Azure Cache, Upstash) need:
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lock_runtime::LockError> {
//! let locks = lock_runtime::LockRegistry::redis("rediss://:PASSWORD@my-cache.example.com:6380").await?;
//! lock_runtime::init(locks)?;
//! # Ok(()) }
//! ```
//!
//! A private CA and client certificates (`tls-auth-clients yes`) are set on
//! the builder with `RedisStoreBuilder::tls_ca` and
//! `tls_identity` (feature `redis-tls`). A certificate that does not check
//! out is a [`LockError::Connect`] naming the
//! server (never the password). Without the feature, a `rediss://` URL is
//! refused with [`LockError::InvalidSettings`].
//!
//! `rediss+cluster://` is a cluster over TLS, and `rediss+sentinel://` a
//! Sentinel group over TLS: the Sentinels and the masters they name (after
//! a failover too) are all reached over TLS, with the same CA and client
//! certificate, so the Sentinels must announce their TLS ports and
//! monitor the servers over TLS (`tls-replication yes`).
//!
//! # Cluster, Sentinel and replicas
//!
//! - `redis+cluster://h1:p1,h2:p2,...` connects to a Redis Cluster through
//!   any of its nodes; a lock's keys share a hash tag, so each script runs
//!   on one node. Release notifications are published on the key's node
//!   and reach the store's subscriber (on the first node) over the cluster
//!   bus.
//! - `redis+sentinel://[:password@]h1:p1,h2:p2/master-name[/db]` finds the
//!   master through the Sentinels and follows a failover: when a command
//!   fails in a way a failover explains (a refused or dropped connection, a
//!   timeout, `READONLY` from a demoted master) the connection is dropped,
//!   and the next command asks the Sentinels again (at most ten times a
//!   second) and uses the master they name once it says it is one (`ROLE`)
//!   and they still name it. It never reconnects to the old address on its
//!   own: a failed master restarted after the failover says it is a master
//!   until the Sentinels demote it. Nor does it stay on a master the
//!   Sentinels moved away from while it was up (a failover they were asked
//!   for, or one they started because they briefly lost sight of it): such
//!   a master takes writes without an error until they demote it, seconds
//!   later, so every second the store asks a Sentinel which master it names
//!   and leaves any other; holders' next renewals then reach the master
//!   everyone else uses. Fencing tokens keep increasing across the
//!   failover (see above).
//! - With asynchronous replication a failover can lose a lease that was
//!   just granted. [`RedisStoreBuilder::replica_acks`] makes every grant
//!   wait (`WAIT`) until that many replicas have it, at one more round trip
//!   per grant; a grant too few replicas confirm in time is undone and the
//!   acquire fails. It does not cover renewals, and a failover to a replica
//!   that did not acknowledge can still lose a grant.
//! - A server that restarts without persistence (or a failover that lost
//!   writes) loses the leases in it: see the crate's guarantees on data
//!   loss. Their holders learn at their next renewal, within a ttl; the
//!   fencing tokens of the keys' next holders are still larger.
//!
//! # Failures
//!
//! A command against a server that is down fails with
//! [`LockError::Store`] once the connection's retries are spent (a few
//! hundred milliseconds with the default 2, at once with
//! [`RedisStoreBuilder::connection_retries`] 0); one against a frozen
//! server fails once it has waited the response timeout (2 s; at most about
//! an eighth more, as the connection looks at its waiting commands eight
//! times per timeout rather than keeping a timer for each) and is not sent
//! again, so no call waits much longer than its response timeout, and no
//! waiting call longer than its `wait_timeout`. An acquire given up while its request was
//! in flight is undone once the server answers. Connections come back by
//! themselves with the server. A password in the URL is never shown:
//! errors and `Debug` print `redis://:***@host`.

mod builder;
mod commands;
mod connection;
mod deadlines;
mod keys;
mod lease;
mod marks;
mod owner_checks;
mod scripts;
mod server;
mod subscriber;
mod urls;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ::redis::Client;
use ::redis::aio::ConnectionLike;

pub use builder::RedisStoreBuilder;
pub(crate) use builder::tls_setters;
use builder::{check_grant_timeout, invalid_settings};
pub use commands::Fencing;
use commands::{Call, Commands, Retry, Tokens, invoke, millis};
pub use connection::RedisConnection;
use connection::Source;
pub(crate) use connection::TlsSettings;
use keys::{lock_name, released_channel, suffixed};
use lease::RedisLease;
use marks::WriterMarks;
use owner_checks::Checks;
pub use owner_checks::OwnerChecks;
use subscriber::Subscriber;

use super::{
    Acquire, AcquireRequest, Capabilities, Claim, LeaseInfo, LockToken, ReleaseWatch, Reply, Store,
};
use crate::error::{LockError, StoreError};

impl From<::redis::RedisError> for crate::store::StoreError {
    /// A Redis error: the server or the connection failed the call.
    fn from(err: ::redis::RedisError) -> Self {
        crate::store::StoreError::unavailable(err)
    }
}

/// The Redis store. Cheap to clone; clones share the connections.
///
/// # Examples
///
/// ```no_run
/// use lock_runtime::store::redis::Fencing;
/// use lock_runtime::{LockError, LockOptions, LockRegistry, RedisStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// // The registry the attribute uses, with defaults:
/// lock_runtime::init(LockRegistry::redis("redis://127.0.0.1:6379").await?)?;
///
/// // A configured one, for the manual API:
/// let store = RedisStore::builder("redis://:secret@10.0.0.5:6379/0")
///     .fencing(Fencing::Off)
///     .connect()
///     .await?;
/// let shop = LockRegistry::builder(store).namespace("shop").build()?;
/// let guard = shop.lock("stock:7", LockOptions::default()).await?;
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisStore<C = RedisConnection> {
    commands: Commands<C>,
    subscriber: Arc<Subscriber>,
    shown_url: String,
    capabilities: Capabilities,
    marks: Arc<WriterMarks>,
}

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Uses any `redis` connection for commands (a cluster connection, say,
    /// from `redis::cluster_async`), and `pubsub` (a client of one node, or
    /// of the cluster's nodes) for release notifications.
    pub fn with_connection(conn: C, pubsub: Client, fencing: Fencing) -> Self {
        RedisStore::new(
            Commands {
                conn,
                fencing,
                replica_acks: None,
                fair: None,
                checks: Arc::new(Checks::new(OwnerChecks::Scripts)),
            },
            Subscriber::new(Source::Client(Box::new(pubsub)), Duration::from_secs(1)),
            "custom connection".into(),
        )
    }

    /// This store in fair mode, as [`RedisStoreBuilder::fair`] makes
    /// it: for a connection given to
    /// [`with_connection`](Self::with_connection) (a cluster's).
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidSettings`] naming the store, when
    /// `grant_timeout` is shorter than 50 ms.
    pub fn fair(mut self, grant_timeout: Duration) -> Result<Self, LockError> {
        check_grant_timeout(grant_timeout)
            .map_err(|reason| invalid_settings(self.shown_url.clone(), reason))?;
        self.commands.fair = Some(grant_timeout);
        Ok(RedisStore::new(
            self.commands,
            self.subscriber,
            self.shown_url,
        ))
    }

    fn new(commands: Commands<C>, subscriber: Arc<Subscriber>, shown_url: String) -> Self {
        let capabilities = Capabilities::new("redis")
            .with_ttl(Duration::from_millis(50), Duration::from_millis(1))
            .with_linger()
            .with_fencing(commands.fencing.promise());
        // A queued waiter asks again within a third of the grant timeout,
        // to keep its place with room to spare.
        let capabilities = match commands.fair {
            Some(grant_timeout) => capabilities.with_waiter_queue(grant_timeout / 3),
            None => capabilities,
        }
        .with_shares()
        .with_permits();
        RedisStore {
            commands,
            subscriber,
            shown_url,
            capabilities,
            marks: Arc::default(),
        }
    }
}

impl<C> RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Which owner-checked commands release and renew this store's leases
    /// now: [`OwnerChecks::Scripts`], [`Delex`](OwnerChecks::Delex) or
    /// [`Delifeq`](OwnerChecks::Delifeq), as detected at connect (or set),
    /// and scripts once a server refused a command.
    pub fn owner_checks(&self) -> OwnerChecks {
        self.commands.checks.sent()
    }

    /// One acquire attempt by `token`: the fencing token when granted, the
    /// holder's remaining time otherwise. A caller that `waits` marks a
    /// held key so that its release is published.
    pub(crate) async fn try_acquire(
        &self,
        key: &str,
        token: LockToken,
        ttl: Duration,
        waits: bool,
    ) -> Result<Result<u64, Option<Duration>>, StoreError> {
        let answer = self
            .commands
            .acquire(
                &lock_name(key),
                token,
                ttl,
                (waits, false),
                Tokens::WithGrant,
            )
            .await?;
        Ok(answer
            .map(|fencing| fencing.unwrap_or(0))
            .map_err(|(remaining, _)| remaining))
    }

    /// Renews `token`'s lease on `key` to `ttl`.
    pub(crate) async fn renew_token(
        &self,
        key: &str,
        token: LockToken,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        self.commands
            .renew(&lock_name(key), token, ttl, false)
            .await
    }

    /// Releases `token`'s lease on `key` (or shortens it to `linger`).
    pub(crate) async fn release_token(
        &self,
        key: &str,
        token: LockToken,
        linger: Duration,
    ) -> Result<bool, StoreError> {
        self.commands
            .release(&lock_name(key), token, linger, false, false)
            .await
    }

    /// Raises `key`'s fencing counter to at least `floor`, issued to
    /// `holder`, kept for at least `life`.
    pub(crate) async fn raise_fencing(
        &self,
        key: &str,
        floor: u64,
        holder: LockToken,
        life: Duration,
    ) -> Result<(), StoreError> {
        let counter = suffixed(&lock_name(key), b":fence");
        let call = Call::new(&scripts::RAISE, &[&counter])
            .arg(floor)
            .arg(millis(life))
            .arg(&holder.hex()[..]);
        let _: i64 = invoke(&self.commands.conn, call, Retry::IfConnectionFailed).await?;
        Ok(())
    }
}

impl<C> Store for RedisStore<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> Reply<'a, Acquire> {
        Reply::new(async move {
            let lock = lock_name(request.key);
            let token = request.token;
            let answer = match request.claim {
                Claim::Exclusive => {
                    let marked = request.hints.waits && self.marks.contains(token);
                    let tokens = match request.hints.fenced {
                        true => Tokens::OnDemand,
                        false => Tokens::Unfenced,
                    };
                    let answer = self
                        .commands
                        .acquire(
                            &lock,
                            token,
                            request.ttl,
                            (request.hints.waits, marked),
                            tokens,
                        )
                        .await?;
                    match answer {
                        Ok(fencing) => {
                            if marked {
                                self.marks.remove(token);
                            }
                            Ok(fencing)
                        }
                        Err((remaining, marks)) => {
                            if marks {
                                self.marks.insert(token);
                            }
                            Err(remaining)
                        }
                    }
                }
                claim => self
                    .commands
                    .share_acquire(
                        &lock,
                        request.token,
                        request.ttl,
                        claim,
                        request.hints.waits,
                    )
                    .await?
                    .map(Some),
            };
            Ok(match answer {
                Ok(fencing) => Acquire::Acquired {
                    fencing,
                    lease: Box::new(RedisLease {
                        commands: self.commands.clone(),
                        lock,
                        token: request.token,
                        ttl: request.ttl,
                        exclusive: request.claim == Claim::Exclusive,
                        contended: request.hints.contended,
                        on_demand: fencing.is_none(),
                    }),
                },
                Err(remaining) => Acquire::Held { remaining },
            })
        })
    }

    fn abandon<'a>(&'a self, key: &'a str, token: LockToken) -> Reply<'a, bool> {
        // A writer giving up takes its mark off the key (release.lua).
        self.marks.remove(token);
        Reply::new(self.release_token(key, token, Duration::ZERO))
    }

    fn watch<'a>(&'a self, key: &'a str) -> Reply<'a, ReleaseWatch> {
        Reply::new(self.subscriber.watch(released_channel(&lock_name(key))))
    }

    fn force_release<'a>(&'a self, key: &'a str) -> Reply<'a, bool> {
        Reply::new(async move {
            let lock = lock_name(key);
            let call = Call::on_lock(&scripts::FORCE_RELEASE, &lock, &[b":writer"])
                .arg(released_channel(&lock));
            let deleted: i64 = invoke(&self.commands.conn, call, Retry::IfConnectionFailed).await?;
            Ok(deleted == 1)
        })
    }

    fn inspect<'a>(&'a self, key: &'a str) -> Reply<'a, Option<LeaseInfo>> {
        Reply::new(async move {
            let lock = lock_name(key);
            let call = Call::on_lock(&scripts::INSPECT, &lock, &[b":fence", b":kind", b":tokens"]);
            let (token, pttl, fencing, kind, holders): (String, i64, String, String, usize) =
                invoke(&self.commands.conn, call, Retry::IfConnectionFailed).await?;
            if token.is_empty() {
                return Ok(None);
            }
            // A value this store did not write (not a token) is still a holder.
            let token = token.parse().ok();
            // -1: no expiry (set by hand); -2: gone between the two reads.
            let remaining = u64::try_from(pttl).ok().map(Duration::from_millis);
            let claim = match kind.as_str() {
                "" => Claim::Exclusive,
                name => commands::claim_of(name),
            };
            Ok(Some(
                LeaseInfo::new(token, fencing.parse().unwrap_or(0), remaining)
                    .with_holders(claim, holders),
            ))
        })
    }
}

impl<C> fmt::Debug for RedisStore<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("url", &self.shown_url)
            .field("fencing", &self.commands.fencing)
            .field("replica_acks", &self.commands.replica_acks)
            .field("fair", &self.commands.fair)
            .field("owner_checks", &self.commands.checks.sent())
            .finish_non_exhaustive()
    }
}
