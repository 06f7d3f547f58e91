//! The PostgreSQL, MySQL, etcd and ZooKeeper rows: each store's library beside its floor, on a server of its own.

use super::*;

/// A store's rows in the table: its name, the number of its first row, its
/// contenders' names for [`make_lib`], and the work of each row (at full
/// scale).
pub(crate) struct StoreRows {
    pub(crate) name: &'static str,
    pub(crate) first: u32,
    pub(crate) floor: &'static str,
    pub(crate) ours: &'static str,
    pub(crate) uncontended_ops: u64,
    pub(crate) distinct_ops: u64,
    pub(crate) process_ops: u64,
    /// Another floor for the uncontended and distinct-key rows: its name in
    /// the table and for [`make_lib`].
    pub(crate) second_floor: Option<(&'static str, &'static str)>,
    /// Other libraries on this store, in every row: the name in the table
    /// and for [`make_lib`].
    pub(crate) peers: &'static [(&'static str, &'static str)],
    /// Another floor for the hand-off row.
    pub(crate) handoff_floor: Option<(&'static str, &'static str)>,
}

pub(crate) const POSTGRES: StoreRows = StoreRows {
    name: "postgres",
    first: 9,
    floor: "pg-floor",
    ours: "pg-lock-runtime",
    uncontended_ops: 2_000,
    distinct_ops: 100,
    process_ops: 200,
    second_floor: None,
    peers: &[("distributed-lock", "pg-distributed-lock")],
    handoff_floor: None,
};

pub(crate) const MYSQL: StoreRows = StoreRows {
    name: "mysql",
    first: 25,
    floor: "mysql-floor",
    ours: "mysql-lock-runtime",
    uncontended_ops: 2_000,
    distinct_ops: 100,
    process_ops: 200,
    second_floor: None,
    peers: &[("distributed-lock", "mysql-distributed-lock")],
    handoff_floor: None,
};

pub(crate) const ETCD: StoreRows = StoreRows {
    name: "etcd",
    first: 13,
    floor: "etcd-floor",
    ours: "etcd-lock-runtime",
    uncontended_ops: 1_000,
    distinct_ops: 50,
    process_ops: 100,
    second_floor: None,
    peers: &[],
    // The floor above retries its transaction at once, so its process never
    // parks; this one waits for the deletion as the library does.
    handoff_floor: Some(("watching floor", "etcd-watch-floor")),
};

pub(crate) const ZOOKEEPER: StoreRows = StoreRows {
    name: "zookeeper",
    first: 17,
    floor: "zk-floor",
    ours: "zk-lock-runtime",
    uncontended_ops: 1_000,
    // Rounds of a second or more: shorter ones are at the mercy of the
    // server's thread hand-offs on two cores (the same work varied by a
    // third from one half-second round to the next).
    distinct_ops: 200,
    process_ops: 100,
    // The queue recipe (sequential child + listing) without a library: the
    // read that a FIFO queue needs and a single node does not.
    second_floor: Some(("queue floor", "zk-queue-floor")),
    peers: &[],
    handoff_floor: None,
};

/// One store's four rows, the library beside the store's floor on one
/// server at `url`: uncontended, distinct keys (interleaved, best of six),
/// one hot key across processes, hand-off. Also returns the store's round
/// trip, the unit of the hand-off row.
pub(crate) async fn store_rows(
    store: &StoreRows,
    url: &str,
    quick: bool,
) -> Result<(Vec<Measured>, Duration), Error> {
    let scale = if quick { 10 } else { 1 };
    let (name, first) = (store.name, store.first);
    let floor = make_lib(store.floor, url).await?;
    let ours = make_lib(store.ours, url).await?;
    let mut contenders = vec![("floor", floor.clone()), ("lock-runtime", ours)];
    if let Some((name, lib)) = store.second_floor {
        contenders.insert(1, (name, make_lib(lib, url).await?));
    }
    for (name, lib) in store.peers {
        contenders.push((name, make_lib(lib, url).await?));
    }
    // Warm the server as well as the clients: once at 64 tasks, so a JIT
    // (ZooKeeper's) has compiled the hot paths of each contender's requests
    // before any round is measured.
    for (_, lib) in &contenders {
        run_tasks(lib, "warm-up", "", 64, store.distinct_ops / scale, false).await?;
    }
    let mut rows = Vec::new();
    for (scenario, tasks, ops) in [
        (
            format!("{first}. {name}: 1 task, uncontended"),
            1usize,
            store.uncontended_ops / scale,
        ),
        (
            format!("{}. {name}: 64 tasks, distinct keys", first + 1),
            64,
            store.distinct_ops / scale,
        ),
    ] {
        // A store's disk makes single runs noisy: six interleaved rounds
        // of each, keeping each contender's best, and beside it the median
        // of its ratios to the floor round by round.
        let refs: Vec<(&str, &Lib)> = contenders.iter().map(|(n, l)| (*n, l)).collect();
        rows.extend(interleaved(&refs, &scenario, tasks, ops, false, ROUNDS).await?);
    }
    let mut workers = vec![("floor", store.floor), ("lock-runtime", store.ours)];
    workers.extend(store.peers);
    for &(lib_name, worker_lib) in &workers {
        let (ops, url) = (store.process_ops / scale, url.to_owned());
        let scenario = format!("{}. {name}: 4 processes x 4 tasks, one hot key", first + 2);
        let mut m =
            tokio::task::spawn_blocking(move || run_processes(&scenario, worker_lib, &url, ops))
                .await??;
        m.lib = lib_name.into();
        rows.push(m);
    }
    let round_trip = store_round_trip(&floor).await?;
    workers.extend(store.handoff_floor);
    for (lib_name, worker_lib) in workers {
        let rounds = if quick { 30 } else { 200 };
        let url = url.to_owned();
        let scenario = format!(
            "{}. {name}: hand-off, release in A to acquire in waiting B",
            first + 3
        );
        let mut m =
            tokio::task::spawn_blocking(move || run_handoff(&scenario, worker_lib, &url, rounds))
                .await??;
        m.lib = lib_name.into();
        m.round_trip = Some(round_trip);
        rows.push(m);
    }
    Ok((rows, round_trip))
}

