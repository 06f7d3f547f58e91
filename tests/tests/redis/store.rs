//! The Redis backend through the manual API, each test against its own
//! `redis-server` started on a free loopback port.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_runtime::store::redis::Fencing;
use lock_runtime::store::testkit::Clients;
use lock_runtime::store_contract;
use lock_runtime::{LockError, LockGuard, LockOptions, LockRegistry, RedisStore};
use lock_tests::{
    RedisServer, is_held, lock_and_release, measure_handoff, time_to_lock, unique_key,
    wait_for_waiter, wait_until,
};
use redis::Commands;

async fn redis_store() -> Clients {
    let server = RedisServer::new();
    let url = server.url();
    Clients::connect(server, async || RedisStore::builder(&url).connect().await).await
}

store_contract!(
    redis_contract,
    redis_store,
    skip: [a_forced_release_is_pushed_to_the_holder]
);

async fn registry(server: &RedisServer) -> LockRegistry {
    LockRegistry::redis(&server.url()).await.unwrap()
}

/// Checks the commands the server ran since [`reset_stats`] (sorted by
/// name, with their counts): `expected`.
fn assert_commands(server: &RedisServer, expected: &[(&str, u64)]) {
    let mut calls = command_calls(server);
    calls.retain(|(name, _)| name != "config|resetstat");
    calls.sort();
    let expected: Vec<(String, u64)> = expected
        .iter()
        .map(|&(name, n)| (name.to_owned(), n))
        .collect();
    assert_eq!(calls, expected);
}

/// A task of its own that takes `key`'s lock (default options) and
/// returns the guard.
fn lock_in_task(registry: &LockRegistry, key: &str) -> tokio::task::JoinHandle<LockGuard> {
    let (registry, key) = (registry.clone(), key.to_owned());
    tokio::spawn(async move { registry.lock(&key, LockOptions::default()).await.unwrap() })
}

/// Calls of each command since the last `CONFIG RESETSTAT`.
fn command_calls(server: &RedisServer) -> Vec<(String, u64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.connection())
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .filter(|(name, _)| !matches!(name.as_str(), "info" | "config"))
        .collect()
}

/// The number of `name` calls in a `command_calls` list.
fn calls_of(calls: &[(String, u64)], name: &str) -> u64 {
    calls.iter().find(|(n, _)| n == name).map_or(0, |(_, n)| *n)
}

fn reset_stats(server: &RedisServer) {
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut server.connection())
        .unwrap();
}

/// The store with fencing off: exclusive grants take the plain `SET NX`
/// path.
async fn redis_unfenced_store() -> Clients {
    let server = RedisServer::new();
    let url = server.url();
    Clients::connect(server, async || {
        RedisStore::builder(&url)
            .fencing(Fencing::Off)
            .connect()
            .await
    })
    .await
}

store_contract!(
    redis_unfenced_contract,
    redis_unfenced_store,
    skip: [
        fencing_tokens_increase_across_holders,
        a_forced_release_is_pushed_to_the_holder,
    ]
);

/// Without fencing, an uncontended lock is the one command a plain lock
/// sends (`SET NX PX`, with `GET` to recognise a retried attempt), no
/// What one unfenced lock and release send when nobody waits: `SET NX PX
/// GET`, and the release script (its `GET` and `DEL`), as the plain lock
/// of the benchmark's floor.
const PLAIN_LOCK: &[(&str, u64)] = &[("del", 1), ("evalsha", 1), ("get", 1), ("set", 1)];

/// script; the release is one script call, as the floor's.
#[tokio::test]
async fn an_unfenced_lock_is_one_plain_set() {
    let server = RedisServer::new();
    let store = RedisStore::builder(&server.url())
        .fencing(Fencing::Off)
        .connect()
        .await
        .unwrap();
    let registry = LockRegistry::new(store);
    let warm = registry
        .lock(&unique_key("warm"), LockOptions::default())
        .await
        .unwrap();
    warm.release().await.unwrap();
    reset_stats(&server);
    let guard = registry
        .lock(&unique_key("plain"), LockOptions::default())
        .await
        .unwrap();
    assert_eq!(guard.fencing_token(), 0);
    guard.release().await.unwrap();
    assert_commands(&server, PLAIN_LOCK);
}

/// `LockOptions::fencing(false)` on a store with fencing: that lock is
/// one plain `SET`, its token 0, and fenced locks of the same key before
/// and after it keep their increasing tokens.
#[tokio::test]
async fn a_lock_without_fencing_on_a_fenced_store_is_one_plain_set() {
    let server = RedisServer::new();
    let registry = registry(&server).await;
    let key = unique_key("mixed");
    let first = registry.lock(&key, LockOptions::default()).await.unwrap();
    let before = first.fencing_token();
    first.release().await.unwrap();
    reset_stats(&server);
    let plain = registry
        .lock(&key, LockOptions::default().fencing(false))
        .await
        .unwrap();
    assert_eq!(plain.fencing_token(), 0);
    plain.release().await.unwrap();
    assert_commands(&server, PLAIN_LOCK);
    let after = registry.lock(&key, LockOptions::default()).await.unwrap();
    assert!(
        after.fencing_token() > before,
        "{before} then {}",
        after.fencing_token()
    );
    after.release().await.unwrap();
}

