//! Semaphores and read-write locks: `permits` as a literal, a constant or
//! a field, `access` either way, with the other arguments and skip mode.

use lock_runtime::{LockError, LockRegistry, distributed_lock};

const REPLICAS: u32 = 3;

struct Exporter {
    locks: LockRegistry,
    slots: u32,
}

impl Exporter {
    #[distributed_lock(key = "export:{day}", permits = self.slots, registry = self.locks, mode = "skip")]
    async fn export(&self, day: u32) -> u32 {
        day
    }
}

#[distributed_lock(key = "report", permits = REPLICAS, ttl = "10s", wait_timeout = "1s")]
async fn report() {}

#[distributed_lock(key = "prices", permits = 2)]
async fn two_at_once() {}

#[distributed_lock(key = "prices:{region}", access = "read", errors = "into")]
async fn read_prices(region: &str) -> Result<usize, LockError> {
    Ok(region.len())
}

#[distributed_lock(keys = ["prices:{a}", "prices:{b}"], access = "write")]
async fn write_prices(a: &str, b: &str) {}

fn main() {
    let _ = (report, two_at_once, read_prices, write_prices);
    let _ = Exporter {
        locks: LockRegistry::memory(),
        slots: 2,
    };
}
