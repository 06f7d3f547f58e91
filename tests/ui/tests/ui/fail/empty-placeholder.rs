use lock_runtime::distributed_lock;

#[distributed_lock(key = "order:{}")]
async fn pay(id: u64) {
    let _ = id;
}

fn main() {}
