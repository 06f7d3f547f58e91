//! The etcd store against real clusters: the contract on one member, ttl
//! rules, bad input, and faults on three members (a killed leader, a killed
//! minority, a lost quorum).

use std::time::{Duration, Instant};

use lock_runtime::store::testkit::Clients;
use lock_runtime::store_contract;
use lock_runtime::{EtcdStore, LockError, LockOptions, LockRegistry};
use lock_tests::{EtcdCluster, Proxy, lock_and_release, time_to_lock, unique_key, wait_until};

async fn etcd_store() -> Clients {
    let cluster = EtcdCluster::single();
    let endpoints = cluster.endpoints();
    let endpoints: Vec<&str> = endpoints.iter().map(String::as_str).collect();
    Clients::connect(cluster, async || {
        EtcdStore::builder(&endpoints).connect().await
    })
    .await
}

store_contract!(etcd_contract, etcd_store);

async fn registry(cluster: &EtcdCluster) -> LockRegistry {
    let endpoints = cluster.endpoints();
    let endpoints: Vec<&str> = endpoints.iter().map(String::as_str).collect();
    LockRegistry::etcd(&endpoints).await.unwrap()
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

#[tokio::test]
async fn ttls_are_whole_seconds_from_the_clusters_minimum() {
    let cluster = EtcdCluster::single();
    let registry = registry(&cluster).await;
    let caps = registry.store().capabilities().clone();
    // With 100 ms elections etcd's shortest lease is 1 s (2 s by default).
    assert_eq!(caps.min_ttl, Duration::from_secs(1), "{caps:?}");
    assert_eq!(caps.ttl_granularity, Duration::from_secs(1));
    let key = unique_key("ttl");
    for (ttl, says) in [
        (
            ms(1500),
            "is not a whole number of 1s, the unit the etcd store counts ttls in",
        ),
        (ms(500), "is shorter than the etcd store's minimum 1s"),
    ] {
        let err = registry
            .lock(&key, LockOptions::default().ttl(ttl))
            .await
            .unwrap_err();
        assert!(matches!(err, LockError::InvalidOptions { .. }), "{err:?}");
        assert!(err.to_string().contains(says), "{err}");
        assert!(err.to_string().contains(&key), "{err}");
    }
    // The lease etcd keeps is exactly the lock's ttl, under the prefix.
    let guard = registry
        .lock(&key, LockOptions::default().ttl(Duration::from_secs(3)))
        .await
        .unwrap();
    let mut client = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .unwrap();
    let lease = lock_tests::etcd_lock_entries(&mut client, &key).await[0].lease();
    let left = client.lease_time_to_live(lease, None).await.unwrap();
    assert_eq!(left.granted_ttl(), 3);
    assert!(left.ttl() <= 3 && left.ttl() >= 2, "{}", left.ttl());
    guard.release().await.unwrap();
    assert!(
        lock_tests::etcd_lock_entries(&mut client, &key)
            .await
            .is_empty()
    );
}

/// The entries in `key`'s queue, by their values (the tokens).
async fn queued(cluster: &EtcdCluster, key: &str) -> Vec<String> {
    let mut client = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .unwrap();
    lock_tests::etcd_lock_entries(&mut client, key)
        .await
        .iter()
        .map(|kv| String::from_utf8_lossy(kv.value()).into_owned())
        .collect()
}

/// Waits up to 5 s for `key`'s queue to hold `len` entries.
async fn until_queued(cluster: &EtcdCluster, key: &str, len: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = queued(cluster, key).await;
        if now.len() == len {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "queue {now:?}, expected {len} entries"
        );
        tokio::time::sleep(ms(10)).await;
    }
}

