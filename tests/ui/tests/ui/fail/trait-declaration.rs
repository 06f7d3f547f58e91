use lock_runtime::distributed_lock;

trait Jobs {
    #[distributed_lock(key = "job")]
    async fn job(&self);
}

fn main() {}
