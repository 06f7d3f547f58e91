//! `--scaling [--quick]`: how cost grows with work. Throughput and p99
//! wait against the number of tasks (1 to 256) on distinct keys and on one
//! hot key, and against the number of keys held at once (a thousand to a
//! million), with the heap this process keeps per held lock (counted by
//! its allocator) and the store's memory per held lock; for
//! lock-runtime, the floor and rslock on Redis, and lock-runtime on each
//! other store. Printed as two tables and drawn in `BENCHMARKS-scaling.svg`
//! (at the repository's root; under `bench/target/` with `--quick`, or
//! when a further argument runs only the series whose names contain it).

use super::*;

/// The task counts of the first sweep.
const TASKS: [usize; 5] = [1, 4, 16, 64, 256];

/// The numbers of keys held at once of the second sweep.
const HELD: [usize; 4] = [1_000, 10_000, 100_000, 1_000_000];

/// A series stops growing once one of its points took longer than this
/// (its next, ten times larger, would take ten times as long).
const CAP: Duration = Duration::from_secs(60);

/// How many tasks take the held keys.
const TAKERS: usize = 64;

/// One series: a contender on a store.
struct Series {
    name: String,
    lib: Lib,
    /// Sections per point of the task sweep (split between the tasks).
    sections: u64,
    /// The largest number of keys held at once it is asked to reach.
    most_held: usize,
    /// The store's memory now, in bytes: Redis's `used_memory`, or the
    /// resident memory of the servers this process started.
    store_bytes: fn(&str) -> u64,
    url: String,
}

/// One point of the task sweep.
struct TaskPoint {
    tasks: usize,
    hot: bool,
    throughput: f64,
    p99: Duration,
}

/// One point of the held-keys sweep.
struct HeldPoint {
    held: usize,
    throughput: f64,
    p99: Duration,
    client_per_lock: f64,
    store_per_lock: f64,
}

/// A lock the held-keys sweep keeps.
enum Held {
    Guard(lock_runtime::LockGuard),
    Floor(String, String),
    Rslock(rslock::Lock),
}

pub(crate) async fn scaling(quick: bool, only: Option<&str>) -> Result<(), Error> {
    let wanted = |name: &str| only.is_none_or(|only| name.contains(only));
    allocations::track_bytes();
    let scale = if quick { 10 } else { 1 };
    let most = if quick { 10_000 } else { 1_000_000 };
    let redis = RedisServer::new();
    let redis_url = redis.url();
    let floor = Lib::Floor(
        redis::Client::open(redis_url.as_str())?
            .get_multiplexed_async_connection()
            .await?,
    );
    let mut all = vec![
        Series::redis("floor (Redis)", floor, &redis_url, scale, most),
        Series::redis(
            "lock-runtime (Redis)",
            make_lib("lock-runtime", &redis_url).await?,
            &redis_url,
            scale,
            most,
        ),
        Series::redis(
            "rslock (Redis)",
            make_lib("rslock", &redis_url).await?,
            &redis_url,
            scale,
            most,
        ),
        Series {
            name: "lock-runtime (memory)".into(),
            lib: Lib::Ours(LockRegistry::memory()),
            sections: 60_000 / scale,
            most_held: most,
            store_bytes: |_| 0,
            url: String::new(),
        },
    ];
    let mut tables = (String::new(), String::new());
    let (mut task_points, mut held_points) = (Vec::new(), Vec::new());
    for series in all.drain(..).filter(|series| wanted(&series.name)) {
        let (tasks, held) = series.run().await?;
        task_points.push((series.name.clone(), tasks));
        held_points.push((series.name.clone(), held));
    }
    drop(redis);
    // The other stores, one server at a time.
    for store in ["postgres", "mysql", "etcd", "zookeeper"] {
        if !wanted(&format!("lock-runtime ({store})")) {
            continue;
        }
        let (server, url): (Box<dyn std::any::Any>, String) = match store {
            "postgres" => {
                let server = lock_tests::PostgresServer::new();
                let url = server.url();
                (Box::new(server), url)
            }
            "mysql" => {
                let server = lock_tests::MariaDbServer::new();
                let url = server.url();
                (Box::new(server), url)
            }
            "etcd" => {
                let cluster = lock_tests::EtcdCluster::single();
                let url = cluster.endpoints().join(",");
                (Box::new(cluster), url)
            }
            _ => {
                let ensemble = lock_tests::ZooKeeperEnsemble::single_deployed();
                let url = ensemble.connect_string();
                (Box::new(ensemble), url)
            }
        };
        let registry = match store {
            "postgres" => LockRegistry::postgres(&url).await?,
            "mysql" => LockRegistry::mysql(&url).await?,
            "etcd" => LockRegistry::etcd(&url.split(',').collect::<Vec<_>>()).await?,
            _ => LockRegistry::zookeeper(&url).await?,
        };
        let series = Series {
            name: format!("lock-runtime ({store})"),
            lib: Lib::Ours(registry),
            sections: 1_600 / scale,
            most_held: (most / 10).max(1_000),
            store_bytes: |_| servers_rss_bytes(),
            url,
        };
        let (tasks, held) = series.run().await?;
        task_points.push((series.name.clone(), tasks));
        held_points.push((series.name.clone(), held));
        drop(series);
        drop(server);
    }
    write_tables(&task_points, &held_points, &mut tables);
    println!("{}\n{}", tables.0, tables.1);
    let path = if quick || only.is_some() {
        std::path::PathBuf::from("target/BENCHMARKS-scaling.svg")
    } else {
        std::path::PathBuf::from("../BENCHMARKS-scaling.svg")
    };
    chart_scaling(&path, &task_points, &held_points)?;
    println!("drawn in {}", path.display());
    Ok(())
}

