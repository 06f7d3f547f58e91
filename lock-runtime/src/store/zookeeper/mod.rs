//! ZooKeeper: a FIFO queue of ephemeral sequential nodes per key, the
//! lowest holding the lock, czxid fencing, and the session for liveness.
//!
//! # How a lock is kept
//!
//! A key is a container node under the store's root (default `/locks`),
//! its name the key with every byte outside `[A-Za-z0-9_.:-]` written as
//! `%XX`, so no key can reach another key's node. Each attempt is an
//! ephemeral sequential child named after its token (`<token>-<sequence>`).
//!
//! - **Acquire** is one transaction, no read: our child's create and an
//!   empty `setData` on the key's node, whose stat (taken in the same
//!   transaction) counts the children. Every child already there has a
//!   lower sequence, so ours holds the lock exactly when it is alone. A
//!   refused attempt in skip mode deletes its child; in wait mode the child
//!   keeps its place in the queue, and the next attempt with the same token
//!   finds it by its name (also after a create whose reply was lost) and
//!   reads the queue, unless the waiter's watch already knows ours heads it.
//! - **Fencing** is the czxid of our child: the zxid of its creation,
//!   cluster-wide and strictly increasing, and lower for every child queued
//!   before ours, so the next holder always has a larger one.
//! - **Waiting** watches only the child just before ours (no herd): its
//!   deletion (a release, an expired session, a waiter that left, an
//!   overdue holder deleted) wakes us to look again. If that child headed
//!   the queue, ours heads it now (no child can join ahead of ours), and
//!   one write (the renewal's) starts our lease.
//! - **Liveness** is the ttl, as on every store. A child's data is its
//!   holder's ttl, and its holder writes it again to renew (so its `mtime`,
//!   stamped by the ensemble, is its last renewal) and when it gets the
//!   lock after waiting. A holder that stops writing (crashed, frozen, cut
//!   off) is *overdue* once the ensemble's clock is past its child's
//!   `mtime` plus its ttl plus 1 s: waiters, and
//!   attempts refused by it, delete its child then, checked against the
//!   version they read so that a renewal landing first wins. So a crashed
//!   holder blocks the key for at most its ttl and 1 s, and a waiter sees
//!   it within that (it looks when a holder could first be overdue; no
//!   polling in between), whatever the session timeout. A reaped holder
//!   that comes back learns it lost the lock (its renewal finds no node,
//!   and its watch sees the deletion). Its lease counted from before its
//!   last write, so it gave the lock up before anyone could delete it.
//!   (A waiter that waited longer than its ttl writes its node a round
//!   trip after it heads the queue; an attempt that reads the node just
//!   before takes it for overdue, and the waiter queues again: safe, but
//!   it loses its place.)
//!   The session still bounds everything: a holder's children go with its
//!   session, and a ttl may not exceed the session timeout. An expired
//!   session is pushed to every holder (body cancelled, `Lost`). The
//!   ensemble's servers' clocks are assumed to agree within the 1 s margin
//!   (writes are stamped by the leader, and a new leader uses its own).
//! - **A connection that breaks** under an acquire (a server restarted,
//!   or dropping out of its quorum, closes its clients' connections) is
//!   not the caller's error: the client takes the session to another
//!   server, and the acquire is made again there within the response
//!   timeout, finding the child the first one may have created by its
//!   name.
//! - **Release** deletes our child; `hold_at_least` deletes it later (if
//!   the session dies first, it goes with it). Deletions asked for while
//!   one is in flight go together, as one transaction (a group commit).
//!
//! # Semaphores and read-write locks
//!
//! A read share or a permit is a child in the same queue whose name says
//! what it claims (`<token>-s-<sequence>`, `<token>-p<limit>-<sequence>`).
//! As in Curator's recipes, who holds follows from the sequence: the first
//! child, and behind it the shares that follow a share, or the permits (up
//! to the limit) that follow a permit. Alone in the queue a share or
//! permit holds at once (the one request of a mutex); behind others, the
//! queue is read. Waiters are served in arrival order, so a writer that
//! queued stops every share that queued after it: readers cannot starve
//! it. A waiting share or permit watches the queue's children (any change
//! may let it in), where a mutex's waiter watches only the child ahead. A
//! key serves one claim while held: a share or permit queued behind
//! another kind is an error naming both. Fencing tokens are the children's
//! czxids, increasing in arrival order; two shares or permits that hold
//! together may be granted in the other order.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::{
    Acquire, AcquireRequest, Capabilities, FencingPromise, LeaseInfo, LockToken, ReleaseWatch,
    Reply, Store,
};

mod builder;
mod follow;
mod holders;
mod keys;
mod lease;
mod overdue;
mod queue;
mod session;
mod state;

pub use builder::ZooKeeperStoreBuilder;
use follow::{LeaveQueue, follow};
use state::{Shared, disconnected};

/// How long an acquire whose connection broke waits for the client to
/// reach another server before it is made again.
const RECONNECT: Duration = Duration::from_millis(50);

