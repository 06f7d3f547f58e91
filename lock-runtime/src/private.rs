//! /!\ WARNING: This is *not* a stable API! /!\
//!
//! What `#[distributed_lock]` expansions call. It may change in any release,
//! which is why the macro crate is pinned to an exact version.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::context::{self, Frame};
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::multi::LockGuards;
use crate::options::LockOptions;
use crate::options::Mode;
use crate::registry::LockRegistry;
use crate::telemetry;

/// Renders a key template's arguments (no allocation beyond the result).
#[doc(hidden)]
pub fn render_key(args: fmt::Arguments<'_>) -> String {
    fmt::format(args)
}

/// Builds the options the attribute's arguments describe (literals made
/// `Duration::from_millis(..)` at compile time, or the user's `Duration`
/// expressions, checked when the call runs); `name` labels its metrics.
#[doc(hidden)]
pub const fn options(
    ttl: Duration,
    wait_timeout: Option<Duration>,
    hold_at_least: Option<Duration>,
    watchdog: bool,
    max_hold: Option<Duration>,
    name: &'static str,
) -> LockOptions {
    LockOptions {
        ttl,
        wait_timeout,
        hold_at_least,
        watchdog,
        max_hold,
        name: Some(name),
    }
}

/// The registry of `registry = expr`: an owned clone, so the expression's
/// borrow ends before the body runs.
#[doc(hidden)]
pub fn registry_of(registry: &LockRegistry) -> LockRegistry {
    registry.clone()
}

/// Wait mode: waits for the lock, runs `body` under it, releases.
#[doc(hidden)]
pub async fn run_wait<F: Future>(
    key: String,
    opts: LockOptions,
    body: F,
) -> Result<F::Output, LockError> {
    run_wait_in(crate::registry()?, key, opts, body).await
}

/// [`run_wait`] on the registry of `registry = expr`.
#[doc(hidden)]
pub async fn run_wait_in<F: Future>(
    registry: &LockRegistry,
    key: String,
    opts: LockOptions,
    body: F,
) -> Result<F::Output, LockError> {
    let full_key = registry.full_key(&key)?;
    if let Some(frame) = context::held_by_task(registry.id(), &full_key) {
        return Ok(reenter(&key, frame, body).await);
    }
    let guard = registry.wait_for(&key, &full_key, &opts).await?;
    run_locked(guard, body).await
}

/// Skip mode: one attempt; `Ok(None)` without running `body` when held.
#[doc(hidden)]
pub async fn run_skip<F: Future>(
    key: String,
    opts: LockOptions,
    body: F,
) -> Result<Option<F::Output>, LockError> {
    run_skip_in(crate::registry()?, key, opts, body).await
}

/// [`run_skip`] on the registry of `registry = expr`.
#[doc(hidden)]
pub async fn run_skip_in<F: Future>(
    registry: &LockRegistry,
    key: String,
    opts: LockOptions,
    body: F,
) -> Result<Option<F::Output>, LockError> {
    let full_key = registry.full_key(&key)?;
    if let Some(frame) = context::held_by_task(registry.id(), &full_key) {
        return Ok(Some(reenter(&key, frame, body).await));
    }
    match registry.acquire(&key, &full_key, &opts, Mode::Skip).await? {
        Some(guard) => run_locked(guard, body).await.map(Some),
        None => Ok(None),
    }
}

/// A nested call on a key the task already holds: runs at once, under the
/// outer lease (whose loss cancels this body with the outer one).
async fn reenter<F: Future>(key: &str, frame: Frame, body: F) -> F::Output {
    tracing::trace!(key, "re-entering a lock this task holds");
    context::with_frame(frame, body).await
}

/// The re-entrancy frame of a held lock.
fn frame_of(guard: &LockGuard) -> Frame {
    let (registry, full_key) = guard.owner();
    Frame {
        registry,
        key: guard.key().into(),
        full_key: full_key.clone(),
        fencing: guard.fencing_token(),
    }
}

/// Runs `body` with `frames` held, until it ends (`Some`) or `lost`
/// completes first (`None`: the body is cancelled).
async fn until_lost<F: Future>(
    frames: impl IntoIterator<Item = Frame>,
    lost: impl Future<Output = ()>,
    body: F,
) -> Option<F::Output> {
    context::with_frames(frames, async {
        tokio::select! {
            biased;
            () = lost => None,
            output = body => Some(output),
        }
    })
    .await
}

