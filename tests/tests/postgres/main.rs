//! The PostgreSQL store against real servers the harness makes with `initdb`: the contract, the attribute and real OS processes.
//!
//! One binary for the family: its modules are the suites.

mod attribute;
mod processes;
mod store;
