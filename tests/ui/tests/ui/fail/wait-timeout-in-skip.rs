use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", mode = "skip", wait_timeout = "5s")]
async fn job() {}

fn main() {}
