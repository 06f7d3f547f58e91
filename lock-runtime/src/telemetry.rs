//! What the runtime tells the outside: a `tracing` span per lock, and
//! (feature `metrics`) counters and histograms through the `metrics`
//! facade. Every store gets both, since they live here and not in the
//! stores.
//!
//! # Spans
//!
//! - `distributed_lock` (INFO), one per lock taken or tried: from the
//!   first wait until the release (or the loss). Fields: `key` (without the
//!   namespace), `mode` (`wait` or `skip`), `store`, `fencing` (once
//!   acquired) and `outcome`: `acquired`, `skipped`, `timeout`, `error`,
//!   and `lost` if the lease is lost later. The attribute runs the body
//!   inside it; the manual API's guard keeps it until the release.
//! - `lock_wait` (INFO), its child: the wait, from the local queue to the
//!   store's answer.
//! - `distributed_locks` (INFO): `keys = [..]`, around one
//!   `distributed_lock` per key and the body.
//!
//! The runtime's events (acquired, contended, renewal failures, losses,
//! releases) are children of these spans. The spans are made only while a
//! subscriber may listen at INFO (`tracing::level_enabled!`); with none, a
//! lock makes no span, and the events still reach `tracing`'s `log`
//! fallback where that is on.
//!
//! # Metrics
//!
//! Labels: `store` and `lock`, the lock's name (the attribute's `name` or
//! else its key template, or [`LockOptions::name`](crate::LockOptions::name);
//! `unnamed` otherwise); never the rendered key, whose values are
//! unbounded.
//!
//! | name | kind | meaning |
//! |---|---|---|
//! | `distributed_lock_acquired_total` | counter | locks acquired |
//! | `distributed_lock_contended_total` | counter | locks that found their key held (here or elsewhere) before acquiring it or giving up |
//! | `distributed_lock_skipped_total` | counter | skip-mode calls that did not run |
//! | `distributed_lock_timeouts_total` | counter | waits that ran out of `wait_timeout` |
//! | `distributed_lock_lost_total` | counter | leases lost while held; label `reason`: `refused` (a renewal found it gone), `late` (no renewal got through in time), `max_hold`, `ttl` (watchdog off), `store` (the store said so: session expired, forced release), `release` (found at the release) |
//! | `distributed_lock_renewals_failed_total` | counter | renewals that did not extend the lease (errors, refusals, too late) |
//! | `distributed_lock_hand_overs_total` | counter | leases handed to the next task of this process without a release |
//! | `distributed_lock_wait_seconds` | histogram | time from the call to the acquisition |
//! | `distributed_lock_hold_seconds` | histogram | time from the acquisition to the release or the loss |

use tracing::Span;

use crate::options::Mode;

/// Awaits a future inside a span when a subscriber listens to it, and as
/// it is otherwise: wrapping a large future (a body) moves it, which costs
/// more than the span itself.
macro_rules! in_span {
    ($span:expr, $future:expr) => {
        if $span.is_disabled() {
            $future.await
        } else {
            ::tracing::Instrument::instrument($future, $span.clone()).await
        }
    };
}
pub(crate) use in_span;

/// The label of a lock without a name.
pub(crate) const UNNAMED: &str = "unnamed";

/// The reasons the runtime itself declares a lease lost; anything else
/// raised the loss signal came from the store.
pub(crate) mod reason {
    pub(crate) const REFUSED: &str = "the store no longer has it (expired or taken over)";
    use crate::store::Deadline;

    pub(crate) const LATE: &str = Deadline::Late.reason();
    pub(crate) const MAX_HOLD: &str = Deadline::MaxHold.reason();
    pub(crate) const TTL: &str = Deadline::Ttl.reason();
    pub(crate) const RELEASE: &str = "the release found it gone";
}

/// The index of a loss's reason in `handles::REASON_LABELS`.
#[cfg(feature = "metrics")]
fn reason_index(reason: &str) -> usize {
    let labels = &handles::REASON_LABELS;
    let runtime = &labels[..labels.len() - 1];
    runtime
        .iter()
        .position(|(declared, _)| *declared == reason)
        .unwrap_or(runtime.len())
}

