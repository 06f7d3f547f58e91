//! MySQL and MariaDB: a lease table, for teams whose only shared store is
//! their MySQL: a row per key, with an expiring lease and a fencing token,
//! never a `GET_LOCK` (which lives as long as one pinned connection, has
//! no ttl and no token, breaks a proxy's connection multiplexing and is
//! refused on Galera clusters).
//!
//! # Table
//!
//! ```sql
//! CREATE TABLE lock_leases (
//!     id           BINARY(32)      NOT NULL PRIMARY KEY,  -- SHA-256 of the key
//!     lock_key     VARBINARY(255)  NOT NULL,              -- the key's first 255 bytes, for people reading the table
//!     token        VARBINARY(40)   NOT NULL,              -- the holder's token ('*shared', '*permits:N': see below)
//!     fencing      BIGINT UNSIGNED NOT NULL,              -- the last grant's fencing value
//!     expires_at   DATETIME(6)     NOT NULL,              -- by the server's clock, UTC
//!     writer_until DATETIME(6)     NULL                   -- a writer waits: no new shares until then
//! ) ENGINE=InnoDB;
//! CREATE TABLE lock_leases_holders (  -- one row per share or permit
//!     id BINARY(32) NOT NULL, token VARBINARY(40) NOT NULL, fencing BIGINT UNSIGNED NOT NULL,
//!     expires_at DATETIME(6) NOT NULL, PRIMARY KEY (id, token)
//! ) ENGINE=InnoDB;
//! -- and three procedures: lock_leases_claim_v2, lock_leases_unclaim_v2, lock_leases_force_v2
//! ```
//!
//! All of it is made on first use when missing (one process at a time,
//! under a named lock); the name is a builder option. A user without the
//! right to make them gets a clear error at connect: an administrator runs
//! the SQL of [`MySqlStoreBuilder::schema`] beforehand and grants the user
//! `SELECT, INSERT, UPDATE, DELETE` on both tables and `EXECUTE` on the
//! procedures. The row's id is the key's SHA-256, so keys of any bytes and
//! any length up to the registry's limit fit the index, and case matters;
//! `lock_key` keeps a key's first 255 bytes, for people (inline in the row:
//! a `BLOB` of the whole key cost the uncontended acquire a fifth more
//! server time).
//!
//! # Statements
//!
//! Every operation is one statement and one round trip (a first attempt
//! at a key found held takes two: see acquire), with the key and token as
//! parameters (never spliced into the SQL), timed by the server's clock
//! (`UTC_TIMESTAMP(6)`, constant within a statement), never the client's,
//! and each runs on its own pooled connection with autocommit: never
//! inside a transaction of the caller's.
//!
//! - acquire, for a key not known to be in demand, is a plain `INSERT` of
//!   the key's row, which costs the server less than an upsert, or, for a
//!   key this process released (its row is kept), an `UPDATE` that takes
//!   the row over if it is free. When that finds the key held, or at once
//!   for a key known to be contended, it is one `INSERT ... ON DUPLICATE
//!   KEY UPDATE`: it
//!   inserts the key's row, takes over an expired one, or renews the same
//!   token's lease (a retried acquire), and answers through
//!   `LAST_INSERT_ID(expr)`, which the server sends back in its OK packet:
//!   the fencing value when granted; when refused, a value with the top
//!   bit set that says how the key is held and how long its holder has
//!   left. The answer never rests on affected-row counts, which mean
//!   "found" or "changed" as the connection's flags say.
//! - renew, release and hand-over are owner-checked by token; a release
//!   marks the row free (or shortens its expiry when it must linger:
//!   `hold_at_least`), keeping it; a hand-over moves the row to a new token
//!   with a new fencing value.
//! - rows of keys free for more than ten minutes are deleted by each store
//!   every five minutes or so ([`MySqlStore::purge`]): a consistent read
//!   that locks nothing finds them, and each is deleted by primary key
//!   unless taken meanwhile.
//!
//! # Waiting
//!
//! MySQL has no `LISTEN`/`NOTIFY`. A process's own tasks wait for a key in
//! its local queue and are handed the lease at once; waiters in other
//! processes ask again when the holder's lease says it ends, and at least
//! every poll interval ([`MySqlStoreBuilder::poll_interval`], 50 ms by
//! default), with jitter: a release reaches a waiter in another process
//! half an interval later on average.
//!
//! # Semaphores and read-write locks
//!
//! A key held by read shares or permits keeps its row, with the claim
//! (`*shared`, `*permits:N`) in place of a token and the expiry of its
//! longest-lived holder; each share or permit is a row of the holders'
//! table. One procedure call (one round trip) grants a share or permit: in
//! one transaction it locks the key's row, drops expired holders, refuses
//! while a writer holds the key or the limit is reached, and draws the
//! fencing value as an acquire does. A writer refused by shares that waits
//! marks the row for 6 s, again with every refusal: new shares are refused
//! until it is served, so readers cannot starve it. A key serves one claim
//! while held: another is an error naming both.
//!
//! # Fencing
//!
//! A key's values come from its row: each grant takes the greater of the
//! last value plus one and the server's clock in microseconds since the
//! epoch, reading the last value under the row's lock. A release keeps the
//! row, so a grant whose statement read the clock before a later grant and
//! release of the key (a statement the server ran late) still draws a
//! greater value. The clock carries the values across what a row cannot:
//! a row purged after ten minutes free, and commits the server lost (a
//! crash with `innodb_flush_log_at_trx_commit` other than 1, a failover to
//! a replica that missed them). So values strictly increase per key unless
//! the server's clock is stepped back by more than the time between two
//! grants of the key.
//!
//! # Servers
//!
//! The statements were run on MariaDB 10.11 (the tests' server). MySQL 8.0
//! and later accept the same statements (`LAST_INSERT_ID(expr)`,
//! `INSERT ... ON DUPLICATE KEY UPDATE` without `VALUES()`, stored
//! procedures); they were not run on it here.

