//! The PostgreSQL store from the service's own `tokio_postgres::Config`,
//! and behind a real PgBouncer: session pooling as it is (notifications
//! and all), transaction pooling with `transaction_pooling` (the contract,
//! and what a hand-off costs by polling), and transaction pooling without
//! it refused.

use std::time::Duration;

use lock_runtime::store::testkit::Clients;
use lock_runtime::store_contract;
use lock_runtime::{LockError, LockOptions, LockRegistry, PostgresStore};
use lock_tests::{PgBouncer, PoolMode, PostgresServer, is_held, unique_key};

use crate::store::handoff;

/// How often a waiter asks again behind a transaction pooler.
const POLL: Duration = Duration::from_millis(100);

/// A store behind PgBouncer in transaction mode, with two server sessions
/// for all its clients (so they share them).
async fn transaction_pooled_store() -> Clients {
    let server = PostgresServer::new();
    let bouncer = PgBouncer::start(&server, PoolMode::Transaction, 2);
    let url = bouncer.url();
    Clients::connect((bouncer, server), async || {
        PostgresStore::builder(&url)
            .transaction_pooling(POLL)
            .connect()
            .await
    })
    .await
}

store_contract!(
    postgres_transaction_pooling_contract,
    transaction_pooled_store,
    skip: [
        a_forced_release_is_pushed_to_the_holder,
        a_watch_fires_on_release_and_only_then,
    ]
);

/// Session pooling keeps a client's session, so the store works as on a
/// server of its own: a release wakes a waiter by notification, long
/// before the holder's lease would end (or a waiter's 5 s retry).
#[tokio::test]
async fn session_pooling_works_as_a_server_of_its_own() {
    let server = PostgresServer::new();
    let bouncer = PgBouncer::start(&server, PoolMode::Session, 20);
    let (a, b) = (
        LockRegistry::postgres(&bouncer.url()).await.unwrap(),
        LockRegistry::postgres(&bouncer.url()).await.unwrap(),
    );
    let key = unique_key("session");
    let guard = a.lock(&key, LockOptions::default()).await.unwrap();
    assert!(is_held(&b, &key).await);
    guard.release().await.unwrap();
    let woken = handoff(&server, &a, &b, &unique_key("handoff")).await;
    eprintln!("hand-off through session pooling: {woken:?}");
    assert!(woken < Duration::from_secs(1), "{woken:?}");
}

/// Behind transaction pooling, a store that expects notifications would
/// wait for releases it is never told of: it refuses to connect, saying
/// what to do. With `transaction_pooling`, waiters poll: a hand-off costs
/// about half the poll interval.
#[tokio::test]
async fn transaction_pooling_is_refused_unless_the_store_polls() {
    let server = PostgresServer::new();
    let bouncer = PgBouncer::start(&server, PoolMode::Transaction, 2);
    let err = PostgresStore::builder(&bouncer.url())
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidSettings { .. }), "{err:?}");
    let shown = err.to_string();
    assert!(shown.contains("transaction_pooling"), "{shown}");

    let polling = async || {
        let store = PostgresStore::builder(&bouncer.url())
            .transaction_pooling(POLL)
            .connect()
            .await
            .unwrap();
        LockRegistry::new(store)
    };
    let (a, b) = (polling().await, polling().await);
    let mut handoffs = Vec::new();
    for _ in 0..5 {
        handoffs.push(handoff(&server, &a, &b, &unique_key("handoff")).await);
    }
    handoffs.sort();
    eprintln!("hand-offs through transaction pooling, polling every {POLL:?}: {handoffs:?}");
    assert!(handoffs[4] < POLL * 3, "{handoffs:?}");
}

/// A store from the `tokio_postgres::Config` a service builds for its
/// pool: it connects with the config's credentials, and a wrong password
/// is a `Connect` error naming the host, user and database, not the
/// password.
#[tokio::test]
async fn a_store_from_the_service_s_own_config() {
    let server = PostgresServer::new();
    let secret = "pool-secret-42";
    server.psql(&format!("CREATE ROLE app LOGIN PASSWORD '{secret}'"));
    server.psql("GRANT CREATE ON SCHEMA public TO app");
    let config = |password: &str| {
        let mut config = tokio_postgres::Config::new();
        config
            .host("127.0.0.1")
            .port(server.port())
            .user("app")
            .password(password)
            .dbname("postgres");
        config
    };
    let err = PostgresStore::with_config(config("wrong"))
        .connect()
        .await
        .unwrap_err();
    let shown = lock_tests::error_chain(&err);
    assert!(matches!(err, LockError::Connect { .. }), "{err:?}");
    let address = format!("host=127.0.0.1:{} user=app dbname=postgres", server.port());
    assert!(shown.contains(&address), "{shown}");
    assert!(
        !shown.contains("wrong") && !shown.contains(secret),
        "{shown}"
    );

    let store = PostgresStore::with_config(config(secret))
        .connect()
        .await
        .unwrap();
    assert!(format!("{store:?}").contains(&address), "{store:?}");
    let locks = LockRegistry::new(store);
    let key = unique_key("config");
    let guard = locks.lock(&key, LockOptions::default()).await.unwrap();
    assert_eq!(server.psql("SELECT count(*) FROM lock_leases"), "1");
    guard.release().await.unwrap();
}
