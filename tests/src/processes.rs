//! The multi-process scenarios every store must pass, run with real OS
//! processes of the `lock-worker` binary: they lock through `lock_url` and
//! race on shared data in the Redis at `data_url`.

mod jobs;

use std::time::{Duration, Instant};

use lock_runtime::LockRegistry;
use redis::Commands;

use crate::{RedisServer, StoreServer, Worker, field, unique_key};

/// How long a worker may take to start and report: a guard against a
/// hang, not a bound under test, so it leaves room for a busy machine and
/// for the worker's own patience in reaching its store (30 s).
pub const STARTUP: Duration = Duration::from_secs(45);

/// Workers of one store, and where their shared data lives.
#[derive(Debug)]
pub struct Processes {
    exe: String,
    lock_url: String,
    data_url: String,
    expiry_slack: Duration,
}

impl Processes {
    /// `exe` is the worker binary (`env!("CARGO_BIN_EXE_lock-worker")`).
    pub fn new(exe: &str, lock_url: &str, data_url: &str) -> Processes {
        Processes {
            exe: exe.to_owned(),
            lock_url: lock_url.to_owned(),
            data_url: data_url.to_owned(),
            expiry_slack: Duration::from_millis(300),
        }
    }

    /// How long after a lease's ttl the store may take to free it (default
    /// 300 ms, the waiter's retry jitter): a store that expires leases on a
    /// timer of its own adds that timer's period.
    pub fn expiry_slack(mut self, slack: Duration) -> Processes {
        self.expiry_slack = slack;
        self
    }

    /// Starts a worker running `scenario` on `key`.
    pub fn worker(&self, scenario: &str, key: &str, extra: &[&str]) -> Worker {
        let mut args = vec![scenario, self.lock_url.as_str(), key];
        args.extend_from_slice(extra);
        Worker::spawn_with_env(
            &self.exe,
            &args,
            &[("LOCK_WORKER_DATA_URL", &self.data_url)],
        )
    }

    /// A holder and three waiting processes on `key`, for a store that
    /// queues waiters: each waiter is started once the one before it is
    /// queued (`queued(n)`: whether the store's queue holds the n-th), and
    /// each reports when it took the lock. Returns, in queue order, each
    /// waiter's `(at_ms, fencing)` from its own clock line (ms since the
    /// epoch).
    pub fn waiters_in_queue_order(
        &self,
        key: &str,
        mut queued: impl FnMut(usize) -> bool,
    ) -> Vec<(u128, u64)> {
        let mut holder = self.worker("hold-30s", key, &["1500"]);
        holder.expect("acquired", STARTUP);
        let mut waiters = Vec::new();
        for n in 1..=3 {
            let mut waiter = self.worker("wait", key, &[]);
            waiter.expect("ready", STARTUP);
            crate::wait_until_blocking("the waiter queued", Duration::from_secs(5), || queued(n));
            waiters.push(waiter);
        }
        waiters
            .iter_mut()
            .map(|waiter| {
                let line = waiter.expect("acquired", Duration::from_secs(10));
                let at = field(&line, "at_ms").parse().unwrap();
                (at, field(&line, "fencing").parse().unwrap())
            })
            .collect()
    }

    /// Runs `processes` workers of `scenario` on `key` at once and waits
    /// for them all (60 s at most); their stdout lines. A worker that fails
    /// fails the test, `why` saying what that may mean.
    fn run_all(
        &self,
        processes: usize,
        scenario: &str,
        key: &str,
        extra: &[&str],
        why: &str,
    ) -> Vec<Vec<String>> {
        let workers: Vec<_> = (0..processes)
            .map(|_| self.worker(scenario, key, extra))
            .collect();
        workers
            .into_iter()
            .map(|worker| worker.finish_ok(Duration::from_secs(60), why))
            .collect()
    }

    fn data(&self) -> redis::Connection {
        redis::Client::open(self.data_url.as_str())
            .and_then(|client| client.get_connection())
            .expect("connect to the data server")
    }

    /// Runs `processes` workers of 4 tasks against a stock of `stock`;
    /// returns the levels sold.
    fn sell(&self, scenario: &str, processes: usize, stock: i64) -> Vec<i64> {
        let item = unique_key("item");
        let mut conn = self.data();
        let () = conn.set(format!("oversell:{item}:level"), stock).unwrap();
        self.run_all(processes, scenario, &item, &["4"], "");
        let level: i64 = conn.get(format!("oversell:{item}:level")).unwrap();
        assert_eq!(level, 0, "stock left");
        conn.lrange(format!("oversell:{item}:sold"), 0, -1).unwrap()
    }

