//! The MySQL store against real servers: the contract, bad input, and
//! faults (a killed server).

use std::time::{Duration, Instant};

use lock_runtime::store::testkit::Clients;
use lock_runtime::store_contract;
use lock_runtime::{Access, LockError, LockOptions, LockRegistry, MySqlStore};
use lock_tests::{MariaDbServer, error_chain, is_held, lock_and_release, time_to_lock, unique_key};

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

/// A claim of another kind (a semaphore against a mutex, both ways, a read
/// lock, another limit) is `InvalidOptions` at once; a timed-out waiter
/// leaves nothing behind; a `hold_at_least` ends on time.
#[tokio::test]
async fn the_claim_rule_and_a_timed_out_waiter_through_the_registry() {
    let server = MariaDbServer::new();
    let (a, b) = (registry(&server).await, registry(&server).await);
    lock_tests::scenarios::a_claim_of_another_kind_is_refused_at_once(&a, &b).await;
    lock_tests::scenarios::a_waiter_that_times_out_leaves_nothing(&a, &b).await;
    lock_tests::scenarios::hold_at_least_ends_on_time(&a, &b).await;
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
    assert!(!is_held(&b, &key).await);
}

/// A released key keeps its row, free, with its fencing value, and the
/// next grant (in another process too) draws a greater one. A purge
/// deletes the rows of keys free for more than ten minutes, with their
/// holder rows, and nothing else; a key purged starts again above its
/// last value (by the server's clock).
#[tokio::test]
async fn a_released_keys_row_is_kept_until_purged() {
    let server = MariaDbServer::new();
    let store = MySqlStore::builder(&server.url()).connect().await.unwrap();
    let (a, b) = (LockRegistry::new(store.clone()), registry(&server).await);
    let fenced = LockOptions::default().fencing(true);
    let count = |table: &str, condition: &str| {
        server.sql(&format!(
            "SELECT COUNT(*) FROM locks.{table} WHERE {condition}"
        ))
    };
    let [old, recent, held, shared] = ["old", "recent", "held", "shared"].map(unique_key);
    let id = |key: &str| format!("UNHEX(SHA2('{key}', 256))");
    let mut last = 0;
    for registry in [&a, &b, &a] {
        let guard = registry.lock(&old, fenced.clone()).await.unwrap();
        assert!(
            guard.fencing_token().await.unwrap() > last,
            "{} after {last}",
            guard.fencing_token().await.unwrap()
        );
        last = guard.fencing_token().await.unwrap();
        guard.release().await.unwrap();
    }
    assert_eq!(
        count("lock_leases", "TRUE"),
        "1",
        "the released key's row is kept"
    );
    assert_eq!(
        count("lock_leases", "expires_at > UTC_TIMESTAMP(6)"),
        "0",
        "and free"
    );
    lock_and_release(&a, &recent).await;
    let holding = a.lock(&held, fenced.clone()).await.unwrap();
    let read = LockOptions::default().access(Access::Read);
    a.lock(&shared, read)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // `old` and `shared` free for eleven minutes, `shared` with a holder
    // row its crashed holder left.
    server.sql(&format!(
        "UPDATE locks.lock_leases SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 660 SECOND
         WHERE id IN ({}, {});
         INSERT INTO locks.lock_leases_holders
         VALUES ({}, 'crashed', 1, UTC_TIMESTAMP(6) - INTERVAL 700 SECOND)",
        id(&old),
        id(&shared),
        id(&shared)
    ));
    assert_eq!(store.purge().await.unwrap(), 2);
    assert_eq!(
        count("lock_leases", "TRUE"),
        "2",
        "`recent` and `held` stay"
    );
    assert_eq!(count("lock_leases", &format!("id = {}", id(&held))), "1");
    assert_eq!(count("lock_leases_holders", "TRUE"), "0");
    assert_eq!(store.purge().await.unwrap(), 0);
    let again = b.lock(&old, fenced).await.unwrap();
    assert!(
        again.fencing_token().await.unwrap() > last,
        "{} after {last}",
        again.fencing_token().await.unwrap()
    );
    again.release().await.unwrap();
    holding.release().await.unwrap();
}

