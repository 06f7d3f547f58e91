//! Running tasks against a contender and measuring their waits.

use super::*;

pub(crate) fn rand_u128() -> u128 {
    lock_runtime::store::LockToken::random().as_u128()
}

/// The result of one contender in one scenario.
pub(crate) struct Measured {
    pub(crate) scenario: String,
    pub(crate) lib: String,
    pub(crate) ops: u64,
    pub(crate) elapsed: Duration,
    pub(crate) waits: Vec<Duration>,
    /// For scenario rows that are not throughput (hand-off, memory growth).
    pub(crate) note: Option<String>,
    /// A hand-off's unit: the store's round trip, when not Redis's PING.
    pub(crate) round_trip: Option<Duration>,
    /// For rows run in rounds, each contender right after the floor: the
    /// median over the rounds of its throughput over the floor's in the
    /// same round (both met the same state of the store's disk).
    pub(crate) paired: Option<f64>,
    /// For rows run in rounds: each round's throughput over the floor's in
    /// that round, in the rounds' order (the same order for every row of
    /// the scenario, so two contenders compare round by round).
    pub(crate) rounds: Vec<f64>,
    /// Allocations the process made per section while the row ran.
    pub(crate) allocations: Option<f64>,
}

impl Measured {
    /// `ops` sections of `lib` in `scenario` over `elapsed`, with their
    /// sorted `waits`; no note, round trip or pairing.
    pub(crate) fn new(
        scenario: impl Into<String>,
        lib: impl Into<String>,
        ops: u64,
        elapsed: Duration,
        waits: Vec<Duration>,
    ) -> Measured {
        Measured {
            scenario: scenario.into(),
            lib: lib.into(),
            ops,
            elapsed,
            waits,
            note: None,
            round_trip: None,
            paired: None,
            rounds: Vec::new(),
            allocations: None,
        }
    }

    /// This row with `note` in place of its throughput.
    pub(crate) fn noted(mut self, note: String) -> Measured {
        self.note = Some(note);
        self
    }

