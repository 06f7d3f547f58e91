use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", ttl = "1m", max_hold = "30s")]
async fn job() {}

fn main() {}
