//! The procedural macro behind [`#[distributed_lock]`](macro@distributed_lock).
//!
//! Do not depend on this crate directly: use `lock-runtime`, which re-exports
//! the attribute and provides everything its expansion calls.

// The workspace's lints, and docs on every public item.
#![warn(missing_docs)]
#![doc(test(attr(deny(warnings))))]

mod errors;
mod expand;
mod input;
mod job;
mod key;
mod parse;
mod valid;

use proc_macro::TokenStream;

/// Makes an `async fn` a critical section that is mutually exclusive across
/// every process sharing the lock store.
///
/// The body runs only while this process holds the lock named by `key`; the
/// lock is released when the body ends, however it ends.
///
/// ```
/// use lock_runtime::{LockError, LockRegistry, distributed_lock};
///
/// #[distributed_lock(key = "stock:{item_id}", ttl = "10s")]
/// async fn buy(item_id: u64, qty: u32) -> u32 {
///     qty // runs in one process at a time per `item_id`
/// }
///
/// #[distributed_lock(key = "job:nightly-report", mode = "skip", ttl = "5m", hold_at_least = "30s")]
/// async fn nightly_report() -> usize {
///     42
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// lock_runtime::init(LockRegistry::memory())?;
/// let bought: u32 = buy(7, 1).await?;
/// assert_eq!(bought, 1);
/// match nightly_report().await? {
///     Some(rows) => println!("ran: {rows} rows"),
///     None => println!("another instance is running it"),
/// }
/// # Ok(())
/// # }
/// ```
///
/// # Arguments
///
/// | argument | default | meaning |
/// |---|---|---|
/// | `key = "…"` | required | template: `{name}` is a parameter (or a name a parameter's pattern binds, as `item` in `Path(item): Path<u64>`), `{name.field.sub}` a field path, `{self.field}` a field of the receiver, rendered with `Display`; `{{` and `}}` are literal braces |
/// | `keys = ["…", "…"]` | instead of `key` | several locks at once (a transfer, a checkout): taken in one canonical order, so callers wanting the same keys in any order never deadlock; all released on every exit; a lost lease on any cancels the body; `fencing_token_for("acct:7")` gives each key's token inside; skip mode takes all or none |
/// | `mode = "wait"` or `"skip"` | `"wait"` | wait: wait for the lock; skip: one attempt, `Ok(None)` if it is held elsewhere |
/// | `ttl = "30s"` | `"30s"` | lease length; units `ms`, `s`, `m`, `h`, combinable (`"1m30s"`) |
/// | `wait_timeout = "5s"` | wait forever | wait mode only: give up with [`LockError::Timeout`] |
/// | `hold_at_least = "10s"` | none | keep the lease this long after it was taken, even if the body ended sooner |
/// | `watchdog = false` | `true` | renew the lease every `ttl / 3` while the body runs |
/// | `fencing = false` | `true` | give the body a fencing token; without one, `fencing_token().await` gives 0 at once, and a store that issues tokens at a cost skips that work (on Redis, the round trip of the body's first read of its token) |
/// | `max_hold = "10m"` | none | stop renewing after this long; the body then loses its lease |
/// | `on_lost = "notify"` | `"cancel"` | when the lease is lost while the body runs: `"cancel"` drops the body at its next `.await`; `"notify"` lets it run to its end, told by `lock_runtime::lost()` / `is_lost()`, for a body that must finish or undo a step. Either way the call then returns `LockError::Lost` (with `errors = "into"`, the body's own error if it returns one) |
/// | `permits = 3` | `1` | a semaphore: at most this many bodies run at once per key, across every process (an integer literal or any `u32` expression); every caller of the key must give the same number |
/// | `access = "read"` or `"write"` | `"write"` | a read-write lock: `"read"` bodies run together, a `"write"` body alone; a waiting writer holds new readers off; `"read"` not with `permits` above 1 |
/// | `registry = expr` | the global registry | the registry to lock in: an expression giving a `LockRegistry`, a reference to one or an `Arc` of one (`registry = self.locks`) |
/// | `errors = "into"` | `"nested"` | for a body returning `Result<T, E>` with `E: From<LockError>`: wait mode returns `Result<T, E>` and skip mode `Result<Option<T>, E>`, the lock's errors converted into `E` (a missing `From` is one compile error at `E`); `"nested"` gives `Result<Result<T, E>, LockError>` |
/// | `name = "stock"` | the key template(s) | the lock's name in metrics (the `lock` label) and spans: a fixed name, so a template's values do not make one series per key |
/// | `crate = "path"` | `::lock_runtime` | path of the runtime crate, for renamed dependencies |
///
/// Every argument is checked at compile time: an unknown or duplicate
/// argument, a bad mode or duration, a placeholder that is not a parameter,
/// unbalanced braces and a non-`async` function are errors that point at
/// the offending token, and so is every option rule the runtime applies to
/// `LockOptions`, with its message: a `ttl` under 1 ms, a duration over ten
/// years, `permits = 0`, `permits` above 1 with `access = "read"`,
/// `wait_timeout` in skip mode, `hold_at_least` longer than `ttl`,
/// `max_hold` shorter than `ttl` or without the watchdog. Options that are
/// all literals are then not checked again when the function runs.
///
/// The four durations and `permits` also take any expression of type
/// [`Duration`](std::time::Duration) (`u32` for `permits`), evaluated at
/// each call: those are checked when the call runs
/// (`LockError::InvalidOptions`).
///
/// ```
/// use std::time::Duration;
/// use lock_runtime::{LockError, LockRegistry, distributed_lock};
///
/// struct Shop {
///     locks: LockRegistry,
///     wait: Duration,
/// }
///
/// impl Shop {
///     #[distributed_lock(key = "stock:{item}", ttl = Duration::from_secs(10),
///                        wait_timeout = self.wait, registry = self.locks)]
///     async fn buy(&self, item: u64) -> u64 {
///         item
///     }
/// }
///
/// #[derive(Debug)]
/// enum AppError {
///     OutOfStock,
///     Lock(LockError),
/// }
///
/// impl From<LockError> for AppError {
///     fn from(err: LockError) -> AppError {
///         AppError::Lock(err)
///     }
/// }
///
/// // `errors = "into"`: one `Result` with the body's error type, not two.
/// #[distributed_lock(key = "stock:{item}", registry = locks, errors = "into")]
/// async fn reserve(locks: &LockRegistry, item: u64, stock: u32) -> Result<u32, AppError> {
///     stock.checked_sub(1).ok_or(AppError::OutOfStock)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// let shop = Shop { locks: LockRegistry::memory(), wait: Duration::from_secs(1) };
/// assert_eq!(shop.buy(7).await?, 7);
/// let left: Result<u32, AppError> = reserve(&shop.locks, 7, 3).await;
/// match left {
///     Ok(left) => assert_eq!(left, 2),
///     Err(AppError::OutOfStock) => println!("sold out"),
///     Err(AppError::Lock(err)) => println!("try again later: {err}"),
/// }
/// # Ok(())
/// # }
/// ```
///
/// # Modes
///
/// In wait mode `async fn f(..) -> T` becomes
/// `async fn f(..) -> Result<T, LockError>`: the call waits until the lock is
/// free (woken by the release, not by polling), or until `wait_timeout`.
///
/// In skip mode it becomes `async fn f(..) -> Result<Option<T>, LockError>`:
/// one attempt is made, and `Ok(None)` is returned without running the body
/// when the lock is held, which is what a scheduled job on many replicas wants.
///
/// A nested call with the same key in the same task (the function calling
/// itself, or another annotated function with the same key) is re-entrant:
/// it runs at once under the outer lock and shares its fencing token.
///
/// # Scheduled jobs
///
/// With `job = "name"` and a schedule, the attribute declares a job that
/// every replica of a service runs and that runs once per fire across
/// them (see `lock_runtime::job`): the `async fn` is the job's body, and
/// takes nothing or the fire (`lock_runtime::job::Fire`, whose `at()` is
/// the fire's scheduled instant). It becomes a plain function that starts
/// the job on this replica, on the global registry (or `registry = ..`),
/// and returns its `JobHandle`: keep it, and `stop()` it at shutdown.
///
/// ```
/// use lock_runtime::job::Fire;
/// use lock_runtime::{LockError, LockRegistry, distributed_lock};
///
/// #[distributed_lock(job = "nightly-report", every = "24h")]
/// async fn nightly_report(fire: Fire) -> Result<(), std::io::Error> {
///     println!("the report due at {:?}", fire.at());
///     Ok(())
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), LockError> {
/// lock_runtime::init(LockRegistry::memory())?;
/// let report = nightly_report()?;
/// // ... at shutdown: no new fires, a running one ends.
/// report.stop().await;
/// # Ok(())
/// # }
/// ```
///
/// | argument | default | meaning |
/// |---|---|---|
/// | `job = "…"` | required | the job's name: the same on every replica; its fires' locks are `job:{name}:{instant}` |
/// | `every = "1h"` | one of the two | the period: fires at every whole multiple of it since the Unix epoch (UTC); a literal as above or a `Duration` expression |
/// | `cron = "0 3 * * *"` | one of the two | a cron expression, read in UTC (five fields, or six with seconds first); needs lock-runtime's `cron` feature; one that does not parse is refused when the job starts |
/// | `overlap = "allow"`, `"skip"` or `"wait"` | `"allow"` | what a fire does while another run of the job goes on |
/// | `ttl = "30s"` | `"30s"` | a run's lease, renewed while it runs: how long a crashed runner holds the fire |
/// | `max_skew = "2s"` | `"2s"` | the largest difference between replicas' clocks |
/// | `registry = expr` | the global registry | the registry the job locks in |
/// | `crate = "path"` | `::lock_runtime` | as above |
///
/// The lock's own arguments (`key`, `mode`, `hold_at_least`, ...) are
/// refused here: each fire is a lock of its own, held while it runs and
/// kept after it as long as the schedule and the skew need; no lock timing
/// is left to choose.
///
/// # Errors
///
/// - [`LockError::NotInitialized`] if `lock_runtime::init` was not called;
/// - [`LockError::Timeout`] when `wait_timeout` passes first;
/// - [`LockError::Lost`] when the lease was lost while the body ran (the
///   watchdog could not renew it, `max_hold` passed, or without the watchdog
///   the `ttl` passed): the body is cancelled at its next `.await`;
/// - [`LockError::InvalidKey`] when the rendered key is empty or too long;
/// - [`LockError::Store`] when the store cannot be reached.
///
/// # Cancellation
///
/// The lock is released when the body returns, when it panics, and when the
/// caller drops the future mid-body: the guard's `Drop` spawns the release on
/// the current Tokio runtime, so the next holder does not wait for the TTL.
/// Only when no runtime is left (the process is exiting) is the TTL the
/// safety net, as it is for a process that crashes.
///
/// # Use with async-trait
///
/// Put the attribute on the method inside an `#[async_trait]` impl block.
/// `#[async_trait]` runs first and produces `Box::pin(async move { .. })`;
/// this attribute recognises that shape, renders the key before the inner
/// future is built, and rewrites the future's `Output`. The trait declares
/// the rewritten return type, `Result<T, LockError>`. Native `async fn` in
/// traits needs nothing special.
///
/// # Renaming the crate
///
/// The expansion refers to `::lock_runtime`. If the dependency is renamed,
/// say which path to use:
///
/// ```toml
/// [dependencies]
/// locks = { package = "lock-runtime", version = "0.1" }
/// ```
///
/// ```ignore
/// #[locks::distributed_lock(key = "job", crate = "locks")]
/// async fn job() {}
/// ```
///
/// [`LockError::Timeout`]: ../lock_runtime/enum.LockError.html#variant.Timeout
/// [`LockError::NotInitialized`]: ../lock_runtime/enum.LockError.html#variant.NotInitialized
/// [`LockError::Lost`]: ../lock_runtime/enum.LockError.html#variant.Lost
/// [`LockError::InvalidKey`]: ../lock_runtime/enum.LockError.html#variant.InvalidKey
/// [`LockError::Store`]: ../lock_runtime/enum.LockError.html#variant.Store
#[proc_macro_attribute]
pub fn distributed_lock(args: TokenStream, item: TokenStream) -> TokenStream {
    let (args, item) = (args.into(), item.into());
    if job::is_job(&args) {
        return job::expand(args, item).into();
    }
    expand::distributed_lock(args, item).into()
}
