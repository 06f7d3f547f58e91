use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", watchdog = false, max_hold = "10m")]
async fn job() {}

fn main() {}
