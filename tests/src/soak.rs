//! The soak runner: worker processes (`lock-worker soak`) lock a few keys
//! at random while the runner SIGKILLs some of them (starting others in
//! their place), freezes others past their leases, black-holes others'
//! connections to the store (when they reach it through proxies) and makes
//! the store's own faults; then the histories they wrote
//! are checked (see [`history`](crate::history)).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::history::{History, Recorder, now_us};
use crate::{Proxy, ProxySwitch, Worker, unique_key};

/// A fault of the store's own that a soak made.
#[derive(Clone, Copy, Debug)]
pub struct Fault {
    kind: &'static str,
    lossy: bool,
    /// How long after its end a lease granted or renewed may still be
    /// lost to it.
    lingers: Duration,
}

impl Fault {
    /// A fault after which the store still has every lease it granted (a
    /// server frozen, a leader restarted with its data).
    pub fn kept(kind: &'static str) -> Fault {
        Fault {
            kind,
            lossy: false,
            lingers: Duration::ZERO,
        }
    }

    /// A fault in which the store may lose leases it granted, as its docs
    /// say it may (a restart without persistence, a failover to a replica
    /// that missed the last writes): their holders may overlap with the
    /// next until they stop, within a lease, as [`History::violations`]
    /// allows.
    pub fn lossy(kind: &'static str) -> Fault {
        Fault::lossy_lingering(kind, Duration::ZERO)
    }

    /// A lossy fault whose losses go on for up to `lingers` after it ended,
    /// as the store's docs say they may (an etcd leader paused and
    /// deposed, answering keep-alives as it resumes until it learns it
    /// was deposed): leases granted or renewed meanwhile may be lost too.
    pub fn lossy_lingering(kind: &'static str, lingers: Duration) -> Fault {
        Fault {
            kind,
            lossy: true,
            lingers,
        }
    }
}

/// A fault the store made by itself, seen by a [`StoreWatch`] (a failover
/// a Sentinel group started on its own): what it was, from when to when.
#[derive(Clone, Copy, Debug)]
pub struct Seen {
    /// The fault, lossy if the store may have lost leases in it.
    pub fault: Fault,
    /// When it began, in µs since the epoch.
    pub from_us: u64,
    /// When it ended, in µs since the epoch.
    pub to_us: u64,
}

/// A watch on the store for the faults it makes by itself, which the
/// runner did not make and so cannot write down as it makes them.
pub trait StoreWatch {
    /// Every fault seen since the soak began; asked once, when the last
    /// worker finished.
    fn seen(&self) -> Vec<Seen>;
}

/// What a [`StoreWatch`] learns poll by poll, as faults of the store's
/// own: spells in which it was troubled (from the last calm poll before
/// to the first calm one after), and changes of what it names (its
/// master, its Raft term). A spell after which it names another than
/// before, or such a change between two calm polls, is lossy, and lasts
/// `lingers` longer (leases granted before it may be lost until then);
/// any other spell is kept.
#[derive(Debug)]
pub struct Spells<T> {
    /// What the store named when last calm.
    named: Option<T>,
    /// Since when the spell of trouble under way has lasted.
    spell: Option<u64>,
    last_poll: u64,
    troubled: &'static str,
    switched: &'static str,
    lingers_us: u64,
    seen: Vec<Seen>,
}

impl<T: Copy + PartialEq> Spells<T> {
    /// Spells named `troubled` (kept) or `switched` (lossy, lasting
    /// `lingers` longer), from now on.
    pub fn new(troubled: &'static str, switched: &'static str, lingers: Duration) -> Spells<T> {
        Spells {
            named: None,
            spell: None,
            last_poll: now_us(),
            troubled,
            switched,
            lingers_us: u64::try_from(lingers.as_micros()).unwrap_or(u64::MAX),
            seen: Vec::new(),
        }
    }

    /// One poll, now: what all the store's members (or its watchers)
    /// agree it names (`None`: they disagree, or one did not answer), and
    /// whether it is calm.
    pub fn poll(&mut self, agreed: Option<T>, calm: bool) {
        let now = now_us();
        match (calm, self.spell) {
            (false, None) => self.spell = Some(self.last_poll),
            (true, Some(from)) => {
                self.record(from, now, agreed);
                self.spell = None;
                self.named = agreed;
            }
            (true, None) => {
                if self.named.is_some() && self.named != agreed {
                    self.record(self.last_poll, now, agreed);
                }
                self.named = agreed;
            }
            (false, Some(_)) => {}
        }
        self.last_poll = now;
    }

    /// Every fault seen; a spell still under way ends now.
    pub fn finish(mut self) -> Vec<Seen> {
        if let Some(from) = self.spell {
            self.record(from, now_us(), None);
        }
        self.seen
    }

