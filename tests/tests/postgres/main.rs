//! The PostgreSQL store against real servers the harness makes with `initdb`: the contract, the attribute, real OS processes, and PgBouncer in front.
//!
//! One binary for the family: its modules are the suites.

mod attribute;
mod partition;
mod pooler;
mod processes;
mod soak;
mod store;
