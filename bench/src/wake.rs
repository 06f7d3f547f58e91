//! The wake-up probe: how long a waiter in another process takes to see a release, on each store's notifications.

use super::*;

/// `--probe-wake [ROUNDS]`: what a release notification costs a parked
/// process. A worker subscribes to a key's release channel through the
/// Redis store and waits; every 6 ms this process publishes on it. Prints
/// the time from the publish to the worker's watch firing, and from there
/// to the end of one round trip made by the woken task (a waiter's
/// acquire), beside this process's own round trip.
pub(crate) async fn probe_wake(args: &[String]) -> Result<(), Error> {
    for kind in ["wake", "wake-raw", "wake-etcd"] {
        println!("{kind}:");
        probe_wake_once(kind, args).await?;
    }
    Ok(())
}

/// What the probe releases on: a Redis channel, or an etcd key deleted.
pub(crate) enum Releaser {
    Redis(MultiplexedConnection, String),
    Etcd(Box<etcd_client::KvClient>, String),
}

impl Releaser {
    /// Connects to the probe's store (etcd for `wake-etcd`, else Redis)
    /// for `key`.
    pub(crate) async fn connect(kind: &str, url: &str, key: &str) -> Result<Releaser, Error> {
        Ok(if kind == "wake-etcd" {
            let endpoints: Vec<&str> = url.split(',').collect();
            let client = etcd_client::Client::connect(endpoints, None).await?;
            Releaser::Etcd(Box::new(client.kv_client()), format!("locks/{key}"))
        } else {
            let conn = redis::Client::open(url)?
                .get_multiplexed_async_connection()
                .await?;
            Releaser::Redis(conn, format!("lock:{{{key}}}:released"))
        })
    }

    /// Makes the key held again (etcd: put it), without a release.
    pub(crate) async fn hold(&mut self) -> Result<(), Error> {
        if let Releaser::Etcd(kv, key) = self {
            kv.put(key.as_str(), "held", None).await?;
        }
        Ok(())
    }

    pub(crate) async fn release(&mut self) -> Result<(), Error> {
        match self {
            Releaser::Redis(conn, channel) => {
                let _: i64 = redis::cmd("PUBLISH")
                    .arg(channel.as_str())
                    .arg("")
                    .query_async(conn)
                    .await?;
            }
            Releaser::Etcd(kv, key) => {
                kv.delete(key.as_str(), None).await?;
            }
        }
        Ok(())
    }

    pub(crate) async fn round_trip(&mut self) -> Result<(), Error> {
        match self {
            Releaser::Redis(conn, _) => {
                let _: String = redis::cmd("PING").query_async(conn).await?;
            }
            Releaser::Etcd(kv, key) => {
                kv.get(key.as_str(), None).await?;
            }
        }
        Ok(())
    }
}

/// How the probe's worker waits for a release: a store's watch, or
/// redis-rs's pubsub stream alone (`wake-raw`).
pub(crate) enum Waiter {
    Store {
        watch: lock_runtime::store::ReleaseWatch,
        /// Kept as long as its watch (its subscriber task).
        _store: Arc<dyn lock_runtime::store::Store>,
    },
    Stream(futures_util::stream::BoxStream<'static, redis::Msg>),
}

impl Waiter {
    pub(crate) async fn subscribe(kind: &str, url: &str, key: &str) -> Result<Waiter, Error> {
        let store: Arc<dyn lock_runtime::store::Store> = match kind {
            "wake-raw" => {
                let mut pubsub = redis::Client::open(url)?.get_async_pubsub().await?;
                pubsub.subscribe(format!("lock:{{{key}}}:released")).await?;
                let stream = futures_util::StreamExt::boxed(pubsub.into_on_message());
                return Ok(Waiter::Stream(stream));
            }
            "wake-etcd" => {
                let endpoints: Vec<&str> = url.split(',').collect();
                Arc::new(
                    lock_runtime::EtcdStore::builder(&endpoints)
                        .connect()
                        .await?,
                )
            }
            _ => Arc::new(lock_runtime::RedisStore::builder(url).connect().await?),
        };
        let watch = store.watch(key).await?;
        Ok(Waiter::Store {
            watch,
            _store: store,
        })
    }

