use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", on_lost = "ignore")]
async fn job() {}

fn main() {}
