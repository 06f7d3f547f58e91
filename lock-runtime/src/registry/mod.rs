//! The registry: one store, a namespace and the local queues; its builder;
//! and the process-wide registry behind the attribute.
//!
//! The one-line constructors over each store (`LockRegistry::memory()`,
//! `::redis(url)`, ...) are in [`stores`].

use std::fmt;
use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Weak};
use std::time::Duration;

use once_cell::sync::OnceCell;

mod stores;

use crate::acquire::{self, FullKey, Parts};
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::local_queue::LocalQueues;
use crate::options::{Access, LockOptions, Mode, permits_of};
use crate::section;
use crate::store::{LeaseInfo, LockToken, MAX_KEY_LEN, Store};
use crate::task_locks;
use crate::telemetry::{self, Labels, Outcome};

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
/// of them contends in the store at a time (for a semaphore of N permits,
/// N of them).
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
    store: Arc<dyn Store>,
    /// `"ns:"`, or empty without a namespace.
    prefix: String,
    local: LocalQueues,
    /// The registry itself, weakly: its identity, which clones share.
    identity: Weak<dyn Send + Sync>,
}

/// Builds a [`LockRegistry`] over any [`Store`].
#[derive(Debug)]
pub struct RegistryBuilder {
    store: Arc<dyn Store>,
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
        Ok(LockRegistry::with_prefix(self.store, prefix))
    }
}

impl LockRegistry {
    /// Starts building a registry over `store`.
    pub fn builder(store: impl Store) -> RegistryBuilder {
        RegistryBuilder {
            store: Arc::new(store),
            namespace: None,
        }
    }

    /// A registry over `store`, without a namespace: the constructors'
    /// base (`LockRegistry::new(RedisStore::builder(url).connect().await?)`).
    pub fn new(store: impl Store) -> LockRegistry {
        LockRegistry::with_prefix(Arc::new(store), String::new())
    }

    fn with_prefix(store: Arc<dyn Store>, prefix: String) -> LockRegistry {
        LockRegistry {
            inner: Arc::new_cyclic(|identity: &Weak<Inner>| Inner {
                store,
                prefix,
                local: LocalQueues::default(),
                identity: identity.clone(),
            }),
        }
    }