#[tokio::test]
async fn uncontended_lock_and_release_are_one_round_trip_each() {
    let server = RedisServer::new();
    let registry = registry(&server).await;
    // The first use loads the scripts (NOSCRIPT, then EVAL); measure after.
    let warm = registry
        .lock(&unique_key("warm"), LockOptions::default())
        .await
        .unwrap();
    warm.release().await.unwrap();
    reset_stats(&server);
    let guard = registry
        .lock(&unique_key("rt"), LockOptions::default())
        .await
        .unwrap();
    guard.release().await.unwrap();
    // Two top-level commands; the rest ran inside the acquire script (SET NX,
    // then TIME and a SET .. GET of the fencing counter) and the release
    // script (GET, DEL; no PUBLISH, as nobody waits).
    assert_commands(
        &server,
        &[
            ("del", 1),
            ("evalsha", 2),
            ("get", 1),
            ("set", 2),
            ("time", 1),
        ],
    );
}

/// A release is published only when a waiter marked the key: not when
/// nobody waits, and when a waiter in another process was refused, also
/// after the holder's process handed the lease to a task of its own, whose
/// release then wakes that waiter long before the lease could expire.
#[tokio::test]
async fn a_release_is_published_only_when_someone_waits() {
    let server = RedisServer::new();
    let (here, there) = (registry(&server).await, registry(&server).await);
    let key = unique_key("published");
    let value =
        || -> Option<String> { server.connection().get(format!("lock:{{{key}}}")).unwrap() };
    lock_and_release(&here, &key).await;
    reset_stats(&server);
    lock_and_release(&here, &key).await;
    assert_eq!(
        calls_of(&command_calls(&server), "publish"),
        0,
        "nobody waits"
    );

    let first = here.lock(&key, LockOptions::default()).await.unwrap();
    let next_here = lock_in_task(&here, &key);
    wait_until("the next task queued locally", || {
        here.local_queue_len(&key) == 2
    })
    .await;
    let waiting = lock_in_task(&there, &key);
    wait_for_waiter(&server, &key).await;
    wait_until("the waiter marked the key", || {
        value().is_some_and(|v| v.ends_with('~'))
    })
    .await;
    reset_stats(&server);
    // Handed over within this process: the mark goes with the lease.
    first.release().await.unwrap();
    let next_here = next_here.await.unwrap();
    assert!(
        value().is_some_and(|v| v.ends_with('~')),
        "the mark was lost: {:?}",
        value()
    );
    assert_eq!(
        calls_of(&command_calls(&server), "publish"),
        0,
        "handed over, not released"
    );
    next_here.release().await.unwrap();
    let guard = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the release woke the waiter (the lease had 30 s left)")
        .unwrap();
    assert_eq!(calls_of(&command_calls(&server), "publish"), 1);
    // The next holder's key is its own token again, unmarked.
    assert!(value().is_some_and(|v| !v.ends_with('~')), "{:?}", value());
    guard.release().await.unwrap();
}

#[tokio::test]
async fn scripts_survive_script_flush() {
    let server = RedisServer::new();
    let registry = registry(&server).await;
    let key = unique_key("flush");
    lock_and_release(&registry, &key).await;
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut server.connection())
        .unwrap();
    let guard = registry.lock(&key, LockOptions::default()).await.unwrap();
    assert!(is_held(&registry, &key).await);
    guard.release().await.unwrap();
}

#[tokio::test]
async fn keys_with_braces_colons_unicode_and_4kb_stay_distinct() {
    let server = RedisServer::new();
    let registry = registry(&server).await;
    let long = "k".repeat(4096);
    let keys = [
        "a{b}c",
        "a%7Bb%7Dc",
        "}{",
        "{",
        "}",
        "x:y:z",
        "x:y",
        "ключ:🔒:{id}",
        "%",
        "%25",
        long.as_str(),
    ];
    let mut guards = Vec::new();
    for key in keys {
        let guard = registry
            .try_lock(key, LockOptions::default())
            .await
            .unwrap();
        guards.push(guard.unwrap_or_else(|| panic!("{key:?} collided with an earlier key")));
    }
    for key in keys {
        assert!(
            registry
                .try_lock(key, LockOptions::default())
                .await
                .unwrap()
                .is_none(),
            "{key:?}"
        );
    }
    let mut conn = server.connection();
    let names: Vec<Vec<u8>> = conn.keys("lock:*").unwrap();
    let locks: Vec<_> = names
        .iter()
        .filter(|name| !name.ends_with(b":fence"))
        .collect();
    assert_eq!(locks.len(), keys.len());
    for name in &locks {
        // One hash tag per lock: the first `{` ... the first `}` is the whole key.
        let text = String::from_utf8_lossy(name);
        let open = text.find('{').unwrap();
        let close = text.find('}').unwrap();
        assert_eq!(close, text.len() - 1, "hash tag ends the name: {text:?}");
        assert!(open < close);
    }
    for guard in guards {
        guard.release().await.unwrap();
    }
}

