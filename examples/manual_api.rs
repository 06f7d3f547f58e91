//! The same guarantees without the attribute: `lock`, `try_lock`,
//! `LockGuard::release`, fencing tokens, and a storage write that refuses a
//! stale token.
//!
//! ```sh
//! cargo run -p examples --example manual_api
//! cargo run -p examples --example manual_api -- --redis redis://127.0.0.1:6379
//! cargo run -p examples --example manual_api -- --postgres postgres://postgres@127.0.0.1/postgres
//! cargo run -p examples --features etcd --example manual_api -- --etcd 127.0.0.1:2379
//! cargo run -p examples --features zookeeper --example manual_api -- --zookeeper 127.0.0.1:2181
//! ```

use std::sync::Mutex;
use std::time::Duration;

use examples::{Error, StoreFlag};
use lock_runtime::{LockError, LockOptions};

/// Storage that remembers the highest fencing token it has seen and refuses
/// writes that carry a lower one: the defence against a holder that paused
/// past its lease and woke up believing it still holds the lock.
#[derive(Default)]
struct FencedStore {
    state: Mutex<(u64, Vec<String>)>,
}

impl FencedStore {
    fn write(&self, token: u64, value: &str) -> Result<(), String> {
        let mut state = self.state.lock().expect("store");
        if token < state.0 {
            return Err(format!(
                "refused `{value}`: token {token} is older than {}",
                state.0
            ));
        }
        state.0 = token;
        state.1.push(value.to_owned());
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let store = StoreFlag::from_args("manual_api")?;
    let registry = store.registry().await?;
    let key = format!("invoice:{}", std::process::id());

    // lock / release: wait for the lock, do the work, release it.
    let guard = registry.lock(&key, LockOptions::default()).await?;
    println!(
        "locked `{}` with fencing token {}",
        guard.key(),
        guard.fencing_token().await?
    );

    // try_lock: one attempt; None while someone holds it.
    let second = registry.try_lock(&key, LockOptions::default()).await?;
    println!(
        "try_lock while held: {}",
        if second.is_some() {
            "got it (wrong!)"
        } else {
            "None"
        }
    );
    guard.release().await?;
    let second = registry.try_lock(&key, LockOptions::default()).await?;
    println!(
        "try_lock after release: {}",
        if second.is_some() {
            "got it"
        } else {
            "None (wrong!)"
        }
    );
    if let Some(second) = second {
        second.release().await?;
    }

    // wait_timeout: give up waiting.
    let held = registry.lock(&key, LockOptions::default()).await?;
    let impatient = LockOptions::default().wait_timeout(Duration::from_millis(100));
    match registry.lock(&key, impatient).await {
        Err(LockError::Timeout { waited, .. }) => println!(
            "gave up after {waited:?}: {}",
            LockError::Timeout {
                key: key.clone(),
                waited
            }
        ),
        other => println!("unexpected: {other:?}"),
    }
    held.release().await?;

    // Fencing: A's lease (300 ms, or the store's shortest ttl; no watchdog)
    // runs out while A is paused.
    let store = FencedStore::default();
    let ttl = registry
        .store()
        .capabilities()
        .min_ttl
        .max(Duration::from_millis(300));
    let short = LockOptions::default().ttl(ttl).watchdog(false);
    let a = registry.lock(&key, short).await?;
    let a_token = a.fencing_token().await?;
    println!("A holds token {a_token} and pauses (a long GC, say)...");
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    println!("A still holds the lease? {}", a.is_held());
    let b = registry.lock(&key, LockOptions::default()).await?;
    let b_token = b.fencing_token().await?;
    println!("B took over with token {b_token}");
    store.write(b_token, "B's invoice")?;
    println!("B wrote: ok");
    match store.write(a_token, "A's stale invoice") {
        Ok(()) => println!("A wrote: ok (the store did not check!)"),
        Err(refused) => println!("A wrote: {refused}"),
    }
    match a.release().await {
        Err(LockError::Lost { .. }) => println!("A's release: lost, and B's lock was left alone"),
        other => println!("A's release: {other:?}"),
    }
    println!("B still holds it? {}", b.is_held());
    b.release().await?;
    let written = store.state.lock().expect("store").1.clone();
    println!("store holds {written:?}");
    Ok(())
}