/// Locks taken one after another reuse their entries' names (each named by
/// a lease the store recycles, a key getting back the lease it used last):
/// a busy key leaves no trail of deleted keys, which etcd keeps until the
/// history is compacted and which every read of the key's range would
/// visit. Eight keys are locked 10 times each, interleaved.
#[tokio::test]
async fn busy_keys_reuse_their_entries_names() {
    let cluster = EtcdCluster::single();
    let registry = registry(&cluster).await;
    let mut client = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .unwrap();
    let base = unique_key("reuse");
    let keys: Vec<String> = (0..8).map(|n| format!("{base}-{n}")).collect();
    let before = client
        .get("any", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    // Rounds of: lock all eight, then release all eight starting with a
    // different one each round, so the lease a key freed is seldom the
    // last one given back.
    for round in 0..10 {
        let mut guards = Vec::new();
        for key in &keys {
            guards.push(registry.lock(key, LockOptions::default()).await.unwrap());
        }
        guards.rotate_left(round % keys.len());
        for guard in guards {
            guard.release().await.unwrap();
        }
    }
    let after = client
        .get("any", None)
        .await
        .unwrap()
        .header()
        .unwrap()
        .revision();
    for key in &keys {
        // Every key written under the range since, from the history.
        let range = lock_tests::etcd_lock_range(key);
        let options = etcd_client::WatchOptions::new()
            .with_prefix()
            .with_start_revision(before + 1);
        let mut stream = client.watch(range.as_str(), Some(options)).await.unwrap();
        let mut names = std::collections::HashSet::new();
        let mut puts = 0;
        let mut deletes = 0;
        while deletes < 10 {
            let answer = tokio::time::timeout(Duration::from_secs(5), stream.message())
                .await
                .expect("the history up to now")
                .unwrap()
                .unwrap();
            for event in answer.events() {
                let kv = event.kv().unwrap();
                assert!(kv.mod_revision() <= after);
                if event.event_type() == etcd_client::EventType::Put {
                    puts += 1;
                    names.insert(kv.key().to_vec());
                } else {
                    deletes += 1;
                }
            }
        }
        assert_eq!(puts, 10, "one entry per lock of {key}");
        assert!(
            names.len() <= 2,
            "{} names for 10 locks of {key}",
            names.len()
        );
    }
}

/// A waiter that gives up (its `wait_timeout`) takes its entry out of the
/// queue: the holder's release then leaves the key free, not held up by
/// an entry nobody waits on.
#[tokio::test]
async fn a_waiter_that_times_out_leaves_the_queue() {
    let cluster = EtcdCluster::single();
    let (holder, waiter) = (registry(&cluster).await, registry(&cluster).await);
    let key = unique_key("timeout");
    let guard = holder.lock(&key, LockOptions::default()).await.unwrap();
    let opts = LockOptions::default().wait_timeout(ms(300));
    let err = waiter.lock(&key, opts).await.unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    until_queued(&cluster, &key, 1).await;
    guard.release().await.unwrap();
    until_queued(&cluster, &key, 0).await;
    let again = waiter.try_lock(&key, LockOptions::default()).await.unwrap();
    assert!(again.is_some(), "the key is free for anyone");
}

/// With a waiter queued behind the holder, a skip-mode attempt neither
/// queues nor takes the lock, even once the holder is gone: the next turn
/// is the waiter's.
#[tokio::test]
async fn a_skip_attempt_does_not_jump_the_queue() {
    let cluster = EtcdCluster::single();
    let key = unique_key("skip");
    let holder = registry(&cluster).await;
    let waiter = registry(&cluster).await;
    let skipper = registry(&cluster).await;
    let guard = holder.lock(&key, LockOptions::default()).await.unwrap();
    let waiting = tokio::spawn({
        let key = key.clone();
        async move {
            let guard = waiter.lock(&key, LockOptions::default()).await.unwrap();
            tokio::time::sleep(ms(200)).await;
            guard.release().await.unwrap();
        }
    });
    until_queued(&cluster, &key, 2).await;
    let skipped = skipper
        .try_lock(&key, LockOptions::default())
        .await
        .unwrap();
    assert!(skipped.is_none(), "a skip attempt took the held key");
    assert_eq!(
        queued(&cluster, &key).await.len(),
        2,
        "the skip attempt queued"
    );
    guard.release().await.unwrap();
    // The waiter now holds it (for 200 ms): the skip attempt still skips.
    until_queued(&cluster, &key, 1).await;
    let skipped = skipper
        .try_lock(&key, LockOptions::default())
        .await
        .unwrap();
    assert!(skipped.is_none(), "the skip attempt took the waiter's turn");
    tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter took the key and released it")
        .unwrap();
    until_queued(&cluster, &key, 0).await;
}

#[tokio::test]
async fn an_unreachable_cluster_is_a_clear_error_within_the_timeouts() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    let err = LockRegistry::etcd(&[&endpoint]).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}, over the {:?} bound",
        started.elapsed(),
        Duration::from_secs(5)
    );
    let shown = format!("{err}: {}", std::error::Error::source(&err).unwrap());
    assert!(shown.contains(&endpoint), "{shown}");
    let shown = lock_tests::invalid_settings(LockRegistry::etcd(&[])).await;
    assert!(shown.contains("no etcd endpoint"), "{shown}");
}

