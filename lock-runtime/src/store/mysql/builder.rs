//! Configuring and connecting a [`MySqlStore`]: where it connects (a URL,
//! the service's own `mysql_async::Opts`, or its pool), the table, the
//! number of connections, the poll interval and timeouts.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Opts, OptsBuilder, Pool, PoolConstraints, PoolOpts};

use super::sql::Table;
use super::{MySqlStore, Shared};
use crate::error::{LockError, StoreError};
use crate::store::common::connect::{self, Timeouts, timeout_setters};
use crate::store::common::redact::redact;

/// Configures and connects a [`MySqlStore`].
#[derive(Debug)]
pub struct MySqlStoreBuilder {
    source: Source,
    table: String,
    connections: usize,
    timeouts: Timeouts,
    poll: Duration,
    tls: Tls,
}

/// TLS asked of the builder: none, or with the system's roots, a CA of
/// its own, a client certificate. Certificates are never printed.
#[derive(Default)]
struct Tls {
    on: bool,
    ca: Option<Vec<u8>>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("on", &self.on)
            .field("ca", &self.ca.is_some())
            .field("identity", &self.identity.is_some())
            .finish()
    }
}

/// Where the store connects.
enum Source {
    Url(String),
    Opts(Box<Opts>),
    Pool(Pool),
}

impl Source {
    /// How errors and `Debug` show it: never with the password.
    fn shown(&self) -> String {
        let opts = match self {
            Source::Url(url) => return redact(url),
            Source::Opts(opts) => opts,
            Source::Pool(_) => return "(the service's pool)".to_owned(),
        };
        format!(
            "mysql://{}@{}:{}/{}",
            opts.user().unwrap_or("(default)"),
            opts.ip_or_hostname(),
            opts.tcp_port(),
            opts.db_name().unwrap_or("(default)")
        )
    }
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.shown())
    }
}

impl MySqlStoreBuilder {
    timeout_setters!(call: "one statement", "2 s"; connect: "2 s");

    /// The lease table's name (default `lock_leases`; the holders' table is
    /// the name with `_holders`, the procedures with `_claim_v2`,
    /// `_unclaim_v2` and `_force_v2`). Letters, digits and `_`, at most 48
    /// bytes, not starting with a digit.
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// How many connections the store's own pool keeps at most (default
    /// 8); each runs one statement at a time. Not used with
    /// [`MySqlStore::with_pool`], whose pool is the service's.
    pub fn connections(mut self, connections: usize) -> Self {
        self.connections = connections.max(1);
        self
    }