    fn record(&mut self, from_us: u64, to_us: u64, after: Option<T>) {
        let switched = self.named.is_some() && self.named != after;
        self.seen.push(if switched {
            Seen {
                fault: Fault::lossy(self.switched),
                from_us,
                to_us: to_us.saturating_add(self.lingers_us),
            }
        } else {
            Seen {
                fault: Fault::kept(self.troubled),
                from_us,
                to_us,
            }
        });
    }
}

/// How a worker reaches the store through proxies of its own: the ports
/// they forward to, and the lock URL made of the proxies' ports.
type Route = (Vec<u16>, Box<dyn Fn(&[u16]) -> String>);

/// A soak of one store.
pub struct Soak {
    exe: String,
    lock_url: String,
    ttl: Duration,
    recovery: Duration,
    seconds: u64,
    workers: usize,
    tasks: usize,
    process_faults: bool,
    freezes_only: bool,
    route: Option<Route>,
    switches: Vec<ProxySwitch>,
    watch: Option<Box<dyn StoreWatch>>,
}

impl std::fmt::Debug for Soak {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Soak")
            .field("lock_url", &self.lock_url)
            .field("ttl", &self.ttl)
            .field("seconds", &self.seconds)
            .field("workers", &self.workers)
            .field("tasks", &self.tasks)
            .field("proxied", &self.route.is_some())
            .field("switches", &self.switches.len())
            .finish_non_exhaustive()
    }
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
    /// Workers cut off from the store past their leases.
    pub cuts: usize,
    /// The store's own faults made.
    pub outages: usize,
    /// When the last worker finished.
    pub ended_us: u64,
    /// The directory of the history files (removed unless a check failed).
    pub dir: PathBuf,
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
            tasks: 2,
            process_faults: true,
            freezes_only: false,
            route: None,
            switches: Vec::new(),
            watch: None,
        }
    }

    /// Every fault a worker frozen past its lease (the fault a careless
    /// release needs to show).
    pub fn freezes_only(mut self) -> Soak {
        self.freezes_only = true;
        self
    }

    /// `workers` processes of `tasks` tasks each (default 4 of 2). With
    /// one process, no process is killed, frozen or cut off: the soak of a
    /// store inside the process (memory) is of its tasks alone.
    pub fn workers(mut self, workers: usize, tasks: usize) -> Soak {
        self.workers = workers;
        self.tasks = tasks;
        self.process_faults = workers > 1;
        self
    }

    /// Each worker reaches the store through proxies of its own, one to
    /// each of `upstreams` (loopback ports), with the lock URL `url` makes
    /// of the proxies' ports; a fault may then black-hole one worker's
    /// proxies past its lease.
    pub fn through_proxies(
        mut self,
        upstreams: Vec<u16>,
        url: impl Fn(&[u16]) -> String + 'static,
    ) -> Soak {
        self.route = Some((upstreams, Box::new(url)));
        self
    }

    /// Every worker reaches the store through the proxies `switches` turn
    /// (shared with the other workers and the servers, as a Cluster's or a
    /// Sentinel group's proxies are, whose addresses the servers announce);
    /// a fault may then black-hole one worker's connections through all of
    /// them past its lease.
    pub fn cut_through(mut self, switches: Vec<ProxySwitch>) -> Soak {
        self.switches = switches;
        self
    }

    /// Writes the faults `watch` saw the store make by itself into the
    /// history, beside the runner's own, before it is checked.
    pub fn watched(mut self, watch: impl StoreWatch + 'static) -> Soak {
        self.watch = Some(Box::new(watch));
        self
    }

    /// How long past a dead or frozen holder's ttl the store may take to
    /// give its key to a waiter (default 300 ms: a waiter's retry after
    /// the lease's end).
    pub fn recovery(mut self, recovery: Duration) -> Soak {
        self.recovery = recovery;
        self
    }

    /// Runs the soak (see [`record`](Self::record)) and panics with every
    /// violation found (see [`History::violations`],
    /// [`History::unavailable`], [`History::unobtainable_when_free`] and
    /// [`History::unlisted_errors`]), and the seed.
    pub fn run(&self, store: &str) -> Report {
        self.run_with(store, &mut || None)
    }

    /// [`run`](Self::run), where a fault may also be one of the store's
    /// own: `server_fault` makes it (a server restarted, a member killed)
    /// and names it, or `None` when it has none to make.
    pub fn run_with(&self, store: &str, server_fault: &mut dyn FnMut() -> Option<Fault>) -> Report {
        let report = self.record_with(store, server_fault);
        let lease = self.ttl + self.recovery;
        let mut violations = report.history.violations(report.ended_us, lease);
        violations.extend(report.history.unavailable(lease, TOLERANCE));
        violations.extend(report.history.unobtainable_when_free(lease, TOLERANCE));
        violations.extend(report.history.unlisted_errors(lease + TOLERANCE));
        assert!(
            violations.is_empty(),
            "{store} soak, seed {} (its histories are kept in {}):\n{}",
            report.seed,
            report.dir.display(),
            violations.join("\n")
        );
        let _ = std::fs::remove_dir_all(&report.dir);
        report
    }

    /// Runs the soak with the seed from `SOAK_SEED`, else the clock, for
    /// `SOAK_SECONDS` if set (`scripts/soak.sh`), and prints the seed and
    /// the summary; the history is not checked.
    pub fn record(&self, store: &str) -> Report {
        let report = self.record_with(store, &mut || None);
        let _ = std::fs::remove_dir_all(&report.dir);
        report
    }

    fn record_with(&self, store: &str, server_fault: &mut dyn FnMut() -> Option<Fault>) -> Report {
        let seed = std::env::var("SOAK_SEED")
            .ok()
            .and_then(|seed| seed.parse().ok())
            .unwrap_or_else(now_us);
        let seconds = std::env::var("SOAK_SECONDS")
            .ok()
            .and_then(|seconds| seconds.parse().ok())
            .unwrap_or(self.seconds);
        eprintln!("{store} soak, seed {seed} (SOAK_SEED={seed} replays the choices)");
        // A failure on the way (a worker that did not start, a fault the
        // harness could not make) says the seed too.
        let run = std::panic::AssertUnwindSafe(|| self.run_seeded(seed, seconds, server_fault));
        let report = std::panic::catch_unwind(run).unwrap_or_else(|panic| {
            let why = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("(a panic without a message)");
            panic!("{store} soak, seed {seed} (SOAK_SEED={seed} replays the choices): {why}")
        });
        eprintln!(
            "{store} soak {seconds}s, seed {seed}: {} bodies, {} workers killed, {} frozen, {} cut off, {} store faults\n{}",
            report.history.grants.len(),
            report.kills,
            report.freezes,
            report.cuts,
            report.outages,
            report
                .history
                .summary(report.ended_us, self.ttl + self.recovery)
        );
        report
    }

    fn run_seeded(
        &self,
        seed: u64,
        seconds: u64,
        server_fault: &mut dyn FnMut() -> Option<Fault>,
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
            let proxies: Vec<Proxy> = self
                .route
                .iter()
                .flat_map(|(upstreams, _)| upstreams.iter().map(|&port| Proxy::start(port)))
                .collect();
            let url = match &self.route {
                Some((_, url)) => url(&proxies.iter().map(Proxy::port).collect::<Vec<_>>()),
                None => self.lock_url.clone(),
            };
            let args = [
                "soak",
                &url,
                &key,
                &left.to_string(),
                file.to_str().expect("a path"),
                &seed.wrapping_add(started).to_string(),
                &self.ttl.as_millis().to_string(),
                &self.tasks.to_string(),
            ];
            // The worker's data store is not used by this scenario.
            let env = [("LOCK_WORKER_DATA_URL", "redis://127.0.0.1:1")];
            let mut worker = Worker::spawn_with_env(&self.exe, &args, &env);
            // A guard against a hang: the worker keeps trying its store for 30 s.
            worker.expect("ready", Duration::from_secs(45));
            (worker, proxies)
        };
        let mut workers: Vec<(Worker, Vec<Proxy>)> = (0..self.workers).map(|_| spawn()).collect();
        let mut draws = Draws(seed.max(1));
        let (mut kills, mut freezes, mut cuts, mut outages) = (0, 0, 0, 0);
        // The kinds of fault come in rounds, each kind once a round in an
        // order drawn from the seed, so a short soak makes every kind; the
        // store's own faults twice a round.
        let mut round: Vec<u64> = Vec::new();
        let ttl_ms = u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX);
        // Faults stop a few leases before the end, so the last bodies
        // finish in the open.
        let faults_until = Duration::from_secs(seconds).saturating_sub(self.ttl * 8);
        while begun.elapsed() < faults_until {
            // A quiet spell, then a fault: the store's own, or one of a
            // worker's (killed, frozen, cut off), or (one process alone)
            // none.
            std::thread::sleep(Duration::from_millis(500 + draws.below(1500)));
            let at = usize::try_from(draws.below(workers.len() as u64)).unwrap_or(0);
            // Past a lease: 1.2 to 3 ttls.
            let stall = Duration::from_millis(ttl_ms * 6 / 5 + draws.below(ttl_ms * 9 / 5 + 1));
            if round.is_empty() {
                round = vec![0, 1, 2, 3, 3];
                for i in (1..round.len()).rev() {
                    let j = usize::try_from(draws.below(i as u64 + 1)).unwrap_or(0);
                    round.swap(i, j);
                }
            }
            let kind = round.pop().unwrap_or(3);
            let kind = if self.freezes_only { 1 } else { kind };
            if kind == 3 || !self.process_faults {
                let from = now_us();
                if let Some(fault) = server_fault() {
                    let to = now_us();
                    runner.line(&format!(
                        "outage kind={} from_us={from} to_us={to} lossy={} lost_until_us={}",
                        fault.kind,
                        fault.lossy,
                        to.saturating_add(
                            u64::try_from(fault.lingers.as_micros()).unwrap_or(u64::MAX)
                        )
                    ));
                    outages += 1;
                }
                continue;
            }
            let (worker, proxies) = &mut workers[at];
            let pid = worker.pid();
            if kind == 0 {
                // The time it ran its last code: when the signal was sent,
                // not when its exit was seen (later, on a busy machine).
                worker.send_kill();
                let killed_at = now_us();
                worker.kill();
                runner.line(&format!("killed pid={pid} at_us={killed_at}"));
                kills += 1;
                workers[at] = spawn();
            } else if kind == 1 || (proxies.is_empty() && self.switches.is_empty()) {
                let from = now_us();
                worker.pause();
                std::thread::sleep(stall);
                worker.resume();
                runner.line(&format!(
                    "frozen pid={pid} from_us={from} to_us={}",
                    now_us()
                ));
                freezes += 1;
            } else {
                let from = now_us();
                proxies.iter().for_each(Proxy::black_hole);
                for switch in &self.switches {
                    switch.black_hole_process(pid);
                }
                std::thread::sleep(stall);
                proxies.iter().for_each(Proxy::forward);
                for switch in &self.switches {
                    switch.forward_process(pid);
                }
                runner.line(&format!("cut pid={pid} from_us={from} to_us={}", now_us()));
                cuts += 1;
            }
        }
        for (mut worker, _proxies) in workers {
            worker.expect("done", Duration::from_secs(60));
        }
        for seen in self.watch.iter().flat_map(|watch| watch.seen()) {
            runner.line(&format!(
                "outage kind={} from_us={} to_us={} lossy={}",
                seen.fault.kind, seen.from_us, seen.to_us, seen.fault.lossy
            ));
            outages += 1;
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
        Report {
            history,
            seed,
            kills,
            freezes,
            cuts,
            outages,
            ended_us,
            dir,
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

/// The soak of a store on one server (PostgreSQL, MariaDB): workers
/// killed, frozen and cut off through proxies of their own, and the
/// server, in turn, frozen past every lease (twice the 500 ms ttl) or
/// killed and restarted (crash recovery keeps what was committed); every
/// body checked. `store` names the store in the report.
pub fn one_server_frozen_or_restarted<S: crate::StoreServer + 'static>(
    exe: &str,
    store: &str,
    server: &mut S,
) {
    let ttl = Duration::from_millis(500);
    let mut faults = 0;
    let soak = Soak::new(exe, &server.url(), ttl, 20)
        .through_proxies(vec![server.port()], |ports| S::url_through(ports[0]));
    let report = soak.run_with(store, &mut || {
        faults += 1;
        if faults % 2 == 1 {
            server.pause();
            std::thread::sleep(ttl * 2);
            server.resume();
            Some(Fault::kept("server-frozen"))
        } else {
            server.restart();
            Some(Fault::kept("restart"))
        }
    });
    assert!(report.history.grants.len() > 50, "no progress");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(seen: &[Seen]) -> Vec<(&'static str, bool)> {
        seen.iter()
            .map(|seen| (seen.fault.kind, seen.fault.lossy))
            .collect()
    }

    /// A spell of trouble is a kept fault while the store names the same
    /// after it, a lossy one when it names another, as is a change between
    /// two calm polls; a spell under way at the end ends there.
    #[test]
    fn spells_are_faults_and_a_switch_is_lossy() {
        let lingers = Duration::from_secs(1);
        let mut spells = Spells::new("down", "switched", lingers);
        spells.poll(Some(1), true);
        spells.poll(Some(1), true);
        spells.poll(None, false);
        spells.poll(Some(1), false);
        spells.poll(Some(1), true);
        spells.poll(Some(2), true);
        spells.poll(None, false);
        spells.poll(Some(3), true);
        spells.poll(None, false);
        let seen = spells.finish();
        assert_eq!(
            kinds(&seen),
            [
                ("down", false),
                ("switched", true),
                ("switched", true),
                ("switched", true)
            ]
        );
        assert!(seen.iter().all(|seen| seen.from_us <= seen.to_us));
        // A switch lasts `lingers` past its end.
        assert!(seen[1].to_us >= seen[1].from_us + 1_000_000);
        // Nothing but calm polls naming one thing: no fault.
        let mut calm = Spells::new("down", "switched", lingers);
        (0..3).for_each(|_| calm.poll(Some(7), true));
        assert!(calm.finish().is_empty());
    }
}
