//! What every store that connects to a server shares: its timeouts and
//! their builder setters, and the error a failed connect gives.

use std::time::Duration;

use crate::error::{LockError, StoreError};

/// The store `open` connects to the `store` at `address` (already without
/// its password), or the failed-connect error naming them.
pub(crate) async fn opened<S>(
    store: &'static str,
    address: String,
    open: impl Future<Output = Result<S, StoreError>>,
) -> Result<S, LockError> {
    open.await.map_err(|source| LockError::Connect {
        store,
        address,
        source,
    })
}

/// How long a store waits on its server: for one answer, and for a
/// connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Timeouts {
    /// How long one call may take before it fails.
    pub(crate) response: Duration,
    /// How long connecting may take before it fails.
    pub(crate) connection: Duration,
}

impl Timeouts {
    /// Timeouts of `response` for a call and `connection` for connecting.
    pub(crate) const fn new(response: Duration, connection: Duration) -> Self {
        Timeouts {
            response,
            connection,
        }
    }
}

/// The `response_timeout` and `connection_timeout` setters of a store
/// builder whose `timeouts` field is a [`Timeouts`], with their defaults as
/// the docs show them: `timeout_setters!(call: "one command", "2 s";
/// connect: "1 s");`.
macro_rules! timeout_setters {
    (call: $call:literal, $response:literal; connect: $connection:literal) => {
        #[doc = concat!("How long ", $call, " may take before it fails (default ", $response, ").")]
        pub fn response_timeout(mut self, timeout: ::std::time::Duration) -> Self {
            self.timeouts.response = timeout;
            self
        }

        #[doc = concat!("How long connecting may take before it fails (default ", $connection, ").")]
        pub fn connection_timeout(mut self, timeout: ::std::time::Duration) -> Self {
            self.timeouts.connection = timeout;
            self
        }
    };
}

pub(crate) use timeout_setters;
