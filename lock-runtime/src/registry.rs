//! The registry: one backend, a namespace, the local wait queues, and the
//! waiting strategy. Also the process-wide registry behind the attribute.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use once_cell::sync::OnceCell;
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};
use tokio::time::{Instant, sleep_until, timeout_at};

use crate::backend::memory::MemoryBackend;
use crate::backend::{Acquire, Backend, LockToken, ReleaseWatch};
use crate::guard::LockGuard;
use crate::options::Mode;
use crate::{LockError, LockOptions};

/// The longest key accepted, in bytes (namespace not included).
pub const MAX_KEY_LEN: usize = 64 * 1024;

/// The longest a waiter sleeps between attempts when no release arrives.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(5);

/// The delay before the next attempt when the holder's remaining time is
/// unknown.
const UNKNOWN_HOLD_DELAY: Duration = Duration::from_millis(50);

static REGISTRY: OnceCell<LockRegistry> = OnceCell::new();

/// Installs the process-wide registry that `#[distributed_lock]` functions use.
///
/// # Errors
///
/// [`LockError::AlreadyInitialized`] if a registry is already installed; the
/// first one stays in place.
///
/// # Examples
///
/// ```
/// lock_runtime::init(lock_runtime::LockRegistry::memory()).unwrap();
/// assert!(lock_runtime::init(lock_runtime::LockRegistry::memory()).is_err());
/// ```
pub fn init(registry: LockRegistry) -> Result<(), LockError> {
    REGISTRY
        .set(registry)
        .map_err(|_| LockError::AlreadyInitialized)
}

/// Returns the process-wide registry installed by [`init`].
///
/// # Errors
///
/// [`LockError::NotInitialized`] before [`init`] was called.
pub fn registry() -> Result<&'static LockRegistry, LockError> {
    REGISTRY.get().ok_or(LockError::NotInitialized)
}

/// A lock store plus everything the locks of one process share: the
/// namespace, and one wait queue per contended key.
///
/// Cheap to clone; clones share the queues. Within one registry, tasks that
/// want the same key queue locally (first come, first served), so only one
/// of them contends in the store at a time.
///
/// # Examples
///
/// ```
/// use lock_runtime::{LockOptions, LockRegistry};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_runtime::LockError> {
/// let registry = LockRegistry::memory();
/// let guard = registry.lock("report:2026-11", LockOptions::default()).await?;
/// assert!(registry.try_lock("report:2026-11", LockOptions::default()).await?.is_none());
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct LockRegistry {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Arc<dyn Backend>,
    /// `"ns:"`, or empty without a namespace.
    prefix: String,
    local: Mutex<HashMap<String, Arc<SlotShared>>>,
    /// Identifies this registry to the per-thread lease renewers.
    renewal_owner: Arc<()>,
}

/// Builds a [`LockRegistry`] over any [`Backend`].
#[derive(Debug)]
pub struct RegistryBuilder {
    backend: Arc<dyn Backend>,
    namespace: Option<String>,
}

impl RegistryBuilder {
    /// Prefixes every key with `namespace` and a colon, so several
    /// applications can share one store. Letters, digits, `_`, `-` and `.`
    /// only, so the namespace always ends at the first colon and no key can
    /// reach into another namespace.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = Some(namespace.into());
        self
    }

    /// Builds the registry.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidKey`] if the namespace is empty or has other
    /// characters than the ones [`namespace`](Self::namespace) allows.
    pub fn build(self) -> Result<LockRegistry, LockError> {
        let prefix = match self.namespace {
            None => String::new(),
            Some(ns) => {
                let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
                if ns.is_empty() || !ns.chars().all(allowed) {
                    return Err(LockError::InvalidKey {
                        key: LockError::shown_key(&ns),
                        reason: "a namespace must be non-empty and contain only ASCII letters, digits, `_`, `-` and `.`".into(),
                    });
                }
                format!("{ns}:")
            }
        };
        Ok(LockRegistry {
            inner: Arc::new(Inner {
                backend: self.backend,
                prefix,
                local: Mutex::default(),
                renewal_owner: Arc::default(),
            }),
        })
    }
}

impl LockRegistry {
    /// An in-process registry over a fresh [`MemoryBackend`]: locks exclude
    /// tasks of this process only.
    pub fn memory() -> LockRegistry {
        LockRegistry::from_backend(Arc::new(MemoryBackend::new()))
    }