#[tokio::test]
async fn refused_credentials_are_a_clear_error_without_the_password() {
    let cluster = EtcdCluster::single();
    let mut admin = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .unwrap();
    admin.user_add("root", "root-secret-1", None).await.unwrap();
    admin.user_grant_role("root", "root").await.unwrap();
    admin.auth_enable().await.unwrap();
    let endpoints = cluster.endpoints();
    let endpoints: Vec<&str> = endpoints.iter().map(String::as_str).collect();
    let wrong = EtcdStore::builder(&endpoints).user("root", "wrong-secret-2");
    let err = lock_tests::connect_error(wrong.connect()).await;
    assert!(err.contains("authentication failed"), "{err}");
    assert!(!err.contains("wrong-secret-2"), "{err}");
    let backend = EtcdStore::builder(&endpoints)
        .user("root", "root-secret-1")
        .connect()
        .await
        .unwrap();
    assert!(!format!("{backend:?}").contains("root-secret-1"));
    let registry = LockRegistry::builder(backend).build().unwrap();
    lock_and_release(&registry, &unique_key("auth")).await;
}

/// Undoes a held lock behind its holder's back: deletes its key, or
/// revokes the lease the key is attached to.
async fn undo(admin: &mut etcd_client::Client, key: &str, how: &str) {
    if how == "delete" {
        assert_eq!(lock_tests::etcd_delete_lock(admin, key).await, 1);
    } else {
        let lease = lock_tests::etcd_lock_entries(admin, key).await[0].lease();
        admin.lease_revoke(lease).await.unwrap();
    }
}

/// How long after `undone` `guard` learns it lost its lock: well under a
/// 30 s lease's first renewal (10 s in), so the loss was pushed, not found.
async fn time_to_hear_the_loss(guard: &lock_runtime::LockGuard, undone: Instant) -> Duration {
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("the loss was pushed to the holder (the renewal is 10 s away)");
    assert!(!guard.is_held());
    undone.elapsed()
}

/// A key deleted or a lease revoked under a holder: the key's watch tells
/// the holder at once, long before its renewal would have found out.
#[tokio::test(flavor = "multi_thread")]
async fn a_key_deleted_or_a_lease_revoked_under_a_holder_is_pushed_at_once() {
    let cluster = EtcdCluster::single();
    let registry = registry(&cluster).await;
    let mut admin = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .unwrap();
    let long = LockOptions::default().ttl(Duration::from_secs(30));
    for how in ["delete", "revoke"] {
        let key = unique_key("pushed");
        let guard = registry.lock(&key, long.clone()).await.unwrap();
        // Another key held and released meanwhile is no loss for it.
        let other = registry
            .lock(&unique_key("other"), long.clone())
            .await
            .unwrap();
        other.release().await.unwrap();
        assert!(guard.is_held());
        let undone = Instant::now();
        undo(&mut admin, &key, how).await;
        let heard = time_to_hear_the_loss(&guard, undone).await;
        eprintln!("{how}: the holder heard of it after {heard:?}");
        let err = guard.release().await.unwrap_err();
        assert!(matches!(err, LockError::Lost { .. }), "{err}");
    }
}

/// The watch stream breaks (its member restarts) while a lock is held: the
/// key is watched again from its grant, and a deletion afterwards is still
/// pushed.
#[tokio::test(flavor = "multi_thread")]
async fn a_pushed_loss_survives_a_restarted_member() {
    let mut cluster = EtcdCluster::single();
    let registry = registry(&cluster).await;
    let long = LockOptions::default().ttl(Duration::from_secs(30));
    let key = unique_key("restart");
    let guard = registry.lock(&key, long).await.unwrap();
    assert!(cluster.restart(0), "{}", cluster.log(0));
    let mut admin = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .unwrap();
    let undone = Instant::now();
    undo(&mut admin, &key, "delete").await;
    let heard = time_to_hear_the_loss(&guard, undone).await;
    eprintln!("after a restart: the holder heard of it after {heard:?}");
}