    /// How often a waiter asks again while another process holds the key
    /// (default 50 ms), and sooner when the holder's lease says it ends: a
    /// release reaches a waiter in another process half of it later on
    /// average, at one statement per waiting process and key per interval.
    /// Waiters in the holder's own process are handed the lock at once.
    pub fn poll_interval(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// Speaks TLS to the server, checking its certificate against the
    /// built-in web roots (or the CA of [`tls_ca`](Self::tls_ca)) and that
    /// it names the URL's host. Also what `require_ssl=true` in the URL
    /// asks.
    #[cfg(feature = "mysql-tls")]
    pub fn tls(mut self) -> Self {
        self.tls.on = true;
        self
    }

    /// Speaks TLS, trusting only the CA (or CAs) in `ca_pem` for the
    /// server's certificate: for a private CA or a self-signed server.
    #[cfg(feature = "mysql-tls")]
    pub fn tls_ca(mut self, ca_pem: impl AsRef<[u8]>) -> Self {
        self.tls.on = true;
        self.tls.ca = Some(ca_pem.as_ref().to_vec());
        self
    }

    /// Speaks TLS, showing the certificate chain `cert_pem` with its
    /// private key `key_pem` to a server that asks for client
    /// certificates (a user made `REQUIRE X509`).
    #[cfg(feature = "mysql-tls")]
    pub fn tls_identity(mut self, cert_pem: impl AsRef<[u8]>, key_pem: impl AsRef<[u8]>) -> Self {
        self.tls.on = true;
        self.tls.identity = Some((cert_pem.as_ref().to_vec(), key_pem.as_ref().to_vec()));
        self
    }

    /// The SQL that makes the lease table and what goes with it (the
    /// holders' table of shares and permits, three procedures) under this
    /// builder's table name, for an administrator to run (with the `mysql`
    /// or `mariadb` client, which reads its `DELIMITER` lines) where the
    /// store's user may not create them.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidSettings`] for a bad table name.
    pub fn schema(&self) -> Result<String, LockError> {
        Table::new(&self.table)
            .map(|table| table.schema())
            .map_err(|reason| self.invalid(reason.to_string()))
    }

    fn invalid(&self, reason: String) -> LockError {
        LockError::InvalidSettings {
            store: "mysql",
            address: self.source.shown(),
            reason,
        }
    }

    /// Connects, and makes the tables and procedures if any is missing.
    ///
    /// # Errors
    ///
    /// [`LockError::Connect`] for an invalid URL, an unreachable server,
    /// refused credentials, or no right to create what is missing;
    /// [`LockError::InvalidSettings`] for a bad table name or a zero poll
    /// interval. Never contains the password.
    pub async fn connect(self) -> Result<MySqlStore, LockError> {
        if self.poll.is_zero() {
            return Err(self.invalid("the poll interval must be longer than zero".to_owned()));
        }
        if let Err(reason) = Table::new(&self.table) {
            return Err(self.invalid(reason.to_string()));
        }
        if self.tls.on && matches!(self.source, Source::Pool(_)) {
            return Err(self.invalid(
                "TLS is the service's pool's to set (its Opts' ssl_opts), not the builder's"
                    .to_owned(),
            ));
        }
        let shown = self.source.shown();
        connect::opened("mysql", shown, self.open()).await
    }

    async fn open(self) -> Result<MySqlStore, StoreError> {
        let table = Table::new(&self.table)?;
        let shown = self.source.shown();
        let opts = match self.source {
            Source::Pool(pool) => Err(pool),
            Source::Url(url) => Ok(Opts::from_url(&url)
                .map_err(|err| format!("invalid URL `{}`: {err}", redact(&url)))?),
            Source::Opts(opts) => Ok(*opts),
        };
        // The service's pool: as many as mysql_async's default allows.
        let mut connections = 100;
        let pool = match opts {
            Err(pool) => pool,
            Ok(opts) => {
                let asked = opts.ssl_opts().is_some();
                let mut opts = OptsBuilder::from_opts(opts);
                if self.tls.on || asked {
                    opts = with_tls(opts, self.tls)?;
                }
                connections = self.connections;
                own_pool(opts, self.connections)
            }
        };
        let shared = Arc::new(Shared {
            pool,
            statements: table.statements(),
            table,
            response_timeout: self.timeouts.response,
            connections,
            freed: Mutex::default(),
        });
        tokio::time::timeout(self.timeouts.connection, create(&shared))
            .await
            .map_err(|_| -> StoreError {
                format!("no answer within {:?}", self.timeouts.connection).into()
            })??;
        Ok(MySqlStore::new(shared, self.poll, shown))
    }
}

/// The store's own pool from `opts`: at most `connections`, kept while
/// used and closed down to one after a minute idle (the pool's default
/// keeps none above its minimum: a connection per statement), none reset
/// on return (its statements leave no session state), each to the address
/// given (the client would otherwise move a connection to `127.0.0.1` onto
/// the server's Unix socket, around any proxy on the way; a `socket=` in
/// the URL still picks one).
fn own_pool(opts: OptsBuilder, connections: usize) -> Pool {
    let opts = opts.prefer_socket(false);
    let constraints = PoolConstraints::new(1, connections).unwrap_or_default();
    let pool_opts = PoolOpts::default()
        .with_constraints(constraints)
        .with_inactive_connection_ttl(Duration::from_secs(60))
        .with_reset_connection(false);
    Pool::new(opts.pool_opts(pool_opts))
}

/// `opts` speaking TLS as `tls` says, or as the URL asked
/// (`require_ssl=true`: its settings are kept when the builder adds none).
#[cfg(feature = "mysql-tls")]
fn with_tls(opts: OptsBuilder, tls: Tls) -> Result<OptsBuilder, StoreError> {
    use mysql_async::{ClientIdentity, SslOpts};
    crate::store::common::tls::install_crypto_provider();
    if !tls.on {
        return Ok(opts);
    }
    let mut ssl = SslOpts::default();
    if let Some(ca) = tls.ca {
        ssl = ssl
            .with_root_certs(vec![ca.into()])
            .with_disable_built_in_roots(true);
    }
    if let Some((cert, key)) = tls.identity {
        ssl = ssl.with_client_identity(Some(ClientIdentity::new(cert.into(), key.into())));
    }
    Ok(opts.ssl_opts(ssl))
}

/// Without the `mysql-tls` feature the builder has no TLS setters, and a
/// URL that asks for TLS is refused (the client would panic).
#[cfg(not(feature = "mysql-tls"))]
fn with_tls(_opts: OptsBuilder, _tls: Tls) -> Result<OptsBuilder, StoreError> {
    Err(StoreError::misuse(
        "the URL asks for TLS (require_ssl=true), which needs lock-runtime's `mysql-tls` feature",
    ))
}

/// Makes the tables and any missing procedure, one process at a time (a
/// named lock on the connection), reading `information_schema` first so
/// that a user who may only use them never needs the right to create.
async fn create(shared: &Shared) -> Result<(), StoreError> {
    let table = &shared.table;
    let mut conn = shared.pool.get_conn().await.map_err(super::mysql_error)?;
    let missing = async |conn: &mut mysql_async::Conn| -> Result<Vec<String>, mysql_async::Error> {
        let mut missing = Vec::new();
        for name in [table.name.clone(), format!("{}_holders", table.name)] {
            let found: Option<i64> = conn
                .exec_first(
                    "SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?",
                    (&name,),
                )
                .await?;
            if found != Some(1) {
                missing.push(name);
            }
        }
        for name in table.procedures() {
            let found: Option<i64> = conn
                .exec_first(
                    "SELECT COUNT(*) FROM information_schema.ROUTINES WHERE ROUTINE_SCHEMA = DATABASE() AND ROUTINE_NAME = ?",
                    (&name,),
                )
                .await?;
            if found != Some(1) {
                missing.push(name);
            }
        }
        Ok(missing)
    };
    if missing(&mut conn)
        .await
        .map_err(super::mysql_error)?
        .is_empty()
    {
        return Ok(());
    }
    let lock = format!("lock_runtime:{}", table.name);
    let made = async {
        let _: Option<i64> = conn.exec_first("SELECT GET_LOCK(?, 30)", (&lock,)).await?;
        let missing = missing(&mut conn).await?;
        for sql in table.tables() {
            conn.query_drop(sql).await?;
        }
        for (name, sql) in table.procedures().iter().zip(table.procedure_bodies()) {
            if missing.contains(name) {
                conn.query_drop(sql).await?;
            }
        }
        Ok::<_, mysql_async::Error>(())
    }
    .await;
    let _ = conn.exec_drop("DO RELEASE_LOCK(?)", (&lock,)).await;
    made.map_err(|err| -> StoreError {
        format!("could not create the lease table `{}` or its procedures (an administrator can run MySqlStoreBuilder::schema's SQL): {err}", table.name).into()
    })
}

impl MySqlStore {
    /// Starts configuring a store for `url`
    /// (`mysql://user:password@host:port/database`).
    pub fn builder(url: &str) -> MySqlStoreBuilder {
        MySqlStoreBuilder::new(Source::Url(url.to_owned()))
    }

