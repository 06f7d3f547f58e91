//! PostgreSQL: a lease table, for teams whose only shared store is their
//! database (seed 004's database lock, done with expiring leases and
//! fencing).
//!
//! # Table
//!
//! ```sql
//! CREATE TABLE lock_leases (
//!     id         bytea PRIMARY KEY,       -- sha256 of the key
//!     key        bytea NOT NULL,          -- the key itself, for people reading the table
//!     token      text NOT NULL,           -- the holder's random token
//!     fencing    bigint NOT NULL,         -- from the sequence below
//!     expires_at timestamptz NOT NULL,    -- by the database's clock
//!     waiting    boolean NOT NULL DEFAULT false  -- someone waits for its release
//! );
//! CREATE SEQUENCE lock_leases_fencing;
//! ```
//!
//! Both are created on first use (`CREATE ... IF NOT EXISTS`, under an
//! advisory lock so that processes starting together do not collide); the
//! name is a builder option. A user without the right to create them gets a
//! clear error at connect; create them beforehand with the statements above.
//! The row's id is the key's SHA-256, so keys of any bytes and any length up
//! to the registry's limit fit the index.
//!
//! # Statements
//!
//! Every operation is one statement, one round trip, with the key and token
//! as parameters (never spliced into the SQL), timed by the database's clock
//! (`clock_timestamp()`), never the client's:
//!
//! - acquire inserts the row, or takes over an expired one, with the next
//!   value of the sequence, and returns the fencing value: the statement of
//!   a plain lock table, plus a transaction-scoped advisory lock on the key
//!   taken before the value is drawn. Without it, a statement that drew its
//!   value and then waited on the row (a release in progress) could, if its
//!   backend ran late, write that value after a later statement had drawn a
//!   greater one, been granted and released: a fencing token going back
//!   (a hand-over draws its value the same way). Refused, it asks a second
//!   statement for the holder's remaining time (and marks the row when the
//!   caller waits): only a contended attempt pays two round trips;
//! - renew, release and hand-over are owner-checked by token; release
//!   deletes the row and, if someone waits for it, sends `NOTIFY` in the
//!   same statement; a release that must linger (`hold_at_least`) shortens
//!   the row's expiry instead.
//!
//! `NOTIFY` is not free: PostgreSQL serialises the commits of notifying
//! transactions. So a release notifies only when the row says someone
//! waits: a waiter marks the row when it subscribes and with every refused
//! attempt (the holder may have changed meanwhile), and an uncontended lock
//! never notifies.
//!
//! Waiters listen on one channel (`LISTEN`, one connection per store, which
//! reconnects and listens again after it drops); the payload is the hex
//! SHA-256 of the released key. Expired rows send nothing, so waiters also
//! retry when the holder's lease says it ends.
//!
//! # Fencing
//!
//! Tokens come from the sequence: strictly increasing across keys and
//! holders, across restarts and crashes of the server (a sequence never
//! hands out a value twice once it is durable). After a failover to an
//! asynchronous standby that missed the last commits, values handed out in
//! that window can be handed out again: the promise then holds only with
//! synchronous replication.

mod listener;
mod session;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::Mutex as AsyncMutex;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Config, Row, Socket, Statement};

use super::{
    Acquire, AcquireRequest, BoxFuture, Capabilities, FencingPromise, HandOver, Lease, LeaseInfo,
    LockToken, ReleaseWatch, SafetyMargin, Store,
};
use crate::error::BackendError;
use crate::store::support::redact::redact;
use listener::Listener;
use session::Opener;

/// What the PostgreSQL store can do.
const CAPABILITIES: Capabilities = Capabilities::new("postgres")
    .with_ttl(Duration::from_millis(100), Duration::from_millis(1))
    .with_features(true, true, true, false)
    .with_margin(SafetyMargin::new(Duration::from_millis(10), 2_000))
    .with_fencing(FencingPromise::new(true, false, true));

/// How often an acquire tries again at once when it was refused by a holder
/// that was gone by the time it asked how long it holds.
const REFUSALS_RETRIED: usize = 3;

