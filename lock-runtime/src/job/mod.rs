//! Scheduled jobs that run once per fire across every replica.
//!
//! Every replica runs the same [`Job`]: the same name and [`Schedule`].
//! Each fire is named by its scheduled instant, computed from the schedule
//! alone, and is a lock of its own (`job:{name}:{instant in ms}`): the
//! first replica to take it runs the body, the others find it taken,
//! however late their clocks are (up to [`Job::max_skew`]), and a held or
//! lingering fire never blocks the next one. No lock timing is left to
//! choose: how long a fire's lock is kept after its run follows from the
//! schedule and the skew.
//!
//! A fire runs at most once. The replica that takes a fire's lock marks
//! it started (`job:{name}:{instant}:started`, a mark whose own lease
//! lasts as long as the fire's marks, so it outlives a frozen replica)
//! before it runs the body; a replica that takes the lock later, after
//! the runner died or was frozen past its lease, finds the mark and does
//! not run the fire again. Such a fire is reported missed (below), or
//! [lost](FireOutcome::Lost) by its runner when that one lives to the end
//! of its body and marks the fire first.
//!
//! What happens to each fire is reported once per replica that saw it
//! (ran, taken elsewhere, skipped for overlap, store unreachable), and a
//! fire that no replica ran to its end is reported missed, once across all
//! replicas: in a span and an event per fire, and to [`Job::on_report`].
//!
//! # Which replica settles a fire
//!
//! After a fire's attempts are over (its period and twice the skew after
//! its instant), every replica looks at it: a fire whose run ended left a
//! mark (`job:{name}:{instant}:done`, kept as long as the fire's own lock).
//! A fire with no mark and nobody holding it was missed (every replica was
//! down, frozen or cut off from the store for its whole period, or its
//! runner died): the replica that takes its lock then reports it, and
//! marks it, so the others do not. A fire whose runner is still running
//! (or died and its lease has not yet run out) is looked at again until
//! one of the two is true.
//!
//! # From a scheduler you already run
//!
//! A service whose scheduler (tokio-cron-scheduler, say) already fires on
//! every replica calls [`Job::run_fire`] from it, with the fire the
//! schedule names ([`Schedule::nearest`] to the time of the call): the
//! fire runs on one replica, and the others are told it was taken. (The
//! repository's `cron_scheduler` example does so from tokio-cron-scheduler,
//! with the same cron expression for the scheduler and the [`Schedule`].)
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use lock_runtime::LockRegistry;
//! use lock_runtime::job::{FireOutcome, Job, Schedule};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lock_runtime::LockError> {
//! let registry = LockRegistry::memory();
//! let schedule = Schedule::every(Duration::from_secs(60));
//! let job = Job::new("sweep", schedule.clone());
//! // In the scheduler's callback, each minute:
//! let fire = schedule.nearest(SystemTime::now());
//! let outcome = job
//!     .run_fire(&registry, fire, |fire| async move {
//!         println!("sweeping for {:?}", fire.at());
//!     })
//!     .await?;
//! assert_eq!(outcome, FireOutcome::Done);
//! # Ok(())
//! # }
//! ```

mod schedule;

pub use schedule::Schedule;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tracing::Instrument;

use crate::error::LockError;
use crate::guard::LockGuard;
use crate::options::LockOptions;
use crate::registry::LockRegistry;
use crate::store::Claim;
use crate::telemetry;

use schedule::epoch_millis;

/// Where a job reads the wall clock.
type Clock = Arc<dyn Fn() -> SystemTime + Send + Sync>;
/// What a job tells of each fire.
type Reporter = Arc<dyn Fn(&FireReport) + Send + Sync>;

/// A job that runs once per fire of its schedule across every replica
/// that runs it (see the [module docs](self)).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use lock_runtime::LockRegistry;
/// use lock_runtime::job::{Job, Schedule};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_runtime::LockError> {
/// let registry = LockRegistry::memory();
/// let job = Job::new("nightly-report", Schedule::every(Duration::from_secs(24 * 3600)))
///     .spawn(&registry, |fire| async move {
///         println!("the report of {:?}", fire.at());
///     })?;
/// // ... and at shutdown: no new fires, the running one ends.
/// job.stop().await;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Job {
    name: Arc<str>,
    schedule: Schedule,
    overlap: Overlap,
    ttl: Duration,
    max_skew: Duration,
    replica: Arc<str>,
    clock: Clock,
    reporter: Option<Reporter>,
}

