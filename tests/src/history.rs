//! Histories of locked bodies, written by soak workers, and the checker
//! that reads them back.
//!
//! A worker appends one line per event to a file of its own, flushed at
//! once, so a SIGKILL loses nothing already done:
//!
//! - `start key=K holder=H claim=C fencing=F at_us=T`: a body began,
//!   holding `K` alone (`C` = `x`), with a read share (`s`) or one of N
//!   permits (`pN`);
//! - `end key=K holder=H at_us=T outcome=O`: it ended; `T` is its last
//!   step (for a body cancelled by a lost lease or by its caller, the last
//!   step it took before), `O` is `released`, `lost`, `cancelled` or
//!   `error` (then with `error=E`, the `LockError` variant);
//! - `skipped key=K holder=H asked_us=A at_us=T`, `timeout ...` and
//!   `cancelled ...` (the same), `failed key=K holder=H error=E at_us=T`:
//!   an attempt that got no lock.
//!
//! A body holding several keys at once writes a `start` and an `end` line
//! per key, under one holder. `start` lines also say when their attempt
//! began (`asked_us`), or, for a body of several keys, since when its
//! leases may have been held (`held_from_us`: the attempt's beginning, as
//! one key may be granted long before the last). The runner appends `killed pid=P at_us=T` for each
//! worker it SIGKILLs, `T` just after the signal was sent (a body of that
//! worker with no `end` line may have acted until then, and no later: a
//! process runs none of its code once SIGKILL is pending), `frozen pid=P from_us=F to_us=T` for each it froze,
//! `cut pid=P from_us=F to_us=T` for each whose connections to the store
//! it black-holed, and `outage kind=K from_us=F to_us=T lossy=L
//! lost_until_us=U` for each fault of the store's own (a server
//! restarted); `lossy=true` if the store may lose granted leases in it (a
//! restart without persistence), and `U` (optional, `T` by default) until
//! when a lease granted or renewed may still be lost to it.
//! Times are microseconds of the wall clock, which every process on this
//! machine shares.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The wall clock now, in microseconds.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// How long after its process resumed a body may finish the step a
/// freeze interrupted (the resumed thread's wait for a core included).
pub const INTERRUPTED_STEP: Duration = Duration::from_millis(25);

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

/// Appends history lines to a file, each flushed as it is written.
#[derive(Debug)]
pub struct Recorder {
    file: std::sync::Mutex<std::fs::File>,
}

impl Recorder {
    /// Appends to `path`, creating it.
    pub fn open(path: &str) -> std::io::Result<Recorder> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Recorder {
            file: std::sync::Mutex::new(file),
        })
    }

    /// Writes one line.
    pub fn line(&self, line: &str) {
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        // One write per line: lines of several tasks never interleave.
        let _ = file.write_all(format!("{line}\n").as_bytes());
    }
}

/// One body that held a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The key.
    pub key: String,
    /// Who held it (`pid.task.n`).
    pub holder: String,
    /// What it claimed: `x` (alone), `s` (a read share), `p<N>` (one of N
    /// permits).
    pub claim: String,
    /// Its fencing token.
    pub fencing: u64,
    /// When the body began.
    pub start_us: u64,
    /// The earliest its lease may have been granted: `start_us`, or for a
    /// body of several keys, when its attempt began.
    pub held_from_us: u64,
    /// When it last acted; `None` if its process died first.
    pub end_us: Option<u64>,
    /// When it took its last step, if it said so before it was released
    /// (a process killed between the two died holding a lease but no
    /// longer acting).
    pub done_us: Option<u64>,
    /// How it ended: `released`, `lost`, `cancelled`, `error`; `died` with
    /// no end line.
    pub outcome: String,
}

/// A call that ended in an error other than a timed-out wait, or lost its
/// lease before its body began.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The key.
    pub key: String,
    /// The caller's pid.
    pub pid: String,
    /// The `LockError` variant.
    pub error: String,
    /// When the call returned.
    pub at_us: u64,
}

/// A fault of the store's own, as the runner made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outage {
    /// What was done (`server-frozen`, `leader-restarted`, …).
    pub kind: String,
    /// When it began.
    pub from_us: u64,
    /// When the store was whole again (as far as the runner knows).
    pub to_us: u64,
    /// Whether the store may lose leases it had granted in it.
    pub lossy: bool,
    /// Until when a lease granted or renewed may still be lost to it
    /// (its end, unless the fault lingers: a deposed leader answering as
    /// it resumes).
    pub lost_until_us: u64,
}

impl Grant {
    /// The pid of its holder.
    fn pid(&self) -> &str {
        self.holder.split('.').next().unwrap_or_default()
    }
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} by {} ({}) fencing {} from {} to {} ({})",
            self.key,
            self.holder,
            self.claim,
            self.fencing,
            self.start_us,
            match (self.end_us, self.done_us) {
                (Some(end), _) => end.to_string(),
                (None, Some(done)) => format!("{done} (its last step; then it died)"),
                (None, None) => "its death".to_owned(),
            },
            self.outcome
        )
    }
}

/// An attempt that waited on a key whose holder had stopped.
struct StoppedWait<'a> {
    attempt: &'a Attempt,
    grant: &'a Grant,
    /// When the holder died, froze or was cut off.
    stopped_us: u64,
    /// When the key should have been free: `stopped_us` and the bound.
    free_by: u64,
}

