use lock_runtime::distributed_lock;

#[distributed_lock(key = "acct:1", keys = ["acct:1", "acct:2"])]
async fn transfer() {}

fn main() {}
