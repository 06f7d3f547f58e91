//! The connection to one Redis server (`redis://`, `rediss://`), made
//! again after it fails.
//!
//! What the `redis` crate's `ConnectionManager` does, kept to what the
//! store needs, so that a command costs what one on a plain multiplexed
//! connection costs: a command's handle holds the connection itself, and
//! checks that it is still the one in use by reading a counter. A command
//! that fails in a way only a new connection mends (the connection
//! dropped, a protocol error) retires the connection; the next command
//! connects again, as many times as the store's retries allow, waiting
//! 50 ms, then twice as long each time up to 1 s; commands that find an
//! attempt under way share its outcome.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::{AsyncConnectionConfig, Client, RedisError, RedisResult};
use futures_util::future::{BoxFuture, FutureExt, Shared};

use crate::store::common::lock;

/// The first pause between two attempts to connect; each next one is twice
/// as long, up to [`MAX_DELAY`].
const MIN_DELAY: Duration = Duration::from_millis(50);
const MAX_DELAY: Duration = Duration::from_secs(1);

type Attempt = Shared<BoxFuture<'static, RedisResult<MultiplexedConnection>>>;

/// The connection in use, shared by every handle of a store.
pub(super) struct Server {
    client: Client,
    config: AsyncConnectionConfig,
    retries: usize,
    state: Mutex<State>,
    /// Counts the connections retired: written with `state` locked, read
    /// also without.
    generation: AtomicU64,
}

enum State {
    Live(MultiplexedConnection),
    /// No connection: the attempt to make one, shared by the commands that
    /// wait for it (started by the first that polls it).
    Connecting(Attempt),
}

/// A handle's copy of the connection, and which one it is.
#[derive(Clone)]
pub(super) struct Live {
    pub(super) conn: MultiplexedConnection,
    generation: u64,
}

impl Server {
    /// Connects to `client`'s server (with `retries` more attempts if
    /// that fails), with `config`.
    pub(super) async fn connect(
        client: Client,
        config: AsyncConnectionConfig,
        retries: usize,
    ) -> RedisResult<(Server, Live)> {
        let conn = attempt(client.clone(), config.clone(), retries).await?;
        let server = Server {
            client,
            config,
            retries,
            state: Mutex::new(State::Live(conn.clone())),
            generation: AtomicU64::new(0),
        };
        Ok((
            server,
            Live {
                conn,
                generation: 0,
            },
        ))
    }

    /// Whether `live` is the connection in use.
    pub(super) fn is_current(&self, live: &Live) -> bool {
        live.generation == self.generation.load(Ordering::Acquire)
    }

    /// The connection in use; once one is retired, the next, connected
    /// now (or by an attempt under way).
    pub(super) async fn current(&self) -> RedisResult<Live> {
        loop {
            let attempt = {
                let state = lock(&self.state);
                match &*state {
                    State::Live(conn) => {
                        return Ok(Live {
                            conn: conn.clone(),
                            generation: self.generation.load(Ordering::Relaxed),
                        });
                    }
                    State::Connecting(attempt) => attempt.clone(),
                }
            };
            let outcome = attempt.clone().await;
            let mut state = lock(&self.state);
            // Whether the state still waits for this attempt: another
            // command may have taken its connection in use, and seen it
            // fail, meanwhile.
            let waiting = matches!(&*state, State::Connecting(now) if now.ptr_eq(&attempt));
            match outcome {
                Ok(conn) if waiting => {
                    *state = State::Live(conn.clone());
                    return Ok(Live {
                        conn,
                        generation: self.generation.load(Ordering::Relaxed),
                    });
                }
                // Retired meanwhile: look again.
                Ok(_) => {}
                Err(err) => {
                    // The next command tries again.
                    if waiting {
                        *state = State::Connecting(self.attempt());
                    }
                    return Err(err);
                }
            }
        }
    }

    /// After `err` on `live`: retires the connection if only a new one
    /// mends it (and it is still the one in use).
    pub(super) fn failed(&self, live: &Live, err: &RedisError) {
        if !err.is_unrecoverable_error() {
            return;
        }
        let mut state = lock(&self.state);
        if self.generation.load(Ordering::Relaxed) == live.generation {
            *state = State::Connecting(self.attempt());
            self.generation
                .store(live.generation + 1, Ordering::Release);
        }
    }

    fn attempt(&self) -> Attempt {
        attempt(self.client.clone(), self.config.clone(), self.retries)
            .boxed()
            .shared()
    }
}

/// Connects, and after a failure tries again up to `retries` times.
async fn attempt(
    client: Client,
    config: AsyncConnectionConfig,
    retries: usize,
) -> RedisResult<MultiplexedConnection> {
    let mut delay = MIN_DELAY;
    let mut tries = 0;
    loop {
        match client
            .get_multiplexed_async_connection_with_config(&config)
            .await
        {
            Err(err) if tries < retries => {
                tracing::debug!(%err, "connecting to the Redis server failed; trying again");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(MAX_DELAY);
                tries += 1;
            }
            connected => return connected,
        }
    }
}
