//! Helpers the stores share. Not part of the contract: a store outside
//! this crate has its own.

#[cfg(any(
    feature = "redis",
    feature = "postgres",
    feature = "etcd",
    feature = "zookeeper"
))]
pub(crate) mod connect;
pub(crate) mod keyed;
#[cfg(any(feature = "etcd", feature = "zookeeper"))]
pub(crate) mod queue;
#[cfg(any(feature = "redis", feature = "postgres"))]
pub(crate) mod redact;
