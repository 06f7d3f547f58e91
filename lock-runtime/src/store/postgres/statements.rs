//! The statement connections, opened again when one breaks, and their
//! prepared statements.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex as AsyncMutex;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Config, Row};

use super::CHANNEL;
use super::session::Opener;
use super::table::{Statements, Stmt, Table, millis, pg_error};
use crate::error::StoreError;
use crate::store::common::claim_text;
use crate::store::{Claim, LockToken};

/// The statement connections and what they need.
pub(super) struct Shared {
    pub(super) opener: Opener,
    pub(super) config: Config,
    pub(super) table: Table,
    pub(super) response_timeout: Duration,
    /// Whether sessions are the store's own (statements prepared once per
    /// session), not lent per transaction by a pooler.
    pub(super) prepare: bool,
    /// Statement connections, made on first use and replaced once closed.
    pub(super) connections: Vec<AsyncMutex<Option<Conn>>>,
}

/// One statement connection and its prepared statements.
#[derive(Clone)]
pub(super) struct Conn {
    pub(super) client: Arc<Client>,
    pub(super) statements: Arc<Statements>,
}

impl Shared {
    /// A new session, driven by a task of its own.
    pub(super) async fn open(&self) -> Result<Client, StoreError> {
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

    /// `client` with the statements (prepared on it, unless a pooler lends
    /// sessions per transaction).
    pub(super) async fn prepared(&self, client: Client) -> Result<Conn, StoreError> {
        let statements = self
            .table
            .statements(&client, self.prepare)
            .await
            .map_err(pg_error)?;
        Ok(Conn {
            client: Arc::new(client),
            statements: Arc::new(statements),
        })
    }

    pub(super) async fn connect(&self) -> Result<Conn, StoreError> {
        let client = self.open().await?;
        self.prepared(client).await
    }

    /// The statement connection of the row `id` (always the same one, so a
    /// key's statements keep their order and one task stays on one
    /// session), connected if it is not.
    pub(super) async fn conn(&self, id: &[u8]) -> Result<Conn, StoreError> {
        let mut prefix = [0u8; 8];
        prefix.copy_from_slice(&id[..8]);
        let at = (u64::from_le_bytes(prefix) % self.connections.len() as u64) as usize;
        let mut connection = self.connections[at].lock().await;
        if let Some(conn) = connection.as_ref().filter(|conn| !conn.client.is_closed()) {
            return Ok(conn.clone());
        }
        let conn = self.connect().await?;
        *connection = Some(conn.clone());
        Ok(conn)
    }

    /// Runs one statement that returns at most one row, within the
    /// response timeout.
    pub(super) async fn query_opt(
        &self,
        id: &[u8],
        pick: impl Fn(&Statements) -> &Stmt,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Option<Row>, StoreError> {
        Ok(self.rows(id, pick, params).await?.into_iter().next())
    }

    /// Runs one statement within the response timeout; how many rows it
    /// changed (each statement that changes rows returns one per row).
    pub(super) async fn execute(
        &self,
        id: &[u8],
        pick: impl Fn(&Statements) -> &Stmt,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        Ok(self.rows(id, pick, params).await?.len() as u64)
    }

    /// Runs one statement on the row's connection, prepared or sent whole,
    /// within the response timeout; the rows it returns.
    async fn rows(
        &self,
        id: &[u8],
        pick: impl Fn(&Statements) -> &Stmt,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, StoreError> {
        self.timed(async {
            let conn = self.conn(id).await?;
            let stmt = pick(&conn.statements);
            match &stmt.prepared {
                Some(prepared) => conn.client.query(prepared, params).await,
                None => {
                    conn.client
                        .query_typed(&stmt.sql, &typed(stmt, params))
                        .await
                }
            }
            .map_err(pg_error)
        })
        .await
    }

    pub(super) async fn timed<T>(
        &self,
        run: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.response_timeout, run)
            .await
            .map_err(|_| -> StoreError {
                format!("no answer within {:?}", self.response_timeout).into()
            })?
    }

    /// After a refusal: the live holder's remaining time and how it holds
    /// the key, if there still is one; marks its row when `mark`, and, for
    /// a waiting `writer`, keeps new shares out.
    pub(super) async fn refused(
        &self,
        id: &[u8],
        mark: bool,
        writer: bool,
    ) -> Result<Option<(Duration, Claim)>, StoreError> {
        let row = self
            .query_opt(id, |s| &s.refused, &[&id, &mark, &writer])
            .await?;
        Ok(row.map(|row| {
            let ms: i64 = row.get(0);
            let held: &str = row.get(1);
            (
                Duration::from_millis(u64::try_from(ms).unwrap_or(0)),
                claim_text::claim_of(held),
            )
        }))
    }

    pub(super) async fn release(
        &self,
        id: &[u8],
        token: LockToken,
        linger: Duration,
    ) -> Result<bool, StoreError> {
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

impl Shared {
    /// Ends `token`'s share or permit of the row `id` `ms` from now, or
    /// at once when `release`. `Ok(false)` when it was no longer held.
    pub(super) async fn unclaim(
        &self,
        id: &[u8],
        token: LockToken,
        ms: i64,
        release: bool,
    ) -> Result<bool, StoreError> {
        let token = token.to_string();
        let row = self
            .query_opt(id, |s| &s.unclaim, &[&id, &token, &ms, &release, &CHANNEL])
            .await?;
        Ok(row.is_some_and(|row| row.get::<_, Option<bool>>(0) == Some(true)))
    }
}

/// `params` with `stmt`'s types, as an unprepared statement takes them.
fn typed<'a>(
    stmt: &Stmt,
    params: &[&'a (dyn ToSql + Sync)],
) -> Vec<(&'a (dyn ToSql + Sync), tokio_postgres::types::Type)> {
    params
        .iter()
        .zip(stmt.types)
        .map(|(param, ty)| (*param, ty.clone()))
        .collect()
}
