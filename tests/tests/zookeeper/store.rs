//! The ZooKeeper store against a real server: the contract, the ttl and
//! session-timeout rules, keys of any characters, the FIFO queue.

use std::time::{Duration, Instant};

use lock_runtime::store::testkit::Clients;
use lock_runtime::store_contract;
use lock_runtime::{LockError, LockOptions, LockRegistry, MAX_KEY_LEN, ZooKeeperStore};
use lock_tests::{Proxy, ZooKeeperEnsemble, unique_key};

/// The session timeout the tests ask for: above the contract's 10 s ttl.
const SESSION: Duration = Duration::from_secs(20);

async fn zookeeper_store() -> Clients {
    let zk = ZooKeeperEnsemble::single();
    let servers = zk.connect_string();
    let builder = || ZooKeeperStore::builder(&servers).session_timeout(SESSION);
    Clients::connect(zk, async || builder().connect().await).await
}

store_contract!(
    zookeeper_contract,
    zookeeper_store,
    skip: [
        a_hand_over_moves_the_lease_to_a_new_token,
    ]
);

async fn registry(zk: &ZooKeeperEnsemble, session: Duration) -> LockRegistry {
    registry_at(&zk.connect_string(), session).await
}

async fn registry_at(connect_string: &str, session: Duration) -> LockRegistry {
    let backend = ZooKeeperStore::builder(connect_string)
        .session_timeout(session)
        .connect()
        .await
        .unwrap();
    LockRegistry::builder(backend).build().unwrap()
}

