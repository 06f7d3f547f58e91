//! Deletions sent together: while one request deleting our children is in
//! flight, the deletions asked for meanwhile gather and go as one
//! transaction when it is answered (a group commit). A store that releases
//! one lock at a time sends each deletion at once, as a plain `delete`; a
//! busy one pays one request, and one transaction in the ensemble's log,
//! for many releases.
//!
//! A transaction is all or nothing: when one of its deletions fails (its
//! child already gone, say), ZooKeeper applies none of them and names the
//! failed one. That one is answered, and the others go again in the next
//! request, so each failure settles one deletion and the sending ends.

use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;
use zookeeper_client::{Error as ZkError, MultiWriteError};

use super::{Failed, Shared};

/// The most deletions in one transaction.
const MOST: usize = 64;

/// The most path bytes in one transaction, a quarter of ZooKeeper's
/// request size limit (`jute.maxbuffer`, 1 MB by default), which a
/// server meets by closing the connection. A key's path may be far longer
/// than most (a key of `MAX_KEY_LEN` bytes each written `%XX` is 192 KiB),
/// so a deletion goes alone when it does not fit with others.
const MOST_BYTES: usize = 256 * 1024;

/// What a deletion learns: `Ok(true)` if it deleted the child, `Ok(false)`
/// if the child was gone.
type Answer = Result<bool, Failed>;

/// The deletions waiting to be sent, and whether a request is in flight.
#[derive(Default)]
pub(in crate::store::zookeeper) struct Deletions {
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Someone is sending: deletions asked for now wait for its next
    /// request.
    sending: bool,
    queued: Vec<Pending>,
}

struct Pending {
    path: String,
    answer: oneshot::Sender<Answer>,
}

impl Deletions {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Deletes `path` with the deletions asked for meanwhile; `Ok(false)` if
/// it was gone.
///
/// The caller that finds no request in flight sends, inline, until its own
/// deletion is answered; deletions still queued then go on in a task of
/// their own, so no caller sends for others for longer than its own wait.
pub(in crate::store::zookeeper) async fn delete(shared: &Arc<Shared>, path: &str) -> Answer {
    let (answer, mut answered) = oneshot::channel();
    let lead = {
        let mut state = shared.deletions.state();
        state.queued.push(Pending {
            path: path.to_owned(),
            answer,
        });
        !std::mem::replace(&mut state.sending, true)
    };
    if lead {
        let mut sender = Sender {
            shared: Some(shared.clone()),
            hand_over: true,
        };
        while sender.send_next().await {
            if let Ok(answer) = answered.try_recv() {
                sender.stop_if_idle();
                return answer;
            }
        }
    }
    // A sender dropped with our deletion in flight (its caller cancelled)
    // leaves the outcome unknown, as a lost reply does.
    answered
        .await
        .unwrap_or(Err(Failed::Timeout(shared.timeout)))
}

/// Who sends. Dropped while deletions are still queued or in flight (its
/// caller's future cancelled, or done with its own), a caller's sender
/// hands the rest to a task; the task's own, dropped early (the runtime
/// shutting down), gives up: their outcome is unknown, and the next
/// deletion sends again.
struct Sender {
    shared: Option<Arc<Shared>>,
    hand_over: bool,
}

impl Sender {
    /// Sends the next request; `false` (and no longer sending) if nothing
    /// was queued.
    async fn send_next(&mut self) -> bool {
        let Some(shared) = self.shared.clone() else {
            return false;
        };
        let batch: Vec<Pending> = {
            let mut state = shared.deletions.state();
            let mut bytes = 0;
            let take = state
                .queued
                .iter()
                .take(MOST)
                .take_while(|pending| {
                    bytes += pending.path.len();
                    bytes <= MOST_BYTES
                })
                .count()
                .max(usize::from(!state.queued.is_empty()));
            if take == 0 {
                state.sending = false;
                self.shared = None;
                return false;
            }
            state.queued.drain(..take).collect()
        };
        let undone = send(&shared, batch).await;
        if !undone.is_empty() {
            // First in the next request.
            shared.deletions.state().queued.splice(0..0, undone);
        }
        true
    }

    /// Stops sending if nothing is queued.
    fn stop_if_idle(&mut self) {
        if let Some(shared) = &self.shared {
            let mut state = shared.deletions.state();
            if state.queued.is_empty() {
                state.sending = false;
                drop(state);
                self.shared = None;
            }
        }
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        let Some(shared) = self.shared.take() else {
            return;
        };
        if self.hand_over
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move {
                let mut sender = Sender {
                    shared: Some(shared),
                    hand_over: false,
                };
                while sender.send_next().await {}
            });
            return;
        }
        let mut state = shared.deletions.state();
        state.sending = false;
        state.queued.clear();
    }
}

/// Sends one request for `batch`, answers the deletions it settled, and
/// returns those left undone (a transaction that failed on another one).
async fn send(shared: &Arc<Shared>, mut batch: Vec<Pending>) -> Vec<Pending> {
    let client = shared.client();
    if let [one] = batch.as_slice() {
        let answer = match shared.call(client.delete(&one.path, None)).await {
            Ok(()) => Ok(true),
            Err(Failed::Refused(ZkError::NoNode)) => Ok(false),
            Err(err) => Err(err),
        };
        if let Some(one) = batch.pop() {
            let _ = one.answer.send(answer);
        }
        return batch;
    }
    let mut multi = client.new_multi_writer();
    for (index, pending) in batch.iter().enumerate() {
        if let Err(err) = multi.add_delete(&pending.path, None) {
            // A path the client refuses (it never is: each was created).
            let pending = batch.remove(index);
            let _ = pending.answer.send(Err(Failed::Refused(err)));
            return batch;
        }
    }
    let failed = match tokio::time::timeout(shared.timeout, multi.commit()).await {
        Ok(Ok(_)) => {
            for pending in batch {
                let _ = pending.answer.send(Ok(true));
            }
            return Vec::new();
        }
        Ok(Err(MultiWriteError::OperationFailed { index, source })) if index < batch.len() => {
            let pending = batch.remove(index);
            let answer = match source {
                ZkError::NoNode => Ok(false),
                err => Err(Failed::Refused(err)),
            };
            let _ = pending.answer.send(answer);
            return batch;
        }
        Ok(Err(err)) => Failed::Refused(err.into()),
        Err(_) => Failed::Timeout(shared.timeout),
    };
    // No answer for any of them.
    for pending in batch {
        let _ = pending.answer.send(Err(match &failed {
            Failed::Refused(err) => Failed::Refused(err.clone()),
            Failed::Timeout(timeout) => Failed::Timeout(*timeout),
        }));
    }
    Vec::new()
}
