//! PostgreSQL: a lease table, for teams whose only shared store is their
//! database: a lock row per key, with an expiring lease and a fencing
//! token.
//!
//! # Table
//!
//! ```sql
//! CREATE TABLE lock_leases (
//!     id           bytea PRIMARY KEY,     -- sha256 of the key
//!     key          bytea NOT NULL,        -- the key itself, for people reading the table
//!     token        text NOT NULL,         -- the holder's random token ('*shared', '*permits:N': see below)
//!     fencing      bigint NOT NULL,       -- from the sequence below
//!     expires_at   timestamptz NOT NULL,  -- by the database's clock
//!     waiting      boolean NOT NULL DEFAULT false,  -- someone waits for its release
//!     writer_until timestamptz            -- a writer waits: no new read shares until then
//! );
//! CREATE SEQUENCE lock_leases_fencing;
//! CREATE TABLE lock_leases_holders (      -- one row per read share or permit
//!     id bytea NOT NULL, token text NOT NULL, fencing bigint NOT NULL,
//!     expires_at timestamptz NOT NULL, PRIMARY KEY (id, token)
//! );
//! -- and three functions: lock_leases_claim, lock_leases_unclaim, lock_leases_force
//! ```
//!
//! All of it is created on first use (`CREATE ... IF NOT EXISTS`, under an
//! advisory lock so that processes starting together do not collide), and
//! what a table made by an earlier version lacks is added then; the name is
//! a builder option. A role without the right to create them gets a clear
//! error at connect: an administrator runs the SQL of
//! [`PostgresStoreBuilder::schema`] beforehand and grants the role
//! `SELECT, INSERT, UPDATE, DELETE` on both tables and `USAGE` on the
//! sequence. The row's id is the key's SHA-256, so keys of any bytes and
//! any length up to the registry's limit fit the index.
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
//! # Semaphores and read-write locks
//!
//! A key held by read shares or permits keeps its row, with the claim
//! (`*shared`, `*permits:N`) in place of a token and the expiry of its
//! longest-lived holder, and each share or permit is a row of
//! `lock_leases_holders` with its own token, fencing value and expiry. One
//! function call grants a share or permit (one round trip): it locks the
//! key's row, drops expired holders, refuses while a writer holds the key
//! or the limit is reached, and draws the fencing value as an acquire
//! does, so values increase across every grant of the key. Renewal and
//! release are one call each; the last release deletes the key's row. A
//! writer refused while shares hold the key and that waits sets
//! `writer_until` 6 s ahead, again with every refusal: new shares are
//! refused until it is served, so readers cannot starve it (on a free key
//! the mark is cut to 50 ms). A key serves one claim while held: another is
//! an error naming both. The mutex's statements are unchanged by any of it.
//!
//! # Poolers
//!
//! Behind a pooler in **session** mode (PgBouncer's `pool_mode = session`)
//! the store works as on a direct connection. In **transaction** mode a
//! session is lent for one transaction at a time, so statements prepared
//! on it and a `LISTEN` on it do not last: connect checks that a
//! notification reaches a listening session and refuses
//! ([`LockError::InvalidSettings`](crate::LockError::InvalidSettings))
//! when it does not. With [`PostgresStoreBuilder::transaction_pooling`]
//! the store sends each statement whole with its parameter types (one
//! round trip, as before) and its waiters ask again every poll interval
//! instead of listening: a hand-off then takes about half the interval.
//! Statement pooling is not supported (the acquire and hand-over are
//! transactions of one statement, but the table's creation is not).
//!
//! # Fencing
//!
//! Tokens come from the sequence: strictly increasing across keys and
//! holders, across restarts and crashes of the server (a sequence never
//! hands out a value twice once it is durable). After a failover to an
//! asynchronous standby that missed the last commits, values handed out in
//! that window can be handed out again: the promise then holds only with
//! synchronous replication.

mod builder;
mod lease;
mod listener;
mod session;
mod statements;
mod table;

pub use builder::PostgresStoreBuilder;
use lease::PostgresLease;
use statements::Shared;
use table::{hex, millis, row_id, turn};

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::{
    Acquire, AcquireRequest, Capabilities, Claim, ClaimMismatch, FencingPromise, LeaseInfo,
    LockToken, ReleaseWatch, Reply, Store,
};
use crate::error::StoreError;
use crate::store::common::claim_text;
use listener::Listener;

/// What the PostgreSQL store can do.
const CAPABILITIES: Capabilities = Capabilities::new("postgres")
    .with_ttl(Duration::from_millis(100), Duration::from_millis(1))
    .with_linger()
    .with_fencing(FencingPromise::INCREASING)
    .with_shares()
    .with_permits();

/// How often an acquire tries again at once when it was refused by a holder
/// that was gone by the time it asked how long it holds.
const REFUSALS_RETRIED: usize = 3;

/// The channel releases are announced on.
const CHANNEL: &str = "lock_leases_released";

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
    waking: Waking,
    capabilities: Capabilities,
    shown: String,
}

/// How waiters learn of releases.
#[derive(Clone)]
enum Waking {
    /// From notifications, on the store's listening session.
    Listen(Arc<Listener>),
    /// By asking again this often (behind a pooler in transaction mode).
    Poll(Duration),
}

