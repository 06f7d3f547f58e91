//! Run-once fires from a scheduler you already run: each replica's
//! `tokio-cron-scheduler` fires the job, and [`Job::run_fire`] runs each
//! fire on one replica only.
//!
//! ```sh
//! cargo run -p examples --features tokio-cron-scheduler --example cron_scheduler
//! cargo run -p examples --features tokio-cron-scheduler --example cron_scheduler -- --redis redis://127.0.0.1:6379
//! ```
//!
//! Three replicas, each with a `JobScheduler` of its own (as each process
//! of a service has), fire the same cron expression every 2 s. In the
//! scheduler's callback, each replica names the fire by the schedule's
//! instant nearest the call ([`Schedule::nearest`], from the same
//! expression), not by its clock reading, and hands it to
//! [`Job::run_fire`]: one replica runs the body, the others are told the
//! fire was taken. With a store flag (`--redis URL`, `--postgres URL`, …)
//! each replica connects to the store on its own.
//!
//! Options: `--fires N` (3). Exits with status 1 if a fire ran other than
//! once.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use examples::Error;
use lock_runtime::LockRegistry;
use lock_runtime::job::{FireOutcome, Job, Schedule};
use tokio_cron_scheduler::{Job as CronJob, JobScheduler};

/// Every 2 s (seconds first): the scheduler's expression and the job's.
const EVERY_2S: &str = "*/2 * * * * *";
/// The replicas, each with a scheduler of its own.
const REPLICAS: usize = 3;

/// What each replica was told of each fire, by the fire's instant in ms.
type Outcomes = Arc<Mutex<BTreeMap<u128, Vec<(usize, FireOutcome)>>>>;

fn epoch_ms(at: SystemTime) -> u128 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis())
}

/// A fire's time of day, UTC (`08:40:14`).
fn time_of_day(at: SystemTime) -> String {
    let seconds = epoch_ms(at) / 1000 % 86_400;
    let (hours, minutes, seconds) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    format!("{hours:02}:{minutes:02}:{seconds:02}")
}

/// Replica `replica`'s scheduler, started: at each fire it calls
/// `run_fire` and notes what it was told.
async fn replica(
    replica: usize,
    registry: LockRegistry,
    job: Job,
    outcomes: Outcomes,
) -> Result<JobScheduler, Error> {
    let schedule = Schedule::cron(EVERY_2S);
    let scheduler = JobScheduler::new().await?;
    let cron = CronJob::new_async(EVERY_2S, move |_id, _scheduler| {
        let (registry, job, outcomes) = (registry.clone(), job.clone(), outcomes.clone());
        let fire = schedule.nearest(SystemTime::now());
        Box::pin(async move {
            let ran = job
                .run_fire(&registry, fire, move |fire| async move {
                    println!(
                        "  fire {}: run by replica #{replica}",
                        time_of_day(fire.at())
                    );
                    tokio::time::sleep(Duration::from_millis(100)).await;
                })
                .await;
            let outcome = match ran {
                Ok(outcome) => outcome,
                Err(err) => {
                    eprintln!("replica #{replica}: {err}");
                    return;
                }
            };
            let mut outcomes = outcomes.lock().expect("outcomes");
            outcomes
                .entry(epoch_ms(fire))
                .or_default()
                .push((replica, outcome));
        })
    })?;
    scheduler.add(cron).await?;
    scheduler.start().await?;
    Ok(scheduler)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let mut fires = 3;
    let store = examples::parse_flags("cron_scheduler", |flag, value| {
        match flag {
            "--fires" => fires = value()?.parse()?,
            _ => return Ok(false),
        }
        Ok(true)
    })?;
    if fires == 0 {
        return Err("--fires must be at least 1".into());
    }
    // A job name of this run's own, so that a store shared with an earlier
    // run holds no marks of its fires.
    let run = format!("{}-{}", std::process::id(), epoch_ms(SystemTime::now()));
    let job = Job::new(format!("cron-report:{run}"), Schedule::cron(EVERY_2S));
    // The fires the verdict counts: from the first at least 500 ms away
    // (the schedulers started by then), `fires` of them.
    let schedule = Schedule::cron(EVERY_2S);
    let first = schedule.next_after(SystemTime::now() + Duration::from_millis(500));
    let last = (1..fires).fold(first, |fire, _| schedule.next_after(fire));
    println!(
        "cron scheduler: {REPLICAS} replicas, each a tokio-cron-scheduler firing \
         {EVERY_2S:?}, on {}; {fires} fires counted",
        store.name()
    );

    let outcomes = Outcomes::default();
    let in_memory = store.registry().await?;
    let mut schedulers = Vec::new();
    for i in 0..REPLICAS {
        let registry = if store.is_shared() {
            store.registry().await?
        } else {
            in_memory.clone()
        };
        schedulers.push(replica(i, registry, job.clone(), outcomes.clone()).await?);
    }
    // Past the last fire counted, and its 100 ms run.
    let end = last + Duration::from_secs(1);
    tokio::time::sleep(end.duration_since(SystemTime::now()).unwrap_or_default()).await;
    for mut scheduler in schedulers {
        scheduler.shutdown().await?;
    }

    let outcomes = outcomes.lock().expect("outcomes").clone();
    let mut wrong = 0;
    let mut fire = first;
    println!("what each replica was told:");
    while fire <= last {
        let told = outcomes.get(&epoch_ms(fire)).cloned().unwrap_or_default();
        let ran: Vec<_> = told
            .iter()
            .filter(|(_, outcome)| *outcome == FireOutcome::Done)
            .map(|(i, _)| format!("#{i}"))
            .collect();
        let taken: Vec<_> = told
            .iter()
            .filter(|(_, outcome)| *outcome == FireOutcome::TakenElsewhere)
            .map(|(i, _)| format!("#{i}"))
            .collect();
        let verdict = if ran.len() == 1 { "once" } else { "WRONG" };
        if ran.len() != 1 {
            wrong += 1;
        }
        println!(
            "  fire {}: ran by {} ({verdict}); taken elsewhere for {}",
            time_of_day(fire),
            if ran.is_empty() {
                "nobody".to_owned()
            } else {
                ran.join(", ")
            },
            if taken.is_empty() {
                "nobody".to_owned()
            } else {
                taken.join(", ")
            },
        );
        fire = schedule.next_after(fire);
    }
    if wrong > 0 {
        println!("FAILED: {wrong} fire(s) did not run exactly once.");
        std::process::exit(1);
    }
    println!("OK: every fire ran exactly once.");
    Ok(())
}