#[tokio::test]
async fn bad_settings_credentials_and_missing_rights_are_clear_errors_without_the_password() {
    let server = MariaDbServer::new();
    let secret = "s3cret-Pa55word";
    server.sql(&format!("CREATE USER 'app'@'%' IDENTIFIED BY '{secret}'"));
    let port = server.port();
    let wrong = format!("mysql://app:wrong-{secret}@127.0.0.1:{port}/locks");
    let err = LockRegistry::mysql(&wrong).await.unwrap_err();
    let shown = format!("{err} / {err:?} / {}", error_chain(&err));
    assert!(!shown.contains(secret), "password leaked: {shown}");
    assert!(shown.contains("Access denied"), "{shown}");
    assert!(
        err.to_string()
            .starts_with("could not connect to the mysql store at `mysql://app:***@127.0.0.1:"),
        "{err}"
    );
    // The right password, but no right to create the table.
    server.sql("GRANT SELECT ON locks.* TO 'app'@'%'");
    let right = format!("mysql://app:{secret}@127.0.0.1:{port}/locks");
    let err = LockRegistry::mysql(&right).await.unwrap_err();
    let shown = error_chain(&err);
    assert!(
        shown.contains("could not create the lease table `lock_leases`"),
        "{shown}"
    );
    assert!(shown.contains("denied"), "{shown}");
    assert!(!shown.contains(secret), "{shown}");
    // Once an administrator made the tables and procedures (with the SQL
    // the builder gives, through the command-line client) and granted
    // their use, the user locks, shares and permits too.
    let schema = MySqlStore::builder(&right).schema().unwrap();
    server.script(&schema);
    server.sql(
        "GRANT SELECT, INSERT, UPDATE, DELETE ON locks.lock_leases TO 'app'@'%'; \
         GRANT SELECT, INSERT, UPDATE, DELETE ON locks.lock_leases_holders TO 'app'@'%'; \
         GRANT EXECUTE ON PROCEDURE locks.lock_leases_claim_v2 TO 'app'@'%'; \
         GRANT EXECUTE ON PROCEDURE locks.lock_leases_unclaim_v2 TO 'app'@'%'; \
         GRANT EXECUTE ON PROCEDURE locks.lock_leases_force_v2 TO 'app'@'%'",
    );
    let app = LockRegistry::mysql(&right).await.unwrap();
    lock_and_release(&app, &unique_key("app")).await;
    let read = LockOptions::default().access(Access::Read);
    let reader = app.lock(&unique_key("app"), read).await.unwrap();
    reader.release().await.unwrap();
    let permits = LockOptions::default().permits(3);
    let permit = app.lock(&unique_key("app"), permits).await.unwrap();
    permit.release().await.unwrap();

    for (bad, reason) in [
        (
            MySqlStore::builder(&right).table("no-dashes"),
            ": invalid table name",
        ),
        (
            MySqlStore::builder(&right).poll_interval(Duration::ZERO),
            "poll interval must be longer than zero",
        ),
    ] {
        let err = lock_tests::invalid_settings(bad.connect()).await;
        assert!(err.contains(reason), "{err}");
    }
    let err = LockRegistry::mysql("mysql://app:hunter2@127.0.0.1:1/locks?bogus=1")
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Connect { .. }), "{err:?}");
    assert!(!format!("{err:?}").contains("hunter2"), "{err:?}");
    let err = LockRegistry::mysql(&format!("mysql://root@127.0.0.1:{}/locks", port + 1))
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Connect { .. }), "{err:?}");
}

#[tokio::test]
async fn a_down_server_gives_a_clear_error_quickly_and_recovers() {
    let mut server = MariaDbServer::new();
    let registry = registry(&server).await;
    lock_tests::scenarios::a_down_server_gives_a_clear_error_quickly_and_recovers(
        &mut server,
        &registry,
    )
    .await;
}