/// The channel releases are announced on.
const CHANNEL: &str = "lock_leases_released";

/// Configures and connects a [`PostgresStore`].
#[derive(Debug)]
pub struct PostgresStoreBuilder {
    url: String,
    table: String,
    connections: usize,
    response_timeout: Duration,
    connection_timeout: Duration,
    opener: Opener,
}

impl PostgresStoreBuilder {
    /// Connects through `tls`, any `tokio-postgres` TLS connector
    /// (`postgres_openssl::MakeTlsConnector`,
    /// `tokio_postgres_rustls::MakeRustlsConnect`, ...): every session of
    /// the store, statements and listening alike. Without it, sessions are
    /// plain TCP; `sslmode=require` in the connect string then fails.
    pub fn tls<T>(mut self, tls: T) -> Self
    where
        T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
        T::Stream: Send + 'static,
        T::TlsConnect: Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        self.opener = Opener::tls(tls);
        self
    }

    /// The lease table's name (default `lock_leases`; its sequence is the
    /// name with `_fencing`). Letters, digits and `_`, at most 50 bytes,
    /// not starting with a digit.
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// How many connections run statements (default 4). Each pipelines the
    /// statements of many tasks; a connection that drops is replaced.
    pub fn connections(mut self, connections: usize) -> Self {
        self.connections = connections.max(1);
        self
    }

    /// How long a statement may take before it fails (default 2 s).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How long connecting may take before it fails (default 2 s).
    pub fn connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }

    /// Connects the first statement connection, creates the table and the
    /// sequence if they are missing, and prepares the statements. The
    /// listening connection is made on the first wait. Sessions are plain
    /// TCP unless [`tls`](Self::tls) gave a connector.
    ///
    /// # Errors
    ///
    /// An invalid connect string or table name, an unreachable server,
    /// refused credentials, or no right to create the table. Never contains
    /// the password.
    pub async fn connect(self) -> Result<PostgresStore, BackendError> {
        let table = Table::new(&self.table)?;
        let mut config: Config = self
            .url
            .parse()
            .map_err(|err| format!("invalid connect string `{}`: {err}", redact(&self.url)))?;
        config.connect_timeout(self.connection_timeout);
        let shared = Arc::new(Shared {
            opener: self.opener.clone(),
            config,
            table,
            response_timeout: self.response_timeout,
            slots: (0..self.connections)
                .map(|_| AsyncMutex::new(None))
                .collect(),
        });
        let client = shared.open().await?;
        shared.table.create(&client).await?;
        let first = shared.prepared(client).await?;
        *shared.slots[0].lock().await = Some(first);
        let listener = Listener::new(shared.config.clone(), self.opener, self.connection_timeout);
        Ok(PostgresStore {
            shared,
            listener,
            shown: redact(&self.url),
        })
    }
}

/// The PostgreSQL store. Cheap to clone; clones share the connections.
///
/// # Examples
///
/// ```no_run
/// use lock_runtime::{LockError, LockOptions, LockRegistry};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// let registry = LockRegistry::postgres("postgres://app:secret@10.0.0.7/shop").await?;
/// let guard = registry.lock("stock:7", LockOptions::default()).await?;
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct PostgresStore {
    shared: Arc<Shared>,
    listener: Arc<Listener>,
    shown: String,
}

impl PostgresStore {
    /// Starts configuring a store for `url`.
    pub fn builder(url: &str) -> PostgresStoreBuilder {
        PostgresStoreBuilder {
            url: url.to_owned(),
            table: "lock_leases".to_owned(),
            connections: 4,
            response_timeout: Duration::from_secs(2),
            connection_timeout: Duration::from_secs(2),
            opener: Opener::plain(),
        }
    }
}

/// The statement connections and what they need.
struct Shared {
    opener: Opener,
    config: Config,
    table: Table,
    response_timeout: Duration,
    /// Statement connections, made on first use and replaced once closed.
    slots: Vec<AsyncMutex<Option<Conn>>>,
}

/// One statement connection and its prepared statements.
#[derive(Clone)]
struct Conn {
    client: Arc<Client>,
    statements: Arc<Statements>,
}