/// What a history says, read back.
#[derive(Debug, Default)]
pub struct History {
    /// Every body, in no particular order.
    pub grants: Vec<Grant>,
    /// Attempts that got no lock, by what came of them.
    pub refused: HashMap<String, u64>,
    /// SIGKILLed workers: pid and time.
    pub killed: HashMap<String, u64>,
    /// Frozen workers: pid, from, to.
    pub frozen: Vec<(String, u64, u64)>,
    /// Workers cut off from the store: pid, from, to.
    pub cut: Vec<(String, u64, u64)>,
    /// The store's own faults.
    pub outages: Vec<Outage>,
    /// Calls that ended in other errors than `Lost` and `Timeout`.
    pub failures: Vec<Failure>,
    /// Every attempt that said when it began: key, who, when it began, when
    /// it ended (its body's start, or its refusal).
    pub attempts: Vec<Attempt>,
}

/// One attempt at a key, as far as the history tells.
#[derive(Clone, Debug)]
pub struct Attempt {
    /// The key.
    pub key: String,
    /// Who asked (`pid.task.n`).
    pub holder: String,
    /// When it began.
    pub asked_us: u64,
    /// When it ended: its body began, or it was refused.
    pub ended_us: u64,
    /// `granted`, `skipped`, `timeout` or `cancelled`.
    pub outcome: String,
}

fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split(' ')
        .find_map(|part| part.strip_prefix(name)?.strip_prefix('='))
}

impl History {
    /// Reads the lines of one file (a worker's or the runner's).
    pub fn read(&mut self, text: &str) -> Result<(), String> {
        // Bodies begun and not yet ended, by key and holder.
        let mut open: HashMap<(String, String), usize> = HashMap::new();
        for line in text.lines().filter(|line| !line.is_empty()) {
            let kind = line.split(' ').next().unwrap_or_default();
            let get = |name: &str| {
                field(line, name).ok_or_else(|| format!("no `{name}` in the history line `{line}`"))
            };
            let number = |name: &str| {
                get(name)?
                    .parse::<u64>()
                    .map_err(|_| format!("`{name}` is not a number in `{line}`"))
            };
            match kind {
                "start" => {
                    if let Some(asked) = field(line, "asked_us") {
                        self.attempts.push(Attempt {
                            key: get("key")?.to_owned(),
                            holder: get("holder")?.to_owned(),
                            asked_us: asked
                                .parse()
                                .map_err(|_| format!("a bad asked_us in `{line}`"))?,
                            ended_us: number("at_us")?,
                            outcome: "granted".to_owned(),
                        });
                    }
                    open.insert(
                        (get("key")?.to_owned(), get("holder")?.to_owned()),
                        self.grants.len(),
                    );
                    self.grants.push(Grant {
                        key: get("key")?.to_owned(),
                        holder: get("holder")?.to_owned(),
                        claim: field(line, "claim").unwrap_or("x").to_owned(),
                        fencing: number("fencing")?,
                        start_us: number("at_us")?,
                        held_from_us: match field(line, "held_from_us") {
                            Some(_) => number("held_from_us")?,
                            None => number("at_us")?,
                        },
                        end_us: None,
                        done_us: None,
                        outcome: "died".to_owned(),
                    });
                }
                "done" => {
                    let at = *open
                        .get(&(get("key")?.to_owned(), get("holder")?.to_owned()))
                        .ok_or_else(|| format!("a done with no start: `{line}`"))?;
                    self.grants[at].done_us = Some(number("at_us")?);
                }
                "end" => {
                    let at = open
                        .remove(&(get("key")?.to_owned(), get("holder")?.to_owned()))
                        .ok_or_else(|| format!("an end with no start: `{line}`"))?;
                    self.grants[at].end_us = Some(number("at_us")?);
                    self.grants[at].outcome = get("outcome")?.to_owned();
                    if self.grants[at].outcome == "error" {
                        self.failure(line, &self.grants[at].holder.clone())?;
                    }
                }
                "killed" => {
                    self.killed.insert(get("pid")?.to_owned(), number("at_us")?);
                }
                "outage" => {
                    let to_us = number("to_us")?;
                    let lost_until_us = match field(line, "lost_until_us") {
                        Some(_) => number("lost_until_us")?,
                        None => to_us,
                    };
                    self.outages.push(Outage {
                        kind: get("kind")?.to_owned(),
                        from_us: number("from_us")?,
                        to_us,
                        lossy: get("lossy")? == "true",
                        lost_until_us,
                    });
                }
                "frozen" | "cut" => {
                    let stall = (get("pid")?.to_owned(), number("from_us")?, number("to_us")?);
                    if kind == "frozen" {
                        self.frozen.push(stall);
                    } else {
                        self.cut.push(stall);
                    }
                }
                "skipped" | "timeout" | "cancelled" | "failed" => {
                    *self.refused.entry(kind.to_owned()).or_default() += 1;
                    if kind == "failed" {
                        self.failure(line, get("holder")?)?;
                    }
                    if let (Some(asked), Some(holder)) =
                        (field(line, "asked_us"), field(line, "holder"))
                    {
                        self.attempts.push(Attempt {
                            key: get("key")?.to_owned(),
                            holder: holder.to_owned(),
                            asked_us: asked
                                .parse()
                                .map_err(|_| format!("a bad asked_us in `{line}`"))?,
                            ended_us: number("at_us")?,
                            outcome: kind.to_owned(),
                        });
                    }
                }
                _ => return Err(format!("an unknown history line `{line}`")),
            }
        }
        Ok(())
    }

