use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", mode = "block")]
async fn job() {}

fn main() {}