/// A waiter's watch breaks (its connection reset), and while it cannot
/// resume the holder's entry is deleted, the queue changed and the history
/// compacted away: the waiter's watch lists the queue again, finds its
/// entry first, and wakes it. It takes the lock as soon as the network
/// heals (its timed retries only keep its entry alive; only the watch
/// says when the entry heads the queue).
#[tokio::test(flavor = "multi_thread")]
async fn a_waiter_whose_watch_resumes_past_a_compaction_is_woken() {
    let cluster = EtcdCluster::single();
    let proxy = Proxy::start(cluster.client_port(0));
    let behind = LockRegistry::etcd(&[&format!("http://127.0.0.1:{}", proxy.port())])
        .await
        .unwrap();
    let mut admin = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .unwrap();
    // Someone else holds the key for 30 s.
    let key = unique_key("compacted");
    let range = lock_tests::etcd_lock_range(&key);
    let holder = format!("{range}someone-else");
    let passer_by = format!("{range}a-passer-by");
    let lease = admin.lease_grant(30, None).await.unwrap().id();
    let on_lease = etcd_client::PutOptions::new().with_lease(lease);
    admin
        .put(holder.as_str(), "someone else", Some(on_lease))
        .await
        .unwrap();
    let watchers = cluster.watchers(0);
    let waiter = tokio::spawn({
        let key = key.clone();
        async move {
            let guard = behind.lock(&key, LockOptions::default()).await;
            (Instant::now(), guard)
        }
    });
    wait_until("the waiter watches the key", || {
        cluster.watchers(0) > watchers
    })
    .await;

    proxy.black_hole();
    proxy.reset();
    admin.lease_revoke(lease).await.unwrap();
    admin
        .put(passer_by.as_str(), "a passer-by", None)
        .await
        .unwrap();
    admin.delete(passer_by.as_str(), None).await.unwrap();
    let now = admin.get(passer_by.as_str(), None).await.unwrap();
    let revision = now.header().unwrap().revision();
    admin.compact(revision, None).await.unwrap();
    let healed = Instant::now();
    proxy.forward();

    let (acquired, guard) = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter took the lock")
        .unwrap();
    let guard = guard.unwrap();
    let after = acquired.duration_since(healed);
    eprintln!("acquired {after:?} after the network healed");
    assert!(after < Duration::from_millis(2500), "{after:?}");
    guard.release().await.unwrap();
}

/// TLS with a client certificate, as a hardened cluster runs: locks work,
/// and a client without TLS gets nothing from the member.
#[tokio::test]
async fn tls_with_a_client_certificate_locks_and_releases() {
    let cluster = EtcdCluster::single_tls();
    let certs = cluster.certs().unwrap();
    let endpoint = cluster.endpoint(0);
    assert!(endpoint.starts_with("https://"), "{endpoint}");
    let backend = EtcdStore::builder(&[&endpoint])
        .tls_ca(certs.pem("ca.crt"))
        .tls_identity(certs.pem("client.crt"), certs.pem("client.key"))
        .connect()
        .await
        .unwrap();
    assert!(format!("{backend:?}").contains(&endpoint), "{backend:?}");
    let registry = LockRegistry::builder(backend).build().unwrap();
    let key = unique_key("tls");
    let mut tokens = Vec::new();
    for _ in 0..2 {
        let guard = registry.lock(&key, LockOptions::default()).await.unwrap();
        tokens.push(guard.fencing_token().await.unwrap());
        guard.release().await.unwrap();
    }
    assert!(tokens[1] > tokens[0], "fencing tokens {tokens:?}");

    // The control: plain HTTP/2 to the same port is not served.
    let plain = endpoint.replace("https://", "http://");
    let err = LockRegistry::etcd(&[&plain]).await.unwrap_err();
    let shown = format!("{err}: {}", std::error::Error::source(&err).unwrap());
    assert!(shown.contains(&plain), "{shown}");
}

