//! Runnable examples of lock-runtime; see the `[[example]]` targets.
//!
//! This library holds what the examples share: the `--redis`, `--postgres`,
//! `--mysql`, `--etcd` and `--zookeeper` flags that choose the lock store, and the
//! registry each one builds.

use lock_runtime::LockRegistry;

/// The error type of the examples' `main`s.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// The store an example locks through, chosen on its command line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum StoreFlag {
    /// No flag: an in-memory registry, one process only.
    #[default]
    Memory,
    /// `--redis URL`.
    Redis(String),
    /// `--postgres URL`.
    Postgres(String),
    /// `--mysql URL`: MySQL or MariaDB.
    MySql(String),
    /// `--etcd ENDPOINTS`: `host:port` (or `http://host:port`), several
    /// separated by commas.
    Etcd(String),
    /// `--zookeeper CONNECT`: `host:port`, several separated by commas.
    ZooKeeper(String),
}

/// Reads an example's command line: the store flags into the returned
/// [`StoreFlag`], every other flag to `other` with a way to read its value;
/// `other` says whether it knew the flag, and an unknown one is an error
/// naming `example`.
pub fn parse_flags(
    example: &str,
    mut other: impl FnMut(&str, &mut dyn FnMut() -> Result<String, Error>) -> Result<bool, Error>,
) -> Result<StoreFlag, Error> {
    let mut store = StoreFlag::default();
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || -> Result<String, Error> {
            args.next()
                .ok_or_else(|| format!("{flag} needs a value").into())
        };
        if !store.parse(&flag, &mut value)? && !other(&flag, &mut value)? {
            return Err(
                format!("unknown option {flag}; see the top of examples/{example}.rs").into(),
            );
        }
    }
    Ok(store)
}

/// Why `--etcd` fails in a build without the `etcd` feature.
pub const WITHOUT_ETCD: &str = "these examples were built without etcd: run them with \
     `cargo run -p examples --features etcd --example ...` \
     (the build needs protoc: apt-get install protobuf-compiler libprotobuf-dev)";

/// Why `--zookeeper` fails in a build without the `zookeeper` feature.
pub const WITHOUT_ZOOKEEPER: &str = "these examples were built without ZooKeeper: run them \
     with `cargo run -p examples --features zookeeper --example ...`";

/// Why `--mysql` fails in a build without the `mysql` feature.
pub const WITHOUT_MYSQL: &str = "these examples were built without MySQL: run them with \
     `cargo run -p examples --features mysql --example ...`";

/// The flags [`StoreFlag::parse`] takes, for usage messages.
pub const STORE_FLAGS: &str =
    "--redis URL, --postgres URL, --mysql URL, --etcd ENDPOINTS or --zookeeper CONNECT";

impl StoreFlag {
    /// Takes `flag` if it names a store, reading its value with `value`;
    /// returns whether it did. A second store flag is an error.
    pub fn parse<E>(
        &mut self,
        flag: &str,
        value: impl FnOnce() -> Result<String, E>,
    ) -> Result<bool, String>
    where
        E: std::fmt::Display,
    {
        let make: fn(String) -> StoreFlag = match flag {
            "--redis" => StoreFlag::Redis,
            "--postgres" => StoreFlag::Postgres,
            "--mysql" => StoreFlag::MySql,
            "--etcd" => StoreFlag::Etcd,
            "--zookeeper" => StoreFlag::ZooKeeper,
            _ => return Ok(false),
        };
        if *self != StoreFlag::Memory {
            return Err(format!("give one of {STORE_FLAGS}, not two"));
        }
        *self = make(value().map_err(|err| err.to_string())?);
        Ok(true)
    }

    /// The store flag of an example that takes no other option: from the
    /// command line, an error naming `example` for anything else.
    pub fn from_args(example: &str) -> Result<StoreFlag, Error> {
        parse_flags(example, |_, _| Ok(false))
    }

    /// Whether processes can share locks through this store.
    pub fn is_shared(&self) -> bool {
        *self != StoreFlag::Memory
    }

