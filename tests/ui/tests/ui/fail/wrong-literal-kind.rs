use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", ttl = 30)]
async fn job() {}

fn main() {}
