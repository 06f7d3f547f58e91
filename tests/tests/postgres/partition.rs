//! A partitioned PostgreSQL holder gives up before anyone else is granted
//! the key (the scenario: `lock_tests::partition`).

use lock_runtime::LockRegistry;
use lock_tests::PostgresServer;
use lock_tests::partition::{TTL, partitions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_holder_is_cancelled_before_anyone_else_is_granted_the_key() {
    let postgres = PostgresServer::new();
    partitions(
        "postgres",
        postgres.port(),
        &postgres.url(),
        |port| format!("postgres://postgres@127.0.0.1:{port}/postgres"),
        |url| async move { LockRegistry::postgres(&url).await.unwrap() },
        // The winner's row expires its ttl after the grant.
        |key, _fencing, _sent| {
            let expires = postgres.psql(&format!(
                "SELECT (extract(epoch FROM expires_at) * 1000000)::bigint FROM lock_leases \
                 WHERE key = convert_to('{}', 'UTF8')",
                key.replace('\'', "''")
            ));
            async move { expires.parse::<u128>().expect("the winner's row") - TTL.as_micros() }
        },
        ([100, 200, 300, 400], 32),
    )
    .await;
}
