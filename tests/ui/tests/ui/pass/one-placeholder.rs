//! Keys that are one placeholder: text (`&str`, `&String`, a `&'static str`
//! field of the receiver) is used as it is; an owned `String` the body
//! moves, a number, a generic `Display` and a field path are rendered.

use std::fmt::Display;

use lock_runtime::{LockRegistry, distributed_lock};

struct Shop {
    name: &'static str,
    id: u32,
}

impl Shop {
    #[distributed_lock(key = "{self.name}")]
    async fn by_name(&self) -> u32 {
        self.id
    }

    #[distributed_lock(key = "{self.id}")]
    async fn by_id(&self) -> &'static str {
        self.name
    }
}

#[distributed_lock(key = "{key}")]
async fn text(key: &str) -> usize {
    key.len()
}

#[distributed_lock(key = "{key}")]
async fn string_ref(key: &String) -> usize {
    key.len()
}

#[distributed_lock(key = "{key}")]
async fn owned(key: String) -> String {
    key
}

#[distributed_lock(key = "{id}")]
async fn number(id: u64) -> u64 {
    id
}

#[distributed_lock(key = "{value}")]
async fn generic<T: Display + Send>(value: T) -> String {
    value.to_string()
}

#[distributed_lock(key = "{pair.0}")]
async fn field(pair: (&str, u8)) -> u8 {
    pair.1
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    lock_runtime::init(LockRegistry::memory()).unwrap();
    let shop = Shop { name: "corner", id: 3 };
    assert_eq!(shop.by_name().await.unwrap(), 3);
    assert_eq!(shop.by_id().await.unwrap(), "corner");
    assert_eq!(text("abc").await.unwrap(), 3);
    assert_eq!(string_ref(&"abcd".to_owned()).await.unwrap(), 4);
    assert_eq!(owned("k".to_owned()).await.unwrap(), "k");
    assert_eq!(number(7).await.unwrap(), 7);
    assert_eq!(generic("g").await.unwrap(), "g");
    assert_eq!(field(("f", 9)).await.unwrap(), 9);
}