    pub(crate) async fn released(&mut self) -> Result<(), Error> {
        match self {
            Waiter::Store { watch, .. } => watch.released().await,
            Waiter::Stream(stream) => {
                futures_util::StreamExt::next(stream)
                    .await
                    .ok_or("the subscription ended")?;
            }
        }
        Ok(())
    }
}

/// The probe's worker (`--worker wake|wake-raw|wake-etcd _ URL KEY COUNT
/// START_NS`): subscribed before the start, it prints when each release
/// woke it and when one round trip from the woken task (as a waiter's
/// acquire would make) was answered.
pub(crate) async fn wake_worker(
    kind: &str,
    url: &str,
    key: &str,
    count: u64,
    start: u128,
) -> Result<(), Error> {
    let mut waiter = Waiter::subscribe(kind, url, key).await?;
    let mut store = Releaser::connect(kind, url, key).await?;
    let wait = start.saturating_sub(now_ns());
    tokio::time::sleep(Duration::from_nanos(wait as u64)).await;
    for _ in 0..count {
        waiter.released().await?;
        let woke = now_ns();
        store.round_trip().await?;
        println!("woke {woke} {}", now_ns());
    }
    Ok(())
}

pub(crate) async fn probe_wake_once(kind: &str, args: &[String]) -> Result<(), Error> {
    let rounds: u64 = args.first().map_or(Ok(400), |r| r.parse())?;
    let key = format!("bench:{}:wake", rand_u128() as u32);
    let (mut redis_server, mut etcd) = (None, None);
    let url = if kind == "wake-etcd" {
        etcd.insert(lock_tests::EtcdCluster::single())
            .endpoints()
            .join(",")
    } else {
        redis_server.insert(RedisServer::new()).url()
    };
    let mut releaser = Releaser::connect(kind, &url, &key).await?;
    let start = now_ns() + 300_000_000;
    let argv = worker_args(kind, "-", &url, &key, rounds, start);
    let worker = tokio::task::spawn_blocking(move || spawn_workers(1, &argv));
    let mut pings = Vec::new();
    for _ in 0..200 {
        let sent = Instant::now();
        releaser.round_trip().await?;
        pings.push(sent.elapsed());
    }
    pings.sort_unstable();
    let wait = (start + 200_000_000).saturating_sub(now_ns());
    tokio::time::sleep(Duration::from_nanos(wait as u64)).await;
    let (mut published, mut answered) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        releaser.hold().await?;
        tokio::time::sleep(Duration::from_millis(6)).await;
        published.push(now_ns());
        let sent = Instant::now();
        releaser.release().await?;
        answered.push(sent.elapsed());
    }
    answered.sort_unstable();
    let outputs = worker.await??;
    let woke: Vec<(u128, u128)> = outputs
        .iter()
        .flatten()
        .filter_map(|line| {
            let rest = line.strip_prefix("woke ")?;
            let mut parts = rest.split(' ').filter_map(|p| p.parse::<u128>().ok());
            Some((parts.next()?, parts.next()?))
        })
        .collect();
    let mut delivery: Vec<Duration> = Vec::new();
    let mut round_trip: Vec<Duration> = Vec::new();
    for (sent, (fired, answered)) in published.iter().zip(&woke) {
        delivery.push(Duration::from_nanos(fired.saturating_sub(*sent) as u64));
        round_trip.push(Duration::from_nanos(answered.saturating_sub(*fired) as u64));
    }
    delivery.sort_unstable();
    round_trip.sort_unstable();
    drop((redis_server, etcd));
    println!("{} wakes of {rounds} releases", woke.len());
    for (what, durations) in [
        ("round trip of this (busy) process", &pings),
        ("the release's own round trip (this process)", &answered),
        ("release sent -> the parked worker's watch fires", &delivery),
        (
            "watch fired -> one round trip from the woken task done",
            &round_trip,
        ),
    ] {
        println!(
            "{what}: p50 {} p90 {}",
            fmt_d(percentile(durations, 50.0)),
            fmt_d(percentile(durations, 90.0))
        );
    }
    Ok(())
}
