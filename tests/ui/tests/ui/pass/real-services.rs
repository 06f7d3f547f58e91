//! The attribute in services: `errors = "into"` (wait and skip mode),
//! placeholders bound inside parameter patterns, and several keys.

use lock_runtime::{LockError, distributed_lock, fencing_token_for};

#[derive(Debug)]
enum AppError {
    Lock(LockError),
}

impl From<LockError> for AppError {
    fn from(err: LockError) -> AppError {
        AppError::Lock(err)
    }
}

struct Path<T>(T);
struct Order {
    id: u64,
    item: String,
}

#[distributed_lock(key = "stock:{item}", errors = "into")]
async fn reserve(Path(item): Path<String>, qty: u32) -> Result<u32, AppError> {
    Ok(qty)
}

#[distributed_lock(key = "job:{id}", mode = "skip", errors = "into")]
async fn job(Order { id, item: _ }: Order) -> Result<u64, AppError> {
    Ok(id)
}

#[distributed_lock(keys = ["acct:{from}", "acct:{to}"], wait_timeout = "5s")]
async fn transfer(from: u32, to: u32) -> Option<u64> {
    fencing_token_for(&format!("acct:{from}")).await.ok()
}

async fn calls() -> Result<(), AppError> {
    let _: u32 = reserve(Path("sku".to_owned()), 1).await?;
    let order = Order {
        id: 7,
        item: "sku".to_owned(),
    };
    let _: Option<u64> = job(order).await?;
    let _: Option<u64> = transfer(1, 2).await?;
    Ok(())
}

fn main() {
    let _ = calls;
    let _ = |e: AppError| match e {
        AppError::Lock(err) => err,
    };
}