    /// A registry over one Redis server (`redis://[:password@]host:port[/db]`),
    /// with the [`RedisBackend`](crate::RedisBackend) defaults.
    ///
    /// # Errors
    ///
    /// [`LockError::Backend`] naming the URL (password redacted) when the URL
    /// is invalid or the server cannot be reached or refuses the credentials.
    #[cfg(feature = "redis")]
    pub async fn redis(url: &str) -> Result<LockRegistry, LockError> {
        let backend = crate::RedisBackend::builder(url)
            .connect()
            .await
            .map_err(|source| LockError::Backend {
                key: crate::backend::redis::redact(url),
                action: "connect to",
                source,
            })?;
        LockRegistry::builder(backend).build()
    }

    /// A registry over N ≥ 3 independent Redis masters with the Redlock
    /// algorithm; see [`RedlockBackend`](crate::RedlockBackend) for what it
    /// promises and what it needs.
    ///
    /// # Errors
    ///
    /// [`LockError::Backend`] naming the nodes (passwords redacted) for fewer
    /// than 3 nodes, a node given twice, an invalid URL, or fewer than a
    /// majority reachable.
    #[cfg(feature = "redis")]
    pub async fn redlock(urls: &[&str]) -> Result<LockRegistry, LockError> {
        let backend = crate::RedlockBackend::connect(urls)
            .await
            .map_err(|source| LockError::Backend {
                key: urls
                    .iter()
                    .map(|url| crate::backend::redis::redact(url))
                    .collect::<Vec<_>>()
                    .join(", "),
                action: "connect to",
                source,
            })?;
        LockRegistry::builder(backend).build()
    }

    /// Starts building a registry over `backend`.
    pub fn builder(backend: impl Backend) -> RegistryBuilder {
        RegistryBuilder {
            backend: Arc::new(backend),
            namespace: None,
        }
    }

    fn from_backend(backend: Arc<dyn Backend>) -> LockRegistry {
        LockRegistry {
            inner: Arc::new(Inner {
                backend,
                prefix: String::new(),
                local: Mutex::default(),
                renewal_owner: Arc::default(),
            }),
        }
    }

