//! The scheduled-job scenarios every store passes: three replicas of a job
//! as real processes (`lock-worker job`), their clocks set 500 ms behind,
//! right, and 500 ms ahead (a spread of 1 s, the jobs' `max_skew`), each
//! run saying in the data store when it started and ended, each replica
//! printing what it reported of each fire.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::Commands;

use super::{Processes, STARTUP};
use crate::{Worker, field, unique_key};

/// The replicas' clock offsets, in ms.
const OFFSETS: [i64; 3] = [-500, 0, 500];
/// The jobs' `max_skew` (`lock-worker job`): the offsets' spread, in ms.
const SKEW_MS: u64 = 1000;
/// The jobs' lease ttl, in ms: long enough that a machine stalled for a
/// second or two loses no lease; in the scenario that kills a runner,
/// short enough that its fire is soon free again.
const TTL_MS: u64 = 5000;
const KILLED_TTL_MS: u64 = 2000;

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn sleep_until_ms(at: u64) {
    std::thread::sleep(Duration::from_millis(at.saturating_sub(now_ms())));
}

/// Three replicas of the jobs of one run.
struct Replicas {
    name: String,
    period: u64,
    workers: Vec<Worker>,
    /// Each replica's clock offset, by pid.
    offsets: BTreeMap<u32, i64>,
    /// When each replica had started its jobs, by the real clock.
    started: Vec<u64>,
}

/// One run's start or end, as the data store has it.
#[derive(Debug)]
struct Run {
    pid: u32,
    at: u64,
    /// Runs of the job inside when it started, itself included.
    inside: i64,
}

/// What the replicas did with one job.
#[derive(Debug, Default)]
struct JobRecord {
    starts: BTreeMap<u64, Vec<Run>>,
    ends: BTreeMap<u64, Vec<Run>>,
    /// Each fire's reports: (replica, outcome).
    reports: BTreeMap<u64, Vec<(String, String)>>,
}

impl JobRecord {
    fn started(&self, fire: u64) -> usize {
        self.starts.get(&fire).map_or(0, Vec::len)
    }

    fn ended(&self, fire: u64) -> usize {
        self.ends.get(&fire).map_or(0, Vec::len)
    }

    fn reported(&self, fire: u64, outcome: &str) -> usize {
        self.reports.get(&fire).map_or(0, |reports| {
            reports.iter().filter(|(_, o)| o == outcome).count()
        })
    }

    /// Fires (of all, not only a window) reported `outcome`.
    fn all_reported(&self, outcome: &str) -> Vec<u64> {
        self.reports
            .keys()
            .copied()
            .filter(|&fire| self.reported(fire, outcome) > 0)
            .collect()
    }

    /// Fires started more than once.
    fn run_twice(&self) -> Vec<u64> {
        self.starts
            .iter()
            .filter(|(_, runs)| runs.len() > 1)
            .map(|(fire, _)| *fire)
            .collect()
    }

    /// Everything known of `fire`, for a failure message.
    fn show(&self, fire: u64) -> String {
        format!(
            "fire {fire}: starts {:?}, ends {:?}, reports {:?}",
            self.starts.get(&fire),
            self.ends.get(&fire),
            self.reports.get(&fire)
        )
    }
}

/// A finished run of the replicas.
struct Finished {
    replicas: Replicas,
    /// When each replica still running at the end stopped its jobs.
    stopped: Vec<(i64, u64)>,
    records: BTreeMap<String, JobRecord>,
}

impl Processes {
    /// Starts three replicas running the jobs `specs` (see `lock-worker
    /// job`) every `period_ms` for `seconds` with leases of `ttl_ms`, and
    /// waits until each has started them.
    fn replicas(&self, period_ms: u64, seconds: u64, specs: &str, ttl_ms: u64) -> Replicas {
        let name = unique_key("job");
        let (period, secs, ttl) = (
            period_ms.to_string(),
            seconds.to_string(),
            ttl_ms.to_string(),
        );
        let mut workers: Vec<Worker> = OFFSETS
            .iter()
            .map(|offset| {
                let offset = offset.to_string();
                self.worker("job", &name, &[&period, &offset, &secs, specs, &ttl])
            })
            .collect();
        let started = workers
            .iter_mut()
            .map(|worker| {
                field(&worker.expect("started", STARTUP), "at_ms")
                    .parse()
                    .unwrap()
            })
            .collect();
        let offsets = workers.iter().map(|w| w.pid()).zip(OFFSETS).collect();
        Replicas {
            name,
            period: period_ms,
            workers,
            offsets,
            started,
        }
    }
}

