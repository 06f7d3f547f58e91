use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", registry = "the shop's")]
async fn job() {}

fn main() {}
