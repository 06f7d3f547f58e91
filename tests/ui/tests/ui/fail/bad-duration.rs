use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", ttl = "30x", wait_timeout = "1.5s")]
async fn job() {}

fn main() {}
