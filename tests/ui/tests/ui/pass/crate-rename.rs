//! `crate = "..."` points the expansion at a renamed runtime.

extern crate lock_runtime as locks;

#[locks::distributed_lock(key = "renamed:{n}", crate = "locks")]
async fn double(n: u32) -> u32 {
    n * 2
}

#[locks::distributed_lock(key = "renamed", mode = "skip", crate = "::locks")]
async fn once() -> u8 {
    1
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    locks::init(locks::LockRegistry::memory()).unwrap();
    assert_eq!(double(21).await.unwrap(), 42);
    assert_eq!(once().await.unwrap(), Some(1));
}