    /// The store's name, for the examples' output.
    pub fn name(&self) -> &'static str {
        match self {
            StoreFlag::Memory => "in-memory",
            StoreFlag::Redis(_) => "Redis",
            StoreFlag::Postgres(_) => "PostgreSQL",
            StoreFlag::MySql(_) => "MySQL",
            StoreFlag::Etcd(_) => "etcd",
            StoreFlag::ZooKeeper(_) => "ZooKeeper",
        }
    }

    /// The flag and its value, to pass on to the processes an example starts.
    pub fn args(&self) -> Vec<String> {
        match self {
            StoreFlag::Memory => Vec::new(),
            StoreFlag::Redis(url) => vec!["--redis".into(), url.clone()],
            StoreFlag::Postgres(url) => vec!["--postgres".into(), url.clone()],
            StoreFlag::MySql(url) => vec!["--mysql".into(), url.clone()],
            StoreFlag::Etcd(endpoints) => vec!["--etcd".into(), endpoints.clone()],
            StoreFlag::ZooKeeper(connect) => vec!["--zookeeper".into(), connect.clone()],
        }
    }

    /// The etcd endpoints of `--etcd`, split at the commas.
    pub fn etcd_endpoints(&self) -> Vec<&str> {
        match self {
            StoreFlag::Etcd(endpoints) => endpoints
                .split(',')
                .map(str::trim)
                .filter(|endpoint| !endpoint.is_empty())
                .collect(),
            _ => Vec::new(),
        }
    }

    /// A client of the etcd data of the examples (their stock, orders and
    /// ledgers), connected to the endpoints of `--etcd`. Boxed: the client
    /// is large, and sits in enums beside small ones.
    #[cfg(feature = "etcd")]
    pub async fn etcd_kv(&self) -> Result<Box<etcd_client::KvClient>, Error> {
        let client = etcd_client::Client::connect(self.etcd_endpoints(), None).await?;
        Ok(Box::new(client.kv_client()))
    }

    /// A session for the ZooKeeper data of the examples (their stock,
    /// orders and ledgers), with the servers of `--zookeeper`.
    #[cfg(feature = "zookeeper")]
    pub async fn zookeeper_client(&self) -> Result<zookeeper_client::Client, Error> {
        let StoreFlag::ZooKeeper(connect) = self else {
            return Err("not a --zookeeper store".into());
        };
        Ok(zookeeper_client::Client::connect(connect).await?)
    }

    /// A pool for the MySQL data of the examples (their stock, orders and
    /// ledgers), on the database of `--mysql`.
    #[cfg(feature = "mysql")]
    pub fn mysql_pool(&self) -> Result<mysql_async::Pool, Error> {
        let StoreFlag::MySql(url) = self else {
            return Err("not a --mysql store".into());
        };
        Ok(mysql_async::Pool::from_url(url)?)
    }

    /// Connects the registry this flag names.
    pub async fn registry(&self) -> Result<LockRegistry, Error> {
        Ok(match self {
            StoreFlag::Memory => LockRegistry::memory(),
            StoreFlag::Redis(url) => LockRegistry::redis(url).await?,
            StoreFlag::Postgres(url) => LockRegistry::postgres(url).await?,
            #[cfg(feature = "mysql")]
            StoreFlag::MySql(url) => LockRegistry::mysql(url).await?,
            #[cfg(not(feature = "mysql"))]
            StoreFlag::MySql(_) => return Err(WITHOUT_MYSQL.into()),
            #[cfg(feature = "etcd")]
            StoreFlag::Etcd(_) => LockRegistry::etcd(&self.etcd_endpoints()).await?,
            #[cfg(not(feature = "etcd"))]
            StoreFlag::Etcd(_) => return Err(WITHOUT_ETCD.into()),
            #[cfg(feature = "zookeeper")]
            StoreFlag::ZooKeeper(connect) => LockRegistry::zookeeper(connect).await?,
            #[cfg(not(feature = "zookeeper"))]
            StoreFlag::ZooKeeper(_) => return Err(WITHOUT_ZOOKEEPER.into()),
        })
    }
}

/// Runs `op`, a ZooKeeper read (or a write that may be made twice), again
/// when the connection to the session's server dropped under it: a server
/// closes its clients' connections when it loses the ensemble's quorum
/// (as one may on a busy machine), and the session goes on on another. At
/// most 5 tries, 100 ms apart; other errors are returned at once.
#[cfg(feature = "zookeeper")]
pub async fn zookeeper_retrying<T, F, Fut>(mut op: F) -> Result<T, zookeeper_client::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, zookeeper_client::Error>>,
{
    let mut tries = 1;
    loop {
        match op().await {
            // `Custom` carries the connection's own I/O errors (a reset).
            Err(zookeeper_client::Error::ConnectionLoss | zookeeper_client::Error::Custom(_))
                if tries < 5 =>
            {
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            done => return done,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn takes_one_store_flag_and_refuses_a_second() {
        let mut store = StoreFlag::default();
        assert_eq!(
            store.parse("--stock", || Ok::<_, String>("1".into())),
            Ok(false)
        );
        assert_eq!(
            store.parse("--etcd", || Ok::<_, String>(
                "127.0.0.1:1, 127.0.0.1:2".into()
            )),
            Ok(true)
        );
        assert_eq!(store.etcd_endpoints(), ["127.0.0.1:1", "127.0.0.1:2"]);
        assert_eq!(store.args(), ["--etcd", "127.0.0.1:1, 127.0.0.1:2"]);
        let second = store.parse("--redis", || Ok::<_, String>("redis://x".into()));
        assert!(second.unwrap_err().contains("not two"));
        let missing = StoreFlag::default().parse("--postgres", || Err("--postgres needs a value"));
        assert_eq!(missing, Err("--postgres needs a value".into()));
    }
}
