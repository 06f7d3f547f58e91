//! The MySQL store against real MariaDB servers the harness makes with `mariadb-install-db`: the contract, bad input, and faults.
//!
//! One binary for the family: its modules are the suites.

mod store;
