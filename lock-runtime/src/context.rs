//! The locks the current task holds through the attribute: re-entrancy and
//! [`fencing_token`].

use std::future::Future;
use std::sync::Arc;

tokio::task_local! {
    static HELD: Vec<Frame>;
}

/// One lock held by the current task.
#[derive(Clone, Debug)]
pub(crate) struct Frame {
    pub(crate) registry: usize,
    /// The key as the caller gave it (for [`fencing_token_for`]).
    pub(crate) key: Arc<str>,
    pub(crate) full_key: Arc<str>,
    pub(crate) fencing: u64,
}

/// Returns the fencing token of the innermost lock held by the current task
/// through `#[distributed_lock]`, or `None` outside an annotated body.
///
/// # Examples
///
/// ```
/// use lock_runtime::{LockRegistry, distributed_lock, fencing_token};
///
/// #[distributed_lock(key = "ledger")]
/// async fn append() -> u64 {
///     fencing_token().expect("inside a locked body")
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_runtime::LockError> {
/// lock_runtime::init(LockRegistry::memory())?;
/// let first = append().await?;
/// let second = append().await?;
/// assert!(second > first);
/// assert_eq!(fencing_token(), None);
/// # Ok(())
/// # }
/// ```
pub fn fencing_token() -> Option<u64> {
    HELD.try_with(|held| held.last().map(|frame| frame.fencing))
        .ok()
        .flatten()
}

/// Returns the fencing token of the lock on `key` held by the current task
/// through `#[distributed_lock]` (the innermost, if nested), or `None`:
/// with `keys = [..]`, each key's own token.
///
/// # Examples
///
/// ```
/// use lock_runtime::{LockRegistry, distributed_lock, fencing_token_for};
///
/// #[distributed_lock(keys = ["acct:{from}", "acct:{to}"])]
/// async fn transfer(from: u32, to: u32) -> (u64, u64) {
///     let token = |id: u32| fencing_token_for(&format!("acct:{id}")).expect("held");
///     (token(from), token(to))
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_runtime::LockError> {
/// lock_runtime::init(LockRegistry::memory())?;
/// let (a, b) = transfer(1, 2).await?;
/// assert_ne!(a, b);
/// # Ok(())
/// # }
/// ```
pub fn fencing_token_for(key: &str) -> Option<u64> {
    HELD.try_with(|held| {
        held.iter()
            .rev()
            .find(|frame| &*frame.key == key)
            .map(|frame| frame.fencing)
    })
    .ok()
    .flatten()
}

/// The frame of `full_key` if the current task already holds it.
pub(crate) fn held_by_task(registry: usize, full_key: &str) -> Option<Frame> {
    HELD.try_with(|held| {
        held.iter()
            .rev()
            .find(|frame| frame.registry == registry && &*frame.full_key == full_key)
            .cloned()
    })
    .ok()
    .flatten()
}

/// Runs `body` with `frame` as the innermost held lock.
pub(crate) async fn with_frame<F: Future>(frame: Frame, body: F) -> F::Output {
    with_frames(std::iter::once(frame), body).await
}

/// Runs `body` with `frames` as the innermost held locks.
pub(crate) async fn with_frames<F: Future>(
    frames: impl IntoIterator<Item = Frame>,
    body: F,
) -> F::Output {
    let mut held = HELD.try_with(Clone::clone).unwrap_or_default();
    held.extend(frames);
    HELD.scope(held, body).await
}
