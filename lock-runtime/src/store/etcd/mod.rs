//! etcd: leases and revision fencing, for locks that must stay correct when
//! a server dies (Raft-replicated, linearizable).
//!
//! # How a lock is kept
//!
//! A lock is a queue of entries under the key's own range (the store's
//! prefix, default `locks/`, the key with `%` and NUL escaped, then a NUL):
//! each contender's entry holds its token, is attached to an etcd lease of
//! the lock's ttl and is named by that lease (see `entry_for`). The entry
//! created first holds the lock; the others wait in creation order, across
//! processes.
//! This is etcd's own recipe (`client/v3/concurrency`). A crashed holder or
//! waiter stops renewing; etcd expires its lease and deletes its entry.
//!
//! - **Acquire** is one transaction: `If` the key's range is empty `Then
//!   Put(entry)`. Else, in skip mode, `Get(first entry)`: a skipping caller
//!   never queues nor takes the lock from a queued waiter; in wait mode,
//!   `Put(entry), Get(entry), Get(first entry)`: ours heads the queue or
//!   waits in it. A waiter that asks again with the entry it has sends,
//!   as that `Else`, a nested `If` its entry does not exist `Then
//!   Put(entry), Get(first entry) Else Get(entry), Get(first entry)`, so
//!   an entry that is there is never written again. (A first attempt's
//!   entry is named by a lease nobody else uses, so it cannot be there;
//!   the flat form spares etcd the nested transaction.) The fencing
//!   token is our entry's create revision: cluster-wide, and strictly
//!   increasing from holder to holder (an entry created later is always
//!   served later), kept by every member while a quorum lives.
//! - **Hand-off takes no round trip**: a waiter lists the queue and follows
//!   the deletions after the listing on its key's shared watch (see
//!   `queues.rs`), and knows it holds the lock as soon as the last entry
//!   ahead of it is deleted; the runtime's next attempt is answered from
//!   that. A waiter keeps its
//!   entry's lease alive as it asks again (every quarter of the cluster's
//!   shortest lease), reading the queue with it, so a deletion its watch
//!   missed does not hold it up for longer; and it gives its entry up
//!   when it stops waiting.
//! - **Leases are prepared ahead** so the common path is that one round
//!   trip: a released lock's lease, still fresh, waits in a small pool per
//!   ttl for the next acquire with the same ttl, and only the first acquire
//!   of a ttl (or one after a long hold) grants a new lease first. Such a
//!   lease is counted from when it was last granted or renewed, not from the
//!   acquire ([`Lease::started_at`](crate::store::Lease::started_at)), so the runtime never believes in more
//!   of it than etcd does.
//! - **Losses are pushed**: an entry held for a moment is watched for a
//!   deletion its holder did not make (a revoked or expired lease, a deleted
//!   entry), which cancels the body at once (see `held.rs`).
//! - **Renew** sends a keep-alive for the lease and, once it is answered,
//!   checks that the entry still holds our token (a linearizable read): a
//!   revoked lease, an expired one or an entry deleted under the holder
//!   is a lost lock, and the body is cancelled. A waiter that finds its
//!   entry at the head of the queue takes the lock the same way.
//! - **Release** deletes the entry if it holds our token. `hold_at_least`
//!   moves the entry to a new lease of what is left instead (an entry keeps
//!   its place in the queue when it is written again).
//! - **A hand-over** within a process replaces the holder's entry by a new
//!   one in one transaction, only while nobody queues behind it: then the
//!   process's next task takes its turn behind the other processes'.
//!
//! # A leader paused, and deposed meanwhile
//!
//! etcd answers a lease keep-alive from the leader's own lease clock,
//! without asking a quorum (3.4.23, the release the tests run; the related
//! case of a stuck leader is etcd-io/etcd#15247). A leader whose process
//! was paused (SIGSTOP, a virtual machine paused by its host) while the
//! others elected another can, as it resumes and before it learns it was
//! deposed, answer a holder's keep-alive as if the lease were renewed,
//! while the cluster lets the lease expire. Another caller can then be
//! granted the key before the deletion reaches the holder's watch, which
//! cancels its body (177 ms later in the soak that found it). This is a
//! lease the store loses, as in the guarantees' "Data loss". Fencing
//! tokens still rise from holder to holder: the tokens are the entries'
//! create revisions, so the stale holder's is the older one, and a lock
//! taken by a keep-alive is taken only once a linearizable read after
//! the keep-alive's answer found the entry still there, that is before
//! the cluster could expire its lease and grant the key to anyone else.
//!
//! # Semaphores and read-write locks
//!
//! A read share or a permit is an entry in the same queue, on a lease of
//! its own, whose name ends with what it claims (`:s`, or `:p` and the
//! limit). Who holds follows from creation order, as in Curator's recipes:
//! the first entry, and behind it the shares that follow a share, or the
//! permits (up to the limit) that follow a permit. An attempt queues its
//! entry and reads the queue in one transaction; in skip mode a refused
//! entry is deleted again. Waiters are served in arrival order, so a
//! writer that queued stops every share that queued after it: readers
//! cannot starve it. A waiting share or permit is woken by every deletion
//! ahead of it, and reads the queue again (one round trip). A key serves
//! one claim while held: a share or permit queued behind another kind is
//! an error naming both. Fencing tokens are the entries' create
//! revisions, so they increase in arrival order; two shares that hold
//! together may be granted in the other order.
//!
//! # Ttls
//!
//! etcd counts leases in whole seconds and raises a ttl below its minimum
//! (1.5 election timeouts: 2 s at default settings) to it. The store asks
//! the cluster its minimum when it connects, declares whole seconds from
//! that minimum in its [`Capabilities`], and refuses other ttls with
//! `InvalidOptions`: a lock never believes in a shorter or longer lease
//! than etcd's. A `hold_at_least` is kept to the millisecond: its entry
//! moves to a lease of its own, of whole seconds and at least the
//! cluster's minimum, which this process revokes when the linger ends; the
//! lease's own expiry only ends it when the process is gone by then (up to
//! the cluster's minimum, or a second, later).
//!
//! # TLS
//!
//! With the `etcd-tls` feature, [`EtcdStoreBuilder::tls_ca`] turns TLS on
//! (rustls, through the etcd client), [`EtcdStoreBuilder::tls_identity`]
//! presents a client certificate and [`EtcdStoreBuilder::tls_domain`]
//! names the certificates' host when it is not the endpoints'.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, KvClient, LeaseClient, Txn, TxnOp, WatchClient};
use tokio::sync::watch;

