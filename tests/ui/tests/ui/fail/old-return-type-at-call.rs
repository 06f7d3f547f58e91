use lock_runtime::distributed_lock;

#[distributed_lock(key = "job")]
async fn count() -> u32 {
    1
}

async fn caller() -> u32 {
    // The call now returns Result<u32, LockError>: using it as u32 is an error.
    count().await
}

fn main() {}
