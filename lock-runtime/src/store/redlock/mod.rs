//! Redlock: one lock over N independent Redis masters, held while a majority
//! of them grant it.
//!
//! # Algorithm
//!
//! - **Acquire**: the single-node acquire script runs on all N nodes at once,
//!   each bounded by a per-node timeout of `ttl / 10` (between 5 ms and 1 s;
//!   [`RedlockStoreBuilder::node_timeout`] sets it).
//!   The lock is ours when a majority (N/2 + 1) granted it and time is left:
//!   validity = `ttl` − elapsed (monotonic clock) − drift, with drift =
//!   `ttl × 0.01 + 2 ms` ([`RedlockStoreBuilder::clock_drift`]). Otherwise it is released on every node, those that
//!   failed included, and the caller retries: when the holder's lease ends,
//!   on a release notification, or after a short random delay when no one won
//!   the vote (up to `ttl / 20`, between 2 and 50 ms;
//!   [`RedlockStoreBuilder::retry_delay`]).
//! - **Renew** (the watchdog, every `ttl / 3`) re-acquires on every node: an
//!   owner-checked extension where the lease is still ours and, while a
//!   majority still has it, the acquire script where a node lost it (a
//!   restart, say). It counts only with a majority within the current
//!   validity; otherwise the lease is lost and the body is cancelled, as on
//!   one node. A lease a majority no longer has (a forced release) is never
//!   taken back.
//! - **Release** runs on every node, owner-checked. Inside the validity
//!   window it succeeds when any node still had the lease (nodes that never
//!   granted it, or restarted, answer "not ours"); when none had it, the
//!   lease was taken (a forced release) and the holder gets `Lost`.
//! - **Wake-ups**: each node's release notification wakes waiters.
//!
//! # What the fencing token guarantees
//!
//! On acquire, each granting node issues a token as one Redis does (its
//! clock in microseconds, or one more than its last token for the key); the
//! lock's token is the largest of those, and before the lock is handed out
//! every reachable node's counter is raised to it for at least the ttl (a
//! majority must confirm). Any two majorities share a node, so the token
//! strictly increases from one holder to the next **as long as a majority of
//! the nodes that confirmed the raise keeps its data until the next
//! acquisition, or the nodes' clocks agree to within the time between the
//! two acquisitions**. Nodes that restart without persistence lose their
//! leases as well: if a majority does so, two holders can overlap. Run the
//! nodes with `appendonly yes` and `appendfsync always`, or keep a crashed
//! node down for longer than the largest ttl before restarting it (the
//! Redlock paper's "delayed restart"). Counters expire with the leases, so
//! no per-key state is left once a key is free.
//!
//! Redlock rests on timing assumptions (bounded clock drift, bounded pauses of
//! the holder); see Martin Kleppmann's "How to do distributed locking" for
//! when those do not hold. N nodes of one Redis Cluster, or one master and its
//! replicas, are **not** independent: use separate masters.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::sync::{OnceCell, watch};
use tokio::time::{Instant, timeout};

mod builder;
mod lease;

pub use builder::RedlockStoreBuilder;
use builder::Timing;
use lease::RedlockLease;

use super::redis::{RedisStore, RedisStoreBuilder};
use super::{
    Acquire, AcquireRequest, Capabilities, FencingPromise, LeaseInfo, LockToken, ReleaseWatch,
    Reply, SafetyMargin, Store,
};
use crate::error::{LockError, StoreError};
use crate::store::common::redact::redact;

/// What Redlock can do. The shortest lease leaves room for the node round
/// trips and the margin: the drift allowance (by default 1 % of the ttl
/// plus 2 ms) plus the 10 ms a single Redis keeps for timers and cancelling
/// the body.
fn capabilities(timing: &Timing) -> Capabilities {
    Capabilities::new("redlock")
        .with_ttl(Duration::from_millis(50), Duration::from_millis(1))
        .with_linger()
        .with_margin(SafetyMargin::new(
            Duration::from_millis(12),
            timing.drift_ppm,
        ))
        .with_fencing(FencingPromise::INCREASING)
}

