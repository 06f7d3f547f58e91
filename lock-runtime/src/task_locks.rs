//! The locks the current task holds through the attribute: re-entrancy,
//! [`fencing_token`] and [`lost`].

use std::cell::{Cell, RefCell};
use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::Arc;

use crate::error::LockError;
use crate::guard::HeldView;
use crate::store::{Claim, LossSignal};

thread_local! {
    /// The locks of the bodies this thread is polling, outermost first:
    /// each body's pushed before each of its polls ([`Scope::enter`]) and
    /// taken back after it. A body is polled inside the poll of the body
    /// around it, so while it runs the stack holds its task's locks, and
    /// no other task's, as a task-local's value would.
    static HELD: RefCell<Vec<Frame>> = const { RefCell::new(Vec::new()) };

    /// Whether `HELD` holds any frame: read first, so that a thread
    /// outside every locked body (the common case) does not borrow it.
    static ANY_HELD: Cell<bool> = const { Cell::new(false) };
}

/// Reads the frames of the task being polled, outermost first (none
/// outside a locked body, or while the thread ends).
fn read_held<R>(read: impl FnOnce(&[Frame]) -> R) -> Option<R> {
    if !ANY_HELD.with(Cell::get) {
        return None;
    }
    HELD.try_with(|held| held.try_borrow().ok().map(|held| read(&held)))
        .ok()
        .flatten()
}

/// One lock held by the current task.
#[derive(Debug)]
pub(crate) struct Frame {
    pub(crate) registry: usize,
    /// How the lease holds its key.
    pub(crate) claim: Claim,
    lease: FrameLease,
}

#[derive(Debug)]
enum FrameLease {
    /// The lock the frame's body took: its guard's state (key, fencing
    /// token, loss signal).
    Taken(HeldView),
    /// A key the task held already, entered again by a nested call: the
    /// lease is the one of the frame below it with the same key. Only the
    /// key is kept, so that a nested call's future that outlives the body
    /// around it holds nothing of that body's lease.
    Again {
        full_key: Arc<str>,
        prefix_len: usize,
    },
}

impl Frame {
    /// The frame of a lock a body took.
    pub(crate) fn taken(registry: usize, claim: Claim, held: HeldView) -> Frame {
        Frame {
            registry,
            claim,
            lease: FrameLease::Taken(held),
        }
    }

    /// The key with the registry's namespace.
    fn full_key(&self) -> &str {
        match &self.lease {
            FrameLease::Taken(held) => held.full_key(),
            FrameLease::Again { full_key, .. } => full_key,
        }
    }

    /// The key as the caller gave it.
    fn key(&self) -> &str {
        match &self.lease {
            FrameLease::Taken(held) => held.key(),
            FrameLease::Again {
                full_key,
                prefix_len,
            } => &full_key[*prefix_len..],
        }
    }

    /// This lock entered again by a nested call.
    fn again(&self) -> Frame {
        let (full_key, prefix_len) = match &self.lease {
            FrameLease::Taken(held) => held.shared_full_key(),
            FrameLease::Again {
                full_key,
                prefix_len,
            } => (full_key.clone(), *prefix_len),
        };
        Frame {
            registry: self.registry,
            claim: self.claim,
            lease: FrameLease::Again {
                full_key,
                prefix_len,
            },
        }
    }

    /// The lease of the frame at the end of `frames`: its own, or that of
    /// the frame below it that took the key it entered again.
    fn lease_in(frames: &[Frame]) -> Option<&HeldView> {
        let (last, below) = frames.split_last()?;
        let (registry, full_key) = match &last.lease {
            FrameLease::Taken(held) => return Some(held),
            FrameLease::Again { full_key, .. } => (last.registry, full_key),
        };
        below.iter().rev().find_map(|frame| match &frame.lease {
            FrameLease::Taken(held)
                if frame.registry == registry && held.full_key() == &**full_key =>
            {
                Some(held)
            }
            _ => None,
        })
    }