    pub(crate) fn throughput(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// This run and `next` of the same contender as one: their sections,
    /// times and waits added up, allocations per section over both.
    pub(crate) fn joined(mut self, next: Measured) -> Measured {
        let sections = (self.ops + next.ops).max(1) as f64;
        self.allocations = match (self.allocations, next.allocations) {
            (Some(a), Some(b)) => Some((a * self.ops as f64 + b * next.ops as f64) / sections),
            _ => None,
        };
        self.ops += next.ops;
        self.elapsed += next.elapsed;
        self.waits.extend(next.waits);
        self.waits.sort_unstable();
        self
    }

    pub(crate) fn pct(&self, p: f64) -> Duration {
        percentile(&self.waits, p)
    }
}

pub(crate) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// `tasks` tasks, `ops` sections each, on distinct keys or one hot key.
pub(crate) async fn run_tasks(
    lib: &Lib,
    scenario: &str,
    name: &str,
    tasks: usize,
    ops: u64,
    hot: bool,
) -> Result<Measured, Error> {
    let run = rand_u128() as u32;
    measure_tasks(scenario, name, tasks, ops, |t| {
        let lib = lib.clone();
        let key = if hot {
            format!("bench:{run}:hot")
        } else {
            format!("bench:{run}:{t}")
        };
        async move {
            let mut waits = Vec::with_capacity(ops as usize);
            for _ in 0..ops {
                waits.push(lib.section(&key).await?);
            }
            Ok(waits)
        }
    })
    .await
}

/// Runs `tasks` tasks at once, task `t` being `task(t)`, which makes
/// `ops` sections and returns their waits: one row, timed from the first
/// spawn to the last task's end.
pub(crate) async fn measure_tasks<F, Fut>(
    scenario: &str,
    name: &str,
    tasks: usize,
    ops: u64,
    task: F,
) -> Result<Measured, Error>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = Result<Vec<Duration>, Error>> + Send + 'static,
{
    let started = Instant::now();
    let allocated = allocations::so_far();
    let handles: Vec<_> = (0..tasks).map(|t| tokio::spawn(task(t))).collect();
    let mut waits = Vec::new();
    for handle in handles {
        waits.extend(handle.await??);
    }
    let elapsed = started.elapsed();
    let allocated = allocations::so_far() - allocated;
    waits.sort_unstable();
    let sections = tasks as u64 * ops;
    let mut row = Measured::new(scenario, name, sections, elapsed, waits);
    row.allocations = Some(allocated as f64 / sections.max(1) as f64);
    Ok(row)
}

pub(crate) fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// How many slices a contender's round is cut into, run in turn with the
/// other contenders' slices: a slow spell of the machine, which moves one
/// run of 64 tasks on two cores by a fifth, then falls on every contender
/// of the round alike.
pub(crate) const SLICES: u64 = 3;

/// Each contender `rounds` times in `scenario`, interleaved: a round runs
/// each contender's `ops` in [`SLICES`] slices, in turn with the others'
/// slices, the order reversed every other slice so that a server that
/// slows down (or warms up) over the run favours none. A contender's
/// round counts all its slices. Keeps each contender's best round, with
/// `paired` the median over the rounds of its throughput over the floor's
/// (the first contender's) in the same round. Rows in the contenders'
/// order.
pub(crate) async fn interleaved(
    contenders: &[(&str, &Lib)],
    scenario: &str,
    tasks: usize,
    ops: u64,
    hot: bool,
    rounds: usize,
) -> Result<Vec<Measured>, Error> {
    let mut best: HashMap<&str, Measured> = HashMap::new();
    let mut ratios: HashMap<&str, Vec<f64>> = HashMap::new();
    let slice_ops = ops.div_ceil(SLICES).max(1);
    for round in 0..rounds {
        let mut this_round: HashMap<&str, Measured> = HashMap::new();
        for slice in 0..SLICES {
            let mut order: Vec<&(&str, &Lib)> = contenders.iter().collect();
            if (round as u64 * SLICES + slice) % 2 == 1 {
                order.reverse();
            }
            for &(name, lib) in order {
                let m = run_tasks(lib, scenario, name, tasks, slice_ops, hot).await?;
                match this_round.remove(name) {
                    Some(so_far) => this_round.insert(name, so_far.joined(m)),
                    None => this_round.insert(name, m),
                };
            }
        }
        let floor = contenders
            .first()
            .and_then(|(name, _)| this_round.get(name).map(Measured::throughput))
            .unwrap_or(0.0);
        for (name, m) in this_round {
            if floor > 0.0 {
                ratios.entry(name).or_default().push(m.throughput() / floor);
            }
            if best
                .get(name)
                .is_none_or(|b| m.throughput() > b.throughput())
            {
                best.insert(name, m);
            }
        }
    }
    let mut rows = Vec::new();
    for (at, (name, _)) in contenders.iter().enumerate() {
        if let Some(mut m) = best.remove(name) {
            // The floor is not paired with itself.
            if let Some(rounds) = ratios.remove(name).filter(|_| at > 0) {
                m.paired = Some(median(rounds.clone()));
                m.rounds = rounds;
            }
            rows.push(m);
        }
    }
    Ok(rows)
}

/// `, rounds LOW-HIGHx`: the spread of a row's per-round ratios, or
/// nothing for a row not run in rounds.
pub(crate) fn rounds_range(rounds: &[f64]) -> String {
    let low = rounds.iter().copied().reduce(f64::min);
    let high = rounds.iter().copied().reduce(f64::max);
    match (low, high) {
        (Some(low), Some(high)) => format!(", rounds {low:.2}-{high:.2}x"),
        _ => String::new(),
    }
}

/// The median of `values` (the mean of the middle two for an even count).
pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Row 1b, the user's shape: one task in this multi-thread runtime locking
/// and releasing one key over and over (default options), in `slice`-long
/// runs interleaved with the floor's on a key of its own, `pairs` times.
/// Each contender's row counts all its slices; `paired` is the median over
/// the pairs of its rate over the floor's in the same pair.
pub(crate) async fn run_user_shape(
    contenders: &[(&str, &Lib)],
    scenario: &str,
    pairs: usize,
    slice: Duration,
) -> Result<Vec<Measured>, Error> {
    let run = rand_u128() as u32;
    let mut totals: Vec<(u64, Duration, Vec<Duration>)> =
        vec![(0, Duration::ZERO, Vec::new()); contenders.len()];
    let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); contenders.len()];
    for pair in 0..pairs {
        let mut rates = vec![0.0; contenders.len()];
        // Every other pair in reverse: the slice a contender follows
        // moves its rate by up to a fifth on this machine.
        let mut order: Vec<usize> = (0..contenders.len()).collect();
        if pair % 2 == 1 {
            order.reverse();
        }
        for at in order {
            let (name, lib) = contenders[at];
            let key = format!("bench:{run}:user:{name}");
            let lib = (*lib).clone();
            // Its own task, as a handler's would be.
            let (ops, elapsed, waits) = tokio::spawn(async move {
                let started = Instant::now();
                let (mut ops, mut waits) = (0u64, Vec::new());
                while started.elapsed() < slice {
                    waits.push(lib.section(&key).await?);
                    ops += 1;
                }
                Ok::<_, Error>((ops, started.elapsed(), waits))
            })
            .await??;
            rates[at] = ops as f64 / elapsed.as_secs_f64();
            totals[at].0 += ops;
            totals[at].1 += elapsed;
            totals[at].2.extend(waits);
        }
        for (at, rate) in rates.iter().enumerate() {
            ratios[at].push(rate / rates[0]);
        }
    }
    let mut rows = Vec::new();
    for (at, (name, _)) in contenders.iter().enumerate() {
        let (ops, elapsed, mut waits) = std::mem::take(&mut totals[at]);
        waits.sort_unstable();
        let mut m = Measured::new(scenario, *name, ops, elapsed, waits);
        if at > 0 {
            m.rounds = std::mem::take(&mut ratios[at]);
            m.paired = Some(median(m.rounds.clone()));
        }
        rows.push(m);
    }
    Ok(rows)
}
