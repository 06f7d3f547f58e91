//! Runnable examples of lock-runtime; see the `[[example]]` targets.
