//! Several locks held together: a transfer between two accounts, a
//! checkout of several items. They are taken one by one in one canonical
//! order (by namespaced key), so two callers that want the same keys in
//! opposite orders never deadlock, and released together.

use std::fmt;
use std::sync::Arc;

use tokio::time::Instant;

use crate::acquire::FullKey;
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::options::{LockOptions, Mode};
use crate::registry::LockRegistry;
use crate::store::LossSignal;

/// The locks taken by [`LockRegistry::lock_all`]: every key's guard, in the
/// order they were taken. Release them with [`LockGuards::release`];
/// dropped, each is released in the background as a [`LockGuard`] is.
pub struct LockGuards {
    guards: Vec<LockGuard>,
}

impl fmt::Debug for LockGuards {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.guards.iter()).finish()
    }
}

impl LockGuards {
    /// The keys, in the order they were locked (each once).
    pub fn keys(&self) -> Vec<&str> {
        self.guards.iter().map(LockGuard::key).collect()
    }

    /// The fencing token of `key`'s lock, as
    /// [`LockGuard::fencing_token`] reads it.
    ///
    /// # Errors
    ///
    /// [`LockError::NotHeld`] if `key` is not one of these; otherwise as
    /// [`LockGuard::fencing_token`].
    pub async fn fencing_token(&self, key: &str) -> Result<u64, LockError> {
        match self.guards.iter().find(|guard| guard.key() == key) {
            Some(guard) => guard.fencing_token().await,
            None => Err(LockError::NotHeld {
                key: Some(LockError::shown_key(key)),
            }),
        }
    }

    /// The guards, in the order they were locked.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// Whether every lease is still held.
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(LockGuard::is_held)
    }

    /// Completes when any of the leases is lost.
    pub async fn lost(&self) {
        let losses: Vec<LossSignal> = self
            .guards
            .iter()
            .map(|guard| guard.loss().clone())
            .collect();
        LossSignal::any_raised(&losses).await
    }

    /// Releases every lock, the last taken first.
    ///
    /// # Errors
    ///
    /// The first error among the releases (`Lost` if a lease was lost
    /// meanwhile); the others are released all the same.
    pub async fn release(self) -> Result<(), LockError> {
        release_all(self.guards).await
    }

    pub(crate) fn new(guards: Vec<LockGuard>) -> LockGuards {
        LockGuards { guards }
    }
}

/// Releases `guards`, the last first; the first error.
pub(crate) async fn release_all(guards: Vec<LockGuard>) -> Result<(), LockError> {
    let mut first = Ok(());
    for guard in guards.into_iter().rev() {
        let released = guard.release().await;
        if first.is_ok() {
            first = released;
        }
    }
    first
}

impl LockRegistry {
    /// Waits for the locks on every key of `keys` (duplicates taken once),
    /// taken in one canonical order so that callers wanting the same keys
    /// in any order never deadlock. `opts.wait_timeout` bounds the whole
    /// wait; on any failure the locks already taken are released.
    ///
    /// # Examples
    ///
    /// ```
    /// use lock_runtime::{LockOptions, LockRegistry};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// let registry = LockRegistry::memory();
    /// let both = registry.lock_all(&["acct:2", "acct:1"], LockOptions::default()).await?;
    /// assert_eq!(both.keys(), ["acct:1", "acct:2"]);
    /// both.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`lock`](Self::lock) for any of the keys; `InvalidKey` for an
    /// empty list.
    pub async fn lock_all(
        &self,
        keys: &[&str],
        opts: LockOptions,
    ) -> Result<LockGuards, LockError> {
        let keys = self.canonical(keys.iter().map(|key| (*key).to_owned()))?;
        opts.validate(&keys[0].0, Mode::Wait)?;
        match self.acquire_all(&keys, &opts, Mode::Wait).await? {
            Some(guards) => Ok(LockGuards { guards }),
            None => Err(LockError::Timeout {
                key: LockError::shown_key(&keys[0].0),
                waited: std::time::Duration::ZERO,
            }),
        }
    }

    /// One attempt at every key of `keys`: `Ok(None)` (nothing kept) when
    /// any of them is held.
    ///
    /// # Errors
    ///
    /// As [`try_lock`](Self::try_lock) for any of the keys.
    pub async fn try_lock_all(
        &self,
        keys: &[&str],
        opts: LockOptions,
    ) -> Result<Option<LockGuards>, LockError> {
        let keys = self.canonical(keys.iter().map(|key| (*key).to_owned()))?;
        opts.validate(&keys[0].0, Mode::Skip)?;
        Ok(self
            .acquire_all(&keys, &opts, Mode::Skip)
            .await?
            .map(|guards| LockGuards { guards }))
    }

    /// `(key, full key)` pairs in lock order, each once.
    pub(crate) fn canonical(
        &self,
        keys: impl IntoIterator<Item = String>,
    ) -> Result<Vec<(String, Arc<str>)>, LockError> {
        let mut pairs = Vec::new();
        for key in keys {
            let full_key = self.full_key(&key)?.to_shared();
            pairs.push((key, full_key));
        }
        if pairs.is_empty() {
            return Err(LockError::InvalidKey {
                key: String::new(),
                reason: "a list of keys must not be empty".to_owned(),
            });
        }
        pairs.sort_by(|a, b| a.1.cmp(&b.1));
        pairs.dedup_by(|a, b| a.1 == b.1);
        Ok(pairs)
    }

    /// Takes `keys` (in that order), `opts` checked for `mode`; `None` in
    /// skip mode when one is held.
    /// Whatever was taken is released on a failure or a refusal.
    pub(crate) async fn acquire_all(
        &self,
        keys: &[(String, Arc<str>)],
        opts: &LockOptions,
        mode: Mode,
    ) -> Result<Option<Vec<LockGuard>>, LockError> {
        let deadline = opts.wait_timeout.map(|timeout| Instant::now() + timeout);
        let mut guards = Vec::with_capacity(keys.len());
        for (key, full_key) in keys {
            let mut each = opts.clone();
            if let Some(deadline) = deadline {
                each.wait_timeout = Some(deadline.saturating_duration_since(Instant::now()));
            }
            match self
                .acquire(key, &FullKey::Shared(full_key.clone()), &each, mode)
                .await
            {
                Ok(Some(guard)) => guards.push(guard),
                refused => {
                    let _ = release_all(guards).await;
                    return refused.map(|_| None);
                }
            }
        }
        Ok(Some(guards))
    }
}

impl crate::section::Leases for LockGuards {
    /// Whether any lease is known lost or past its deadline (see
    /// [`LockGuard::lost_now`]).
    fn lost_now(&self) -> bool {
        self.guards.iter().any(LockGuard::lost_now)
    }

    /// None of their own: the call's span is around the whole run.
    fn span(&self) -> Option<&tracing::Span> {
        None
    }
}
