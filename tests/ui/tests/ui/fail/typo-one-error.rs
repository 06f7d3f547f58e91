//! A typo in the attribute is one error, at the attribute: the callers,
//! written for the lock's `Result`, see the signature they expect.

use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(key = "stock:{item}", tll = "1s")]
async fn buy(item: u64) -> u64 {
    item
}

#[distributed_lock(key = "job", mode = "skip", ttl = "1x")]
async fn job() -> u8 {
    1
}

async fn caller() -> Result<u64, LockError> {
    let bought = buy(7).await?;
    let ran: Option<u8> = job().await?;
    Ok(bought + u64::from(ran.unwrap_or(0)))
}

fn main() {
    let _ = caller;
}
