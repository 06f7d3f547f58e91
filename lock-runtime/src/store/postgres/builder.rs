//! Configuring and connecting a [`PostgresStore`]: the table, TLS, the
//! number of connections and timeouts.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex as AsyncMutex;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{Config, Socket};

use super::PostgresStore;
use super::listener::Listener;
use super::session::Opener;
use super::shared::Shared;
use super::table::Table;
use crate::error::{BackendError, LockError};
use crate::store::support::connect::{self, Timeouts, timeout_setters};
use crate::store::support::redact::redact;

/// Configures and connects a [`PostgresStore`].
#[derive(Debug)]
pub struct PostgresStoreBuilder {
    url: String,
    table: String,
    connections: usize,
    timeouts: Timeouts,
    opener: Opener,
}

impl PostgresStoreBuilder {
    timeout_setters!(call: "one statement", "2 s"; connect: "2 s");

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
    pub async fn connect(self) -> Result<PostgresStore, LockError> {
        let shown = redact(&self.url);
        connect::opened("postgres", shown, self.open()).await
    }

    async fn open(self) -> Result<PostgresStore, BackendError> {
        let table = Table::new(&self.table)?;
        let mut config: Config = self
            .url
            .parse()
            .map_err(|err| format!("invalid connect string `{}`: {err}", redact(&self.url)))?;
        config.connect_timeout(self.timeouts.connection);
        let shared = Arc::new(Shared {
            opener: self.opener.clone(),
            config,
            table,
            response_timeout: self.timeouts.response,
            slots: (0..self.connections)
                .map(|_| AsyncMutex::new(None))
                .collect(),
        });
        let client = shared.open().await?;
        shared.table.create(&client).await?;
        let first = shared.prepared(client).await?;
        *shared.slots[0].lock().await = Some(first);
        let listener = Listener::new(shared.config.clone(), self.opener, self.timeouts.connection);
        Ok(PostgresStore {
            shared,
            listener,
            shown: redact(&self.url),
        })
    }
}

impl PostgresStore {
    /// Starts configuring a store for `url`.
    pub fn builder(url: &str) -> PostgresStoreBuilder {
        PostgresStoreBuilder {
            url: url.to_owned(),
            table: "lock_leases".to_owned(),
            connections: 4,
            timeouts: Timeouts::new(Duration::from_secs(2), Duration::from_secs(2)),
            opener: Opener::plain(),
        }
    }
}