impl Replicas {
    /// The data store's record of the job `suffix`'s runs so far.
    fn runs(&self, data: &mut redis::Connection, suffix: &str) -> JobRecord {
        let lines: Vec<String> = data
            .lrange(format!("jobs:{}-{suffix}:runs", self.name), 0, -1)
            .unwrap();
        let mut record = JobRecord::default();
        for line in lines {
            let parts: Vec<&str> = line.split(' ').collect();
            let number = |i: usize| parts[i].parse::<u64>().unwrap();
            let run = Run {
                pid: number(2) as u32,
                at: number(3),
                inside: parts.get(4).map_or(0, |n| n.parse().unwrap()),
            };
            let runs = if parts[0] == "start" {
                &mut record.starts
            } else {
                &mut record.ends
            };
            runs.entry(number(1)).or_default().push(run);
        }
        record
    }

    /// The replica `pid`'s clock offset.
    fn offset(&self, pid: u32) -> i64 {
        self.offsets[&pid]
    }

    /// How late `run` started, by its replica's clock, after `fire`.
    fn late(&self, fire: u64, run: &Run) -> i64 {
        run.at as i64 + self.offset(run.pid) - fire as i64
    }

    /// Waits for every replica (the `killed` ones may have died) and reads
    /// what the jobs `suffixes` did.
    fn finish(
        mut self,
        data: &mut redis::Connection,
        suffixes: &[&str],
        killed: &[u32],
    ) -> Finished {
        let mut reports = Vec::new();
        let mut stopped = Vec::new();
        for worker in std::mem::take(&mut self.workers) {
            let pid = worker.pid();
            let lines = if killed.contains(&pid) {
                worker.finish(STARTUP).1
            } else {
                let lines = worker.finish_ok(STARTUP * 2, "");
                let at = lines
                    .iter()
                    .find(|line| line.starts_with("stopping"))
                    .expect("a stopping line");
                stopped.push((self.offset(pid), field(at, "at_ms").parse().unwrap()));
                lines
            };
            reports.extend(lines.into_iter().filter(|line| line.starts_with("report")));
        }
        let mut records: BTreeMap<String, JobRecord> = suffixes
            .iter()
            .map(|suffix| ((*suffix).to_owned(), self.runs(data, suffix)))
            .collect();
        for line in &reports {
            let suffix = field(line, "job").rsplit('-').next().unwrap_or_default();
            if let Some(record) = records.get_mut(suffix) {
                record
                    .reports
                    .entry(field(line, "fire").parse().unwrap())
                    .or_default()
                    .push((
                        field(line, "replica").to_owned(),
                        field(line, "outcome").to_owned(),
                    ));
            }
        }
        Finished {
            replicas: self,
            stopped,
            records,
        }
    }
}

impl Finished {
    fn record(&self, suffix: &str) -> &JobRecord {
        &self.records[suffix]
    }

    /// The fires every replica tried and had settled before it stopped:
    /// after every replica started its jobs (by the fastest clock) and
    /// early enough that a replica still running at the end looked at them
    /// after their attempts (their period, twice the skew and a quarter
    /// period) and a lease of a dead runner (`extra_ms` more).
    fn window(&self, extra_ms: u64) -> Vec<u64> {
        let period = self.replicas.period;
        let fastest = OFFSETS.iter().max().copied().unwrap_or(0);
        let from = self.replicas.started.iter().max().copied().unwrap_or(0) as i64 + fastest;
        let settled = period + 2 * SKEW_MS + period / 4 + extra_ms + 500;
        let to = self
            .stopped
            .iter()
            .map(|(offset, at)| *at as i64 + offset)
            .min()
            .expect("a replica ran to the end")
            - settled as i64;
        let first = (from as u64 / period + 1) * period;
        (first..=to.max(0) as u64)
            .step_by(period as usize)
            .collect()
    }

    /// Says, for the closing figures, what became of the fires of `suffix`
    /// in `window`.
    fn tally(&self, store: &str, what: &str, suffix: &str, window: &[u64]) {
        let record = self.record(suffix);
        let once = window.iter().filter(|&&f| record.started(f) == 1).count();
        let twice = window.iter().filter(|&&f| record.started(f) > 1).count();
        let missed = window
            .iter()
            .filter(|&&f| record.reported(f, "missed") > 0)
            .count();
        eprintln!(
            "scheduled job on {store}, {what}: {} fires expected, {once} run once, {twice} run twice, {missed} missed",
            window.len()
        );
    }
}

