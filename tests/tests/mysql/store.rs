//! The MySQL store against real servers: the contract, bad input, and
//! faults (a killed server).

use lock_runtime::store::testkit::Clients;
use lock_runtime::store_contract;
use lock_runtime::{LockOptions, LockRegistry, MySqlStore};
use lock_tests::{MariaDbServer, is_held, unique_key};

async fn mysql_store() -> Clients {
    let server = MariaDbServer::new();
    let url = server.url();
    Clients::connect(server, async || MySqlStore::builder(&url).connect().await).await
}

store_contract!(
    mysql_contract,
    mysql_store,
    skip: [
        a_forced_release_is_pushed_to_the_holder,
        a_watch_fires_on_release_and_only_then,
    ]
);

async fn registry(server: &MariaDbServer) -> LockRegistry {
    LockRegistry::mysql(&server.url()).await.unwrap()
}

#[tokio::test]
async fn the_table_is_created_once_and_shared() {
    let server = MariaDbServer::new();
    let (a, b) = (registry(&server).await, registry(&server).await);
    let key = unique_key("table");
    let guard = a.lock(&key, LockOptions::default()).await.unwrap();
    assert!(is_held(&b, &key).await);
    assert_eq!(server.sql("SELECT COUNT(*) FROM locks.lock_leases"), "1");
    guard.release().await.unwrap();
    assert_eq!(server.sql("SELECT COUNT(*) FROM locks.lock_leases"), "0");
}
