use lock_runtime::distributed_lock;

#[distributed_lock(ttl = "10s")]
async fn job() {}

fn main() {}