mod builder;
mod lease;
mod sql;

pub use builder::MySqlStoreBuilder;
use lease::MySqlLease;
use sql::{HELD, Statements, Table, micros};

use std::collections::HashSet;
use std::fmt;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use mysql_async::prelude::{FromRow, Queryable};
use mysql_async::{Params, Pool};
use sha2::{Digest, Sha256};

use super::{
    Acquire, AcquireRequest, Capabilities, Claim, ClaimMismatch, FencingPromise, LeaseInfo,
    LockToken, ReleaseWatch, Reply, Store,
};
use crate::error::StoreError;
use crate::store::common::claim_text;

/// What the MySQL store can do (its poll interval is the builder's).
const CAPABILITIES: Capabilities = Capabilities::new("mysql")
    .with_ttl(Duration::from_millis(100), Duration::from_millis(1))
    .with_linger()
    .with_fencing(FencingPromise::INCREASING.surviving_data_loss())
    .with_shares()
    .with_permits();

/// MySQL's and MariaDB's deadlock error: a statement rolled back by the
/// server, safe to send again.
const ER_LOCK_DEADLOCK: u16 = 1213;
/// A row lock not granted within `innodb_lock_wait_timeout`.
const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;
/// An `INSERT` of a row id that exists.
const ER_DUP_ENTRY: u16 = 1062;

/// How often an acquire asks again at once when the server rolled it back
/// (a deadlock between two first inserts of one key).
const DEADLOCKS_RETRIED: usize = 3;

/// The MySQL or MariaDB store. Cheap to clone; clones share the pool.
///
/// # Examples
///
/// ```no_run
/// use lock_runtime::{LockError, LockOptions, LockRegistry};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// let registry = LockRegistry::mysql("mysql://app:secret@10.0.0.7/shop").await?;
/// let guard = registry.lock("stock:7", LockOptions::default()).await?;
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct MySqlStore {
    shared: Arc<Shared>,
    capabilities: Capabilities,
    shown: String,
}

/// What the store and its leases share: the pool and the statements.
pub(super) struct Shared {
    pool: Pool,
    table: Table,
    statements: Statements,
    response_timeout: Duration,
    /// How many connections the pool may hold: after a server restart,
    /// that many can be found closed one after the other.
    connections: usize,
    /// Row ids of keys this process released, whose rows are kept free:
    /// taking one again tries [`Statements::take`] first. At most
    /// [`FREED_KNOWN`]; forgotten all at once beyond.
    freed: Mutex<HashSet<[u8; 32]>>,
}

/// The most released keys [`Shared::freed`] knows.
const FREED_KNOWN: usize = 4096;

