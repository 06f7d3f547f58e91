//! What an acquire asks of a store, and what the store answers.

use std::sync::Arc;
use std::time::Duration;

use super::{Lease, LockToken, LossSignal};

/// What a store knows of the lease on one key: the answer to
/// [`Store::inspect`](super::Store::inspect) when the key is held.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseInfo {
    /// The holder's token, when the store keeps one it can read back.
    pub token: Option<LockToken>,
    /// The holder's fencing token (0 from a store without fencing).
    pub fencing: u64,
    /// How long the lease has left, when the store counts it (a session
    /// store does not: the lease lasts as long as the holder's session).
    pub remaining: Option<Duration>,
}

impl LeaseInfo {
    /// A lease held by `token` with `fencing`, ending in `remaining`.
    pub fn new(token: Option<LockToken>, fencing: u64, remaining: Option<Duration>) -> Self {
        LeaseInfo {
            token,
            fencing,
            remaining,
        }
    }
}

/// One acquire attempt, as the runtime asks it of a store.
#[derive(Debug)]
#[non_exhaustive]
pub struct AcquireRequest<'a> {
    /// The full key, namespace included.
    pub key: &'a str,
    /// The would-be holder's token. An attempt is retried with the same
    /// token, and a store answers a repeat as it answered the first (so a
    /// retried request cannot lock its own sender out).
    pub token: LockToken,
    /// The lease length; already checked against [`Capabilities`](super::Capabilities).
    pub ttl: Duration,
    /// Raised by the store if it learns that the lease is lost; a store
    /// that [pushes losses](super::Capabilities::pushes_loss) keeps a clone in
    /// its handle.
    pub loss: &'a LossSignal,
    /// Whether the caller waits for a release if the key is held (wait
    /// mode), rather than giving up at once: a store whose release
    /// notifications cost something can send them only when someone waits.
    pub waits: bool,
    /// `key`, shared: a store that keeps the key can take a reference
    /// rather than a copy.
    pub(crate) shared_key: Option<&'a Arc<str>>,
}

impl<'a> AcquireRequest<'a> {
    /// An attempt at `key` by `token` for a lease of `ttl`.
    pub fn new(key: &'a str, token: LockToken, ttl: Duration, loss: &'a LossSignal) -> Self {
        AcquireRequest {
            key,
            token,
            ttl,
            loss,
            waits: false,
            shared_key: None,
        }
    }

    /// An attempt at the key `key` shares.
    pub(crate) fn shared(
        key: &'a Arc<str>,
        token: LockToken,
        ttl: Duration,
        loss: &'a LossSignal,
    ) -> Self {
        AcquireRequest {
            shared_key: Some(key),
            ..AcquireRequest::new(key, token, ttl, loss)
        }
    }

    /// Says whether the caller waits for a release if the key is held.
    pub fn waiting(mut self, waits: bool) -> Self {
        self.waits = waits;
        self
    }
}

/// The answer to one acquire attempt.
#[derive(Debug)]
#[non_exhaustive]
pub enum Acquire {
    /// The lease is ours.
    Acquired {
        /// The fencing token of this lease (see [`FencingPromise`](super::FencingPromise)).
        fencing: u64,
        /// The handle that renews, releases or hands over this lease.
        lease: Box<dyn Lease>,
    },
    /// Someone else holds it.
    Held {
        /// How long their lease has left, when the store knows
        /// ([`Capabilities::remaining_time`](super::Capabilities::remaining_time)).
        remaining: Option<Duration>,
    },
}

/// What [`Lease::hand_over`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandOver {
    /// The lease is the next holder's now, with this fencing token.
    Moved {
        /// The next holder's fencing token.
        fencing: u64,
    },
    /// The lease was no longer ours: nothing was handed over.
    Lost,
    /// The store released the lease rather than hand it over: a waiter it
    /// queued (in another process) had its turn. The next holder in this
    /// process acquires in the store as usual.
    Released,
}

impl From<Option<u64>> for HandOver {
    /// `Some(fencing)`: moved with that token; `None`: lost.
    fn from(fencing: Option<u64>) -> Self {
        match fencing {
            Some(fencing) => HandOver::Moved { fencing },
            None => HandOver::Lost,
        }
    }
}