/// The store's name in the figures: the lock URL's scheme, or `redlock`
/// for several Redis URLs.
fn store_name(url: &str) -> &str {
    match url.split("://").next().unwrap_or(url) {
        "redis" if url.contains(',') => "redlock",
        scheme => scheme,
    }
}

impl Processes {
    /// Three replicas with skewed clocks run four jobs for 20 s on a
    /// 500 ms schedule, one with 50 ms runs, three with runs of 1.5
    /// periods under each overlap choice. Every fire of the short job
    /// runs exactly once and none is missed; the long runs overlap under
    /// `Allow` (every fire runs once), never under `Skip` (a fire met by
    /// a run is skipped) or `Wait` (a fire met by a run starts late, or
    /// is skipped once its period is over).
    pub fn scheduled_jobs_run_each_fire_once_and_overlap_as_chosen(&self) {
        let mut data = self.data();
        let specs = "every:allow:50,allow:allow:750,skip:skip:750,wait:wait:750";
        let replicas = self.replicas(500, 20, specs, TTL_MS);
        let done = replicas.finish(&mut data, &["every", "allow", "skip", "wait"], &[]);
        let window = done.window(0);
        let store = store_name(&self.lock_url);
        assert!(window.len() >= 20, "too few fires to judge: {window:?}");

        let every = done.record("every");
        done.tally(store, "50 ms runs", "every", &window);
        for &fire in &window {
            assert!(
                every.started(fire) == 1 && every.ended(fire) == 1,
                "not run exactly once: {}",
                every.show(fire)
            );
        }
        assert_eq!(every.run_twice(), Vec::<u64>::new(), "fires run twice");
        assert_eq!(
            every.all_reported("missed"),
            Vec::<u64>::new(),
            "fires missed"
        );

        let allow = done.record("allow");
        done.tally(store, "750 ms runs, overlap allowed", "allow", &window);
        for &fire in &window {
            assert_eq!(allow.started(fire), 1, "{}", allow.show(fire));
        }
        assert_eq!(allow.run_twice(), Vec::<u64>::new(), "fires run twice");
        let met = allow
            .starts
            .values()
            .flatten()
            .filter(|r| r.inside > 1)
            .count();
        assert!(met > 0, "runs of 1.5 periods never overlapped: {allow:?}");

        for suffix in ["skip", "wait"] {
            let record = done.record(suffix);
            let overlapping: Vec<&Run> = record
                .starts
                .values()
                .flatten()
                .filter(|run| run.inside > 1)
                .collect();
            assert!(
                overlapping.is_empty(),
                "{suffix}: runs overlapped: {overlapping:?}"
            );
            assert_eq!(record.run_twice(), Vec::<u64>::new(), "{suffix}: run twice");
            assert_eq!(
                record.all_reported("missed"),
                Vec::<u64>::new(),
                "{suffix}: missed"
            );
            for &fire in &window {
                let (ran, skipped) = (
                    record.started(fire),
                    record.reported(fire, "skipped_overlap"),
                );
                assert_eq!(ran + skipped, 1, "{suffix}: {}", record.show(fire));
            }
            let skipped = window
                .iter()
                .filter(|&&f| record.reported(f, "skipped_overlap") == 1)
                .count();
            let late = window
                .iter()
                .filter_map(|&f| Some(done.replicas.late(f, record.starts.get(&f)?.first()?)))
                .filter(|&late| late > 150)
                .count();
            eprintln!(
                "scheduled job on {store}, 750 ms runs, overlap {suffix}: {} fires, {skipped} skipped, {late} started over 150 ms late",
                window.len()
            );
            if suffix == "skip" {
                assert!(skipped > 0, "skip: no fire was skipped: {record:?}");
            } else {
                assert!(late > 0, "wait: no fire waited for a run: {record:?}");
            }
        }
    }