/// What a fire does while another run of the job goes on (on any
/// replica).
///
/// Runs of one job meet when a run outlives its period, and also when
/// replicas' clocks differ by more than a period: a replica whose clock is
/// behind runs a fire that the others, started later by their clocks,
/// never tried, while they run a newer one. Under [`Skip`](Self::Skip) or
/// [`Wait`](Self::Wait) the newer fire then gives way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Overlap {
    /// The fire runs beside the other run: every fire runs. The default.
    #[default]
    Allow,
    /// The fire is skipped, reported [`FireOutcome::SkippedOverlap`]: runs
    /// of the job never overlap.
    Skip,
    /// The fire waits for the other run to end, and runs late, unless its
    /// own period is over by then (then it is skipped as above).
    Wait,
}

/// One fire, as the body sees it.
#[derive(Clone, Debug)]
pub struct Fire {
    job: Arc<str>,
    at: SystemTime,
    fencing_token: u64,
}

impl Fire {
    /// The job's name.
    pub fn job(&self) -> &str {
        &self.job
    }

    /// The fire's scheduled instant (not when this replica started it).
    pub fn at(&self) -> SystemTime {
        self.at
    }

    /// The fencing token of the fire's lock. Each fire is a key of its
    /// own: the token orders writes within one fire's run where the store
    /// promises fencing, never fires (compare [`at`](Self::at) for that).
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }
}

/// What happened to one fire, as one replica saw it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct FireReport {
    /// The job's name.
    pub job: Arc<str>,
    /// The fire's scheduled instant.
    pub fire: SystemTime,
    /// The replica reporting ([`Job::replica`]).
    pub replica: Arc<str>,
    /// When the body started and ended here, by this replica's clock (for
    /// a fire it ran).
    pub ran: Option<(SystemTime, SystemTime)>,
    /// What happened.
    pub outcome: FireOutcome,
}

/// What happened to one fire (see [`FireReport`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FireOutcome {
    /// This replica ran the body to its end.
    Done,
    /// This replica ran the body, which returned an error (its text).
    Failed(String),
    /// This replica ran the body and lost the fire's lock meanwhile: the
    /// body was cancelled at its next `.await`, or ended after the lock's
    /// lease had run out (the replica was frozen, say).
    Lost,
    /// This replica ran the body and the job was cancelled
    /// ([`JobHandle::cancel`]) before it ended.
    Cancelled,
    /// Another replica took the fire.
    TakenElsewhere,
    /// This replica took the fire while the job's previous run was still
    /// running, under [`Overlap::Skip`] (or [`Overlap::Wait`] until the
    /// fire's period was over): nobody runs it.
    SkippedOverlap,
    /// This replica could not reach the store within the fire's period
    /// (the last error's text): another may have run it; the fire is
    /// reported missed if none did.
    Unreachable(String),
    /// No replica ran the fire to its end (reported by one replica).
    Missed,
}

impl FireOutcome {
    /// Its name in metrics: `done`, `failed`, `lost`, `cancelled`,
    /// `taken_elsewhere`, `skipped_overlap`, `unreachable`, `missed`.
    pub fn label(&self) -> &'static str {
        match self {
            FireOutcome::Done => "done",
            FireOutcome::Failed(_) => "failed",
            FireOutcome::Lost => "lost",
            FireOutcome::Cancelled => "cancelled",
            FireOutcome::TakenElsewhere => "taken_elsewhere",
            FireOutcome::SkippedOverlap => "skipped_overlap",
            FireOutcome::Unreachable(_) => "unreachable",
            FireOutcome::Missed => "missed",
        }
    }
}

/// What a body's output says of its run: `()` is a success; a `Result`'s
/// error is a failed run ([`FireOutcome::Failed`]).
pub trait FireResult {
    /// The error's text, when the run failed.
    fn failure(&self) -> Option<String>;
}

impl FireResult for () {
    fn failure(&self) -> Option<String> {
        None
    }
}

impl<T, E: fmt::Display> FireResult for Result<T, E> {
    fn failure(&self) -> Option<String> {
        self.as_ref().err().map(ToString::to_string)
    }
}