    /// Notes the error a call of `holder` ended in, from its `line`.
    fn failure(&mut self, line: &str, holder: &str) -> Result<(), String> {
        let get = |name: &str| {
            field(line, name).ok_or_else(|| format!("no `{name}` in the history line `{line}`"))
        };
        self.failures.push(Failure {
            key: get("key")?.to_owned(),
            pid: holder.split('.').next().unwrap_or_default().to_owned(),
            error: get("error")?.to_owned(),
            at_us: get("at_us")?
                .parse()
                .map_err(|_| format!("`at_us` is not a number in `{line}`"))?,
        });
        Ok(())
    }

    /// When a grant's body last may have acted: its end, its last step,
    /// or its process's death (or `run_end`, if the process was not
    /// killed).
    fn end_of(&self, grant: &Grant, run_end: u64) -> u64 {
        grant
            .end_us
            .or(grant.done_us)
            .unwrap_or_else(|| self.killed.get(grant.pid()).copied().unwrap_or(run_end))
    }

    /// Checks exclusion and fencing per key; every violation found, with
    /// the records involved. A body claiming the key alone acts with no
    /// other; read shares act together; at most N bodies hold permits of
    /// N. Fencing tokens rise in the order bodies began across every pair
    /// that excludes each other (one of them alone). `run_end` bounds
    /// bodies whose process was neither killed nor finished.
    ///
    /// Two overlaps are allowed, both documented. After a lossy outage
    /// (the store lost leases it had granted): a body granted before it
    /// beside one granted after, as long as the first stops within `lease`
    /// (the ttl and the store's recovery) of the outage's end: told at its
    /// next renewal that reaches the store, or ending before it reaches
    /// the store again, untold. And a body frozen mid-step, which finishes
    /// that step as its process resumes: within [`INTERRUPTED_STEP`] of
    /// the resume, after which it must have been stopped.
    /// Fencing tokens must rise across both all the same.
    pub fn violations(&self, run_end: u64, lease: Duration) -> Vec<String> {
        let mut found = Vec::new();
        for grants in self.by_key().values() {
            // The bodies still acting when the next one began.
            let mut acting: Vec<(&Grant, u64)> = Vec::new();
            for &grant in grants.iter() {
                acting.retain(|&(_, until)| until > grant.start_us);
                if let Some((other, until)) = refused_by(&acting, grant)
                    && !self.lost_with_the_store(other, grant, micros(lease))
                    && !self.interrupted_by_a_freeze(other, grant)
                {
                    found.push(format!(
                        "overlap by {} µs: {other} / {grant}",
                        until - grant.start_us
                    ));
                }
                acting.push((grant, self.end_of(grant, run_end)));
            }
            for (i, before) in grants.iter().enumerate() {
                for after in &grants[i + 1..] {
                    let excludes = before.claim == "x" || after.claim == "x";
                    if excludes && after.fencing <= before.fencing {
                        found.push(format!("fencing not increasing: {before} then {after}"));
                    }
                }
            }
        }
        found
    }

    /// The grants of each key, in the order their bodies began.
    fn by_key(&self) -> BTreeMap<&str, Vec<&Grant>> {
        let mut by_key: BTreeMap<&str, Vec<&Grant>> = BTreeMap::new();
        for grant in &self.grants {
            by_key.entry(&grant.key).or_default().push(grant);
        }
        for grants in by_key.values_mut() {
            grants.sort_by_key(|grant| grant.start_us);
        }
        by_key
    }

    /// Whether `before`'s lease may have been lost by the store in a lossy
    /// outage begun before `after` was granted (the lease granted before
    /// the outage's end, though its body may have begun after), and
    /// `before` stopped (told, ended, or its process died) within `lease`
    /// of the outage's end.
    fn lost_with_the_store(&self, before: &Grant, after: &Grant, lease: u64) -> bool {
        self.outages.iter().any(|outage| {
            outage.lossy
                && before.held_from_us < outage.lost_until_us
                && after.start_us > outage.from_us
                && self.end_of(before, u64::MAX) <= outage.lost_until_us + lease
        })
    }

    /// Whether `before`'s last step is the one a freeze of its process
    /// interrupted, finished as the process resumed: it was frozen while
    /// `before`'s body ran, `after` began during the freeze (the lease
    /// having ended meanwhile), and `before` took no step later than
    /// [`INTERRUPTED_STEP`] after the process resumed, and was stopped
    /// then (`lost`, or `cancelled` by its caller). Code a process was
    /// running when it stopped runs on when it resumes, before any
    /// `.await` where a lost lease could cancel it (the guarantees'
    /// "Process pauses"); fencing tokens must rise across it all the same.
    fn interrupted_by_a_freeze(&self, before: &Grant, after: &Grant) -> bool {
        let Some(end) = before.end_us else {
            return false;
        };
        matches!(before.outcome.as_str(), "lost" | "cancelled")
            && self.frozen.iter().any(|(pid, from, to)| {
                pid == before.pid()
                    && before.start_us < *from
                    && after.start_us > *from
                    && end >= *from
                    && end <= to + micros(INTERRUPTED_STEP)
            })
    }