    /// Three replicas with skewed clocks run a job with 400 ms runs on a
    /// 500 ms schedule. The replica running a fire is SIGKILLed mid-run:
    /// its fire is reported missed, once, once its lease (2 s) ran out, and
    /// not run again. 5 s later the two others are frozen for 2.5 s: the fires
    /// due meanwhile are reported missed, none runs twice, and every other
    /// fire runs exactly once.
    pub fn a_killed_runner_and_frozen_replicas_leave_fires_missed_never_run_twice(&self) {
        let mut data = self.data();
        let period = 500;
        let mut replicas = self.replicas(period, 18, "every:allow:400", KILLED_TTL_MS);
        let all_started = replicas.started.iter().max().copied().unwrap_or(0);
        // The first run to start 1.5 s after every replica started, seen
        // within 200 ms of its start: half of its 400 ms are left for the
        // kill (on a busy machine the look itself can take longer, and a
        // run seen late may end before the kill; the next one is taken).
        let mut victim = None;
        crate::wait_until_blocking("a run to kill", Duration::from_secs(10), || {
            let record = replicas.runs(&mut data, "every");
            let seen = now_ms();
            victim = record
                .starts
                .iter()
                .find(|(fire, runs)| {
                    runs[0].at > all_started + 1500
                        && seen < runs[0].at + 200
                        && record.ended(**fire) == 0
                })
                .map(|(fire, runs)| (*fire, runs[0].pid));
            victim.is_some()
        });
        let (killed_fire, pid) = victim.expect("a run to kill");
        let worker = replicas
            .workers
            .iter_mut()
            .find(|w| w.pid() == pid)
            .expect("the runner");
        let kill_from = now_ms();
        worker.kill();
        let killed_at = now_ms();
        // The killed run's fire is free again a lease (2 s, and a store's
        // expiry slack) after the kill, and reported missed then.
        sleep_until_ms(killed_at + 5000);
        let survivors: Vec<&Worker> = replicas.workers.iter().filter(|w| w.pid() != pid).collect();
        for worker in &survivors {
            worker.pause();
        }
        let frozen_from = now_ms();
        std::thread::sleep(Duration::from_millis(2500));
        let frozen_to = now_ms();
        for worker in &survivors {
            worker.resume();
        }
        let offsets: Vec<i64> = replicas
            .offsets
            .iter()
            .filter(|(p, _)| **p != pid)
            .map(|(_, o)| *o)
            .collect();
        let done = replicas.finish(&mut data, &["every"], &[pid]);
        let record = done.record("every");
        let window = done.window(KILLED_TTL_MS + 1000);
        let store = store_name(&self.lock_url);

        assert_eq!(record.run_twice(), Vec::<u64>::new(), "fires run twice");
        assert!(
            record.started(killed_fire) == 1
                && record.ended(killed_fire) == 0
                && record.reported(killed_fire, "missed") == 1,
            "the killed run's fire: {}",
            record.show(killed_fire)
        );
        // When the survivors try a fire (by the real clock), and when its
        // run, started at the latest then, has ended (with room).
        let (fastest, slowest) = (
            offsets.iter().max().copied().unwrap_or(0),
            offsets.iter().min().copied().unwrap_or(0),
        );
        let tried_from = |fire: u64| fire as i64 - fastest;
        let over_by = |fire: u64| (fire + period) as i64 - slowest + 400 + 300;
        let (from, to) = (frozen_from as i64, frozen_to as i64);
        // Any replica, the killed one too, may have been at a fire the
        // kill met: started it (the killed run's), or taken its lock and
        // died before its body began (then it is missed).
        let (fastest_all, slowest_all) = (
            OFFSETS.iter().max().copied().unwrap_or(0),
            OFFSETS.iter().min().copied().unwrap_or(0),
        );
        let met_by_kill = |fire: u64| {
            fire as i64 - fastest_all - 100 <= killed_at as i64
                && (fire + period) as i64 - slowest_all + 700 >= kill_from as i64
        };
        let mut frozen_missed = 0;
        for &fire in &window {
            if fire == killed_fire {
                continue;
            }
            if tried_from(fire) >= from && over_by(fire) - 700 <= to {
                // Every attempt at it fell in the freeze.
                assert!(
                    record.started(fire) == 0 && record.reported(fire, "missed") == 1,
                    "a fire due while every replica was frozen: {}",
                    record.show(fire)
                );
                frozen_missed += 1;
            } else if !met_by_kill(fire) && (over_by(fire) < from || tried_from(fire) > to) {
                assert!(
                    record.started(fire) == 1 && record.ended(fire) == 1,
                    "a fire away from the faults not run exactly once: {}",
                    record.show(fire)
                );
            } else {
                // Met by the freeze or the kill: run (perhaps lost: its
                // runner, frozen before its body's first step, told so
                // and marked it) or missed.
                let accounted = record.started(fire)
                    + record.reported(fire, "lost")
                    + record.reported(fire, "missed");
                assert!(
                    accounted >= 1 && record.reported(fire, "missed") <= 1,
                    "a fire met by a fault neither run nor missed: {}",
                    record.show(fire)
                );
            }
        }
        let missed = window
            .iter()
            .filter(|&&f| record.reported(f, "missed") > 0)
            .count();
        eprintln!(
            "scheduled job on {store}, runner killed and replicas frozen 2.5 s: {} fires, {} run once, 0 run twice, {missed} missed ({frozen_missed} due in the freeze, 1 killed mid-run)",
            window.len(),
            window.iter().filter(|&&f| record.started(f) == 1).count(),
        );
        assert!(frozen_missed >= 2, "the freeze covered too few fires");
    }

