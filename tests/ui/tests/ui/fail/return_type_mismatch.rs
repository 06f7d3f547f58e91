use lock_runtime::distributed_lock;

#[distributed_lock(key = "job")]
async fn count() -> u32 {
    "not a number"
}

#[distributed_lock(key = "job")]
async fn early() -> u32 {
    if true {
        return "early";
    }
    1
}

fn main() {}
