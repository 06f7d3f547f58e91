//! Running a body under held leases: re-entrancy frames, cancellation or
//! notice on a lost lease, and the call's result after the release.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::task::Poll;

use tracing::Span;

use crate::error::LockError;
use crate::guard::LockGuard;
use crate::options::OnLost;
use crate::store::Claim;
use crate::task_locks::{self, Frame, Scope};

/// A nested call on a key the task already holds: runs at once, under the
/// outer lease (whose loss cancels this body with the outer one).
pub(crate) async fn reenter<F: Future>(key: &str, frame: Frame, body: F) -> F::Output {
    tracing::trace!(key, "re-entering a lock this task holds");
    task_locks::with_frame(frame, body).await
}

/// The re-entrancy frame of a held lock.
pub(crate) fn frame_of(guard: &LockGuard) -> Frame {
    Frame::taken(guard.registry_id(), guard.claim(), guard.view())
}

/// Whether a task that holds `key` as `held` may enter a nested call that
/// wants it as `wanted`. First the claim rule ([`Claim::meets`]): a claim
/// of another kind of lock is the mismatch, as a store would answer it.
/// Then the nested call runs under the outer lease when the outer claim
/// covers it (a write lock covers a read, a read lock reads, a permit
/// serves its own semaphore); a write inside a read is an error at once:
/// waiting for the inner lock could never end.
pub(crate) fn check_reentry(key: &str, held: Claim, wanted: Claim) -> Result<(), LockError> {
    if let Err(mismatch) = wanted.fits(held) {
        return Err(LockError::invalid_options(key, mismatch.to_string()));
    }
    if held == Claim::Shared && wanted == Claim::Exclusive {
        return Err(LockError::invalid_options(
            key,
            format!(
                "this task already holds the key ({held}) and asks for it {wanted} in a nested call: \
                 it would wait for itself; take the outer lock as {wanted}, or not nest"
            ),
        ));
    }
    Ok(())
}

/// Runs `body` with `scope`'s frames held: to its end (`Some`), or,
/// under [`OnLost::Cancel`], until the lease is lost (`None`: the body is
/// cancelled). Before each poll of the body, the first included,
/// `lost_now` says whether the lease is known lost or past its deadline
/// (an atomic load and a clock read): a body whose process paused between
/// the grant and its first step (a SIGSTOP, a host pausing the machine),
/// or whose task wakes late, runs none of its steps once its lease has
/// ended. Only while the body waits is `lost` (the leases' own, which
/// completes on a loss) polled too, so that a loss wakes it. Each poll
/// is inside the leases' span, if they have one.
///
/// The caller pins the body and `lost` where they are and keeps the
/// scope: the future returned holds only references, so awaiting it moves
/// nothing large.
pub(crate) fn until_lost<'a, F: Future>(
    scope: &'a mut Scope,
    leases: &'a impl Leases,
    on_lost: OnLost,
    mut body: Pin<&'a mut F>,
    mut lost: Pin<&'a mut impl Future<Output = ()>>,
) -> impl Future<Output = Option<F::Output>> + 'a {
    poll_fn(move |cx| {
        let _in_span = leases.span().map(Span::enter);
        match on_lost {
            OnLost::Cancel => {
                if leases.lost_now() {
                    return Poll::Ready(None);
                }
                let entered = scope.enter();
                if let Poll::Ready(output) = body.as_mut().poll(cx) {
                    return Poll::Ready(Some(output));
                }
                drop(entered);
                lost.as_mut().poll(cx).map(|()| None)
            }
            OnLost::Notify => {
                let _entered = scope.enter();
                body.as_mut().poll(cx).map(Some)
            }
        }
    })
}

/// The leases a body runs under, as [`until_lost`] watches them: one
/// guard's, or several.
pub(crate) trait Leases {
    /// Whether a loss was raised or a deadline has passed (which raises
    /// it): a clock read too.
    fn lost_now(&self) -> bool;
    /// The span the body runs in, if the leases have one that listens.
    fn span(&self) -> Option<&Span>;
}

impl Leases for LockGuard {
    fn lost_now(&self) -> bool {
        LockGuard::lost_now(self)
    }

    #[inline]
    fn span(&self) -> Option<&Span> {
        let span = LockGuard::span(self);
        (!span.is_disabled()).then_some(span)
    }
}

/// The call's result when the lease on `key` was lost while the body ran
/// (and it was left to finish, `output`): `Lost`, or the body's own error.
pub(crate) fn lost_under<T>(
    key: &str,
    output: Option<T>,
    failed: fn(&T) -> bool,
) -> Result<T, LockError> {
    match output {
        Some(output) if failed(&output) => Ok(output),
        _ => Err(LockError::lost(key)),
    }
}

/// The call's result once the body finished and `released` says how its
/// release went. A release that found a lease lost means mutual exclusion
/// may not have held: `Lost`. If only the store is unreachable, the body's
/// result stands: the lease was held throughout (the watchdog would have
/// said otherwise) and ends at its TTL.
pub(crate) fn settle<T>(output: T, released: Result<(), LockError>) -> Result<T, LockError> {
    match released {
        Ok(()) => Ok(output),
        Err(LockError::Store { key, source, .. }) => {
            tracing::warn!(%key, error = %source, "release failed after the body finished; the lease ends at its ttl");
            Ok(output)
        }
        Err(error) => Err(error),
    }
}
