//! The soak runner: worker processes (`lock-worker soak`) lock a few keys
//! at random while the runner SIGKILLs some of them (starting others in
//! their place) and freezes others past their leases; then the histories
//! they wrote are checked (see [`history`](crate::history)).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::history::{History, Recorder, now_us};
use crate::{Worker, unique_key};

/// A soak of one store.
#[derive(Debug)]
pub struct Soak {
    exe: String,
    lock_url: String,
    ttl: Duration,
    recovery: Duration,
    seconds: u64,
    workers: usize,
}

/// What a soak did and found.
#[derive(Debug)]
pub struct Report {
    /// Every body and refused attempt recorded.
    pub history: History,
    /// The seed its choices followed.
    pub seed: u64,
    /// Workers SIGKILLed.
    pub kills: usize,
    /// Workers frozen past their leases.
    pub freezes: usize,
    /// The store's own faults made.
    pub outages: usize,
    /// When the last worker finished.
    pub ended_us: u64,
}

impl Soak {
    /// Workers of `exe` (`env!("CARGO_BIN_EXE_lock-worker")`) locking
    /// through `lock_url` (as the worker reads it) with leases of `ttl`,
    /// for `seconds`.
    pub fn new(exe: &str, lock_url: &str, ttl: Duration, seconds: u64) -> Soak {
        Soak {
            exe: exe.to_owned(),
            lock_url: lock_url.to_owned(),
            ttl,
            recovery: Duration::from_millis(300),
            seconds,
            workers: 4,
        }
    }

    /// How long past a dead or frozen holder's ttl the store may take to
    /// give its key to a waiter (default 300 ms: a waiter's retry after
    /// the lease's end).
    pub fn recovery(mut self, recovery: Duration) -> Soak {
        self.recovery = recovery;
        self
    }

    /// Runs the soak (see [`record`](Self::record)) and panics with every
    /// violation found (see [`History::violations`] and
    /// [`History::unavailable`]), and the seed.
    pub fn run(&self, store: &str) -> Report {
        self.run_with(store, &mut || None)
    }

    /// [`run`](Self::run), where a fault may also be one of the store's
    /// own: `server_fault` makes it (a server restarted, a member killed)
    /// and names it, or `None` when it has none to make.
    pub fn run_with(
        &self,
        store: &str,
        server_fault: &mut dyn FnMut() -> Option<&'static str>,
    ) -> Report {
        let report = self.record_with(store, server_fault);
        let mut violations = report.history.violations(report.ended_us);
        violations.extend(
            report
                .history
                .unavailable(self.ttl + self.recovery, TOLERANCE),
        );
        assert!(
            violations.is_empty(),
            "{store} soak, seed {}:\n{}",
            report.seed,
            violations.join("\n")
        );
        report
    }

    /// Runs the soak with the seed from `SOAK_SEED`, else the clock, for
    /// `SOAK_SECONDS` if set (`scripts/soak.sh`), and prints the seed and
    /// the summary; the history is not checked.
    pub fn record(&self, store: &str) -> Report {
        self.record_with(store, &mut || None)
    }

    fn record_with(
        &self,
        store: &str,
        server_fault: &mut dyn FnMut() -> Option<&'static str>,
    ) -> Report {
        let seed = std::env::var("SOAK_SEED")
            .ok()
            .and_then(|seed| seed.parse().ok())
            .unwrap_or_else(now_us);
        let seconds = std::env::var("SOAK_SECONDS")
            .ok()
            .and_then(|seconds| seconds.parse().ok())
            .unwrap_or(self.seconds);
        eprintln!("{store} soak, seed {seed} (SOAK_SEED={seed} replays the choices)");
        let report = self.run_seeded(seed, seconds, server_fault);
        eprintln!(
            "{store} soak {seconds}s, seed {seed}: {} bodies, {} workers killed, {} frozen, {} server faults\n{}",
            report.history.grants.len(),
            report.kills,
            report.freezes,
            report.outages,
            report.history.summary(report.ended_us)
        );
        report
    }

