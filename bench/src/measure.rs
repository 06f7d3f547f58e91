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
    let started = Instant::now();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let lib = lib.clone();
        let key = if hot {
            format!("bench:{run}:hot")
        } else {
            format!("bench:{run}:{t}")
        };
        handles.push(tokio::spawn(async move {
            let mut waits = Vec::with_capacity(ops as usize);
            for _ in 0..ops {
                waits.push(lib.section(&key).await?);
            }
            Ok::<_, Error>(waits)
        }));
    }
    let mut waits = Vec::new();
    for handle in handles {
        waits.extend(handle.await??);
    }
    let elapsed = started.elapsed();
    waits.sort_unstable();
    Ok(Measured::new(
        scenario,
        name,
        tasks as u64 * ops,
        elapsed,
        waits,
    ))
}

pub(crate) fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
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