    /// The lease this frame took, if it took one.
    fn taken_lease(&self) -> Option<&HeldView> {
        match &self.lease {
            FrameLease::Taken(held) => Some(held),
            FrameLease::Again { .. } => None,
        }
    }
}

/// Returns the fencing token of the innermost lock held by the current task
/// through `#[distributed_lock]`. At once where the store issued it with the
/// grant; see [`LockGuard::fencing_token`](crate::LockGuard::fencing_token)
/// for the store that issues it at the first read.
///
/// # Errors
///
/// [`LockError::NotHeld`] outside an annotated body;
/// [`LockError::Lost`] and [`LockError::Store`] as
/// [`LockGuard::fencing_token`](crate::LockGuard::fencing_token) says.
///
/// # Examples
///
/// ```
/// use lock_runtime::{LockError, LockRegistry, distributed_lock, fencing_token};
///
/// #[distributed_lock(key = "ledger", errors = "into")]
/// async fn append() -> Result<u64, LockError> {
///     fencing_token().await
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_runtime::LockError> {
/// lock_runtime::init(LockRegistry::memory())?;
/// let first = append().await?;
/// let second = append().await?;
/// assert!(second > first);
/// assert!(matches!(fencing_token().await, Err(LockError::NotHeld { key: None })));
/// # Ok(())
/// # }
/// ```
pub async fn fencing_token() -> Result<u64, LockError> {
    let innermost = read_held(|held| Frame::lease_in(held).cloned()).flatten();
    let Some(innermost) = innermost else {
        return Err(LockError::NotHeld { key: None });
    };
    innermost.fencing_token().await
}

/// Returns the fencing token of the lock on `key` held by the current task
/// through `#[distributed_lock]` (the innermost, if nested): with
/// `keys = [..]`, each key's own token.
///
/// # Errors
///
/// [`LockError::NotHeld`] when the task holds no lock on `key` through the
/// attribute; otherwise as [`fencing_token`].
///
/// # Examples
///
/// ```
/// use lock_runtime::{LockError, LockRegistry, distributed_lock, fencing_token_for};
///
/// #[distributed_lock(keys = ["acct:{from}", "acct:{to}"], errors = "into")]
/// async fn transfer(from: u32, to: u32) -> Result<(u64, u64), LockError> {
///     let from = fencing_token_for(&format!("acct:{from}")).await?;
///     let to = fencing_token_for(&format!("acct:{to}")).await?;
///     Ok((from, to))
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
pub async fn fencing_token_for(key: &str) -> Result<u64, LockError> {
    let held = read_held(|held| {
        let innermost = held.iter().rposition(|frame| frame.key() == key)?;
        Frame::lease_in(&held[..=innermost]).cloned()
    })
    .flatten();
    let Some(held) = held else {
        return Err(LockError::NotHeld {
            key: Some(LockError::shown_key(key)),
        });
    };
    held.fencing_token().await
}

/// Completes when a lease the current task holds through
/// `#[distributed_lock]` is lost; never completes outside an annotated
/// body, where no lease can be lost.
///
/// A body run under `on_lost = "cancel"` (the default) is cancelled at its
/// next `.await` when its lease is lost, so this matters to bodies under
/// `on_lost = "notify"`, which are left to run: select on it to stop or
/// undo a step. The call still ends in [`LockError::Lost`](crate::LockError::Lost)
/// (with `errors = "into"`, unless the body returns its own error).
///
/// # Examples
///
/// ```
/// use lock_runtime::{LockRegistry, distributed_lock};
///
/// #[distributed_lock(key = "export", on_lost = "notify")]
/// async fn export() -> &'static str {
///     tokio::select! {
///         () = lock_runtime::lost() => "rolled back",
///         () = async { /* write the export */ } => "written",
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), lock_runtime::LockError> {
/// lock_runtime::init(LockRegistry::memory())?;
/// assert_eq!(export().await?, "written");
/// # Ok(())
/// # }
/// ```
pub async fn lost() {
    let losses: Vec<LossSignal> = read_held(|held| {
        held.iter()
            .filter_map(Frame::taken_lease)
            .map(|held| held.loss().clone())
            .collect()
    })
    .unwrap_or_default();
    LossSignal::any_raised(&losses).await
}

/// Whether a lease the current task holds through `#[distributed_lock]`
/// is known to be lost; `false` outside an annotated body. See [`lost`].
pub fn is_lost() -> bool {
    read_held(|held| {
        held.iter()
            .filter_map(Frame::taken_lease)
            .any(|held| held.loss().is_raised())
    })
    .unwrap_or(false)
}

/// If the current task already holds `full_key`: the frame of a nested
/// call that enters it again.
pub(crate) fn held_by_task(registry: usize, full_key: &str) -> Option<Frame> {
    read_held(|held| {
        held.iter()
            .rev()
            .find(|frame| frame.registry == registry && frame.full_key() == full_key)
            .map(Frame::again)
    })
    .flatten()
}

/// Runs `body` with `frame` as the innermost held lock.
pub(crate) fn with_frame<F: Future>(frame: Frame, body: F) -> impl Future<Output = F::Output> {
    Scope::one(frame).run(body)
}

/// The locks a body took: pushed on the thread's stack for each of its
/// polls, above those of the bodies around it.
pub(crate) struct Scope {
    /// One inline (a body that takes one lock allocates no list), more in
    /// a list; while a poll runs, on the thread's stack instead.
    one: Option<Frame>,
    more: Vec<Frame>,
}

impl Scope {
    /// One lock, for a body to run under.
    pub(crate) fn one(frame: Frame) -> Scope {
        Scope {
            one: Some(frame),
            more: Vec::new(),
        }
    }

    /// The locks `frames`, for a body to run under.
    pub(crate) fn new(frames: impl IntoIterator<Item = Frame>) -> Scope {
        let more: Vec<Frame> = frames.into_iter().collect();
        if more.len() == 1 {
            return Scope::one(more.into_iter().next().expect("one frame"));
        }
        Scope { one: None, more }
    }

    /// Runs `body` with the frames in place for each of its polls.
    pub(crate) async fn run<F: Future>(mut self, body: F) -> F::Output {
        let mut body = pin!(body);
        poll_fn(|cx| {
            let _entered = self.enter();
            body.as_mut().poll(cx)
        })
        .await
    }

    /// Puts the frames in place until the returned guard is dropped (at
    /// the end of one poll of the body).
    pub(crate) fn enter(&mut self) -> Entered<'_> {
        let pushed = HELD
            .try_with(|held| {
                let Ok(mut held) = held.try_borrow_mut() else {
                    // Read right now: never, reads are closures that poll
                    // nothing.
                    return Pushed::None;
                };
                let pushed = match self.one.take() {
                    Some(one) => {
                        held.push(one);
                        Pushed::One
                    }
                    None => {
                        let pushed = self.more.len();
                        held.append(&mut self.more);
                        Pushed::More(pushed)
                    }
                };
                ANY_HELD.with(|any| any.set(!held.is_empty()));
                pushed
            })
            // The thread is ending.
            .unwrap_or(Pushed::None);
        Entered {
            scope: self,
            pushed,
        }
    }
}

/// A scope's frames in place; dropping it takes them back.
pub(crate) struct Entered<'a> {
    scope: &'a mut Scope,
    /// What went on the stack: polls nest, so it is on top when this is
    /// dropped.
    pushed: Pushed,
}

#[derive(Clone, Copy)]
enum Pushed {
    None,
    One,
    More(usize),
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        if let Pushed::None = self.pushed {
            return;
        }
        let _ = HELD.try_with(|held| {
            let Ok(mut held) = held.try_borrow_mut() else {
                return;
            };
            match self.pushed {
                Pushed::None => {}
                Pushed::One => self.scope.one = held.pop(),
                Pushed::More(pushed) => {
                    let from = held.len().saturating_sub(pushed);
                    self.scope.more.extend(held.drain(from..));
                }
            }
            ANY_HELD.with(|any| any.set(!held.is_empty()));
        });
    }
}