impl Series {
    fn redis(name: &str, lib: Lib, url: &str, scale: u64, most: usize) -> Series {
        Series {
            name: name.into(),
            lib,
            sections: 6_000 / scale,
            most_held: most,
            store_bytes: redis_used_memory,
            url: url.into(),
        }
    }

    async fn run(&self) -> Result<(Vec<TaskPoint>, Vec<HeldPoint>), Error> {
        // Connections, scripts and (ZooKeeper's) JIT warmed first.
        run_tasks(&self.lib, "warm-up", &self.name, 64, 20, false).await?;
        let mut tasks = Vec::new();
        for hot in [false, true] {
            for n in TASKS {
                let ops = (self.sections / n as u64).max(2);
                let started = Instant::now();
                let m = run_tasks(&self.lib, "scaling", &self.name, n, ops, hot).await?;
                let point = TaskPoint {
                    tasks: n,
                    hot,
                    throughput: m.throughput(),
                    p99: m.pct(99.0),
                };
                println!(
                    "{:<26} {:>3} tasks {:<13} {:>9.0}/s  p99 {:>9}",
                    self.name,
                    n,
                    if hot { "one hot key" } else { "distinct keys" },
                    point.throughput,
                    fmt_d(point.p99)
                );
                tasks.push(point);
                if started.elapsed() > CAP {
                    break;
                }
            }
        }
        let mut held = Vec::new();
        for n in HELD.into_iter().filter(|&n| n <= self.most_held) {
            let started = Instant::now();
            let point = match self.hold(n).await {
                Ok(point) => point,
                Err(error) => {
                    // The series ends here; the report says where and why.
                    let mut why = error.to_string();
                    let mut source = error.source();
                    while let Some(cause) = source {
                        let _ = write!(why, ": {cause}");
                        source = cause.source();
                    }
                    println!("{:<26} {n:>9} held: failed: {why}", self.name);
                    break;
                }
            };
            println!(
                "{:<26} {:>9} held  {:>9.0}/s  p99 {:>9}  {:>7.0} B/lock here  {:>7.0} B/lock in the store",
                self.name,
                n,
                point.throughput,
                fmt_d(point.p99),
                point.client_per_lock,
                point.store_per_lock
            );
            held.push(point);
            if started.elapsed() > CAP {
                break;
            }
        }
        Ok((tasks, held))
    }