    /// 4 processes x 2 tasks make 30 transfers each between two accounts,
    /// half of them in each direction, under `keys = [from, to]`: all
    /// finish (no deadlock between opposite orders), no two bodies are
    /// ever inside one account, and the money is all there.
    pub fn opposite_transfers_across_processes_never_deadlock(&self) {
        let bank = unique_key("bank");
        let mut conn = self.data();
        for account in [1, 2] {
            let () = conn
                .set(format!("bank:{bank}:balance:{account}"), 10_000)
                .unwrap();
        }
        for lines in self.run_all(4, "transfer", &bank, &["30"], " (a deadlock?)") {
            assert!(lines.iter().any(|l| l == "done transfers=60"), "{lines:?}");
        }
        let overlaps: Vec<String> = conn.lrange(format!("bank:{bank}:overlaps"), 0, -1).unwrap();
        assert!(overlaps.is_empty(), "overlapping bodies: {overlaps:?}");
        let total: i64 = [1, 2]
            .iter()
            .map(|account| {
                conn.get::<_, i64>(format!("bank:{bank}:balance:{account}"))
                    .unwrap()
            })
            .sum();
        assert_eq!(total, 20_000, "money lost or made");
    }

    /// 4 processes x 4 tasks sell a stock of 40: each level exactly once.
    pub fn four_processes_sell_exactly_the_stock(&self) {
        let mut sold = self.sell("oversell", 4, 40);
        sold.sort_unstable();
        assert_eq!(
            sold,
            (1..=40).collect::<Vec<_>>(),
            "each stock level sold exactly once"
        );
    }

    /// The control: without the lock the same processes oversell.
    pub fn without_the_lock_the_same_processes_oversell(&self) {
        let sold = self.sell("oversell-unlocked", 4, 40);
        assert!(
            sold.len() > 40,
            "expected an oversell without the lock, sold {}",
            sold.len()
        );
    }

    /// A skip-mode job skips while another process runs it, and runs once
    /// that one is done.
    pub fn skip_mode_skips_while_another_process_runs_the_job(&self) {
        let key = unique_key("job");
        let mut holder = self.worker("hold-30s", &key, &["1500"]);
        holder.expect("acquired", STARTUP);
        let lines = self.worker("skip", &key, &[]).finish_ok(STARTUP, "");
        assert!(lines.iter().any(|l| l.starts_with("skipped")), "{lines:?}");
        assert!(!lines.iter().any(|l| l.starts_with("ran")), "{lines:?}");
        holder.expect("released", STARTUP);
        let lines = self.worker("skip", &key, &[]).finish_ok(STARTUP, "");
        assert!(lines.iter().any(|l| l.starts_with("ran")), "{lines:?}");
    }

    /// A SIGKILLed holder of a 1 s lease blocks a waiting process for less
    /// than 1 s and the store's expiry slack.
    pub fn a_sigkilled_holder_blocks_others_for_at_most_its_ttl(&self) {
        let key = unique_key("crash");
        let mut holder = self.worker("hold-1s", &key, &["60000"]);
        holder.expect("acquired", STARTUP);
        let mut waiter = self.worker("wait", &key, &[]);
        waiter.expect("ready", STARTUP);
        holder.kill();
        let killed_at = Instant::now();
        waiter.expect("acquired", Duration::from_secs(5));
        let blocked = killed_at.elapsed();
        eprintln!("a SIGKILLed holder (1 s lease) blocked the waiter for {blocked:?}");
        // The lease had at most 1 s left.
        assert!(
            blocked < Duration::from_secs(1) + self.expiry_slack,
            "blocked {blocked:?} after SIGKILL"
        );
    }

    /// Fencing tokens strictly increase over 4 processes x 25 rounds.
    pub fn fencing_tokens_strictly_increase_across_processes(&self) {
        let key = unique_key("fence");
        self.run_all(4, "fence", &key, &["25"], "");
        // Appended under the lock, so list order is holding order.
        let tokens: Vec<u64> = self.data().lrange(format!("fence:{key}"), 0, -1).unwrap();
        assert_eq!(tokens.len(), 100);
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    }

