//! A short soak on one Redis server: worker processes lock three keys at
//! random (wait and skip mode, bodies shorter and longer than their 500 ms
//! leases) while the runner SIGKILLs some (and starts others in their
//! place) and freezes others past their leases; then every body recorded
//! is checked: no two bodies of a key acted at once, and fencing tokens
//! rise in the order the bodies began.

use std::time::{Duration, Instant};

use lock_tests::history::{History, Recorder, now_us};
use lock_tests::{RedisServer, Worker, unique_key};

const WORKER: &str = env!("CARGO_BIN_EXE_lock-worker");

/// How long the workers run, and the seed of the runner's and the
/// workers' choices (printed, so a failure can be replayed).
const SECONDS: u64 = 20;

#[test]
fn workers_killed_and_frozen_at_random_never_overlap_and_fence_in_order() {
    let seed = std::env::var("SOAK_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(now_us);
    eprintln!("soak seed {seed} (SOAK_SEED={seed} replays the runner's choices)");
    let server = RedisServer::new();
    let dir = std::env::temp_dir().join(unique_key("soak").replace(':', "-"));
    std::fs::create_dir_all(&dir).unwrap();
    let runner = Recorder::open(dir.join("runner").to_str().unwrap()).unwrap();
    let key = unique_key("soak");
    let mut started = 0;
    let mut spawn = |left: u64| {
        started += 1;
        let file = dir.join(format!("worker-{started}"));
        let args = [
            "soak",
            &server.url(),
            &key,
            &left.to_string(),
            file.to_str().unwrap(),
            &(seed + started).to_string(),
        ];
        let mut worker = Worker::spawn(WORKER, &args);
        worker.expect("ready", Duration::from_secs(10));
        worker
    };
    let begun = Instant::now();
    let left = || SECONDS.saturating_sub(begun.elapsed().as_secs()).max(1);
    let mut workers: Vec<Worker> = (0..4).map(|_| spawn(SECONDS)).collect();
    let mut draws = seed | 1;
    let mut draw = |n: u64| {
        draws ^= draws << 13;
        draws ^= draws >> 7;
        draws ^= draws << 17;
        draws % n
    };
    let (mut kills, mut freezes) = (0, 0);
    while begun.elapsed() < Duration::from_secs(SECONDS - 4) {
        // A quiet spell, then a fault.
        std::thread::sleep(Duration::from_millis(500 + draw(1500)));
        let at = usize::try_from(draw(workers.len() as u64)).unwrap();
        if draw(2) == 0 {
            let pid = workers[at].pid();
            workers[at].kill();
            runner.line(&format!("killed pid={pid} at_us={}", now_us()));
            kills += 1;
            workers[at] = spawn(left());
        } else {
            workers[at].pause();
            std::thread::sleep(Duration::from_millis(600 + draw(900)));
            workers[at].resume();
            freezes += 1;
        }
    }
    for mut worker in workers {
        worker.expect("done", Duration::from_secs(30));
    }
    let run_end = now_us();
    let mut history = History::default();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        history.read(&text).unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "soak {SECONDS}s, seed {seed}: {} bodies, {kills} workers killed, {freezes} frozen\n{}",
        history.grants.len(),
        history.summary(run_end)
    );
    let violations = history.violations(run_end);
    assert!(
        violations.is_empty(),
        "seed {seed}:\n{}",
        violations.join("\n")
    );
    assert!(history.grants.len() > 50, "no progress");
}
