//! Local items named like std ones do not confuse the expansion.

#![allow(dead_code)]

mod core {}
mod std {}
mod lock_runtime_private {}

type Result<T> = ::core::result::Result<T, ()>;
type Option = ();
struct Box;
struct String;
trait Future {}
fn format_args() {}

#[::lock_runtime::distributed_lock(key = "shadow:{id}")]
async fn shadowed(id: u32) -> u32 {
    id
}

#[::lock_runtime::distributed_lock(key = "shadow", mode = "skip")]
async fn shadowed_skip() {}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    ::lock_runtime::init(::lock_runtime::LockRegistry::memory()).unwrap();
    assert_eq!(shadowed(5).await.unwrap(), 5);
    assert!(shadowed_skip().await.unwrap().is_some());
}
