//! The quick start: the attribute in wait and skip mode.
//!
//! `cargo run -p examples --example quick_start` runs on the in-memory
//! backend; add `-- --redis redis://127.0.0.1:6379` to lock through Redis
//! (or `-- --postgres postgres://user@host/db` through PostgreSQL,
//! `--features etcd --example quick_start -- --etcd 127.0.0.1:2379` through
//! etcd, or `--features zookeeper --example quick_start -- --zookeeper
//! 127.0.0.1:2181` through ZooKeeper), and start it in several terminals at once to see the processes
//! take turns.

use std::time::Duration;

use examples::{Error, StoreFlag};
use lock_runtime::{distributed_lock, fencing_token};

#[distributed_lock(key = "stock:{item_id}", ttl = "10s")]
async fn buy(item_id: u64, qty: u32) -> String {
    let token = fencing_token().await.unwrap_or_default();
    tokio::time::sleep(Duration::from_millis(20)).await;
    format!("item {item_id} x{qty} (fencing token {token})")
}

#[distributed_lock(
    key = "job:nightly-report",
    mode = "skip",
    ttl = "30s",
    hold_at_least = "1s"
)]
async fn nightly_report() -> usize {
    tokio::time::sleep(Duration::from_millis(50)).await;
    42
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let store = StoreFlag::from_args("quick_start")?;
    if store.is_shared() {
        println!("locking through {}", store.name());
    } else {
        println!(
            "locking in memory (pass {} to lock through a store)",
            examples::STORE_FLAGS
        );
    }
    lock_runtime::init(store.registry().await?)?;

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
