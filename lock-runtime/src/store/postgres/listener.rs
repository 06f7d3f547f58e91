//! The one listening connection of a PostgreSQL store: `LISTEN` on the
//! release channel while some task of this process waits, and a wake-up for
//! the waiters of each released key.
//!
//! A notification reaches only the sessions listening when it is committed,
//! so after the connection drops every waiter is woken (releases may have
//! been missed) and the connection is made again and listens again while
//! anyone waits.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::{Mutex as AsyncMutex, watch};
use tokio::task::AbortHandle;
use tokio_postgres::{AsyncMessage, Config};

use super::CHANNEL;
use super::session::Opener;
use super::statements::Shared;
use super::table::pg_error;
use crate::error::StoreError;
use crate::store::{ReleaseWatch, Reply};

/// The listening connection and who waits for which row.
pub(super) struct Listener {
    config: Config,
    opener: Opener,
    connect_timeout: Duration,
    state: Mutex<State>,
    /// One connect at a time.
    connecting: AsyncMutex<()>,
}

#[derive(Default)]
struct State {
    /// Waiters by row id (hex), as the notifications name them.
    rows: HashMap<String, watch::Sender<()>>,
    /// The task that reads notifications, while the connection is up.
    reader: Option<AbortHandle>,
    /// The listening session's client.
    client: Option<tokio_postgres::Client>,
}

impl Listener {
    pub(super) fn new(config: Config, opener: Opener, connect_timeout: Duration) -> Arc<Listener> {
        Arc::new(Listener {
            config,
            opener,
            connect_timeout,
            state: Mutex::default(),
            connecting: AsyncMutex::new(()),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // One map or field update per use: consistent after a panic.
        self.state
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
    }

    /// Subscribes to releases of the row `id`, listening first if nobody did.
    pub(super) async fn watch(self: &Arc<Self>, id: String) -> Result<ReleaseWatch, StoreError> {
        let rx = self
            .state()
            .rows
            .entry(id.clone())
            .or_insert_with(|| watch::Sender::new(()))
            .subscribe();
        let unwatch = Unwatch {
            listener: Arc::downgrade(self),
            id,
        };
        self.listen().await?;
        Ok(ReleaseWatch::new(rx, Some(Box::new(unwatch))))
    }

    /// Makes sure the connection is up and listening.
    async fn listen(self: &Arc<Self>) -> Result<(), StoreError> {
        let _one = self.connecting.lock().await;
        let up = self
            .state()
            .reader
            .as_ref()
            .is_some_and(|reader| !reader.is_finished());
        if up {
            return Ok(());
        }
        let reader = tokio::time::timeout(self.connect_timeout, self.connect())
            .await
            .map_err(|_| "timed out connecting the listening connection")??;
        self.state().reader = Some(reader);
        Ok(())
    }

    /// Connects, listens, and starts the task that reads notifications.
    /// Boxed: the reader may reconnect, which calls this again, and only a
    /// named future type lets the compiler see that the cycle is `Send`.
    fn connect(self: &Arc<Self>) -> Reply<'_, AbortHandle> {
        Reply::new(self.connect_now())
    }

    async fn connect_now(self: &Arc<Self>) -> Result<AbortHandle, StoreError> {
        let (client, mut messages) = self.opener.open(&self.config).await.map_err(pg_error)?;
        let listener = Arc::downgrade(self);
        let reader = tokio::spawn(async move {
            loop {
                let message = std::future::poll_fn(|cx| messages(cx)).await;
                let Some(listener) = listener.upgrade() else {
                    return;
                };
                match message {
                    Some(Ok(AsyncMessage::Notification(note))) => {
                        if let Some(waiters) = listener.state().rows.get(note.payload()) {
                            waiters.send_replace(());
                        }
                    }
                    Some(Ok(_)) => {}
                    Some(Err(_)) | None => {
                        tracing::warn!(
                            "lock listening connection lost; waiters retry on their timers until it is back"
                        );
                        listener.wake_all();
                        tokio::spawn(reconnect(Arc::downgrade(&listener)));
                        return;
                    }
                }
            }
        });
        client
            .batch_execute(&format!("LISTEN {CHANNEL}"))
            .await
            .map_err(pg_error)?;
        // Kept while listening: dropping the client would end the session.
        self.state().client = Some(client);
        Ok(reader.abort_handle())
    }

    fn wake_all(&self) {
        for waiters in self.state().rows.values() {
            waiters.send_replace(());
        }
    }
}

/// Whether a notification reaches a session that listens, within `wait`:
/// one session listens on a channel of its own, a statement session
/// notifies it. Behind a pooler that lends sessions per transaction, the
/// listening session is gone once its `LISTEN` committed, and nothing
/// arrives.
pub(super) async fn notifications_arrive(
    shared: &Shared,
    wait: Duration,
) -> Result<bool, StoreError> {
    let (client, mut messages) = shared.opener.open(&shared.config).await.map_err(pg_error)?;
    let channel = format!("lock_runtime_probe_{:016x}", rand::random::<u64>());
    let heard = async {
        loop {
            match std::future::poll_fn(|cx| messages(cx)).await {
                Some(Ok(AsyncMessage::Notification(note))) if note.channel() == channel => {
                    return Ok(true);
                }
                Some(Ok(_)) => {}
                Some(Err(error)) => return Err(pg_error(error)),
                None => return Ok(false),
            }
        }
    };
    let notify = async {
        client
            .batch_execute(&format!("LISTEN {channel}"))
            .await
            .map_err(pg_error)?;
        let conn = shared.conn(&[0; 8]).await?;
        conn.client
            .batch_execute(&format!("NOTIFY {channel}"))
            .await
            .map_err(pg_error)?;
        // The session that listens says when it hears.
        std::future::pending::<Result<bool, StoreError>>().await
    };
    let probe = async {
        tokio::select! {
            heard = heard => heard,
            failed = notify => failed,
        }
    };
    tokio::time::timeout(wait, probe).await.unwrap_or(Ok(false))
}

/// Connects and listens again, with backoff, while anyone waits; stops when
/// the store is gone or nobody waits (the next waiter connects).
async fn reconnect(listener: Weak<Listener>) {
    let mut delay = Duration::from_millis(50);
    loop {
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(2));
        let Some(listener) = listener.upgrade() else {
            return;
        };
        if listener.state().rows.is_empty() {
            return;
        }
        if listener.listen().await.is_ok() {
            tracing::info!("lock listening connection restored");
            // Releases while it was down were missed: every waiter retries.
            listener.wake_all();
            return;
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Some(reader) = self.state().reader.take() {
            reader.abort();
        }
    }
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listener")
            .field("rows", &self.state().rows.len())
            .finish_non_exhaustive()
    }
}

/// Forgets the row when its last waiter goes away.
struct Unwatch {
    listener: Weak<Listener>,
    id: String,
}

impl Drop for Unwatch {
    fn drop(&mut self) {
        let Some(listener) = self.listener.upgrade() else {
            return;
        };
        let mut state = listener.state();
        if state
            .rows
            .get(&self.id)
            .is_some_and(|waiters| waiters.receiver_count() == 0)
        {
            state.rows.remove(&self.id);
        }
    }
}