/// How often each store purges the rows of keys long free (see
/// [`MySqlStore::purge`]), give or take a fifth.
const PURGE_EVERY: Duration = Duration::from_secs(300);

impl Shared {
    /// Runs `run` on a pooled connection, within the response timeout
    /// (connecting included).
    async fn on_conn<T>(
        &self,
        run: impl AsyncFnOnce(&mut mysql_async::Conn) -> Result<T, mysql_async::Error>,
    ) -> Result<T, StoreError> {
        let answer = tokio::time::timeout(self.response_timeout, async {
            let mut conn = self.pool.get_conn().await?;
            run(&mut conn).await
        })
        .await
        .map_err(|_| -> StoreError {
            format!("no answer within {:?}", self.response_timeout).into()
        })?;
        answer.map_err(mysql_error)
    }

    /// Runs a statement; the `LAST_INSERT_ID` its OK packet carries (`None`
    /// when the statement set none: no row matched).
    async fn exec_id(
        &self,
        statement: &str,
        params: impl Into<Params> + Send,
    ) -> Result<Option<u64>, StoreError> {
        self.on_conn(async |conn| {
            conn.exec_drop(statement, params).await?;
            Ok(conn.last_insert_id().filter(|&id| id != 0))
        })
        .await
    }

    /// Runs a statement; the first row it returns.
    async fn first<T: FromRow + Send + 'static>(
        &self,
        statement: &str,
        params: impl Into<Params> + Send,
    ) -> Result<Option<T>, StoreError> {
        self.on_conn(async |conn| conn.exec_first(statement, params).await)
            .await
    }

    /// Extends an exclusive lease to `by` from now: whether it was ours.
    async fn extend(
        &self,
        id: &[u8; 32],
        token: LockToken,
        by: Duration,
    ) -> Result<bool, StoreError> {
        let token = token.to_string();
        let (token, statement) = (token.as_str(), &self.statements.extend);
        self.again_if_closed(move || async move {
            let params = (micros(by), &id[..], token);
            Ok(self.exec_id(statement, params).await?.is_some())
        })
        .await
    }

    /// Runs `once`, and again while it fails on a connection found closed
    /// (a pooled one the server dropped: a restart, an idle timeout; the
    /// pool discards it), at most once per connection the pool may hold
    /// and one more: for statements whose repeat answers as the first did.
    async fn again_if_closed<T, F: Future<Output = Result<T, StoreError>>>(
        &self,
        once: impl Fn() -> F,
    ) -> Result<T, StoreError> {
        let mut left = self.connections;
        loop {
            match once().await {
                Err(err) if closed(&err) && left > 0 => left -= 1,
                other => return other,
            }
        }
    }

    /// Ends an exclusive lease, its row kept free: whether it was ours.
    async fn release(&self, id: &[u8; 32], token: LockToken) -> Result<bool, StoreError> {
        let params = (&id[..], token.to_string());
        let released = self
            .exec_id(&self.statements.release, params)
            .await?
            .is_some();
        if released {
            self.freed_now(id);
        }
        Ok(released)
    }

    /// Notes that `id`'s row is kept, free (or soon: a lingering release).
    fn freed_now(&self, id: &[u8; 32]) {
        let mut freed = self.freed.lock().unwrap_or_else(|e| e.into_inner());
        if freed.len() >= FREED_KNOWN {
            freed.clear();
        }
        freed.insert(*id);
    }

    /// Whether this process freed `id`'s row (and has not forgotten).
    fn was_freed(&self, id: &[u8; 32]) -> bool {
        self.freed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(id)
    }

    /// Deletes the rows of keys free for longer than [`sql::KEPT_FREE_SECS`]
    /// (at most [`sql::PURGED_AT_MOST`]), and their holder rows: how many.
    async fn purge(&self) -> Result<u64, StoreError> {
        let statements = &self.statements;
        let ids: Vec<Vec<u8>> = self
            .on_conn(async |conn| conn.exec(&statements.purge_find, ()).await)
            .await?;
        let mut purged = 0;
        for id in ids {
            // By primary key, each in its own statement: no lock held on
            // rows in use, and a key taken meanwhile is left alone.
            let deleted = self
                .on_conn(async |conn| {
                    conn.exec_drop(&statements.purge_key, (&id,)).await?;
                    Ok(conn.affected_rows())
                })
                .await?;
            if deleted == 1 {
                self.exec_id(&statements.purge_holders, (&id,)).await?;
                purged += 1;
            }
        }
        if purged > 0 {
            self.freed.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
        Ok(purged)
    }

    /// Extends a share or permit to `by` from now, or releases it: whether
    /// it was still held.
    async fn unclaim(
        &self,
        id: &[u8; 32],
        token: LockToken,
        by: Duration,
        release: bool,
    ) -> Result<bool, StoreError> {
        let token = token.to_string();
        let (token, statement) = (token.as_str(), &self.statements.unclaim);
        let once = move || async move {
            let params = (&id[..], token, micros(by), release);
            // A call the server rolled back (a deadlock with a claimer)
            // did nothing: sent again.
            let mut tries = 0;
            let done: Option<i64> = loop {
                match self.first(statement, params).await {
                    Err(err) if rolled_back(&err) && tries < DEADLOCKS_RETRIED => tries += 1,
                    other => break other?,
                }
            };
            Ok(done == Some(1))
        };
        // A renewal's repeat answers as the first did; a release's would
        // find its own share gone.
        if release {
            once().await
        } else {
            self.again_if_closed(once).await
        }
    }
}

