use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", crate = "lock runtime")]
async fn job() {}

fn main() {}
