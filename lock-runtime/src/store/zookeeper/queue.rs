//! A key's queue of children: joining it, reading it, and leaving it.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use zookeeper_client::{CreateMode, Error as ZkError, MultiWriteError, MultiWriteResult, Stat};

use super::keys;
use super::state::deletions;
use super::state::{Child, Failed, Shared};
use crate::error::StoreError;
use crate::store::common::queue::Place;
use crate::store::{Claim, LockToken};

/// Our child in a key's queue, as [`Shared::enqueue`] found or made it.
pub(super) struct Enqueued {
    pub(super) child: Child,
    /// Whether it heads the queue.
    pub(super) first: bool,
    /// The queue, sorted, when it was read to find that out.
    pub(super) queue: Option<Vec<String>>,
    /// Whether it was created by this call (so written just now).
    pub(super) fresh: bool,
}

impl Enqueued {
    fn new(child: Child, first: bool, queue: Option<Vec<String>>) -> Option<Enqueued> {
        Some(Enqueued {
            child,
            first,
            queue,
            fresh: false,
        })
    }
}

impl Shared {
    /// Our child for `token` under `parent` and whether it heads the
    /// queue; creates the child, claiming `claim` for `ttl`, if we have
    /// none. `None` if ours was gone.
    pub(super) async fn enqueue(
        self: &Arc<Self>,
        parent: &str,
        token: LockToken,
        (claim, ttl): (Claim, Duration),
    ) -> Result<Option<Enqueued>, StoreError> {
        let known = self.created().get(&token).cloned();
        match known {
            Some(Some(child)) if child.place != Place::Unknown => {
                // Told by the waiter's watch: no round trip.
                let head = child.place == Place::Head;
                Ok(Enqueued::new(child, head, None))
            }
            Some(Some(child)) => {
                let queue = self.queue(parent).await?;
                if queue.iter().any(|name| name == child.name()) {
                    let first = queue.first().is_some_and(|name| name == child.name());
                    return Ok(Enqueued::new(child, first, Some(queue)));
                }
                // Gone (expired at its ttl, deleted by an operator).
                self.created().remove(&token);
                Ok(None)
            }
            Some(None) => {
                // A create whose answer was lost: look for it by name.
                let queue = self.queue(parent).await?;
                let prefix = format!("{token}-");
                let Some(name) = queue.iter().find(|name| name.starts_with(&prefix)) else {
                    self.created().remove(&token);
                    return Box::pin(self.enqueue(parent, token, (claim, ttl))).await;
                };
                let path = format!("{parent}/{name}");
                let Some(stat) = self.call(self.client().check_stat(&path)).await? else {
                    self.created().remove(&token);
                    return Ok(None);
                };
                let child = Child::new(parent, name, stat.czxid);
                let first = queue.first() == Some(name);
                self.created().insert(token, Some(child.clone()));
                Ok(Enqueued::new(child, first, Some(queue)))
            }
            None => {
                self.created().insert(token, None);
                let child = self.create(parent, token, (claim, ttl)).await?;
                let created = match child {
                    Ok(pair) => pair,
                    Err(()) => {
                        // The key's node was missing: make it, once more.
                        self.make_parent(parent).await?;
                        self.create(parent, token, (claim, ttl))
                            .await?
                            .map_err(|()| format!("the node `{parent}` vanished twice"))?
                    }
                };
                let (child, first) = created;
                self.created().insert(token, Some(child.clone()));
                let made = Enqueued::new(child, first, None);
                Ok(made.map(|made| Enqueued {
                    fresh: true,
                    ..made
                }))
            }
        }
    }

