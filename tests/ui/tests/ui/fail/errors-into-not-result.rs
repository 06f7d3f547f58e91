use lock_runtime::distributed_lock;

#[distributed_lock(key = "job", errors = "into")]
async fn job() -> u32 {
    1
}

fn main() {}
