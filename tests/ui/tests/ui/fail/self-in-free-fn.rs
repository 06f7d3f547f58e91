use lock_runtime::distributed_lock;

#[distributed_lock(key = "shard:{self.shard}")]
async fn rebalance(shard: u32) {
    let _ = shard;
}

fn main() {}