    /// Keys left unobtainable too long: after a holder of a key (claimed
    /// alone) died or froze, every attempt at the key until the next body
    /// began must end (refused, or granted) by when it began or the key
    /// was free again (`bound` after the death or freeze: the ttl and the
    /// store's recovery), whichever is later, and `tolerance`. Attempts of
    /// a process frozen meanwhile, and attempts during a fault of the
    /// store's own or within `bound` after it, are not held to it.
    pub fn unavailable(&self, bound: Duration, tolerance: Duration) -> Vec<String> {
        let tolerance = micros(tolerance);
        self.waits_on_stopped_holders(bound)
            .into_iter()
            .filter(|wait| {
                let attempt = wait.attempt;
                attempt.ended_us > attempt.asked_us.max(wait.free_by) + tolerance
            })
            .map(|wait| {
                let attempt = wait.attempt;
                format!(
                    "{} unobtainable: an attempt by {} asked at {} ended ({}) at {}, \
                     though {} stopped at {} (free by {})",
                    attempt.key,
                    attempt.holder,
                    attempt.asked_us,
                    attempt.outcome,
                    attempt.ended_us,
                    wait.grant,
                    wait.stopped_us,
                    wait.free_by
                )
            })
            .collect()
    }

    /// Keys left unobtainable though free: a wait at a key claimed alone
    /// (granted in the end, or timed out) that went on more than
    /// `tolerance` past the moment the key was free, that is past its
    /// start, `bound` (the ttl and the store's recovery) past the end of
    /// every body of the key begun before it ended (its death, for a
    /// process killed), and `bound` past the healing of every fault of the
    /// store's own begun before it ended. Attempts of a process frozen or
    /// cut off meanwhile are not held to it.
    pub fn unobtainable_when_free(&self, bound: Duration, tolerance: Duration) -> Vec<String> {
        let (bound, tolerance) = (micros(bound), micros(tolerance));
        let by_key = self.by_key();
        let mut found = Vec::new();
        for attempt in &self.attempts {
            if !matches!(attempt.outcome.as_str(), "granted" | "timeout")
                || self.frozen_during(attempt)
            {
                continue;
            }
            let Some(grants) = by_key.get(attempt.key.as_str()) else {
                continue;
            };
            if grants.iter().any(|grant| grant.claim != "x") {
                continue;
            }
            // Its own body begins when it ends: not among them.
            let held = grants
                .iter()
                .filter(|grant| grant.start_us < attempt.ended_us)
                .map(|grant| self.end_of(grant, u64::MAX).saturating_add(bound));
            let healed = self
                .outages
                .iter()
                .filter(|outage| outage.from_us < attempt.ended_us)
                .map(|outage| outage.to_us.saturating_add(bound));
            let free_from = held.chain(healed).fold(attempt.asked_us, u64::max);
            if attempt.ended_us > free_from.saturating_add(tolerance) {
                found.push(format!(
                    "{} unobtainable though free: an attempt by {} asked at {} ended ({}) at {}, \
                     the key free from {}",
                    attempt.key,
                    attempt.holder,
                    attempt.asked_us,
                    attempt.outcome,
                    attempt.ended_us,
                    free_from
                ));
            }
        }
        found
    }

