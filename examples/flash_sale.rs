//! The flash sale: many buyers, a small stock, and a purchase that is a
//! non-atomic read, pause, write, exactly the code that oversells without a
//! lock.
//!
//! ```sh
//! cargo run -p examples --example flash_sale                      # in memory, one process
//! cargo run -p examples --example flash_sale -- --no-lock         # the same, oversold
//! cargo run -p examples --example flash_sale -- --redis redis://127.0.0.1:6379 --processes 4
//! cargo run -p examples --example flash_sale -- --postgres postgres://postgres@127.0.0.1/postgres --processes 4
//! cargo run -p examples --features mysql --example flash_sale -- --mysql mysql://root@127.0.0.1/shop --processes 4
//! cargo run -p examples --features etcd --example flash_sale -- --etcd 127.0.0.1:2379 --processes 4
//! cargo run -p examples --features zookeeper --example flash_sale -- --zookeeper 127.0.0.1:2181 --processes 4
//! ```
//!
//! Options: `--stock N` (100), `--buyers N` (32, spread over the processes),
//! `--pause-ms N` (2, between read and write), `--redis URL`,
//! `--postgres URL`, `--mysql URL`, `--etcd ENDPOINTS` or `--zookeeper CONNECT` (the lock
//! store, which also keeps the stock and the orders), `--processes N` (1; more needs a store: the
//! example starts them itself), `--no-lock`. Exits with status 1 if
//! anything was oversold with the lock on.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
#[cfg(feature = "etcd")]
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use examples::{Error, STORE_FLAGS, StoreFlag};
use lock_runtime::distributed_lock;
#[cfg(feature = "mysql")]
use mysql_async::prelude::Queryable;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

#[derive(Clone, Debug)]
struct Args {
    stock: u64,
    buyers: usize,
    pause: Duration,
    store: StoreFlag,
    processes: usize,
    locked: bool,
    /// Set in the processes the example starts: the sale's id.
    worker: Option<String>,
}

