//! Configuring and connecting a [`PostgresStore`]: where it connects (a
//! connect string or the service's own `tokio_postgres::Config`), the
//! table, TLS, a pooler in front, the number of connections and timeouts.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex as AsyncMutex;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{Config, Socket};

use super::listener::Listener;
use super::session::Opener;
use super::statements::Shared;
use super::table::Table;
use super::{PostgresStore, Waking};
use crate::error::{LockError, StoreError};
use crate::store::common::connect::{self, Timeouts, timeout_setters};
use crate::store::common::redact::redact;

/// Configures and connects a [`PostgresStore`].
#[derive(Debug)]
pub struct PostgresStoreBuilder {
    source: Source,
    table: String,
    connections: usize,
    timeouts: Timeouts,
    opener: Opener,
    /// Set behind a pooler in transaction mode: how often a waiter asks
    /// again.
    transaction_pooling: Option<Duration>,
}

/// Where the store connects.
enum Source {
    Url(String),
    Config(Box<Config>),
}

impl Source {
    /// How errors and `Debug` show it: never with the password.
    fn shown(&self) -> String {
        match self {
            Source::Url(url) => redact(url),
            Source::Config(config) => {
                let hosts: Vec<String> = config
                    .get_hosts()
                    .iter()
                    .zip(config.get_ports().iter().chain(std::iter::repeat(&5432)))
                    .map(|(host, port)| match host {
                        tokio_postgres::config::Host::Tcp(name) => format!("{name}:{port}"),
                        tokio_postgres::config::Host::Unix(path) => {
                            format!("{}:{port}", path.display())
                        }
                    })
                    .collect();
                format!(
                    "host={} user={} dbname={}",
                    hosts.join(","),
                    config.get_user().unwrap_or("(default)"),
                    config.get_dbname().unwrap_or("(default)")
                )
            }
        }
    }

    fn config(&self) -> Result<Config, StoreError> {
        match self {
            Source::Url(url) => url
                .parse()
                .map_err(|err| format!("invalid connect string `{}`: {err}", redact(url)).into()),
            Source::Config(config) => Ok((**config).clone()),
        }
    }
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown())
    }
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

    /// The SQL that makes the lease table and what goes with it (a
    /// sequence, the holders' table of shares and permits, three
    /// functions) under this builder's table name, for an administrator to
    /// run where the store's role may not create them (or to add what a
    /// table made by an earlier version lacks). Each statement does
    /// nothing when its object is there.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidSettings`] for a bad table name.
    pub fn schema(&self) -> Result<String, LockError> {
        Table::new(&self.table)
            .map(|table| table.schema())
            .map_err(|reason| LockError::InvalidSettings {
                store: "postgres",
                address: self.source.shown(),
                reason: reason.to_string(),
            })
    }

    /// For a server behind a pooler that lends its sessions per
    /// transaction (PgBouncer's `pool_mode = transaction`, and most
    /// "transaction mode" poolers of hosted databases): every statement is
    /// sent whole with its parameter types (one round trip, nothing
    /// prepared on a session that the next statement may not get), and
    /// waiters do not `LISTEN` (a notification would reach whichever client
    /// holds the server session then): a waiter asks again every `poll`
    /// (and when the holder's lease ends, if sooner). A release then
    /// reaches a waiter `poll / 2` later on average, at one statement per
    /// waiter per `poll`. Without it, a store that finds notifications do
    /// not reach it refuses to connect. Session pooling needs nothing.
    pub fn transaction_pooling(mut self, poll: Duration) -> Self {
        self.transaction_pooling = Some(poll);
        self
    }

    /// How many connections run statements (default 4). Each pipelines the
    /// statements of many tasks; a connection that drops is replaced.
    pub fn connections(mut self, connections: usize) -> Self {
        self.connections = connections.max(1);
        self
    }

    /// Connects the first statement connection, creates the table and the
    /// sequence if they are missing, and prepares the statements; then
    /// checks that a notification reaches a listening session (unless
    /// [`transaction_pooling`](Self::transaction_pooling)). The listening
    /// connection waiters use is made on the first wait. Sessions are plain
    /// TCP unless [`tls`](Self::tls) gave a connector.
    ///
    /// # Errors
    ///
    /// [`LockError::Connect`] for an invalid connect string, an unreachable
    /// server, refused credentials, or no right to create the table;
    /// [`LockError::InvalidSettings`] for a bad table name, a zero poll
    /// interval, or when notifications do not reach a listening session (a
    /// pooler in transaction mode). Never contains the password.
    pub async fn connect(self) -> Result<PostgresStore, LockError> {
        let shown = self.source.shown();
        let invalid = |reason: String| LockError::InvalidSettings {
            store: "postgres",
            address: shown.clone(),
            reason,
        };
        if self.transaction_pooling.is_some_and(|poll| poll.is_zero()) {
            return Err(invalid(
                "the transaction pooling poll interval must be longer than zero".to_owned(),
            ));
        }
        if let Err(reason) = Table::new(&self.table) {
            return Err(invalid(reason.to_string()));
        }
        let listens = self.transaction_pooling.is_none();
        let timeout = self.timeouts.connection;
        let store = connect::opened("postgres", shown.clone(), self.open()).await?;
        if listens {
            let heard = connect::opened(
                "postgres",
                shown.clone(),
                store.notifications_arrive(timeout),
            )
            .await?;
            if !heard {
                return Err(invalid(
                    "a notification sent to a listening session never arrived: a pooler in transaction mode (PgBouncer's pool_mode = transaction) does not keep the session LISTEN needs; connect directly or through session pooling, or use PostgresStoreBuilder::transaction_pooling"
                        .to_owned(),
                ));
            }
        }
        Ok(store)
    }

    async fn open(self) -> Result<PostgresStore, StoreError> {
        let table = Table::new(&self.table)?;
        let mut config = self.source.config()?;
        config.connect_timeout(self.timeouts.connection);
        let shared = Arc::new(Shared {
            opener: self.opener.clone(),
            config,
            table,
            response_timeout: self.timeouts.response,
            prepare: self.transaction_pooling.is_none(),
            connections: (0..self.connections)
                .map(|_| AsyncMutex::new(None))
                .collect(),
        });
        let client = shared.open().await?;
        shared.table.create(&client).await?;
        let first = shared.prepared(client).await?;
        *shared.connections[0].lock().await = Some(first);
        let waking = match self.transaction_pooling {
            None => Waking::Listen(Listener::new(
                shared.config.clone(),
                self.opener,
                self.timeouts.connection,
            )),
            Some(poll) => Waking::Poll(poll),
        };
        Ok(PostgresStore::new(shared, waking, self.source.shown()))
    }
}

