//! Inherent methods (`&self`, `&mut self`, `self`), `{self.field}` keys and
//! native `async fn` in a trait impl.

use lock_runtime::{LockError, LockRegistry, distributed_lock};

struct Shard {
    id: u32,
    moves: u32,
}

impl Shard {
    #[distributed_lock(key = "shard:{self.id}")]
    async fn peek(&self) -> u32 {
        self.moves
    }

    #[distributed_lock(key = "shard:{self.id}:{to}")]
    pub async fn rebalance(&mut self, to: u32) -> u32 {
        self.moves += 1;
        to
    }

    #[distributed_lock(key = "shard:{self.id}", mode = "skip")]
    async fn retire(self) -> u32 {
        self.id
    }
}

trait Inventory {
    async fn reserve(&self, sku: &str) -> Result<bool, LockError>;
}

impl Inventory for Shard {
    #[distributed_lock(key = "sku:{sku}")]
    async fn reserve(&self, sku: &str) -> bool {
        !sku.is_empty() && self.id > 0
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    lock_runtime::init(LockRegistry::memory()).unwrap();
    let mut shard = Shard { id: 3, moves: 0 };
    assert_eq!(shard.rebalance(9).await.unwrap(), 9);
    assert_eq!(shard.peek().await.unwrap(), 1);
    assert!(shard.reserve("apple").await.unwrap());
    assert_eq!(shard.retire().await.unwrap(), Some(3));
}
