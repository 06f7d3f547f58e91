use lock_runtime::distributed_lock;

struct Path<T>(T);
struct State<T>(T);

#[distributed_lock(key = "stock:{sku}")]
async fn buy(State(app): State<u32>, Path(item): Path<String>) -> String {
    format!("{app} {item}")
}

fn main() {}