impl PostgresStore {
    /// Starts configuring a store for `url`
    /// (`postgres://user:password@host:port/dbname`, or `host=.. user=..`).
    pub fn builder(url: &str) -> PostgresStoreBuilder {
        PostgresStoreBuilder::new(Source::Url(url.to_owned()))
    }

    /// Starts configuring a store from the `tokio_postgres::Config` the
    /// service already builds (the one its pool's manager takes, with
    /// `deadpool-postgres` or `bb8-postgres`): one place for the host,
    /// credentials and options. The store opens its own few sessions from
    /// it rather than borrowing the pool's: it keeps one listening session
    /// for as long as anyone waits, and pipelines every task's statements
    /// on its statement sessions, neither of which a checked-out pooled
    /// client can do; the pool's size is not touched. Its connect timeout
    /// is the builder's.
    ///
    /// ```no_run
    /// use lock_runtime::{LockRegistry, PostgresStore};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// let mut config = tokio_postgres::Config::new();
    /// config.host("10.0.0.7").user("app").password("secret").dbname("shop");
    /// // ... the service's pool is built from `config.clone()` ...
    /// let locks = LockRegistry::new(PostgresStore::with_config(config).connect().await?);
    /// # let _ = locks; Ok(()) }
    /// ```
    pub fn with_config(config: Config) -> PostgresStoreBuilder {
        PostgresStoreBuilder::new(Source::Config(Box::new(config)))
    }

    /// Connects with the default settings: `PostgresStore::builder(url).connect()`.
    ///
    /// # Errors
    ///
    /// As [`PostgresStoreBuilder::connect`].
    pub async fn connect(url: &str) -> Result<PostgresStore, LockError> {
        PostgresStore::builder(url).connect().await
    }
}

impl PostgresStoreBuilder {
    fn new(source: Source) -> Self {
        PostgresStoreBuilder {
            source,
            table: "lock_leases".to_owned(),
            connections: 4,
            timeouts: Timeouts::new(Duration::from_secs(2), Duration::from_secs(2)),
            opener: Opener::plain(),
            transaction_pooling: None,
        }
    }
}
