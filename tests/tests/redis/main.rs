//! The Redis store and Redlock against real servers the harness starts: the contract, the attribute, a cluster, real OS processes, and holders cut off by a proxy.
//!
//! One binary for the family: its modules are the suites.

mod attribute;
mod claims;
mod cluster;
mod commands;
mod fair;
mod partition;
mod processes;
mod redlock;
mod redlock_processes;
mod soak;
mod store;
mod support;
mod tls;
