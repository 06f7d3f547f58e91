//! Runs every example with small parameters, in memory, over Redis, over
//! PostgreSQL, over etcd and over ZooKeeper, so none of them can rot. `cargo test --workspace` builds the examples before
//! it runs any test.

use std::path::PathBuf;
use std::process::Command;

use lock_tests::{EtcdCluster, PostgresServer, RedisServer, ZooKeeperEnsemble};

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
    eprintln!("$ {name} {}\n{stdout}{stderr}", args.join(" "));
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

#[test]
fn scheduled_job_without_hold_at_least_runs_ticks_twice() {
    let (ok, out) = run("scheduled_job", &["--ticks", "1", "--no-hold"]);
    assert!(ok, "{out}");
    assert!(out.contains("tick 1: ran by #0, #1, #2 (WRONG)"), "{out}");
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
fn scheduled_job_runs_each_tick_once_across_processes_on_etcd() {
    let cluster = EtcdCluster::single();
    scheduled_job_across_processes("--etcd", &cluster.endpoints().join(","), "etcd");
}

#[test]
fn scheduled_job_runs_each_tick_once_across_processes_on_zookeeper() {
    let ensemble = ZooKeeperEnsemble::single();
    scheduled_job_across_processes("--zookeeper", &ensemble.connect_string(), "ZooKeeper");
}

/// Runs `example` in memory and on each store (Redis, PostgreSQL, etcd,
/// ZooKeeper), and checks each run's output with `check`.
fn on_every_store(example: &str, check: impl Fn(&str)) {
    let (redis, postgres, etcd, zookeeper) = (
        RedisServer::new(),
        PostgresServer::new(),
        EtcdCluster::single(),
        ZooKeeperEnsemble::single(),
    );
    let (redis_url, postgres_url, etcd_endpoints, zookeeper_connect) = (
        redis.url(),
        postgres.url(),
        etcd.endpoints().join(","),
        zookeeper.connect_string(),
    );
    for args in [
        vec![],
        vec!["--redis", redis_url.as_str()],
        vec!["--postgres", postgres_url.as_str()],
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