/// Which lock a figure is about: its bounded labels, and (feature
/// `metrics`) the metric handles registered for them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Labels {
    #[cfg(feature = "metrics")]
    handles: &'static handles::Handles,
}

impl Labels {
    /// The labels `store` and `name`. With the `metrics` feature, their
    /// handles are registered with the recorder installed at the first
    /// lock of that name, and reused from then on (a registration per lock
    /// allocated and hashed the labels each time: +18 % per lock).
    #[cfg_attr(not(feature = "metrics"), allow(unused_variables))]
    pub(crate) fn new(store: &'static str, name: &'static str) -> Labels {
        Labels {
            #[cfg(feature = "metrics")]
            handles: handles::of(store, name),
        }
    }
}

/// The metric handles of each (store, lock name), registered once.
#[cfg(feature = "metrics")]
mod handles {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use metrics::{Counter, Histogram};
    use once_cell::sync::Lazy;

    use crate::telemetry::reason;

    /// Each reason the runtime declares and its `reason` label; any other
    /// reason (the last entry's) is the store's.
    pub(super) const REASON_LABELS: [(&str, &str); 6] = [
        (reason::REFUSED, "refused"),
        (reason::LATE, "late"),
        (reason::MAX_HOLD, "max_hold"),
        (reason::TTL, "ttl"),
        (reason::RELEASE, "release"),
        ("", "store"),
    ];

    #[derive(Debug)]
    pub(super) struct Handles {
        pub(super) acquired: Counter,
        pub(super) contended: Counter,
        pub(super) skipped: Counter,
        pub(super) timeouts: Counter,
        pub(super) renewals_failed: Counter,
        pub(super) hand_overs: Counter,
        pub(super) lost: [Counter; 6],
        pub(super) wait: Histogram,
        pub(super) hold: Histogram,
    }

    /// By the names' addresses and lengths: one entry per place that names
    /// a lock, so the map stays as bounded as the labels.
    type Key = (usize, usize, usize, usize);

    static CACHE: Lazy<Mutex<HashMap<Key, &'static Handles>>> = Lazy::new(Mutex::default);

    pub(super) fn of(store: &'static str, name: &'static str) -> &'static Handles {
        let key = (
            store.as_ptr() as usize,
            store.len(),
            name.as_ptr() as usize,
            name.len(),
        );
        let mut cache = CACHE.lock().unwrap_or_else(|poison| poison.into_inner());
        cache.entry(key).or_insert_with(|| {
            let counter = |metric: &'static str| metrics::counter!(metric, "store" => store, "lock" => name);
            let histogram = |metric: &'static str| metrics::histogram!(metric, "store" => store, "lock" => name);
            // Bounded: one per (store, name) pair the program uses.
            Box::leak(Box::new(Handles {
                acquired: counter("distributed_lock_acquired_total"),
                contended: counter("distributed_lock_contended_total"),
                skipped: counter("distributed_lock_skipped_total"),
                timeouts: counter("distributed_lock_timeouts_total"),
                renewals_failed: counter("distributed_lock_renewals_failed_total"),
                hand_overs: counter("distributed_lock_hand_overs_total"),
                lost: REASON_LABELS.map(|(_, reason)| {
                    metrics::counter!(
                        "distributed_lock_lost_total",
                        "store" => store,
                        "lock" => name,
                        "reason" => reason,
                    )
                }),
                wait: histogram("distributed_lock_wait_seconds"),
                hold: histogram("distributed_lock_hold_seconds"),
            }))
        })
    }
}

/// Whether any subscriber may listen to the runtime's (INFO) spans. Without
/// one, they are not made: `tracing`'s fallback to the `log` crate (its
/// `log` feature, turned on by many a dependency) would otherwise record
/// every span's fields for a logger that has no place for spans, at a cost
/// of the order of the lock itself on the in-process store. The events
/// reach such a logger all the same.
fn spans_listened() -> bool {
    tracing::level_enabled!(tracing::Level::INFO)
}

