//! The crate's error type, and the error a store reports to it.

use std::fmt;
use std::time::Duration;

/// A store's own error, boxed: what a [`StoreError`] carries.
type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What kind of failure a store reports. The runtime decides from the kind
/// alone what the caller gets, so that every store means the same by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreErrorKind {
    /// The store could not be reached, did not answer in time, or failed
    /// on its side: the same call may succeed later. The caller gets
    /// [`LockError::Store`].
    Unavailable,
    /// The call can never succeed as made: a claim that does not fit how
    /// the key is held ([`ClaimMismatch`](crate::store::ClaimMismatch)), an
    /// option the store refuses. A programming error, not retried: the
    /// caller gets [`LockError::InvalidOptions`] naming the key.
    Misuse,
    /// The lease the call was about is no longer the caller's. The caller
    /// gets [`LockError::Lost`].
    Lost,
}

/// An error a [`Store`](crate::store::Store) or
/// [`Lease`](crate::store::Lease) reports: its [kind](StoreErrorKind),
/// from which the runtime makes the caller's [`LockError`], and the
/// store's own error as its cause.
///
/// `?` turns a message (`String`, `&str`) or a boxed error into an
/// [unavailable](StoreErrorKind::Unavailable) one, as are the errors of
/// the client crates this crate's stores use; say another kind with
/// [`misuse`](Self::misuse) or [`lost`](Self::lost).
///
/// ```
/// use lock_runtime::store::{StoreError, StoreErrorKind};
///
/// let err = StoreError::from("no answer within 2s");
/// assert_eq!(err.kind(), StoreErrorKind::Unavailable);
/// assert_eq!(err.to_string(), "no answer within 2s");
/// ```
#[derive(Debug)]
pub struct StoreError {
    kind: StoreErrorKind,
    source: Source,
}

/// Why a lease whose token came with its grant issues none on demand.
#[derive(Debug)]
struct TokensWithGrant;

impl fmt::Display for TokensWithGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("this lease's fencing token came with its grant; it issues none on demand")
    }
}

impl std::error::Error for TokensWithGrant {}

impl StoreError {
    /// The store could not serve the call now (see
    /// [`StoreErrorKind::Unavailable`]).
    pub fn unavailable(source: impl Into<Source>) -> Self {
        StoreError {
            kind: StoreErrorKind::Unavailable,
            source: source.into(),
        }
    }

    /// The call can never succeed as made (see [`StoreErrorKind::Misuse`]);
    /// `source` says why, in words a caller can act on.
    pub fn misuse(source: impl Into<Source>) -> Self {
        StoreError {
            kind: StoreErrorKind::Misuse,
            source: source.into(),
        }
    }

    /// What a lease whose fencing token came with its grant answers when
    /// asked for one on demand (the default of
    /// [`Lease::fencing_token`](crate::store::Lease::fencing_token)): a
    /// misuse, made without an allocation, since the runtime may ask at
    /// every hand-over within a process.
    pub(crate) fn tokens_with_grant() -> Self {
        StoreError::misuse(TokensWithGrant)
    }

    /// The lease is no longer the caller's (see [`StoreErrorKind::Lost`]).
    pub fn lost(source: impl Into<Source>) -> Self {
        StoreError {
            kind: StoreErrorKind::Lost,
            source: source.into(),
        }
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> StoreErrorKind {
        self.kind
    }

    /// The store's own error.
    pub fn get_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.source
    }
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.source, f)
    }
}

impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.source()
    }
}

impl From<String> for StoreError {
    fn from(message: String) -> Self {
        StoreError::unavailable(message)
    }
}

impl From<&str> for StoreError {
    fn from(message: &str) -> Self {
        StoreError::unavailable(message)
    }
}

impl From<Source> for StoreError {
    fn from(source: Source) -> Self {
        StoreError::unavailable(source)
    }
}

impl From<std::io::Error> for StoreError {
    fn from(source: std::io::Error) -> Self {
        StoreError::unavailable(source)
    }
}

