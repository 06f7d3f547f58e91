//! The defaults and limits of a lock's options, defined once: the runtime
//! applies them to `LockOptions`, and the `#[distributed_lock]` attribute
//! checks its literal arguments against them at compile time. Use them
//! through `lock-runtime`, which re-exports what users need.

#![no_std]

use core::time::Duration;

/// The lease length when none is given: 30 s.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// The longest duration any option accepts: ten years. Longer values are
/// almost always a unit mistake, and they would overflow clocks.
pub const MAX_DURATION: Duration = Duration::from_secs(10 * 365 * 24 * 60 * 60);