/// How a fire's state looks in the store ([`Job::inspect`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum FireState {
    /// Nobody has taken it (yet), or its marks have run out.
    Open,
    /// A replica holds it: its run is going on (or its runner died and
    /// its lease has not run out).
    Running,
    /// A replica started its run, which ended without marking it (its
    /// runner died, or lost the fire's lock): it is not run again, and is
    /// reported missed once its attempts are over.
    Interrupted,
    /// Settled: its run ended, or it was reported missed.
    Settled,
}

/// A running job ([`Job::spawn`]). Dropping it cancels the job, as
/// [`cancel`](Self::cancel) does, without waiting.
#[derive(Debug)]
pub struct JobHandle {
    control: watch::Sender<Control>,
    task: Option<JoinHandle<()>>,
}

/// What the job's replica is told to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Control {
    Run,
    /// No new fires; running bodies end on their own.
    Stop,
    /// No new fires; running bodies are cancelled.
    Cancel,
}

impl JobHandle {
    /// Stops firing and waits for the bodies running here to end.
    pub async fn stop(mut self) {
        self.end(Control::Stop).await;
    }

    /// Stops firing and cancels the bodies running here at their next
    /// `.await` (reported [`FireOutcome::Cancelled`]; their fires are not
    /// run again), and waits for that.
    pub async fn cancel(mut self) {
        self.end(Control::Cancel).await;
    }

    async fn end(&mut self, how: Control) {
        self.control.send_replace(how);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for JobHandle {
    fn drop(&mut self) {
        if self.task.is_some() {
            self.control.send_replace(Control::Cancel);
        }
    }
}

impl fmt::Debug for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Job")
            .field("name", &self.name)
            .field("schedule", &self.schedule)
            .field("overlap", &self.overlap)
            .field("ttl", &self.ttl)
            .field("max_skew", &self.max_skew)
            .field("replica", &self.replica)
            .finish_non_exhaustive()
    }
}

impl Job {
    /// A job named `name` (part of its keys: the same on every replica),
    /// firing on `schedule`.
    pub fn new(name: impl Into<String>, schedule: Schedule) -> Job {
        Job {
            name: Arc::from(name.into()),
            schedule,
            overlap: Overlap::default(),
            ttl: Duration::from_secs(30),
            max_skew: Duration::from_secs(2),
            replica: Arc::from(format!("pid {}", std::process::id())),
            clock: Arc::new(SystemTime::now),
            reporter: None,
        }
    }

    /// What a fire does while another run of the job goes on (default
    /// [`Overlap::Allow`]).
    pub fn overlap(mut self, overlap: Overlap) -> Job {
        self.overlap = overlap;
        self
    }

    /// The ttl of a run's lease, renewed while the body runs (default
    /// 30 s): how long a crashed runner blocks the job.
    pub fn ttl(mut self, ttl: Duration) -> Job {
        self.ttl = ttl;
        self
    }

    /// The largest difference between two replicas' clocks (default 2 s):
    /// a replica late by up to this much still finds its fire taken. A
    /// replica later than that, or a fire that every replica missed, is
    /// judged this much later, and each fire's marks are kept twice its
    /// period and five times this long.
    pub fn max_skew(mut self, skew: Duration) -> Job {
        self.max_skew = skew;
        self
    }

    /// This replica's name in reports (default `pid N`).
    pub fn replica(mut self, name: impl Into<String>) -> Job {
        self.replica = Arc::from(name.into());
        self
    }

    /// Where the job reads the wall clock (default [`SystemTime::now`]):
    /// for tests that skew replicas.
    pub fn clock(mut self, clock: impl Fn() -> SystemTime + Send + Sync + 'static) -> Job {
        self.clock = Arc::new(clock);
        self
    }

    /// Called with every report of this replica (besides the event logged
    /// for it).
    pub fn on_report(mut self, report: impl Fn(&FireReport) + Send + Sync + 'static) -> Job {
        self.reporter = Some(Arc::new(report));
        self
    }

    /// The key of the fire at `fire` (without the registry's namespace).
    pub fn fire_key(&self, fire: SystemTime) -> String {
        format!("job:{}:{}", self.name, epoch_millis(fire))
    }