use super::{
    Acquire, AcquireRequest, Capabilities, Claim, FencingPromise, LeaseInfo, LockToken,
    ReleaseWatch, Reply, Store,
};

use crate::store::common::queue::Place;

mod acquire;
mod builder;
mod calls;
mod follow;
mod held;
mod holders;
mod keys;
mod lease;
mod queues;
mod state;

pub use builder::EtcdStoreBuilder;
use calls::{gets, owned, whole_seconds};
use follow::{AbortOnDrop, follow};
use keys::{first_of, queue_end};
use state::{Queued, Shared};

/// The most unused leases kept per ttl.
const MAX_SPARES: usize = 256;

/// How long a watch that broke waits before it resumes.
const WATCH_RETRY: Duration = Duration::from_millis(100);

/// How long a call no member could take waits before it is sent again.
const RETRY: Duration = Duration::from_millis(10);

/// What the etcd store can do, given the cluster's shortest lease. The
/// margin is the networked default: the leader expires leases by its
/// clock, counted from when it received the grant or keep-alive (after we
/// sent it); a new leader extends every lease. Left: clock rate and timer
/// slack.
fn capabilities(min_ttl: Duration) -> Capabilities {
    Capabilities::new("etcd")
        .with_ttl(min_ttl, Duration::from_secs(1))
        .with_linger()
        .with_pushed_losses()
        // A waiter's entry lives on its lease, kept alive as it asks again.
        .with_waiter_queue(queue_poll(min_ttl))
        .with_fencing(FencingPromise::INCREASING.surviving_data_loss())
        .with_shares()
        .with_permits()
}

