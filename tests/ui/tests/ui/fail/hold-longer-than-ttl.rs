use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", mode = "skip", ttl = "10s", hold_at_least = "1m")]
async fn job() {}

fn main() {}
