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
//! releases) are children of these spans. With no subscriber, a span costs
//! a check of a cached flag and its fields are never evaluated.
//!
//! # Metrics
//!
//! Labels: `store` and `lock`, the lock's name (the attribute's key
//! template, or [`LockOptions::name`](crate::LockOptions::name); `unnamed`
//! otherwise); never the rendered key, whose values are unbounded.
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

use std::time::Duration;

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
    pub(crate) const LATE: &str = "no renewal got through before the lease ran out";
    pub(crate) const MAX_HOLD: &str = "max_hold reached";
    pub(crate) const TTL: &str = "ttl passed with the watchdog off";
    pub(crate) const RELEASE: &str = "the release found it gone";
}

/// The `reason` label of a loss.
fn reason_label(reason: &str) -> &'static str {
    match reason {
        reason::REFUSED => "refused",
        reason::LATE => "late",
        reason::MAX_HOLD => "max_hold",
        reason::TTL => "ttl",
        reason::RELEASE => "release",
        _ => "store",
    }
}

/// Which lock a figure is about: its bounded labels.
#[derive(Clone, Copy, Debug)]
#[cfg_attr(not(feature = "metrics"), allow(dead_code))]
pub(crate) struct Labels {
    pub(crate) store: &'static str,
    pub(crate) name: &'static str,
}

/// The `distributed_lock` span of one lock on `key`.
pub(crate) fn lock_span(key: &str, mode: Mode, store: &'static str) -> Span {
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
pub(crate) fn wait_span(parent: &Span) -> Span {
    tracing::info_span!(parent: parent, "lock_wait")
}

/// The `distributed_locks` span of a `keys = [..]` call.
pub(crate) fn locks_span(keys: &[String], mode: Mode) -> Span {
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
    started: tokio::time::Instant,
) {
    if let Some(fencing) = fencing {
        span.record("fencing", fencing);
    }
    span.record("outcome", outcome.as_str());
    #[cfg(feature = "metrics")]
    {
        let Labels { store, name } = labels;
        let counter = |metric: &'static str| {
            metrics::counter!(metric, "store" => store, "lock" => name).increment(1);
        };
        if contended {
            counter("distributed_lock_contended_total");
        }
        match outcome {
            Outcome::Acquired => {
                counter("distributed_lock_acquired_total");
                metrics::histogram!("distributed_lock_wait_seconds", "store" => store, "lock" => name)
                    .record(started.elapsed().as_secs_f64());
            }
            Outcome::Skipped => counter("distributed_lock_skipped_total"),
            Outcome::Timeout => counter("distributed_lock_timeouts_total"),
            Outcome::Error => {}
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (labels, contended, started);
}

/// Records a lease lost while held, for `reason`.
pub(crate) fn lost(span: &Span, labels: Labels, reason: &str) {
    span.record("outcome", "lost");
    #[cfg(feature = "metrics")]
    metrics::counter!(
        "distributed_lock_lost_total",
        "store" => labels.store,
        "lock" => labels.name,
        "reason" => reason_label(reason),
    )
    .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = (labels, reason_label(reason));
}

/// Records the end of a hold that lasted `held`.
pub(crate) fn hold_ended(labels: Labels, held: Duration) {
    #[cfg(feature = "metrics")]
    metrics::histogram!("distributed_lock_hold_seconds", "store" => labels.store, "lock" => labels.name)
        .record(held.as_secs_f64());
    #[cfg(not(feature = "metrics"))]
    let _ = (labels, held);
}

/// Records a renewal that did not extend the lease.
pub(crate) fn renewal_failed(labels: Labels) {
    #[cfg(feature = "metrics")]
    metrics::counter!("distributed_lock_renewals_failed_total", "store" => labels.store, "lock" => labels.name)
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = labels;
}

/// Records a lease handed to the next task of this process.
pub(crate) fn handed_over(labels: Labels) {
    #[cfg(feature = "metrics")]
    metrics::counter!("distributed_lock_hand_overs_total", "store" => labels.store, "lock" => labels.name)
        .increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = labels;
}
