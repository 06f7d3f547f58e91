//! Redis over TLS (`rediss://`, the `redis-tls` feature), against a real
//! `redis-server` serving TLS with certificates from a throwaway CA: the
//! store contract with a client certificate, and the settings that cannot
//! work as clear errors that name the server and never the password.

use std::time::{Duration, Instant};

use lock_runtime::store::testkit::Clients;
use lock_runtime::{
    LockError, LockOptions, LockRegistry, RedisStore, distributed_lock, store_contract,
};
use lock_tests::{RedisTlsServer, connect_error, unique_key};

const PASSWORD: &str = "tls-secret-7";

/// A store over TLS to a server that asks for client certificates.
async fn redis_tls_store() -> Clients {
    let server = RedisTlsServer::new(PASSWORD, true);
    let (url, ca) = (server.url(), server.certs.pem("ca.crt"));
    let (cert, key) = (
        server.certs.pem("client.crt"),
        server.certs.pem("client.key"),
    );
    Clients::connect(server, async || {
        RedisStore::builder(&url)
            .tls_ca(&ca)
            .tls_identity(&cert, &key)
            .connect()
            .await
    })
    .await
}

store_contract!(
    redis_tls_contract,
    redis_tls_store,
    skip: [a_forced_release_is_pushed_to_the_holder]
);

#[distributed_lock(key = "tls:{key}", registry = locks, ttl = "2s")]
async fn locked_body(locks: &LockRegistry, key: &str) -> Option<u64> {
    lock_runtime::fencing_token().await.ok()
}

/// The attribute on a registry over TLS, and the server's own view: the
/// lock was a key on the TLS server.
#[tokio::test]
async fn the_attribute_locks_over_tls() {
    let server = RedisTlsServer::new(PASSWORD, false);
    let store = RedisStore::builder(&server.url())
        .tls_ca(server.certs.pem("ca.crt"))
        .connect()
        .await
        .unwrap();
    let locks = LockRegistry::new(store);
    let key = unique_key("attr");
    let first = locked_body(&locks, &key).await.unwrap().unwrap();
    let second = locked_body(&locks, &key).await.unwrap().unwrap();
    assert!(second > first, "{first} then {second}");
    let guard = locks
        .lock(&format!("tls:{key}"), LockOptions::default())
        .await
        .unwrap();
    assert!(
        locks
            .inspect(&format!("tls:{key}"))
            .await
            .unwrap()
            .is_some()
    );
    guard.release().await.unwrap();
}

/// A CA that did not sign the server's certificate, the system's roots
/// (which do not hold the test CA), and no client certificate where the
/// server asks for one: each a `Connect` error naming the server, soon,
/// without the password.
#[tokio::test]
async fn certificates_that_do_not_fit_are_connect_errors_naming_the_server() {
    let server = RedisTlsServer::new(PASSWORD, true);
    let url = server.url();
    let address = format!("127.0.0.1:{}", server.tls_port());
    let (ca, cert, key) = (
        server.certs.pem("ca.crt"),
        server.certs.pem("client.crt"),
        server.certs.pem("client.key"),
    );
    let other_ca = server.certs.pem("other-ca.crt");
    let cases: [(&str, RedisStoreBuilderFn<'_>); 3] = [
        (
            "another CA",
            Box::new(|b| b.tls_ca(&other_ca).tls_identity(&cert, &key)),
        ),
        (
            "the system's roots",
            Box::new(|b| b.tls_identity(&cert, &key)),
        ),
        ("no client certificate", Box::new(|b| b.tls_ca(&ca))),
    ];
    for (case, configure) in cases {
        let started = Instant::now();
        let err = connect_error(configure(RedisStore::builder(&url)).connect()).await;
        eprintln!("{case}: {err}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{case}: {:?}",
            started.elapsed()
        );
        assert!(err.contains(&address), "{case}: {err}");
        assert!(!err.contains(PASSWORD), "{case}: {err}");
        if case != "no client certificate" {
            assert!(err.to_lowercase().contains("certificate"), "{case}: {err}");
        }
    }
    // The control: the same settings as the failing cases, all of them
    // right, connect.
    RedisStore::builder(&url)
        .tls_ca(&ca)
        .tls_identity(&cert, &key)
        .connect()
        .await
        .unwrap();
}

type RedisStoreBuilderFn<'a> = Box<
    dyn Fn(
            lock_runtime::store::redis::RedisStoreBuilder,
        ) -> lock_runtime::store::redis::RedisStoreBuilder
        + 'a,
>;

/// Certificates with a `redis://` URL would be silently unused: refused
/// before any connection, naming the URL without its password.
#[tokio::test]
async fn certificates_without_rediss_are_invalid_settings() {
    let server = RedisTlsServer::new(PASSWORD, false);
    let plain = server.url().replace("rediss://", "redis://");
    let err = RedisStore::builder(&plain)
        .tls_ca(server.certs.pem("ca.crt"))
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidSettings { .. }), "{err:?}");
    let shown = err.to_string();
    assert!(
        shown.contains("rediss://") && !shown.contains(PASSWORD),
        "{shown}"
    );
}
