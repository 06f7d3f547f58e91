use lock_runtime::distributed_lock;

struct Order;

// A placeholder's value must be `Display`: alone in the template, and
// among other text.
#[distributed_lock(key = "{order}")]
async fn pay(order: Order) {
    let _ = order;
}

#[distributed_lock(key = "order:{order}")]
async fn ship(order: Order) {
    let _ = order;
}

fn main() {}
