//! What [`overdue`](super::super::overdue) keeps between looks: the
//! ensemble's clock as last read, and when each key's holders could first
//! be overdue.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::time::Instant;

/// The ensemble's clock as last read from a write's reply, and the
/// overdue holders' next due times per key.
#[derive(Default)]
pub(in crate::store::zookeeper) struct Dues {
    /// The `mtime` of our latest write, and when its reply came.
    clock: Mutex<Option<(i64, Instant)>>,
    /// Per key node: when the earliest of its holders, as last read,
    /// could be overdue.
    due: Mutex<HashMap<String, Instant>>,
}

/// Keys whose due times are kept at most; beyond, they are forgotten and
/// read again.
const DUE_KEPT: usize = 4096;

impl Dues {
    /// Notes the ensemble's clock from a write's reply received now.
    pub(in crate::store::zookeeper) fn saw(&self, mtime: i64) {
        *self.clock.lock().unwrap_or_else(|e| e.into_inner()) = Some((mtime, Instant::now()));
    }

    /// The ensemble's clock now, in milliseconds, never ahead of it: the
    /// last reading and the time since its reply.
    pub(in crate::store::zookeeper) fn now(&self) -> Option<i64> {
        let (mtime, at) = (*self.clock.lock().unwrap_or_else(|e| e.into_inner()))?;
        let since = i64::try_from(at.elapsed().as_millis()).unwrap_or(i64::MAX);
        Some(mtime.saturating_add(since))
    }

    /// When the holders of `parent`, as last read, could first be
    /// overdue; `None` if not known.
    pub(in crate::store::zookeeper) fn due(&self, parent: &str) -> Option<Instant> {
        let due = self.due.lock().unwrap_or_else(|e| e.into_inner());
        due.get(parent).copied()
    }

    pub(in crate::store::zookeeper) fn set_due(&self, parent: &str, at: Option<Instant>) {
        let mut due = self.due.lock().unwrap_or_else(|e| e.into_inner());
        match at {
            Some(at) => {
                if due.len() >= DUE_KEPT && !due.contains_key(parent) {
                    due.clear();
                }
                due.insert(parent.to_owned(), at);
            }
            None => {
                due.remove(parent);
            }
        }
    }
}
