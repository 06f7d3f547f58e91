//! The PostgreSQL store against real servers: the contract, bad input, and
//! faults (a killed server, killed sessions).

use std::time::{Duration, Instant};

use lock_runtime::store::testkit::Clients;
use lock_runtime::store_contract;
use lock_runtime::{Access, LockError, LockOptions, LockRegistry, PostgresStore};
use lock_tests::{PostgresServer, is_held, lock_and_release, time_to_lock, unique_key};

async fn postgres_store() -> Clients {
    let server = PostgresServer::new();
    let url = server.url();
    Clients::connect(server, async || {
        PostgresStore::builder(&url).connect().await
    })
    .await
}

store_contract!(
    postgres_contract,
    postgres_store,
    skip: [
        a_forced_release_is_pushed_to_the_holder,
    ]
);

async fn registry(server: &PostgresServer) -> LockRegistry {
    LockRegistry::postgres(&server.url()).await.unwrap()
}

/// How long a release in `holder` takes to wake a waiter in `waiter` whose
/// holder's lease still has ~30 s: only a notification explains a short one.
pub(crate) async fn handoff(
    server: &PostgresServer,
    holder: &LockRegistry,
    waiter: &LockRegistry,
    key: &str,
) -> Duration {
    // The acquire statement (it begins with the key's turn).
    let attempts = || server.statement_calls("WITH acquiring AS");
    let held = holder.lock(key, LockOptions::default()).await.unwrap();
    let before = attempts();
    let waiting = tokio::spawn({
        let (waiter, key) = (waiter.clone(), key.to_owned());
        async move {
            let guard = waiter.lock(&key, LockOptions::default()).await.unwrap();
            let at = Instant::now();
            guard.release().await.unwrap();
            at
        }
    });
    // Its first attempt, then (listening by then) its second: both refused.
    lock_tests::wait_until("the waiter's second attempt", || attempts() >= before + 2).await;
    let released = Instant::now();
    held.release().await.unwrap();
    let acquired = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the waiter acquires within 10 s")
        .unwrap();
    acquired - released
}

#[tokio::test]
async fn the_table_is_created_once_and_shared() {
    let server = PostgresServer::new();
    let (a, b) = (registry(&server).await, registry(&server).await);
    let key = unique_key("table");
    let guard = a.lock(&key, LockOptions::default()).await.unwrap();
    assert!(is_held(&b, &key).await);
    assert_eq!(server.psql("SELECT count(*) FROM lock_leases"), "1");
    guard.release().await.unwrap();
    assert_eq!(server.psql("SELECT count(*) FROM lock_leases"), "0");
    let custom = PostgresStore::builder(&server.url())
        .table("shop_locks")
        .connect()
        .await
        .unwrap();
    let shop = LockRegistry::builder(custom).build().unwrap();
    lock_and_release(&shop, &key).await;
    assert_eq!(server.psql("SELECT count(*) FROM shop_locks"), "0");
    let bad = PostgresStore::builder(&server.url()).table("locks; DROP TABLE lock_leases");
    let err = lock_tests::invalid_settings(bad.connect()).await;
    assert!(err.contains(": invalid table name"), "{err}");
}

