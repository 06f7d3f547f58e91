//! Runs every example with small parameters, in memory, over Redis, over
//! PostgreSQL, over MySQL (MariaDB), over etcd and over ZooKeeper, so none of them can rot. `cargo test --workspace` builds the examples before
//! it runs any test. `custom_store` is the exception: it is built as a
//! test of its own (its contract suite and its demo), not as a program.

use std::path::PathBuf;
use std::process::Command;

use lock_tests::{EtcdCluster, MariaDbServer, PostgresServer, RedisServer, ZooKeeperEnsemble};

/// `target/<profile>/examples/<name>`, next to this test's `deps` directory.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target directory");
    let path = dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: run the whole suite (./scripts/test.sh), or `cargo build -p examples --examples` first",
        path.display()
    );
    path
}

/// Runs an example; returns its exit success and its stdout.
fn run(name: &str, args: &[&str]) -> (bool, String) {
    let output = Command::new(example(name))
        .args(args)
        .output()
        .expect("run example");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    eprintln!(
        "$ {name} {}\n{stdout}{stderr}({})",
        args.join(" "),
        output.status
    );
    (output.status.success(), stdout)
}

#[test]
fn flash_sale_in_memory_sells_exactly_the_stock() {
    let (ok, out) = run("flash_sale", &["--stock", "30", "--buyers", "8"]);
    assert!(ok, "{out}");
    assert!(out.contains("stock       30 -> 0"), "{out}");
    assert!(
        out.contains("orders      30 recorded, 30 distinct items"),
        "{out}"
    );
    assert!(out.contains("oversold    0"), "{out}");
    assert!(out.contains("lock waits  p50"), "{out}");
    assert!(out.contains("OK: every item sold exactly once."), "{out}");
}

#[test]
fn flash_sale_without_the_lock_shows_the_oversell() {
    let (ok, out) = run(
        "flash_sale",
        &["--stock", "30", "--buyers", "8", "--no-lock"],
    );
    assert!(ok, "the demo of the oversell exits 0: {out}");
    assert!(out.contains("OVERSOLD without the lock"), "{out}");
}

/// The flash sale in 3 processes on a store (`flag value`, named `backend`
/// in the output): every item sold once; the control without the lock
/// oversells.
fn flash_sale_across_processes(flag: &str, value: &str, backend: &str) {
    let args = [
        flag,
        value,
        "--processes",
        "3",
        "--stock",
        "30",
        "--buyers",
        "6",
    ];
    let (ok, out) = run("flash_sale", &args);
    assert!(ok, "{out}");
    let header = format!("6 buyers in 3 process(es), {backend} backend, lock on");
    assert!(out.contains(&header), "{out}");
    assert!(out.contains("stock       30 -> 0"), "{out}");
    assert!(
        out.contains("orders      30 recorded, 30 distinct items"),
        "{out}"
    );
    assert!(out.contains("OK: every item sold exactly once."), "{out}");
    let (ok, out) = run("flash_sale", &[&args[..], &["--no-lock"]].concat());
    assert!(ok, "{out}");
    assert!(out.contains("OVERSOLD without the lock"), "{out}");
}

#[test]
fn flash_sale_across_processes_on_redis() {
    let server = RedisServer::new();
    flash_sale_across_processes("--redis", &server.url(), "Redis");
}

#[test]
fn flash_sale_across_processes_on_postgres() {
    let server = PostgresServer::new();
    flash_sale_across_processes("--postgres", &server.url(), "PostgreSQL");
}

#[test]
fn flash_sale_across_processes_on_mysql() {
    let server = MariaDbServer::new();
    flash_sale_across_processes("--mysql", &server.url(), "MySQL");
}

#[test]
fn flash_sale_across_processes_on_a_three_member_etcd_cluster() {
    let cluster = EtcdCluster::spawn(3);
    flash_sale_across_processes("--etcd", &cluster.endpoints().join(","), "etcd");
}

#[test]
fn flash_sale_across_processes_on_a_three_server_zookeeper_ensemble() {
    let ensemble = ZooKeeperEnsemble::spawn(3);
    flash_sale_across_processes("--zookeeper", &ensemble.connect_string(), "ZooKeeper");
}

