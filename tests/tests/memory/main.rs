//! The runtime on the in-process store: the attribute and the manual API, the store contract, inspection and spans.
//!
//! One binary for the family: its modules are the suites.

mod attribute_errors;
mod attribute_keys;
mod attribute_settings;
mod claims;
mod inspect;
mod lost_lease;
mod manual;
mod registry;
mod soak;
mod spans;
