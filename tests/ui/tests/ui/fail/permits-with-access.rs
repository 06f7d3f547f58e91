use lock_runtime::distributed_lock;

#[distributed_lock(key = "prices", permits = 3, access = "read")]
async fn read_prices() {}

fn main() {}
