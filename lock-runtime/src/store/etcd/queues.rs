//! Watched queues: one long-lived watch per key that waiters of this store
//! wait on, shared by them, reporting the deletions in the key's range.
//!
//! etcd serves a new watch whose start revision is already past (a commit
//! landed between its creation and its registration, which is common on a
//! busy key) from a catch-up loop that runs every 100 ms: a waiter that
//! opened a watch of its own each time it waits would often hear of the
//! release that hands it the lock up to 100 ms late. A watch kept open
//! stays in step, so each key's watch lives while anyone waits on it and
//! for [`IDLE`] after. A waiter subscribes first, then lists the queue, and
//! applies only the deletions after the listing's revision: nothing is
//! missed and nothing counted twice. A broken watch is opened again and its
//! subscribers told to list again ([`Deletion::Reset`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use etcd_client::{EventType, WatchClient, WatchFilterType, WatchOptions};
use tokio::sync::{broadcast, watch};
use tokio::time::Instant;

use super::{WATCH_RETRY, queue_end};

/// How long a key's watch stays open after its last waiter left.
const IDLE: Duration = Duration::from_secs(5);

/// How long opening a watch may take before it is tried again.
const OPEN_TIMEOUT: Duration = Duration::from_secs(2);

/// How many deletions a subscriber may fall behind before it lists again.
const BACKLOG: usize = 256;

/// What a key's watch reports.
#[derive(Clone, Debug)]
pub(super) enum Deletion {
    /// This entry was deleted at this revision.
    Deleted { entry: Vec<u8>, revision: i64 },
    /// The watch broke and was opened again: deletions may have been
    /// missed; list the queue again.
    Reset,
}

/// The watched queues of one store.
#[derive(Default)]
pub(super) struct WatchedQueues {
    queues: Mutex<HashMap<Vec<u8>, Arc<Watched>>>,
}

/// One key's watch.
struct Watched {
    deletions: broadcast::Sender<Deletion>,
    /// How many times the watch was opened (0: not yet).
    opened: watch::Sender<u64>,
}

/// A waiter's subscription to a key's watch.
pub(super) struct Subscription {
    pub(super) deletions: broadcast::Receiver<Deletion>,
    opened: watch::Receiver<u64>,
}

impl Subscription {
    /// Waits until the watch is open: from then on, every deletion after
    /// a listing made now is reported.
    pub(super) async fn opened(&mut self) {
        let _ = self.opened.wait_for(|opened| *opened > 0).await;
    }
}

impl WatchedQueues {
    /// Subscribes to the deletions in `queue`'s range, opening its watch if
    /// nobody waits on it yet.
    pub(super) fn subscribe(self: &Arc<Self>, watches: &WatchClient, queue: &[u8]) -> Subscription {
        let mut queues = self.lock();
        if let Some(watched) = queues.get(queue) {
            return Subscription {
                deletions: watched.deletions.subscribe(),
                opened: watched.opened.subscribe(),
            };
        }
        let (deletions, receiver) = broadcast::channel(BACKLOG);
        let (opened, opened_rx) = watch::channel(0);
        let watched = Arc::new(Watched { deletions, opened });
        queues.insert(queue.to_vec(), watched.clone());
        tokio::spawn(follow(
            Arc::downgrade(self),
            watches.clone(),
            queue.to_vec(),
            watched,
        ));
        Subscription {
            deletions: receiver,
            opened: opened_rx,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, Arc<Watched>>> {
        self.queues.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends `queue`'s watch if nobody subscribes to it; whether it ended.
    /// Under the map's lock, as subscribing is, so no subscriber joins a
    /// watch that ends.
    fn end_if_idle(&self, queue: &[u8], watched: &Arc<Watched>) -> bool {
        let mut queues = self.lock();
        if watched.deletions.receiver_count() > 0 {
            return false;
        }
        if queues
            .get(queue)
            .is_some_and(|now| Arc::ptr_eq(now, watched))
        {
            queues.remove(queue);
        }
        true
    }
}

/// Keeps `queue`'s watch open and reports its deletions, until nobody has
/// subscribed for [`IDLE`] or the store is dropped.
async fn follow(
    queues: Weak<WatchedQueues>,
    mut watches: WatchClient,
    queue: Vec<u8>,
    watched: Arc<Watched>,
) {
    let options = WatchOptions::new()
        .with_range(queue_end(&queue))
        .with_filters([WatchFilterType::NoPut]);
    let mut idle_since = None::<Instant>;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // Opened without a start revision: in step with the store from its
        // creation on. Subscribers list the queue after this.
        let opening = async {
            let mut stream = watches.watch(queue.clone(), Some(options.clone())).await?;
            stream.message().await?;
            Ok::<_, etcd_client::Error>(stream)
        };
        let mut stream = match tokio::time::timeout(OPEN_TIMEOUT, opening).await {
            Ok(Ok(stream)) => stream,
            failed => {
                if let Ok(Err(error)) = failed {
                    tracing::debug!(%error, "etcd queue watch: opening failed");
                }
                tokio::time::sleep(WATCH_RETRY).await;
                let Some(all) = queues.upgrade() else {
                    return;
                };
                if all.end_if_idle(&queue, &watched) {
                    return;
                }
                continue;
            }
        };
        watched.opened.send_modify(|opened| *opened += 1);
        if *watched.opened.borrow() > 1 {
            let _ = watched.deletions.send(Deletion::Reset);
        }
        loop {
            tokio::select! {
                answer = stream.message() => {
                    let Ok(Some(answer)) = answer else {
                        break;
                    };
                    for event in answer.events() {
                        if event.event_type() != EventType::Delete {
                            continue;
                        }
                        if let Some(kv) = event.kv() {
                            let _ = watched.deletions.send(Deletion::Deleted {
                                entry: kv.key().to_vec(),
                                revision: kv.mod_revision(),
                            });
                        }
                    }
                    if answer.canceled() {
                        break;
                    }
                }
                _ = tick.tick() => {
                    let Some(all) = queues.upgrade() else {
                        return;
                    };
                    if watched.deletions.receiver_count() > 0 {
                        idle_since = None;
                        continue;
                    }
                    let since = *idle_since.get_or_insert_with(Instant::now);
                    if since.elapsed() >= IDLE && all.end_if_idle(&queue, &watched) {
                        return;
                    }
                }
            }
        }
        tokio::time::sleep(WATCH_RETRY).await;
    }
}