/// What a wrong TLS setting gives: a clear error naming the endpoint or the
/// setting, within the timeouts, never a hang or a panic.
#[tokio::test]
async fn tls_settings_that_cannot_work_are_clear_errors() {
    let cluster = EtcdCluster::single_tls();
    let certs = cluster.certs().unwrap();
    let endpoint = cluster.endpoint(0);
    let error = |result: Result<EtcdStore, LockError>| {
        let err = lock_tests::error_chain(&result.map(|_| ()).unwrap_err());
        eprintln!("{err}");
        err
    };
    let started = Instant::now();
    // No client certificate, for a member that asks for one.
    let err = error(
        EtcdStore::builder(&[&endpoint])
            .tls_ca(certs.pem("ca.crt"))
            .connect()
            .await,
    );
    assert!(
        err.contains("cannot connect to etcd at") && err.contains(&endpoint),
        "{err}"
    );
    assert!(err.contains("`tls_identity`"), "{err}");
    // A CA that did not sign the member's certificate.
    let err = error(
        EtcdStore::builder(&[&endpoint])
            .tls_ca(certs.pem("other-ca.crt"))
            .tls_identity(certs.pem("client.crt"), certs.pem("client.key"))
            .connect()
            .await,
    );
    assert!(
        err.contains("cannot connect to etcd at") && err.contains(&endpoint),
        "{err}"
    );
    assert!(err.contains("invalid peer certificate"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(12),
        "took {:?}, over the {:?} bound",
        started.elapsed(),
        Duration::from_secs(12)
    );
    // Schemes that contradict the settings, refused before connecting.
    let plain = endpoint.replace("https://", "http://");
    let refused = lock_tests::invalid_settings;
    let err = refused(
        EtcdStore::builder(&[&plain])
            .tls_ca(certs.pem("ca.crt"))
            .connect(),
    )
    .await;
    assert!(
        err.contains(&plain) && err.contains("use https://"),
        "{err}"
    );
    let err = refused(EtcdStore::builder(&[&endpoint]).connect()).await;
    assert!(err.contains(&endpoint) && err.contains("tls_ca"), "{err}");
    let err = refused(
        EtcdStore::builder(&[&endpoint])
            .tls_identity(certs.pem("client.crt"), certs.pem("client.key"))
            .connect(),
    )
    .await;
    assert!(err.contains("call `tls_ca`"), "{err}");
}

/// A member that is not the leader dies: nobody notices.
#[tokio::test(flavor = "multi_thread")]
async fn a_dead_minority_member_is_skipped() {
    let mut cluster = EtcdCluster::spawn(3);
    let registry = registry(&cluster).await;
    let key = unique_key("minority");
    lock_and_release(&registry, &key).await;
    let leader = cluster.leader().expect("a leader");
    let follower = (leader + 1) % 3;
    cluster.kill(follower);
    let guard = registry
        .lock(&key, LockOptions::default().ttl(Duration::from_secs(1)))
        .await
        .unwrap();
    // Three renewals of the 1 s lease go through the two members left.
    tokio::time::sleep(ms(1200)).await;
    assert!(guard.is_held(), "renewals failed with a quorum alive");
    guard.release().await.unwrap();
    assert!(time_to_lock(&registry, &key).await < Duration::from_secs(1));
    assert!(cluster.restart(follower));
}

/// Two of three members die: calls fail with a clear error within the
/// wait timeout; once one is back, locks work again.
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_quorum_is_a_clear_error_and_locks_work_again_after() {
    let mut cluster = EtcdCluster::spawn(3);
    let registry = registry(&cluster).await;
    let key = unique_key("quorum");
    lock_and_release(&registry, &key).await;
    cluster.kill(1);
    cluster.kill(2);
    let started = Instant::now();
    let options = LockOptions::default().wait_timeout(Duration::from_secs(3));
    let err = registry.lock(&key, options.clone()).await.unwrap_err();
    let waited = started.elapsed();
    let cause = std::error::Error::source(&err).map(ToString::to_string);
    eprintln!("without quorum: {err} ({cause:?}) after {waited:?}");
    assert!(waited < Duration::from_millis(3500), "{waited:?}");
    assert!(
        matches!(err, LockError::Store { .. } | LockError::Timeout { .. }),
        "{err:?}"
    );
    if let LockError::Store { .. } = err {
        let cause = std::error::Error::source(&err).unwrap().to_string();
        assert!(cause.contains("etcd"), "{cause}");
    }
    assert!(cluster.restart(1), "quorum back with two members");
    let guard = registry.lock(&key, options).await.unwrap();
    guard.release().await.unwrap();
}

/// A claim of another kind (a semaphore against a mutex, both ways, a read
/// lock, another limit) is `InvalidOptions` at once; a timed-out waiter
/// leaves nothing behind (its queued entry is gone when the call returns); a
/// `hold_at_least` ends on time (not rounded up to whole seconds).
#[tokio::test]
async fn the_claim_rule_and_a_timed_out_waiter_through_the_registry() {
    let cluster = EtcdCluster::single();
    let (a, b) = (registry(&cluster).await, registry(&cluster).await);
    lock_tests::scenarios::a_claim_of_another_kind_is_refused_at_once(&a, &b).await;
    lock_tests::scenarios::a_waiter_that_times_out_leaves_nothing(&a, &b).await;
    lock_tests::scenarios::hold_at_least_ends_on_time(&a, &b).await;
}
