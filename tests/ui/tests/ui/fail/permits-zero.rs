use lock_runtime::distributed_lock;

#[distributed_lock(key = "export", permits = 0)]
async fn export() {}

fn main() {}
