use lock_runtime::distributed_lock;

#[distributed_lock(key = "order:{id")]
async fn pay(id: u64) {
    let _ = id;
}

#[distributed_lock(key = "order:id}")]
async fn refund(id: u64) {
    let _ = id;
}

fn main() {}