/// How often a waiter asks again, keeping its queued entry's lease alive:
/// a quarter of the cluster's shortest lease.
fn queue_poll(min_ttl: Duration) -> Duration {
    min_ttl.checked_div(4).unwrap_or_default()
}

/// The etcd store. Cheap to clone; clones share the connection and the
/// pool of prepared leases.
///
/// # Examples
///
/// ```no_run
/// use lock_runtime::{LockError, LockOptions, LockRegistry};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// let registry = LockRegistry::etcd(&["http://10.0.0.7:2379", "http://10.0.0.8:2379"]).await?;
/// let options = LockOptions::default().ttl(Duration::from_secs(10));
/// let guard = registry.lock("stock:7", options).await?;
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct EtcdStore {
    /// One allocation for every clone: a held lock keeps a clone, and
    /// cloning the clients themselves allocates.
    inner: Arc<Inner>,
    /// The cluster's shortest lease, asked at connect.
    min_ttl: Duration,
    capabilities: Capabilities,
}

/// An [`EtcdStore`]'s clients and settings.
struct Inner {
    kv: KvClient,
    leases: LeaseClient,
    watches: WatchClient,
    shared: Arc<Shared>,
    prefix: String,
    timeout: Duration,
    shown: String,
}

impl Store for EtcdStore {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> Reply<'a, Acquire> {
        Reply::new(async move {
            let queue = self.queue_of(request.key);
            let secs = whole_seconds(request.ttl);
            // A waiter asks again with the entry it has.
            let mut known = self.inner.shared.queued().get(&request.token).cloned();
            known = known.filter(|e| e.queue == queue);
            if request.claim != Claim::Exclusive {
                return self.claim(request, queue, secs, known).await;
            }
            let placed = |e: &Queued, place| e.secs == secs && e.place == place;
            let fresh = |e: &Queued| e.lease.fresh_at.elapsed() < request.ttl / 2;
            // Told by the waiter's watch: no round trip.
            if let Some(entry) = known.take_if(|e| placed(e, Place::Head) && fresh(e)) {
                self.inner.shared.queued().remove(&request.token);
                let lease = self.granted(entry, request.token, true, request.loss);
                return Ok(Acquire::Acquired {
                    fencing: Some(lease.created.max(0).unsigned_abs()),
                    lease: Box::new(lease),
                });
            }
            // Behind others, as the waiter's watch last placed it: no
            // round trip while its entry's lease is fresh. Once the lease
            // needs keeping alive, the queue is read too (the attempt
            // below, which keeps a queued entry alive), so a deletion the
            // watch missed holds a waiter up for one keep-alive period at
            // most, not until it gives up.
            if known
                .as_ref()
                .is_some_and(|e| placed(e, Place::Behind) && self.fresh_in_queue(e))
            {
                return Ok(Acquire::Held { remaining: None });
            }
            self.attempt(request, queue, secs, known).await
        })
    }

    fn abandon<'a>(&'a self, key: &'a str, token: LockToken) -> Reply<'a, bool> {
        Reply::new(async move {
            let queue = self.queue_of(key);
            let waiting = self.inner.shared.queued().remove(&token);
            let entries = match &waiting {
                Some(waiting) => vec![waiting.entry.clone()],
                // Not known here (an attempt whose answer was lost): look
                // for the token among the entries.
                None => self.entries_of(&queue, token).await?,
            };
            let mut held = false;
            for entry in entries {
                let value = token.to_string();
                let txn = Txn::new().when([owned(&entry, &value)]).and_then([
                    TxnOp::get(queue.clone(), Some(first_of(&queue))),
                    TxnOp::delete(entry.clone(), None),
                ]);
                let answer = self.txn(&txn).await?;
                if !answer.succeeded() {
                    continue;
                }
                let first = gets(&answer).into_iter().next().flatten();
                held |= first.is_some_and(|first| first.key() == entry.as_slice());
                if let Some(waiting) = &waiting {
                    self.inner
                        .shared
                        .give_back(waiting.secs, waiting.lease, &queue);
                }
            }
            Ok(held)
        })
    }

    fn watch<'a>(&'a self, key: &'a str) -> Reply<'a, ReleaseWatch> {
        Reply::new(async move {
            let queue = self.queue_of(key);
            let (tx, rx) = watch::channel(());
            let (placed, first) = tokio::sync::oneshot::channel();
            let task = tokio::spawn(follow(self.clone(), queue, tx, placed));
            let task = AbortOnDrop(task.abort_handle());
            // The first placement (a listing, and the watch from it), so
            // no deletion after this returns is missed, and the attempt
            // that follows needs no round trip.
            match tokio::time::timeout(self.inner.timeout, first).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(err))) => return Err(err),
                Ok(Err(_)) => return Err("the etcd watch ended at once".into()),
                Err(_) => {
                    let timeout = self.inner.timeout;
                    return Err(format!("no answer from etcd within {timeout:?}").into());
                }
            }
            Ok(ReleaseWatch::new(rx, Some(Box::new(task))))
        })
    }

    /// Deletes every entry that holds the key (the first; with it, the
    /// shares or permits that hold beside it), each only if it is the
    /// entry that was read.
    fn force_release<'a>(&'a self, key: &'a str) -> Reply<'a, bool> {
        Reply::new(async move {
            let queue = self.queue_of(key);
            let holders = self.holders(&queue).await?;
            if holders.is_empty() {
                return Ok(false);
            }
            let mut deleted = false;
            for holder in holders {
                let created = holder.create_revision();
                let txn = Txn::new()
                    .when([Compare::create_revision(
                        holder.key(),
                        CompareOp::Equal,
                        created,
                    )])
                    .and_then([TxnOp::delete(holder.key(), None)]);
                deleted |= self.txn(&txn).await?.succeeded();
            }
            Ok(deleted)
        })
    }

    /// The first entry of the key's queue holds the holder's token, and its
    /// create revision is the holder's fencing token (of several shares or
    /// permits holding, the latest's); the remaining time is what etcd says
    /// of its lease, in whole seconds rounded down.
    fn inspect<'a>(&'a self, key: &'a str) -> Reply<'a, Option<LeaseInfo>> {
        Reply::new(async move {
            let queue = self.queue_of(key);
            let holders = self.holders(&queue).await?;
            let Some(holder) = holders.last() else {
                return Ok(None);
            };
            let claim = holders::claim_of(&queue, holder.key());
            let lease = holder.lease();
            let remaining = if lease == 0 {
                None
            } else {
                let left = self
                    .lease_call(|mut c| async move { c.time_to_live(lease, None).await })
                    .await?;
                // -1: the lease ended between the two reads.
                if left.ttl() < 0 {
                    return Ok(None);
                }
                Some(Duration::from_secs(left.ttl().unsigned_abs()))
            };
            let token = std::str::from_utf8(holder.value())
                .ok()
                .and_then(|value| value.parse().ok());
            let fencing = holder.create_revision().max(0).unsigned_abs();
            let info = LeaseInfo::new(token, fencing, remaining);
            Ok(Some(info.with_holders(claim, holders.len())))
        })
    }
}

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.inner.shown)
            .field("prefix", &self.inner.prefix)
            .field("min_ttl", &self.min_ttl)
            .finish_non_exhaustive()
    }
}
