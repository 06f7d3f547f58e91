use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", ttl = "10s", ttl = "20s")]
async fn job() {}

fn main() {}
