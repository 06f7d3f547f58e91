//! Jobs on replicas that share one in-process store, with skewed clocks.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::job::{Fire, FireOutcome, FireReport, Job, JobHandle, Overlap, Schedule};
use lock_runtime::{LockRegistry, MemoryStore};

const PERIOD: Duration = Duration::from_millis(200);

/// A fire's instant in milliseconds since the Unix epoch, as its key names it.
fn epoch_millis(at: SystemTime) -> u128 {
    at.duration_since(UNIX_EPOCH).unwrap().as_millis()
}

/// Every report of every replica, and the fires each body ran.
#[derive(Clone, Default)]
struct Ledger {
    reports: Arc<Mutex<Vec<FireReport>>>,
}

impl Ledger {
    fn outcomes(&self) -> BTreeMap<u128, Vec<FireOutcome>> {
        let mut by_fire: BTreeMap<u128, Vec<FireOutcome>> = BTreeMap::new();
        for report in self.reports.lock().unwrap().iter() {
            by_fire
                .entry(epoch_millis(report.fire))
                .or_default()
                .push(report.outcome.clone());
        }
        by_fire
    }

    fn count(outcomes: &[FireOutcome], wanted: &FireOutcome) -> usize {
        outcomes.iter().filter(|o| *o == wanted).count()
    }

    fn count_refs(outcomes: &[&FireOutcome], wanted: &FireOutcome) -> usize {
        outcomes.iter().filter(|o| **o == wanted).count()
    }
}

/// A clock `skew_ms` off the real one (plus what `jump` holds, in ms).
fn skewed(skew_ms: i64, jump: Arc<AtomicU64>) -> impl Fn() -> SystemTime + Send + Sync {
    move || {
        let now = SystemTime::now() + Duration::from_millis(jump.load(Ordering::Relaxed));
        if skew_ms >= 0 {
            now + Duration::from_millis(skew_ms as u64)
        } else {
            now - Duration::from_millis(skew_ms.unsigned_abs())
        }
    }
}

/// `replicas` jobs on one store, clocks apart by up to 300 ms.
fn replicas(
    store: &MemoryStore,
    ledger: &Ledger,
    jump: &Arc<AtomicU64>,
    configure: impl Fn(Job) -> Job,
    body: impl Fn(Fire) -> tokio::task::JoinHandle<()> + Send + Sync + Clone + 'static,
) -> Vec<JobHandle> {
    [-300, 0, 300]
        .into_iter()
        .enumerate()
        .map(|(i, skew)| {
            let reports = ledger.reports.clone();
            let job = Job::new("report", Schedule::every(PERIOD))
                .max_skew(Duration::from_millis(400))
                .ttl(Duration::from_secs(2))
                .replica(format!("replica {i}"))
                .clock(skewed(skew, jump.clone()))
                .on_report(move |report| reports.lock().unwrap().push(report.clone()));
            let body = body.clone();
            configure(job)
                .spawn(&LockRegistry::new(store.clone()), move |fire| {
                    let run = body(fire);
                    async move { run.await.map_err(|e| e.to_string()) }
                })
                .unwrap()
        })
        .collect()
}

/// Runs the replicas for `run`, then stops them after their fires are
/// settled.
async fn run_for(handles: Vec<JobHandle>, run: Duration) {
    tokio::time::sleep(run).await;
    for handle in handles {
        handle.stop().await;
    }
}

#[tokio::test]
async fn three_skewed_replicas_run_each_fire_once() {
    let (store, ledger, jump) = (MemoryStore::default(), Ledger::default(), Arc::default());
    let handles = replicas(
        &store,
        &ledger,
        &jump,
        |job| job,
        |_| tokio::spawn(tokio::time::sleep(Duration::from_millis(30))),
    );
    run_for(handles, PERIOD * 12).await;
    let outcomes = ledger.outcomes();
    let ran: Vec<u128> = outcomes
        .iter()
        .filter(|(_, o)| Ledger::count(o, &FireOutcome::Done) > 0)
        .map(|(fire, _)| *fire)
        .collect();
    assert!(ran.len() >= 8, "{outcomes:?}");
    eprintln!(
        "memory, three skewed replicas: {} fires seen, {} run",
        outcomes.len(),
        ran.len()
    );
    for (fire, seen) in &outcomes {
        assert!(
            Ledger::count(seen, &FireOutcome::Done) <= 1,
            "fire {fire} ran twice: {seen:?}"
        );
        assert_eq!(
            Ledger::count(seen, &FireOutcome::Missed),
            0,
            "fire {fire}: {seen:?}"
        );
    }
    // No gap between the first fire run and the last.
    for pair in ran.windows(2) {
        assert_eq!(pair[1] - pair[0], PERIOD.as_millis(), "{ran:?}");
    }
}