    /// The store this registry uses.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
    }

    /// Waits for the lock on `key` and returns its guard.
    ///
    /// # Errors
    ///
    /// [`LockError::Timeout`] when `opts.wait_timeout` passes first,
    /// [`LockError::InvalidKey`] / [`LockError::InvalidOptions`] for bad
    /// input (options the store cannot honour included),
    /// [`LockError::Store`] when the store fails.
    ///
    /// # Cancellation
    ///
    /// Dropping the future while it waits leaves nothing behind: an attempt
    /// whose answer was not awaited is undone in the store, and a lease
    /// granted but not yet returned is released.
    ///
    /// # Panics
    ///
    /// When polled outside a Tokio runtime (the renewal and the stores'
    /// background work are Tokio tasks): run it inside `#[tokio::main]`,
    /// `#[tokio::test]` or `Runtime::block_on`. The same holds for
    /// [`try_lock`](Self::try_lock), [`lock_all`](Self::lock_all) and the
    /// attribute's functions.
    pub async fn lock(&self, key: &str, opts: LockOptions) -> Result<LockGuard, LockError> {
        opts.validate(key, Mode::Wait)?;
        let full_key = self.full_key(key)?;
        let guard = self.acquire(key, &full_key, &opts, Mode::Wait).await?;
        guard.ok_or_else(|| never_skipped(key))
    }

    /// Waits for the lock on `key`, runs `body` under it and releases it:
    /// the attribute's wait mode, for code that builds its key or options at
    /// run time. Re-entrant as the attribute is (a key the task holds runs
    /// `body` at once), and `body` sees [`fencing_token`](crate::fencing_token)
    /// and [`lost`](crate::lost).
    ///
    /// A lost lease cancels `body` at its next `.await`, or with
    /// [`OnLost::Notify`](crate::OnLost::Notify) lets it finish; either way
    /// the call returns [`LockError::Lost`].
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock), and [`LockError::Lost`].
    ///
    /// # Examples
    ///
    /// ```
    /// use lock_runtime::{LockOptions, LockRegistry, OnLost};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// let registry = LockRegistry::memory();
    /// let opts = LockOptions::default().on_lost(OnLost::Notify);
    /// let token = registry
    ///     .with_lock("report:eu", opts, async { lock_runtime::fencing_token().await })
    ///     .await?;
    /// assert!(token.is_ok());
    /// # Ok(())
    /// # }
    /// ```
    pub async fn with_lock<F: Future>(
        &self,
        key: &str,
        opts: LockOptions,
        body: F,
    ) -> Result<F::Output, LockError> {
        opts.validate(key, Mode::Wait)?;
        let full_key = self.full_key(key)?;
        let ran = self
            .run(key, &full_key, &opts, Mode::Wait, |_| false, body)
            .await?;
        ran.ok_or_else(|| never_skipped(key))
    }

    /// One call of a body under the lock on `full_key` (`key` as the
    /// caller gave it), `opts` checked for `mode`: re-entered at once when
    /// the task holds the key already ([`section::check_reentry`]);
    /// otherwise the lock is taken, the body run while the lease is held,
    /// cancelled when it is lost (or, under
    /// [`OnLost::Notify`](crate::OnLost::Notify), left to finish), and the
    /// lock released (see [`section::settle`] and [`section::lost_under`]).
    /// `None` when skip mode found the key held.
    pub(crate) async fn run<F: Future>(
        &self,
        key: &str,
        full_key: &FullKey<'_>,
        opts: &LockOptions,
        mode: Mode,
        failed: fn(&F::Output) -> bool,
        body: F,
    ) -> Result<Option<F::Output>, LockError> {
        if let Some(frame) = task_locks::held_by_task(self.id(), full_key) {
            section::check_reentry(key, frame.claim, opts.claim())?;
            return Ok(Some(section::reenter(key, frame, body).await));
        }
        let Some(guard) = self.acquire(key, full_key, opts, mode).await? else {
            return Ok(None);
        };
        let outcome = {
            let mut scope = task_locks::Scope::one(section::frame_of(&guard));
            let body = pin!(body);
            let lost = pin!(guard.lost());
            section::until_lost(&mut scope, &guard, opts.on_lost, body, lost).await
        };
        match outcome {
            Some(output) if guard.is_held() => {
                section::settle(output, guard.release().await).map(Some)
            }
            output => {
                let (full_key, prefix_len) = guard.full_key();
                let full_key = full_key.clone();
                // Owner-checked: a lease already taken over is left alone.
                let _ = guard.release().await;
                section::lost_under(&full_key[prefix_len..], output, failed).map(Some)
            }
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
        opts.validate(key, Mode::Skip)?;
        let full_key = self.full_key(key)?;
        self.acquire(key, &full_key, &opts, Mode::Skip).await
    }

    /// Deletes the lock on `key` whoever holds it, and wakes its waiters:
    /// for an operator whose holder is stuck. `Ok(true)` when a lease was
    /// deleted.
    ///
    /// This breaks mutual exclusion if the holder is still running: it
    /// learns of the loss when the store tells it (the memory store does at
    /// once) or at its next renewal, and only then is its body cancelled
    /// with [`LockError::Lost`].
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidKey`] for a bad key, [`LockError::Store`] when
    /// the store fails.
    pub async fn force_release(&self, key: &str) -> Result<bool, LockError> {
        let full_key = self.full_key(key)?;
        self.inner
            .store
            .force_release(&full_key)
            .await
            .map_err(|source| LockError::store(key, "force-release", source))
    }

    /// Who holds the lock on `key`, as the store sees it now: `None` when
    /// it is free. For operators and health checks ("who holds `stock:7`,
    /// and for how long?"); the answer may be stale as soon as it arrives,
    /// so never use it to decide whether to take the lock.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidKey`] for a bad key, [`LockError::Store`] when
    /// the store fails or cannot inspect its locks.
    ///
    /// # Examples
    ///
    /// ```
    /// use lock_runtime::{LockOptions, LockRegistry};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// let registry = LockRegistry::memory();
    /// assert!(registry.inspect("stock:7").await?.is_none());
    /// let guard = registry.lock("stock:7", LockOptions::default()).await?;
    /// let info = registry.inspect("stock:7").await?.expect("held");
    /// assert!(info.held_by_this_process);
    /// assert_eq!(info.fencing_token, guard.fencing_token().await?);
    /// println!("held for {:?} more", info.remaining);
    /// # guard.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    pub async fn inspect(&self, key: &str) -> Result<Option<LockInfo>, LockError> {
        let full_key = self.full_key(key)?;
        let lease = self
            .inner
            .store
            .inspect(&full_key)
            .await
            .map_err(|source| LockError::store(key, "inspect", source))?;
        Ok(lease.map(LockInfo::of))
    }

    /// Takes the lock on `full_key` in `mode`, with `opts` checked for it
    /// (`LockOptions::validate`): `None` when skip mode found it held.
    pub(crate) async fn acquire(
        &self,
        key: &str,
        full_key: &FullKey<'_>,
        opts: &LockOptions,
        mode: Mode,
    ) -> Result<Option<LockGuard>, LockError> {
        let inner = &*self.inner;
        let capabilities = inner.store.capabilities();
        let span = telemetry::lock_span(key, mode, capabilities.store);
        let labels = Labels::new(capabilities.store, opts.name.unwrap_or(telemetry::UNNAMED));
        let parts = Parts {
            store: &inner.store,
            local: &inner.local,
            capabilities,
            registry: &inner.identity,
            prefix_len: inner.prefix.len(),
            span: &span,
            labels,
        };
        // The wait, in a `lock_wait` span; how it ended is recorded on the
        // lock's span and in the metrics. Not `instrument`ed: moving the
        // large wait future into a wrapper cost more than everything else
        // the spans add; its events name the span as their parent instead.
        let started = acquire::call_start(opts);
        let mut contended = false;
        let wait = telemetry::wait_span(&span);
        let result = acquire::contend(
            &parts,
            key,
            full_key,
            opts,
            mode,
            started,
            &mut contended,
            &wait,
        )
        .await;
        drop(wait);
        let (outcome, fencing) = match &result {
            Ok(Some((grant, _))) => (Outcome::Acquired, grant.fencing),
            Ok(None) => (Outcome::Skipped, None),
            Err(LockError::Timeout { .. }) => (Outcome::Timeout, None),
            Err(_) => (Outcome::Error, None),
        };
        telemetry::acquire_ended(&span, labels, outcome, fencing, contended, started);
        let Some((grant, turn)) = result? else {
            return Ok(None);
        };
        Ok(Some(LockGuard::new(&parts, grant, opts, turn, contended)))
    }

    /// The address of the registry's identity (its shared state, which
    /// its clones share): how a task's frames name the registry that took
    /// a key, as [`Parts::registry_id`] does.
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as *const () as usize
    }

    /// Validates `key` and puts the namespace in front of it.
    pub(crate) fn full_key<'a>(&self, key: &'a str) -> Result<FullKey<'a>, LockError> {
        if key.is_empty() || key.len() > MAX_KEY_LEN {
            return Err(invalid_key(key));
        }
        if self.inner.prefix.is_empty() {
            return Ok(FullKey::Given(key));
        }
        // Not `format!`: its machinery cost more than the rest of building
        // the key.
        let mut full = String::with_capacity(self.inner.prefix.len() + key.len());
        full.push_str(&self.inner.prefix);
        full.push_str(key);
        Ok(FullKey::Shared(full.into()))
    }

    /// How many keys have a local queue: keys held or waited for by this
    /// registry's tasks right now.
    pub fn local_keys(&self) -> usize {
        self.inner.local.len()
    }

    /// How many of this registry's tasks hold or wait for `key` right now
    /// (0 for a key that is not valid).
    pub fn local_queue_len(&self, key: &str) -> usize {
        self.full_key(key)
            .map_or(0, |full_key| self.inner.local.queued(&full_key))
    }
}