/// The median round trip of the store a floor talks to: `SELECT 1` on
/// PostgreSQL and MySQL, a `put` (a committed write) on etcd, a `setData` (a
/// committed write) on ZooKeeper.
pub(crate) async fn store_round_trip(floor: &Lib) -> Result<Duration, Error> {
    let mut samples = Vec::new();
    for _ in 0..200 {
        let started = Instant::now();
        match floor {
            Lib::PgFloor(pg) => {
                pg.client.simple_query("SELECT 1").await?;
            }
            Lib::MySqlFloor(mysql) => {
                use mysql_async::prelude::Queryable;
                mysql.pool.get_conn().await?.query_drop("SELECT 1").await?;
            }
            Lib::EtcdFloor(etcd) => {
                etcd.kv.clone().put("bench:round-trip", "", None).await?;
            }
            Lib::ZkFloor(zk) => {
                zk.client.set_data(ZkFloor::DIR, b"", None).await?;
            }
            _ => return Err("not a store floor".into()),
        }
        samples.push(started.elapsed());
    }
    samples.sort_unstable();
    Ok(samples[samples.len() / 2])
}

/// Runs one store's rows on a server of its own and prints them.
pub(crate) async fn one_store(name: &str, quick: bool) -> Result<(), Error> {
    let (rows, round_trip) = match name {
        "postgres" => {
            let server = lock_tests::PostgresServer::new();
            store_rows(&POSTGRES, &server.url(), quick).await?
        }
        "mysql" => {
            let server = lock_tests::MariaDbServer::new();
            store_rows(&MYSQL, &server.url(), quick).await?
        }
        "etcd" => {
            let cluster = lock_tests::EtcdCluster::single();
            store_rows(&ETCD, &cluster.endpoints().join(","), quick).await?
        }
        "zookeeper" => {
            let ensemble = lock_tests::ZooKeeperEnsemble::single_deployed();
            store_rows(&ZOOKEEPER, &ensemble.connect_string(), quick).await?
        }
        "memory" => {
            // Rows 6a, 6b and 7, on the global registry the attribute uses.
            let memory = LockRegistry::memory();
            lock_runtime::init(memory.clone())?;
            let scale = if quick { 10 } else { 1 };
            let rounds = if quick { 2 } else { ROUNDS };
            for m in memory_rows(&Lib::Ours(memory), scale, rounds).await? {
                println!("{}", row_line(&m));
            }
            return Ok(());
        }
        "claims" => {
            // Rows 21-24 and 29-30: semaphores and read-write locks.
            let (redis, postgres) = (RedisServer::new(), lock_tests::PostgresServer::new());
            let mut rows = claim_rows("Redis", &redis.url(), 21, quick).await?;
            rows.extend(claim_rows("PostgreSQL", &postgres.url(), 23, quick).await?);
            drop((redis, postgres));
            let mysql = lock_tests::MariaDbServer::new();
            rows.extend(claim_rows("MySQL", &mysql.url(), 29, quick).await?);
            for m in &rows {
                println!("{}", row_line(m));
            }
            return Ok(());
        }
        other => {
            return Err(format!(
                "--store takes memory, postgres, mysql, etcd, zookeeper or claims, not `{other}`"
            )
            .into());
        }
    };
    println!("round trip p50 {}", fmt_d(round_trip));
    for m in &rows {
        let rtt = m.scenario.contains("hand-off").then(|| {
            format!(
                " {:.1} RTT",
                m.pct(50.0).as_secs_f64() / round_trip.as_secs_f64()
            )
        });
        println!("{}{}", row_line(m), rtt.unwrap_or_default());
    }
    Ok(())
}