    /// Creates our child, its data the ttl; returns it and whether it
    /// heads the queue, or `Err(())` when the key's node does not exist.
    ///
    /// One request, one transaction, and no read: the create and an empty
    /// `setData` on the key's node, whose returned stat is taken in the
    /// same transaction. Its child count says whether ours is the only
    /// child (every child already there has a lower sequence, so ours
    /// heads the queue exactly when it is alone), and its `mzxid` is the
    /// transaction's zxid, which is our child's czxid.
    ///
    /// A caller that stops waiting (a timeout while the ensemble is away, a
    /// cancelled attempt) leaves the outcome unknown: the child is then
    /// looked for and deleted once the queue can be read (see
    /// [`Shared::sweep`]), so no orphan blocks the queue for the rest of the
    /// session.
    pub(super) async fn create(
        self: &Arc<Self>,
        parent: &str,
        token: LockToken,
        (claim, ttl): (Claim, Duration),
    ) -> Result<Result<(Child, bool), ()>, StoreError> {
        let options = CreateMode::EphemeralSequential.with_acls(self.settings.acls());
        let hex = token.hex();
        let mut prefix = String::with_capacity(parent.len() + hex.len() + 2);
        prefix.push_str(parent);
        prefix.push('/');
        prefix.extend(hex.iter().map(|&digit| char::from(digit)));
        prefix.push('-');
        prefix.push_str(&keys::tag(claim));
        let client = self.client();
        let mut multi = client.new_multi_writer();
        multi
            .add_create(&prefix, &keys::ttl_data(ttl), &options)
            .and_then(|()| multi.add_set_data(parent, &[], None))
            .map_err(|err| format!("ZooKeeper refused the lock node `{prefix}`: {err}"))?;
        let mut unknown = Unknown {
            shared: Some(self),
            parent,
            token,
        };
        let created = match tokio::time::timeout(self.timeout, multi.commit()).await {
            Ok(Ok(results)) => created(results).map_err(Failed::Refused),
            Ok(Err(
                MultiWriteError::OperationFailed { source, .. }
                | MultiWriteError::RequestFailed { source },
            )) => Err(Failed::Refused(source)),
            Err(_) => Err(Failed::Timeout(self.timeout)),
        };
        let settled = matches!(
            created,
            Ok(_)
                | Err(Failed::Refused(
                    ZkError::NoNode
                        | ZkError::NodeExists
                        | ZkError::NoAuth
                        | ZkError::InvalidAcl
                        | ZkError::BadArguments(_),
                ))
        );
        if settled {
            // Made, or refused for sure.
            unknown.shared = None;
        }
        drop(unknown);
        let (path, stat) = match created {
            Ok(answer) => answer,
            Err(Failed::Refused(ZkError::NoNode)) => return Ok(Err(())),
            Err(err) => return Err(err.into()),
        };
        // The transaction's time, by the ensemble's clock.
        self.overdue.saw(stat.mtime);
        let name = path.rsplit('/').next().unwrap_or_default();
        let child = Child::new(parent, name, stat.mzxid);
        Ok(Ok((child, stat.num_children == 1)))
    }

    /// Creates the key's node (a container: the ensemble removes it once
    /// it has no children left).
    pub(super) async fn make_parent(&self, parent: &str) -> Result<(), StoreError> {
        let container = CreateMode::Container.with_acls(self.settings.acls());
        let client = self.client();
        let made = self.call(client.create(parent, &[], &container)).await;
        match made {
            Ok(_) | Err(Failed::Refused(ZkError::NodeExists)) => Ok(()),
            Err(err) => Err(err.into()),
        }
    }

    /// The key's children, sorted by sequence; empty if it has no node.
    pub(super) async fn queue(&self, parent: &str) -> Result<Vec<String>, StoreError> {
        let client = self.client();
        match self.call(client.list_children(parent)).await {
            Ok(mut queue) => {
                sort(&mut queue);
                Ok(queue)
            }
            Err(Failed::Refused(ZkError::NoNode)) => Ok(Vec::new()),
            Err(err) => Err(err.into()),
        }
    }

    /// Deletes `path`, in one request with the deletions asked for
    /// meanwhile (see [`deletions`]); `Ok(false)` if it was gone.
    pub(super) async fn delete(self: &Arc<Self>, path: &str) -> Result<bool, StoreError> {
        Ok(deletions::delete(self, path).await?)
    }

    /// Deletes our node at `path`, now or, if the ensemble does not answer,
    /// as soon as it does: a node left behind would hold its place in the
    /// queue (or the lock itself) for as long as the session lives, which
    /// outlasts a leader election or a lost connection. `Ok(false)` if it
    /// was gone. Retrying by path is safe: the name holds our token.
    pub(super) async fn discard(self: &Arc<Self>, path: &str) -> Result<bool, StoreError> {
        let deleted = self.delete(path).await;
        if deleted.is_err() {
            self.discard_later(path.to_owned());
        }
        deleted
    }

    /// [`Shared::discard`] in the background, retrying until the ensemble
    /// answers.
    pub(super) fn discard_later(self: &Arc<Self>, path: String) {
        self.retry(Duration::from_millis(50), move |store| {
            let path = path.clone();
            async move {
                let deleted = store.delete(&path).await;
                if let Err(err) = &deleted {
                    tracing::debug!(%path, %err, "lock node not deleted yet; retrying");
                }
                deleted.is_ok()
            }
        });
    }

