//! Pushed losses: the keys a store holds, watched for their deletion.
//!
//! A key held for [`WATCH_AFTER`] gets a watch from the revision after its
//! grant, all on one multiplexed watch stream per store: an acquire only
//! queues a message and pays no round trip, and the short holds that are
//! most locks cost etcd nothing (a watch created later still reports
//! every deletion since the grant). A deletion the holder did not make (its
//! lease expired or was revoked, an operator deleted the key or forced a
//! release) raises the holder's [`LossSignal`] then, rather than at its
//! next renewal. A release forgets its key before it deletes it. A broken
//! stream is opened again and every held key watched again from its own
//! start, so nothing in between is missed; a key whose start was compacted
//! away is left to the renewal, which checks ownership anyway.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use etcd_client::{EventType, WatchClient, WatchFilterType, WatchOptions};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::WATCH_RETRY;
use crate::backend::LossSignal;

/// The watch that opens a stream: on a key no lock uses, reporting nothing.
const OPENER_ID: i64 = i64::MAX;

/// How long a key is held before it is watched: a loss is pushed within
/// this (plus the event's way), and shorter holds are never watched.
pub(super) const WATCH_AFTER: Duration = Duration::from_millis(100);

/// The keys one store holds, and the task that watches them.
#[derive(Default)]
pub(super) struct HeldKeys {
    next_id: AtomicI64,
    keys: Mutex<HashMap<i64, Held>>,
    /// Which stream the task has open (counts reconnections).
    stream: AtomicU64,
    requests: OnceLock<mpsc::UnboundedSender<Request>>,
}

/// One held key: where its watch starts and whom to tell.
struct Held {
    key: Vec<u8>,
    from: i64,
    loss: LossSignal,
    /// The stream its watch was created on (0: none yet).
    stream: u64,
}

enum Request {
    /// Watch the key of this id from `due` on.
    Watch(i64, Instant),
    Cancel(i64),
}

impl HeldKeys {
    /// Starts watching `key`, granted at revision `granted`, for `loss`;
    /// returns the handle to [`forget`](Self::forget) it by.
    pub(super) fn hold(
        self: &Arc<Self>,
        watches: &WatchClient,
        opener: &[u8],
        key: &[u8],
        granted: i64,
        loss: &LossSignal,
    ) -> i64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        self.lock().insert(
            id,
            Held {
                key: key.to_vec(),
                from: granted + 1,
                loss: loss.clone(),
                stream: 0,
            },
        );
        let requests = self.requests.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            let task = watch_held(watches.clone(), opener.to_vec(), Arc::downgrade(self), rx);
            tokio::spawn(task);
            tx
        });
        let _ = requests.send(Request::Watch(id, Instant::now() + WATCH_AFTER));
        id
    }

    /// Stops watching the key of `id`, before its holder deletes or moves it.
    pub(super) fn forget(&self, id: i64) {
        let watched = self.lock().remove(&id).is_some_and(|held| held.stream != 0);
        if watched && let Some(requests) = self.requests.get() {
            let _ = requests.send(Request::Cancel(id));
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Held>> {
        self.keys.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What to send to watch `id` on stream `stream`, unless it is gone or
    /// already watched there.
    fn to_watch(&self, id: i64, stream: u64) -> Option<(Vec<u8>, WatchOptions)> {
        let mut keys = self.lock();
        let held = keys.get_mut(&id).filter(|held| held.stream != stream)?;
        held.stream = stream;
        let options = WatchOptions::new()
            .with_watch_id(id)
            .with_start_revision(held.from)
            .with_filters([WatchFilterType::NoPut]);
        Some((held.key.clone(), options))
    }

    /// The key of `id` was deleted, or its watch cancelled by etcd.
    fn ended(&self, id: i64, deleted: bool) {
        let Some(held) = self.lock().remove(&id) else {
            return;
        };
        if deleted {
            held.loss.raise(
                "its key was deleted in etcd (lease expired or revoked, or a forced release)",
            );
        }
    }
}

/// The task: one watch stream for every held key, opened again when it
/// breaks, until the store is dropped.
async fn watch_held(
    mut watches: WatchClient,
    opener: Vec<u8>,
    keys: Weak<HeldKeys>,
    mut requests: mpsc::UnboundedReceiver<Request>,
) {
    let opening = WatchOptions::new()
        .with_watch_id(OPENER_ID)
        .with_filters([WatchFilterType::NoPut, WatchFilterType::NoDelete]);
    // Keys to watch once held long enough, in the order they are due.
    let mut due: VecDeque<(Instant, i64)> = VecDeque::new();
    loop {
        let Ok(mut stream) = watches.watch(opener.clone(), Some(opening.clone())).await else {
            tokio::time::sleep(WATCH_RETRY).await;
            continue;
        };
        let Some(held) = keys.upgrade() else { return };
        let generation = held.stream.fetch_add(1, Ordering::Relaxed) + 1;
        let ids: Vec<i64> = held.lock().keys().copied().collect();
        let mut broken = false;
        for id in ids {
            if let Some((key, options)) = held.to_watch(id, generation) {
                broken |= stream.watch(key, Some(options)).await.is_err();
            }
        }
        drop(held);
        while !broken {
            let next_due = due.front().map(|(at, _)| *at);
            tokio::select! {
                request = requests.recv() => {
                    match request {
                        None => return,
                        Some(Request::Watch(id, at)) => due.push_back((at, id)),
                        Some(Request::Cancel(id)) => broken = stream.cancel(id).await.is_err(),
                    }
                }
                () = sleep_until(next_due) => {
                    let Some(held) = keys.upgrade() else { return };
                    let now = Instant::now();
                    while let Some(&(at, id)) = due.front() {
                        if at > now || broken {
                            break;
                        }
                        due.pop_front();
                        if let Some((key, options)) = held.to_watch(id, generation) {
                            broken = stream.watch(key, Some(options)).await.is_err();
                        }
                    }
                }
                answer = stream.message() => {
                    let Ok(Some(answer)) = answer else {
                        broken = true;
                        continue;
                    };
                    let Some(held) = keys.upgrade() else { return };
                    let id = answer.watch_id();
                    let deleted = answer
                        .events()
                        .iter()
                        .any(|event| event.event_type() == EventType::Delete);
                    if deleted || (answer.canceled() && id != OPENER_ID) {
                        held.ended(id, deleted);
                    }
                    if answer.canceled() && id == OPENER_ID {
                        broken = true;
                    }
                }
            }
        }
        tokio::time::sleep(WATCH_RETRY).await;
    }
}

/// Sleeps until `at`, or forever without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
