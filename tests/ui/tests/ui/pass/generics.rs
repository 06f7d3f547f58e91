//! Generic functions with where-clauses, reference and pattern parameters
//! the key does not use, field paths, `impl Trait` returns, `?` and `return`
//! in the body.

use std::fmt::Display;

use lock_runtime::{LockRegistry, distributed_lock};

struct Conn {
    writes: u32,
}

struct Order {
    customer: Customer,
    lines: (u32, u32),
}

struct Customer {
    id: u64,
}

#[distributed_lock(key = "item:{id}")]
async fn generic<T, U>(id: T, extra: U) -> String
where
    T: Display + Send,
    U: Into<String> + Send,
{
    format!("{id}:{}", extra.into())
}

#[distributed_lock(key = "conn:{name}")]
async fn write(name: &str, conn: &mut Conn, (a, b): (u32, u32), _: u8) -> u32 {
    conn.writes += a + b;
    conn.writes
}

#[distributed_lock(key = "order:{order.customer.id}:{order.lines.0}:{{literal}}")]
async fn field_path(order: &Order) -> u32 {
    order.lines.1
}

#[distributed_lock(key = "display")]
async fn opaque() -> impl Display {
    42
}

#[distributed_lock(key = "parse:{text}")]
async fn parse(text: &str) -> Result<u32, std::num::ParseIntError> {
    if text.is_empty() {
        return Ok(0);
    }
    let n: u32 = text.parse()?;
    Ok(n + 1)
}

#[distributed_lock(key = "unit", ttl = "1m30s", wait_timeout = "5s", hold_at_least = "1ms", max_hold = "2h")]
async fn unit() {}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    lock_runtime::init(LockRegistry::memory()).unwrap();
    assert_eq!(generic(7u8, "x").await.unwrap(), "7:x");
    let mut conn = Conn { writes: 0 };
    assert_eq!(write("db", &mut conn, (1, 2), 0).await.unwrap(), 3);
    let order = Order { customer: Customer { id: 1 }, lines: (2, 3) };
    assert_eq!(field_path(&order).await.unwrap(), 3);
    assert_eq!(opaque().await.unwrap().to_string(), "42");
    assert_eq!(parse("41").await.unwrap(), Ok(42));
    assert!(parse("x").await.unwrap().is_err());
    unit().await.unwrap();
}