    /// The store this registry uses.
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.inner.backend
    }

    /// Waits for the lock on `key` and returns its guard.
    ///
    /// # Errors
    ///
    /// [`LockError::Timeout`] when `opts.wait_timeout` passes first,
    /// [`LockError::InvalidKey`] / [`LockError::InvalidOptions`] for bad
    /// input, [`LockError::Backend`] when the store fails.
    ///
    /// # Cancellation
    ///
    /// Dropping the future while it waits leaves nothing behind; dropping it
    /// after the store granted the lease but before it returned releases the
    /// lease.
    pub async fn lock(&self, key: &str, opts: LockOptions) -> Result<LockGuard, LockError> {
        let full_key = self.full_key(key)?;
        self.wait_for(key, full_key, &opts).await
    }

    /// Waits for the lock on an already namespaced key.
    pub(crate) async fn wait_for(
        &self,
        key: &str,
        full_key: String,
        opts: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        match self.acquire(key, full_key, opts, Mode::Wait).await? {
            Some(guard) => Ok(guard),
            // Waiting never gives up without a deadline; keep the type honest.
            None => Err(LockError::Timeout {
                key: LockError::shown_key(key),
                waited: Duration::ZERO,
            }),
        }
    }

    /// Makes one attempt at the lock on `key`: `Ok(None)` when it is held,
    /// by another process or by another task of this one.
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock), without `Timeout`; a `wait_timeout` in
    /// `opts` is an [`LockError::InvalidOptions`].
    pub async fn try_lock(
        &self,
        key: &str,
        opts: LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        let full_key = self.full_key(key)?;
        self.acquire(key, full_key, &opts, Mode::Skip).await
    }

    pub(crate) fn renewal_owner(&self) -> &Arc<()> {
        &self.inner.renewal_owner
    }

    /// An id that tells registries apart (clones share it).
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as *const () as usize
    }

    /// Validates `key` and puts the namespace in front of it.
    pub(crate) fn full_key(&self, key: &str) -> Result<String, LockError> {
        let reason = if key.is_empty() {
            "a key must not be empty".to_owned()
        } else if key.len() > MAX_KEY_LEN {
            format!(
                "a key may be at most {MAX_KEY_LEN} bytes, this one has {}",
                key.len()
            )
        } else {
            return Ok(format!("{}{key}", self.inner.prefix));
        };
        Err(LockError::InvalidKey {
            key: LockError::shown_key(key),
            reason,
        })
    }

    /// Queues locally, then contends in the store; `None` only in skip mode.
    pub(crate) async fn acquire(
        &self,
        key: &str,
        full_key: String,
        opts: &LockOptions,
        mode: Mode,
    ) -> Result<Option<LockGuard>, LockError> {
        opts.validate(key, mode)?;
        let min_ttl = self.inner.backend.min_ttl();
        if opts.ttl < min_ttl {
            return Err(LockError::invalid_options(
                key,
                format!(
                    "ttl {:?} is shorter than this backend's minimum {min_ttl:?}",
                    opts.ttl
                ),
            ));
        }
        let started = Instant::now();
        let deadline = opts.wait_timeout.map(|timeout| started + timeout);
        let timed_out = || LockError::Timeout {
            key: LockError::shown_key(key),
            waited: started.elapsed(),
        };
        let slot = self.local_slot(full_key);
        let permit = match mode {
            Mode::Skip => match slot.try_lock() {
                Some(permit) => permit,
                None => {
                    tracing::debug!(key, "lock held by another task of this process; skipping");
                    return Ok(None);
                }
            },
            Mode::Wait => within(deadline, slot.lock()).await.ok_or_else(timed_out)?,
        };
        let backend = &*self.inner.backend;
        let ttl = opts.ttl_millis();
        if let Some(baton) = permit.take_baton() {
            if baton.ttl == ttl {
                tracing::debug!(
                    key,
                    fencing = baton.fencing,
                    waited_ms = started.elapsed().as_millis() as u64,
                    "lock handed over by the previous holder in this process"
                );
                let guard = LockGuard::new(
                    self.clone(),
                    key,
                    baton.token,
                    baton.fencing,
                    baton.sent_at,
                    opts,
                    permit,
                )
                .with_chain(baton.chain);
                return Ok(Some(guard));
            }
            // Handed over with another ttl: give it back and take our own.
            backend
                .release(permit.key(), baton.token, Duration::ZERO)
                .await
                .map_err(|source| LockError::backend(key, "release", source))?;
        }
        let full_key = permit.key();
        let token = LockToken::random();
        let mut watch: Option<ReleaseWatch> = None;
        loop {
            let attempt_at = Instant::now();
            let attempt = within(deadline, backend.acquire(full_key, token, ttl))
                .await
                .ok_or_else(timed_out)?
                .map_err(|source| LockError::backend(key, "acquire", source))?;
            let remaining = match attempt {
                Acquire::Acquired { fencing } => {
                    tracing::debug!(
                        key,
                        fencing,
                        waited_ms = started.elapsed().as_millis() as u64,
                        "lock acquired"
                    );
                    let guard =
                        LockGuard::new(self.clone(), key, token, fencing, attempt_at, opts, permit);
                    return Ok(Some(guard));
                }
                Acquire::Held { remaining } => remaining,
            };
            if mode == Mode::Skip {
                tracing::debug!(key, "lock held elsewhere; skipping");
                return Ok(None);
            }
            let Some(watch) = watch.as_mut() else {
                // Subscribe, then retry at once: a release that happened
                // between the attempt and the subscription is not missed.
                let subscribed = within(deadline, backend.watch(full_key))
                    .await
                    .ok_or_else(timed_out)?
                    .map_err(|source| LockError::backend(key, "watch", source))?;
                watch = Some(subscribed);
                tracing::debug!(
                    key,
                    remaining_ms = remaining.map(|r| r.as_millis() as u64),
                    "lock contended; waiting"
                );
                continue;
            };
            let mut wake = Instant::now() + retry_delay(remaining);
            if let Some(deadline) = deadline {
                wake = wake.min(deadline);
            }
            tokio::select! {
                () = watch.released() => {}
                () = sleep_until(wake) => {}
            }
            if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                return Err(timed_out());
            }
        }
    }

    /// Gets or creates the local queue for `full_key`.
    fn local_slot(&self, full_key: String) -> LocalSlot {
        let shared = self.local().entry(full_key.clone()).or_default().clone();
        LocalSlot {
            registry: self.clone(),
            full_key,
            shared,
        }
    }

    fn local(&self) -> MutexGuard<'_, HashMap<String, Arc<SlotShared>>> {
        // Every update under this lock is a single map operation, so the map
        // is consistent even if a holder panicked.
        self.inner
            .local
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// How many keys have a local queue: keys held or waited for by this
    /// registry's tasks right now.
    pub fn local_keys(&self) -> usize {
        self.local().len()
    }
}

