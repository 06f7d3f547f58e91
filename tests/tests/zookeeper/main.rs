//! The ZooKeeper store against real ensembles the harness starts: the harness itself, the contract, the attribute and real OS processes.
//!
//! One binary for the family: its modules are the suites.

mod attribute;
mod harness;
mod processes;
mod soak;
mod store;
