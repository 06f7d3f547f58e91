//! The MySQL store against real MariaDB servers the harness makes with `mariadb-install-db`: the contract, the attribute, real OS processes, a partition and a soak.
//!
//! One binary for the family: its modules are the suites.

mod attribute;
mod partition;
mod processes;
mod soak;
mod store;
