//! Redlock across real OS processes: the scenarios every store passes, and
//! a chaos run in which nodes are killed and restarted while processes
//! contend.

use std::time::{Duration, Instant};

use lock_runtime::LockRegistry;
use lock_tests::processes::Processes;
use lock_tests::{RedisServer, RedisServers, Worker, process_scenarios, unique_key};
use rand::seq::SliceRandom;
use redis::Commands;

const WORKER: &str = env!("CARGO_BIN_EXE_lock-worker");

/// A holder in another process is seen by inspection (a majority of the
/// nodes agree on its token) and freed by a forced release on every node.
#[test]
fn another_process_holding_a_key_is_seen_and_can_be_freed() {
    let nodes = RedisServers::spawn(3);
    let data = RedisServer::new();
    let urls = nodes.urls();
    Processes::new(WORKER, &urls.join(","), &data.url())
        .another_process_holding_a_key_is_seen_and_can_be_freed(async || {
            let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
            LockRegistry::redlock(&urls).await.expect("connect")
        });
}

fn spawn_worker(
    scenario: &str,
    urls: &str,
    key: &str,
    extra: &[&str],
    data: &RedisServer,
) -> Worker {
    let mut args = vec![scenario, urls, key];
    args.extend_from_slice(extra);
    Worker::spawn_with_env(WORKER, &args, &[("LOCK_WORKER_DATA_URL", &data.url())])
}

/// Three nodes and the data server, and the processes of the scenarios
/// every store passes, locking through Redlock.
fn shared() -> ((RedisServers, RedisServer), Processes) {
    let nodes = RedisServers::spawn(3);
    let data = RedisServer::new();
    let processes = Processes::new(WORKER, &nodes.urls().join(","), &data.url());
    ((nodes, data), processes)
}

process_scenarios!(shared);

/// Scheduled jobs keep their promise on Redlock too: its release can
/// linger, which marks a fire taken; a killed runner's and frozen
/// replicas' fires are missed, never run twice.
mod jobs {
    lock_tests::job_scenarios!(super::shared);
}

/// Several processes contend on one key while a controller kills and
/// restarts random minorities of five persistent nodes (`appendfsync
/// always`: a restarted node keeps its leases and counters, as the Redlock
/// paper requires). Each holder records entry and exit in a separate Redis;
/// an entry that finds someone inside is an overlap. `LOCK_CHAOS_SECS` sets
/// the length (default 4 s).
#[test]
fn chaos_kills_and_restarts_of_minorities_never_break_exclusion() {
    let secs: u64 = std::env::var("LOCK_CHAOS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    let mut nodes = RedisServers::spawn_persistent(5);
    let data = RedisServer::new();
    let urls = nodes.urls().join(",");
    let key = unique_key("chaos");
    let workers: Vec<_> = (0..3)
        .map(|_| spawn_worker("chaos", &urls, &key, &[&secs.to_string()], &data))
        .collect();

    let mut rng = rand::rng();
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut kills = 0;
    while Instant::now() < deadline {
        let mut order: Vec<usize> = (0..nodes.len()).collect();
        order.shuffle(&mut rng);
        let down = &order[..rand::random_range(1..=2)];
        for &i in down {
            nodes.stop(i);
            kills += 1;
        }
        std::thread::sleep(Duration::from_millis(rand::random_range(100..400)));
        for &i in down {
            nodes.restart(i);
        }
        std::thread::sleep(Duration::from_millis(rand::random_range(50..200)));
    }

    let entries = lock_tests::sum_of_done(workers, "entries");
    let mut conn = data.connection();
    let overlaps: Vec<String> = conn.lrange(format!("chaos:{key}:overlaps"), 0, -1).unwrap();
    let tokens: Vec<u64> = conn.lrange(format!("chaos:{key}:tokens"), 0, -1).unwrap();
    let lost: u64 = conn.llen(format!("chaos:{key}:lost")).unwrap();
    eprintln!(
        "chaos {secs}s: {kills} node kills, {entries} critical sections, {} tokens, {lost} lost leases",
        tokens.len()
    );
    assert!(
        overlaps.is_empty(),
        "overlapping critical sections: {overlaps:?}"
    );
    assert!(
        entries > 0 && tokens.len() as u64 >= entries,
        "no progress under chaos"
    );
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens not increasing: {tokens:?}"
    );
}