/// The error of a key that is empty or too long. Out of line: the lock
/// path stays short.
#[cold]
#[inline(never)]
fn invalid_key(key: &str) -> LockError {
    let reason = if key.is_empty() {
        "a key must not be empty".to_owned()
    } else {
        format!(
            "a key may be at most {MAX_KEY_LEN} bytes, this one has {}",
            key.len()
        )
    };
    LockError::InvalidKey {
        key: LockError::shown_key(key),
        reason,
    }
}

/// What a wait that ended without the lock and without an error would
/// be: waiting never gives up but with its deadline (`Timeout`), so this
/// is never returned; it keeps the types honest.
pub(crate) fn never_skipped(key: &str) -> LockError {
    LockError::Timeout {
        key: LockError::shown_key(key),
        waited: Duration::ZERO,
    }
}

/// A held lock, as [`LockRegistry::inspect`] finds it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// How long the holder's lease has left, if it is not renewed; `None`
    /// from a store that does not count it (ZooKeeper: the lease lasts as
    /// long as the holder's session).
    pub remaining: Option<Duration>,
    /// The holder's fencing token (0 from a store without fencing). Where
    /// the store issues tokens when the holder first reads them (Redis's
    /// default lock), 0 until the holder has read one; a lease passed
    /// from task to task of one process (the memory store's) shows the
    /// last token issued on it until the task holding it now reads its
    /// own.
    pub fencing_token: u64,
    /// Whether a task of this process holds it (through any registry).
    pub held_by_this_process: bool,
    /// How it is held: [`Access::Read`] for read locks, else
    /// [`Access::Write`].
    pub access: Access,
    /// For a semaphore, how many permits the key has.
    pub permits: Option<u32>,
    /// How many hold it: the readers or permit holders (1 for a mutex or a
    /// writer). The fields above describe one of them.
    pub holders: usize,
}

impl LockInfo {
    /// What users read of the lease a store found: the holder's token
    /// becomes whether it is of this process, its claim the access and
    /// permits a guard reports.
    fn of(lease: LeaseInfo) -> LockInfo {
        LockInfo {
            remaining: lease.remaining,
            fencing_token: lease.fencing,
            held_by_this_process: lease.token.is_some_and(LockToken::is_from_this_process),
            access: Access::of(lease.claim),
            permits: permits_of(lease.claim),
            holders: lease.holders,
        }
    }
}

impl fmt::Debug for LockRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockRegistry")
            .field("store", &self.inner.store)
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}
