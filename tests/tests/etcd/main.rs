//! The etcd store against real clusters the harness starts: the contract, the attribute and real OS processes.
//!
//! One binary for the family: its modules are the suites.

mod attribute;
mod partition;
mod processes;
mod soak;
mod store;