#[tokio::test]
async fn bad_credentials_and_missing_rights_are_clear_errors_without_the_password() {
    let server = PostgresServer::new();
    let secret = "s3cret-Pa55word";
    server.psql(&format!("CREATE ROLE app LOGIN PASSWORD '{secret}'"));
    let port = server.port();
    let wrong = format!("postgres://app:wrong-{secret}@127.0.0.1:{port}/postgres");
    let err = LockRegistry::postgres(&wrong).await.unwrap_err();
    let shown = format!(
        "{err} / {err:?} / {}",
        std::error::Error::source(&err).unwrap()
    );
    assert!(!shown.contains(secret), "password leaked: {shown}");
    assert!(shown.contains("password authentication failed"), "{shown}");
    assert!(
        err.to_string().starts_with(
            "could not connect to the postgres store at `postgres://app:***@127.0.0.1:"
        ),
        "{err}"
    );
    // The right password, but no right to create the table (PostgreSQL 15
    // does not let every role create in `public`).
    let right = format!("postgres://app:{secret}@127.0.0.1:{port}/postgres");
    let err = LockRegistry::postgres(&right).await.unwrap_err();
    let shown = format!("{err}: {}", std::error::Error::source(&err).unwrap());
    assert!(
        shown.contains("cannot create the lease table `lock_leases`"),
        "{shown}"
    );
    assert!(shown.contains("permission denied"), "{shown}");
    assert!(!shown.contains(secret), "{shown}");
    // Once an administrator made the table (with the SQL the builder
    // gives) and granted its use, the role locks, shares and permits too.
    let schema = PostgresStore::builder(&right).schema().unwrap();
    server.psql(&schema);
    server.psql("GRANT SELECT, INSERT, UPDATE, DELETE ON lock_leases, lock_leases_holders TO app");
    server.psql("GRANT USAGE ON SEQUENCE lock_leases_fencing TO app");
    let app = LockRegistry::postgres(&right).await.unwrap();
    lock_and_release(&app, &unique_key("app")).await;
    let read = LockOptions::default().access(Access::Read);
    let reader = app.lock(&unique_key("app"), read).await.unwrap();
    reader.release().await.unwrap();
    let bad = PostgresStore::builder(&right).table("no-dashes").schema();
    assert!(
        matches!(bad, Err(LockError::InvalidSettings { .. })),
        "{bad:?}"
    );

    let err = LockRegistry::postgres(&format!(
        "postgres://postgres@127.0.0.1:{}/postgres",
        port + 1
    ))
    .await
    .unwrap_err();
    assert!(matches!(err, LockError::Connect { .. }), "{err:?}");
}

#[tokio::test]
async fn a_down_server_gives_a_clear_error_quickly_and_recovers() {
    let mut server = PostgresServer::new();
    let registry = registry(&server).await;
    lock_tests::scenarios::a_down_server_gives_a_clear_error_quickly_and_recovers(
        &mut server,
        &registry,
    )
    .await;
}

