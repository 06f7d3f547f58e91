//! What an acquire asks of a store, and what the store answers.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::{Claim, Lease, LockToken, LossSignal};

/// What a store knows of the lease on one key: the answer to
/// [`Store::inspect`](super::Store::inspect) when the key is held. Users
/// read it as a [`LockInfo`](crate::LockInfo), which says whether the
/// holder's token is of this process rather than the token.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseInfo {
    /// The holder's token, when the store keeps one it can read back.
    pub token: Option<LockToken>,
    /// The holder's fencing token (0 from a store without fencing). A
    /// store that issues tokens on demand ([`Lease::fencing_token`]) gives
    /// 0 until the holder has read one, never an earlier holder's.
    pub fencing: u64,
    /// How long the lease has left, when the store counts it (a session
    /// store does not: the lease lasts as long as the holder's session).
    pub remaining: Option<Duration>,
    /// How the key is held: [`Claim::Exclusive`] unless the store says
    /// otherwise ([`with_holders`](Self::with_holders)).
    pub claim: Claim,
    /// How many leases hold the key (1 for an exclusive claim; the shares
    /// or permits held otherwise). The other fields describe one of them.
    pub holders: usize,
}

impl LeaseInfo {
    /// A lease held by `token` with `fencing`, ending in `remaining`: the
    /// key's only holder, exclusive.
    pub fn new(token: Option<LockToken>, fencing: u64, remaining: Option<Duration>) -> Self {
        LeaseInfo {
            token,
            fencing,
            remaining,
            claim: Claim::Exclusive,
            holders: 1,
        }
    }

    /// Says the key is held under `claim` by `holders` leases, of which
    /// this is one.
    pub fn with_holders(mut self, claim: Claim, holders: usize) -> Self {
        self.claim = claim;
        self.holders = holders;
        self
    }
}

/// One acquire attempt, as the runtime asks it of a store.
///
/// Its fields are of two kinds. What the store must honour: the
/// [`key`](Self::key), the [`claim`](Self::claim) (by the claim rule,
/// [`Claim::meets`]), the [`token`](Self::token) (a retry with the same
/// token gets the same answer: see [`Store`](super::Store)), the
/// [`ttl`](Self::ttl) and the [`loss`](Self::loss) signal of a store that
/// pushes losses. And [`hints`](Self::hints): what the caller knows, which
/// a store may use to do less work and may ignore without breaking
/// anything.
#[derive(Debug)]
#[non_exhaustive]
pub struct AcquireRequest<'a> {
    /// The full key, namespace included.
    pub key: &'a str,
    /// What the attempt claims: the key alone unless the caller asked for a
    /// share or a permit.
    pub claim: Claim,
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
    /// What the caller knows that may save the store work.
    pub hints: Hints,
    /// `key`, shared, when the caller has it so: see
    /// [`owned_key`](Self::owned_key).
    shared_key: Option<&'a Arc<str>>,
}

/// What the caller of an acquire knows that may save a store work: each may
/// be ignored, and a store that ignores them all is still correct.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Hints {
    /// Whether the caller waits for a release if the key is held (wait
    /// mode), rather than giving up at once: a store whose release
    /// notifications cost something can send them only when someone waits,
    /// and a store that queues waiters queues only these. Default: false.
    pub waits: bool,
    /// Whether the caller wants a fencing token. When not, a store may skip
    /// the work of making one and answer 0. Default: true.
    pub fenced: bool,
    /// Whether the caller knows the key to be in demand: an earlier attempt
    /// by this token was refused, or the caller queued behind another task
    /// of this process. Others are then likely to wait on the lease too: a
    /// store with a cheaper release for a key nobody waits on may keep its
    /// general one for this lease. Default: false.
    pub contended: bool,
    /// When the caller sent the attempt, on this process's clock: the
    /// holder counts the lease from then. A store that shares the
    /// holder's clock may count the lease from then too, rather than read
    /// the clock (its lease then ends no later than it would have).
    /// Default: `None`.
    pub sent_at: Option<Instant>,
}

impl Default for Hints {
    fn default() -> Self {
        Hints {
            waits: false,
            fenced: true,
            contended: false,
            sent_at: None,
        }
    }
}

impl<'a> AcquireRequest<'a> {
    /// An exclusive attempt at `key` by `token` for a lease of `ttl`, with
    /// the default [`Hints`].
    pub fn new(key: &'a str, token: LockToken, ttl: Duration, loss: &'a LossSignal) -> Self {
        AcquireRequest {
            key,
            claim: Claim::Exclusive,
            token,
            ttl,
            loss,
            hints: Hints::default(),
            shared_key: None,
        }
    }

    /// As [`new`](Self::new), with the key as a shared string, which a
    /// store that keeps the key takes rather than a copy
    /// ([`owned_key`](Self::owned_key)).
    pub fn with_shared_key(
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

    /// Says whether the caller waits for a release if the key is held
    /// ([`Hints::waits`]).
    pub fn waiting(mut self, waits: bool) -> Self {
        self.hints.waits = waits;
        self
    }

    /// Says whether the caller wants a fencing token ([`Hints::fenced`]).
    pub fn fencing(mut self, fenced: bool) -> Self {
        self.hints.fenced = fenced;
        self
    }

    /// Says whether the caller knows the key to be in demand
    /// ([`Hints::contended`]).
    pub fn contended(mut self, contended: bool) -> Self {
        self.hints.contended = contended;
        self
    }

    /// Says when the caller sent the attempt ([`Hints::sent_at`]).
    pub fn sent_at(mut self, at: Instant) -> Self {
        self.hints.sent_at = Some(at);
        self
    }

    /// Sets what the attempt claims.
    pub fn claiming(mut self, claim: Claim) -> Self {
        self.claim = claim;
        self
    }

    /// The key as a shared string, for a store that keeps it: the
    /// caller's, when it gave one ([`with_shared_key`](Self::with_shared_key)),
    /// else a copy.
    pub fn owned_key(&self) -> Arc<str> {
        self.shared_key
            .cloned()
            .unwrap_or_else(|| Arc::from(self.key))
    }
}

/// The answer to one acquire attempt.
#[derive(Debug)]
#[non_exhaustive]
pub enum Acquire {
    /// The lease is ours.
    Acquired {
        /// The fencing token of this lease (see
        /// [`FencingPromise`](super::FencingPromise)); `None` when the store
        /// issues it only when the holder asks ([`Lease::fencing_token`]).
        fencing: Option<u64>,
        /// The handle that renews, releases or hands over this lease.
        lease: Box<dyn Lease>,
    },
    /// Someone else holds it.
    Held {
        /// How long until the attempt could succeed, when the store counts
        /// leases (a session store does not): what the holder's lease has
        /// left, or with several holders, until enough of theirs end.
        remaining: Option<Duration>,
    },
}

/// What [`Lease::hand_over`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum HandOver {
    /// The lease is the next holder's now, with this fencing token.
    Moved {
        /// The next holder's fencing token; `None` when the store issues
        /// it only when the holder asks ([`Lease::fencing_token`]).
        fencing: Option<u64>,
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
            Some(fencing) => HandOver::Moved {
                fencing: Some(fencing),
            },
            None => HandOver::Lost,
        }
    }
}