    fn done_key(&self, fire: SystemTime) -> String {
        format!("{}:done", self.fire_key(fire))
    }

    fn started_key(&self, fire: SystemTime) -> String {
        format!("{}:started", self.fire_key(fire))
    }

    fn running_key(&self) -> String {
        format!("job:{}:running", self.name)
    }

    fn now(&self) -> SystemTime {
        (self.clock)()
    }

    fn options(&self) -> LockOptions {
        LockOptions::default()
            .ttl(self.ttl)
            .name(format!("job:{}", self.name))
    }

    /// How the fire at `fire` looks in the store.
    ///
    /// # Errors
    ///
    /// [`LockError::Store`] when the store fails.
    pub async fn inspect(
        &self,
        registry: &LockRegistry,
        fire: SystemTime,
    ) -> Result<FireState, LockError> {
        if registry.inspect(&self.done_key(fire)).await?.is_some() {
            return Ok(FireState::Settled);
        }
        if registry.inspect(&self.fire_key(fire)).await?.is_some() {
            return Ok(FireState::Running);
        }
        Ok(match registry.inspect(&self.started_key(fire)).await? {
            Some(_) => FireState::Interrupted,
            None => FireState::Open,
        })
    }

    /// Starts the job on this replica: from the first fire after now, each
    /// fire runs `body` here unless another replica took it. Needs a Tokio
    /// runtime.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidOptions`] naming the job's key when the schedule
    /// or ttl cannot work, or the store cannot keep a lock after its
    /// release (every built-in store can).
    pub fn spawn<F, Fut>(self, registry: &LockRegistry, body: F) -> Result<JobHandle, LockError>
    where
        F: Fn(Fire) -> Fut + Send + Sync + 'static,
        Fut: Future + Send + 'static,
        Fut::Output: FireResult,
    {
        self.check(registry)?;
        let (control, watching) = watch::channel(Control::Run);
        let task = tokio::spawn(drive(
            Arc::new(self),
            registry.clone(),
            Arc::new(body),
            watching,
        ));
        Ok(JobHandle {
            control,
            task: Some(task),
        })
    }

    /// Refuses a job whose schedule or ttl cannot work on `registry`, or
    /// a store that cannot keep a lock after its release.
    fn check(&self, registry: &LockRegistry) -> Result<(), LockError> {
        let key = self.running_key();
        let invalid = |reason: String| LockError::invalid_options(&key, reason);
        self.schedule.check().map_err(invalid)?;
        let caps = registry.store().capabilities();
        if !caps.linger {
            return Err(invalid(format!(
                "the {} store cannot keep a lock after its release, which marks a fire as taken",
                caps.store
            )));
        }
        caps.check(Claim::Exclusive, self.ttl, None)
            .map_err(invalid)?;
        registry.full_key(&self.fire_key(SystemTime::now()))?;
        Ok(())
    }

    /// Runs the fire at `fire` here unless another replica takes it, for
    /// a scheduler of your own (tokio-cron-scheduler, say) that calls this
    /// on every replica at each fire; returns what happened, also reported
    /// as [`spawn`](Self::spawn) reports it.
    ///
    /// `fire` names the fire: every replica must pass the same instant,
    /// the schedule's, not its clock reading; [`Schedule::nearest`] gives
    /// it from the time the scheduler called. The overlap choice, the
    /// marks and the retries on store errors (until the next fire is due)
    /// are as with `spawn`; a fire no replica ran is not reported missed
    /// here, since the scheduler, not the job, knows which fires were due.
    ///
    /// # Errors
    ///
    /// As [`spawn`](Self::spawn).
    pub async fn run_fire<F, Fut>(
        &self,
        registry: &LockRegistry,
        fire: SystemTime,
        body: F,
    ) -> Result<FireOutcome, LockError>
    where
        F: Fn(Fire) -> Fut + Send + Sync + 'static,
        Fut: Future + Send + 'static,
        Fut::Output: FireResult,
    {
        self.check(registry)?;
        let next = self.schedule.next_after(fire);
        // Never cancelled: the sender lives as long as the attempt.
        let (_control, watching) = watch::channel(Control::Run);
        let span = tracing::info_span!(
            "scheduled_job",
            job = %self.name,
            fire = epoch_millis(fire),
            replica = %self.replica,
        );
        let attempt = attempt(
            Arc::new(self.clone()),
            registry.clone(),
            Arc::new(body),
            fire,
            next,
            watching,
        );
        Ok(attempt.instrument(span).await)
    }