/// One Redis master, connected on first use (so a node that is down when the
/// registry is built can join later).
struct Node {
    /// Its URL and connection settings.
    builder: RedisStoreBuilder,
    shown: String,
    store: OnceCell<RedisStore>,
}

impl Node {
    /// Its store, connected now if it was not yet.
    async fn store(&self) -> Result<&RedisStore, StoreError> {
        self.store
            .get_or_try_init(|| self.builder.clone().connect_store())
            .await
    }
}

/// The Redlock store over N ≥ 3 independent Redis masters. Cheap to clone.
#[derive(Clone)]
pub struct RedlockStore {
    nodes: Arc<[Node]>,
    timing: Timing,
    capabilities: Capabilities,
}

/// A node's answer, or why there was none.
type NodeResult<T> = Result<T, StoreError>;

impl RedlockStore {
    /// Connects to the nodes at `urls` with the default settings (see
    /// [`builder`](Self::builder)).
    ///
    /// # Errors
    ///
    /// As [`RedlockStoreBuilder::connect`].
    pub async fn connect(urls: &[&str]) -> Result<RedlockStore, LockError> {
        RedlockStore::builder(urls).connect().await
    }

    /// Starts configuring a store over the Redis masters at `urls`
    /// (`redis://` or, with the `redis-tls` feature, `rediss://`).
    pub fn builder(urls: &[&str]) -> RedlockStoreBuilder {
        RedlockStoreBuilder::new(urls)
    }

    /// Checks the nodes and connects to those that answer.
    async fn open(
        urls: &[String],
        node: impl Fn(&str) -> RedisStoreBuilder,
        timing: Timing,
    ) -> Result<RedlockStore, StoreError> {
        if urls.len() < 3 {
            return Err(format!(
                "redlock needs at least 3 independent Redis masters, got {}",
                urls.len()
            )
            .into());
        }
        let mut seen = HashSet::new();
        for url in urls {
            let info = ::redis::Client::open(url.as_str())
                .map_err(|err| format!("invalid node URL `{}`: {err}", redact(url)))?
                .get_connection_info()
                .clone();
            let address = format!("{}/{}", info.addr(), info.redis_settings().db());
            if !seen.insert(address.clone()) {
                return Err(format!(
                    "redlock node {address} is given twice; the nodes must be independent"
                )
                .into());
            }
        }
        let redlock = RedlockStore {
            nodes: urls
                .iter()
                .map(|url| Node {
                    builder: node(url),
                    shown: redact(url),
                    store: OnceCell::new(),
                })
                .collect(),
            capabilities: capabilities(&timing),
            timing,
        };
        let reached = join_all(redlock.nodes.iter().map(|node| async move {
            timeout(Duration::from_secs(2), node.store())
                .await
                .map_err(|_| -> StoreError { "timed out".into() })
                .and_then(|result| result.map(|_| ()))
        }))
        .await;
        let up = reached.iter().filter(|result| result.is_ok()).count();
        if up < redlock.quorum() {
            return Err(redlock.no_quorum("connect", up, &reached).into());
        }
        Ok(redlock)
    }

    /// How many nodes must agree: N/2 + 1.
    pub fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// The per-node timeout for a lease of `ttl`.
    fn node_timeout(&self, ttl: Duration) -> Duration {
        self.timing.node_timeout(ttl)
    }

    /// The clock-drift allowance for a lease of `ttl`.
    fn drift(&self, ttl: Duration) -> Duration {
        self.timing.drift(ttl)
    }

