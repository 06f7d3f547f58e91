//! A waiter following its key's queue: the deletion of the child ahead.

use std::sync::Weak;
use std::time::Duration;

use tokio::sync::watch;

use super::holders;
use super::keys::claim_of;
use super::queue::sort;
use super::state::Shared;
use crate::store::common::queue::Place;
use crate::store::{Claim, LockToken};

/// Ends a watch: stops its task, and takes our waiting exclusive children
/// (not the held ones) out of the key's queue.
pub(super) struct LeaveQueue {
    pub(super) shared: Weak<Shared>,
    pub(super) parent: String,
    pub(super) task: tokio::task::AbortHandle,
}

impl Drop for LeaveQueue {
    fn drop(&mut self) {
        self.task.abort();
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let waiting: Vec<(LockToken, String)> = {
            let held = shared.held();
            shared
                .created()
                .iter()
                .filter_map(|(token, child)| {
                    let child = child.as_ref()?;
                    // Shares and permits of one process wait side by side,
                    // each with a watch of its own: this one cannot tell
                    // whose they are, and leaves them to their waiters'
                    // abandon.
                    let exclusive = claim_of(child.name()) == Claim::Exclusive;
                    (exclusive && child.parent() == self.parent && !held.contains_key(child.path()))
                        .then(|| (*token, child.path().to_owned()))
                })
                .collect()
        };
        if waiting.is_empty() {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            for (token, path) in waiting {
                shared.created().remove(&token);
                let _ = shared.discard(&path).await;
            }
        });
    }
}

/// Reports the releases a waiter on `parent` cares about: the deletion of
/// the child just before ours (or, with no child of ours, of the holder's;
/// for a share or permit of ours, any change of the queue), and keeps our
/// child's [`Place`] up to date. Deletes the holders found overdue, looking
/// again when one could be. `placed` is told once the first placement is
/// made.
pub(super) async fn follow(
    shared: Weak<Shared>,
    parent: String,
    tx: watch::Sender<()>,
    placed: tokio::sync::oneshot::Sender<()>,
) {
    let mut placed = Some(placed);
    // Sets the place of our child named `name`.
    let place = |shared: &Weak<Shared>, name: Option<&String>, place: Place| {
        let (Some(name), Some(store)) = (name, shared.upgrade()) else {
            return;
        };
        for child in store.created().values_mut().flatten() {
            if child.parent() == parent && child.name() == name {
                child.place = place;
            }
        }
    };
    loop {
        let Some(store) = shared.upgrade() else {
            return;
        };
        let ours: Vec<String> = store
            .created()
            .values()
            .filter_map(|child| child.as_ref())
            .filter(|child| child.parent() == parent)
            .map(|child| child.name().to_owned())
            .collect();
        if let Some(name) = ours.iter().find(|name| claim_of(name) != Claim::Exclusive) {
            // A share or permit may hold behind others: every change of
            // the queue may let it in.
            let client = store.client();
            let watched = store.call(client.list_and_watch_children(&parent)).await;
            let Ok((mut children, watcher)) = watched else {
                drop(store);
                place(&shared, Some(name), Place::Unknown);
                placed.take().map(|placed| placed.send(()));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            sort(&mut children);
            if matches!(
                store.reap_overdue(&parent, Some(children.clone())).await,
                Ok(true)
            ) {
                continue;
            }
            let due = store.overdue.due(&parent);
            drop(store);
            let at = children.iter().position(|child| child == name);
            let holds = at.is_some_and(|at| holders::holds(&children, at) == Ok(true));
            let here = if holds { Place::Head } else { Place::Behind };
            place(
                &shared,
                Some(name),
                if at.is_some() { here } else { Place::Unknown },
            );
            placed.take().map(|placed| placed.send(()));
            if holds || at.is_none() {
                tx.send_replace(());
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            tokio::select! {
                _ = watcher.changed() => {}
                () = until(due) => continue,
            }
            place(&shared, Some(name), Place::Unknown);
            tx.send_replace(());
            continue;
        }
        let queue = match store.queue(&parent).await {
            Ok(queue) => queue,
            Err(_) => {
                drop(store);
                placed.take().map(|placed| placed.send(()));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let mine = queue.iter().position(|name| ours.contains(name));
        let name = mine.map(|at| &queue[at]);
        let target = match mine {
            Some(0) => None,
            Some(at) => queue.get(at - 1).cloned(),
            None => queue.first().cloned(),
        };
        let Some(target) = target else {
            // Nothing ahead of us: look again.
            place(&shared, name, Place::Head);
            placed.take().map(|placed| placed.send(()));
            tx.send_replace(());
            drop(store);
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let path = format!("{parent}/{target}");
        let client = store.client();
        let watched = store.call(client.check_and_watch_stat(&path)).await;
        drop(store);
        // Ours is second: once the head is deleted, ours heads the queue.
        let after = if mine == Some(1) {
            Place::Head
        } else {
            Place::Unknown
        };
        match watched {
            Ok((None, _)) => {
                place(&shared, name, after);
                placed.take().map(|placed| placed.send(()));
                tx.send_replace(());
            }
            Ok((Some(_), watcher)) => {
                place(&shared, name, Place::Behind);
                placed.take().map(|placed| placed.send(()));
                // With the watch in place (so a release meanwhile is not
                // waited for behind these reads): holders found overdue
                // are deleted, and the next look is planned.
                let Some(store) = shared.upgrade() else {
                    return;
                };
                if matches!(
                    store.reap_overdue(&parent, Some(queue.clone())).await,
                    Ok(true)
                ) {
                    continue;
                }
                let due = store.overdue.due(&parent);
                drop(store);
                let event = tokio::select! {
                    event = watcher.changed() => event.event_type,
                    // Look again: a holder may be overdue.
                    () = until(due) => continue,
                };
                let deleted = event == zookeeper_client::EventType::NodeDeleted;
                match event {
                    zookeeper_client::EventType::NodeDeleted => place(&shared, name, after),
                    // The child ahead renewed: still behind it.
                    zookeeper_client::EventType::NodeDataChanged => continue,
                    _ => place(&shared, name, Place::Unknown),
                }
                tx.send_replace(());
                if deleted && after == Place::Head {
                    // Ours heads the queue: the waiter's grant (one write)
                    // goes out now, not behind a listing of ours on the
                    // same session.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            Err(_) => {
                place(&shared, name, Place::Unknown);
                placed.take().map(|placed| placed.send(()));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Sleeps until `due`, or forever without one.
async fn until(due: Option<tokio::time::Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}
