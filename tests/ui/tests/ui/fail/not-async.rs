use lock_runtime::distributed_lock;

#[distributed_lock(key = "job")]
fn job() {}

fn main() {}