    /// The attempts [`unavailable`](Self::unavailable) holds to its bound:
    /// each attempt at a key claimed alone that ended after the key's
    /// holder stopped (died, froze, was cut off) and no later than the
    /// next body began, outside the store's faults and its own process's
    /// stalls.
    fn waits_on_stopped_holders(&self, bound: Duration) -> Vec<StoppedWait<'_>> {
        let bound = micros(bound);
        let mut waits = Vec::new();
        for (key, grants) in self.by_key() {
            if grants.iter().any(|grant| grant.claim != "x") {
                continue;
            }
            for (i, &grant) in grants.iter().enumerate() {
                let next = grants.get(i + 1).map_or(u64::MAX, |next| next.start_us);
                for stopped_us in self.blocked_at(grant, next) {
                    for attempt in self.attempts.iter().filter(|a| a.key == *key) {
                        let waited = attempt.ended_us > stopped_us && attempt.ended_us <= next;
                        let outage = self.outages.iter().any(|outage| {
                            outage.from_us < attempt.ended_us
                                && outage.to_us + bound > attempt.asked_us
                        });
                        if waited && !outage && !self.frozen_during(attempt) {
                            waits.push(StoppedWait {
                                attempt,
                                grant,
                                stopped_us,
                                free_by: stopped_us + bound,
                            });
                        }
                    }
                }
            }
        }
        waits
    }

    /// When `grant`'s holder stopped while holding, before `next` began:
    /// killed with no end line, or frozen or cut off while its body was
    /// acting.
    fn blocked_at(&self, grant: &Grant, next: u64) -> Vec<u64> {
        let mut at = Vec::new();
        if grant.end_us.is_none()
            && let Some(&killed) = self.killed.get(grant.pid())
            && killed >= grant.start_us
            && killed < next
        {
            at.push(killed);
        }
        let acting_until = grant.end_us.unwrap_or(u64::MAX).saturating_add(50_000);
        for (pid, from, _) in self.frozen.iter().chain(&self.cut) {
            if pid == grant.pid()
                && *from >= grant.start_us
                && *from <= acting_until
                && *from < next
            {
                at.push(*from);
            }
        }
        at
    }

    /// Whether `attempt`'s process was frozen or cut off while it waited.
    fn frozen_during(&self, attempt: &Attempt) -> bool {
        let pid = attempt.holder.split('.').next().unwrap_or_default();
        self.frozen
            .iter()
            .chain(&self.cut)
            .any(|(frozen, from, to)| {
                frozen == pid && *from < attempt.ended_us && *to > attempt.asked_us
            })
    }

    /// Calls that ended in an error the guarantees ("What a call ends in
    /// under a fault") do not list for the fault at hand. `Lost` and
    /// `Timeout` are listed for any call (a lease that could not be
    /// renewed in time, a wait that ran out); `Store` (the store
    /// unreachable or failing) only during a fault of the store's own, or
    /// while the caller's process is cut off or frozen, or within `bound`
    /// (a lease) after; any other error is a bug.
    pub fn unlisted_errors(&self, bound: Duration) -> Vec<String> {
        let bound = micros(bound);
        let within = |from: u64, to: u64, at: u64| from <= at && at <= to + bound;
        self.failures
            .iter()
            .filter(|failure| {
                let faulted = self
                    .outages
                    .iter()
                    .any(|outage| within(outage.from_us, outage.to_us, failure.at_us))
                    || self.frozen.iter().chain(&self.cut).any(|(pid, from, to)| {
                        *pid == failure.pid && within(*from, *to, failure.at_us)
                    });
                !(failure.error == "Lost" || failure.error == "Store" && faulted)
            })
            .map(|failure| {
                format!(
                    "an unlisted error: {} on {} by pid {} at {}",
                    failure.error, failure.key, failure.pid, failure.at_us
                )
            })
            .collect()
    }

    /// Per key: grants, losses, bodies whose process died, the longest
    /// time between one body's end and the next one's start, and the
    /// smallest between a lost body's last step and the start of the next
    /// body that excludes it; then refusals, faults of each kind, errors
    /// of each kind, and the run's longest gap and smallest margin. The
    /// overlaps allowed after a lossy outage (see
    /// [`violations`](Self::violations), with the same `lease`) are
    /// counted apart, not as margins.
    pub fn summary(&self, run_end: u64, lease: Duration) -> String {
        let mut lines = Vec::new();
        let (mut longest_gap, mut smallest_margin) = (0, None::<i64>);
        let mut lost_with_the_store = Vec::new();
        let mut interrupted = Vec::new();
        for (key, grants) in self.by_key() {
            let gap = grants
                .windows(2)
                .map(|pair| {
                    pair[1]
                        .start_us
                        .saturating_sub(self.end_of(pair[0], run_end))
                })
                .max()
                .unwrap_or(0);
            let lost = grants.iter().filter(|g| g.outcome == "lost").count();
            let died = grants.iter().filter(|g| g.outcome == "died").count();
            // From a lost body's last step to the next body's start, when
            // the two exclude each other.
            let excluding = grants
                .windows(2)
                .filter(|pair| pair[0].claim == "x" || pair[1].claim == "x");
            let (allowed, kept): (Vec<_>, Vec<_>) = excluding.partition(|pair| {
                pair[1].start_us < self.end_of(pair[0], run_end)
                    && self.lost_with_the_store(pair[0], pair[1], micros(lease))
            });
            let (stepped, kept): (Vec<_>, Vec<_>) = kept.into_iter().partition(|pair| {
                pair[1].start_us < self.end_of(pair[0], run_end)
                    && self.interrupted_by_a_freeze(pair[0], pair[1])
            });
            interrupted.extend(stepped.iter().map(|pair| {
                format!(
                    "allowed, a step a freeze interrupted: {} / {}",
                    pair[0], pair[1]
                )
            }));
            let kept = kept.into_iter().filter(|pair| pair[0].outcome == "lost");
            lost_with_the_store.extend(allowed.iter().map(|pair| {
                format!(
                    "allowed, the store lost the first's lease: {} / {}",
                    pair[0], pair[1]
                )
            }));
            let margin = kept
                .map(|pair| pair[1].start_us as i64 - self.end_of(pair[0], run_end) as i64)
                .min();
            longest_gap = longest_gap.max(gap);
            smallest_margin = match (smallest_margin, margin) {
                (Some(smallest), Some(margin)) => Some(smallest.min(margin)),
                (smallest, margin) => smallest.or(margin),
            };
            let margin = margin.map_or_else(
                || "no lost body followed".to_owned(),
                |margin| {
                    format!(
                        "smallest margin after a loss {:.0} ms",
                        margin as f64 / 1000.0
                    )
                },
            );
            lines.push(format!(
                "{key}: {} grants, {lost} lost, {died} died holding, longest gap {:.0} ms, {margin}",
                grants.len(),
                gap as f64 / 1000.0
            ));
        }
        let mut refused: Vec<_> = self.refused.iter().collect();
        refused.sort_unstable();
        let outages = tally(self.outages.iter().map(|outage| outage.kind.as_str()));
        let errors = tally(self.failures.iter().map(|failure| failure.error.as_str()));
        lines.push(format!(
            "refused: {refused:?}; workers killed: {}, frozen: {}, cut off: {}; \
             store faults: {outages:?}; errors: {errors:?}",
            self.killed.len(),
            self.frozen.len(),
            self.cut.len(),
        ));
        // The longest an attempt waited on a stopped holder's key, from the
        // stop (or its asking, if later) to its end.
        let longest_unavailable = self
            .waits_on_stopped_holders(lease)
            .iter()
            .map(|wait| {
                let attempt = wait.attempt;
                attempt.ended_us - attempt.asked_us.max(wait.stopped_us).min(attempt.ended_us)
            })
            .max();
        lines.push(format!(
            "longest wait on a key whose holder died, froze or was cut off: {}",
            longest_unavailable.map_or_else(
                || "none (no attempt waited on one)".to_owned(),
                |waited| format!("{:.0} ms", waited as f64 / 1000.0)
            )
        ));
        lines.push(format!(
            "in all: {} bodies, longest gap {:.0} ms, smallest margin after a loss {}, \
             overlaps allowed after the store lost leases: {}, after a step a freeze \
             interrupted: {}",
            self.grants.len(),
            longest_gap as f64 / 1000.0,
            smallest_margin.map_or_else(
                || "none (no loss followed)".to_owned(),
                |margin| format!("{:.0} ms", margin as f64 / 1000.0)
            ),
            lost_with_the_store.len(),
            interrupted.len()
        ));
        lines.extend(lost_with_the_store);
        lines.extend(interrupted);
        lines.join("\n")
    }
}