struct Statements {
    acquire: Statement,
    refused: Statement,
    extend: Statement,
    release: Statement,
    hand_over: Statement,
    force_release: Statement,
    inspect: Statement,
}

impl Shared {
    /// A new session, driven by a task of its own.
    async fn open(&self) -> Result<Client, BackendError> {
        let (client, mut messages) = self.opener.open(&self.config).await.map_err(pg_error)?;
        tokio::spawn(async move {
            // Drives the session; its notices are of no use here.
            while let Some(message) = std::future::poll_fn(|cx| messages(cx)).await {
                if let Err(error) = message {
                    tracing::debug!(%error, "lock statement connection ended");
                    return;
                }
            }
        });
        Ok(client)
    }

    /// `client` with the statements prepared on it.
    async fn prepared(&self, client: Client) -> Result<Conn, BackendError> {
        let statements = self.table.prepare(&client).await.map_err(pg_error)?;
        Ok(Conn {
            client: Arc::new(client),
            statements: Arc::new(statements),
        })
    }

    async fn connect(&self) -> Result<Conn, BackendError> {
        let client = self.open().await?;
        self.prepared(client).await
    }

    /// The statement connection of the row `id` (always the same one, so a
    /// key's statements keep their order and one task stays on one
    /// session), connected if it is not.
    async fn conn(&self, id: &[u8]) -> Result<Conn, BackendError> {
        let mut prefix = [0u8; 8];
        prefix.copy_from_slice(&id[..8]);
        let at = (u64::from_le_bytes(prefix) % self.slots.len() as u64) as usize;
        let mut slot = self.slots[at].lock().await;
        if let Some(conn) = slot.as_ref().filter(|conn| !conn.client.is_closed()) {
            return Ok(conn.clone());
        }
        let conn = self.connect().await?;
        *slot = Some(conn.clone());
        Ok(conn)
    }

    /// Runs one statement that returns at most one row, within the
    /// response timeout.
    async fn query_opt(
        &self,
        id: &[u8],
        pick: impl Fn(&Statements) -> &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, BackendError> {
        self.timed(async {
            let conn = self.conn(id).await?;
            let row = conn.client.query_opt(pick(&conn.statements), params);
            row.await.map_err(pg_error)
        })
        .await
    }

    /// Runs one statement within the response timeout; how many rows it
    /// changed.
    async fn execute(
        &self,
        id: &[u8],
        pick: impl Fn(&Statements) -> &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, BackendError> {
        self.timed(async {
            let conn = self.conn(id).await?;
            let changed = conn.client.execute(pick(&conn.statements), params);
            changed.await.map_err(pg_error)
        })
        .await
    }

    async fn timed<T>(
        &self,
        run: impl Future<Output = Result<T, BackendError>>,
    ) -> Result<T, BackendError> {
        tokio::time::timeout(self.response_timeout, run)
            .await
            .map_err(|_| -> BackendError {
                format!("no answer within {:?}", self.response_timeout).into()
            })?
    }

    /// After a refusal: the live holder's remaining time, if there still
    /// is one; marks its row when `mark`.
    async fn refused(&self, id: &[u8], mark: bool) -> Result<Option<Duration>, BackendError> {
        let row = self.query_opt(id, |s| &s.refused, &[&id, &mark]).await?;
        Ok(row.map(|row| {
            let ms: i64 = row.get(0);
            Duration::from_millis(u64::try_from(ms).unwrap_or(0))
        }))
    }

    async fn release(
        &self,
        id: &[u8],
        token: LockToken,
        linger: Duration,
    ) -> Result<bool, BackendError> {
        let token = token.to_string();
        let changed = if linger.is_zero() {
            self.execute(id, |s| &s.release, &[&id, &token, &CHANNEL])
                .await?
        } else {
            let linger = millis(linger);
            self.execute(id, |s| &s.extend, &[&id, &token, &linger])
                .await?
        };
        Ok(changed == 1)
    }
}

/// The lease table's name, checked, and its statements.
struct Table {
    name: String,
}

impl Table {
    fn new(name: &str) -> Result<Table, BackendError> {
        let valid = !name.is_empty()
            && name.len() <= 50
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!(
                "invalid table name `{name}`: letters, digits and `_`, at most 50 bytes, not starting with a digit"
            )
            .into());
        }
        Ok(Table {
            name: name.to_ascii_lowercase(),
        })
    }