    fn run_seeded(
        &self,
        seed: u64,
        seconds: u64,
        server_fault: &mut dyn FnMut() -> Option<&'static str>,
    ) -> Report {
        let dir: PathBuf = std::env::temp_dir().join(unique_key("soak").replace(':', "-"));
        std::fs::create_dir_all(&dir).expect("a soak directory");
        let runner = Recorder::open(dir.join("runner").to_str().expect("a path")).expect("log");
        let key = unique_key("soak");
        let begun = Instant::now();
        let mut started = 0u64;
        let mut spawn = || {
            started += 1;
            let left = seconds.saturating_sub(begun.elapsed().as_secs()).max(1);
            let file = dir.join(format!("worker-{started}"));
            let args = [
                "soak",
                &self.lock_url,
                &key,
                &left.to_string(),
                file.to_str().expect("a path"),
                &seed.wrapping_add(started).to_string(),
                &self.ttl.as_millis().to_string(),
            ];
            // The worker's data store is not used by this scenario.
            let env = [("LOCK_WORKER_DATA_URL", "redis://127.0.0.1:1")];
            let mut worker = Worker::spawn_with_env(&self.exe, &args, &env);
            worker.expect("ready", Duration::from_secs(20));
            worker
        };
        let mut workers: Vec<Worker> = (0..self.workers).map(|_| spawn()).collect();
        let mut draws = Draws(seed.max(1));
        let (mut kills, mut freezes, mut outages) = (0, 0, 0);
        let ttl_ms = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        // Faults stop a few leases before the end, so the last bodies
        // finish in the open.
        let faults_until = Duration::from_secs(seconds).saturating_sub(self.ttl * 8);
        while begun.elapsed() < faults_until {
            // A quiet spell, then a fault.
            std::thread::sleep(Duration::from_millis(500 + draws.below(1500)));
            let at = usize::try_from(draws.below(workers.len() as u64)).unwrap_or(0);
            let kind = draws.below(3);
            if kind == 2 {
                let from = now_us();
                if let Some(fault) = server_fault() {
                    runner.line(&format!(
                        "outage kind={fault} from_us={from} to_us={}",
                        now_us()
                    ));
                    outages += 1;
                    continue;
                }
            }
            if kind == 0 {
                let pid = workers[at].pid();
                workers[at].kill();
                runner.line(&format!("killed pid={pid} at_us={}", now_us()));
                kills += 1;
                workers[at] = spawn();
            } else {
                // Past its lease: 1.2 to 3 ttls.
                let frozen = ttl_ms * 6 / 5 + draws.below(ttl_ms * 9 / 5 + 1);
                let (pid, from) = (workers[at].pid(), now_us());
                workers[at].pause();
                std::thread::sleep(Duration::from_millis(frozen));
                workers[at].resume();
                runner.line(&format!(
                    "frozen pid={pid} from_us={from} to_us={}",
                    now_us()
                ));
                freezes += 1;
            }
        }
        for mut worker in workers {
            worker.expect("done", Duration::from_secs(60));
        }
        let ended_us = now_us();
        let mut history = History::default();
        for entry in std::fs::read_dir(&dir).expect("the soak directory") {
            let path = entry.expect("an entry").path();
            let text = std::fs::read_to_string(&path).expect("a history");
            history
                .read(&text)
                .unwrap_or_else(|err| panic!("{}: {err}", path.display()));
        }
        let _ = std::fs::remove_dir_all(&dir);
        Report {
            history,
            seed,
            kills,
            freezes,
            outages,
            ended_us,
        }
    }
}

/// How much later than the store's bound a waiter may get a freed key
/// (its process scheduled late on a loaded machine).
const TOLERANCE: Duration = Duration::from_millis(500);

/// A small generator of pseudo-random numbers (xorshift): a soak's
/// choices follow from its seed.
#[derive(Debug)]
pub struct Draws(pub u64);

impl Draws {
    /// A number below `n` (0 for 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0.checked_rem(n).unwrap_or(0)
    }
}
