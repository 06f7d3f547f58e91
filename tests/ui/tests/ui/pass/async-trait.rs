//! Methods of an `#[async_trait]` impl: the attribute sees the
//! `Box::pin(async move { .. })` that async-trait produced.

use async_trait::async_trait;
use lock_runtime::{LockError, LockRegistry, distributed_lock};

#[async_trait]
trait Payments {
    async fn pay(&self, order: u64, cents: u32) -> Result<u32, LockError>;
    async fn sweep(&self) -> Result<Option<usize>, LockError>;
}

struct Gateway {
    region: &'static str,
}

#[async_trait]
impl Payments for Gateway {
    #[distributed_lock(key = "pay:{self.region}:{order}", ttl = "5s")]
    async fn pay(&self, order: u64, cents: u32) -> u32 {
        let _ = order;
        cents
    }

    #[distributed_lock(key = "sweep:{self.region}", mode = "skip")]
    async fn sweep(&self) -> usize {
        self.region.len()
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    lock_runtime::init(LockRegistry::memory()).unwrap();
    let gateway = Gateway { region: "eu" };
    assert_eq!(gateway.pay(1, 250).await.unwrap(), 250);
    assert_eq!(gateway.sweep().await.unwrap(), Some(2));
    let dynamic: &dyn Payments = &gateway;
    assert_eq!(dynamic.pay(2, 5).await.unwrap(), 5);
}
