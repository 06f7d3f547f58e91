//! The waiting writers that marked their key while shares held it (see
//! `acquire.lua`): each clears its mark once granted, and only they pay
//! for it.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::store::LockToken;

/// The tokens of this store's writers whose mark stands.
#[derive(Debug, Default)]
pub(super) struct WriterMarks {
    /// How many tokens the set holds: read without the lock, so that an
    /// acquire with no writer waiting behind shares takes no lock.
    count: AtomicUsize,
    tokens: Mutex<HashSet<LockToken>>,
}

impl WriterMarks {
    pub(super) fn contains(&self, token: LockToken) -> bool {
        self.count.load(Ordering::Acquire) > 0 && self.lock().contains(&token)
    }

    pub(super) fn insert(&self, token: LockToken) {
        let mut tokens = self.lock();
        if tokens.insert(token) {
            self.count.store(tokens.len(), Ordering::Release);
        }
    }

    pub(super) fn remove(&self, token: LockToken) {
        if self.count.load(Ordering::Acquire) == 0 {
            return;
        }
        let mut tokens = self.lock();
        if tokens.remove(&token) {
            self.count.store(tokens.len(), Ordering::Release);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<LockToken>> {
        // Every critical section is one set operation: consistent after a panic.
        self.tokens
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mark_is_known_until_removed() {
        let marks = WriterMarks::default();
        let (a, b) = (LockToken::random(), LockToken::random());
        assert!(!marks.contains(a));
        marks.insert(a);
        marks.insert(a);
        assert!(marks.contains(a) && !marks.contains(b));
        marks.remove(b);
        assert!(marks.contains(a));
        marks.remove(a);
        assert!(!marks.contains(a));
        assert_eq!(marks.count.load(Ordering::Acquire), 0);
    }
}
