//! The locks the current task holds through the attribute: re-entrancy,
//! [`fencing_token`] and [`lost`].

use std::cell::{Cell, RefCell};
use std::future::{Future, poll_fn};
use std::pin::pin;

use crate::error::LockError;
use crate::guard::HeldView;
use crate::store::{Claim, LossSignal};

thread_local! {
    /// The locks of the task whose locked body this thread is polling:
    /// put in place around each poll of the body ([`Scope::enter`]) and
    /// taken out after it, so they are that task's alone, as a
    /// task-local's value would be.
    static HELD: RefCell<Frames> = const {
        RefCell::new(Frames {
            one: None,
            more: Vec::new(),
        })
    };

    /// Whether `HELD` holds any frame: read first, so that a thread
    /// outside every locked body (the common case) does not borrow it.
    static ANY_HELD: Cell<bool> = const { Cell::new(false) };
}

/// Reads the frames of the task being polled (none outside a locked
/// body, or while the thread ends).
fn read_held<R>(read: impl FnOnce(&Frames) -> R) -> Option<R> {
    if !ANY_HELD.with(Cell::get) {
        return None;
    }
    HELD.try_with(|held| held.try_borrow().ok().map(|held| read(&held)))
        .ok()
        .flatten()
}

/// The locks the current task holds, outermost first: one inline (an
/// annotated body that nests none allocates no list), more in a list.
#[derive(Clone, Debug, Default)]
struct Frames {
    one: Option<Frame>,
    more: Vec<Frame>,
}

impl Frames {
    fn as_slice(&self) -> &[Frame] {
        match &self.one {
            Some(one) => std::slice::from_ref(one),
            None => &self.more,
        }
    }

    fn is_empty(&self) -> bool {
        self.one.is_none() && self.more.is_empty()
    }

    fn iter(&self) -> std::slice::Iter<'_, Frame> {
        self.as_slice().iter()
    }

    fn last(&self) -> Option<&Frame> {
        self.as_slice().last()
    }

    /// These frames, and `inner` within them.
    fn with(mut self, inner: impl IntoIterator<Item = Frame>) -> Frames {
        let mut inner = inner.into_iter();
        if self.one.is_none() && self.more.is_empty() {
            let Some(first) = inner.next() else {
                return self;
            };
            let Some(second) = inner.next() else {
                self.one = Some(first);
                return self;
            };
            self.more.extend([first, second]);
        } else if let Some(one) = self.one.take() {
            self.more.push(one);
        }
        self.more.extend(inner);
        self
    }
}

/// One lock held by the current task.
#[derive(Clone, Debug)]
pub(crate) struct Frame {
    pub(crate) registry: usize,
    /// How the lease holds its key.
    pub(crate) claim: Claim,
    /// The lease: its key, fencing token and loss signal.
    pub(crate) held: HeldView,
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
    let innermost = read_held(|held| held.last().map(|frame| frame.held.clone())).flatten();
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
        held.iter()
            .rev()
            .find(|frame| frame.held.key() == key)
            .map(|frame| frame.held.clone())
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
    let losses: Vec<LossSignal> =
        read_held(|held| held.iter().map(|frame| frame.held.loss().clone()).collect())
            .unwrap_or_default();
    LossSignal::any_raised(&losses).await
}

/// Whether a lease the current task holds through `#[distributed_lock]`
/// is known to be lost; `false` outside an annotated body. See [`lost`].
pub fn is_lost() -> bool {
    read_held(|held| held.iter().any(|frame| frame.held.loss().is_raised())).unwrap_or(false)
}

/// The frame of `full_key` if the current task already holds it.
pub(crate) fn held_by_task(registry: usize, full_key: &str) -> Option<Frame> {
    read_held(|held| {
        held.iter()
            .rev()
            .find(|frame| frame.registry == registry && frame.held.full_key() == full_key)
            .cloned()
    })
    .flatten()
}

/// Runs `body` with `frame` as the innermost held lock.
pub(crate) fn with_frame<F: Future>(frame: Frame, body: F) -> impl Future<Output = F::Output> {
    Scope::new(std::iter::once(frame)).run(body)
}

/// The locks a body runs under, with those of the bodies around it: put
/// in place for each of its polls.
pub(crate) struct Scope {
    frames: Frames,
}

impl Scope {
    /// The frames of the task being polled now, and `inner` within them.
    pub(crate) fn new(inner: impl IntoIterator<Item = Frame>) -> Scope {
        // Outside every locked body (the common case) there is nothing to
        // copy.
        let outer = read_held(|held| (!held.is_empty()).then(|| held.clone()))
            .flatten()
            .unwrap_or_default();
        Scope {
            frames: outer.with(inner),
        }
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
        let swapped = swap_held(&mut self.frames);
        Entered {
            frames: &mut self.frames,
            swapped,
        }
    }
}

/// A scope's frames in place; dropping it puts back what was there.
pub(crate) struct Entered<'a> {
    frames: &'a mut Frames,
    /// Whether the frames went in (not while the thread ends).
    swapped: bool,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        if self.swapped {
            swap_held(self.frames);
        }
    }
}

/// Swaps `frames` with the thread's; `false` if the thread's are gone
/// (the thread is ending) or read right now (never: reads are closures
/// that poll nothing).
fn swap_held(frames: &mut Frames) -> bool {
    HELD.try_with(|held| match held.try_borrow_mut() {
        Ok(mut held) => {
            std::mem::swap(&mut *held, frames);
            ANY_HELD.with(|any| any.set(!held.is_empty()));
            true
        }
        Err(_) => false,
    })
    .unwrap_or(false)
}