#[tokio::test]
async fn a_down_server_gives_a_clear_error_quickly_and_recovers() {
    let mut server = RedisServer::new();
    let registry = registry(&server).await;
    let key = unique_key("down");
    lock_and_release(&registry, &key).await;
    server.kill();
    let started = Instant::now();
    let opts = LockOptions::default().wait_timeout(Duration::from_secs(3));
    let err = registry.lock(&key, opts.clone()).await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    assert!(err.to_string().contains(&key), "{err}");
    assert!(
        std::error::Error::source(&err).is_some(),
        "the redis error is kept"
    );
    assert!(
        took < Duration::from_secs(3),
        "failed fast, not at the timeout: {took:?}"
    );
    assert!(matches!(
        registry.try_lock(&key, LockOptions::default()).await,
        Err(LockError::Backend { .. })
    ));
    server.restart();
    // The connection comes back by itself; allow it a few seconds.
    let deadline = Instant::now() + Duration::from_secs(10);
    let guard = loop {
        match registry.lock(&key, opts.clone()).await {
            Ok(guard) => break guard,
            Err(err) if Instant::now() < deadline => {
                assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(err) => panic!("no recovery after restart: {err}"),
        }
    };
    assert!(is_held(&registry, &key).await);
    guard.release().await.unwrap();
}

/// Connecting to a server that is down: the builder's error is the same
/// redacted `LockError::Connect` as `LockRegistry::redis`'s, and the number
/// of connection retries is the builder's to choose (the default 2 take
/// about half a second; 0 fails after the first refusal).
#[tokio::test]
async fn connecting_to_a_down_server_is_a_redacted_connect_error() {
    let mut server = RedisServer::new();
    let port = server.port();
    server.kill();
    let url = format!("redis://:hunter2@127.0.0.1:{port}/0");
    for retries in [0, 2] {
        let started = Instant::now();
        let err = RedisStore::builder(&url)
            .connection_retries(retries)
            .connect()
            .await
            .unwrap_err();
        eprintln!("{retries} retries: failed after {:?}", started.elapsed());
        assert!(matches!(err, LockError::Connect { .. }), "{err:?}");
        let shown = format!("{err} {err:?}");
        assert!(shown.contains(&format!("127.0.0.1:{port}")), "{shown}");
        assert!(!shown.contains("hunter2"), "{shown}");
    }
}

#[tokio::test]
async fn a_frozen_server_never_holds_a_caller_past_wait_timeout() {
    let server = RedisServer::new();
    let registry = registry(&server).await;
    let key = unique_key("frozen");
    lock_and_release(&registry, &key).await;
    server.pause();
    let started = Instant::now();
    let opts = LockOptions::default().wait_timeout(Duration::from_millis(500));
    let err = registry.lock(&key, opts).await.unwrap_err();
    let took = started.elapsed();
    server.resume();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    assert!(took < Duration::from_millis(900), "{took:?}");
}

#[tokio::test]
async fn a_held_lock_is_lost_when_the_server_dies() {
    let mut server = RedisServer::new();
    let registry = registry(&server).await;
    let opts = LockOptions::default().ttl(Duration::from_millis(600));
    let guard = registry.lock(&unique_key("dies"), opts).await.unwrap();
    server.kill();
    let started = Instant::now();
    while guard.is_held() {
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "loss not noticed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        started.elapsed() <= Duration::from_millis(700),
        "{:?}",
        started.elapsed()
    );
    assert!(guard.release().await.is_err());
}

#[tokio::test]
async fn an_expired_holder_gets_lost_and_leaves_the_new_holders_lock() {
    let server = RedisServer::new();
    let (a, b) = (registry(&server).await, registry(&server).await);
    let key = unique_key("expired");
    let short = LockOptions::default()
        .ttl(Duration::from_millis(200))
        .watchdog(false);
    let first = a.lock(&key, short).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = b.lock(&key, LockOptions::default()).await.unwrap();
    assert!(second.fencing_token() > first.fencing_token());
    assert!(matches!(first.release().await, Err(LockError::Lost { .. })));
    assert!(second.is_held());
    assert!(is_held(&a, &key).await, "second lock intact");
    second.release().await.unwrap();
}

#[tokio::test]
async fn tasks_of_one_process_send_one_contender_to_redis() {
    let server = RedisServer::new();
    let (holder, waiters) = (registry(&server).await, registry(&server).await);
    let key = unique_key("queue");
    // Warm up the scripts and the subscriber, then hold the lock.
    let warm = waiters.lock(&key, LockOptions::default()).await.unwrap();
    warm.release().await.unwrap();
    let held = holder.lock(&key, LockOptions::default()).await.unwrap();
    reset_stats(&server);
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (waiters, key) = (waiters.clone(), key.clone());
            tokio::spawn(async move {
                let guard = waiters.lock(&key, LockOptions::default()).await.unwrap();
                guard.release().await.unwrap();
            })
        })
        .collect();
    // One contender: its attempt, and its retry after subscribing.
    wait_for_waiter(&server, &key).await;
    wait_until("the contender retried", || {
        calls_of(&command_calls(&server), "evalsha") >= 2
    })
    .await;
    wait_until("all 8 tasks queued", || waiters.local_queue_len(&key) == 8).await;
    // Nothing can signal that no more attempts come: watch for a while
    // (well short of the 5 s fallback retry) that none does.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let calls = command_calls(&server);
    let evalsha = calls_of(&calls, "evalsha");
    assert_eq!(
        evalsha, 2,
        "8 waiting tasks sent {evalsha} acquire attempts: {calls:?}"
    );
    held.release().await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
}