/// The call's result once the body finished and `released` says how its
/// release went. A release that found a lease lost means mutual exclusion
/// may not have held: `Lost`. If only the store is unreachable, the body's
/// result stands: the lease was held throughout (the watchdog would have
/// said otherwise) and ends at its TTL.
fn settle<T>(output: T, released: Result<(), LockError>) -> Result<T, LockError> {
    match released {
        Ok(()) => Ok(output),
        Err(LockError::Backend { key, source, .. }) => {
            tracing::warn!(%key, error = %source, "release failed after the body finished; the lease ends at its ttl");
            Ok(output)
        }
        Err(error) => Err(error),
    }
}

/// Wait mode with `keys = [..]`: waits for every lock (in canonical order),
/// runs `body` under all of them, releases all. `registry` is the one of
/// `registry = expr`, or the global one.
#[doc(hidden)]
pub async fn run_wait_all<F: Future>(
    registry: Option<&LockRegistry>,
    keys: Vec<String>,
    opts: LockOptions,
    body: F,
) -> Result<F::Output, LockError> {
    let first = keys.first().cloned().unwrap_or_default();
    match run_all(registry, keys, opts, Mode::Wait, body).await? {
        Some(output) => Ok(output),
        None => Err(LockError::Timeout {
            key: LockError::shown_key(&first),
            waited: Duration::ZERO,
        }),
    }
}

/// Skip mode with `keys = [..]`: `Ok(None)` when any of them is held.
#[doc(hidden)]
pub async fn run_skip_all<F: Future>(
    registry: Option<&LockRegistry>,
    keys: Vec<String>,
    opts: LockOptions,
    body: F,
) -> Result<Option<F::Output>, LockError> {
    run_all(registry, keys, opts, Mode::Skip, body).await
}

/// Takes the keys this task does not hold yet, runs `body` under every
/// lease (cancelled when any is lost), releases what it took.
async fn run_all<F: Future>(
    registry: Option<&LockRegistry>,
    keys: Vec<String>,
    opts: LockOptions,
    mode: Mode,
    body: F,
) -> Result<Option<F::Output>, LockError> {
    let registry = match registry {
        Some(registry) => registry,
        None => crate::registry()?,
    };
    let span = telemetry::locks_span(&keys, mode);
    let result = telemetry::in_span!(span, run_all_in(registry, keys, opts, mode, body));
    let outcome = match &result {
        Ok(Some(_)) => "acquired",
        Ok(None) => "skipped",
        Err(LockError::Timeout { .. }) => "timeout",
        Err(LockError::Lost { .. }) => "lost",
        Err(_) => "error",
    };
    span.record("outcome", outcome);
    result
}

async fn run_all_in<F: Future>(
    registry: &LockRegistry,
    keys: Vec<String>,
    opts: LockOptions,
    mode: Mode,
    body: F,
) -> Result<Option<F::Output>, LockError> {
    let mut wanted = Vec::new();
    for (key, full_key) in registry.canonical(keys)? {
        // A key this task holds already is re-entered, not taken again.
        if context::held_by_task(registry.id(), &full_key).is_none() {
            wanted.push((key, full_key));
        }
    }
    let guards = if wanted.is_empty() {
        Vec::new()
    } else {
        match registry.acquire_all(&wanted, &opts, mode).await? {
            Some(guards) => guards,
            None => return Ok(None),
        }
    };
    let frames: Vec<Frame> = guards.iter().map(frame_of).collect();
    let guards = LockGuards::new(guards);
    match until_lost(frames, guards.lost(), body).await {
        Some(output) => settle(Some(output), guards.release().await),
        None => {
            let lost = guards
                .guards()
                .iter()
                .find(|guard| !guard.is_held())
                .map(|guard| guard.key().to_owned())
                .unwrap_or_default();
            let _ = guards.release().await;
            Err(LockError::lost(&lost))
        }
    }
}

/// Runs `body` while the lease is held; cancels it when the lease is lost;
/// then releases (see [`settle`]).
async fn run_locked<F: Future>(guard: LockGuard, body: F) -> Result<F::Output, LockError> {
    let span = guard.span();
    let outcome = telemetry::in_span!(
        span,
        until_lost(std::iter::once(frame_of(&guard)), guard.lost(), body)
    );
    let key = guard.key().to_owned();
    match outcome {
        Some(output) => settle(output, guard.release().await),
        None => {
            // Owner-checked: a lease already taken over is left alone.
            let _ = guard.release().await;
            Err(LockError::lost(&key))
        }
    }
}
