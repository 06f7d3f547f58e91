use lock_runtime::distributed_lock;

#[distributed_lock(key = "job")]
const fn job() {}

fn main() {}
