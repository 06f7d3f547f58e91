use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", ttl = "0ms")]
async fn job() {}

fn main() {}