    /// Starts configuring a store from the `mysql_async::Opts` the service
    /// already builds: one place for the host, credentials and TLS. The
    /// store makes its own small pool from them.
    pub fn with_opts(opts: Opts) -> MySqlStoreBuilder {
        MySqlStoreBuilder::new(Source::Opts(Box::new(opts)))
    }

    /// Starts configuring a store on the service's own pool: each statement
    /// checks a connection out and returns it at once, outside any
    /// transaction of the service's.
    pub fn with_pool(pool: Pool) -> MySqlStoreBuilder {
        MySqlStoreBuilder::new(Source::Pool(pool))
    }

    /// Connects with the default settings: `MySqlStore::builder(url).connect()`.
    ///
    /// # Errors
    ///
    /// As [`MySqlStoreBuilder::connect`].
    pub async fn connect(url: &str) -> Result<MySqlStore, LockError> {
        MySqlStore::builder(url).connect().await
    }
}

impl MySqlStoreBuilder {
    fn new(source: Source) -> Self {
        MySqlStoreBuilder {
            source,
            table: "lock_leases".to_owned(),
            connections: 8,
            timeouts: Timeouts::new(Duration::from_secs(2), Duration::from_secs(2)),
            poll: Duration::from_millis(50),
            tls: Tls::default(),
        }
    }
}
