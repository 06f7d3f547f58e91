use lock_runtime::distributed_lock;

#[derive(Debug)]
struct AppErr;

#[distributed_lock(key = "job", errors = "into")]
async fn job() -> Result<u32, AppErr> {
    Ok(1)
}

fn main() {}