    /// Runs `attempt` in the background, first after `pause`, then again
    /// after a pause that doubles up to 2 s, until it says it is done or the
    /// store is dropped. Bounded: a session outlives no ensemble outage
    /// forever, so the retries stop after some minutes. Also called from
    /// drops, perhaps outside the runtime: then it does nothing.
    pub(super) fn retry<A, F>(self: &Arc<Self>, mut pause: Duration, mut attempt: A)
    where
        A: FnMut(Arc<Shared>) -> F + Send + 'static,
        F: Future<Output = bool> + Send,
    {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let shared = Arc::downgrade(self);
        runtime.spawn(async move {
            for _ in 0..300 {
                tokio::time::sleep(pause).await;
                let Some(store) = shared.upgrade() else {
                    return;
                };
                if attempt(store).await {
                    return;
                }
                pause = (pause * 2).min(Duration::from_secs(2));
            }
        });
    }

    /// Drops our child for `token` (refused in skip mode, given up, or
    /// abandoned); `Ok(true)` if it was there.
    pub(super) async fn withdraw(
        self: &Arc<Self>,
        parent: &str,
        token: LockToken,
    ) -> Result<bool, StoreError> {
        let known = self.created().remove(&token).flatten();
        let path = match known {
            Some(child) => child.path().to_owned(),
            None => {
                let prefix = format!("{token}-");
                let queue = match self.queue(parent).await {
                    Ok(queue) => queue,
                    Err(err) => {
                        // Our create may still be applied (the ensemble
                        // away, a reply lost): look again until we can.
                        self.sweep(parent, token);
                        return Err(err);
                    }
                };
                let Some(name) = queue.into_iter().find(|name| name.starts_with(&prefix)) else {
                    return Ok(false);
                };
                format!("{parent}/{name}")
            }
        };
        self.held().remove(path.as_str());
        self.discard(&path).await
    }

    /// Deletes `token`'s child under `parent` once the queue can be read
    /// again: a create whose outcome we could not learn. A listing answered
    /// after the create (one session answers in order) settles it; if the
    /// session ends first, the child went with it.
    pub(super) fn sweep(self: &Arc<Self>, parent: &str, token: LockToken) {
        let parent = parent.to_owned();
        self.retry(Duration::from_millis(100), move |store| {
            let parent = parent.clone();
            async move {
                if store.created().contains_key(&token) {
                    return true; // asked for again: its attempt will find it
                }
                let Ok(queue) = store.queue(&parent).await else {
                    return false;
                };
                let prefix = format!("{token}-");
                if let Some(name) = queue.iter().find(|name| name.starts_with(&prefix)) {
                    let path = format!("{parent}/{name}");
                    tracing::debug!(%path, "deleting a lock node whose attempt was given up");
                    let _ = store.discard(&path).await;
                }
                true
            }
        });
    }
}

/// A create whose outcome is not known while this lives (its reply not in,
/// or lost): dropped so, it has the child looked for and deleted once the
/// queue can be read, unless the attempt asks for it again.
pub(super) struct Unknown<'a> {
    pub(super) shared: Option<&'a Arc<Shared>>,
    pub(super) parent: &'a str,
    pub(super) token: LockToken,
}

impl Drop for Unknown<'_> {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            shared.sweep(self.parent, self.token);
        }
    }
}

/// Our child's path and the key's node stat, from the results of the
/// create-and-touch transaction.
pub(super) fn created(results: Vec<MultiWriteResult>) -> Result<(String, Stat), ZkError> {
    let mut path = None;
    let mut stat = None;
    for result in results {
        match result {
            MultiWriteResult::Create { path: made, .. } => path = Some(made),
            MultiWriteResult::SetData { stat: touched } => stat = Some(touched),
            _ => {}
        }
    }
    match (path, stat) {
        (Some(path), Some(stat)) => Ok((path, stat)),
        _ => Err(ZkError::UnexpectedError(
            "a lock node's transaction answered without its results".to_owned(),
        )),
    }
}

/// Sorts children by their sequence (the digits after the last `-`).
pub(super) fn sort(queue: &mut [String]) {
    queue.sort_by_key(|name| sequence(name));
}

pub(super) fn sequence(name: &str) -> i64 {
    name.rsplit('-')
        .next()
        .and_then(|digits| digits.parse().ok())
        .unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_sort_by_sequence() {
        let mut queue = vec![
            "b-0000000010".to_owned(),
            "a-0000000002".to_owned(),
            "c-0000000009".to_owned(),
        ];
        sort(&mut queue);
        assert_eq!(queue, ["a-0000000002", "c-0000000009", "b-0000000010"]);
    }
}