    /// A waiting process takes over within a second of the release, while
    /// the holder's 30 s lease had ~29 s left: only the release
    /// notification explains that.
    pub fn a_waiter_in_another_process_is_woken_by_the_release(&self) {
        let key = unique_key("handoff");
        let mut holder = self.worker("hold-30s", &key, &["1500"]);
        holder.expect("acquired", STARTUP);
        let mut waiter = self.worker("wait", &key, &[]);
        waiter.expect("ready", STARTUP);
        let released: u128 = field(&holder.expect("releasing", STARTUP), "at_ms")
            .parse()
            .unwrap();
        let acquired: u128 = field(&waiter.expect("acquired", STARTUP), "at_ms")
            .parse()
            .unwrap();
        let handoff = acquired.saturating_sub(released);
        assert!(handoff < 1000, "hand-off took {handoff} ms");
        eprintln!("cross-process hand-off: {handoff} ms");
    }

    /// A semaphore of 3 shared by 4 processes x 4 tasks, 10 sections
    /// each: never more than 3 inside (counted in the data store, which the
    /// lock does not protect), and 3 reached: it is not a mutex in disguise.
    pub fn a_semaphore_of_three_across_processes_is_reached_and_never_exceeded(&self) {
        let key = unique_key("sem");
        self.run_all(4, "semaphore", &key, &["4", "10"], "");
        let seen: Vec<i64> = self
            .data()
            .lrange(format!("sem:{key}:seen"), 0, -1)
            .unwrap();
        assert_eq!(seen.len(), 160);
        let most = seen.iter().copied().max().unwrap_or(0);
        eprintln!("semaphore of 3, 4 processes x 4 tasks: at most {most} inside");
        assert_eq!(most, 3, "{seen:?}");
    }

    /// Two processes hold the two permits of a key (1 s leases); a third
    /// waits. One holder is SIGKILLed: its permit comes back within its
    /// ttl and the store's slack, and the waiter gets it.
    pub fn a_sigkilled_permit_holder_frees_its_permit_within_its_ttl(&self) {
        let key = unique_key("permit");
        let mut first = self.worker("hold-permit", &key, &["60000"]);
        first.expect("acquired", STARTUP);
        let mut second = self.worker("hold-permit", &key, &["60000"]);
        second.expect("acquired", STARTUP);
        let mut third = self.worker("hold-permit", &key, &["100"]);
        third.expect("ready", STARTUP);
        first.kill();
        let killed_at = Instant::now();
        third.expect("acquired", Duration::from_secs(5));
        let recovered = killed_at.elapsed();
        eprintln!("a SIGKILLed holder's permit (1 s lease) came back in {recovered:?}");
        assert!(
            recovered < Duration::from_secs(1) + self.expiry_slack,
            "recovered after {recovered:?}"
        );
        third.expect("released", STARTUP);
        second.kill();
    }