/// Why a lock could not be taken, kept, or released.
///
/// Every variant that concerns one lock names its key in the message.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// A lock was used before [`init`](crate::init) installed a registry.
    #[error("no lock registry is installed; call `lock_runtime::init` at start-up")]
    NotInitialized,

    /// [`init`](crate::init) was called a second time.
    #[error("a lock registry is already installed; `lock_runtime::init` may be called once")]
    AlreadyInitialized,

    /// `wait_timeout` passed before the lock could be taken.
    #[error("timed out after {:?} waiting for lock `{key}`", to_millis(*waited))]
    Timeout {
        /// The key of the lock.
        key: String,
        /// How long the caller waited.
        waited: Duration,
    },

    /// The lease was lost while it was held: it expired, was taken over, or
    /// `max_hold` passed. Mutual exclusion may not have held for the body.
    #[error("lease on lock `{key}` was lost while held")]
    Lost {
        /// The key of the lock.
        key: String,
    },

    /// The key cannot be used (empty, too long, …).
    #[error("invalid lock key `{key}`: {reason}")]
    InvalidKey {
        /// The key as given, shortened if very long.
        key: String,
        /// What is wrong with it.
        reason: String,
    },

    /// The options cannot be used together or are out of range.
    #[error("invalid options for lock `{key}`: {reason}")]
    InvalidOptions {
        /// The key of the lock.
        key: String,
        /// What is wrong with the options.
        reason: String,
    },

    /// A store could not be connected to (an invalid address, a server
    /// that cannot be reached or refuses the credentials).
    #[error("could not connect to the {store} store at `{address}`")]
    Connect {
        /// The store's name: "redis", "postgres", ...
        store: &'static str,
        /// The address as given, without its password.
        address: String,
        /// The store's error.
        #[source]
        source: StoreError,
    },

    /// A store's settings cannot work (an argument out of range, or two that
    /// contradict each other); found before anything is sent to it.
    #[error("invalid settings for the {store} store at `{address}`: {reason}")]
    InvalidSettings {
        /// The store's name: "redis", "postgres", ...
        store: &'static str,
        /// The store's address, without its password.
        address: String,
        /// What cannot work, and what would.
        reason: String,
    },

    /// [`fencing_token`](crate::fencing_token) or
    /// [`fencing_token_for`](crate::fencing_token_for) was asked where the
    /// task holds no such lock through `#[distributed_lock]`: outside an
    /// annotated body (`key` is `None`), or for a key it did not lock.
    #[error("this task holds no lock{} through #[distributed_lock]", .key.as_ref().map(|key| format!(" on `{key}`")).unwrap_or_default())]
    NotHeld {
        /// The key asked for, if one was.
        key: Option<String>,
    },

    /// The store could not be reached or answered with an error, for one
    /// lock ([`StoreErrorKind::Unavailable`]): the same call may succeed
    /// later.
    #[error("the lock store failed to {action} `{key}`")]
    Store {
        /// The key of the lock.
        key: String,
        /// What was being done: "acquire", "renew", "release", "watch",
        /// "inspect", ....
        action: &'static str,
        /// The store's error.
        #[source]
        source: StoreError,
    },
}

impl LockError {
    /// The HTTP status a service answers a request with when its lock failed
    /// this way, and the delay to put in `Retry-After` where a retry may
    /// succeed:
    ///
    /// | error | status | retry after |
    /// |---|---|---|
    /// | `Timeout`, `Store`, `Connect` | 503 Service Unavailable | 1 s |
    /// | `Lost` | 409 Conflict | none: the work may have half happened |
    /// | `InvalidKey` | 400 Bad Request (the key comes from the request) | none |
    /// | the others (programming or set-up errors) | 500 Internal Server Error | none |
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_runtime::LockError;
    ///
    /// let err = LockError::Timeout { key: "stock:7".into(), waited: Duration::from_secs(2) };
    /// assert_eq!(err.http_status(), (503, Some(Duration::from_secs(1))));
    /// ```
    pub fn http_status(&self) -> (u16, Option<Duration>) {
        const RETRY: Option<Duration> = Some(Duration::from_secs(1));
        match self {
            LockError::Timeout { .. } | LockError::Store { .. } | LockError::Connect { .. } => {
                (503, RETRY)
            }
            LockError::Lost { .. } => (409, None),
            LockError::InvalidKey { .. } => (400, None),
            LockError::NotInitialized
            | LockError::AlreadyInitialized
            | LockError::NotHeld { .. }
            | LockError::InvalidOptions { .. }
            | LockError::InvalidSettings { .. } => (500, None),
        }
    }

    /// Shortens a key for an error message, so a 4 KB key does not fill the log.
    pub(crate) fn shown_key(key: &str) -> String {
        const MAX: usize = 200;
        if key.len() <= MAX {
            return key.to_owned();
        }
        let mut end = MAX;
        while !key.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}… ({} bytes)", &key[..end], key.len())
    }

    pub(crate) fn lost(key: &str) -> Self {
        LockError::Lost {
            key: Self::shown_key(key),
        }
    }

    /// The caller's error when a store failed to `action` `key`, by the
    /// error's kind: [`Store`](LockError::Store) for an unavailable store,
    /// [`InvalidOptions`](LockError::InvalidOptions) for a misuse (its
    /// reason the store's words), [`Lost`](LockError::Lost) for a lease no
    /// longer held.
    pub(crate) fn store(key: &str, action: &'static str, source: StoreError) -> Self {
        match source.kind() {
            StoreErrorKind::Misuse => Self::invalid_options(key, source.to_string()),
            StoreErrorKind::Lost => Self::lost(key),
            StoreErrorKind::Unavailable => LockError::Store {
                key: Self::shown_key(key),
                action,
                source,
            },
        }
    }

    pub(crate) fn invalid_options(key: &str, reason: impl Into<String>) -> Self {
        LockError::InvalidOptions {
            key: Self::shown_key(key),
            reason: reason.into(),
        }
    }
}

/// `waited` rounded to milliseconds, for messages (`2.001s`, not
/// `2.000089644s`).
fn to_millis(waited: Duration) -> Duration {
    Duration::from_millis(u64::try_from(waited.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_show_milliseconds() {
        let err = LockError::Timeout {
            key: "stock:7".into(),
            waited: Duration::from_nanos(2_000_089_644),
        };
        assert_eq!(
            err.to_string(),
            "timed out after 2s waiting for lock `stock:7`"
        );
        let err = LockError::Timeout {
            key: "k".into(),
            waited: Duration::from_micros(150_400),
        };
        assert_eq!(
            err.to_string(),
            "timed out after 150ms waiting for lock `k`"
        );
    }
}
