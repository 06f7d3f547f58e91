use lock_runtime::distributed_lock;

#[distributed_lock(key = "order:{idd}")]
async fn pay(id: u64, amount: u32) {
    let _ = (id, amount);
}

fn main() {}