    /// Takes `n` distinct keys with [`TAKERS`] tasks and keeps them all,
    /// measures, then lets them all go.
    async fn hold(&self, n: usize) -> Result<HeldPoint, Error> {
        let client_before = allocations::live_bytes();
        let store_before = (self.store_bytes)(&self.url);
        let run = rand_u128() as u32;
        let started = Instant::now();
        let handles: Vec<_> = (0..TAKERS)
            .map(|t| {
                let lib = self.lib.clone();
                tokio::spawn(async move {
                    let mut kept = Vec::new();
                    let mut waits = Vec::new();
                    for k in (t..n).step_by(TAKERS) {
                        let key = format!("held:{run}:{k}");
                        let asked = Instant::now();
                        kept.push(hold(&lib, &key).await?);
                        waits.push(asked.elapsed());
                    }
                    Ok::<_, Error>((kept, waits))
                })
            })
            .collect();
        let mut kept = Vec::new();
        let mut waits = Vec::new();
        for handle in handles {
            let (k, w) = handle.await??;
            kept.push(k);
            waits.extend(w);
        }
        let elapsed = started.elapsed();
        let client = (allocations::live_bytes() - client_before).max(0);
        let store = (self.store_bytes)(&self.url).saturating_sub(store_before);
        waits.sort_unstable();
        let m = Measured::new("held", &self.name, n as u64, elapsed, waits);
        let releases: Vec<_> = kept
            .into_iter()
            .map(|kept| {
                let lib = self.lib.clone();
                tokio::spawn(async move {
                    for held in kept {
                        let_go(&lib, held).await?;
                    }
                    Ok::<_, Error>(())
                })
            })
            .collect();
        for release in releases {
            release.await??;
        }
        Ok(HeldPoint {
            held: n,
            throughput: m.throughput(),
            p99: m.pct(99.0),
            client_per_lock: client as f64 / n as f64,
            store_per_lock: store as f64 / n as f64,
        })
    }
}

async fn hold(lib: &Lib, key: &str) -> Result<Held, Error> {
    Ok(match lib {
        Lib::Ours(registry) => {
            Held::Guard(registry.lock(key, LockOptions::default().ttl(TTL)).await?)
        }
        Lib::Floor(conn) => {
            let mut conn = conn.clone();
            let token = floor_acquire(&mut conn, key).await?;
            Held::Floor(key.to_owned(), token)
        }
        Lib::Rslock(manager) => Held::Rslock(
            manager
                .acquire_no_guard(key, TTL)
                .await
                .map_err(|e| format!("rslock: {e:?}"))?,
        ),
        _ => return Err("not a contender of the scaling run".into()),
    })
}

async fn let_go(lib: &Lib, held: Held) -> Result<(), Error> {
    match (lib, held) {
        (_, Held::Guard(guard)) => guard.release().await?,
        (Lib::Floor(conn), Held::Floor(key, token)) => {
            floor_release(&mut conn.clone(), &key, &token).await?
        }
        (Lib::Rslock(manager), Held::Rslock(lock)) => manager.unlock(&lock).await,
        _ => return Err("a held lock of another contender".into()),
    }
    Ok(())
}