impl PostgresStore {
    fn new(shared: Arc<Shared>, waking: Waking, shown: String) -> Self {
        let capabilities = match waking {
            Waking::Listen(_) => CAPABILITIES,
            Waking::Poll(poll) => CAPABILITIES.with_polled_releases(poll),
        };
        PostgresStore {
            shared,
            waking,
            capabilities,
            shown,
        }
    }

    /// Whether a notification reaches a session that listens, within
    /// `wait`: not when a pooler lends sessions per transaction.
    async fn notifications_arrive(&self, wait: Duration) -> Result<bool, StoreError> {
        listener::notifications_arrive(&self.shared, wait).await
    }
}

impl Store for PostgresStore {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> Reply<'a, Acquire> {
        Reply::new(async move {
            if request.claim != Claim::Exclusive {
                return self.claim(request).await;
            }
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
                        fencing: Some(u64::try_from(fencing).unwrap_or(0)),
                        lease: Box::new(PostgresLease {
                            shared: self.shared.clone(),
                            id,
                            token: request.token,
                            ttl: request.ttl,
                            one_of_many: false,
                        }),
                    });
                }
                // Marked rows notify on release: only worth it to listeners.
                let mark = request.hints.waits && matches!(self.waking, Waking::Listen(_));
                if let Some((remaining, held)) =
                    self.shared.refused(&id, mark, request.hints.waits).await?
                {
                    request.claim.fits(held)?;
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

    fn abandon<'a>(&'a self, key: &'a str, token: LockToken) -> Reply<'a, bool> {
        Reply::new(async move {
            // The claim is not known here: the key's lease, else a share.
            let id = row_id(key);
            Ok(self.shared.release(&id, token, Duration::ZERO).await?
                || self.shared.unclaim(&id, token, 0, true).await?)
        })
    }

    fn watch<'a>(&'a self, key: &'a str) -> Reply<'a, ReleaseWatch> {
        Reply::new(async move {
            let id = row_id(key);
            let Waking::Listen(listener) = &self.waking else {
                // No notifications: waiters poll.
                return Ok(ReleaseWatch::never());
            };
            let watch = listener.watch(hex(&id)).await?;
            // Listening first: a release after the mark is not missed.
            self.shared.refused(&id, true, false).await?;
            Ok(watch)
        })
    }

    fn force_release<'a>(&'a self, key: &'a str) -> Reply<'a, bool> {
        Reply::new(async move {
            let id = row_id(key);
            let row = self
                .shared
                .query_opt(&id, |s| &s.force_release, &[&id, &CHANNEL])
                .await?;
            Ok(row.is_some_and(|row| row.get::<_, Option<bool>>(0) == Some(true)))
        })
    }

    fn inspect<'a>(&'a self, key: &'a str) -> Reply<'a, Option<LeaseInfo>> {
        Reply::new(async move {
            let id = row_id(key);
            let row = self.shared.query_opt(&id, |s| &s.inspect, &[&id]).await?;
            let Some(row) = row else {
                return Ok(None);
            };
            let token: &str = row.get(0);
            let fencing: i64 = row.get(1);
            let ms: i64 = row.get(2);
            let held: &str = row.get(3);
            let holders: i64 = row.get(4);
            let claim = claim_text::claim_of(held);
            if holders == 0 {
                // Free, a waiting writer's mark aside.
                return Ok(None);
            }
            let info = LeaseInfo::new(
                token.parse().ok(),
                u64::try_from(fencing).unwrap_or(0),
                Some(Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
            );
            Ok(Some(info.with_holders(
                claim,
                usize::try_from(holders).unwrap_or(usize::MAX),
            )))
        })
    }
}

impl PostgresStore {
    /// One attempt at a share or a permit (see sql/claims.sql): one round
    /// trip.
    async fn claim(&self, request: AcquireRequest<'_>) -> Result<Acquire, StoreError> {
        let id = row_id(request.key);
        let key = request.key.as_bytes();
        let (token, ttl) = (request.token.to_string(), millis(request.ttl));
        let (asked, limit) = claim_text::text(request.claim);
        let mark = request.hints.waits && matches!(self.waking, Waking::Listen(_));
        let row = self
            .shared
            .query_opt(
                &id,
                |s| &s.claim,
                &[&id, &key, &token, &ttl, &asked, &limit, &turn(&id), &mark],
            )
            .await?
            .ok_or("the claim function returned no row")?;
        let (answer, value, held): (i32, Option<i64>, Option<String>) =
            (row.get(0), row.get(1), row.get(2));
        let value = u64::try_from(value.unwrap_or(0)).unwrap_or(0);
        match answer {
            1 => Ok(Acquire::Acquired {
                fencing: Some(value),
                lease: Box::new(PostgresLease {
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
                remaining: Some(Duration::from_millis(value)),
            }),
        }
    }
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresStore")
            .field("url", &self.shown)
            .field("table", &self.shared.table.name)
            .field("sessions", &self.shared.opener)
            .field(
                "transaction_pooling",
                &matches!(self.waking, Waking::Poll(_)),
            )
            .finish_non_exhaustive()
    }
}
