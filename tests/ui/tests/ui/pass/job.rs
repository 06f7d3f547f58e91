//! The scheduled-job form: a function that starts the job and returns
//! its handle, with or without the fire, on the global registry or one
//! named.
use std::time::Duration;

use lock_runtime::job::{Fire, JobHandle};
use lock_runtime::{LockError, LockRegistry, distributed_lock};

#[distributed_lock(job = "nightly-report", every = "24h")]
async fn nightly_report() -> Result<(), std::io::Error> {
    Ok(())
}

fn locks() -> LockRegistry {
    LockRegistry::memory()
}

/// Every fire, with its instant.
#[distributed_lock(job = "sweep", every = Duration::from_secs(60), overlap = "skip",
                   ttl = "10s", max_skew = "500ms", registry = locks())]
pub async fn sweep(fire: Fire) {
    let _ = fire.at();
}

fn main() {
    let _: fn() -> Result<JobHandle, LockError> = nightly_report;
    let _: fn() -> Result<JobHandle, LockError> = sweep;
}
