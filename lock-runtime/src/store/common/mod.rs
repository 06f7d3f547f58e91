//! Helpers the stores share. Not part of the contract: a store outside
//! this crate has its own.

#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) mod claim_text;
#[cfg(any(
    feature = "redis",
    feature = "postgres",
    feature = "mysql",
    feature = "etcd",
    feature = "zookeeper"
))]
pub(crate) mod connect;
pub(crate) mod keyed;
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
pub(crate) mod queue;
#[cfg(any(feature = "redis", feature = "postgres", feature = "mysql"))]
pub(crate) mod redact;
pub(crate) mod slots;
#[cfg(any(feature = "redis-tls", feature = "mysql-tls"))]
pub(crate) mod tls;

/// Locks `mutex`, as it is after a panic elsewhere: for state whose every
/// critical section leaves it consistent.
#[cfg(feature = "redis")]
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poison| poison.into_inner())
}