fn parse_args() -> Result<Args, Error> {
    let mut args = Args {
        stock: 100,
        buyers: 32,
        pause: Duration::from_millis(2),
        store: StoreFlag::Memory,
        processes: 1,
        locked: true,
        worker: None,
    };
    args.store = examples::parse_flags("flash_sale", |flag, value| {
        match flag {
            "--stock" => args.stock = value()?.parse()?,
            "--buyers" => args.buyers = value()?.parse()?,
            "--pause-ms" => args.pause = Duration::from_millis(value()?.parse()?),
            "--processes" => args.processes = value()?.parse()?,
            "--no-lock" => args.locked = false,
            "--worker" => args.worker = Some(value()?),
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    if args.processes > 1 && !args.store.is_shared() {
        return Err(format!(
            "--processes needs {STORE_FLAGS}: processes share a lock through a store"
        )
        .into());
    }
    if args.buyers == 0 || args.processes == 0 {
        return Err("--buyers and --processes must be at least 1".into());
    }
    Ok(args)
}

/// Where the stock and the orders live.
#[derive(Clone)]
enum Store {
    Memory(Arc<MemoryShop>),
    Redis {
        conn: MultiplexedConnection,
        sale: String,
    },
    Postgres {
        client: Arc<tokio_postgres::Client>,
        sale: String,
    },
    /// Rows of `flash_stock` and `flash_orders`, as on PostgreSQL.
    #[cfg(feature = "mysql")]
    MySql {
        pool: mysql_async::Pool,
        sale: String,
    },
    /// Keys under `flash/{sale}/`: `stock`, and one `orders/…` key per order.
    #[cfg(feature = "etcd")]
    Etcd {
        client: Box<etcd_client::KvClient>,
        sale: String,
    },
    /// Nodes under `/flash/{sale}`: `stock`, and one sequential child of
    /// `orders` per order.
    #[cfg(feature = "zookeeper")]
    ZooKeeper {
        client: zookeeper_client::Client,
        sale: String,
    },
}

/// Numbers this process's orders, for their etcd keys.
#[cfg(feature = "etcd")]
static ORDER_SEQ: AtomicUsize = AtomicUsize::new(0);

#[derive(Default)]
struct MemoryShop {
    stock: AtomicU64,
    orders: Mutex<Vec<u64>>,
}

impl Store {
    async fn read_stock(&mut self) -> Result<u64, Error> {
        Ok(match self {
            Store::Memory(shop) => shop.stock.load(Ordering::SeqCst),
            Store::Redis { conn, sale } => conn.get(format!("flash:{sale}:stock")).await?,
            Store::Postgres { client, sale } => {
                let row = client
                    .query_one("SELECT stock FROM flash_stock WHERE sale = $1", &[sale])
                    .await?;
                row.get::<_, i64>(0) as u64
            }
            #[cfg(feature = "mysql")]
            Store::MySql { pool, sale } => pool
                .get_conn()
                .await?
                .exec_first("SELECT stock FROM flash_stock WHERE sale = ?", (&*sale,))
                .await?
                .ok_or("the stock row is missing")?,
            #[cfg(feature = "etcd")]
            Store::Etcd { client, sale } => {
                let got = client.get(format!("flash/{sale}/stock"), None).await?;
                let kv = got.kvs().first().ok_or("the stock key is missing")?;
                kv.value_str()?.parse()?
            }
            #[cfg(feature = "zookeeper")]
            Store::ZooKeeper { client, sale } => {
                let (client, path) = (&*client, &format!("/flash/{sale}/stock"));
                // A server reads from its own copy, which may trail the
                // leader's: the last holder's write, made through another
                // session, could be missing yet. `sync` first brings this
                // session's server up to the leader.
                let data = examples::zookeeper_retrying(|| async move {
                    client.sync(path).await?;
                    Ok(client.get_data(path).await?.0)
                })
                .await?;
                String::from_utf8(data)?.parse()?
            }
        })
    }

    async fn write_stock(&mut self, level: u64) -> Result<(), Error> {
        match self {
            Store::Memory(shop) => shop.stock.store(level, Ordering::SeqCst),
            Store::Redis { conn, sale } => conn.set(format!("flash:{sale}:stock"), level).await?,
            Store::Postgres { client, sale } => {
                let level = level as i64;
                client
                    .execute(
                        "INSERT INTO flash_stock (sale, stock) VALUES ($1, $2)
                         ON CONFLICT (sale) DO UPDATE SET stock = excluded.stock",
                        &[sale, &level],
                    )
                    .await?;
            }
            #[cfg(feature = "mysql")]
            Store::MySql { pool, sale } => {
                pool.get_conn()
                    .await?
                    .exec_drop(
                        "INSERT INTO flash_stock (sale, stock) VALUES (?, ?)
                         ON DUPLICATE KEY UPDATE stock = ?",
                        (&*sale, level, level),
                    )
                    .await?;
            }
            #[cfg(feature = "etcd")]
            Store::Etcd { client, sale } => {
                client
                    .put(format!("flash/{sale}/stock"), level.to_string(), None)
                    .await?;
            }
            #[cfg(feature = "zookeeper")]
            Store::ZooKeeper { client, sale } => {
                let path = format!("/flash/{sale}/stock");
                let data = level.to_string();
                // The same level twice is one write: it may be sent again.
                let set =
                    examples::zookeeper_retrying(|| client.set_data(&path, data.as_bytes(), None));
                match set.await {
                    Err(zookeeper_client::Error::NoNode) => {
                        // The first write, by the parent: make the sale's nodes.
                        let options = zookeeper_client::CreateMode::Persistent
                            .with_acls(zookeeper_client::Acls::anyone_all());
                        client
                            .mkdir(&format!("/flash/{sale}/orders"), &options)
                            .await?;
                        client.create(&path, data.as_bytes(), &options).await?;
                    }
                    done => {
                        done?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Records an order for the item at stock level `level`.
    async fn record_order(&mut self, level: u64) -> Result<(), Error> {
        match self {
            Store::Memory(shop) => shop.orders.lock().expect("orders").push(level),
            Store::Redis { conn, sale } => {
                let _: u64 = conn.rpush(format!("flash:{sale}:orders"), level).await?;
            }
            Store::Postgres { client, sale } => {
                let level = level as i64;
                client
                    .execute(
                        "INSERT INTO flash_orders (sale, level) VALUES ($1, $2)",
                        &[sale, &level],
                    )
                    .await?;
            }
            #[cfg(feature = "mysql")]
            Store::MySql { pool, sale } => {
                pool.get_conn()
                    .await?
                    .exec_drop(
                        "INSERT INTO flash_orders (sale, level) VALUES (?, ?)",
                        (&*sale, level),
                    )
                    .await?;
            }
            #[cfg(feature = "etcd")]
            Store::Etcd { client, sale } => {
                let order = ORDER_SEQ.fetch_add(1, Ordering::Relaxed);
                let key = format!("flash/{sale}/orders/{}-{order}", std::process::id());
                client.put(key, level.to_string(), None).await?;
            }
            #[cfg(feature = "zookeeper")]
            Store::ZooKeeper { client, sale } => {
                let options = zookeeper_client::CreateMode::PersistentSequential
                    .with_acls(zookeeper_client::Acls::anyone_all());
                let path = format!("/flash/{sale}/orders/o-");
                client
                    .create(&path, level.to_string().as_bytes(), &options)
                    .await?;
            }
        }
        Ok(())
    }

    async fn orders(&mut self) -> Result<Vec<u64>, Error> {
        Ok(match self {
            Store::Memory(shop) => shop.orders.lock().expect("orders").clone(),
            Store::Redis { conn, sale } => {
                conn.lrange(format!("flash:{sale}:orders"), 0, -1).await?
            }
            Store::Postgres { client, sale } => client
                .query("SELECT level FROM flash_orders WHERE sale = $1", &[sale])
                .await?
                .iter()
                .map(|row| row.get::<_, i64>(0) as u64)
                .collect(),
            #[cfg(feature = "mysql")]
            Store::MySql { pool, sale } => {
                pool.get_conn()
                    .await?
                    .exec("SELECT level FROM flash_orders WHERE sale = ?", (&*sale,))
                    .await?
            }
            #[cfg(feature = "etcd")]
            Store::Etcd { client, sale } => {
                let prefix = etcd_client::GetOptions::new().with_prefix();
                let got = client
                    .get(format!("flash/{sale}/orders/"), Some(prefix))
                    .await?;
                let mut levels = Vec::new();
                for kv in got.kvs() {
                    levels.push(kv.value_str()?.parse()?);
                }
                levels
            }
            #[cfg(feature = "zookeeper")]
            Store::ZooKeeper { client, sale } => {
                let (client, dir) = (&*client, &format!("/flash/{sale}/orders"));
                // Up to the leader first, as `read_stock`: the buyers wrote
                // through other sessions.
                let orders = examples::zookeeper_retrying(|| async move {
                    client.sync(dir).await?;
                    let mut orders = Vec::new();
                    for order in client.list_children(dir).await? {
                        orders.push(client.get_data(&format!("{dir}/{order}")).await?.0);
                    }
                    Ok(orders)
                })
                .await?;
                let mut levels = Vec::new();
                for data in orders {
                    levels.push(String::from_utf8(data)?.parse()?);
                }
                levels
            }
        })
    }

    async fn order_count(&mut self) -> Result<u64, Error> {
        Ok(match self {
            Store::Memory(shop) => shop.orders.lock().expect("orders").len() as u64,
            Store::Redis { conn, sale } => conn.llen(format!("flash:{sale}:orders")).await?,
            Store::Postgres { client, sale } => {
                let row = client
                    .query_one("SELECT count(*) FROM flash_orders WHERE sale = $1", &[sale])
                    .await?;
                row.get::<_, i64>(0) as u64
            }
            #[cfg(feature = "mysql")]
            Store::MySql { pool, sale } => pool
                .get_conn()
                .await?
                .exec_first(
                    "SELECT COUNT(*) FROM flash_orders WHERE sale = ?",
                    (&*sale,),
                )
                .await?
                .unwrap_or(0),
            #[cfg(feature = "etcd")]
            Store::Etcd { client, sale } => {
                let count = etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_count_only();
                let got = client
                    .get(format!("flash/{sale}/orders/"), Some(count))
                    .await?;
                got.count() as u64
            }
            #[cfg(feature = "zookeeper")]
            Store::ZooKeeper { client, sale } => {
                let dir = format!("/flash/{sale}/orders");
                let stat = examples::zookeeper_retrying(|| client.check_stat(&dir))
                    .await?
                    .ok_or("no orders node")?;
                stat.num_children as u64
            }
        })
    }

    /// Connects to where `args` says the stock lives (a fresh connection, as
    /// a separate client would have), for the sale `sale`.
    async fn open(args: &Args, sale: &str) -> Result<Store, Error> {
        let sale = sale.to_owned();
        Ok(match &args.store {
            StoreFlag::Memory => Store::Memory(Arc::default()),
            StoreFlag::Redis(url) => {
                let conn = redis::Client::open(url.as_str())?
                    .get_multiplexed_async_connection()
                    .await?;
                Store::Redis { conn, sale }
            }
            StoreFlag::Postgres(url) => {
                let (client, connection) =
                    tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
                tokio::spawn(connection);
                Store::Postgres {
                    client: Arc::new(client),
                    sale,
                }
            }
            #[cfg(feature = "mysql")]
            StoreFlag::MySql(_) => Store::MySql {
                pool: args.store.mysql_pool()?,
                sale,
            },
            #[cfg(not(feature = "mysql"))]
            StoreFlag::MySql(_) => return Err(examples::WITHOUT_MYSQL.into()),
            #[cfg(feature = "etcd")]
            StoreFlag::Etcd(_) => {
                let client = args.store.etcd_kv().await?;
                Store::Etcd { client, sale }
            }
            #[cfg(not(feature = "etcd"))]
            StoreFlag::Etcd(_) => return Err(examples::WITHOUT_ETCD.into()),
            #[cfg(feature = "zookeeper")]
            StoreFlag::ZooKeeper(_) => Store::ZooKeeper {
                client: args.store.zookeeper_client().await?,
                sale,
            },
            #[cfg(not(feature = "zookeeper"))]
            StoreFlag::ZooKeeper(_) => return Err(examples::WITHOUT_ZOOKEEPER.into()),
        })
    }

    /// Creates the tables of a PostgreSQL or MySQL store (once, by the
    /// parent).
    async fn create_tables(&self) -> Result<(), Error> {
        if let Store::Postgres { client, .. } = self {
            client
                .batch_execute(
                    "CREATE TABLE IF NOT EXISTS flash_stock (sale text PRIMARY KEY, stock bigint NOT NULL);
                     CREATE TABLE IF NOT EXISTS flash_orders (sale text NOT NULL, level bigint NOT NULL);",
                )
                .await?;
        }
        #[cfg(feature = "mysql")]
        if let Store::MySql { pool, .. } = self {
            let mut conn = pool.get_conn().await?;
            conn.query_drop(
                "CREATE TABLE IF NOT EXISTS flash_stock (sale VARCHAR(64) PRIMARY KEY, stock BIGINT UNSIGNED NOT NULL)",
            )
            .await?;
            conn.query_drop(
                "CREATE TABLE IF NOT EXISTS flash_orders (sale VARCHAR(64) NOT NULL, level BIGINT UNSIGNED NOT NULL)",
            )
            .await?;
        }
        Ok(())
    }

    /// Removes the sale's data from a shared store.
    async fn clean_up(self) -> Result<(), Error> {
        match self {
            Store::Memory(_) => {}
            Store::Redis { mut conn, sale } => {
                let _: u64 = conn
                    .del(&[
                        format!("flash:{sale}:stock"),
                        format!("flash:{sale}:orders"),
                    ])
                    .await?;
            }
            Store::Postgres { client, sale } => {
                client
                    .execute("DELETE FROM flash_stock WHERE sale = $1", &[&sale])
                    .await?;
                client
                    .execute("DELETE FROM flash_orders WHERE sale = $1", &[&sale])
                    .await?;
            }
            #[cfg(feature = "mysql")]
            Store::MySql { pool, sale } => {
                let mut conn = pool.get_conn().await?;
                conn.exec_drop("DELETE FROM flash_stock WHERE sale = ?", (&sale,))
                    .await?;
                conn.exec_drop("DELETE FROM flash_orders WHERE sale = ?", (&sale,))
                    .await?;
                drop(conn);
                pool.disconnect().await?;
            }
            #[cfg(feature = "etcd")]
            Store::Etcd { mut client, sale } => {
                let prefix = etcd_client::DeleteOptions::new().with_prefix();
                client
                    .delete(format!("flash/{sale}/"), Some(prefix))
                    .await?;
            }
            #[cfg(feature = "zookeeper")]
            Store::ZooKeeper { client, sale } => {
                let dir = format!("/flash/{sale}/orders");
                for order in client.list_children(&dir).await? {
                    client.delete(&format!("{dir}/{order}"), None).await?;
                }
                for node in [
                    dir,
                    format!("/flash/{sale}/stock"),
                    format!("/flash/{sale}"),
                ] {
                    client.delete(&node, None).await?;
                }
            }
        }
        Ok(())
    }
}

/// One purchase, unprotected: read the stock, pause, write it back less one.
async fn buy_one(store: &mut Store, pause: Duration) -> Result<Option<u64>, Error> {
    let level = store.read_stock().await?;
    if level == 0 {
        return Ok(None);
    }
    tokio::time::sleep(pause).await;
    store.write_stock(level - 1).await?;
    store.record_order(level).await?;
    Ok(Some(level))
}

/// The same purchase as a critical section, across every process of the sale.
/// Also returns how long the caller waited for the lock.
#[distributed_lock(key = "stock:{sale}", ttl = "10s")]
async fn buy_one_locked(
    sale: &str,
    store: &mut Store,
    pause: Duration,
    called: Instant,
) -> (Result<Option<u64>, Error>, Duration) {
    let waited = called.elapsed();
    (buy_one(store, pause).await, waited)
}

/// A buyer buys until the stock is gone; returns its lock waits.
async fn buyer(mut store: Store, sale: String, args: Args) -> Result<Vec<Duration>, Error> {
    let mut waits = Vec::new();
    loop {
        let bought = if args.locked {
            let (bought, waited) =
                buy_one_locked(&sale, &mut store, args.pause, Instant::now()).await?;
            waits.push(waited);
            bought?
        } else {
            buy_one(&mut store, args.pause).await?
        };
        if bought.is_none() {
            return Ok(waits);
        }
    }
}

/// Runs `buyers` buyer tasks in this process; returns all their lock waits.
async fn run_buyers(
    store: &Store,
    sale: &str,
    args: &Args,
    buyers: usize,
) -> Result<Vec<Duration>, Error> {
    let mut tasks = Vec::new();
    for _ in 0..buyers {
        let store = match store {
            Store::Memory(_) => store.clone(),
            // One connection per buyer, as separate clients would have.
            _ => Store::open(args, sale).await?,
        };
        tasks.push(tokio::spawn(buyer(store, sale.to_owned(), args.clone())));
    }
    let mut waits = Vec::new();
    for task in tasks {
        waits.extend(task.await??);
    }
    Ok(waits)
}

/// Prints a progress line every 100 ms until the stock is gone.
fn spawn_progress(mut store: Store, stock: u64) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        tick.tick().await;
        loop {
            tick.tick().await;
            let (Ok(orders), Ok(left)) = (store.order_count().await, store.read_stock().await)
            else {
                continue;
            };
            println!("  ... {orders} orders, stock at {left} of {stock}");
        }
    })
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// Starts the worker processes of a multi-process sale; returns their waits.
fn run_processes(args: &Args, sale: &str) -> Result<Vec<Duration>, Error> {
    let exe = std::env::current_exe()?;
    if !args.store.is_shared() {
        return Err("worker processes need a shared store".into());
    }
    let mut children = Vec::new();
    for i in 0..args.processes {
        // Spread the buyers; every process gets at least one.
        let buyers =
            (args.buyers / args.processes + usize::from(i < args.buyers % args.processes)).max(1);
        let mut command = Command::new(&exe);
        command
            .args(["--worker", sale])
            .args(args.store.args())
            .args(["--buyers", &buyers.to_string()])
            .args(["--pause-ms", &args.pause.as_millis().to_string()])
            .stdout(Stdio::piped());
        if !args.locked {
            command.arg("--no-lock");
        }
        children.push(command.spawn()?);
    }
    let mut waits = Vec::new();
    for mut child in children {
        let stdout = child.stdout.take().ok_or("no worker stdout")?;
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            if let Some(list) = line.strip_prefix("waits-us ") {
                waits.extend(
                    list.split(',')
                        .filter_map(|us| us.parse().ok())
                        .map(Duration::from_micros),
                );
            }
        }
        let status = child.wait()?;
        if !status.success() {
            return Err(format!("a worker process failed: {status}").into());
        }
    }
    Ok(waits)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args = parse_args()?;
    lock_runtime::init(args.store.registry().await?)?;

    if let Some(sale) = &args.worker {
        // A worker process: buy, then report the lock waits to the parent.
        let store = Store::open(&args, sale).await?;
        if let Store::Memory(_) = store {
            return Err(format!("--worker needs {STORE_FLAGS}").into());
        }
        let waits = run_buyers(&store, sale, &args, args.buyers).await?;
        let list: Vec<String> = waits.iter().map(|w| w.as_micros().to_string()).collect();
        println!("waits-us {}", list.join(","));
        return Ok(());
    }

    let stamp = SystemTime::now().duration_since(UNIX_EPOCH)?.as_millis();
    let sale = format!("{}-{stamp}", std::process::id());
    let mut store = Store::open(&args, &sale).await?;
    store.create_tables().await?;
    store.write_stock(args.stock).await?;
    let backend = args.store.name();
    println!(
        "flash sale: {} items, {} buyers in {} process(es), {} backend, lock {}",
        args.stock,
        args.buyers,
        args.processes,
        backend,
        if args.locked { "on" } else { "OFF" }
    );

    let started = Instant::now();
    let progress = spawn_progress(store.clone(), args.stock);
    let waits = if args.processes > 1 {
        let (args, sale) = (args.clone(), sale.clone());
        tokio::task::spawn_blocking(move || run_processes(&args, &sale)).await??
    } else {
        run_buyers(&store, &sale, &args, args.buyers).await?
    };
    progress.abort();
    let elapsed = started.elapsed();

    let orders = store.orders().await?;
    let left = store.read_stock().await?;
    let distinct: HashSet<u64> = orders.iter().copied().collect();
    let oversold = (orders.len() as u64).saturating_sub(args.stock);
    let sold_twice = orders.len() - distinct.len();
    let mut sorted = waits;
    sorted.sort_unstable();
    println!("  stock       {} -> {left}", args.stock);
    println!(
        "  orders      {} recorded, {} distinct items",
        orders.len(),
        distinct.len()
    );
    println!("  oversold    {oversold} ({sold_twice} items sold more than once)");
    println!("  elapsed     {:.2} s", elapsed.as_secs_f64());
    if args.locked {
        println!(
            "  lock waits  p50 {}, p99 {}, max {} over {} purchases",
            ms(percentile(&sorted, 50.0)),
            ms(percentile(&sorted, 99.0)),
            ms(sorted.last().copied().unwrap_or_default()),
            sorted.len()
        );
    }
    match (oversold + sold_twice as u64, args.locked) {
        (0, _) => println!("OK: every item sold exactly once."),
        (_, false) => {
            println!("OVERSOLD without the lock, as expected: run again without --no-lock.")
        }
        (_, true) => {
            println!("FAILED: oversold with the lock on.");
            std::process::exit(1);
        }
    }
    store.clean_up().await?;
    Ok(())
}