    /// 3 processes x 2 tasks read continuously (20 ms sections) and
    /// overlap; a writer from a fourth process gets the key within a bound
    /// (the readers inside finish, no new one starts), alone, with a
    /// fencing token above every earlier reader's and below every later
    /// one's.
    pub fn readers_overlap_and_a_writer_gets_in_within_a_bound(&self) {
        let key = unique_key("rw");
        let readers: Vec<_> = (0..3)
            .map(|_| self.worker("read", &key, &["2", "3000"]))
            .collect();
        let mut conn = self.data();
        let seen_key = format!("rw:{key}:seen");
        let deadline = Instant::now() + STARTUP;
        while conn.llen::<_, usize>(&seen_key).unwrap() < 30 {
            assert!(Instant::now() < deadline, "the readers did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        let mut writer = self.worker("write", &key, &[]);
        let asked: u128 = field(&writer.expect("asked", STARTUP), "at_ms")
            .parse()
            .unwrap();
        let wrote = writer.expect("wrote", Duration::from_secs(5));
        let at: u128 = field(&wrote, "at_ms").parse().unwrap();
        assert_eq!(field(&wrote, "readers"), "0", "the writer was alone");
        let waited = at.saturating_sub(asked);
        for reader in readers {
            reader.finish_ok(Duration::from_secs(30), "");
        }
        let seen: Vec<i64> = conn.lrange(&seen_key, 0, -1).unwrap();
        let overlaps: Vec<String> = conn.lrange(format!("rw:{key}:overlaps"), 0, -1).unwrap();
        let most = seen.iter().copied().max().unwrap_or(0);
        eprintln!(
            "6 readers in 3 processes: up to {most} inside at once over {} reads; a writer waited {waited} ms",
            seen.len()
        );
        assert!(
            overlaps.is_empty(),
            "a reader saw a writer inside: {overlaps:?}"
        );
        assert!(most >= 2, "the readers never overlapped: {most}");
        // Readers inside finish their 20 ms sections; none starts meanwhile.
        assert!(waited < 1000, "the writer waited {waited} ms");
        // Fencing: every reader that entered before the writer holds a
        // smaller token than the writer's, every one after a larger one.
        let tokens: Vec<String> = conn.lrange(format!("rw:{key}:tokens"), 0, -1).unwrap();
        let parse = |entry: &str| entry[1..].parse::<u64>().expect("a token");
        let at = tokens
            .iter()
            .position(|entry| entry.starts_with('w'))
            .expect("the writer's entry");
        let written = parse(&tokens[at]);
        assert!(
            tokens[..at].iter().all(|entry| parse(entry) < written)
                && tokens[at + 1..].iter().all(|entry| parse(entry) > written),
            "fencing tokens around the writer's {written}: {tokens:?}"
        );
    }

    /// A holder of a 1 s lease (renewed every 333 ms) for a 5 s body;
    /// `undo(key)` removes its lease in the store: the body is cancelled
    /// with `Lost` at the next renewal and never finishes.
    pub fn a_lease_undone_under_a_running_body_cancels_it(
        &self,
        what: &str,
        undo: impl FnOnce(&str),
    ) {
        let key = unique_key(what);
        let mut holder = self.worker("hold-1s", &key, &["5000"]);
        holder.expect("acquired", STARTUP);
        undo(&key);
        expect_cancelled_with_lost(holder, Instant::now());
    }

    /// A worker holds a key (a 1 s lease renewed every 333 ms, for a 30 s
    /// body); this process, on the registry `connect` makes, sees it held
    /// by another process with the worker's fencing token, force-releases
    /// it, then finds it free; the worker's body is cancelled with `Lost`
    /// at its next renewal and never finishes.
    pub fn another_process_holding_a_key_is_seen_and_can_be_freed(
        &self,
        connect: impl AsyncFnOnce() -> LockRegistry,
    ) {
        let key = unique_key("inspect");
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        let registry = runtime.block_on(connect());
        let mut holder = self.worker("hold-1s", &key, &["30000"]);
        let fencing: u64 = field(&holder.expect("acquired", STARTUP), "fencing")
            .parse()
            .unwrap();
        let info = runtime
            .block_on(registry.inspect(&key))
            .expect("inspect")
            .expect("held by the worker");
        assert!(!info.held_by_this_process, "{info:?}");
        assert_eq!(info.fencing_token, fencing, "{info:?}");
        if let Some(left) = info.remaining {
            assert!(left <= Duration::from_secs(1), "{info:?}");
        }
        assert!(
            runtime
                .block_on(registry.force_release(&key))
                .expect("force-release")
        );
        let freed_at = Instant::now();
        assert_eq!(
            runtime.block_on(registry.inspect(&key)).expect("inspect"),
            None
        );
        expect_cancelled_with_lost(holder, freed_at);
    }

    /// Two processes of two tasks contend on one key for 6 s (1 s ttl);
    /// `kill_leader` kills the store's leader once entries flow. No entry
    /// ever finds another inside, fencing tokens grow in holding order, and
    /// locks resume within 5 s. Returns how long they took to resume.
    pub fn a_killed_leader_breaks_no_exclusion(&self, kill_leader: impl FnOnce()) -> Duration {
        let key = unique_key("leader");
        let workers: Vec<_> = (0..2).map(|_| self.worker("chaos", &key, &["6"])).collect();
        let mut data = self.data();
        let entries = |data: &mut redis::Connection| -> usize {
            data.llen(format!("chaos:{key}:tokens")).unwrap()
        };
        crate::wait_until_blocking("the first entries", Duration::from_secs(10), || {
            entries(&mut data) > 20
        });
        std::thread::sleep(Duration::from_secs(1));
        let before = entries(&mut data);
        kill_leader();
        let killed_at = Instant::now();
        while entries(&mut data) <= before + 1 {
            if killed_at.elapsed() > Duration::from_secs(10) {
                let lines: Vec<Vec<String>> = workers
                    .into_iter()
                    .map(|worker| worker.finish(Duration::from_secs(30)).1)
                    .collect();
                panic!("no entry within 10 s of the kill; the workers said {lines:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let resumed = killed_at.elapsed();
        let errors = crate::sum_of_done(workers, "errors");
        let overlaps: Vec<String> = data.lrange(format!("chaos:{key}:overlaps"), 0, -1).unwrap();
        let tokens: Vec<u64> = data.lrange(format!("chaos:{key}:tokens"), 0, -1).unwrap();
        let lost: u64 = data.llen(format!("chaos:{key}:lost")).unwrap();
        eprintln!(
            "locks resumed {resumed:?} after the leader was killed; {} entries, {errors} errors \
             (calls that failed while no leader answered), {lost} bodies cancelled",
            tokens.len()
        );
        assert!(overlaps.is_empty(), "overlapping holders: {overlaps:?}");
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "fencing tokens out of holding order: {tokens:?}"
        );
        assert!(resumed < Duration::from_secs(5), "{resumed:?}");
        resumed
    }
}

/// A `hold-1s` worker whose lease was undone at `undone_at`: its body is
/// cancelled with `Lost` at its next renewal (within 900 ms) and never
/// finishes.
fn expect_cancelled_with_lost(mut holder: Worker, undone_at: Instant) {
    let lost = holder.expect("error", STARTUP);
    assert!(lost.contains("was lost"), "{lost}");
    assert!(
        undone_at.elapsed() < Duration::from_millis(900),
        "the holder learned of the loss after {:?}",
        undone_at.elapsed()
    );
    let lines = holder.finish_ok(STARTUP, "");
    assert!(
        !lines.iter().any(|l| l.starts_with("releasing")),
        "body cancelled: {lines:?}"
    );
}

/// A store's server and a Redis server for the data the workers race on.
#[derive(Debug)]
pub struct WithData<S> {
    /// The store's server.
    pub locks: S,
    /// Where the workers keep the data they race on.
    pub data: RedisServer,
}

impl<S: StoreServer> WithData<S> {
    /// `locks` beside a new data server, and the processes of the
    /// scenarios every store passes (`exe`: the worker binary).
    pub fn start(exe: &str, locks: S) -> (WithData<S>, Processes) {
        let servers = WithData {
            locks,
            data: RedisServer::new(),
        };
        let processes = Processes::new(exe, &servers.locks.url(), &servers.data.url());
        (servers, processes)
    }
}

/// One `#[test]` per [`Processes`] scenario named, each on fresh servers:
/// `process_scenarios!(setup: scenario, ...)`, where `setup()` returns the
/// servers (kept until the test ends) and the processes to run with.
/// `process_scenarios!(setup)` names the scenarios every store passes.
#[macro_export]
macro_rules! process_scenarios {
    ($setup:path) => {
        $crate::process_scenarios!(
            $setup:
            four_processes_sell_exactly_the_stock,
            opposite_transfers_across_processes_never_deadlock,
            without_the_lock_the_same_processes_oversell,
            skip_mode_skips_while_another_process_runs_the_job,
            a_sigkilled_holder_blocks_others_for_at_most_its_ttl,
            fencing_tokens_strictly_increase_across_processes,
            a_waiter_in_another_process_is_woken_by_the_release,
        );
    };
    ($setup:path: $($scenario:ident),* $(,)?) => {
        $(
            #[test]
            fn $scenario() {
                let (_servers, processes) = $setup();
                processes.$scenario();
            }
        )*
    };
}

/// One `#[test]` per scheduled-job scenario every store passes (see
/// [`Processes`]), each on fresh servers from `setup()` as in
/// [`process_scenarios!`](crate::process_scenarios).
#[macro_export]
macro_rules! job_scenarios {
    ($setup:path) => {
        $crate::process_scenarios!(
            $setup:
            scheduled_jobs_run_each_fire_once_and_overlap_as_chosen,
            a_killed_runner_and_frozen_replicas_leave_fires_missed_never_run_twice,
        );
    };
}