#[tokio::test]
async fn subscriptions_are_dropped_once_nobody_waits() {
    let server = RedisServer::new();
    let (holder, waiter) = (registry(&server).await, registry(&server).await);
    let key = unique_key("unsub");
    let held = holder.lock(&key, LockOptions::default()).await.unwrap();
    let task = tokio::spawn({
        let key = key.clone();
        async move {
            waiter
                .lock(&key, LockOptions::default())
                .await
                .unwrap()
                .release()
                .await
                .unwrap()
        }
    });
    let channels = || -> Vec<String> {
        redis::cmd("PUBSUB")
            .arg("CHANNELS")
            .query(&mut server.connection())
            .unwrap()
    };
    let started = Instant::now();
    while channels().is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "waiter never subscribed"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    held.release().await.unwrap();
    task.await.unwrap();
    let started = Instant::now();
    while !channels().is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "still subscribed: {:?}",
            channels()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_password_in_the_url_works_and_never_shows() {
    let secret = "s3cret-Pa55word";
    let server = RedisServer::with_password(secret);
    let registry = LockRegistry::redis(&server.url()).await.unwrap();
    let guard = registry
        .lock(&unique_key("auth"), LockOptions::default())
        .await
        .unwrap();
    guard.release().await.unwrap();
    assert!(!format!("{registry:?}").contains(secret), "{registry:?}");

    let wrong = format!("redis://:wrong-{secret}@127.0.0.1:{}", server.port());
    let err = LockRegistry::redis(&wrong).await.unwrap_err();
    let shown = format!(
        "{err} / {:?} / {}",
        err,
        std::error::Error::source(&err).unwrap()
    );
    assert!(!shown.contains(secret), "password leaked: {shown}");
    assert!(
        shown.to_lowercase().contains("auth") || shown.contains("WRONGPASS"),
        "{shown}"
    );
    assert!(
        err.to_string()
            .starts_with("could not connect to the redis store at `redis://:***@127.0.0.1:"),
        "{err}"
    );

    let missing = format!("redis://127.0.0.1:{}", server.port());
    let err = LockRegistry::redis(&missing).await.unwrap_err();
    let shown = format!("{err}: {}", std::error::Error::source(&err).unwrap());
    assert!(
        shown.contains("NOAUTH") || shown.to_lowercase().contains("auth"),
        "{shown}"
    );
}

#[tokio::test]
async fn fencing_counters_can_be_bounded_or_turned_off() {
    let server = RedisServer::new();
    let build = |fencing| {
        let url = server.url();
        async move {
            let backend = RedisStore::builder(&url)
                .fencing(fencing)
                .connect()
                .await
                .unwrap();
            LockRegistry::builder(backend).build().unwrap()
        }
    };
    let mut conn = server.connection();

    let off = build(Fencing::Off).await;
    let key = unique_key("off");
    let guard = off.lock(&key, LockOptions::default()).await.unwrap();
    assert_eq!(guard.fencing_token(), 0);
    guard.release().await.unwrap();
    let counter: bool = conn.exists(format!("lock:{{{key}}}:fence")).unwrap();
    assert!(!counter, "no counter kept with Fencing::Off");

    let bounded = build(Fencing::ExpireAfter(Duration::from_secs(60))).await;
    let key = unique_key("bounded");
    let first = bounded.lock(&key, LockOptions::default()).await.unwrap();
    let token = first.fencing_token();
    first.release().await.unwrap();
    let second = bounded.lock(&key, LockOptions::default()).await.unwrap();
    assert!(second.fencing_token() > token);
    second.release().await.unwrap();
    let pttl: i64 = conn.pttl(format!("lock:{{{key}}}:fence")).unwrap();
    assert!(
        pttl > 50_000 && pttl <= 60_000,
        "counter expires: pttl {pttl}"
    );
}

#[tokio::test]
async fn a_counter_ahead_of_the_clock_is_counted_on_and_one_behind_is_not() {
    // The server's clock stepped back: the counter a recent grant left is
    // ahead of it, so tokens continue from the counter. The script
    // compares the clock's digits with the counter's as strings, so the
    // cases are: ahead with as many digits, behind with as many, behind
    // with fewer.
    let server = RedisServer::new();
    let registry = registry(&server).await;
    let mut conn = server.connection();
    let (seconds, micros): (u64, u64) = redis::cmd("TIME").query(&mut conn).unwrap();
    let now = seconds * 1_000_000 + micros;
    let mut lock_with_counter = async |counter: u64| {
        let key = unique_key("stepped-back");
        let () = conn
            .set_ex(format!("lock:{{{key}}}:fence"), counter, 60)
            .unwrap();
        let mut tokens = Vec::new();
        for _ in 0..2 {
            let guard = registry.lock(&key, LockOptions::default()).await.unwrap();
            tokens.push(guard.fencing_token());
            guard.release().await.unwrap();
        }
        tokens
    };
    let ahead = now + 1_000 * 1_000_000;
    assert_eq!(lock_with_counter(ahead).await, [ahead + 1, ahead + 2]);
    for behind in [now - 1_000 * 1_000_000, 12_345] {
        let tokens = lock_with_counter(behind).await;
        assert!(
            tokens[0] >= now && tokens[0] < ahead && tokens[1] > tokens[0],
            "a counter behind the clock ({behind}) gave {tokens:?}, the clock read {now}"
        );
    }
}

#[tokio::test]
async fn waiters_are_woken_again_after_the_server_restarts() {
    let mut server = RedisServer::new();
    let (a, b) = (registry(&server).await, registry(&server).await);
    let key = unique_key("restart");
    // B waits on A's lock, so B's subscriber connection is up.
    let held = a.lock(&key, LockOptions::default()).await.unwrap();
    let waiting = tokio::spawn({
        let (b, key) = (b.clone(), key.clone());
        async move { b.lock(&key, LockOptions::default()).await }
    });
    wait_for_waiter(&server, &key).await;
    let restarted_at = Instant::now();
    server.restart();
    // B is woken by the lost subscription and retries at once: it gets the
    // lock (the restart lost A's lease) or, while its command connection is
    // still down, a Backend error. Either way it neither waits out the 30 s
    // lease nor sleeps until its fallback retry (5 s after its last attempt).
    let outcome = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .unwrap()
        .unwrap();
    let woken_after = restarted_at.elapsed();
    assert!(
        woken_after < Duration::from_millis(2500),
        "woken {woken_after:?} after the restart: by the fallback timer, not the lost subscription"
    );
    match outcome {
        Ok(guard) => guard.release().await.unwrap(),
        Err(err) => assert!(matches!(err, LockError::Backend { .. }), "{err:?}"),
    }
    assert!(matches!(
        held.release().await,
        Err(LockError::Lost { .. }) | Err(LockError::Backend { .. })
    ));

    // Notifications work again: a 30 s lease hands off on release, not on expiry.
    let key = unique_key("restart");
    let deadline = Instant::now() + Duration::from_secs(10);
    while a.try_lock(&key, LockOptions::default()).await.is_err() {
        assert!(Instant::now() < deadline, "no recovery after the restart");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let handoff = measure_handoff(&a, b, &key, &server).await;
    assert!(
        handoff < Duration::from_secs(1),
        "hand-off took {handoff:?}: no notification"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_waiters_get_the_lease_handed_over_in_one_round_trip() {
    let server = RedisServer::new();
    let registry = registry(&server).await;
    let key = unique_key("handover");
    // Warm up the scripts, then hold the lock while 8 tasks queue behind it.
    lock_and_release(&registry, &key).await;
    let first = registry.lock(&key, LockOptions::default()).await.unwrap();
    reset_stats(&server);
    let seen = std::sync::Arc::new(std::sync::Mutex::new(vec![first.fencing_token()]));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (registry, key, seen) = (registry.clone(), key.clone(), seen.clone());
            tokio::spawn(async move {
                for _ in 0..5 {
                    let guard = registry.lock(&key, LockOptions::default()).await.unwrap();
                    seen.lock().unwrap().push(guard.fencing_token());
                    guard.release().await.unwrap();
                }
            })
        })
        .collect();
    wait_until("8 tasks queued behind the holder", || {
        registry.local_queue_len(&key) == 9
    })
    .await;
    first.release().await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 41);
    assert!(
        seen.windows(2).all(|w| w[0] < w[1]),
        "fencing in holding order: {seen:?}"
    );
    let calls = command_calls(&server);
    let evalsha = calls_of(&calls, "evalsha");
    // Without hand-overs: 41 releases + 40 acquires = 81 calls. With them,
    // most of those pairs are one hand-over script.
    assert!(
        evalsha <= 60,
        "{evalsha} scripts for 41 sections: {calls:?}"
    );
}

#[tokio::test]
async fn an_acquire_given_up_in_flight_leaves_no_lease() {
    let server = RedisServer::new();
    let (a, b) = (registry(&server).await, registry(&server).await);
    let (timed_out, dropped) = (unique_key("orphan"), unique_key("orphan"));
    lock_and_release(&a, &timed_out).await;
    // Frozen, the server takes the requests into its socket buffer and
    // answers them once it is thawed, after the callers gave up.
    server.pause();
    let opts = LockOptions::default().wait_timeout(Duration::from_millis(300));
    let err = a.lock(&timed_out, opts).await.unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    let cancelled = tokio::time::timeout(
        Duration::from_millis(300),
        a.lock(&dropped, LockOptions::default()),
    )
    .await;
    assert!(cancelled.is_err(), "the call was dropped in flight");
    server.resume();
    // The 30 s leases the thawed server granted were released at once.
    for key in [&timed_out, &dropped] {
        let waited = time_to_lock(&b, key).await;
        assert!(waited < Duration::from_secs(1), "{waited:?}");
    }
}

#[tokio::test]
async fn every_call_against_a_frozen_server_returns_within_its_timeout() {
    let server = RedisServer::new();
    let timeout = Duration::from_millis(800);
    let backend = RedisStore::builder(&server.url())
        .response_timeout(timeout)
        .connect()
        .await
        .unwrap();
    let registry = LockRegistry::builder(backend).build().unwrap();
    let (held, free) = (unique_key("frozen"), unique_key("frozen"));
    lock_and_release(&registry, &free).await;
    let guard = registry.lock(&held, LockOptions::default()).await.unwrap();
    server.pause();
    // Slack for a loaded machine, but less than a second timeout: a call
    // that was sent again after its response timeout fails this.
    let bound = timeout + Duration::from_millis(600);

    let started = Instant::now();
    let err = registry
        .try_lock(&free, LockOptions::default())
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    assert!(took >= timeout && took < bound, "try_lock took {took:?}");

    let started = Instant::now();
    let wait = Duration::from_millis(300);
    let opts = LockOptions::default().wait_timeout(wait);
    let err = registry.lock(&free, opts).await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    assert!(
        took < wait + Duration::from_millis(300),
        "lock took {took:?}"
    );

    let started = Instant::now();
    let err = guard.release().await.unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, LockError::Backend { .. }), "{err:?}");
    assert!(took < bound, "release took {took:?}");
    server.resume();
}

