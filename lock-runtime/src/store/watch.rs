//! Release notifications for one key.

use std::fmt;

use tokio::sync::watch;

use super::LockToken;

/// A subscription to release notifications for one key.
///
/// Created before an acquire attempt, it reports every release that happens
/// after its creation, so a release between a failed attempt and the wait is
/// not missed when the store delivers it. Stores may still miss some (a
/// dropped connection): waiters retry on a timer as well.
pub struct ReleaseWatch {
    rx: Notices,
    // Dropped after `rx`: lets a store free per-key state once unwatched.
    _hold: Option<Box<dyn Send + Sync>>,
}

/// What a store sends on each release.
enum Notices {
    /// Only that there was one.
    Released(watch::Receiver<()>),
    /// The token the release granted the key to, if any.
    Granted(watch::Receiver<Option<LockToken>>),
    /// None: the store cannot tell.
    Never,
}

impl ReleaseWatch {
    /// Wraps a watch receiver that is bumped on each release of the key.
    /// `hold` is dropped with the subscription, after the receiver: a store
    /// can use it to free its per-key state once nobody watches the key.
    pub fn new(rx: watch::Receiver<()>, hold: Option<Box<dyn Send + Sync>>) -> Self {
        ReleaseWatch {
            rx: Notices::Released(rx),
            _hold: hold,
        }
    }

    /// As [`new`](Self::new), for a store whose release may grant the key
    /// to a queued waiter: each notice carries the token granted (`None`
    /// when the key was only freed), so other waiters need not try.
    pub fn granting(
        rx: watch::Receiver<Option<LockToken>>,
        hold: Option<Box<dyn Send + Sync>>,
    ) -> Self {
        ReleaseWatch {
            rx: Notices::Granted(rx),
            _hold: hold,
        }
    }

    /// A watch that never fires, for a store that cannot tell of releases
    /// (it says how often its waiters ask again instead:
    /// [`Capabilities::with_polled_releases`](super::Capabilities::with_polled_releases)).
    pub fn never() -> Self {
        ReleaseWatch {
            rx: Notices::Never,
            _hold: None,
        }
    }

    /// Completes at the next release after the previous call (or after the
    /// subscription was made). Never completes if the store stopped sending,
    /// or for a [`never`](Self::never) watch.
    pub async fn released(&mut self) {
        let sending = match &mut self.rx {
            Notices::Released(rx) => rx.changed().await.is_ok(),
            Notices::Granted(rx) => rx.changed().await.is_ok(),
            Notices::Never => false,
        };
        if !sending {
            std::future::pending::<()>().await;
        }
    }

    /// Completes at the next release that `token` may act on: one that
    /// freed the key or granted it to `token`, not one that granted it to
    /// another waiter.
    pub async fn released_for(&mut self, token: LockToken) {
        loop {
            self.released().await;
            let granted = match &mut self.rx {
                Notices::Released(_) | Notices::Never => None,
                Notices::Granted(rx) => *rx.borrow_and_update(),
            };
            if granted.is_none_or(|granted| granted == token) {
                return;
            }
        }
    }
}

impl fmt::Debug for ReleaseWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReleaseWatch").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::sync::watch;

    use super::{LockToken, ReleaseWatch};

    /// A notice that granted the key to another waiter leaves a waiter
    /// asleep; one that granted it to the waiter, or only freed it, wakes it.
    #[tokio::test]
    async fn a_waiter_wakes_for_its_own_grant_or_a_free_key_only() {
        let (tx, rx) = watch::channel(None);
        let mut watch = ReleaseWatch::granting(rx, None);
        let (ours, other) = (LockToken::random(), LockToken::random());
        tx.send_replace(Some(other));
        {
            let waiting = watch.released_for(ours);
            tokio::pin!(waiting);
            // A zero timeout polls the wait once: still asleep.
            let polled = tokio::time::timeout(Duration::ZERO, &mut waiting).await;
            assert!(polled.is_err(), "woken by another waiter's grant");
            tx.send_replace(Some(ours));
            tokio::time::timeout(Duration::from_secs(5), waiting)
                .await
                .expect("woken by its own grant");
        }
        tx.send_replace(None);
        tokio::time::timeout(Duration::from_secs(5), watch.released_for(ours))
            .await
            .expect("woken by a release that freed the key");
    }
}
