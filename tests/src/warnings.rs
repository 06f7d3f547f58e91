//! A worker's view of the runtime's warnings: a minimal `tracing`
//! subscriber that prints each warning on stderr (with the process and
//! the time) and counts the leases lost, by reason, so a worker can say
//! why it lost a lock, not only that it did.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata};

/// Prints the runtime's warnings and counts its lost leases by reason.
/// Install it with [`Warnings::install`] before the registry is built.
#[derive(Debug, Default)]
pub struct Warnings {
    lost: Mutex<BTreeMap<String, u64>>,
}

impl Warnings {
    /// Makes a new one this process's global subscriber, for good.
    pub fn install() -> &'static Warnings {
        let warnings: &'static Warnings = Box::leak(Box::default());
        tracing::subscriber::set_global_default(Printer(warnings))
            .expect("no other subscriber is installed");
        warnings
    }

    /// How many leases were lost, by the reason the runtime gave: the
    /// `reason` field of its `lease lost` warnings.
    pub fn lost(&self) -> BTreeMap<String, u64> {
        self.lost.lock().expect("lost").clone()
    }
}

/// The subscriber itself; [`Warnings`] is static and shared with it.
struct Printer(&'static Warnings);

/// Collects an event's message and its other fields as `name=value`.
#[derive(Default)]
struct Fields {
    message: String,
    reason: Option<String>,
    rest: String,
}

impl Fields {
    fn put(&mut self, name: &str, value: String) {
        match name {
            "message" => self.message = value,
            "reason" => self.reason = Some(value),
            name => {
                let _ = write!(self.rest, " {name}={value}");
            }
        }
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field.name(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field.name(), format!("{value:?}"));
    }
}

impl tracing::Subscriber for Printer {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.is_event() && *metadata.level() <= Level::WARN
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        // Spans are never enabled; an id is still owed.
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let Fields {
            message,
            reason,
            rest,
        } = fields;
        let at_ms = crate::history::now_us() / 1000;
        let reason_shown = reason
            .as_deref()
            .map(|reason| format!(" reason={reason:?}"))
            .unwrap_or_default();
        eprintln!(
            "worker {} at_ms={at_ms} {}: {message}{reason_shown}{rest}",
            std::process::id(),
            event.metadata().level()
        );
        if message == "lease lost" {
            let reason = reason.unwrap_or_default();
            *self.0.lost.lock().expect("lost").entry(reason).or_default() += 1;
        }
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one test of this binary that installs a subscriber (it is
    /// global, for good).
    #[test]
    fn lost_leases_are_counted_by_reason_and_other_warnings_are_not() {
        let warnings = Warnings::install();
        let reason: &str = "no renewal got through before the lease ran out";
        tracing::warn!(key = "k", reason, "lease lost");
        tracing::warn!(key = "k", reason, "lease lost");
        tracing::warn!(
            key = "k",
            reason = "the store no longer has it",
            "lease lost"
        );
        tracing::warn!(key = "k", "lease renewal failed; retrying");
        tracing::info!(key = "k", reason, "lease lost");
        let lost = warnings.lost();
        assert_eq!(lost.get(reason), Some(&2), "{lost:?}");
        assert_eq!(lost.get("the store no longer has it"), Some(&1), "{lost:?}");
        assert_eq!(lost.len(), 2, "{lost:?}");
    }
}
