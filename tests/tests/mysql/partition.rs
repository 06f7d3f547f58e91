//! A partitioned MySQL holder gives up before anyone else is granted the
//! key (the scenario: `lock_tests::partition`).

use lock_runtime::LockRegistry;
use lock_tests::MariaDbServer;
use lock_tests::partition::{TTL, partitions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_holder_is_cancelled_before_anyone_else_is_granted_the_key() {
    let server = MariaDbServer::new();
    partitions(
        "mysql",
        server.port(),
        &server.url(),
        |port| format!("mysql://root@127.0.0.1:{port}/locks"),
        |url| async move { LockRegistry::mysql(&url).await.unwrap() },
        // The winner's row expires its ttl after the grant.
        |key, _fencing, _sent| {
            let expires = server.sql(&format!(
                "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', expires_at) \
                 FROM locks.lock_leases WHERE lock_key = X'{}'",
                hex(key.as_bytes())
            ));
            async move { expires.parse::<u128>().expect("the winner's row") - TTL.as_micros() }
        },
        ([100, 200, 300, 400], 32),
    )
    .await;
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
