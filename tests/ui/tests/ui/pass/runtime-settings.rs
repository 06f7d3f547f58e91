//! Durations from `Duration` expressions (constants, fields, calls) and
//! `registry = expr` (a field, a reference, an `Arc`), in functions,
//! methods and skip mode.

use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{LockError, LockRegistry, distributed_lock};

const TTL: Duration = Duration::from_secs(10);

struct Shop {
    locks: LockRegistry,
    wait: Duration,
}

impl Shop {
    #[distributed_lock(key = "stock:{item}", ttl = TTL, wait_timeout = self.wait, registry = self.locks)]
    async fn buy(&self, item: u64) -> u64 {
        item
    }

    #[distributed_lock(key = "job", mode = "skip", ttl = Duration::from_millis(500), registry = &self.locks)]
    async fn job(&self) {}
}

#[distributed_lock(key = "k:{id}", registry = locks, hold_at_least = Duration::from_secs(1))]
async fn with_arc(locks: Arc<LockRegistry>, id: u32) -> u32 {
    id
}

async fn calls(shop: &Shop) -> Result<(), LockError> {
    let _: u64 = shop.buy(1).await?;
    let _: Option<()> = shop.job().await?;
    let _: u32 = with_arc(Arc::new(LockRegistry::memory()), 2).await?;
    Ok(())
}

fn main() {
    let _ = calls;
}