    /// Three replicas with skewed clocks run a job with 50 ms runs every
    /// `period`; `outage` takes the store away just before a fire is due
    /// on the fastest clock (and returns once it is back). The fire runs
    /// once, after the outage began, and so does every other fire; none
    /// is missed. `outage` returns when the store's new server was started
    /// if it was down for the whole outage (one server restarted, not a
    /// cluster that elects a new leader): the fire then ran after that.
    pub fn a_fire_due_in_a_store_outage_runs_once_late(
        &self,
        period: Duration,
        outage: impl FnOnce() -> Option<SystemTime>,
    ) {
        let period = period.as_millis() as u64;
        let replicas = self.replicas(period, (period * 3 + 8000) / 1000, "every:allow:50", TTL_MS);
        let fastest = OFFSETS.iter().max().copied().unwrap_or(0);
        let all_started = replicas.started.iter().max().copied().unwrap_or(0);
        // The first fire a period after every replica started.
        let fire = ((all_started as i64 + fastest) as u64 + period) / period * period + period;
        let kill_at = (fire as i64 - fastest - 100) as u64;
        sleep_until_ms(kill_at);
        let killed_at = now_ms();
        let restarted_at = outage();
        let back_at = now_ms();
        let done = replicas.finish(&mut self.data(), &["every"], &[]);
        let record = done.record("every");
        let window = done.window(0);
        let store = store_name(&self.lock_url);
        let outage_ms = back_at - killed_at;
        assert!(
            outage_ms < period,
            "the store was away {outage_ms} ms, more than the {period} ms period the scenario needs"
        );
        assert!(window.contains(&fire), "{fire} not in {window:?}");
        let runs = record.starts.get(&fire);
        let run = match runs.map(Vec::as_slice) {
            Some([run]) => run,
            _ => panic!("the fire in the outage: {}", record.show(fire)),
        };
        let late = done.replicas.late(fire, run);
        eprintln!(
            "scheduled job on {store}, store away {outage_ms} ms: the fire due in it ran once, {late} ms late"
        );
        assert!(
            run.at >= killed_at,
            "ran before the outage: {}",
            record.show(fire)
        );
        if let Some(restarted_at) = restarted_at {
            let restarted_at = restarted_at
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            assert!(
                run.at >= restarted_at,
                "ran while the store was down (its new server started at {restarted_at}): {}",
                record.show(fire)
            );
        }
        for &fire in &window {
            assert!(
                record.started(fire) == 1 && record.ended(fire) == 1,
                "not run exactly once: {}",
                record.show(fire)
            );
        }
        assert_eq!(record.all_reported("missed"), Vec::<u64>::new(), "missed");
        done.tally(
            store,
            &format!("{period} ms period, store away {outage_ms} ms"),
            "every",
            &window,
        );
    }

    /// Three processes run a ShedLock-style task (one fixed key, skip
    /// mode, held at least 1 s) at the same 2 s ticks of the wall clock,
    /// `ticks` times: each tick runs exactly once.
    pub fn a_task_held_at_least_1s_on_2s_ticks_runs_every_tick_once(&self, ticks: u64) {
        let key = unique_key("ticks");
        let period = 2000;
        let first = (now_ms() + 4000) / period * period + period;
        let (period_arg, first_arg, ticks_arg) =
            (period.to_string(), first.to_string(), ticks.to_string());
        let workers: Vec<Worker> = (0..3)
            .map(|_| self.worker("ticks", &key, &[&period_arg, &first_arg, &ticks_arg]))
            .collect();
        let ran: u64 = crate::sum_of_done(workers, "ran");
        let runs: Vec<String> = self
            .data()
            .lrange(format!("ticks:{key}:runs"), 0, -1)
            .unwrap();
        let mut per_tick: BTreeMap<u64, usize> = BTreeMap::new();
        for run in &runs {
            let tick = run.split(' ').next().unwrap().parse().unwrap();
            *per_tick.entry(tick).or_default() += 1;
        }
        let once = per_tick.values().filter(|&&n| n == 1).count();
        eprintln!(
            "a task held at least 1 s on 2 s ticks, 3 processes on {}: {ticks} ticks, {once} run once, {ran} runs",
            store_name(&self.lock_url)
        );
        for n in 0..ticks {
            let tick = first + n * period;
            assert_eq!(per_tick.get(&tick), Some(&1), "tick {tick}: {runs:?}");
        }
        assert_eq!(ran, ticks, "{runs:?}");
    }
}
