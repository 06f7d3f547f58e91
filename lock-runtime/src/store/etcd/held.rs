//! Pushed losses: the keys a store holds, watched for their deletion.
//!
//! A key held for [`WATCH_AFTER`] gets a watch from the revision after its
//! grant, all on one multiplexed watch stream per store. The store's task
//! looks for such keys on a tick of its own: an acquire only notes its key
//! in a map, and pays no round trip and no wake-up of the task; the short
//! holds that are most locks cost etcd nothing (a watch created later still
//! reports every deletion since the grant). A deletion the holder did not make (its
//! lease expired or was revoked, an operator deleted the key or forced a
//! release) raises the holder's [`LossSignal`] then, rather than at its
//! next renewal. A release forgets its key before it deletes it. A broken
//! stream is opened again and every held key watched again from its own
//! start, so nothing in between is missed; a key whose start was compacted
//! away is left to the renewal, which checks ownership anyway.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use etcd_client::{EventType, WatchClient, WatchFilterType, WatchOptions};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::WATCH_RETRY;
use crate::store::LossSignal;

/// The watch that opens a stream: on a key no lock uses, reporting nothing.
const OPENER_ID: i64 = i64::MAX;

/// How long a key is held before it is watched: a loss is pushed within
/// this and a tick (plus the event's way), and shorter holds are never
/// watched.
pub(super) const WATCH_AFTER: Duration = Duration::from_millis(100);

/// How often the task looks for keys held long enough to watch.
const TICK: Duration = Duration::from_millis(50);

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
    /// When it was taken: watched from `WATCH_AFTER` later.
    since: Instant,
    /// The stream its watch was created on (0: none yet).
    stream: u64,
}

/// What a release asks of the task.
enum Request {
    /// Stop watching the key of this id.
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
                since: Instant::now(),
                stream: 0,
            },
        );
        self.requests.get_or_init(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            let task = watch_held(watches.clone(), opener.to_vec(), Arc::downgrade(self), rx);
            tokio::spawn(task);
            tx
        });
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

    /// What to send to watch, on stream `stream`, every key held since
    /// `before` or earlier and not watched there yet; they count as watched
    /// there from now.
    fn to_watch(&self, stream: u64, before: Instant) -> Vec<(Vec<u8>, WatchOptions)> {
        let mut keys = self.lock();
        keys.iter_mut()
            .filter(|(_, held)| held.stream != stream && held.since <= before)
            .map(|(&id, held)| {
                held.stream = stream;
                let options = WatchOptions::new()
                    .with_watch_id(id)
                    .with_start_revision(held.from)
                    .with_filters([WatchFilterType::NoPut]);
                (held.key.clone(), options)
            })
            .collect()
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
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let Ok(mut stream) = watches.watch(opener.clone(), Some(opening.clone())).await else {
            tokio::time::sleep(WATCH_RETRY).await;
            continue;
        };
        let Some(held) = keys.upgrade() else { return };
        let generation = held.stream.fetch_add(1, Ordering::Relaxed) + 1;
        // Every key held now, each from its own start: nothing deleted
        // while the stream was down is missed.
        let all = held.to_watch(generation, Instant::now());
        drop(held);
        let mut broken = false;
        for (key, options) in all {
            broken |= stream.watch(key, Some(options)).await.is_err();
        }
        while !broken {
            tokio::select! {
                request = requests.recv() => {
                    match request {
                        None => return,
                        Some(Request::Cancel(id)) => broken = stream.cancel(id).await.is_err(),
                    }
                }
                _ = tick.tick() => {
                    let Some(held) = keys.upgrade() else { return };
                    let before = Instant::now().checked_sub(WATCH_AFTER).unwrap_or_else(Instant::now);
                    let due = held.to_watch(generation, before);
                    drop(held);
                    for (key, options) in due {
                        if broken {
                            break;
                        }
                        broken = stream.watch(key, Some(options)).await.is_err();
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