#[test]
fn flash_sale_refuses_processes_without_redis() {
    let (ok, out) = run("flash_sale", &["--processes", "2"]);
    assert!(!ok, "{out}");
}

#[test]
fn scheduled_job_runs_each_tick_once_in_memory() {
    let (ok, out) = run("scheduled_job", &["--ticks", "2"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("tick 1: ran by #0 (once); skipped by #1, #2"),
        "{out}"
    );
    assert!(
        out.contains("tick 2: ran by #0 (once); skipped by #1, #2"),
        "{out}"
    );
    assert!(out.contains("OK: every tick ran exactly once."), "{out}");
}

/// Three replicas, each firing from a tokio-cron-scheduler of its own
/// through a registry of its own when `store` names one: every fire runs
/// once, the other two replicas told it was taken.
fn cron_scheduler_runs_each_fire_once(store: &[&str], backend: &str) {
    let args = [store, &["--fires", "2"]].concat();
    let (ok, out) = run("cron_scheduler", &args);
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!("on {backend}; 2 fires counted")),
        "{out}"
    );
    let fires: Vec<&str> = out
        .lines()
        .filter(|line| line.contains(" ran by "))
        .collect();
    assert_eq!(fires.len(), 2, "{out}");
    for fire in fires {
        assert!(fire.contains("(once); taken elsewhere for #"), "{out}");
        assert_eq!(fire.matches('#').count(), 3, "{out}");
    }
    assert!(out.contains("OK: every fire ran exactly once."), "{out}");
}

#[test]
fn cron_scheduler_runs_each_fire_once_in_memory() {
    cron_scheduler_runs_each_fire_once(&[], "in-memory");
}

#[test]
fn cron_scheduler_runs_each_fire_once_on_redis() {
    let server = RedisServer::new();
    cron_scheduler_runs_each_fire_once(&["--redis", &server.url()], "Redis");
}

/// The scheduled job as 3 processes on a store (`flag value`, named
/// `backend` in the output): each of 2 ticks runs exactly once.
fn scheduled_job_across_processes(flag: &str, value: &str, backend: &str) {
    let (ok, out) = run(
        "scheduled_job",
        &[flag, value, "--instances", "3", "--ticks", "2"],
    );
    assert!(ok, "{out}");
    let header = format!("3 instances (processes on {backend})");
    assert!(out.contains(&header), "{out}");
    assert_eq!(out.matches("(once)").count(), 2, "{out}");
    assert!(out.contains("OK: every tick ran exactly once."), "{out}");
}

#[test]
fn scheduled_job_runs_each_tick_once_across_processes() {
    let server = RedisServer::new();
    scheduled_job_across_processes("--redis", &server.url(), "Redis");
}

#[test]
fn scheduled_job_runs_each_tick_once_across_processes_on_postgres() {
    let server = PostgresServer::new();
    scheduled_job_across_processes("--postgres", &server.url(), "PostgreSQL");
}

#[test]
fn scheduled_job_runs_each_tick_once_across_processes_on_mysql() {
    let server = MariaDbServer::new();
    scheduled_job_across_processes("--mysql", &server.url(), "MySQL");
}

#[test]
fn scheduled_job_runs_each_tick_once_across_processes_on_etcd() {
    let cluster = EtcdCluster::single();
    scheduled_job_across_processes("--etcd", &cluster.endpoints().join(","), "etcd");
}

#[test]
fn scheduled_job_runs_each_tick_once_across_processes_on_zookeeper() {
    let ensemble = ZooKeeperEnsemble::single();
    scheduled_job_across_processes("--zookeeper", &ensemble.connect_string(), "ZooKeeper");
}

/// Runs `example` in memory and on each store (Redis, PostgreSQL, MySQL,
/// etcd, ZooKeeper), and checks each run's output with `check`.
fn on_every_store(example: &str, check: impl Fn(&str)) {
    let (redis, postgres, mysql, etcd, zookeeper) = (
        RedisServer::new(),
        PostgresServer::new(),
        MariaDbServer::new(),
        EtcdCluster::single(),
        ZooKeeperEnsemble::single(),
    );
    let (redis_url, postgres_url, mysql_url, etcd_endpoints, zookeeper_connect) = (
        redis.url(),
        postgres.url(),
        mysql.url(),
        etcd.endpoints().join(","),
        zookeeper.connect_string(),
    );
    for args in [
        vec![],
        vec!["--redis", redis_url.as_str()],
        vec!["--postgres", postgres_url.as_str()],
        vec!["--mysql", mysql_url.as_str()],
        vec!["--etcd", etcd_endpoints.as_str()],
        vec!["--zookeeper", zookeeper_connect.as_str()],
    ] {
        let (ok, out) = run(example, &args);
        assert!(ok, "{out}");
        check(&out);
    }
}

