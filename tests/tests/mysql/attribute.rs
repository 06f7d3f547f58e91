//! The attribute over MySQL in one process: the global registry points at
//! one server this single test owns; each scenario runs against it in
//! turn.

use lock_runtime::LockRegistry;
use lock_tests::MariaDbServer;
use lock_tests::attribute::{
    a_lease_undone_under_the_body_is_lost, an_ended_body_frees_its_key_at_once,
};

/// Live rows of `key`'s lease.
fn rows(server: &MariaDbServer, key: &str) -> usize {
    let key: String = key.bytes().map(|b| format!("{b:02x}")).collect();
    server
        .sql(&format!(
            "SELECT COUNT(*) FROM locks.lock_leases WHERE lock_key = X'{key}' AND expires_at > UTC_TIMESTAMP(6)"
        ))
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_over_mysql() {
    let server = MariaDbServer::new();
    lock_runtime::init(LockRegistry::mysql(&server.url()).await.unwrap()).unwrap();
    let mut entries = async |key: &str| rows(&server, key);
    a_lease_undone_under_the_body_is_lost(&mut entries, || {
        server.sql("DELETE FROM locks.lock_leases");
    })
    .await;
    an_ended_body_frees_its_key_at_once(false, &mut entries).await;
    an_ended_body_frees_its_key_at_once(true, &mut entries).await;
}
