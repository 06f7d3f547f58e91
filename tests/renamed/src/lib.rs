//! `lock-runtime` renamed to `locks`: the attribute finds it with `crate = "locks"`.

/// Runs under a lock through the renamed crate.
#[locks::distributed_lock(key = "renamed:{n}", crate = "locks")]
pub async fn double(n: u32) -> u32 {
    n * 2
}

#[cfg(test)]
mod tests {
    #[tokio::test]
    async fn renamed_crate_path_works() {
        locks::init(locks::LockRegistry::memory()).unwrap();
        assert_eq!(super::double(21).await.unwrap(), 42);
    }
}
