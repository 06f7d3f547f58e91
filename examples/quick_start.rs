//! The quick start: the attribute in wait and skip mode.
//!
//! `cargo run -p examples --example quick_start` runs on the in-memory
//! backend; add `-- --redis redis://127.0.0.1:6379` to lock through Redis,
//! and start it in several terminals at once to see the processes take turns.

use std::time::Duration;

use lock_runtime::{LockError, LockRegistry, distributed_lock, fencing_token};

#[distributed_lock(key = "stock:{item_id}", ttl = "10s")]
async fn buy(item_id: u64, qty: u32) -> String {
    let token = fencing_token().unwrap_or_default();
    tokio::time::sleep(Duration::from_millis(20)).await;
    format!("item {item_id} x{qty} (fencing token {token})")
}

#[distributed_lock(
    key = "job:nightly-report",
    mode = "skip",
    ttl = "5m",
    hold_at_least = "1s"
)]
async fn nightly_report() -> usize {
    tokio::time::sleep(Duration::from_millis(50)).await;
    42
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    let args: Vec<String> = std::env::args().collect();
    let registry = match args.iter().position(|arg| arg == "--redis") {
        Some(at) => {
            let url = args
                .get(at + 1)
                .map_or("redis://127.0.0.1:6379", String::as_str);
            println!("locking through Redis at {url}");
            LockRegistry::redis(url).await?
        }
        None => {
            println!("locking in memory (pass --redis URL to lock through Redis)");
            LockRegistry::memory()
        }
    };
    lock_runtime::init(registry)?;

    // Four buyers of one item: the lock runs them one at a time.
    let buyers: Vec<_> = (1..=4).map(|qty| tokio::spawn(buy(7, qty))).collect();
    for buyer in buyers {
        let receipt = buyer.await.expect("buyer task")?;
        println!("bought {receipt}");
    }

    // Two replicas fire the same scheduled job: one runs it, one skips.
    let (a, b) = tokio::join!(nightly_report(), nightly_report());
    for (replica, outcome) in [("a", a?), ("b", b?)] {
        match outcome {
            Some(rows) => println!("replica {replica}: ran the report, {rows} rows"),
            None => println!("replica {replica}: another instance is running it, skipped"),
        }
    }
    Ok(())
}
