//! The one subscriber connection of a Redis store: release notifications for
//! every key a task of this process waits for.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use ::redis::aio::{PubSubSink, PubSubStream};
use futures_util::StreamExt;
use tokio::sync::{Mutex as AsyncMutex, watch};
use tokio::task::AbortHandle;

use super::connection::Source;
use crate::error::StoreError;
use crate::store::{LockToken, ReleaseWatch};

/// The one subscriber connection of a store: per-key channels subscribed
/// while someone waits on the key, and a task that dispatches messages.
pub(super) struct Subscriber {
    /// Where to connect: one server, or the current master.
    source: Source,
    connect_timeout: Duration,
    state: Mutex<SubscriberState>,
    /// Serialises SUBSCRIBE/UNSUBSCRIBE, so an unsubscribe of a channel
    /// nobody watches can never overtake a new watcher's subscribe.
    ops: AsyncMutex<()>,
}

#[derive(Default)]
struct SubscriberState {
    /// Each watched channel, and the token its last message granted the
    /// key to (`None`: a release that only freed it).
    channels: HashMap<Vec<u8>, watch::Sender<Option<LockToken>>>,
    sink: Option<PubSubSink>,
    /// The dispatch task, stopped when the store goes away.
    dispatcher: Option<AbortHandle>,
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        if let Some(dispatcher) = self.state().dispatcher.take() {
            dispatcher.abort();
        }
    }
}

impl Subscriber {
    pub(super) fn new(source: Source, connect_timeout: Duration) -> Arc<Self> {
        Arc::new(Subscriber {
            source,
            connect_timeout,
            state: Mutex::default(),
            ops: AsyncMutex::new(()),
        })
    }

    fn state(&self) -> MutexGuard<'_, SubscriberState> {
        // Each update is one map or field assignment: consistent after a panic.
        self.state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Subscribes to `channel` and returns once Redis confirmed it.
    pub(super) async fn watch(
        self: &Arc<Self>,
        channel: Vec<u8>,
    ) -> Result<ReleaseWatch, StoreError> {
        let rx = self
            .state()
            .channels
            .entry(channel.clone())
            .or_insert_with(|| watch::Sender::new(None))
            .subscribe();
        // From here on, dropping (on error or cancellation) unwatches.
        let unwatch = Unwatch {
            subscriber: Arc::downgrade(self),
            channel: channel.clone(),
        };
        let _serial = self.ops.lock().await;
        let mut sink = self.sink().await?;
        sink.subscribe(&channel).await?;
        Ok(ReleaseWatch::granting(rx, Some(Box::new(unwatch))))
    }

    /// The current subscriber connection, connecting if there is none.
    /// Called with `ops` held, so only one caller connects.
    async fn sink(self: &Arc<Self>) -> Result<PubSubSink, StoreError> {
        if let Some(sink) = self.state().sink.clone() {
            return Ok(sink);
        }
        let (sink, stream) = self.connect().await?;
        let dispatcher = tokio::spawn(dispatch(Arc::downgrade(self), stream)).abort_handle();
        let mut state = self.state();
        state.sink = Some(sink.clone());
        if let Some(previous) = state.dispatcher.replace(dispatcher) {
            previous.abort();
        }
        Ok(sink)
    }

    async fn connect(&self) -> Result<(PubSubSink, PubSubStream), StoreError> {
        let connect = async {
            let client = self.source.client().await?;
            Ok::<_, StoreError>(client.get_async_pubsub().await?)
        };
        let pubsub = tokio::time::timeout(self.connect_timeout, connect)
            .await
            .map_err(|_| "timed out connecting the subscriber connection")??;
        Ok(pubsub.split())
    }

    /// Wakes every watcher: used when notifications may have been missed.
    fn wake_all(&self) {
        for sender in self.state().channels.values() {
            sender.send_replace(None);
        }
    }
}

/// Reads messages until the connection ends, then reconnects and
/// resubscribes while anyone watches; stops when the store is dropped.
async fn dispatch(subscriber: Weak<Subscriber>, mut stream: PubSubStream) {
    loop {
        while let Some(msg) = stream.next().await {
            let Some(subscriber) = subscriber.upgrade() else {
                return;
            };
            let state = subscriber.state();
            if let Some(sender) = state.channels.get(msg.get_channel_name().as_bytes()) {
                // Fair mode names the token granted; plain releases send
                // nothing.
                let granted = std::str::from_utf8(msg.get_payload_bytes())
                    .ok()
                    .and_then(|payload| payload.parse().ok());
                sender.send_replace(granted);
            }
        }
        let Some(strong) = subscriber.upgrade() else {
            return;
        };
        tracing::warn!(
            "lock subscriber connection lost; waiters fall back to lease expiry until it is back"
        );
        strong.state().sink = None;
        // Releases may have been missed: let every waiter try again now.
        strong.wake_all();
        drop(strong);
        match resubscribe(&subscriber).await {
            Some(next) => stream = next,
            None => return,
        }
    }
}

/// Reconnects with backoff and subscribes every watched channel again.
/// `None` when the store is gone, or nobody is watching any more (the next
/// watcher then connects).
async fn resubscribe(subscriber: &Weak<Subscriber>) -> Option<PubSubStream> {
    let mut delay = Duration::from_millis(50);
    loop {
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
        let strong = subscriber.upgrade()?;
        let _serial = strong.ops.lock().await;
        let channels: Vec<Vec<u8>> = strong.state().channels.keys().cloned().collect();
        if channels.is_empty() {
            return None;
        }
        let Ok((mut sink, stream)) = strong.connect().await else {
            continue;
        };
        if sink.subscribe(&channels).await.is_err() {
            continue;
        }
        strong.state().sink = Some(sink);
        tracing::info!(
            channels = channels.len(),
            "lock subscriber connection restored"
        );
        strong.wake_all();
        return Some(stream);
    }
}

/// Drops the channel (and unsubscribes) when its last watcher goes away.
struct Unwatch {
    subscriber: Weak<Subscriber>,
    channel: Vec<u8>,
}

impl Drop for Unwatch {
    fn drop(&mut self) {
        let Some(subscriber) = self.subscriber.upgrade() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let channel = std::mem::take(&mut self.channel);
        runtime.spawn(async move {
            let _serial = subscriber.ops.lock().await;
            let sink = {
                let mut state = subscriber.state();
                match state.channels.get(&channel) {
                    Some(sender) if sender.receiver_count() == 0 => {
                        state.channels.remove(&channel);
                        state.sink.clone()
                    }
                    // Watched again meanwhile (or already gone): keep it.
                    _ => None,
                }
            };
            let Some(mut sink) = sink else { return };
            if let Err(error) = sink.unsubscribe(&channel).await {
                tracing::debug!(%error, "unsubscribe failed");
            }
        });
    }
}
