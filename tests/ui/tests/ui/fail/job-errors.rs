use lock_runtime::distributed_lock;

#[distributed_lock(job = "a", key = "x", every = "1h")]
async fn with_a_key() {}

#[distributed_lock(job = "b")]
async fn without_a_schedule() {}

#[distributed_lock(job = "c", every = "0s", overlap = "never")]
async fn bad_values() {}

#[distributed_lock(job = "d", every = "1h")]
async fn two_arguments(a: u32, b: u32) {}

#[distributed_lock(job = "e", every = "1h")]
fn not_async() {}

#[distributed_lock(job = "f", every = "1h", cron = "0 3 * * *")]
async fn two_schedules() {}

fn main() {
    let _ = with_a_key();
    let _ = without_a_schedule();
    let _ = bad_values();
    let _ = two_arguments();
    let _ = not_async();
    let _ = two_schedules();
}
