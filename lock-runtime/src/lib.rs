//! Declarative distributed locks for async Rust.
//!
//! Put [`#[distributed_lock]`](macro@distributed_lock) on an `async fn` and
//! its body never runs in two processes at once: the lock is taken before
//! the body, renewed while it runs, and released however it ends.
//!
//! ```
//! use lock_runtime::{LockError, LockRegistry, distributed_lock};
//!
//! #[distributed_lock(key = "stock:{item_id}", ttl = "10s")]
//! async fn buy(item_id: u64, qty: u32) -> u32 {
//!     qty
//! }
//!
//! #[distributed_lock(key = "job:nightly-report", mode = "skip", ttl = "5m", hold_at_least = "30s")]
//! async fn nightly_report() -> usize {
//!     42
//! }
//!
//! #[tokio::main(flavor = "current_thread")]
//! async fn main() -> Result<(), LockError> {
//!     lock_runtime::init(LockRegistry::memory())?;
//!     let bought = buy(7, 1).await?;
//!     assert_eq!(bought, 1);
//!     match nightly_report().await? {
//!         Some(rows) => println!("ran: {rows} rows"),
//!         None => println!("another instance is running it"),
//!     }
//!     Ok(())
//! }
//! ```
//!
//! Without the attribute, [`LockRegistry::lock`] and
//! [`LockRegistry::try_lock`] return a [`LockGuard`].
//!
//! # Stores
//!
//! A [`LockRegistry`] wraps one store. [`LockRegistry::memory`] keeps
//! locks in this process (tests, single-instance services);
//! [`LockRegistry::redis`] shares them between every process that uses one
//! Redis server, [`LockRegistry::redlock`] between those that use N
//! independent ones; PostgreSQL, etcd and ZooKeeper are behind their
//! features. Each has a builder for its settings, and
//! [`LockRegistry::new`] or [`LockRegistry::builder`] takes the store it
//! builds. Every store implements the contract in [`store`]; everything
//! else (waiting, renewal, re-entrancy, release on every exit) is written
//! once on top of it.
//!
//! # Features
//!
//! - `macros` (default): the `#[distributed_lock]` attribute.
//! - `redis` (default): [`RedisStore`], [`RedlockStore`],
//!   [`LockRegistry::redis`] and [`LockRegistry::redlock`].
//! - `postgres`: `PostgresStore` and `LockRegistry::postgres`, a lease
//!   table in a PostgreSQL database.
//! - `etcd`: `EtcdStore` and `LockRegistry::etcd`, leases on an etcd
//!   cluster with its revisions as fencing tokens (its build needs `protoc`).
//! - `zookeeper`: `ZooKeeperStore` and `LockRegistry::zookeeper`, a FIFO
//!   queue of ephemeral sequential nodes per key, czxid fencing.
//! - `metrics`: counters and histograms of every lock through the
//!   [`metrics`](https://docs.rs/metrics) facade (`distributed_lock_acquired_total`,
//!   `distributed_lock_wait_seconds`, ...; the README lists them all),
//!   labelled by store and lock name ([`LockOptions::name`], the
//!   attribute's `name` or key template). Install the recorder before the
//!   first lock: each lock name's metrics are registered once, at its first
//!   lock, and reused.
//!
//! # Observability
//!
//! Every lock is a `tracing` span named `distributed_lock` (fields `key`,
//! `mode`, `store`, `fencing`, `outcome`), with its wait as a child span
//! `lock_wait`; the attribute runs its body inside it, and
//! [`LockGuard::span`] gives it to manual-API users. With no subscriber a
//! span's fields are never evaluated. [`LockRegistry::inspect`] says who
//! holds a key, and [`LockRegistry::force_release`] frees a stuck one.

// The workspace's lints, and docs on every public item.
#![warn(missing_docs)]
#![doc(test(attr(deny(warnings))))]

// The API: what users of locks call.
mod body;
mod context;
mod error;
mod guard;
mod multi;
mod options;
mod private;
mod registry;
// The engine: written once over the contract, names no store.
mod acquire;
mod local_queue;
mod renewal;
mod telemetry;
// The contract, and the stores under it.
pub mod store;

pub use context::{fencing_token, fencing_token_for, is_lost, lost};
pub use error::{BackendError, LockError};
pub use guard::LockGuard;
pub use multi::LockGuards;
pub use options::{LockOptions, MAX_DURATION, OnLost};
pub use registry::{LockInfo, LockRegistry, MAX_KEY_LEN, RegistryBuilder, init, registry};

#[cfg(feature = "etcd")]
pub use store::etcd::EtcdStore;
pub use store::memory::MemoryStore;
#[cfg(feature = "postgres")]
pub use store::postgres::PostgresStore;
#[cfg(feature = "redis")]
pub use store::redis::{Fencing, RedisStore};
#[cfg(feature = "redis")]
pub use store::redlock::RedlockStore;
#[cfg(feature = "zookeeper")]
pub use store::zookeeper::ZooKeeperStore;

/// The memory store's former name.
#[deprecated(since = "0.2.0", note = "renamed to `MemoryStore`")]
pub type MemoryBackend = MemoryStore;
/// The Redis store's former name.
#[cfg(feature = "redis")]
#[deprecated(since = "0.2.0", note = "renamed to `RedisStore`")]
pub type RedisBackend = RedisStore;
/// The Redlock store's former name.
#[cfg(feature = "redis")]
#[deprecated(since = "0.2.0", note = "renamed to `RedlockStore`")]
pub type RedlockBackend = RedlockStore;
/// The PostgreSQL store's former name.
#[cfg(feature = "postgres")]
#[deprecated(since = "0.2.0", note = "renamed to `PostgresStore`")]
pub type PostgresBackend = PostgresStore;
/// The etcd store's former name.
#[cfg(feature = "etcd")]
#[deprecated(since = "0.2.0", note = "renamed to `EtcdStore`")]
pub type EtcdBackend = EtcdStore;
/// The ZooKeeper store's former name.
#[cfg(feature = "zookeeper")]
#[deprecated(since = "0.2.0", note = "renamed to `ZooKeeperStore`")]
pub type ZooKeeperBackend = ZooKeeperStore;

#[cfg(feature = "macros")]
#[doc(inline)]
pub use lock_macros::distributed_lock;

/// The README's examples, compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;

/// Items the `#[distributed_lock]` expansion uses. Not public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::private::*;
}