/// Purges the rows of keys long free every [`PURGE_EVERY`] or so, while
/// the store lives.
async fn purge_now_and_then(shared: Weak<Shared>) {
    let fifth = PURGE_EVERY / 5;
    loop {
        let pause = PURGE_EVERY - fifth + fifth.mul_f64(2.0 * rand::random::<f64>());
        tokio::time::sleep(pause).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        match shared.purge().await {
            Ok(0) => {}
            Ok(purged) => tracing::debug!(purged, "purged the rows of keys long free"),
            Err(err) => tracing::warn!(%err, "could not purge the rows of keys long free"),
        }
    }
}

/// The client's error as the store's: a server's refusal of the statement
/// itself (bad SQL, a missing table or procedure, no right) can never
/// succeed as sent; the rest (the connection, a deadlock or a lock wait
/// rolled back, the server shutting down) may on the next try.
fn mysql_error(err: mysql_async::Error) -> StoreError {
    match &err {
        mysql_async::Error::Server(server)
            if !matches!(server.code, ER_LOCK_DEADLOCK | ER_LOCK_WAIT_TIMEOUT)
                && matches!(server.state.get(..2), Some("42")) =>
        {
            StoreError::misuse(err)
        }
        _ => StoreError::unavailable(err),
    }
}

/// Whether the call failed on a closed connection: nothing of the
/// statement ran, or (a connection cut while it ran) as if it had.
fn closed(err: &StoreError) -> bool {
    err.get_ref()
        .downcast_ref::<mysql_async::Error>()
        .is_some_and(|err| {
            matches!(
                err,
                mysql_async::Error::Io(_)
                    | mysql_async::Error::Driver(mysql_async::DriverError::ConnectionClosed)
            )
        })
}

/// Whether the server rolled the statement back for a deadlock or a lock
/// wait: the key is busy; asking again is safe.
fn rolled_back(err: &StoreError) -> bool {
    server_code(err).is_some_and(|code| matches!(code, ER_LOCK_DEADLOCK | ER_LOCK_WAIT_TIMEOUT))
}

/// The server's error code, when the server refused the statement.
fn server_code(err: &StoreError) -> Option<u16> {
    match err.get_ref().downcast_ref::<mysql_async::Error>()? {
        mysql_async::Error::Server(server) => Some(server.code),
        _ => None,
    }
}

/// What the `lock_key` column keeps of `key`: its first 255 bytes.
fn shown_key(key: &str) -> &[u8] {
    &key.as_bytes()[..key.len().min(255)]
}