    /// Sleeps until this replica's clock reads `at` (read again at least
    /// every 5 s, so a clock set forward is followed).
    async fn sleep_until(&self, at: SystemTime) {
        loop {
            let Ok(left) = at.duration_since(self.now()) else {
                return;
            };
            if left.is_zero() {
                return;
            }
            tokio::time::sleep(left.min(Duration::from_secs(5))).await;
        }
    }

    /// When the fire at `fire` (the next one at `next`) has had every
    /// attempt it will get, by this replica's clock: a replica attempts a
    /// fire until its own clock reads `next`, which this one's may read up
    /// to twice the skew later; and a quarter period (at most 5 s) for an
    /// attempt then in flight.
    fn settle_at(&self, fire: SystemTime, next: SystemTime) -> SystemTime {
        let period = next.duration_since(fire).unwrap_or_default();
        next + self.max_skew * 2 + (period / 4).min(Duration::from_secs(5))
    }

    /// Until when a replica looks at a fire (see `settle`): twice its
    /// period and four times the skew after it, by its own clock. The
    /// fire's marks are kept a skew longer ([`linger`](Self::linger)).
    fn keep_until(&self, fire: SystemTime, next: SystemTime) -> SystemTime {
        let period = next.duration_since(fire).unwrap_or_default();
        fire + period * 2 + self.max_skew * 4
    }

    /// Reports `outcome` for `fire`: an event in the fire's span, and the
    /// job's reporter.
    fn report(
        &self,
        fire: SystemTime,
        ran: Option<(SystemTime, SystemTime)>,
        outcome: FireOutcome,
    ) -> FireOutcome {
        let ms = epoch_millis(fire);
        telemetry::job_fire(&self.name, outcome.label());
        match &outcome {
            FireOutcome::Done | FireOutcome::TakenElsewhere => {
                tracing::debug!(job = %self.name, fire = ms, outcome = ?outcome, "scheduled job fire")
            }
            FireOutcome::Missed
            | FireOutcome::Lost
            | FireOutcome::Failed(_)
            | FireOutcome::Unreachable(_) => {
                tracing::warn!(job = %self.name, fire = ms, outcome = ?outcome, "scheduled job fire")
            }
            _ => {
                tracing::info!(job = %self.name, fire = ms, outcome = ?outcome, "scheduled job fire")
            }
        }
        if let Some(reporter) = &self.reporter {
            let report = FireReport {
                job: self.name.clone(),
                fire,
                replica: self.replica.clone(),
                ran,
                outcome,
            };
            reporter(&report);
            return report.outcome;
        }
        outcome
    }

    /// Marks the fire settled (its `:done` key) and releases its lock,
    /// both kept until the fire's marks may be looked at;
    /// [`LockError::Lost`] when the lock was lost meanwhile. A store error
    /// on the mark is tried again, with backoff, while a replica may still
    /// look at the fire (the lock, held meanwhile, keeps them looking): a
    /// fire left unmarked would be reported missed.
    async fn settle_and_release(
        &self,
        registry: &LockRegistry,
        fire: SystemTime,
        next: SystemTime,
        guard: LockGuard,
    ) -> Result<(), LockError> {
        let (most, mut backoff) = self.backoff(fire, next);
        // Until every replica would still see the mark: one whose clock
        // is ahead by the skew stops looking then (see `settle`); the
        // others see the fire's lock held meanwhile and look on.
        let looked_at = self.keep_until(fire, next) - self.max_skew;
        loop {
            let linger = self.linger(fire, next);
            match self.mark(registry, &self.done_key(fire), linger).await {
                Err(LockError::Store { .. }) if self.now() + backoff < looked_at => {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(most);
                }
                _ => break,
            }
        }
        guard.release_lingering(self.linger(fire, next)).await
    }

    /// How a fire's attempts back off after a store error: at most an
    /// eighth of its period (10 ms to 2 s), starting from 20 ms or less.
    fn backoff(&self, fire: SystemTime, next: SystemTime) -> (Duration, Duration) {
        let period = next.duration_since(fire).unwrap_or_default();
        let most = (period / 8).clamp(Duration::from_millis(10), Duration::from_secs(2));
        (most, Duration::from_millis(20).min(most))
    }