    /// Creates the table and its sequence if they are missing, one process
    /// at a time.
    async fn create(&self, client: &Client) -> Result<(), BackendError> {
        let t = &self.name;
        // Creating needs the right to create, even when the table exists:
        // a role that may only use it must not be asked to.
        let exists: bool = client
            .query_one(
                "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL",
                &[&t, &format!("{t}_fencing")],
            )
            .await
            .map_err(pg_error)?
            .get(0);
        if exists {
            return Ok(());
        }
        let sql = format!(
            "BEGIN;
             SELECT pg_advisory_xact_lock(hashtext('lock-runtime:{t}'));
             CREATE TABLE IF NOT EXISTS {t} (
                 id bytea PRIMARY KEY,
                 key bytea NOT NULL,
                 token text NOT NULL,
                 fencing bigint NOT NULL,
                 expires_at timestamptz NOT NULL,
                 waiting boolean NOT NULL DEFAULT false
             );
             CREATE SEQUENCE IF NOT EXISTS {t}_fencing;
             COMMIT;"
        );
        client
            .batch_execute(&sql)
            .await
            .map_err(|err| -> BackendError {
                format!(
                    "cannot create the lease table `{t}` (create it beforehand, see the docs): {}",
                    pg_error(err)
                )
                .into()
            })
    }

    async fn prepare(&self, client: &Client) -> Result<Statements, tokio_postgres::Error> {
        let t = &self.name;
        let remaining = "ceil(extract(epoch from (expires_at - clock_timestamp())) * 1000)::bigint";
        Ok(Statements {
            // $1 id, $2 key, $3 token, $4 ttl ms: the fencing value if
            // granted, no row if held. A repeat by the same token answers
            // as the first run did (same fencing). The statement a plain
            // lock table needs and no more: the common path pays for
            // nothing else.
            //
            // The key's turn first ($5, see `turn`), then the fencing
            // value: a statement that waits on the row (a release in
            // progress) keeps its turn, so no later statement on the key
            // takes a value, is granted and releases before this one
            // writes its earlier value.
            acquire: client
                .prepare(&format!(
                    "WITH acquiring AS (SELECT pg_advisory_xact_lock(hashtext('{t}'), $5))
                     INSERT INTO {t} AS l (id, key, token, fencing, expires_at)
                     SELECT $1, $2, $3, nextval('{t}_fencing'),
                            clock_timestamp() + $4::bigint * interval '1 millisecond'
                     FROM acquiring
                     ON CONFLICT (id) DO UPDATE
                         SET token = excluded.token,
                             fencing = CASE WHEN l.token = excluded.token
                                            THEN l.fencing ELSE excluded.fencing END,
                             expires_at = excluded.expires_at,
                             waiting = l.waiting AND l.token = excluded.token
                         WHERE l.expires_at <= clock_timestamp() OR l.token = excluded.token
                     RETURNING fencing"
                ))
                .await?,
            // $1 id, $2 mark: after a refusal (or to subscribe), the
            // holder's remaining time, no row if there is no live holder
            // any more; marks the row when asked, so that its release
            // notifies. A marking caller is told of a holder only if the
            // row is marked: by this update (which waits for a release in
            // progress and then finds the row gone), or already (a release
            // then notifies). Reading the row from the statement's snapshot
            // instead once told a waiter of a holder whose release, not yet
            // committed, had read `waiting` as false: no notification came,
            // and the waiter slept until its timed retry (5 s in the
            // benchmark's row 11).
            refused: client
                .prepare(&format!(
                    "WITH marked AS (
                         UPDATE {t} SET waiting = true
                         WHERE $2 AND id = $1 AND NOT waiting AND expires_at > clock_timestamp()
                         RETURNING {remaining}
                     )
                     (SELECT * FROM marked)
                     UNION ALL
                     (SELECT {remaining} FROM {t}
                      WHERE id = $1 AND expires_at > clock_timestamp() AND (waiting OR NOT $2))
                     LIMIT 1"
                ))
                .await?,
            // $1 id, $2 token, $3 ms: our lease ends that long from now (a
            // renewal by the ttl, a lingering release by what is left).
            extend: client
                .prepare(&format!(
                    "UPDATE {t} SET expires_at = clock_timestamp() + $3::bigint * interval '1 millisecond'
                     WHERE id = $1 AND token = $2 AND expires_at > clock_timestamp()"
                ))
                .await?,
            // $1 id, $2 token, $3 channel. Notifies only if someone waits.
            release: client
                .prepare(&format!(
                    "DELETE FROM {t}
                     WHERE id = $1 AND token = $2 AND expires_at > clock_timestamp()
                     RETURNING (CASE WHEN waiting THEN pg_notify($3, encode(id, 'hex')) END) IS NULL"
                ))
                .await?,
            // $1 id, $2 token, $3 next token, $4 ttl ms, $5 the key's turn
            // (as in `acquire`).
            hand_over: client
                .prepare(&format!(
                    "WITH handing_over AS (SELECT pg_advisory_xact_lock(hashtext('{t}'), $5))
                     UPDATE {t} SET token = $3, fencing = nextval('{t}_fencing'),
                         expires_at = clock_timestamp() + $4::bigint * interval '1 millisecond'
                     FROM handing_over
                     WHERE id = $1 AND token = $2 AND expires_at > clock_timestamp()
                     RETURNING fencing"
                ))
                .await?,
            // $1 id, $2 channel.
            force_release: client
                .prepare(&format!(
                    "DELETE FROM {t} WHERE id = $1 AND expires_at > clock_timestamp()
                     RETURNING pg_notify($2, encode(id, 'hex')) IS NULL"
                ))
                .await?,
            // $1 id: the live holder's token, fencing and remaining time.
            inspect: client
                .prepare(&format!(
                    "SELECT token, fencing, {remaining} FROM {t}
                     WHERE id = $1 AND expires_at > clock_timestamp()"
                ))
                .await?,
        })
    }
}