#[tokio::test]
async fn fires_nobody_attempted_are_reported_missed_once() {
    let (store, ledger, jump) = (
        MemoryStore::default(),
        Ledger::default(),
        Arc::new(AtomicU64::new(0)),
    );
    let handles = replicas(
        &store,
        &ledger,
        &jump,
        |job| job,
        |_| tokio::spawn(async {}),
    );
    tokio::time::sleep(PERIOD * 3).await;
    // Every replica's clock leaps eight periods ahead, as after a freeze,
    // past the 600 ms between the clocks: the fires in between were never
    // attempted.
    jump.store(8 * PERIOD.as_millis() as u64, Ordering::Relaxed);
    run_for(handles, PERIOD * 14).await;
    let outcomes = ledger.outcomes();
    let missed: Vec<u128> = outcomes
        .iter()
        .filter(|(_, o)| Ledger::count(o, &FireOutcome::Missed) > 0)
        .map(|(fire, _)| *fire)
        .collect();
    assert!(!missed.is_empty(), "{outcomes:?}");
    for (fire, seen) in &outcomes {
        let (done, lost) = (
            Ledger::count(seen, &FireOutcome::Done),
            Ledger::count(seen, &FireOutcome::Missed),
        );
        assert!(done + lost <= 1, "fire {fire}: {seen:?}");
    }
}

#[tokio::test]
async fn a_long_run_skips_the_fires_it_overlaps_unless_allowed() {
    for (overlap, may_overlap) in [(Overlap::Skip, false), (Overlap::Allow, true)] {
        let (store, ledger, jump) = (MemoryStore::default(), Ledger::default(), Arc::default());
        let inside = Arc::new(AtomicU64::new(0));
        let most = Arc::new(AtomicU64::new(0));
        let (now_in, top) = (inside.clone(), most.clone());
        let handles = replicas(
            &store,
            &ledger,
            &jump,
            move |job| job.overlap(overlap),
            move |_| {
                let (now_in, top) = (now_in.clone(), top.clone());
                tokio::spawn(async move {
                    let n = now_in.fetch_add(1, Ordering::SeqCst) + 1;
                    top.fetch_max(n, Ordering::SeqCst);
                    tokio::time::sleep(PERIOD * 5 / 2).await;
                    now_in.fetch_sub(1, Ordering::SeqCst);
                })
            },
        );
        run_for(handles, PERIOD * 12).await;
        let outcomes = ledger.outcomes();
        let skipped = outcomes
            .values()
            .filter(|o| Ledger::count(o, &FireOutcome::SkippedOverlap) > 0)
            .count();
        let most = most.load(Ordering::SeqCst);
        if may_overlap {
            assert!(most >= 2, "{overlap:?}: at most {most} at once");
            assert_eq!(skipped, 0, "{overlap:?}: {outcomes:?}");
        } else {
            assert_eq!(most, 1, "{overlap:?}: {most} at once");
            assert!(skipped >= 2, "{overlap:?}: {outcomes:?}");
        }
    }
}

#[tokio::test]
async fn a_bad_schedule_is_refused_naming_the_job() {
    let registry = LockRegistry::memory();
    let err = Job::new("zero", Schedule::every(Duration::ZERO))
        .spawn(&registry, |_| async {})
        .unwrap_err();
    let said = err.to_string();
    assert!(
        said.contains("job:zero") && said.contains("at least 1 ms"),
        "{said}"
    );
}

/// The store the attribute-form job below runs on, shared by its
/// "replicas" (each call of the function is one).
fn attribute_store() -> LockRegistry {
    static STORE: std::sync::OnceLock<MemoryStore> = std::sync::OnceLock::new();
    LockRegistry::new(STORE.get_or_init(MemoryStore::default).clone())
}

/// Runs of an attribute-form job, by fire.
type Runs = Mutex<BTreeMap<u128, u32>>;

/// Counts a run of `fire` in `runs`.
fn count_run(runs: &Runs, fire: &Fire) {
    *runs
        .lock()
        .unwrap()
        .entry(epoch_millis(fire.at()))
        .or_default() += 1;
}

/// Two replicas started by `start` (an attribute-form job's function),
/// stopped after `run`; the runs `runs` counted.
async fn two_replicas(
    start: fn() -> Result<JobHandle, lock_runtime::LockError>,
    run: Duration,
    runs: &Runs,
) -> BTreeMap<u128, u32> {
    let replicas = [start().unwrap(), start().unwrap()];
    tokio::time::sleep(run).await;
    for replica in replicas {
        replica.stop().await;
    }
    runs.lock().unwrap().clone()
}

/// Each run of the attribute-form job, by fire.
static ATTRIBUTE_RUNS: Runs = Mutex::new(BTreeMap::new());

/// The attribute's job form: a function that starts the job.
#[lock_runtime::distributed_lock(job = "attribute-form", every = "100ms", registry = attribute_store())]
async fn attribute_form(fire: Fire) {
    count_run(&ATTRIBUTE_RUNS, &fire);
}

