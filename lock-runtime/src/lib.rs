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
//! [`LockRegistry::try_lock`] return a [`LockGuard`];
//! [`LockRegistry::lock_all`] takes several keys, and
//! [`LockRegistry::with_lock`] runs a future under a lock whose key or
//! options are built at run time. The attribute's arguments are listed on
//! [`distributed_lock`](macro@distributed_lock); [`LockOptions`] holds the
//! same settings for the manual API.
//!
//! # Stores
//!
//! A [`LockRegistry`] wraps one store, and [`init`] makes one the registry
//! every annotated function uses (`registry = expr` picks another per
//! function):
//!
//! | store | constructor | feature | promises | semaphores, read-write locks |
//! |---|---|---|---|---|
//! | this process | [`LockRegistry::memory`] | | tests, one instance | yes; a waiting writer holds new readers off |
//! | Redis: one server, a Cluster (`redis+cluster://`), a Sentinel group (`redis+sentinel://`), each over TLS (`rediss...`) | [`LockRegistry::redis`], [`RedisStore::builder`] | `redis` (default), `redis-tls` | [`store::redis`] | yes, one round trip per grant; a waiting writer holds new readers off; in fair mode, everyone in arrival order |
//! | Redlock over N independent Redis masters | [`LockRegistry::redlock`], [`RedlockStore::builder`] | `redis` | [`store::redlock`] | no: refused at the first call (`InvalidOptions`); a permit kept on a majority of independent masters is not built |
//! | PostgreSQL, a lease table | `LockRegistry::postgres`, `PostgresStore::builder`, `PostgresStore::with_config` | `postgres` | `store::postgres` | yes, one round trip per grant (a function); a waiting writer holds new readers off |
//! | MySQL 8.0+ or MariaDB 10.6+, a lease table | `LockRegistry::mysql`, `MySqlStore::builder`, `MySqlStore::with_opts`, `MySqlStore::with_pool` | `mysql` | `store::mysql` | yes, one round trip per grant (a procedure); a waiting writer holds new readers off |
//! | etcd leases and revisions | `LockRegistry::etcd`, `EtcdStore::builder` | `etcd`, `etcd-tls` | `store::etcd` | yes, one round trip per grant; served in arrival order, a queued writer ahead of later readers |
//! | ZooKeeper ephemeral sequential nodes | `LockRegistry::zookeeper`, `ZooKeeperStore::builder` | `zookeeper` | `store::zookeeper`; a crashed holder's key is free within its ttl and 1 s, whatever the session timeout | yes, one request per grant alone in the queue; served in arrival order, a queued writer ahead of later readers |
//!
//! On every store a crashed holder blocks its key for its `ttl`, and on
//! etcd (leases in whole seconds) and ZooKeeper (a margin for its servers'
//! clocks, see `store::zookeeper`) for at most 1 s more.
//!
//! A store refuses a claim it does not serve (`permits` above 1, `access =
//! "read"`) with [`LockError::InvalidOptions`] naming it, before anything
//! is sent; its [`Capabilities`](store::Capabilities) say which it serves.
//!
//! Every store implements the contract in [`store`] (where the types for
//! writing a store of your own live); everything else (waiting, renewal,
//! re-entrancy, release on every exit) is written once on top of it.
//!
//! # Features
//!
//! - `macros` (default): the `#[distributed_lock]` attribute.
//! - `redis` (default): [`RedisStore`] and [`RedlockStore`].
//! - `redis-tls`: `rediss://` URLs, with rustls; a private CA and client
//!   certificates on the builders.
//! - `postgres`, `mysql`, `etcd` (its build needs `protoc`), `etcd-tls`,
//!   `zookeeper`: those stores.
//! - `metrics`: counters and histograms of every lock through the
//!   [`metrics`](https://docs.rs/metrics) facade, labelled by `store` and
//!   `lock` (the lock's name: [`LockOptions::name`], the attribute's `name`
//!   or key template): `distributed_lock_acquired_total`,
//!   `_contended_total`, `_skipped_total`, `_timeouts_total`,
//!   `_lost_total` (with a `reason`), `_renewals_failed_total`,
//!   `_hand_overs_total`, and the histograms `distributed_lock_wait_seconds`
//!   and `distributed_lock_hold_seconds`. Install the recorder before the
//!   first lock: each name's metrics are registered at its first lock.
//!   Scheduled jobs count their fires in
//!   `distributed_lock_job_fires_total`, labelled by `job` and `outcome`
//!   ([`FireOutcome::label`](job::FireOutcome::label)): each replica counts
//!   what it saw, one replica counts a fire `missed`.
//! - `testkit`: the store contract as tests (`store_contract!`), for a
//!   store of your own.
//!
//! # A lost lease
//!
//! When a lease is lost while its body runs, the body is cancelled at its
//! next `.await` and the call returns [`LockError::Lost`]. A body that must
//! finish or undo a step takes `on_lost = "notify"`
//! ([`LockOptions::on_lost`]): it runs on, learns of the loss from [`lost`]
//! or [`is_lost`], and the call still returns `Lost`.
//!
//! # Scheduled jobs
//!
//! A job that every replica schedules and one runs per fire is a
//! [`job::Job`]: each fire is a lock of its own, named by its scheduled
//! instant, so a replica whose clock is late finds it taken, no lock timing
//! is left to choose, and a fire nobody ran is reported missed:
//!
//! ```
//! use std::time::Duration;
//! use lock_runtime::LockRegistry;
//! use lock_runtime::job::{Job, Schedule};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lock_runtime::LockError> {
//! let registry = LockRegistry::memory();
//! let cleanup = Job::new("cleanup", Schedule::every(Duration::from_secs(600)))
//!     .spawn(&registry, |fire| async move {
//!         println!("cleaning up for the fire at {:?}", fire.at());
//!     })?;
//! cleanup.stop().await;
//! # Ok(())
//! # }
//! ```
//!
//! The attribute declares the same: `#[distributed_lock(job = "cleanup",
//! every = "10m")]` on an `async fn` taking nothing or the [`job::Fire`]
//! makes a function that starts the job and returns its
//! [`job::JobHandle`] (see the attribute's docs).
//!
//! # Recipes
//!
//! **A job on at most N replicas.** Each tick, every replica tries; at most
//! three run the export at once, the others skip it:
//!
//! ```
//! use lock_runtime::{LockRegistry, distributed_lock};
//!
//! #[distributed_lock(key = "export", permits = 3, mode = "skip", ttl = "1m")]
//! async fn export_shard() -> &'static str {
//!     "exported"
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lock_runtime::LockError> {
//! lock_runtime::init(LockRegistry::memory())?;
//! match export_shard().await? {
//!     Some(done) => println!("{done}"),
//!     None => println!("three replicas are exporting already"),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! **A read-mostly cache.** Readers run together; the refresh runs alone,
//! and once it waits no new reader starts, so a stream of readers cannot
//! hold it off:
//!
//! ```
//! use lock_runtime::{LockRegistry, distributed_lock};
//!
//! #[distributed_lock(key = "prices:{region}", access = "read", registry = locks)]
//! async fn price(locks: &LockRegistry, region: &str, item: u32) -> u32 {
//!     item * 100 // read the shared price list
//! }
//!
//! #[distributed_lock(key = "prices:{region}", access = "write", registry = locks)]
//! async fn refresh(locks: &LockRegistry, region: &str) {
//!     // rewrite the shared price list
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), lock_runtime::LockError> {
//! let locks = LockRegistry::memory();
//! let (a, b) = tokio::join!(price(&locks, "eu", 1), price(&locks, "eu", 2));
//! assert_eq!((a?, b?), (100, 200));
//! refresh(&locks, "eu").await?;
//! # Ok(())
//! # }
//! ```
//!
//! **Leader election.** One replica holds a long-lived lock, renewed by the
//! watchdog for as long as it lives; the others wait for it. Leadership
//! ends when the lease is lost (the leader cut off from the store, say):
//! `on_lost = "notify"` lets the loop stop cleanly instead of being dropped
//! mid-step.
//!
//! ```
//! use std::time::Duration;
//! use lock_runtime::{LockRegistry, distributed_lock};
//!
//! #[distributed_lock(key = "leader:billing", ttl = "10s", on_lost = "notify")]
//! async fn lead(rounds: u32) -> u32 {
//!     let mut done = 0;
//!     while done < rounds && !lock_runtime::is_lost() {
//!         tokio::select! {
//!             () = lock_runtime::lost() => break, // no longer the leader
//!             () = tokio::time::sleep(Duration::from_millis(1)) => done += 1, // one round of leader's work
//!         }
//!     }
//!     done
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! lock_runtime::init(LockRegistry::memory()).unwrap();
//! // Each replica runs this loop; the one that returns had the lock.
//! match lead(3).await {
//!     Ok(rounds) => println!("led for {rounds} rounds"),
//!     Err(err) => eprintln!("leadership ended: {err}"),
//! }
//! # }
//! ```
//!
//! # Observability
//!
//! Every lock is a `tracing` span named `distributed_lock` (fields `key`,
//! `mode`, `store`, `fencing`, `outcome`), with its wait as a child span
//! `lock_wait`; the attribute runs its body inside it, and
//! [`LockGuard::span`] gives it to manual-API users. With no subscriber
//! listening at INFO, no span is made (the events still reach `tracing`'s
//! `log` fallback). [`LockRegistry::inspect`] says who
//! holds a key, and [`LockRegistry::force_release`] frees a stuck one.
//! [`LockError::http_status`] maps a failed lock to the HTTP answer a
//! service gives.
//!
#![doc = include_str!("guarantees.md")]
// The workspace's lints, and docs on every public item.
#![warn(missing_docs)]
#![doc(test(attr(deny(warnings))))]

// The API: what users of locks call.
mod error;
mod guard;
mod lock_all;
mod options;
mod private;
mod registry;
mod section;
mod task_locks;
// The engine: written once over the contract, names no store.
mod acquire;
mod local_queue;
mod renewal;
mod telemetry;
// Scheduled jobs that run once per fire.
pub mod job;
// The contract, and the stores under it.
pub mod store;

pub use error::LockError;
pub use guard::LockGuard;
pub use lock_all::LockGuards;
pub use options::{Access, LockOptions, MAX_DURATION, OnLost};
pub use registry::{LockInfo, LockRegistry, RegistryBuilder, init, registry};
pub use store::MAX_KEY_LEN;
pub use task_locks::{fencing_token, fencing_token_for, is_lost, lost};

#[cfg(feature = "etcd")]
pub use store::etcd::EtcdStore;
pub use store::memory::MemoryStore;
#[cfg(feature = "mysql")]
pub use store::mysql::MySqlStore;
#[cfg(feature = "postgres")]
pub use store::postgres::PostgresStore;
#[cfg(feature = "redis")]
pub use store::redis::{Fencing, RedisStore};
#[cfg(feature = "redis")]
pub use store::redlock::RedlockStore;
#[cfg(feature = "zookeeper")]
pub use store::zookeeper::ZooKeeperStore;

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