/// The row id of `key`: its SHA-256.
fn row_id(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

impl MySqlStore {
    /// The store over `shared`, which it purges now and then while it
    /// lives (see [`purge`](Self::purge)).
    fn new(shared: Arc<Shared>, poll: Duration, shown: String) -> Self {
        tokio::spawn(purge_now_and_then(Arc::downgrade(&shared)));
        MySqlStore {
            shared,
            capabilities: CAPABILITIES.with_polled_releases(poll),
            shown,
        }
    }

    /// Deletes the rows of keys free for more than ten minutes, at most
    /// 500 of them, and returns how many. A released key's row is kept
    /// that long, with its fencing value (see the module's "Fencing"). The
    /// store does this on its own every five minutes or so; call it to
    /// clear the table sooner.
    ///
    /// # Errors
    ///
    /// The server's, when it cannot be reached or refuses the statements.
    pub async fn purge(&self) -> Result<u64, StoreError> {
        self.shared.purge().await
    }

    /// One exclusive attempt: granted, or how the key is held.
    async fn acquire_exclusive(&self, request: &AcquireRequest<'_>) -> Result<Acquire, StoreError> {
        let id = row_id(request.key);
        let token = request.token.to_string();
        let ttl = micros(request.ttl);
        let granted = |fencing| Acquire::Acquired {
            fencing,
            lease: Box::new(MySqlLease {
                shared: self.shared.clone(),
                id,
                token: request.token,
                ttl: request.ttl,
                one_of_many: false,
            }),
        };
        if !request.hints.contended && self.shared.was_freed(&id) {
            // A key this process released: its row is most often still
            // free. Held (by another, or by us after an attempt whose
            // answer was lost) or purged, the upsert below decides.
            let take = &self.shared.statements.take;
            let once = || self.shared.exec_id(take, (token.as_str(), ttl, &id[..]));
            match self.shared.again_if_closed(once).await {
                Ok(Some(fencing)) => return Ok(granted(Some(fencing))),
                Ok(None) => {}
                Err(err) if rolled_back(&err) => {}
                Err(err) => return Err(err),
            }
        } else if !request.hints.contended {
            // A key not known to be in demand, nor freed here, most often
            // has no row: a plain insert takes it. A row (held, free,
            // expired, or ours from an attempt whose answer was lost) makes
            // it fail with nothing written, and the upsert below decides.
            let insert = &self.shared.statements.insert;
            let once = || {
                let params = (&id[..], shown_key(request.key), token.as_str(), ttl);
                self.shared.exec_id(insert, params)
            };
            match self.shared.again_if_closed(once).await {
                Ok(fencing) => {
                    let fencing = fencing.ok_or("the insert set no LAST_INSERT_ID")?;
                    return Ok(granted(Some(fencing)));
                }
                Err(err) if server_code(&err) == Some(ER_DUP_ENTRY) || rolled_back(&err) => {}
                Err(err) => return Err(err),
            }
        }
        let params = || {
            Params::Positional(vec![
                (&id[..]).into(),
                shown_key(request.key).into(),
                token.as_str().into(),
                ttl.into(),
                request.hints.waits.into(),
                token.as_str().into(),
                token.as_str().into(),
                token.as_str().into(),
                ttl.into(),
            ])
        };
        let mut tries = 0;
        let answer = loop {
            // A retried acquire gets the same answer (the contract's first
            // rule): a repeat on another connection is safe.
            let once = || {
                self.shared
                    .exec_id(&self.shared.statements.acquire, params())
            };
            match self.shared.again_if_closed(once).await {
                Err(err) if rolled_back(&err) && tries < DEADLOCKS_RETRIED => tries += 1,
                Err(err) if rolled_back(&err) => {
                    // Busy with other callers' first inserts: ask again soon.
                    return Ok(Acquire::Held {
                        remaining: Some(Duration::ZERO),
                    });
                }
                other => break other?.ok_or("the acquire statement set no LAST_INSERT_ID")?,
            }
        };
        if answer < HELD {
            return Ok(granted(Some(answer)));
        }
        let (kind, remaining) = sql::held(answer);
        let held = match kind {
            0 => Claim::Exclusive,
            1 => Claim::Shared,
            limit => NonZeroU32::new(limit).map_or(Claim::Exclusive, Claim::permits),
        };
        request.claim.fits(held)?;
        Ok(Acquire::Held {
            remaining: Some(remaining),
        })
    }

    /// One attempt at a share or a permit (the claim procedure): one round
    /// trip.
    async fn claim(&self, request: &AcquireRequest<'_>) -> Result<Acquire, StoreError> {
        let id = row_id(request.key);
        let (asked, limit) = claim_text::text(request.claim);
        let token = request.token.to_string();
        let params = || {
            Params::Positional(vec![
                (&id[..]).into(),
                shown_key(request.key).into(),
                token.as_str().into(),
                micros(request.ttl).into(),
                asked.as_str().into(),
                limit.into(),
                request.hints.waits.into(),
            ])
        };
        // A repeat by the same token answers as the first did, also after
        // the server rolled the call back (a deadlock between claimers).
        let once = || self.shared.first(&self.shared.statements.claim, params());
        let mut tries = 0;
        let row: Option<(i64, u64, Option<String>)> = loop {
            match self.shared.again_if_closed(once).await {
                Err(err) if rolled_back(&err) && tries < DEADLOCKS_RETRIED => tries += 1,
                Err(err) if rolled_back(&err) => {
                    // Busy with other claimers: ask again soon.
                    return Ok(Acquire::Held {
                        remaining: Some(Duration::ZERO),
                    });
                }
                other => break other?,
            }
        };
        let (answer, value, held) = row.ok_or("the claim procedure returned no row")?;
        match answer {
            1 => Ok(Acquire::Acquired {
                fencing: Some(value),
                lease: Box::new(MySqlLease {
                    shared: self.shared.clone(),
                    id,
                    token: request.token,
                    ttl: request.ttl,
                    one_of_many: true,
                }),
            }),
            2 => {
                let held = claim_text::claim_of(held.as_deref().unwrap_or_default());
                Err(ClaimMismatch::new(held, request.claim).into())
            }
            _ => Ok(Acquire::Held {
                remaining: Some(Duration::from_micros(value)),
            }),
        }
    }
}

impl Store for MySqlStore {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> Reply<'a, Acquire> {
        Reply::new(async move {
            if request.claim == Claim::Exclusive {
                self.acquire_exclusive(&request).await
            } else {
                self.claim(&request).await
            }
        })
    }

    fn abandon<'a>(&'a self, key: &'a str, token: LockToken) -> Reply<'a, bool> {
        Reply::new(async move {
            // The claim is not known here: the key's lease, else a share.
            let id = row_id(key);
            Ok(self.shared.release(&id, token).await?
                || self
                    .shared
                    .unclaim(&id, token, Duration::ZERO, true)
                    .await?)
        })
    }

    fn watch<'a>(&'a self, _key: &'a str) -> Reply<'a, ReleaseWatch> {
        // No notifications: waiters ask again every poll interval.
        Reply::ready(Ok(ReleaseWatch::never()))
    }

    fn force_release<'a>(&'a self, key: &'a str) -> Reply<'a, bool> {
        Reply::new(async move {
            let id = row_id(key);
            let forced: Option<i64> = self
                .shared
                .first(&self.shared.statements.force, (&id[..],))
                .await?;
            Ok(forced == Some(1))
        })
    }

    fn inspect<'a>(&'a self, key: &'a str) -> Reply<'a, Option<LeaseInfo>> {
        Reply::new(async move {
            let id = row_id(key);
            type Row = (
                String,
                u64,
                i64,
                Option<String>,
                Option<u64>,
                Option<i64>,
                i64,
            );
            let row: Option<Row> = self
                .shared
                .again_if_closed(|| {
                    self.shared
                        .first(&self.shared.statements.inspect, (&id[..],))
                })
                .await?;
            let Some((held, fencing, us, holder, holder_fencing, holder_us, live)) = row else {
                return Ok(None);
            };
            let claim = claim_text::claim_of(&held);
            let remaining = |us: i64| Some(Duration::from_micros(u64::try_from(us).unwrap_or(0)));
            if claim == Claim::Exclusive {
                if us <= 0 {
                    return Ok(None);
                }
                let info = LeaseInfo::new(held.parse().ok(), fencing, remaining(us));
                return Ok(Some(info.with_holders(claim, 1)));
            }
            let (Some(token), Some(fencing), Some(us)) = (holder, holder_fencing, holder_us) else {
                // Free, a waiting writer's mark aside.
                return Ok(None);
            };
            let info = LeaseInfo::new(token.parse().ok(), fencing, remaining(us));
            Ok(Some(info.with_holders(
                claim,
                usize::try_from(live).unwrap_or(usize::MAX),
            )))
        })
    }
}

impl fmt::Debug for MySqlStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MySqlStore")
            .field("url", &self.shown)
            .field("table", &self.shared.table.name)
            .field("poll", &self.capabilities.release_poll)
            .finish_non_exhaustive()
    }
}
