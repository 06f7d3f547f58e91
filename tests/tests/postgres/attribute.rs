//! The attribute over PostgreSQL in one process: the global registry points
//! at one server this single test owns; each scenario runs against it in
//! turn.

use lock_runtime::LockRegistry;
use lock_tests::PostgresServer;
use lock_tests::attribute::{
    a_lease_undone_under_the_body_is_lost, an_ended_body_frees_its_key_at_once,
};

/// Rows of `key`'s lease.
fn rows(server: &PostgresServer, key: &str) -> usize {
    let key = key.replace('\'', "''");
    server
        .psql(&format!(
            "SELECT count(*) FROM lock_leases WHERE key = convert_to('{key}', 'UTF8')"
        ))
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_over_postgres() {
    let server = PostgresServer::new();
    lock_runtime::init(LockRegistry::postgres(&server.url()).await.unwrap()).unwrap();
    let mut entries = async |key: &str| rows(&server, key);
    a_lease_undone_under_the_body_is_lost(&mut entries, || {
        server.psql("DELETE FROM lock_leases");
    })
    .await;
    an_ended_body_frees_its_key_at_once(false, &mut entries).await;
    an_ended_body_frees_its_key_at_once(true, &mut entries).await;
}