#[tokio::test]
async fn the_attribute_form_starts_a_job_each_call_a_replica() {
    let runs = two_replicas(attribute_form, Duration::from_millis(1000), &ATTRIBUTE_RUNS).await;
    assert!(runs.len() >= 7, "{runs:?}");
    assert!(runs.values().all(|&n| n == 1), "a fire run twice: {runs:?}");
    // No fire between the first and the last was left out.
    let (first, last) = (runs.keys().next().unwrap(), runs.keys().last().unwrap());
    assert_eq!(runs.len() as u128, (last - first) / 100 + 1, "{runs:?}");
}

/// Each run of the cron-form job, by fire.
static CRON_RUNS: Runs = Mutex::new(BTreeMap::new());

/// The attribute's job form on a cron schedule: every second.
#[lock_runtime::distributed_lock(job = "cron-form", cron = "* * * * * *", registry = attribute_store())]
async fn cron_form(fire: Fire) {
    count_run(&CRON_RUNS, &fire);
}

#[tokio::test]
async fn a_cron_schedule_fires_on_its_seconds_once_across_replicas() {
    let runs = two_replicas(cron_form, Duration::from_millis(2600), &CRON_RUNS).await;
    assert!(runs.len() >= 2, "{runs:?}");
    assert!(runs.keys().all(|fire| fire % 1000 == 0), "{runs:?}");
    assert!(runs.values().all(|&n| n == 1), "a fire run twice: {runs:?}");
}

#[tokio::test]
async fn a_bad_cron_expression_is_refused_naming_the_job() {
    let err = Job::new("bad-cron", Schedule::cron("61 * * * *"))
        .spawn(&LockRegistry::memory(), |_| async {})
        .unwrap_err();
    let said = err.to_string();
    assert!(
        said.contains("job:bad-cron") && said.contains("invalid cron expression \"61 * * * *\""),
        "{said}"
    );
}

/// A scheduler of the user's own (a ticker per replica, each late by its
/// own delay, as tokio-cron-scheduler on three replicas would be) calls
/// `run_fire` with the schedule's nearest fire: each fire runs once, the
/// others are told it was taken elsewhere.
#[tokio::test]
async fn run_fire_from_an_outside_scheduler_runs_each_fire_once() {
    let store = MemoryStore::default();
    // Longer than the other tests' period: a replica's ticker, 90 ms late
    // on purpose and later again on a busy machine, must stay nearer its
    // own fire than the next one.
    let period = PERIOD * 3;
    let schedule = Schedule::every(period);
    let runs: Arc<Mutex<BTreeMap<u128, Vec<usize>>>> = Arc::default();
    let outcomes: Arc<Mutex<Vec<(u128, FireOutcome)>>> = Arc::default();
    let first = schedule.next_after(SystemTime::now() + period);
    let tickers: Vec<_> = [0u64, 40, 90]
        .into_iter()
        .enumerate()
        .map(|(replica, late_ms)| {
            let (registry, schedule) = (LockRegistry::new(store.clone()), schedule.clone());
            let (runs, outcomes) = (runs.clone(), outcomes.clone());
            let job = Job::new("outside", schedule.clone()).replica(format!("replica {replica}"));
            tokio::spawn(async move {
                for n in 0..5u32 {
                    let due = first + period * n + Duration::from_millis(late_ms);
                    let wait = due.duration_since(SystemTime::now()).unwrap_or_default();
                    tokio::time::sleep(wait).await;
                    let fire = schedule.nearest(SystemTime::now());
                    let runs = runs.clone();
                    let outcome = job
                        .run_fire(&registry, fire, move |fire| {
                            let runs = runs.clone();
                            async move {
                                let mut runs = runs.lock().unwrap();
                                runs.entry(epoch_millis(fire.at()))
                                    .or_default()
                                    .push(replica);
                            }
                        })
                        .await
                        .unwrap();
                    outcomes.lock().unwrap().push((epoch_millis(fire), outcome));
                }
            })
        })
        .collect();
    for ticker in tickers {
        ticker.await.unwrap();
    }
    let runs = runs.lock().unwrap().clone();
    assert_eq!(runs.len(), 5, "{runs:?}");
    assert!(runs.values().all(|by| by.len() == 1), "{runs:?}");
    let outcomes = outcomes.lock().unwrap().clone();
    for fire in runs.keys() {
        let seen: Vec<&FireOutcome> = outcomes
            .iter()
            .filter(|(f, _)| f == fire)
            .map(|(_, o)| o)
            .collect();
        assert_eq!(
            (
                Ledger::count_refs(&seen, &FireOutcome::Done),
                Ledger::count_refs(&seen, &FireOutcome::TakenElsewhere)
            ),
            (1, 2),
            "fire {fire}: {seen:?}"
        );
    }
}