#[tokio::test]
async fn a_release_wakes_the_waiter_before_and_after_a_restart() {
    let mut server = PostgresServer::new();
    let (a, b) = (registry(&server).await, registry(&server).await);
    let quick = handoff(&server, &a, &b, &unique_key("wake")).await;
    assert!(
        quick < Duration::from_secs(1),
        "hand-off took {quick:?}: no notification"
    );
    server.restart();
    // The statement and listening connections come back by themselves.
    let deadline = Instant::now() + Duration::from_secs(10);
    while a
        .try_lock(&unique_key("probe"), LockOptions::default())
        .await
        .is_err()
        || b.try_lock(&unique_key("probe"), LockOptions::default())
            .await
            .is_err()
    {
        assert!(Instant::now() < deadline, "no recovery after the restart");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = handoff(&server, &a, &b, &unique_key("wake")).await;
    assert!(
        after < Duration::from_secs(1),
        "hand-off took {after:?} after the restart"
    );
}

#[tokio::test]
async fn sessions_killed_with_pg_terminate_backend_are_replaced() {
    let server = PostgresServer::new();
    let (a, b) = (registry(&server).await, registry(&server).await);
    let key = unique_key("terminate");
    let quick = handoff(&server, &a, &b, &key).await;
    assert!(quick < Duration::from_secs(1), "{quick:?}");
    let killed = server.psql(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
    );
    assert_ne!(killed, "0", "sessions were killed");
    // A statement on a killed session fails; the next one gets a new one.
    // Both registries lost theirs: each is probed until it has a new one.
    for registry in [&a, &b] {
        let deadline = Instant::now() + Duration::from_secs(5);
        while registry
            .try_lock(&unique_key("probe"), LockOptions::default())
            .await
            .is_err()
        {
            assert!(
                Instant::now() < deadline,
                "statement connections not replaced"
            );
        }
    }
    let after = handoff(&server, &a, &b, &key).await;
    assert!(
        after < Duration::from_secs(1),
        "hand-off took {after:?}: LISTEN not restored"
    );
    assert!(time_to_lock(&b, &key).await < Duration::from_secs(1));
}

#[tokio::test]
async fn every_waiter_is_notified_even_when_another_took_the_key_first() {
    let server = PostgresServer::new();
    let (a, b, c) = (
        registry(&server).await,
        registry(&server).await,
        registry(&server).await,
    );
    let key = unique_key("queue");
    let held = a.lock(&key, LockOptions::default()).await.unwrap();
    // The acquire statement (it begins with the key's turn).
    let attempts = || server.statement_calls("WITH acquiring AS");
    let before = attempts();
    // B and C wait; each subscribed and was refused twice.
    let waiters: Vec<_> = [b, c]
        .into_iter()
        .map(|registry| {
            let key = key.clone();
            tokio::spawn(async move {
                let guard = registry.lock(&key, LockOptions::default()).await.unwrap();
                let acquired = Instant::now();
                tokio::time::sleep(Duration::from_millis(100)).await;
                let released = Instant::now();
                guard.release().await.unwrap();
                (acquired, released)
            })
        })
        .collect();
    lock_tests::wait_until("both waiters refused twice", || attempts() >= before + 4).await;
    held.release().await.unwrap();
    let mut turns = Vec::new();
    for waiter in waiters {
        turns.push(waiter.await.unwrap());
    }
    turns.sort();
    // The second waiter was refused by the first (whose row it then
    // marked), so the first's release notified it: no 5 s fallback retry.
    let gap = turns[1].0 - turns[0].1;
    assert!(gap < Duration::from_secs(1), "second hand-off took {gap:?}");
}

#[tokio::test]
async fn tls_is_a_builder_option() {
    let server = PostgresServer::with_tls();
    server.psql("CREATE ROLE tls LOGIN SUPERUSER");
    let url = format!("postgres://tls@127.0.0.1:{}/postgres", server.port());
    // Role `tls` may not connect without TLS.
    let err = LockRegistry::postgres(&url).await.unwrap_err();
    let source = std::error::Error::source(&err).unwrap().to_string();
    assert!(source.contains("no encryption"), "{source}");
    // Through a connector it does, for statements and listening alike. The
    // certificate is self-signed: this test does not check it.
    let mut builder = openssl::ssl::SslConnector::builder(openssl::ssl::SslMethod::tls()).unwrap();
    builder.set_verify(openssl::ssl::SslVerifyMode::NONE);
    let tls = postgres_openssl::MakeTlsConnector::new(builder.build());
    let connect = || {
        PostgresStore::builder(&format!("{url}?sslmode=require"))
            .tls(tls.clone())
            .connect()
    };
    let (a, b) = (connect().await.unwrap(), connect().await.unwrap());
    let (a, b) = (
        LockRegistry::builder(a).build().unwrap(),
        LockRegistry::builder(b).build().unwrap(),
    );
    let quick = handoff(&server, &a, &b, &unique_key("tls")).await;
    assert!(
        quick < Duration::from_secs(1),
        "hand-off over TLS took {quick:?}"
    );
    let encrypted = server.psql(
        "SELECT count(*) FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) \
         WHERE ssl AND usename = 'tls'",
    );
    assert!(
        encrypted.parse::<u32>().unwrap() >= 2,
        "{encrypted} TLS sessions"
    );
}

/// Sends `signal` to server process `pid` (a backend) with `kill`.
fn signal_backend(pid: &str, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([signal, pid])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} {pid} failed");
}

/// An acquire whose statement waits on the row (another transaction's
/// insert of it, rolled back) and whose backend then runs late (frozen)
/// still gets a fencing token below that of any acquire granted after it:
/// tokens follow grant order. Without the key's turn, the late statement
/// wrote the value it drew before waiting, after a second acquire had
/// drawn a greater one, been granted and released.
#[tokio::test]
async fn fencing_follows_grant_order_when_a_waiting_statement_runs_late() {
    let server = PostgresServer::new();
    let (late, other) = (registry(&server).await, registry(&server).await);
    let key = unique_key("late");
    // The table exists once a lock was taken.
    lock_and_release(&late, &unique_key("warm")).await;
    let (blocker, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    blocker.batch_execute("BEGIN").await.unwrap();
    blocker
        .execute(
            "INSERT INTO lock_leases (id, key, token, fencing, expires_at) \
             VALUES (sha256($1), $1, 'blocker', 0, now() + interval '1 hour')",
            &[&key.as_bytes()],
        )
        .await
        .unwrap();
    let blocker_pid: i32 = blocker
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let first = tokio::spawn({
        let (late, key) = (late.clone(), key.clone());
        async move {
            let guard = late.lock(&key, LockOptions::default()).await.unwrap();
            let granted = (Instant::now(), guard.fencing_token().await.unwrap());
            guard.release().await.unwrap();
            granted
        }
    });
    // The first acquire's statement waits on the blocker's row: freeze it.
    let waiting = format!(
        "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
         AND query LIKE '%lock_leases%' AND pid <> {blocker_pid}"
    );
    lock_tests::wait_until("the first acquire waits on the row", || {
        !server.psql(&waiting).is_empty()
    })
    .await;
    let late_pid = server.psql(&waiting);
    signal_backend(&late_pid, "-STOP");
    blocker.batch_execute("ROLLBACK").await.unwrap();
    // A second acquire: granted at once (then released), or waiting for
    // the key's turn, which the frozen statement holds.
    let second = tokio::spawn({
        let (other, key) = (other.clone(), key.clone());
        async move {
            let guard = other
                .try_lock(&key, LockOptions::default())
                .await
                .unwrap()?;
            let granted = (Instant::now(), guard.fencing_token().await.unwrap());
            guard.release().await.unwrap();
            Some(granted)
        }
    });
    let turns = "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory'";
    lock_tests::wait_until("the second acquire ends or waits for its turn", || {
        second.is_finished() || server.psql(turns) != "0"
    })
    .await;
    signal_backend(&late_pid, "-CONT");
    let first = tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .expect("the late acquire ends")
        .unwrap();
    let second = tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("the second acquire ends")
        .unwrap();
    let mut grants: Vec<(Instant, u64)> = std::iter::once(first).chain(second).collect();
    grants.sort();
    let tokens: Vec<u64> = grants.iter().map(|(_, token)| *token).collect();
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens in grant order: {tokens:?}"
    );
}