/// How many times each name occurs, by name.
fn tally<'a>(names: impl Iterator<Item = &'a str>) -> Vec<(&'a str, usize)> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for name in names {
        *counts.entry(name).or_default() += 1;
    }
    counts.into_iter().collect()
}

/// The body among `acting` that `grant` may not act beside, if any, and
/// until when it acts: anything beside a body alone; a share beside
/// anything but shares; a permit beside another claim, or beside as many
/// permits as there are.
fn refused_by<'a>(acting: &[(&'a Grant, u64)], grant: &Grant) -> Option<(&'a Grant, u64)> {
    let other_kind = acting
        .iter()
        .find(|(other, _)| grant.claim == "x" || other.claim != grant.claim);
    if let Some(&(other, until)) = other_kind {
        return Some((other, until));
    }
    let limit: usize = grant.claim.strip_prefix('p')?.parse().ok()?;
    (acting.len() >= limit).then(|| acting[acting.len() - limit])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The ttl and recovery the tests' lossy outages allow.
    const LEASE: Duration = Duration::from_micros(100);

    fn history(text: &str) -> History {
        let mut history = History::default();
        history.read(text).unwrap();
        history
    }

    #[test]
    fn bodies_one_after_another_with_rising_tokens_pass() {
        let h = history(
            "start key=a holder=1.0.0 fencing=5 at_us=100\n\
             end key=a holder=1.0.0 at_us=200 outcome=released\n\
             start key=a holder=2.0.0 fencing=7 at_us=210\n\
             end key=a holder=2.0.0 at_us=300 outcome=lost\n\
             start key=b holder=2.1.0 fencing=1 at_us=150\n",
        );
        assert_eq!(h.violations(1_000, LEASE), Vec::<String>::new());
    }

    #[test]
    fn an_overlap_and_a_token_going_back_are_found() {
        let h = history(
            "start key=a holder=1.0.0 fencing=5 at_us=100\n\
             start key=a holder=2.0.0 fencing=4 at_us=150\n\
             end key=a holder=2.0.0 at_us=160 outcome=released\n\
             end key=a holder=1.0.0 at_us=200 outcome=released\n",
        );
        let found = h.violations(1_000, LEASE);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].starts_with("overlap by 50 µs"), "{found:?}");
        assert!(found[1].starts_with("fencing not increasing"), "{found:?}");
    }

    #[test]
    fn a_killed_holder_counts_until_its_death() {
        let text = "start key=a holder=1.0.0 fencing=5 at_us=100\n\
                    start key=a holder=2.0.0 fencing=6 at_us=400\n";
        let mut h = history(text);
        // Not killed: it may have acted until the run's end.
        assert_eq!(h.violations(1_000, LEASE).len(), 1);
        h.read("killed pid=1 at_us=300\n").unwrap();
        assert_eq!(h.violations(1_000, LEASE), Vec::<String>::new());
        h.killed.insert("1".to_owned(), 450);
        assert_eq!(h.violations(1_000, LEASE).len(), 1);
    }

    #[test]
    fn a_holder_killed_after_its_last_step_counts_until_that_step() {
        let text = "start key=a holder=1.0.0 fencing=5 at_us=100\n\
                    start key=a holder=2.0.0 fencing=6 at_us=250\n\
                    killed pid=1 at_us=300\n";
        // Killed after the next body began: it may have acted until then.
        assert_eq!(history(text).violations(1_000, LEASE).len(), 1);
        // Its body had taken its last step before (its release was under
        // way): no overlap.
        let done = format!("{text}done key=a holder=1.0.0 at_us=200\n");
        assert_eq!(
            history(&done).violations(1_000, LEASE),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_wait_on_a_free_key_is_found_once_the_store_healed() {
        let bound = Duration::from_micros(100);
        let tolerance = Duration::from_micros(50);
        // Released at 200, a fault from 300 to 400: the key is free from
        // 500; a wait granted by 550 passes.
        let text = "start key=a holder=1.0.0 fencing=5 at_us=100\n\
                    end key=a holder=1.0.0 at_us=200 outcome=released\n\
                    outage kind=restarted from_us=300 to_us=400 lossy=false\n\
                    start key=a holder=2.0.0 fencing=6 asked_us=150 at_us=550\n";
        let h = history(text);
        assert_eq!(
            h.unobtainable_when_free(bound, tolerance),
            Vec::<String>::new()
        );
        // Granted at 900: 400 µs after the key was free.
        let late = history(&text.replace("at_us=550", "at_us=900"));
        let found = late.unobtainable_when_free(bound, tolerance);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("free from 500"), "{found:?}");
        // A wait that timed out on a key another body held all along.
        let held = "start key=b holder=1.0.0 fencing=5 at_us=100\n\
                    timeout key=b holder=2.0.0 asked_us=150 at_us=900\n";
        assert_eq!(
            history(held).unobtainable_when_free(bound, tolerance),
            Vec::<String>::new()
        );
        // Its process frozen while it waited: not held to it.
        let frozen = format!(
            "{}frozen pid=2 from_us=600 to_us=800\n",
            text.replace("at_us=550", "at_us=900")
        );
        assert_eq!(
            history(&frozen).unobtainable_when_free(bound, tolerance),
            Vec::<String>::new()
        );
    }

    #[test]
    fn bad_lines_are_errors_naming_them() {
        let mut h = History::default();
        let err = h.read("start key=a holder=1.0.0 at_us=1\n").unwrap_err();
        assert!(err.contains("fencing") && err.contains("key=a"), "{err}");
        let err = h
            .read("end key=a holder=9 at_us=1 outcome=released\n")
            .unwrap_err();
        assert!(err.contains("no start"), "{err}");
    }

    #[test]
    fn shares_act_together_and_permits_up_to_their_limit() {
        let ok = history(
            "start key=r holder=1.0.0 claim=s fencing=1 at_us=100\n\
             start key=r holder=2.0.0 claim=s fencing=2 at_us=110\n\
             end key=r holder=1.0.0 at_us=200 outcome=released\n\
             end key=r holder=2.0.0 at_us=210 outcome=released\n\
             start key=r holder=3.0.0 claim=x fencing=3 at_us=220\n\
             end key=r holder=3.0.0 at_us=300 outcome=released\n\
             start key=p holder=1.1.0 claim=p2 fencing=9 at_us=100\n\
             start key=p holder=2.1.0 claim=p2 fencing=8 at_us=110\n",
        );
        assert_eq!(ok.violations(1_000, LEASE), Vec::<String>::new());
        let bad = history(
            "start key=r holder=1.0.0 claim=s fencing=1 at_us=100\n\
             start key=r holder=3.0.0 claim=x fencing=3 at_us=150\n\
             start key=p holder=1.1.0 claim=p2 fencing=7 at_us=100\n\
             start key=p holder=2.1.0 claim=p2 fencing=8 at_us=110\n\
             start key=p holder=3.1.0 claim=p2 fencing=9 at_us=120\n",
        );
        let found = bad.violations(1_000, LEASE);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.iter().all(|f| f.starts_with("overlap")), "{found:?}");
    }

    #[test]
    fn a_key_left_blocked_past_its_bound_after_a_death_is_found() {
        let text = "start key=a holder=1.0.0 fencing=5 asked_us=0 at_us=100\n\
                    killed pid=1 at_us=1000\n\
                    skipped key=a holder=2.0.0 asked_us=1200 at_us=1210\n\
                    start key=a holder=3.0.0 fencing=6 asked_us=1100 at_us=3000\n";
        let h = history(text);
        // Free 1 000 µs after the death, 500 µs to spare: the waiter that
        // asked at 1 100 should have had it by 2 500.
        let found = h.unavailable(Duration::from_micros(1_000), Duration::from_micros(500));
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("3.0.0 asked at 1100 ended (granted) at 3000"),
            "{found:?}"
        );
        let generous = h.unavailable(Duration::from_micros(2_000), Duration::from_micros(500));
        assert_eq!(generous, Vec::<String>::new());
    }

    #[test]
    fn a_body_of_several_keys_is_one_holder_on_each() {
        let h = history(
            "start key=a holder=1.0.0 fencing=5 at_us=100\n\
             start key=b holder=1.0.0 fencing=3 at_us=100\n\
             end key=a holder=1.0.0 at_us=200 outcome=released\n\
             end key=b holder=1.0.0 at_us=200 outcome=released\n\
             start key=b holder=2.0.0 fencing=4 at_us=150\n",
        );
        assert_eq!(h.grants.len(), 3);
        let found = h.violations(1_000, LEASE);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("overlap by 50 µs: b by 1.0.0"),
            "{found:?}"
        );
    }

    #[test]
    fn after_a_lossy_outage_only_a_holder_stopped_in_time_may_overlap() {
        let text = "start key=a holder=1.0.0 fencing=5 at_us=100\n\
                    outage kind=data-dropped from_us=200 to_us=210 lossy=true\n\
                    start key=a holder=2.0.0 fencing=6 at_us=250\n\
                    end key=a holder=1.0.0 at_us=300 outcome=lost\n";
        assert_eq!(history(text).violations(1_000, LEASE), Vec::<String>::new());
        // Stopped 190 µs after the outage: later than the lease allows.
        let late = text.replace("at_us=300 outcome=lost", "at_us=400 outcome=lost");
        assert_eq!(history(&late).violations(1_000, LEASE).len(), 1);
        // Ended untold (it could not reach the store again), in time.
        let untold = text.replace("outcome=lost", "outcome=released");
        assert_eq!(
            history(&untold).violations(1_000, LEASE),
            Vec::<String>::new()
        );
        // A process that never ended the body, not killed: past the lease.
        let on = text.replace("end key=a holder=1.0.0 at_us=300 outcome=lost\n", "");
        assert_eq!(history(&on).violations(1_000, LEASE).len(), 1);
        // An outage that loses nothing excuses nothing.
        let kept = text.replace("lossy=true", "lossy=false");
        assert_eq!(history(&kept).violations(1_000, LEASE).len(), 1);
        // Tokens must rise across it all the same.
        let back = text.replace("fencing=6", "fencing=4");
        let found = history(&back).violations(1_000, LEASE);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("fencing not increasing"), "{found:?}");
    }

    #[test]
    fn a_body_of_several_keys_may_begin_after_the_outage_that_lost_its_first_lease() {
        // Its first key granted before the outage, its second after: its
        // body begins after the outage, and stops at its next renewal.
        let text = "outage kind=data-dropped from_us=200 to_us=210 lossy=true\n\
                    start key=a holder=1.0.0 fencing=5 held_from_us=100 at_us=230\n\
                    start key=b holder=1.0.0 fencing=3 held_from_us=100 at_us=230\n\
                    start key=a holder=2.0.0 fencing=6 at_us=250\n\
                    end key=a holder=1.0.0 at_us=300 outcome=lost\n\
                    end key=b holder=1.0.0 at_us=300 outcome=lost\n";
        assert_eq!(history(text).violations(1_000, LEASE), Vec::<String>::new());
        // Asked after the outage: its leases were granted after it too.
        let after = text.replace("held_from_us=100", "held_from_us=215");
        let found = history(&after).violations(1_000, LEASE);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("overlap by 50 µs: a by 1.0.0"),
            "{found:?}"
        );
    }

    #[test]
    fn backend_errors_are_listed_only_during_a_fault() {
        let h = history(
            "failed key=a holder=1.0.0 error=Store at_us=100\n\
             outage kind=server-frozen from_us=1000 to_us=2000 lossy=false\n\
             failed key=a holder=1.0.1 error=Store at_us=1500\n\
             failed key=a holder=1.0.2 error=Store at_us=2050\n\
             cut pid=2 from_us=3000 to_us=4000\n\
             start key=a holder=2.0.0 fencing=1 at_us=2900\n\
             end key=a holder=2.0.0 at_us=3500 outcome=error error=Store\n\
             failed key=a holder=3.0.0 error=Store at_us=3500\n\
             failed key=a holder=1.0.3 error=InvalidKey at_us=1500\n",
        );
        let found = h.unlisted_errors(Duration::from_micros(100));
        assert_eq!(
            found,
            [
                "an unlisted error: Store on a by pid 1 at 100",
                "an unlisted error: Store on a by pid 3 at 3500",
                "an unlisted error: InvalidKey on a by pid 1 at 1500",
            ],
        );
    }

    /// A lossy fault that lingers past its end (a deposed leader answering
    /// as it resumes) may lose a lease granted after it ended, until its
    /// `lost_until_us`; not one granted later.
    #[test]
    fn a_lingering_lossy_fault_allows_an_overlap_granted_just_after_it() {
        let run = |first_at: u64| {
            let text = format!(
                "outage kind=leader-frozen from_us=1000 to_us=2000 lossy=true lost_until_us=3000\n\
                 start key=a holder=1.0.0 fencing=5 at_us={first_at}\n\
                 start key=a holder=2.0.0 fencing=6 at_us={}\n\
                 end key=a holder=2.0.0 at_us=9000 outcome=released\n\
                 end key=a holder=1.0.0 at_us={} outcome=lost\n",
                first_at + 50,
                first_at + 100
            );
            history(&text).violations(10_000, LEASE)
        };
        assert!(run(2500).is_empty(), "{:?}", run(2500));
        assert_eq!(run(3500).len(), 1, "granted after the fault's reach");
    }

    /// A body frozen mid-step finishes that step as its process resumes,
    /// after its lease ended and the next holder began: allowed, once, if
    /// it is then stopped; a step later than that, or a body that ran to
    /// its end, is an overlap.
    #[test]
    fn a_step_a_freeze_interrupted_may_end_as_the_process_resumes_and_no_later() {
        let run = |end: u64, outcome: &str| {
            let text = format!(
                "start key=a holder=1.0.0 fencing=5 at_us=100\n\
                 frozen pid=1 from_us=1000 to_us=50000\n\
                 start key=a holder=2.0.0 fencing=6 at_us=2000\n\
                 end key=a holder=2.0.0 at_us=3000 outcome=released\n\
                 end key=a holder=1.0.0 at_us={end} outcome={outcome}\n"
            );
            history(&text).violations(60_000, LEASE)
        };
        assert!(run(50_040, "lost").is_empty(), "{:?}", run(50_040, "lost"));
        assert!(run(49_000, "cancelled").is_empty());
        // A step well after the resume: the body ran on.
        assert_eq!(run(80_000, "lost").len(), 1);
        // Ran to its end and released: never told.
        assert_eq!(run(50_040, "released").len(), 1);
        // Fencing must still rise.
        let text = "start key=a holder=1.0.0 fencing=7 at_us=100\n\
                    frozen pid=1 from_us=1000 to_us=50000\n\
                    start key=a holder=2.0.0 fencing=6 at_us=2000\n\
                    end key=a holder=2.0.0 at_us=3000 outcome=released\n\
                    end key=a holder=1.0.0 at_us=50040 outcome=lost\n";
        let found = history(text).violations(60_000, LEASE);
        assert!(
            found.len() == 1 && found[0].starts_with("fencing"),
            "{found:?}"
        );
    }

    #[test]
    fn a_holder_cut_off_blocks_its_key_as_a_frozen_one_does() {
        let text = "start key=a holder=1.0.0 fencing=5 asked_us=0 at_us=100\n\
                    cut pid=1 from_us=1000 to_us=5000\n\
                    end key=a holder=1.0.0 at_us=1500 outcome=lost\n\
                    start key=a holder=3.0.0 fencing=6 asked_us=1100 at_us=3000\n";
        let found = history(text).unavailable(Duration::from_micros(1_000), Duration::ZERO);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].contains("free by 2000"), "{found:?}");
    }
}
