use lock_runtime::distributed_lock;

const TTL_SECS: u64 = 30;

#[distributed_lock(key = "job", ttl = TTL_SECS)]
async fn job() {}

fn main() {}