/// A lease table made by an earlier version (no holders' table, no writer
/// mark, no functions) is brought up to date at connect, its leases kept:
/// a held lock stays held, and the key then serves read locks.
#[tokio::test]
async fn a_table_made_by_an_earlier_version_is_brought_up_to_date() {
    let server = PostgresServer::new();
    server.psql(
        "CREATE TABLE lock_leases (
             id bytea PRIMARY KEY, key bytea NOT NULL, token text NOT NULL,
             fencing bigint NOT NULL, expires_at timestamptz NOT NULL,
             waiting boolean NOT NULL DEFAULT false
         );
         CREATE SEQUENCE lock_leases_fencing;",
    );
    let key = unique_key("old");
    server.psql(&format!(
        "INSERT INTO lock_leases (id, key, token, fencing, expires_at)
         VALUES (sha256(convert_to('{key}', 'UTF8')), convert_to('{key}', 'UTF8'),
                 'someone', nextval('lock_leases_fencing'), clock_timestamp() + interval '1 hour')"
    ));
    let registry = registry(&server).await;
    let info = registry.inspect(&key).await.unwrap().expect("still held");
    assert_eq!(info.holders, 1, "{info:?}");
    let read = LockOptions::default().access(Access::Read);
    let refused = registry.try_lock(&key, read.clone()).await.unwrap();
    assert!(refused.is_none(), "a read lock joined a held key");
    assert!(registry.force_release(&key).await.unwrap());
    let reader = registry.lock(&key, read).await.unwrap();
    assert_eq!(reader.access(), Access::Read);
    reader.release().await.unwrap();
    assert_eq!(
        server.psql("SELECT count(*) FROM lock_leases_holders"),
        "0",
        "the share's row went with its release"
    );
}

/// The soak's server freeze stops every process of the server: a session
/// opened before it (its backend already forked) does not answer while it
/// is frozen, and does once thawed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_answers_nobody_until_thawed() {
    let server = PostgresServer::new();
    let (client, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client.simple_query("SELECT 1").await.unwrap();
    server.pause();
    let frozen =
        tokio::time::timeout(Duration::from_millis(1000), client.simple_query("SELECT 1")).await;
    server.resume();
    assert!(frozen.is_err(), "a frozen server answered: {frozen:?}");
    client.simple_query("SELECT 1").await.unwrap();
}

/// A claim of another kind (a semaphore against a mutex, both ways, a read
/// lock, another limit) is `InvalidOptions` at once; a timed-out waiter
/// leaves nothing behind; a `hold_at_least` ends on time.
#[tokio::test]
async fn the_claim_rule_and_a_timed_out_waiter_through_the_registry() {
    let server = PostgresServer::new();
    let (a, b) = (registry(&server).await, registry(&server).await);
    lock_tests::scenarios::a_claim_of_another_kind_is_refused_at_once(&a, &b).await;
    lock_tests::scenarios::a_waiter_that_times_out_leaves_nothing(&a, &b).await;
    lock_tests::scenarios::hold_at_least_ends_on_time(&a, &b).await;
}