    /// Runs `op` on every node at once, each within `limit`.
    async fn on_all<'a, T, F, Fut>(&'a self, limit: Duration, op: F) -> Vec<NodeResult<T>>
    where
        F: Fn(&'a RedisStore) -> Fut,
        Fut: std::future::Future<Output = NodeResult<T>> + 'a,
    {
        join_all(self.nodes.iter().map(|node| on_node(node, limit, &op))).await
    }

    /// Releases `token`'s lease on every node; how many released it.
    async fn release_everywhere(&self, key: &str, token: LockToken, ttl: Duration) -> usize {
        let results = self
            .on_all(self.node_timeout(ttl), |node| {
                node.release_token(key, token, Duration::ZERO)
            })
            .await;
        tally(&results).0
    }

    /// Describes a failed quorum with each node's error.
    fn no_quorum<T>(&self, action: &str, ok: usize, results: &[NodeResult<T>]) -> String {
        let errors: Vec<String> = self
            .nodes
            .iter()
            .zip(results)
            .filter_map(|(node, result)| {
                result
                    .as_ref()
                    .err()
                    .map(|err| format!("{}: {err}", node.shown))
            })
            .collect();
        format!(
            "redlock could not {action} on a majority: {ok} of {} nodes answered, {} needed; {}",
            self.nodes.len(),
            self.quorum(),
            errors.join("; ")
        )
    }
}