/// The client's error with the server's own message, which its `Display`
/// leaves out ("db error").
pub(super) fn pg_error(err: tokio_postgres::Error) -> BackendError {
    match err.as_db_error() {
        Some(db) => format!("{err}: {db}").into(),
        None => Box::new(err),
    }
}

/// The row id of `key`: its SHA-256.
/// The advisory lock a key's fencing values are drawn under (with the
/// table's name): the first four bytes of its row id. Keys that share them
/// only take turns.
fn turn(id: &[u8]) -> i32 {
    let mut first = [0u8; 4];
    for (to, from) in first.iter_mut().zip(id) {
        *to = *from;
    }
    i32::from_be_bytes(first)
}

fn row_id(key: &str) -> Vec<u8> {
    Sha256::digest(key.as_bytes()).to_vec()
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// One lease row: its id and our token.
struct PostgresLease {
    shared: Arc<Shared>,
    id: Vec<u8>,
    token: LockToken,
    ttl: Duration,
}

impl Lease for PostgresLease {
    fn renew(&mut self) -> BoxFuture<'_, Result<bool, BackendError>> {
        Box::pin(async move {
            let (token, ttl) = (self.token.to_string(), millis(self.ttl));
            let changed = self
                .shared
                .execute(&self.id, |s| &s.extend, &[&self.id, &token, &ttl])
                .await?;
            Ok(changed == 1)
        })
    }

    fn release(&mut self, linger: Duration) -> BoxFuture<'_, Result<bool, BackendError>> {
        Box::pin(self.shared.release(&self.id, self.token, linger))
    }

    fn hand_over(&mut self) -> BoxFuture<'_, Result<HandOver, BackendError>> {
        Box::pin(async move {
            let next = LockToken::random();
            let (token, next_text, ttl) =
                (self.token.to_string(), next.to_string(), millis(self.ttl));
            let row = self
                .shared
                .query_opt(
                    &self.id,
                    |s| &s.hand_over,
                    &[&self.id, &token, &next_text, &ttl, &turn(&self.id)],
                )
                .await?;
            let fencing: Option<i64> = row.map(|row| row.get(0));
            if fencing.is_some() {
                self.token = next;
            }
            Ok(fencing.map(|f| u64::try_from(f).unwrap_or(0)).into())
        })
    }
}

