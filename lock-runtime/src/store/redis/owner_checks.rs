//! The server's own owner-checked commands, sent in place of a script where
//! the server has them: Redis 8.4's `DELEX key IFEQ token`, Valkey 9's
//! `DELIFEQ key token`, and both servers' `SET key token IFEQ token PX ms`
//! (Valkey's since 8.1).

use std::sync::atomic::{AtomicU8, Ordering};

use ::redis::{Cmd, RedisError, Value};
use once_cell::sync::Lazy;

/// Which commands release and renew an exclusive lease: the server's own
/// owner-checked commands, or the store's Lua scripts (see the [module
/// docs](super#protocol)). Set with
/// [`RedisStoreBuilder::owner_checks`](super::RedisStoreBuilder::owner_checks);
/// [`RedisStore::owner_checks`](super::RedisStore::owner_checks) says which
/// a store sends.
///
/// The commands serve the common case: a lease nobody waits for, released
/// or renewed in one command that the server runs without a script. A key
/// a waiter marked, a lease whose acquire found the key in demand, shares
/// and permits, and fair mode keep the scripts. A server that refuses one
/// of the commands (unknown, a syntax error, no permission) gets the
/// script for that call, and the store sends scripts from then on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum OwnerChecks {
    /// Asks every server that takes writes at connect (`COMMAND INFO`):
    /// the one server, each primary of a cluster, a Sentinel group's master
    /// (again after each failover). The commands are used when every one
    /// has them; Redis 8.4 brought `DELEX` with `SET … IFEQ`, and Valkey's
    /// `DELIFEQ` came after its `SET … IFEQ`. The default.
    #[default]
    Detect,
    /// Lua scripts only.
    Scripts,
    /// `DELEX key IFEQ token` and `SET … IFEQ` (Redis 8.4 and later),
    /// without asking.
    Delex,
    /// `DELIFEQ key token` and `SET … IFEQ` (Valkey 9 and later), without
    /// asking.
    Delifeq,
}

/// What a store sends now, shared by its clones and its connection (which
/// asks again after a Sentinel failover).
#[derive(Debug)]
pub(super) struct Checks {
    /// An [`OwnerChecks`] as `u8`: never `Detect`.
    sent: AtomicU8,
    detects: bool,
}

impl Checks {
    /// As `setting` says; scripts until a detection says otherwise.
    pub(super) fn new(setting: OwnerChecks) -> Self {
        let detects = setting == OwnerChecks::Detect;
        let checks = Checks {
            sent: AtomicU8::new(OwnerChecks::Scripts as u8),
            detects,
        };
        if !detects {
            checks.set(setting);
        }
        checks
    }

    /// The commands sent now: never [`OwnerChecks::Detect`].
    pub(super) fn sent(&self) -> OwnerChecks {
        match self.sent.load(Ordering::Relaxed) {
            sent if sent == OwnerChecks::Delex as u8 => OwnerChecks::Delex,
            sent if sent == OwnerChecks::Delifeq as u8 => OwnerChecks::Delifeq,
            _ => OwnerChecks::Scripts,
        }
    }

    /// Whether the store asks the server which commands it has.
    pub(super) fn detects(&self) -> bool {
        self.detects
    }

    /// Sends `sent` from now on (scripts for `Detect`).
    pub(super) fn set(&self, sent: OwnerChecks) {
        let sent = match sent {
            OwnerChecks::Detect => OwnerChecks::Scripts,
            sent => sent,
        };
        self.sent.store(sent as u8, Ordering::Relaxed);
    }

    /// A server refused one of the commands: scripts from now on.
    pub(super) fn refused(&self, error: &RedisError) {
        if self.sent() != OwnerChecks::Scripts {
            tracing::warn!(%error, "the Redis server refused an owner-checked command; using scripts");
            self.set(OwnerChecks::Scripts);
        }
    }
}

/// The question [`offered`] reads the answer of.
pub(super) static QUESTION: Lazy<Cmd> = Lazy::new(|| {
    let mut cmd = ::redis::cmd("COMMAND");
    cmd.arg("INFO").arg("DELEX").arg("DELIFEQ");
    cmd
});

