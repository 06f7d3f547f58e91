//! Short soaks on Redis (see `lock_tests::soak`): worker processes killed,
//! frozen and cut off at random while the store has faults of its own,
//! every body checked; and the proof that the checker catches a broken
//! release.

use std::time::Duration;

use lock_tests::soak::{Fault, Soak};
use lock_tests::{Proxy, RedisCluster, RedisServer, RedisServers};

const WORKER: &str = env!("CARGO_BIN_EXE_lock-worker");

/// One server: workers killed, frozen and cut off through proxies of
/// their own; the server frozen past every lease (its keys expire by its
/// own clock meanwhile), or restarted without persistence (every lease
/// dropped: their holders may overlap with the next until their next
/// renewal tells them, and fencing tokens keep rising).
#[test]
fn one_server_frozen_and_restarted_empty_never_overlaps_but_as_documented() {
    let mut server = RedisServer::new();
    let ttl = Duration::from_millis(500);
    let mut faults = 0;
    let report = Soak::new(WORKER, &server.url(), ttl, 20)
        .through_proxies(vec![server.port()], |ports| {
            format!("redis://127.0.0.1:{}", ports[0])
        })
        .run_with("redis", &mut || {
            faults += 1;
            if faults % 2 == 1 {
                server.pause();
                std::thread::sleep(ttl * 2);
                server.resume();
                Some(Fault::kept("server-frozen"))
            } else {
                server.restart();
                Some(Fault::lossy("restarted-empty"))
            }
        });
    assert!(report.history.grants.len() > 50, "no progress");
}

/// A cluster of three primaries, each behind a proxy it announces, so a
/// worker can be cut off from every node at once: a primary frozen past
/// every lease (its slots unavailable meanwhile, the others serving), or
/// restarted without persistence (its leases dropped, as on one server).
#[test]
fn a_cluster_with_a_primary_frozen_or_restarted_empty_never_overlaps_but_as_documented() {
    let mut cluster = RedisCluster::spawn_proxied(3);
    let ttl = Duration::from_millis(500);
    let mut faults = 0usize;
    let report = Soak::new(WORKER, &cluster.url(), ttl, 20)
        .cut_through(cluster.proxy_switches())
        .run_with("redis cluster", &mut || {
            faults += 1;
            let node = faults % 3;
            if faults % 2 == 1 {
                cluster.node(node).pause();
                std::thread::sleep(ttl * 2);
                cluster.node(node).resume();
                Some(Fault::kept("primary-frozen"))
            } else {
                cluster.restart(node);
                Some(Fault::lossy("primary-restarted-empty"))
            }
        });
    assert!(report.history.grants.len() > 50, "no progress");
}

/// The cut a soak makes through shared proxies holds back one process's
/// connections, those it had and those it makes meanwhile, and no other
/// process's; forwarding again lets them through.
#[test]
fn a_proxy_switch_cuts_off_one_process_alone() {
    let server = RedisServer::new();
    let proxy = Proxy::start(server.port());
    let switch = proxy.switch();
    let ping = |conn: &mut redis::Connection| redis::cmd("PING").query::<String>(conn);
    let connect = || {
        let client = redis::Client::open(proxy.redis_url()).unwrap();
        let conn = client
            .get_connection_with_timeout(Duration::from_secs(2))
            .unwrap();
        conn.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        conn
    };
    // Another process's PING through the proxy.
    let other_process = || {
        let output = std::process::Command::new("timeout")
            .args(["5", "redis-cli", "-p", &proxy.port().to_string(), "PING"])
            .output()
            .expect("run redis-cli");
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    };
    let mut before = connect();
    assert_eq!(ping(&mut before).unwrap(), "PONG");

    switch.black_hole_process(std::process::id());
    assert!(
        ping(&mut before).is_err(),
        "a connection it had still passes"
    );
    let client = redis::Client::open(proxy.redis_url()).unwrap();
    let meanwhile = client
        .get_connection_with_timeout(Duration::from_millis(300))
        .and_then(|mut conn| {
            conn.set_read_timeout(Some(Duration::from_millis(300)))?;
            ping(&mut conn)
        });
    assert!(meanwhile.is_err(), "a connection it made meanwhile passes");
    assert_eq!(other_process(), "PONG", "another process was cut off too");

    switch.forward_process(std::process::id());
    assert_eq!(ping(&mut connect()).unwrap(), "PONG");
}

/// Redlock over five masters, each worker reaching them through proxies
/// of its own (cut off from all five at once as a fault): one master
/// frozen past every lease, or killed and restarted empty after twice the
/// ttl (the delayed restart Redlock needs), while a majority keeps every
/// lease.
#[test]
fn redlock_with_a_master_frozen_or_restarted_late_never_overlaps() {
    let mut servers = RedisServers::spawn(5);
    let url = servers.urls().join(",");
    let masters = (0..servers.len()).map(|i| servers.get(i).port()).collect();
    let ttl = Duration::from_millis(500);
    let mut faults = 0usize;
    let soak = Soak::new(WORKER, &url, ttl, 20).through_proxies(masters, |ports| {
        let urls: Vec<String> = ports
            .iter()
            .map(|port| format!("redis://127.0.0.1:{port}"))
            .collect();
        urls.join(",")
    });
    let report = soak.run_with("redlock", &mut || {
        faults += 1;
        let i = faults % servers.len();
        if faults % 2 == 1 {
            servers.get(i).pause();
            std::thread::sleep(ttl * 2);
            servers.get(i).resume();
            Some(Fault::kept("master-frozen"))
        } else {
            servers.stop(i);
            std::thread::sleep(ttl * 2);
            servers.restart(i);
            Some(Fault::kept("master-restarted-late"))
        }
    });
    assert!(report.history.grants.len() > 50, "no progress");
}

/// The checker bites: the same soak with leases that release without
/// checking the owner (a holder back from a freeze deletes its
/// successor's lock, and a third caller gets the key beside the
/// successor) is caught with overlapping bodies. Every fault is a freeze.
#[test]
fn a_release_that_does_not_check_the_owner_is_caught() {
    let server = RedisServer::new();
    let url = format!("careless+{}", server.url());
    let ttl = Duration::from_millis(500);
    let report = Soak::new(WORKER, &url, ttl, 25)
        .freezes_only()
        .record("careless redis");
    let violations = report.history.violations(report.ended_us, ttl);
    eprintln!("the careless release, caught:\n{}", violations.join("\n"));
    assert!(
        violations.iter().any(|found| found.starts_with("overlap")),
        "seed {}: no overlap found; frozen {} times",
        report.seed,
        report.freezes
    );
}