impl fmt::Debug for PostgresLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresLease").finish_non_exhaustive()
    }
}

impl Store for PostgresStore {
    fn capabilities(&self) -> &Capabilities {
        &CAPABILITIES
    }

    fn acquire<'a>(
        &'a self,
        request: AcquireRequest<'a>,
    ) -> BoxFuture<'a, Result<Acquire, BackendError>> {
        Box::pin(async move {
            let id = row_id(request.key);
            let key = request.key.as_bytes();
            let (token, ttl) = (request.token.to_string(), millis(request.ttl));
            // A refusal whose holder is gone by the time it is asked how
            // long it holds: try again at once, a few times.
            for _ in 0..REFUSALS_RETRIED {
                let granted = self
                    .shared
                    .query_opt(&id, |s| &s.acquire, &[&id, &key, &token, &ttl, &turn(&id)])
                    .await?;
                if let Some(row) = granted {
                    let fencing: i64 = row.get(0);
                    return Ok(Acquire::Acquired {
                        fencing: u64::try_from(fencing).unwrap_or(0),
                        lease: Box::new(PostgresLease {
                            shared: self.shared.clone(),
                            id,
                            token: request.token,
                            ttl: request.ttl,
                        }),
                    });
                }
                if let Some(remaining) = self.shared.refused(&id, request.waits).await? {
                    return Ok(Acquire::Held {
                        remaining: Some(remaining),
                    });
                }
            }
            Ok(Acquire::Held {
                remaining: Some(Duration::ZERO),
            })
        })
    }

    fn abandon<'a>(
        &'a self,
        key: &'a str,
        token: LockToken,
    ) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            self.shared
                .release(&row_id(key), token, Duration::ZERO)
                .await
        })
    }

    fn watch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<ReleaseWatch, BackendError>> {
        Box::pin(async move {
            let id = row_id(key);
            let watch = self.listener.watch(hex(&id)).await?;
            // Listening first: a release after the mark is not missed.
            self.shared.refused(&id, true).await?;
            Ok(watch)
        })
    }

    fn force_release<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<bool, BackendError>> {
        Box::pin(async move {
            let id = row_id(key);
            let changed = self
                .shared
                .execute(&id, |s| &s.force_release, &[&id, &CHANNEL])
                .await?;
            Ok(changed == 1)
        })
    }

    fn inspect<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<LeaseInfo>, BackendError>> {
        Box::pin(async move {
            let id = row_id(key);
            let row = self.shared.query_opt(&id, |s| &s.inspect, &[&id]).await?;
            Ok(row.map(|row| {
                let token: &str = row.get(0);
                let fencing: i64 = row.get(1);
                let ms: i64 = row.get(2);
                LeaseInfo::new(
                    token.parse().ok(),
                    u64::try_from(fencing).unwrap_or(0),
                    Some(Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
                )
            }))
        })
    }
}

/// Lowercase hex, as PostgreSQL's `encode(.., 'hex')` writes it.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("url", &self.shown)
            .field("table", &self.shared.table.name)
            .field("sessions", &self.shared.opener)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_checked() {
        assert!(Table::new("lock_leases").is_ok());
        assert_eq!(Table::new("Shop_Locks").unwrap().name, "shop_locks");
        for bad in ["", "1locks", "locks; DROP TABLE x", "a-b", &"x".repeat(51)] {
            let err = Table::new(bad).err().expect(bad).to_string();
            assert!(err.starts_with("invalid table name"), "{err}");
        }
    }

    #[test]
    fn row_ids_are_the_keys_sha256_in_hex_as_postgres_writes_it() {
        assert_eq!(
            hex(&row_id("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