#[tokio::test]
async fn a_ttl_longer_than_the_session_timeout_is_refused() {
    let zk = ZooKeeperEnsemble::single();
    let registry = registry(&zk, Duration::from_secs(4)).await;
    let key = unique_key("ttl");
    let long = LockOptions::default().ttl(Duration::from_secs(5));
    let err = registry.lock(&key, long).await.unwrap_err();
    assert!(matches!(err, LockError::InvalidOptions { .. }), "{err}");
    assert!(err.to_string().contains("session timeout"), "{err}");
    let fits = LockOptions::default().ttl(Duration::from_secs(4));
    registry
        .lock(&key, fits)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// Waiters in three sessions queue in the order they arrived, and get the
/// lock in that order: ZooKeeper's sequential nodes are a FIFO queue.
#[tokio::test(flavor = "multi_thread")]
async fn waiters_get_the_lock_in_the_order_they_queued() {
    let zk = ZooKeeperEnsemble::single();
    let observer = zookeeper_client::Client::connect(&zk.connect_string())
        .await
        .unwrap();
    let key = unique_key("fifo");
    let queue_len = || {
        let (observer, key) = (observer.clone(), key.clone());
        async move {
            // The key's characters are all kept as they are in its node.
            let path = format!("/locks/{key}");
            observer.list_children(&path).await.map_or(0, |c| c.len())
        }
    };
    let options = LockOptions::default().ttl(Duration::from_secs(10));
    let holder = registry(&zk, SESSION).await;
    let first = holder.lock(&key, options.clone()).await.unwrap();
    let (order_tx, mut order_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for name in ["second", "third", "fourth"] {
        let registry = registry(&zk, SESSION).await;
        let queued = queue_len().await;
        let (key, options, order_tx) = (key.clone(), options.clone(), order_tx.clone());
        waiters.push(tokio::spawn(async move {
            let guard = registry.lock(&key, options).await.unwrap();
            order_tx.send(name).unwrap();
            guard.release().await.unwrap();
        }));
        // The next waiter starts once this one has its place.
        let since = std::time::Instant::now();
        while queue_len().await <= queued {
            assert!(
                since.elapsed() < Duration::from_secs(5),
                "{name} never queued"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    first.release().await.unwrap();
    let mut order = Vec::new();
    for _ in 0..3 {
        order.push(order_rx.recv().await.unwrap());
    }
    assert_eq!(order, ["second", "third", "fourth"]);
    for waiter in waiters {
        waiter.await.unwrap();
    }
}

/// No herd: each waiter watches only the child just ahead of its own, so
/// a release wakes one waiter. With a holder and three waiters in four
/// sessions, the key's node has no watch (a child watch would wake them
/// all), the last child has none, the second and third have one session
/// each, and no session watches two children. (The holder watches its own
/// child too, to hear of a forced release.)
#[tokio::test(flavor = "multi_thread")]
async fn each_waiter_watches_only_the_child_ahead_of_it() {
    let zk = ZooKeeperEnsemble::single();
    let observer = zookeeper_client::Client::connect(&zk.connect_string())
        .await
        .unwrap();
    let key = unique_key("herd");
    let parent = format!("/locks/{key}");
    let options = LockOptions::default().ttl(Duration::from_secs(10));
    let holder = registry(&zk, SESSION).await;
    let first = holder.lock(&key, options.clone()).await.unwrap();
    let mut waiters = Vec::new();
    for queued in 2..=4 {
        let registry = registry(&zk, SESSION).await;
        let (key, options) = (key.clone(), options.clone());
        waiters.push(tokio::spawn(async move {
            let guard = registry.lock(&key, options).await.unwrap();
            guard.release().await.unwrap();
        }));
        // The next waiter starts once this one has its place.
        let since = Instant::now();
        while observer.list_children(&parent).await.unwrap().len() < queued {
            assert!(since.elapsed() < Duration::from_secs(5), "never queued");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let mut queue = observer.list_children(&parent).await.unwrap();
    // `<token>-<sequence>`: ten digits, so their text sorts by sequence.
    queue.sort_by(|a, b| a.rsplit('-').next().cmp(&b.rsplit('-').next()));
    let child = |i: usize| format!("{parent}/{}", queue[i]);
    // The waiters' watches are set in the background once they queue.
    let ours = || {
        let mut watches = zk.watches(0);
        watches.retain(|path, _| *path == parent || path.starts_with(&format!("{parent}/")));
        watches
    };
    lock_tests::wait_until("the waiters watch", || {
        let watches = ours();
        watches.contains_key(&child(1)) && watches.contains_key(&child(2))
    })
    .await;
    let watches = ours();
    eprintln!("queue {queue:?}, watches {watches:#?}");
    assert!(!watches.contains_key(&parent), "the key's node is watched");
    assert!(
        !watches.contains_key(&child(3)),
        "the last child is watched"
    );
    for path in watches.keys() {
        assert!(
            (0..3).any(|i| child(i) == *path),
            "{path} is not a child in the queue"
        );
    }
    assert_eq!(watches[&child(1)].len(), 1, "{watches:?}");
    assert_eq!(watches[&child(2)].len(), 1, "{watches:?}");
    let mut sessions: Vec<&String> = watches.values().flatten().collect();
    let watching = sessions.len();
    sessions.sort();
    sessions.dedup();
    assert_eq!(sessions.len(), watching, "a session watches two children");
    first.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
}

/// The holder's connection is black-holed until the server expires its
/// session: the holder gives up (its guard says lost) before another
/// client gets the lock, and once the network heals the store opens a new
/// session and locks again.
#[tokio::test(flavor = "multi_thread")]
async fn a_holder_cut_off_until_its_session_expires_gives_up_first_then_recovers() {
    let zk = ZooKeeperEnsemble::single();
    let proxy = Proxy::start(zk.client_port(0));
    let session = Duration::from_secs(2);
    let cut_off = registry_at(&format!("127.0.0.1:{}", proxy.port()), session).await;
    let other = registry(&zk, session).await;
    let key = unique_key("expired");
    let options = LockOptions::default().ttl(session);
    let guard = cut_off.lock(&key, options.clone()).await.unwrap();
    proxy.black_hole();
    let cut_at = Instant::now();
    let taking = tokio::spawn({
        let (key, options) = (key.clone(), options.clone());
        async move {
            let guard = other.lock(&key, options).await.unwrap();
            (cut_at.elapsed(), guard)
        }
    });
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the holder was told");
    let gave_up = cut_at.elapsed();
    let (taken, next) = tokio::time::timeout(Duration::from_secs(10), taking)
        .await
        .expect("the other client took the lock")
        .unwrap();
    eprintln!("holder gave up {gave_up:?} after the cut, the other took it {taken:?} after");
    assert!(gave_up < taken, "gave up {gave_up:?}, taken {taken:?}");
    let err = guard.release().await.unwrap_err();
    assert!(matches!(err, LockError::Lost { .. }), "{err}");
    next.release().await.unwrap();

    proxy.forward();
    let again = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            match cut_off.lock(&key, options.clone()).await {
                Ok(guard) => return guard,
                // Calls on the expired session fail until the new one is open.
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    })
    .await
    .expect("a new session locks again");
    again.release().await.unwrap();
}

/// The fencing token is the held node's czxid (the acquire reads it from
/// its own transaction, not from a second request), and the holder is the
/// key's only child.
#[tokio::test]
async fn the_fencing_token_is_the_held_nodes_czxid() {
    let zk = ZooKeeperEnsemble::single();
    let registry = registry(&zk, SESSION).await;
    let client = zookeeper_client::Client::connect(&zk.connect_string())
        .await
        .unwrap();
    let key = unique_key("czxid");
    let options = LockOptions::default().ttl(SESSION);
    let mut last = 0;
    for _ in 0..3 {
        let guard = registry.lock(&key, options.clone()).await.unwrap();
        let parent = format!("/locks/{key}");
        let queue = client.list_children(&parent).await.unwrap();
        assert_eq!(queue.len(), 1, "{queue:?}");
        let (_, stat) = client
            .get_data(&format!("{parent}/{}", queue[0]))
            .await
            .unwrap();
        assert_eq!(guard.fencing_token().await.unwrap(), stat.czxid as u64);
        assert!(guard.fencing_token().await.unwrap() > last);
        last = guard.fencing_token().await.unwrap();
        guard.release().await.unwrap();
    }
}

/// Releases asked for while one is in flight reach the ensemble together,
/// in one transaction, so many releases cost far fewer transactions than
/// locks. A transaction is all or nothing: when one of its deletions fails
/// (a forced release deleted the node first), that release alone hears it,
/// and the others still go through.
#[tokio::test]
async fn releases_in_flight_together_share_requests_and_fail_alone() {
    const KEYS: usize = 40;
    let zk = ZooKeeperEnsemble::single();
    let registry = registry(&zk, SESSION).await;
    let client = zookeeper_client::Client::connect(&zk.connect_string())
        .await
        .unwrap();
    let base = unique_key("together");
    let options = LockOptions::default().ttl(SESSION);
    let mut guards = Vec::new();
    for i in 0..KEYS {
        guards.push(
            registry
                .lock(&format!("{base}-{i}"), options.clone())
                .await
                .unwrap(),
        );
    }
    let before = zk.last_zxid(0).unwrap();
    // Every fourth key is also forced free, in the same burst: each of its
    // node's two deletions comes after the other or fails in the same
    // transaction as the other releases.
    let mut releases = tokio::task::JoinSet::new();
    for (i, guard) in guards.into_iter().enumerate() {
        releases.spawn(async move { (i, Some(guard.release().await), None) });
        if i % 4 == 0 {
            let (registry, key) = (registry.clone(), format!("{base}-{i}"));
            releases.spawn(async move { (i, None, Some(registry.force_release(&key).await)) });
        }
    }
    let mut released: Vec<_> = (0..KEYS).map(|_| None).collect();
    let mut forced: Vec<_> = (0..KEYS).map(|_| None).collect();
    while let Some(joined) = releases.join_next().await {
        match joined.unwrap() {
            (i, Some(release), _) => released[i] = Some(release),
            (i, _, force) => forced[i] = force,
        }
    }
    let transactions = zk.last_zxid(0).unwrap() - before;
    // The ensemble removes empty key nodes (containers) now and then, one
    // transaction each: not ours.
    let mut swept = 0;
    for i in 0..KEYS {
        let parent = format!("/locks/{base}-{i}");
        let left = match client.list_children(&parent).await {
            Ok(left) => left,
            Err(zookeeper_client::Error::NoNode) => {
                swept += 1;
                Vec::new()
            }
            Err(err) => panic!("{err}"),
        };
        assert!(left.is_empty(), "key {i} still has {left:?}");
        let release = released[i].take().unwrap();
        let Some(force) = forced[i].take() else {
            release.unwrap_or_else(|err| panic!("release {i}: {err:?}"));
            continue;
        };
        // Exactly one of the two deleted the node.
        match (release, force.unwrap()) {
            (Ok(()), false) | (Err(LockError::Lost { .. }), true) => {}
            other => panic!("key {i}: release and forced release: {other:?}"),
        }
    }
    let ours = transactions - swept;
    eprintln!(
        "{KEYS} releases and {} forced: {ours} transactions",
        KEYS / 4
    );
    // One each would be 50; together, about 2 for the releases and one
    // per failed deletion of a forced release.
    assert!(
        ours < KEYS as i64 / 2,
        "{ours} transactions for {KEYS} releases: they did not go together"
    );
}

/// Releases of keys at the length limit, each byte written `%XX` (a path
/// of 192 KiB), in flight together: they go in as many requests as keep
/// within ZooKeeper's request size limit (1 MB; a server closes the
/// connection of a request above it), and every one goes through.
#[tokio::test]
async fn releases_of_the_longest_keys_together_keep_within_the_request_limit() {
    let zk = ZooKeeperEnsemble::single();
    let registry = registry(&zk, SESSION).await;
    let base = unique_key("long");
    let options = LockOptions::default().ttl(SESSION);
    let keys: Vec<String> = (0..8)
        .map(|i| {
            let mut key = format!("{base}-{i}-");
            key.extend(std::iter::repeat_n('/', MAX_KEY_LEN - key.len()));
            key
        })
        .collect();
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(registry.lock(key, options.clone()).await.unwrap());
    }
    let mut releases = tokio::task::JoinSet::new();
    for guard in guards {
        releases.spawn(guard.release());
    }
    while let Some(released) = releases.join_next().await {
        released.unwrap().expect("a release of a long key");
    }
    for key in &keys {
        let again = registry.try_lock(key, options.clone()).await.unwrap();
        again.expect("released").release().await.unwrap();
    }
}

/// An error and its sources, as one line.
fn chain(err: &dyn std::error::Error) -> String {
    let mut line = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        line = format!("{line}: {cause}");
        source = cause.source();
    }
    line
}

/// A chroot, from the builder or the connect string, confines every node
/// under it (created on connect): the same key outside it is another lock.
#[tokio::test]
async fn a_chroot_confines_every_node_under_it() {
    let zk = ZooKeeperEnsemble::single();
    let builder = ZooKeeperStore::builder(&zk.connect_string())
        .chroot("/apps/orders")
        .session_timeout(SESSION);
    let confined = LockRegistry::builder(builder.connect().await.unwrap())
        .build()
        .unwrap();
    let by_string = registry_at(&format!("{}/apps/orders", zk.connect_string()), SESSION).await;
    let outside = registry(&zk, SESSION).await;
    let key = unique_key("chroot");
    let options = LockOptions::default().ttl(SESSION);
    let guard = confined.lock(&key, options.clone()).await.unwrap();
    let same = by_string.try_lock(&key, options.clone()).await.unwrap();
    assert!(same.is_none(), "the connect string's chroot is the same");
    let other = outside.try_lock(&key, options.clone()).await.unwrap();
    let other = other.expect("outside the chroot the key is another lock");
    let client = zookeeper_client::Client::connect(&zk.connect_string())
        .await
        .unwrap();
    let queue = client
        .list_children(&format!("/apps/orders/locks/{key}"))
        .await
        .unwrap();
    assert_eq!(queue.len(), 1, "{queue:?}");
    guard.release().await.unwrap();
    other.release().await.unwrap();

    let bad = ZooKeeperStore::builder(&zk.connect_string()).chroot("apps/");
    let bad = lock_tests::invalid_settings(bad.connect()).await;
    assert!(bad.contains("chroot `apps/`"), "{bad}");
}

/// With digest credentials the nodes admit only sessions holding the same
/// ones: another process with them queues as usual; without them, or with
/// a wrong password, an attempt fails with a clear error that never shows
/// the password.
#[tokio::test]
async fn digest_credentials_admit_only_the_same_credentials() {
    let zk = ZooKeeperEnsemble::single();
    let with = |password: &'static str| {
        ZooKeeperStore::builder(&zk.connect_string())
            .digest("orders", password)
            .session_timeout(SESSION)
    };
    let builder = with("s3cret-pw");
    let shown = format!("{builder:?}");
    assert!(!shown.contains("s3cret-pw"), "{shown}");
    let build = |backend| LockRegistry::builder(backend).build().unwrap();
    let holder = build(builder.connect().await.unwrap());
    let peer = build(with("s3cret-pw").connect().await.unwrap());
    let key = unique_key("digest");
    let options = LockOptions::default().ttl(SESSION);
    let guard = holder.lock(&key, options.clone()).await.unwrap();
    assert!(
        peer.try_lock(&key, options.clone())
            .await
            .unwrap()
            .is_none()
    );

    let wrong = build(with("wr0ng-pw").connect().await.unwrap());
    let anonymous = registry(&zk, SESSION).await;
    for (who, registry) in [("a wrong password", &wrong), ("no credentials", &anonymous)] {
        let err = registry.try_lock(&key, options.clone()).await.unwrap_err();
        let line = chain(&err);
        eprintln!("with {who}: {line}");
        assert!(matches!(err, LockError::Store { .. }), "{who}: {line}");
        assert!(line.contains("not authorized"), "{who}: {line}");
        assert!(line.contains(&key), "{who}: {line}");
        assert!(!line.contains("pw"), "{who}: {line}");
    }
    guard.release().await.unwrap();
    let next = peer.try_lock(&key, options).await.unwrap();
    next.expect("free for the same credentials")
        .release()
        .await
        .unwrap();
}

/// A release that never reached the server (the connection cut, then
/// reset, the request with it) is not the end of it: the node is deleted
/// once the client is back, so the next client gets the lock then, not
/// when the holder's 30 s session ends.
#[tokio::test(flavor = "multi_thread")]
async fn a_release_lost_on_the_way_frees_the_lock_once_the_client_is_back() {
    let zk = ZooKeeperEnsemble::single();
    let proxy = Proxy::start(zk.client_port(0));
    let backend = ZooKeeperStore::builder(&format!("127.0.0.1:{}", proxy.port()))
        .session_timeout(Duration::from_secs(30))
        .response_timeout(Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let holder = LockRegistry::builder(backend).build().unwrap();
    let other = registry(&zk, Duration::from_secs(30)).await;
    let key = unique_key("unanswered");
    let options = LockOptions::default().ttl(Duration::from_secs(30));
    let guard = holder.lock(&key, options.clone()).await.unwrap();
    proxy.black_hole();
    let err = guard.release().await.unwrap_err();
    assert!(matches!(err, LockError::Store { .. }), "{err:?}");
    // The delete dies with the connection; the client reconnects.
    proxy.reset();
    proxy.forward();
    let back = Instant::now();
    let next = other
        .lock(&key, options.wait_timeout(Duration::from_secs(10)))
        .await
        .expect("the lock is free well before the holder's session ends");
    eprintln!(
        "the release failed ({err}); the lock was free {:?} after the connection came back",
        back.elapsed()
    );
    next.release().await.unwrap();
}

/// A connection that breaks under an acquire (its request on the way, a
/// server's connection closed, as a restart or a server dropping out of
/// its quorum closes them) is not the caller's error: the session lives
/// on, the client connects again, and the acquire is made again there,
/// within the response timeout.
#[tokio::test(flavor = "multi_thread")]
async fn an_acquire_whose_connection_breaks_is_made_again_on_the_next() {
    let zk = ZooKeeperEnsemble::single();
    let proxy = Proxy::start(zk.client_port(0));
    let registry = registry_at(&format!("127.0.0.1:{}", proxy.port()), SESSION).await;
    let key = unique_key("reconnected");
    proxy.black_hole();
    let held_before = proxy.held_back();
    let attempt = tokio::spawn({
        let (registry, key) = (registry.clone(), key.clone());
        let options = LockOptions::default().ttl(Duration::from_secs(10));
        async move { registry.lock(&key, options).await }
    });
    // The acquire's request is on its way: held back by the proxy.
    let deadline = Instant::now() + Duration::from_secs(10);
    while proxy.held_back() == held_before {
        assert!(Instant::now() < deadline, "no request reached the proxy");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    proxy.reset();
    proxy.forward();
    let guard = attempt
        .await
        .unwrap()
        .expect("the acquire was made again once the client was back");
    assert!(guard.is_held());
    guard.release().await.unwrap();
}

/// The holder's connection is cut, and while it is away its node is
/// deleted by hand. The session lives on, so nothing expires; once the
/// client is back within the session, the holder checks its node, finds it
/// gone and reports the lease lost, long before its ttl would have run out.
#[tokio::test(flavor = "multi_thread")]
async fn a_node_deleted_while_the_holder_was_away_is_lost_once_it_is_back() {
    let zk = ZooKeeperEnsemble::single();
    let proxy = Proxy::start(zk.client_port(0));
    let holder = registry_at(&format!("127.0.0.1:{}", proxy.port()), SESSION).await;
    let observer = zookeeper_client::Client::connect(&zk.connect_string())
        .await
        .unwrap();
    let key = unique_key("away");
    let ttl = Duration::from_secs(10);
    let guard = holder
        .lock(&key, LockOptions::default().ttl(ttl))
        .await
        .unwrap();
    let held_at = Instant::now();
    // Away: the connection closed and reconnecting held back.
    proxy.black_hole();
    proxy.reset();
    let parent = format!("/locks/{key}");
    let queue = observer.list_children(&parent).await.unwrap();
    assert_eq!(queue.len(), 1, "{queue:?}");
    observer
        .delete(&format!("{parent}/{}", queue[0]), None)
        .await
        .unwrap();
    let lost_while_away = tokio::time::timeout(Duration::from_millis(500), guard.lost()).await;
    assert!(lost_while_away.is_err(), "told before the client was back");
    proxy.forward();
    let back_at = Instant::now();
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the holder was told once it was back");
    eprintln!(
        "lost {:?} after the client was back, {:?} after the lock was taken (ttl {ttl:?})",
        back_at.elapsed(),
        held_at.elapsed()
    );
    assert!(held_at.elapsed() < ttl, "the ttl ran out first");
    let err = guard.release().await.unwrap_err();
    assert!(matches!(err, LockError::Lost { .. }), "{err}");
}

/// Two of three servers die: a lock attempt fails with a clear error
/// within its wait_timeout, and locks work again once one is back. (The
/// first request after the restart may wait seconds for the ensemble; a
/// ttl as long as the session leaves its grant time to be renewed.)
#[tokio::test(flavor = "multi_thread")]
async fn a_lost_quorum_is_a_clear_error_and_locks_work_again_after() {
    let mut zk = ZooKeeperEnsemble::spawn(3);
    let session = Duration::from_secs(4);
    let registry = registry(&zk, session).await;
    let key = unique_key("quorum");
    let options = LockOptions::default()
        .ttl(session)
        .wait_timeout(Duration::from_secs(3));
    registry
        .lock(&key, options.clone())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    zk.kill(1);
    zk.kill(2);
    let started = Instant::now();
    let err = registry.lock(&key, options.clone()).await.unwrap_err();
    let took = started.elapsed();
    let source = std::error::Error::source(&err).map(ToString::to_string);
    eprintln!("without quorum: {err} ({source:?}) after {took:?}");
    assert!(
        matches!(err, LockError::Store { .. } | LockError::Timeout { .. }),
        "{err:?}"
    );
    assert!(took < Duration::from_secs(4), "{took:?}");
    zk.restart(1)
        .unwrap_or_else(|why| panic!("restarting server 1: {why}"));
    let back = Instant::now();
    let guard = loop {
        match registry.lock(&key, options.clone()).await {
            Ok(guard) => break guard,
            Err(err) => {
                assert!(
                    back.elapsed() < Duration::from_secs(20),
                    "still failing: {err}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    eprintln!("locks work again {:?} after the restart", back.elapsed());
    guard.release().await.unwrap();
}

/// A claim of another kind (a semaphore against a mutex, both ways, a read
/// lock, another limit) is `InvalidOptions` at once; a timed-out waiter
/// leaves nothing behind (its queued node is gone when the call returns); a
/// `hold_at_least` ends on time.
#[tokio::test]
async fn the_claim_rule_and_a_timed_out_waiter_through_the_registry() {
    let zk = ZooKeeperEnsemble::single();
    let (a, b) = (registry(&zk, SESSION).await, registry(&zk, SESSION).await);
    lock_tests::scenarios::a_claim_of_another_kind_is_refused_at_once(&a, &b).await;
    lock_tests::scenarios::a_waiter_that_times_out_leaves_nothing(&a, &b).await;
    lock_tests::scenarios::hold_at_least_ends_on_time(&a, &b).await;
}
