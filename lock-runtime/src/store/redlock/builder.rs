//! Configuring and connecting a [`RedlockStore`]: each node's connection,
//! and the algorithm's timings.

use std::time::Duration;

use super::RedlockStore;
use crate::error::LockError;
use crate::store::common::connect::{self, Timeouts, timeout_setters};
use crate::store::common::redact::redact;
use crate::store::redis::{RedisStore, RedisStoreBuilder, TlsSettings, tls_setters};

/// Configures and connects a [`RedlockStore`].
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use lock_runtime::{LockRegistry, RedlockStore};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_runtime::LockError> {
/// let store = RedlockStore::builder(&["redis://10.0.0.1", "redis://10.0.0.2", "redis://10.0.0.3"])
///     .node_timeout(Duration::from_millis(50))
///     .clock_drift(0.02)
///     .response_timeout(Duration::from_millis(500))
///     .connect()
///     .await?;
/// let locks = LockRegistry::new(store);
/// # let _ = locks; Ok(()) }
/// ```
#[derive(Debug)]
pub struct RedlockStoreBuilder {
    urls: Vec<String>,
    timeouts: Timeouts,
    connection_retries: usize,
    timing: Timing,
    /// What a setter got that cannot work (checked at `connect`).
    invalid: Option<String>,
    /// Each node's certificates, for `rediss://` nodes.
    tls: TlsSettings,
}

/// The algorithm's timings (see the [module docs](super#algorithm)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Timing {
    /// Fixed per-node timeout; `None`: a tenth of the ttl, 5 ms to 1 s.
    node_timeout: Option<Duration>,
    /// The clock-drift allowance in millionths of the ttl (plus 2 ms).
    pub(super) drift_ppm: u32,
    /// The longest random pause after a split vote; `None`: a twentieth of
    /// the ttl, 2 to 50 ms.
    retry_delay: Option<Duration>,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            node_timeout: None,
            drift_ppm: 10_000,
            retry_delay: None,
        }
    }
}

impl Timing {
    /// How long one node may take to answer for a lease of `ttl`.
    pub(super) fn node_timeout(&self, ttl: Duration) -> Duration {
        self.node_timeout
            .unwrap_or_else(|| (ttl / 10).clamp(Duration::from_millis(5), Duration::from_secs(1)))
    }

    /// The clock-drift allowance for a lease of `ttl`.
    pub(super) fn drift(&self, ttl: Duration) -> Duration {
        let proportional = ttl.as_nanos() * u128::from(self.drift_ppm) / 1_000_000;
        Duration::from_nanos(u64::try_from(proportional).unwrap_or(u64::MAX))
            + Duration::from_millis(2)
    }

    /// A random pause after a split vote, so contenders do not collide
    /// again.
    pub(super) fn split_vote_delay(&self, ttl: Duration) -> Duration {
        let max = self.retry_delay.unwrap_or_else(|| {
            (ttl / 20).clamp(Duration::from_millis(2), Duration::from_millis(50))
        });
        let max = u64::try_from(max.as_micros())
            .unwrap_or(u64::MAX)
            .max(1_000);
        Duration::from_micros(rand::random_range(1_000..=max))
    }
}

impl RedlockStoreBuilder {
    pub(super) fn new(urls: &[&str]) -> Self {
        RedlockStoreBuilder {
            urls: urls.iter().map(|url| (*url).to_owned()).collect(),
            timeouts: Timeouts::new(Duration::from_secs(2), Duration::from_secs(1)),
            connection_retries: 2,
            timing: Timing::default(),
            invalid: None,
            tls: TlsSettings::default(),
        }
    }

    timeout_setters!(call: "one command on a node", "2 s"; connect: "1 s");

    /// How many times a node's failed connection is tried again (default
    /// 2), as [`RedisStoreBuilder::connection_retries`].
    pub fn connection_retries(mut self, retries: usize) -> Self {
        self.connection_retries = retries;
        self
    }