/// A lease committed before the server was killed is there after crash
/// recovery: another caller is still refused, and the holder keeps it.
#[tokio::test]
async fn a_lease_outlives_a_server_crash_and_restart() {
    let mut server = MariaDbServer::new();
    let (holder, other) = (registry(&server).await, registry(&server).await);
    let key = unique_key("crash");
    let opts = LockOptions::default().ttl(Duration::from_secs(10));
    let guard = holder.lock(&key, opts).await.unwrap();
    server.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match other.try_lock(&key, LockOptions::default()).await {
            Ok(None) => break,
            Ok(Some(_)) => panic!("the lease was lost in the crash"),
            Err(err) => {
                assert!(
                    Instant::now() < deadline,
                    "no recovery: {}",
                    error_chain(&err)
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    assert!(guard.is_held());
    guard.release().await.unwrap();
    lock_and_release(&other, &key).await;
}

/// The store never runs inside a transaction of the caller's, even on the
/// caller's own pool: a lock taken while the caller's transaction is open
/// stays taken when that transaction rolls back. The pool counts found
/// rows (as sqlx always does), which the store's answers do not depend on.
#[tokio::test]
async fn on_the_callers_pool_a_rolled_back_transaction_keeps_the_lock() {
    use mysql_async::prelude::Queryable;
    let server = MariaDbServer::new();
    server.sql("CREATE TABLE locks.orders (id INT PRIMARY KEY)");
    let opts =
        mysql_async::OptsBuilder::from_opts(mysql_async::Opts::from_url(&server.url()).unwrap())
            .client_found_rows(true);
    let pool = mysql_async::Pool::new(opts);
    let ours = LockRegistry::new(MySqlStore::with_pool(pool.clone()).connect().await.unwrap());
    let other = registry(&server).await;
    let key = unique_key("tx");
    let mut tx = pool
        .start_transaction(mysql_async::TxOpts::default())
        .await
        .unwrap();
    tx.query_drop("INSERT INTO orders VALUES (1)")
        .await
        .unwrap();
    let guard = ours
        .lock(&key, LockOptions::default().ttl(Duration::from_millis(300)))
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert!(is_held(&other, &key).await, "the rollback undid the lock");
    assert_eq!(server.sql("SELECT COUNT(*) FROM locks.orders"), "0");
    // Renewed past its ttl through the pool, and lingering after an early
    // release: found-rows counting changes none of the answers.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(guard.is_held());
    guard.release().await.unwrap();
    let linger = LockOptions::default().hold_at_least(Duration::from_millis(400));
    let lingering = ours.lock(&key, linger).await.unwrap();
    let taken = Instant::now();
    lingering.release().await.unwrap();
    assert!(is_held(&other, &key).await, "hold_at_least was not kept");
    time_to_lock(&other, &key).await;
    assert!(
        taken.elapsed() >= Duration::from_millis(300),
        "taken again {:?} after a 400 ms hold_at_least",
        taken.elapsed()
    );
    lock_and_release(&ours, &key).await;
}

/// TLS with the server's CA and a client certificate (a user made
/// `REQUIRE X509`); refused without the certificate, or trusting another
/// CA; the password never shown.
#[tokio::test]
async fn tls_with_a_client_certificate() {
    let server = MariaDbServer::with_tls();
    let certs = server.certs();
    let url = format!("mysql://tls@127.0.0.1:{}/locks", server.port());
    let store = MySqlStore::builder(&url)
        .tls_ca(certs.pem("ca.crt"))
        .tls_identity(certs.pem("client.crt"), certs.pem("client.key"))
        .connect()
        .await
        .unwrap();
    let registry = LockRegistry::new(store);
    lock_and_release(&registry, &unique_key("tls")).await;
    let reader = registry
        .lock(
            &unique_key("tls"),
            LockOptions::default().access(Access::Read),
        )
        .await
        .unwrap();
    reader.release().await.unwrap();

    let no_certificate = MySqlStore::builder(&url)
        .tls_ca(certs.pem("ca.crt"))
        .connect()
        .await
        .unwrap_err();
    assert!(
        matches!(no_certificate, LockError::Connect { .. }),
        "{no_certificate:?}"
    );
    assert!(
        error_chain(&no_certificate).contains("Access denied"),
        "{}",
        error_chain(&no_certificate)
    );
    let secret = "s3cret-Pa55word";
    let other_ca = MySqlStore::builder(&format!(
        "mysql://tls:{secret}@127.0.0.1:{}/locks",
        server.port()
    ))
    .tls_ca(certs.pem("other-ca.crt"))
    .tls_identity(certs.pem("client.crt"), certs.pem("client.key"))
    .connect()
    .await
    .unwrap_err();
    let shown = format!("{other_ca} / {other_ca:?} / {}", error_chain(&other_ca));
    assert!(matches!(other_ca, LockError::Connect { .. }), "{shown}");
    assert!(shown.to_lowercase().contains("certificate"), "{shown}");
    assert!(!shown.contains(secret), "password leaked: {shown}");
}

/// Shares and permits of a key longer than the 255 bytes `lock_key`
/// keeps: granted, and kept apart from a key that differs past them.
#[tokio::test]
async fn shares_and_permits_of_long_keys() {
    let server = MariaDbServer::new();
    let registry = registry(&server).await;
    let long = format!("{}{}", unique_key("long"), "x".repeat(1_000));
    let read = LockOptions::default().access(Access::Read);
    let reader = registry
        .lock(&format!("{long}a"), read.clone())
        .await
        .unwrap();
    let writer = registry
        .try_lock(&format!("{long}b"), LockOptions::default())
        .await
        .unwrap()
        .expect("a key differing past 255 bytes is another key");
    let permit = registry
        .lock(&format!("{long}c"), LockOptions::default().permits(3))
        .await
        .unwrap();
    for guard in [reader, writer, permit] {
        guard.release().await.unwrap();
    }
}