    /// How long a fire's marks are kept from now: until
    /// [`keep_until`](Self::keep_until) by the replica clock furthest
    /// behind, up to the skew behind this one (the replicas look at the
    /// fire until then by their own clocks), and at least a period and twice
    /// the skew, so a run that ends late is still seen ended by the
    /// replicas looking.
    fn linger(&self, fire: SystemTime, next: SystemTime) -> Duration {
        let period = next.duration_since(fire).unwrap_or_default();
        (self.keep_until(fire, next) + self.max_skew)
            .duration_since(self.now())
            .unwrap_or_default()
            .max(period + self.max_skew * 2)
    }

    /// Marks `key` for `linger` from now: a lock taken with a lease that
    /// long (not renewed; up to one of the store's ttl units longer), so a replica frozen between taking and
    /// releasing it still leaves it marked. `false` when it was marked
    /// already.
    async fn mark(
        &self,
        registry: &LockRegistry,
        key: &str,
        linger: Duration,
    ) -> Result<bool, LockError> {
        // The lease: `linger`, rounded up to the unit the store counts
        // ttls in.
        let unit = registry
            .store()
            .capabilities()
            .ttl_granularity
            .as_nanos()
            .max(1);
        let nanos = linger.as_nanos().div_ceil(unit).max(1) * unit;
        let ttl = Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX));
        let options = self.options().ttl(ttl).watchdog(false);
        match registry.try_lock(key, options).await? {
            Some(mark) => {
                let _ = mark.release_lingering(linger).await;
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

/// One replica's loop: each fire's attempt, and each fire's settling.
async fn drive<F, Fut>(
    job: Arc<Job>,
    registry: LockRegistry,
    body: Arc<F>,
    mut control: watch::Receiver<Control>,
) where
    F: Fn(Fire) -> Fut + Send + Sync + 'static,
    Fut: Future + Send + 'static,
    Fut::Output: FireResult,
{
    let mut runs = JoinSet::new();
    let mut settles = JoinSet::new();
    let mut fire = job.schedule.next_after(job.now());
    loop {
        tokio::select! {
            () = job.sleep_until(fire) => {}
            _ = control.wait_for(|c| *c != Control::Run) => break,
        }
        let next = job.schedule.next_after(fire);
        let span = tracing::info_span!(
            "scheduled_job",
            job = %job.name,
            fire = epoch_millis(fire),
            replica = %job.replica,
        );
        if job.now() < next {
            let attempt = attempt(
                job.clone(),
                registry.clone(),
                body.clone(),
                fire,
                next,
                control.clone(),
            );
            runs.spawn(attempt.instrument(span.clone()));
        }
        settles.spawn(settle(job.clone(), registry.clone(), fire, next).instrument(span));
        // Frozen or asleep past whole periods: fires whose marks are gone
        // by now cannot be told apart; the next is looked at from here.
        let now = job.now();
        fire = if now > job.keep_until(fire, next) {
            job.schedule.next_after(now)
        } else {
            next
        };
        while runs.try_join_next().is_some() {}
        while settles.try_join_next().is_some() {}
    }
    settles.abort_all();
    while runs.join_next().await.is_some() {}
}

/// One replica's attempt at one fire: taken, run and marked, or taken
/// elsewhere; a store error is tried again while the fire's period lasts.
async fn attempt<F, Fut>(
    job: Arc<Job>,
    registry: LockRegistry,
    body: Arc<F>,
    fire: SystemTime,
    next: SystemTime,
    mut control: watch::Receiver<Control>,
) -> FireOutcome
where
    F: Fn(Fire) -> Fut + Send + Sync + 'static,
    Fut: Future + Send + 'static,
    Fut::Output: FireResult,
{
    let key = job.fire_key(fire);
    let (most, mut backoff) = job.backoff(fire, next);
    let (guard, fencing_token) = loop {
        let err = match registry.try_lock(&key, job.options()).await {
            // Read before the fire is marked started: a fire marked is not
            // tried again.
            Ok(Some(guard)) => match guard.fencing_token().await {
                Err(err) => {
                    let _ = guard.release().await;
                    err
                }
                // Held now, or started before by a replica that lost it (its
                // runner died or was frozen past its lease): a fire runs once.
                Ok(token) => match job
                    .mark(&registry, &job.started_key(fire), job.linger(fire, next))
                    .await
                {
                    Ok(true) => break (guard, token),
                    Ok(false) => {
                        let _ = guard.release().await;
                        return job.report(fire, None, FireOutcome::TakenElsewhere);
                    }
                    Err(err) => {
                        let _ = guard.release().await;
                        err
                    }
                },
            },
            Ok(None) => return job.report(fire, None, FireOutcome::TakenElsewhere),
            Err(err) => err,
        };
        if !matches!(err, LockError::Store { .. }) || job.now() + backoff >= next {
            return job.report(fire, None, FireOutcome::Unreachable(err.to_string()));
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(most);
    };
    let running = match job.overlap {
        Overlap::Allow => None,
        Overlap::Skip | Overlap::Wait => {
            let running = job.running_key();
            let taken = if job.overlap == Overlap::Skip {
                registry.try_lock(&running, job.options()).await
            } else {
                let left = next.duration_since(job.now()).unwrap_or_default();
                let waiting = job
                    .options()
                    .wait_timeout(left.max(Duration::from_millis(1)));
                match registry.lock(&running, waiting).await {
                    Err(LockError::Timeout { .. }) => Ok(None),
                    other => other.map(Some),
                }
            };
            match taken {
                Ok(Some(guard)) => Some(guard),
                Ok(None) => {
                    let _ = job.settle_and_release(&registry, fire, next, guard).await;
                    return job.report(fire, None, FireOutcome::SkippedOverlap);
                }
                Err(err) => {
                    // Freed at once: another replica may still take it.
                    let _ = guard.release().await;
                    return job.report(fire, None, FireOutcome::Unreachable(err.to_string()));
                }
            }
        }
    };
    let started = job.now();
    let run = body(Fire {
        job: job.name.clone(),
        at: fire,
        fencing_token,
    });
    let outcome = tokio::select! {
        output = run => output.failure().map_or(FireOutcome::Done, FireOutcome::Failed),
        () = guard.lost() => FireOutcome::Lost,
        () = lost(running.as_ref()) => FireOutcome::Lost,
        _ = control.wait_for(|c| *c == Control::Cancel) => FireOutcome::Cancelled,
    };
    let ended = job.now();
    if let Some(running) = running {
        let _ = running.release().await;
    }
    let released = job.settle_and_release(&registry, fire, next, guard).await;
    // A run that ended after its lease ran out (its replica frozen, say)
    // was not alone to its end.
    let outcome = match (outcome, released) {
        (FireOutcome::Done | FireOutcome::Failed(_), Err(LockError::Lost { .. })) => {
            FireOutcome::Lost
        }
        (outcome, _) => outcome,
    };
    job.report(fire, Some((started, ended)), outcome)
}

/// Until `guard`'s lease is lost; never without one.
async fn lost(guard: Option<&LockGuard>) {
    match guard {
        Some(guard) => guard.lost().await,
        None => std::future::pending().await,
    }
}

/// Looks at a fire once its attempts are over: settled, or taken here and
/// reported missed, or looked at again while someone holds it.
async fn settle(job: Arc<Job>, registry: LockRegistry, fire: SystemTime, next: SystemTime) {
    job.sleep_until(job.settle_at(fire, next)).await;
    let (fire_key, done_key) = (job.fire_key(fire), job.done_key(fire));
    let period = next.duration_since(fire).unwrap_or_default();
    let again = (job.ttl / 3).min(period).max(Duration::from_millis(10));
    let give_up = job.keep_until(fire, next);
    while job.now() < give_up {
        match registry.inspect(&done_key).await {
            Ok(Some(_)) => return,
            Ok(None) => {
                if let Ok(Some(guard)) = registry.try_lock(&fire_key, job.options()).await {
                    let _ = job.settle_and_release(&registry, fire, next, guard).await;
                    job.report(fire, None, FireOutcome::Missed);
                    return;
                }
                // Held: running, or its runner is gone and its lease not
                // yet out.
            }
            Err(_) => {}
        }
        tokio::time::sleep(again).await;
    }
}