/// Redis's `used_memory`, in bytes.
fn redis_used_memory(url: &str) -> u64 {
    let info: Result<String, _> = redis::Client::open(url)
        .and_then(|client| client.get_connection())
        .and_then(|mut conn| redis::cmd("INFO").arg("memory").query(&mut conn));
    info.ok()
        .and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("used_memory:"))
                .and_then(|bytes| bytes.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Writes the two tables: the task sweep (throughput and p99 per task
/// count, distinct keys then one hot key) and the held-keys sweep.
fn write_tables(
    tasks: &[(String, Vec<TaskPoint>)],
    held: &[(String, Vec<HeldPoint>)],
    out: &mut (String, String),
) {
    let head: Vec<String> = TASKS.iter().map(|n| format!("{n} tasks")).collect();
    let _ = writeln!(out.0, "| series | keys | {} |", head.join(" | "));
    let _ = writeln!(out.0, "|---|---|{}", "---:|".repeat(TASKS.len()));
    for (name, points) in tasks {
        for hot in [false, true] {
            let cells: Vec<String> = TASKS
                .iter()
                .map(|&n| {
                    points
                        .iter()
                        .find(|p| p.tasks == n && p.hot == hot)
                        .map_or("-".to_owned(), |p| {
                            format!("{:.0}/s, p99 {}", p.throughput, fmt_d(p.p99))
                        })
                })
                .collect();
            let keys = if hot { "one hot" } else { "distinct" };
            let _ = writeln!(out.0, "| {name} | {keys} | {} |", cells.join(" | "));
        }
    }
    let _ = writeln!(
        out.1,
        "| series | keys held | taken/s | p99 wait | this process, per lock | the store, per lock |"
    );
    let _ = writeln!(out.1, "|---|---:|---:|---:|---:|---:|");
    for (name, points) in held {
        for p in points {
            let _ = writeln!(
                out.1,
                "| {name} | {} | {:.0} | {} | {:.0} B | {:.0} B |",
                p.held,
                p.throughput,
                fmt_d(p.p99),
                p.client_per_lock,
                p.store_per_lock
            );
        }
    }
}

/// Draws the sweeps: throughput and p99 against tasks (distinct keys, one
/// hot key), and throughput and memory per lock against keys held.
fn chart_scaling(
    path: &std::path::Path,
    tasks: &[(String, Vec<TaskPoint>)],
    held: &[(String, Vec<HeldPoint>)],
) -> Result<(), Error> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1500, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let areas = root.split_evenly((2, 3));
    type Line = (String, Vec<(f64, f64)>);
    let by_tasks = |hot: bool, value: fn(&TaskPoint) -> f64| -> Vec<Line> {
        tasks
            .iter()
            .map(|(name, points)| {
                let line = points
                    .iter()
                    .filter(|p| p.hot == hot)
                    .map(|p| (p.tasks as f64, value(p)))
                    .collect();
                (name.clone(), line)
            })
            .collect()
    };
    let by_held = |value: fn(&HeldPoint) -> f64| -> Vec<Line> {
        held.iter()
            .map(|(name, points)| {
                (
                    name.clone(),
                    points.iter().map(|p| (p.held as f64, value(p))).collect(),
                )
            })
            .collect()
    };
    let panels: [(&str, &str, &str, Vec<Line>); 6] = [
        (
            "throughput, distinct keys",
            "tasks",
            "locks/s",
            by_tasks(false, |p| p.throughput),
        ),
        (
            "throughput, one hot key",
            "tasks",
            "locks/s",
            by_tasks(true, |p| p.throughput),
        ),
        (
            "taking keys while holding them all",
            "keys held at once",
            "locks/s",
            by_held(|p| p.throughput),
        ),
        (
            "p99 wait, distinct keys",
            "tasks",
            "µs",
            by_tasks(false, |p| p.p99.as_secs_f64() * 1e6),
        ),
        (
            "p99 wait, one hot key",
            "tasks",
            "µs",
            by_tasks(true, |p| p.p99.as_secs_f64() * 1e6),
        ),
        (
            "memory per held lock (this process + the store)",
            "keys held at once",
            "bytes",
            by_held(|p| p.client_per_lock + p.store_per_lock),
        ),
    ];
    for (area, (title, x_desc, y_desc, lines)) in areas.iter().zip(panels) {
        let points = lines.iter().flat_map(|(_, line)| line.iter());
        let (mut x_min, mut x_max, mut y_min, mut y_max) = (f64::MAX, 2f64, f64::MAX, 1f64);
        for &(x, y) in points {
            x_min = x_min.min(x);
            x_max = x_max.max(x);
            if y > 0.0 {
                y_min = y_min.min(y);
                y_max = y_max.max(y);
            }
        }
        let y_min = if y_min == f64::MAX { 1.0 } else { y_min / 2.0 };
        let x_min = if x_min == f64::MAX { 1.0 } else { x_min / 1.5 };
        let mut chart = ChartBuilder::on(area)
            .caption(title, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(36)
            .y_label_area_size(60)
            .build_cartesian_2d(
                (x_min..x_max * 1.5).log_scale(),
                (y_min.max(1e-3)..y_max * 2.0).log_scale(),
            )?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(y_desc)
            .draw()?;
        for (i, (name, line)) in lines.into_iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let line: Vec<(f64, f64)> = line.into_iter().filter(|&(_, y)| y > 0.0).collect();
            chart.draw_series(
                line.iter()
                    .map(|&point| Circle::new(point, 3, color.filled())),
            )?;
            chart
                .draw_series(LineSeries::new(line, color.stroke_width(2)))?
                .label(name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerLeft)
            .border_style(BLACK)
            .background_style(WHITE.mix(0.8))
            .label_font(("sans-serif", 11))
            .draw()?;
    }
    root.present()?;
    Ok(())
}