    /// How long each node may take to answer an acquire or renewal before
    /// it counts as not granting (default: a tenth of the ttl, between 5 ms
    /// and 1 s). Every node is asked at once, so this bounds one round. At
    /// least 1 ms.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        if timeout < Duration::from_millis(1) {
            self.invalid = Some(format!(
                "the node timeout ({timeout:?}) must be at least 1 ms"
            ));
        }
        self.timing.node_timeout = Some(timeout);
        self
    }

    /// The clock-drift allowance as a fraction of the ttl (default 0.01,
    /// the Redlock paper's): a lease counts as held until `ttl` −
    /// elapsed − (`ttl × factor` + 2 ms), and the runtime's margin grows
    /// with it. Raise it where the nodes' clocks may run at different
    /// rates. Between 0 and 0.5.
    pub fn clock_drift(mut self, factor: f64) -> Self {
        if !(0.0..=0.5).contains(&factor) {
            self.invalid = Some(format!(
                "the clock drift factor ({factor}) must be between 0 and 0.5"
            ));
        } else {
            self.timing.drift_ppm = (factor * 1_000_000.0).round() as u32;
        }
        self
    }

    /// The longest random pause before trying again after a split vote
    /// (no contender won a majority; default: a twentieth of the ttl,
    /// between 2 and 50 ms). Contenders retry at random within it, so one
    /// of them wins the next round. At least 1 ms.
    pub fn retry_delay(mut self, max: Duration) -> Self {
        if max < Duration::from_millis(1) {
            self.invalid = Some(format!("the retry delay ({max:?}) must be at least 1 ms"));
        }
        self.timing.retry_delay = Some(max);
        self
    }

    tls_setters!("every `rediss://` node");

    /// Connects to the nodes.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidSettings`] for a setting that cannot work;
    /// [`LockError::Connect`] naming the nodes (passwords redacted) for
    /// fewer than 3 nodes, an address given twice (same host, port and
    /// database), an invalid URL, or fewer than a majority of the nodes
    /// reachable now. Nodes that are down but not a majority are connected
    /// when they come back.
    pub async fn connect(self) -> Result<RedlockStore, LockError> {
        let shown: Vec<String> = self.urls.iter().map(|url| redact(url)).collect();
        let shown = shown.join(", ");
        if let Some(reason) = self.invalid.clone() {
            return Err(LockError::InvalidSettings {
                store: "redlock",
                address: shown,
                reason,
            });
        }
        let node = |url: &str| self.node(url);
        connect::opened(
            "redlock",
            shown,
            RedlockStore::open(&self.urls, node, self.timing),
        )
        .await
    }

    /// The settings of the node at `url`.
    fn node(&self, url: &str) -> RedisStoreBuilder {
        RedisStore::builder(url)
            .response_timeout(self.timeouts.response)
            .connection_timeout(self.timeouts.connection)
            .connection_retries(self.connection_retries)
            .with_tls(self.tls.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timings_default_to_the_ttl_s_fractions_and_take_settings() {
        let timing = Timing::default();
        let ttl = Duration::from_secs(10);
        assert_eq!(timing.node_timeout(ttl), Duration::from_secs(1));
        assert_eq!(
            timing.node_timeout(Duration::from_millis(20)),
            Duration::from_millis(5)
        );
        assert_eq!(timing.drift(ttl), Duration::from_millis(102));
        for _ in 0..100 {
            let pause = timing.split_vote_delay(ttl);
            assert!(pause >= Duration::from_millis(1) && pause <= Duration::from_millis(50));
        }
        let set = RedlockStoreBuilder::new(&["redis://a", "redis://b", "redis://c"])
            .node_timeout(Duration::from_millis(30))
            .clock_drift(0.05)
            .retry_delay(Duration::from_millis(3));
        assert!(set.invalid.is_none());
        assert_eq!(set.timing.node_timeout(ttl), Duration::from_millis(30));
        assert_eq!(set.timing.drift(ttl), Duration::from_millis(502));
        for _ in 0..100 {
            assert!(set.timing.split_vote_delay(ttl) <= Duration::from_millis(3));
        }
    }

    #[test]
    fn settings_that_cannot_work_are_kept_for_connect_to_refuse() {
        let nodes = ["redis://a", "redis://b", "redis://c"];
        let drift = RedlockStoreBuilder::new(&nodes).clock_drift(0.9);
        assert!(drift.invalid.unwrap().contains("clock drift factor (0.9)"));
        let drift = RedlockStoreBuilder::new(&nodes).clock_drift(f64::NAN);
        assert!(drift.invalid.is_some());
        let node = RedlockStoreBuilder::new(&nodes).node_timeout(Duration::ZERO);
        assert!(node.invalid.unwrap().contains("node timeout"));
        let retry = RedlockStoreBuilder::new(&nodes).retry_delay(Duration::from_micros(10));
        assert!(retry.invalid.unwrap().contains("retry delay"));
    }
}