/// The commands that every server offers, from their answers to
/// [`QUESTION`]: one server's (an array with one entry per command, nil
/// for an unknown one), or a map of each node's.
pub(super) fn offered(answer: &Value) -> OwnerChecks {
    let answers: Vec<&Value> = match answer {
        Value::Map(nodes) => nodes.iter().map(|(_, answer)| answer).collect(),
        answer => vec![answer],
    };
    // Whether every server knows the command asked `at` that place.
    let everywhere = |at: usize| {
        !answers.is_empty()
            && answers.iter().all(|answer| {
                matches!(answer, Value::Array(entries)
                    if !matches!(entries.get(at), None | Some(Value::Nil)))
            })
    };
    if everywhere(0) {
        OwnerChecks::Delex
    } else if everywhere(1) {
        OwnerChecks::Delifeq
    } else {
        OwnerChecks::Scripts
    }
}

/// The owner-checked release of `token`'s key `lock` with `checks`' command.
pub(super) fn delete(checks: OwnerChecks, lock: &[u8], hex: &[u8]) -> Cmd {
    let mut cmd = Cmd::with_capacity(4, 32 + lock.len());
    match checks {
        OwnerChecks::Delifeq => cmd.arg("DELIFEQ").arg(lock).arg(hex),
        _ => cmd.arg("DELEX").arg(lock).arg("IFEQ").arg(hex),
    };
    cmd
}

/// Sets `lock` to expire in `ms` if `token` (`hex`) holds it.
pub(super) fn expire(lock: &[u8], hex: &[u8], ms: u64) -> Cmd {
    let mut cmd = Cmd::with_capacity(7, 64 + lock.len());
    cmd.arg("SET")
        .arg(lock)
        .arg(hex)
        .arg("IFEQ")
        .arg(hex)
        .arg("PX")
        .arg(ms);
    cmd
}

/// Whether `error` is a server's refusal of a command it lacks or does not
/// let this client run (`ERR unknown command`, `ERR syntax error`,
/// `NOPERM`), which left the key untouched.
pub(super) fn is_refusal(error: &RedisError) -> bool {
    matches!(error.code(), Some("ERR" | "NOPERM"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> Value {
        Value::Array(vec![Value::BulkString(b"delex".to_vec()), Value::Int(-2)])
    }

    #[test]
    fn the_commands_every_server_offers_are_used() {
        let redis_7 = Value::Array(vec![Value::Nil, Value::Nil]);
        let redis_8_4 = Value::Array(vec![entry(), Value::Nil]);
        let valkey_9 = Value::Array(vec![Value::Nil, entry()]);
        assert_eq!(offered(&redis_7), OwnerChecks::Scripts);
        assert_eq!(offered(&redis_8_4), OwnerChecks::Delex);
        assert_eq!(offered(&valkey_9), OwnerChecks::Delifeq);
        assert_eq!(offered(&Value::Array(vec![])), OwnerChecks::Scripts);
        assert_eq!(offered(&Value::Nil), OwnerChecks::Scripts);
        let node = |answer: &Value| (Value::SimpleString("127.0.0.1:7000".into()), answer.clone());
        let cluster = |answers: &[&Value]| Value::Map(answers.iter().map(|a| node(a)).collect());
        assert_eq!(
            offered(&cluster(&[&redis_8_4, &redis_8_4])),
            OwnerChecks::Delex
        );
        assert_eq!(
            offered(&cluster(&[&redis_8_4, &redis_7])),
            OwnerChecks::Scripts
        );
        assert_eq!(
            offered(&cluster(&[&valkey_9, &redis_8_4])),
            OwnerChecks::Scripts
        );
        assert_eq!(offered(&cluster(&[])), OwnerChecks::Scripts);
    }

    #[test]
    fn a_refusal_falls_back_to_scripts_for_good() {
        let checks = Checks::new(OwnerChecks::Delifeq);
        assert!(!checks.detects());
        assert_eq!(checks.sent(), OwnerChecks::Delifeq);
        let unknown = RedisError::from((
            ::redis::ErrorKind::Server(::redis::ServerErrorKind::ResponseError),
            "unknown command",
        ));
        checks.refused(&unknown);
        assert_eq!(checks.sent(), OwnerChecks::Scripts);
        let detecting = Checks::new(OwnerChecks::Detect);
        assert!(detecting.detects());
        assert_eq!(detecting.sent(), OwnerChecks::Scripts);
    }
}