/// Runs `fut` until `deadline`; `None` if the deadline came first.
async fn within<F: std::future::Future>(deadline: Option<Instant>, fut: F) -> Option<F::Output> {
    match deadline {
        None => Some(fut.await),
        Some(deadline) => timeout_at(deadline, fut).await.ok(),
    }
}

/// When to try again without a release notification: when the holder's
/// lease says it ends, plus jitter so waiting processes do not all retry in
/// the same millisecond; never later than `MAX_RETRY_DELAY`.
fn retry_delay(remaining: Option<Duration>) -> Duration {
    let base = remaining.unwrap_or(UNKNOWN_HOLD_DELAY).min(MAX_RETRY_DELAY);
    let spread = (base / 8).clamp(Duration::from_millis(1), Duration::from_millis(50));
    let jitter = rand::random_range(0..=spread.as_micros() as u64);
    base + Duration::from_micros(jitter)
}

/// How many times in a row a lease may be handed to the next task of this
/// process before it is released in the store, so that other processes get
/// their turn.
pub(crate) const MAX_HAND_OVERS: u32 = 8;

/// A lease handed over by the previous holder in this process, waiting for
/// the next one at the front of the local queue.
#[derive(Debug)]
pub(crate) struct Baton {
    pub(crate) token: LockToken,
    pub(crate) fencing: u64,
    pub(crate) ttl: Duration,
    /// When the hand-over request was sent: the lease is good for `ttl`
    /// from then.
    pub(crate) sent_at: Instant,
    /// How many hand-overs in a row led to this one.
    pub(crate) chain: u32,
}

/// The local queue of one key, and the lease handed along it.
#[derive(Default)]
struct SlotShared {
    queue: Arc<AsyncMutex<()>>,
    baton: Mutex<Option<Baton>>,
}

impl SlotShared {
    fn baton(&self) -> MutexGuard<'_, Option<Baton>> {
        // Only `take` and `replace`: consistent after a panic.
        self.baton
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }
}

/// This registry's queue for one key; removes the queue from the map when
/// the last user goes away.
struct LocalSlot {
    registry: LockRegistry,
    full_key: String,
    shared: Arc<SlotShared>,
}

impl LocalSlot {
    async fn lock(self) -> LocalPermit {
        let guard = self.shared.queue.clone().lock_owned().await;
        LocalPermit { guard, slot: self }
    }

    fn try_lock(self) -> Option<LocalPermit> {
        let guard = self.shared.queue.clone().try_lock_owned().ok()?;
        Some(LocalPermit { guard, slot: self })
    }
}

impl Drop for LocalSlot {
    fn drop(&mut self) {
        let mut local = self.registry.local();
        // The map's reference and ours: nobody else holds or waits.
        if Arc::strong_count(&self.shared) != 2 {
            return;
        }
        local.remove(&self.full_key);
        drop(local);
        // A lease handed over to a waiter that then went away: release it
        // now rather than let it block other processes until its ttl.
        let Some(baton) = self.shared.baton().take() else {
            return;
        };
        let (backend, key) = (self.registry.backend().clone(), self.full_key.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = backend.release(&key, baton.token, Duration::ZERO).await;
            });
        }
    }
}

/// The right to contend in the store for one key: held from the local
/// queue's front until the lease is released.
pub(crate) struct LocalPermit {
    // Dropped first, so the next local waiter goes ahead before the slot
    // checks whether it is still needed.
    guard: OwnedMutexGuard<()>,
    slot: LocalSlot,
}

impl LocalPermit {
    pub(crate) fn key(&self) -> &str {
        &self.slot.full_key
    }

    /// Whether other tasks of this process wait behind this permit.
    pub(crate) fn has_waiters(&self) -> bool {
        // The map and this permit's slot hold one reference each; every
        // waiter holds one more (its own slot).
        Arc::strong_count(&self.slot.shared) > 2
    }

    /// Takes the lease the previous holder handed over, if any.
    fn take_baton(&self) -> Option<Baton> {
        self.slot.shared.baton().take()
    }

    /// Leaves `baton` for the next holder and gives up the turn.
    pub(crate) fn pass(self, baton: Baton) {
        *self.slot.shared.baton() = Some(baton);
    }
}

impl fmt::Debug for LocalPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let _ = &self.guard;
        f.debug_struct("LocalPermit")
            .field("key", &self.key())
            .finish()
    }
}

impl fmt::Debug for LockRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockRegistry")
            .field("backend", &self.inner.backend)
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}
