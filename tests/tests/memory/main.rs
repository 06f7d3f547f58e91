//! The runtime on the in-process store: the attribute and the manual API, the store contract, inspection, spans and scheduled jobs.
//!
//! One binary for the family: its modules are the suites.

mod attribute_errors;
mod attribute_keys;
mod attribute_settings;
mod claims;
mod inspect;
mod jobs;
mod lost_lease;
mod manual;
mod registry;
mod soak;
mod spans;