#[test]
fn manual_api_in_memory_and_on_every_store() {
    on_every_store("manual_api", |out| {
        assert!(out.contains("try_lock while held: None"), "{out}");
        assert!(out.contains("try_lock after release: got it"), "{out}");
        assert!(
            out.contains("A wrote: refused `A's stale invoice`"),
            "{out}"
        );
        assert!(out.contains("B still holds it? true"), "{out}");
        assert!(out.contains(r#"store holds ["B's invoice"]"#), "{out}");
    });
}

#[test]
fn quick_start_in_memory_and_on_every_store() {
    on_every_store("quick_start", |out| {
        assert_eq!(out.matches("bought item 7").count(), 4, "{out}");
        assert_eq!(out.matches("ran the report").count(), 1, "{out}");
    });
}

/// A running `web_shop`, stopped by its pid when dropped.
struct WebShop {
    child: std::process::Child,
    base: String,
    http: ureq::Agent,
}

impl WebShop {
    /// Starts `web_shop` on a free loopback port with `args`.
    fn start(args: &[&str]) -> WebShop {
        use std::io::BufRead;
        let mut child = Command::new(example("web_shop"))
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start web_shop");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("web_shop's first line");
        let base = line
            .split_whitespace()
            .find(|word| word.starts_with("http://"))
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_owned();
        let http = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(std::time::Duration::from_secs(20)))
            .build()
            .into();
        WebShop { child, base, http }
    }

    /// Sends `method path`; the status, the `Retry-After` header and the body.
    fn call(&self, method: &str, path: &str) -> (u16, Option<String>, String) {
        let url = format!("{}{path}", self.base);
        let response = match method {
            "POST" => self.http.post(&url).send_empty(),
            "DELETE" => self.http.delete(&url).call(),
            _ => self.http.get(&url).call(),
        };
        let mut response = response.unwrap_or_else(|err| panic!("{method} {url}: {err}"));
        let retry_after = response
            .headers()
            .get("retry-after")
            .map(|value| value.to_str().unwrap().to_owned());
        let body = response.body_mut().read_to_string().unwrap();
        (response.status().as_u16(), retry_after, body)
    }

    /// `n` concurrent purchases of `item`; their statuses and bodies.
    fn buy_concurrently(&self, item: &str, n: usize) -> Vec<(u16, String)> {
        std::thread::scope(|scope| {
            let buyers: Vec<_> = (0..n)
                .map(|_| scope.spawn(|| self.call("POST", &format!("/buy/{item}"))))
                .collect();
            buyers
                .into_iter()
                .map(|buyer| {
                    let (status, _, body) = buyer.join().unwrap();
                    (status, body)
                })
                .collect()
        })
    }
}

impl Drop for WebShop {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// 20 concurrent HTTP buyers for a stock of 5: exactly 5 receipts (each
/// stock level once), 15 "sold out"; `/metrics` counts every purchase's
/// lock, labelled with the handler's name, and its waits.
#[test]
fn web_shop_sells_the_stock_once_and_exports_metrics() {
    let shop = WebShop::start(&["--stock", "5", "--pause-ms", "5", "--wait-ms", "5000"]);
    let answers = shop.buy_concurrently("sku-a", 20);
    let mut left: Vec<String> = answers
        .iter()
        .filter(|(status, _)| *status == 200)
        .map(|(_, body)| {
            body.split("\"left\":")
                .nth(1)
                .unwrap()
                .split(',')
                .next()
                .unwrap()
                .to_owned()
        })
        .collect();
    left.sort();
    assert_eq!(left, ["0", "1", "2", "3", "4"], "{answers:?}");
    let sold_out = answers
        .iter()
        .filter(|(status, body)| *status == 409 && body.contains("sold out"));
    assert_eq!(sold_out.count(), 15, "{answers:?}");
    let (status, _, metrics) = shop.call("GET", "/metrics");
    assert_eq!(status, 200);
    eprintln!("/metrics:\n{metrics}");
    let line = |prefix: &str| {
        metrics
            .lines()
            .find(|line| line.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in\n{metrics}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .to_owned()
    };
    let labels = r#"{store="memory",lock="stock"}"#;
    assert_eq!(
        line(&format!("distributed_lock_acquired_total{labels}")),
        "20"
    );
    assert_eq!(
        line(&format!("distributed_lock_wait_seconds_count{labels}")),
        "20"
    );
    assert_eq!(
        line(&format!("distributed_lock_hold_seconds_count{labels}")),
        "20"
    );
    // Most buyers found the item's lock held by another request.
    let contended: u64 = line(&format!("distributed_lock_contended_total{labels}"))
        .parse()
        .unwrap();
    assert!(contended > 0 && contended < 20, "{contended}");
}

/// A slow purchase holds the item: a second buyer's wait runs out (503 with
/// `Retry-After`); the operator sees the lock held by this process and
/// frees it, which cancels the slow purchase (409, nothing written); the
/// item is then free and its stock intact.
#[test]
fn web_shop_maps_lock_errors_to_statuses_and_frees_a_stuck_lock() {
    let shop = WebShop::start(&["--stock", "3", "--pause-ms", "3000", "--wait-ms", "100"]);
    std::thread::scope(|scope| {
        let slow = scope.spawn(|| shop.call("POST", "/buy/sku-b"));
        let held = |shop: &WebShop| {
            let (_, _, body) = shop.call("GET", "/locks/sku-b");
            body.contains(r#""held":true"#)
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !held(&shop) {
            assert!(
                std::time::Instant::now() < deadline,
                "the slow purchase never held the lock"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let (status, retry_after, body) = shop.call("POST", "/buy/sku-b");
        assert_eq!(status, 503, "{body}");
        assert_eq!(retry_after.as_deref(), Some("1"));
        assert!(body.contains("timed out"), "{body}");
        let (status, _, body) = shop.call("GET", "/locks/sku-b");
        assert_eq!(status, 200);
        assert!(body.contains(r#""held_by_this_process":true"#), "{body}");
        assert!(body.contains(r#""fencing_token":1"#), "{body}");
        let (status, _, body) = shop.call("DELETE", "/locks/sku-b");
        assert_eq!((status, body.as_str()), (200, r#"{"freed":true}"#));
        let (status, _, body) = slow.join().unwrap();
        assert_eq!(status, 409, "{body}");
        assert!(body.contains("was lost"), "{body}");
    });
    let (_, _, body) = shop.call("GET", "/locks/sku-b");
    assert!(body.contains(r#""held":false"#), "{body}");
    let (_, _, metrics) = shop.call("GET", "/metrics");
    for expected in [
        r#"distributed_lock_timeouts_total{store="memory",lock="stock"} 1"#,
        r#"distributed_lock_lost_total{store="memory",lock="stock",reason="store"} 1"#,
    ] {
        assert!(metrics.contains(expected), "no {expected} in\n{metrics}");
    }
}

/// Two instances share one Redis for their locks and stock: 2 x 10
/// concurrent HTTP buyers for a stock of 6 get exactly 6 receipts.
#[test]
fn two_web_shops_on_redis_sell_the_stock_once() {
    let server = RedisServer::new();
    let url = server.url();
    let args = [
        "--redis",
        url.as_str(),
        "--stock",
        "6",
        "--pause-ms",
        "5",
        "--wait-ms",
        "5000",
    ];
    let shops = [WebShop::start(&args), WebShop::start(&args)];
    let answers: Vec<(u16, String)> = std::thread::scope(|scope| {
        let runs: Vec<_> = shops
            .iter()
            .map(|shop| scope.spawn(|| shop.buy_concurrently("sku-c", 10)))
            .collect();
        runs.into_iter()
            .flat_map(|run| run.join().unwrap())
            .collect()
    });
    let receipts = answers.iter().filter(|(status, _)| *status == 200).count();
    assert_eq!(receipts, 6, "{answers:?}");
    assert_eq!(
        answers.iter().filter(|(status, _)| *status == 409).count(),
        14
    );
}