/// The `distributed_lock` span of one lock on `key`.
#[inline]
pub(crate) fn lock_span(key: &str, mode: Mode, store: &'static str) -> Span {
    if !spans_listened() {
        return Span::none();
    }
    tracing::info_span!(
        "distributed_lock",
        key,
        mode = mode.as_str(),
        store,
        fencing = tracing::field::Empty,
        outcome = tracing::field::Empty,
    )
}

/// The `lock_wait` span, a child of `parent`.
#[inline]
pub(crate) fn wait_span(parent: &Span) -> Span {
    if parent.is_none() {
        return Span::none();
    }
    tracing::info_span!(parent: parent, "lock_wait")
}

/// The `distributed_locks` span of a `keys = [..]` call.
pub(crate) fn locks_span(keys: &[String], mode: Mode) -> Span {
    if !spans_listened() {
        return Span::none();
    }
    tracing::info_span!(
        "distributed_locks",
        keys = ?keys,
        mode = mode.as_str(),
        outcome = tracing::field::Empty,
    )
}

/// How an acquire ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    Acquired,
    Skipped,
    Timeout,
    Error,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Acquired => "acquired",
            Outcome::Skipped => "skipped",
            Outcome::Timeout => "timeout",
            Outcome::Error => "error",
        }
    }
}

/// Records how an acquire ended, on its span and in the metrics.
pub(crate) fn acquire_ended(
    span: &Span,
    labels: Labels,
    outcome: Outcome,
    fencing: Option<u64>,
    contended: bool,
    started: Option<tokio::time::Instant>,
) {
    // A disabled span keeps no fields; recording into one still costs a
    // call per field (and a `log` record when `tracing`'s `log` feature is
    // on), so it is skipped.
    if !span.is_disabled() {
        if let Some(fencing) = fencing {
            span.record("fencing", fencing);
        }
        span.record("outcome", outcome.as_str());
    }
    #[cfg(feature = "metrics")]
    {
        let handles = labels.handles;
        if contended {
            handles.contended.increment(1);
        }
        match outcome {
            Outcome::Acquired => {
                handles.acquired.increment(1);
                if let Some(started) = started {
                    handles.wait.record(started.elapsed().as_secs_f64());
                }
            }
            Outcome::Skipped => handles.skipped.increment(1),
            Outcome::Timeout => handles.timeouts.increment(1),
            Outcome::Error => {}
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (labels, contended, started);
}

/// Records a lease lost while held, for `reason`.
pub(crate) fn lost(span: &Span, labels: Labels, reason: &str) {
    if !span.is_disabled() {
        span.record("outcome", "lost");
    }
    #[cfg(feature = "metrics")]
    labels.handles.lost[reason_index(reason)].increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (labels, reason);
}

/// Records the end of a hold that began at `started_at` (the clock is read
/// only when the hold time is recorded).
#[inline]
pub(crate) fn hold_ended(labels: Labels, started_at: tokio::time::Instant) {
    #[cfg(feature = "metrics")]
    labels
        .handles
        .hold
        .record(started_at.elapsed().as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (labels, started_at);
}

/// Records what happened to a fire of the scheduled job `job`, as this
/// replica saw it (`outcome`: [`FireOutcome::label`](crate::job::FireOutcome::label)).
pub(crate) fn job_fire(job: &str, outcome: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "distributed_lock_job_fires_total",
        "job" => job.to_owned(),
        "outcome" => outcome
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (job, outcome);
}

/// Records a renewal that did not extend the lease.
pub(crate) fn renewal_failed(labels: Labels) {
    #[cfg(feature = "metrics")]
    labels.handles.renewals_failed.increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = labels;
}

/// Records a lease handed to the next task of this process.
#[inline]
pub(crate) fn handed_over(labels: Labels) {
    #[cfg(feature = "metrics")]
    labels.handles.hand_overs.increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = labels;
}