/// What the ZooKeeper store can do, given the session timeout granted.
///
/// The margin is the networked default: the holder counts its lock from
/// before its request; the ensemble expires a session no sooner than its
/// timeout after it last heard from the client, which is after that.
fn capabilities(session_timeout: Duration) -> Capabilities {
    Capabilities::new("zookeeper")
        .with_ttl(Duration::from_millis(100), Duration::from_millis(1))
        .with_max_ttl(session_timeout)
        .with_linger()
        .with_pushed_losses()
        .with_fencing(FencingPromise::INCREASING.surviving_data_loss())
        .with_shares()
        .with_permits()
}

/// The ZooKeeper store. Cheap to clone; clones share the session.
#[derive(Clone)]
pub struct ZooKeeperStore {
    shared: Arc<Shared>,
    /// The session timeout the ensemble granted: the longest ttl.
    session_timeout: Duration,
    capabilities: Capabilities,
    shown: String,
}

impl fmt::Debug for ZooKeeperStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZooKeeperStore")
            .field("servers", &self.shown)
            .field("root", &self.shared.root)
            .field("session_timeout", &self.session_timeout)
            .finish_non_exhaustive()
    }
}

impl Store for ZooKeeperStore {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> Reply<'a, Acquire> {
        Reply::new(async move {
            let parent = self.shared.parent(request.key);
            // A connection that breaks under the attempt (a server
            // restarted or out of its quorum for a moment) leaves the
            // session to another server: the attempt is made again there,
            // within the response timeout. A retried attempt by the same
            // token finds what the first one did (its child, by name).
            let deadline = Instant::now() + self.shared.timeout;
            loop {
                match self.attempt_acquire(&parent, &request).await {
                    Err(err) if disconnected(&err) && Instant::now() + RECONNECT < deadline => {
                        tracing::debug!(%err, "ZooKeeper: the connection broke under an acquire; again");
                        tokio::time::sleep(RECONNECT).await;
                    }
                    answer => return answer,
                }
            }
        })
    }

    fn abandon<'a>(&'a self, key: &'a str, token: LockToken) -> Reply<'a, bool> {
        Reply::new(async move {
            let parent = self.shared.parent(key);
            // Granted to an attempt nobody heard: its child is held.
            let known = self.shared.created().get(&token).cloned().flatten();
            let holds = known.is_some_and(|child| self.shared.held().contains_key(child.path()));
            // First, even while the ensemble is away: a create still in
            // flight is then deleted when it lands.
            let withdrew = self.shared.withdraw(&parent, token).await?;
            Ok(holds && withdrew)
        })
    }

    fn watch<'a>(&'a self, key: &'a str) -> Reply<'a, ReleaseWatch> {
        Reply::new(async move {
            let parent = self.shared.parent(key);
            let (tx, rx) = watch::channel(());
            let (placed, first) = tokio::sync::oneshot::channel();
            let task = tokio::spawn(follow(
                Arc::downgrade(&self.shared),
                parent.clone(),
                tx,
                placed,
            ));
            // The first placement (a listing and the watch on the child
            // ahead), so the attempt that follows needs no round trip.
            let _ = tokio::time::timeout(self.shared.timeout, first).await;
            // Our queued child, if the caller leaves it waiting: dropped
            // with the watch, it leaves the queue unless it got the lock.
            let leave = LeaveQueue {
                shared: Arc::downgrade(&self.shared),
                parent,
                task: task.abort_handle(),
            };
            Ok(ReleaseWatch::new(rx, Some(Box::new(leave))))
        })
    }

    fn force_release<'a>(&'a self, key: &'a str) -> Reply<'a, bool> {
        Reply::new(async move {
            let parent = self.shared.parent(key);
            let mut deleted = false;
            for holder in self.holders(&parent).await? {
                deleted |= self.shared.delete(&format!("{parent}/{holder}")).await?;
            }
            Ok(deleted)
        })
    }

    /// The head of the key's queue (of several shares or permits holding,
    /// the latest): its name starts with the holder's token, its czxid is
    /// the fencing token. The remaining time is not
    /// known outside the holder (the lock lasts while its session does and
    /// its holder renews it).
    fn inspect<'a>(&'a self, key: &'a str) -> Reply<'a, Option<LeaseInfo>> {
        Reply::new(async move {
            let parent = self.shared.parent(key);
            // The head may leave between the listing and its stat: look again.
            for _ in 0..3 {
                let holders = self.holders(&parent).await?;
                let Some(head) = holders.last() else {
                    return Ok(None);
                };
                let path = format!("{parent}/{head}");
                let stat = self
                    .shared
                    .call(self.shared.client().check_stat(&path))
                    .await?;
                if let Some(stat) = stat {
                    let token = head
                        .split_once('-')
                        .and_then(|(token, _)| token.parse().ok());
                    let fencing = stat.czxid.max(0).unsigned_abs();
                    let info = LeaseInfo::new(token, fencing, None);
                    let claim = keys::claim_of(&holders[0]);
                    return Ok(Some(info.with_holders(claim, holders.len())));
                }
            }
            Err("ZooKeeper: the head of the lock's queue kept changing while it was read".into())
        })
    }
}