/// Runs `op` on one node (connecting it if need be) within `limit`.
async fn on_node<'a, T, F, Fut>(node: &'a Node, limit: Duration, op: &F) -> NodeResult<T>
where
    F: Fn(&'a RedisStore) -> Fut,
    Fut: std::future::Future<Output = NodeResult<T>> + 'a,
{
    let call = async move { op(node.store().await?).await };
    match timeout(limit, call).await {
        Ok(result) => result,
        Err(_) => Err(format!("no answer within {limit:?}").into()),
    }
}

/// How many nodes said "ours" (`Ok(true)`) and "not ours" (`Ok(false)`).
fn tally(results: &[NodeResult<bool>]) -> (usize, usize) {
    let ours = results.iter().filter(|r| matches!(r, Ok(true))).count();
    let not_ours = results.iter().filter(|r| matches!(r, Ok(false))).count();
    (ours, not_ours)
}

impl Store for RedlockStore {
    fn capabilities(&self) -> &Capabilities {
        &self.capabilities
    }

    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> Reply<'a, Acquire> {
        let AcquireRequest {
            key,
            token,
            ttl,
            hints,
            ..
        } = request;
        let waits = hints.waits;
        Reply::new(async move {
            let started = Instant::now();
            let limit = self.node_timeout(ttl);
            let results = self
                .on_all(limit, |node| node.try_acquire(key, token, ttl, waits))
                .await;
            let mut fencing = Vec::new();
            let mut held = Vec::new();
            for result in &results {
                match result {
                    Ok(Ok(f)) => fencing.push(*f),
                    Ok(Err(remaining)) => held.push(*remaining),
                    Err(_) => {}
                }
            }
            let validity = ttl
                .checked_sub(started.elapsed())
                .and_then(|left| left.checked_sub(self.drift(ttl)));
            if fencing.len() >= self.quorum() && validity.is_some_and(|v| !v.is_zero()) {
                let token_value = fencing.iter().copied().max().unwrap_or(0);
                let raised = self
                    .on_all(limit, |node| {
                        node.raise_fencing(key, token_value, token, ttl)
                    })
                    .await;
                if raised.iter().filter(|r| r.is_ok()).count() >= self.quorum() {
                    let valid_until = started + ttl - self.drift(ttl);
                    let lease = RedlockLease::new(self.clone(), key, token, ttl, valid_until);
                    return Ok(Acquire::Acquired {
                        fencing: Some(token_value),
                        lease: Box::new(lease),
                    });
                }
            }
            self.release_everywhere(key, token, ttl).await;
            if fencing.len() + held.len() < self.quorum() {
                return Err(self
                    .no_quorum("acquire", fencing.len() + held.len(), &results)
                    .into());
            }
            // Held by someone with a majority: retry when their lease ends.
            // A split vote (or a slow round): retry after a random pause.
            let remaining = if held.len() >= self.quorum() {
                let mut ends: Vec<Duration> =
                    held.iter().map(|r| r.unwrap_or(Duration::ZERO)).collect();
                ends.sort_unstable();
                // The lease stands while a majority still has it.
                Some(ends[ends.len() - self.quorum()])
            } else {
                Some(self.timing.split_vote_delay(ttl))
            };
            Ok(Acquire::Held { remaining })
        })
    }

    fn abandon<'a>(&'a self, key: &'a str, token: LockToken) -> Reply<'a, bool> {
        Reply::new(async move {
            let ttl = Duration::from_secs(1);
            Ok(self.release_everywhere(key, token, ttl).await > 0)
        })
    }

    fn watch<'a>(&'a self, key: &'a str) -> Reply<'a, ReleaseWatch> {
        Reply::new(async move {
            let results = self
                .on_all(Duration::from_secs(1), |node| node.watch(key))
                .await;
            let (tx, rx) = watch::channel(());
            let mut subscribed = 0;
            for inner in results.into_iter().flatten() {
                subscribed += 1;
                tokio::spawn(forward(inner, tx.clone()));
            }
            if subscribed == 0 {
                return Err(
                    "redlock could not subscribe to release notifications on any node".into(),
                );
            }
            Ok(ReleaseWatch::new(rx, None))
        })
    }

    fn force_release<'a>(&'a self, key: &'a str) -> Reply<'a, bool> {
        Reply::new(async move {
            let results = self
                .on_all(Duration::from_secs(1), |node| node.force_release(key))
                .await;
            let (deleted, kept) = tally(&results);
            if deleted + kept == 0 {
                return Err(self.no_quorum("force-release", 0, &results).into());
            }
            Ok(deleted > 0)
        })
    }

    /// The holder is the token a majority of the nodes have; its lease
    /// stands while a majority still has it, and its fencing token is the
    /// largest those nodes issued.
    fn inspect<'a>(&'a self, key: &'a str) -> Reply<'a, Option<LeaseInfo>> {
        Reply::new(async move {
            let results = self
                .on_all(Duration::from_secs(1), |node| node.inspect(key))
                .await;
            let answered: Vec<&Option<LeaseInfo>> = results.iter().flatten().collect();
            if answered.len() < self.quorum() {
                return Err(self.no_quorum("inspect", answered.len(), &results).into());
            }
            let mut seen: Vec<&LeaseInfo> =
                answered.iter().filter_map(|info| info.as_ref()).collect();
            seen.sort_by_key(|info| info.token.map(LockToken::as_u128));
            let holder = seen
                .chunk_by(|a, b| a.token == b.token)
                .find(|same| same.len() >= self.quorum() && same[0].token.is_some());
            let Some(same) = holder else {
                return Ok(None);
            };
            let mut ends: Vec<Duration> = same
                .iter()
                .map(|info| info.remaining.unwrap_or(Duration::MAX))
                .collect();
            ends.sort_unstable();
            let remaining = ends[ends.len() - self.quorum()];
            let fencing = same.iter().map(|info| info.fencing).max().unwrap_or(0);
            Ok(Some(LeaseInfo::new(
                same[0].token,
                fencing,
                (remaining != Duration::MAX).then_some(remaining),
            )))
        })
    }
}

/// Forwards one node's releases to the combined watch until it is dropped.
async fn forward(mut inner: ReleaseWatch, tx: watch::Sender<()>) {
    loop {
        tokio::select! {
            () = tx.closed() => return,
            () = inner.released() => {
                tx.send_replace(());
            }
        }
    }
}

impl fmt::Debug for RedlockStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nodes: Vec<&str> = self.nodes.iter().map(|node| node.shown.as_str()).collect();
        f.debug_struct("RedlockStore")
            .field("nodes", &nodes)
            .field("quorum", &self.quorum())
            .finish()
    }
}