#[tokio::test]
async fn fencing_tokens_never_go_backwards_when_redis_loses_its_data() {
    let mut server = RedisServer::new();
    let registry = registry(&server).await;
    let key = unique_key("data-loss");
    let mut tokens = Vec::new();
    let mut take = async |registry: &LockRegistry| {
        let guard = registry.lock(&key, LockOptions::default()).await.unwrap();
        tokens.push(guard.fencing_token());
        guard.release().await.unwrap();
    };
    for _ in 0..3 {
        take(&registry).await;
    }
    let () = redis::cmd("FLUSHALL")
        .query(&mut server.connection())
        .unwrap();
    take(&registry).await;
    // A restart without persistence: every counter is gone.
    server.restart();
    let registry = LockRegistry::redis(&server.url()).await.unwrap();
    take(&registry).await;
    take(&registry).await;
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing went backwards across FLUSHALL and a restart: {tokens:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_counters_end_with_their_leases() {
    let server = RedisServer::new();
    let registry = registry(&server).await;
    let ttl = Duration::from_millis(300);
    let prefix = unique_key("counters");
    // `LOCK_COUNTER_KEYS=1000000` for the full-size run; 100 000 in CI.
    let keys: usize = std::env::var("LOCK_COUNTER_KEYS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000);
    let tasks: Vec<_> = (0..32)
        .map(|task| {
            let (registry, prefix) = (registry.clone(), prefix.clone());
            tokio::spawn(async move {
                for i in (task..keys).step_by(32) {
                    let key = format!("{prefix}:{i}");
                    let opts = LockOptions::default().ttl(ttl);
                    let guard = registry.lock(&key, opts).await.unwrap();
                    guard.release().await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    // Distinct keys locked once: their counters go with the ttl (`KEYS`
    // leaves out, and deletes, keys whose time is up).
    let left = || -> usize {
        let names: Vec<Vec<u8>> = server.connection().keys("lock:*").unwrap();
        names.len()
    };
    wait_until("every counter expired", || left() == 0).await;
}

/// Fair mode, with a grant timeout of `grant_ms`.
async fn fair_backend(server: &RedisServer, grant_ms: u64) -> RedisStore {
    RedisStore::builder(&server.url())
        .fair(Duration::from_millis(grant_ms))
        .connect()
        .await
        .unwrap()
}

/// A registry over its own fair-mode backend.
async fn fair_registry(server: &RedisServer, grant_ms: u64) -> LockRegistry {
    LockRegistry::builder(fair_backend(server, grant_ms).await)
        .build()
        .unwrap()
}

async fn redis_fair_store() -> Clients {
    let server = RedisServer::new();
    let (a, b) = (
        fair_backend(&server, 500).await,
        fair_backend(&server, 500).await,
    );
    Clients::new(Arc::new(a), Arc::new(b), server)
}

store_contract!(
    redis_fair_contract,
    redis_fair_store,
    skip: [
        a_forced_release_is_pushed_to_the_holder,
    ]
);

/// The waiters queued in fair mode on `key`.
fn fair_queue(server: &RedisServer, key: &str) -> Vec<String> {
    server
        .connection()
        .lrange(format!("lock:{{{key}}}:queue"), 0, -1)
        .unwrap()
}

#[tokio::test]
async fn fair_mode_refuses_a_grant_timeout_too_short_to_keep_a_place() {
    let secret = "s3cret-Pa55word";
    let server = RedisServer::with_password(secret);
    let url = format!("redis://:{secret}@127.0.0.1:{}", server.port());
    let err = RedisStore::builder(&url)
        .fair(Duration::from_millis(10))
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidSettings { .. }), "{err:?}");
    let shown = format!("{err} {err:?}");
    assert!(shown.contains("grant timeout (10ms)"), "{shown}");
    assert!(shown.contains("127.0.0.1"), "names the store: {shown}");
    assert!(!shown.contains(secret), "password leaked: {shown}");
}

/// A waiter that gives up (its `wait_timeout`) leaves the queue: the
/// holder's release then frees the key instead of granting it to nobody.
#[tokio::test]
async fn fair_mode_a_waiter_that_times_out_leaves_the_queue() {
    let server = RedisServer::new();
    let key = unique_key("fair-timeout");
    let holder = fair_registry(&server, 2000).await;
    let waiter = fair_registry(&server, 2000).await;
    let guard = holder.lock(&key, LockOptions::default()).await.unwrap();
    let opts = LockOptions::default().wait_timeout(Duration::from_millis(300));
    let err = waiter.lock(&key, opts).await.unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    wait_until("the waiter left the queue", || {
        fair_queue(&server, &key).is_empty()
    })
    .await;
    guard.release().await.unwrap();
    let left: bool = server
        .connection()
        .exists(format!("lock:{{{key}}}"))
        .unwrap();
    assert!(!left, "released, not granted");
    let again = waiter.try_lock(&key, LockOptions::default()).await.unwrap();
    assert!(again.is_some(), "the key is free for anyone");
}

/// With a waiter queued, a key found free (its holder's lease gone without
/// a release) is the waiter's: a skip-mode attempt does not take it, and
/// never queues; the waiter takes it at its next attempt.
#[tokio::test]
async fn fair_mode_a_skip_attempt_does_not_jump_the_queue() {
    let server = RedisServer::new();
    let key = unique_key("fair-skip");
    // A 3 s grant timeout: the waiter asks again once a second.
    let holder = fair_registry(&server, 3000).await;
    let waiter = fair_registry(&server, 3000).await;
    let skipper = fair_registry(&server, 3000).await;
    let guard = holder.lock(&key, LockOptions::default()).await.unwrap();
    let waiting = tokio::spawn({
        let key = key.clone();
        // The waiter keeps the key until the end, so the skipper can never
        // find it free after the waiter's turn either.
        async move { waiter.lock(&key, LockOptions::default()).await.unwrap() }
    });
    wait_until("the waiter queued", || fair_queue(&server, &key).len() == 1).await;
    let queued = fair_queue(&server, &key);
    // The lease vanishes as if it had expired: no release, no grant.
    let () = server.connection().del(format!("lock:{{{key}}}")).unwrap();
    let skipped = skipper
        .try_lock(&key, LockOptions::default())
        .await
        .unwrap();
    assert!(
        skipped.is_none(),
        "the skip attempt took a queued waiter's turn"
    );
    // The waiter may have taken the key by its own next attempt meanwhile
    // and left the queue; the skipper must never be in it.
    let now_queued = fair_queue(&server, &key);
    assert!(
        now_queued.iter().all(|entry| queued.contains(entry)),
        "only the waiter queued: {queued:?} then {now_queued:?}"
    );
    let taken = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .expect("the waiter took the key at its next attempt")
        .unwrap();
    taken.release().await.unwrap();
    drop(guard);
}

/// Fair mode still hands a lease to the next task of the holder's process
/// while no other process waits: one script, no `DEL`.
#[tokio::test]
async fn fair_mode_hands_over_within_a_process_while_nobody_else_waits() {
    let server = RedisServer::new();
    let key = unique_key("fair-hand-over");
    let registry = fair_registry(&server, 2000).await;
    let first = registry.lock(&key, LockOptions::default()).await.unwrap();
    let next = lock_in_task(&registry, &key);
    wait_until("the next task queued locally", || {
        registry.local_queue_len(&key) == 2
    })
    .await;
    reset_stats(&server);
    let fencing = first.fencing_token();
    first.release().await.unwrap();
    let next = next.await.unwrap();
    assert!(next.fencing_token() > fencing);
    let calls = command_calls(&server);
    assert_eq!(
        calls_of(&calls, "del"),
        0,
        "released, not handed over: {calls:?}"
    );
    next.release().await.unwrap();
}

/// Fair mode: with another process's waiter queued in the store, the
/// holder's release goes to it, ahead of the holder's own next task, which
/// queued later in its process only.
#[tokio::test]
async fn fair_mode_serves_another_process_waiter_before_the_holder_own_next_task() {
    let server = RedisServer::new();
    let key = unique_key("fair-other-first");
    let here = fair_registry(&server, 2000).await;
    let there = fair_registry(&server, 2000).await;
    let first = here.lock(&key, LockOptions::default()).await.unwrap();
    let (order_tx, mut order) = tokio::sync::mpsc::unbounded_channel();
    let waiter = |registry: LockRegistry, who: &'static str| {
        let (key, order_tx) = (key.clone(), order_tx.clone());
        tokio::spawn(async move {
            let guard = registry.lock(&key, LockOptions::default()).await.unwrap();
            order_tx.send(who).unwrap();
            guard.release().await.unwrap();
        })
    };
    let remote = waiter(there, "other process");
    wait_until("the other process's waiter queued", || {
        fair_queue(&server, &key).len() == 1
    })
    .await;
    let local = waiter(here.clone(), "same process");
    wait_until("the next task queued locally", || {
        here.local_queue_len(&key) == 2
    })
    .await;
    first.release().await.unwrap();
    remote.await.unwrap();
    local.await.unwrap();
    let served: Vec<&str> = [order.recv().await.unwrap(), order.recv().await.unwrap()].into();
    assert_eq!(served, ["other process", "same process"]);
}

/// Fair mode serves shares and permits in arrival order with everyone
/// else: a reader that comes after a queued writer queues behind it, even
/// while readers hold; a release grants the writer, then the reader; a
/// freed permit goes to the first queued waiter, and a skip-mode attempt
/// never jumps the queue.
#[tokio::test]
async fn fair_mode_serves_shares_and_permits_in_arrival_order() {
    use lock_runtime::store::{
        Acquire, AcquireRequest, Claim, Lease, LockToken, LossSignal, Store,
    };
    let server = RedisServer::new();
    let store = fair_backend(&server, 500).await;
    let loss = LossSignal::new();
    let ttl = Duration::from_secs(10);
    let attempt = async |key: &str, token: LockToken, claim: Claim, waits: bool| {
        let request = AcquireRequest::new(key, token, ttl, &loss)
            .claiming(claim)
            .waiting(waits);
        store.acquire(request).await.unwrap()
    };
    let granted = |answer: Acquire| -> Box<dyn Lease> {
        match answer {
            Acquire::Acquired { lease, .. } => lease,
            other => panic!("expected the lease, got {other:?}"),
        }
    };
    let refused = |answer: Acquire| assert!(matches!(answer, Acquire::Held { .. }), "{answer:?}");
    let hex = |token: LockToken| token.to_string();

    let key = unique_key("fair-rw");
    let (first, writer, late) = (
        LockToken::random(),
        LockToken::random(),
        LockToken::random(),
    );
    let mut reader = granted(attempt(&key, first, Claim::Shared, false).await);
    refused(attempt(&key, writer, Claim::Exclusive, true).await);
    refused(attempt(&key, late, Claim::Shared, true).await);
    assert_eq!(fair_queue(&server, &key), [hex(writer), hex(late)]);
    refused(attempt(&key, LockToken::random(), Claim::Shared, false).await);
    assert!(reader.release(Duration::ZERO).await.unwrap());
    let mut write = granted(attempt(&key, writer, Claim::Exclusive, true).await);
    refused(attempt(&key, late, Claim::Shared, true).await);
    assert!(write.release(Duration::ZERO).await.unwrap());
    let mut read = granted(attempt(&key, late, Claim::Shared, true).await);
    assert!(read.release(Duration::ZERO).await.unwrap());
    assert!(fair_queue(&server, &key).is_empty());

    let key = unique_key("fair-permits");
    let two = Claim::permits(std::num::NonZeroU32::new(2).unwrap());
    let mut held: Vec<Box<dyn Lease>> = Vec::new();
    for _ in 0..2 {
        held.push(granted(
            attempt(&key, LockToken::random(), two, false).await,
        ));
    }
    let (third, fourth) = (LockToken::random(), LockToken::random());
    refused(attempt(&key, third, two, true).await);
    refused(attempt(&key, fourth, two, true).await);
    assert!(held[0].release(Duration::ZERO).await.unwrap());
    refused(attempt(&key, LockToken::random(), two, false).await);
    refused(attempt(&key, fourth, two, true).await);
    held[0] = granted(attempt(&key, third, two, true).await);
    assert_eq!(fair_queue(&server, &key), [hex(fourth)]);
    assert!(held[1].release(Duration::ZERO).await.unwrap());
    held[1] = granted(attempt(&key, fourth, two, true).await);
    for lease in &mut held {
        assert!(lease.release(Duration::ZERO).await.unwrap());
    }
}
