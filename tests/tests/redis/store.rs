//! The Redis backend through the manual API, each test against its own
//! `redis-server` started on a free loopback port.

use std::time::{Duration, Instant};

use lock_runtime::store::redis::Fencing;
use lock_runtime::store::testkit::Clients;
use lock_runtime::store_contract;
use lock_runtime::{LockError, LockOptions, LockRegistry, RedisStore};
use lock_tests::{
    RedisServer, is_held, lock_and_release, measure_handoff, time_to_lock, unique_key,
    wait_for_waiter, wait_until,
};
use redis::Commands;

use super::support::{calls_of, command_calls, registry, reset_stats};

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

/// Each lock's Redis name is one hash tag (the contract suite checks that
/// such keys stay distinct): the first `{` to the first `}` is the whole
/// key, so all of a lock's names are in one slot of a cluster.
#[tokio::test]
async fn each_lock_name_is_one_hash_tag_whatever_braces_the_key_has() {
    let server = RedisServer::new();
    let registry = registry(&server).await;
    let keys = ["a{b}c", "}{", "{", "}", "x:{y}:z", "ключ:🔒:{id}"];
    let mut guards = Vec::new();
    for key in keys {
        guards.push(registry.lock(key, LockOptions::default()).await.unwrap());
    }
    let mut conn = server.connection();
    let names: Vec<Vec<u8>> = conn.keys("lock:*").unwrap();
    let locks: Vec<_> = names
        .iter()
        .filter(|name| !name.ends_with(b":fence"))
        .collect();
    assert_eq!(locks.len(), keys.len());
    for name in &locks {
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
    assert!(matches!(err, LockError::Store { .. }), "{err:?}");
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
        Err(LockError::Store { .. })
    ));
    server.restart();
    // The connection comes back by itself; allow it a few seconds.
    let deadline = Instant::now() + Duration::from_secs(10);
    let guard = loop {
        match registry.lock(&key, opts.clone()).await {
            Ok(guard) => break guard,
            Err(err) if Instant::now() < deadline => {
                assert!(matches!(err, LockError::Store { .. }), "{err:?}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(err) => panic!("no recovery after restart: {err}"),
        }
    };
    assert!(is_held(&registry, &key).await);
    guard.release().await.unwrap();
}

/// Tasks that find the connection gone all wait for one new connection:
/// the restarted server sees one command connection (and the
/// subscriber's, and this test's own), not one per task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_that_find_the_connection_gone_share_one_new_one() {
    let mut server = RedisServer::new();
    let registry = registry(&server).await;
    lock_and_release(&registry, &unique_key("gone")).await;
    server.restart();
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let registry = registry.clone();
            tokio::spawn(async move {
                let key = unique_key("gone");
                let deadline = Instant::now() + Duration::from_secs(10);
                loop {
                    match registry.lock(&key, LockOptions::default()).await {
                        Ok(guard) => return guard.release().await.unwrap(),
                        Err(err) if Instant::now() < deadline => {
                            assert!(matches!(err, LockError::Store { .. }), "{err:?}");
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        Err(err) => panic!("no recovery after the restart: {err}"),
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let stats: String = redis::cmd("INFO")
        .arg("stats")
        .query(&mut server.connection())
        .unwrap();
    let received: u64 = stats
        .lines()
        .find_map(|line| line.strip_prefix("total_connections_received:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no connection count in {stats}"));
    assert!(received <= 4, "{received} connections for 32 tasks");
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
        "took {:?}, over the {:?} bound",
        started.elapsed(),
        Duration::from_millis(700)
    );
    assert!(guard.release().await.is_err());
}

#[tokio::test]
async fn an_expired_holder_gets_lost_and_leaves_the_new_holders_lock() {
    let server = RedisServer::new();
    let (a, b) = (registry(&server).await, registry(&server).await);
    let key = unique_key("expired");
    let earlier = a.lock(&key, LockOptions::default()).await.unwrap();
    let earlier_token = earlier.fencing_token().await.unwrap();
    earlier.release().await.unwrap();
    let short = LockOptions::default()
        .ttl(Duration::from_millis(200))
        .watchdog(false);
    let first = a.lock(&key, short).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = b.lock(&key, LockOptions::default()).await.unwrap();
    // Its token never read while it held the key, the expired holder gets
    // none now: only the loss.
    assert!(matches!(
        first.fencing_token().await,
        Err(LockError::Lost { .. })
    ));
    assert!(!first.is_held());
    assert!(second.fencing_token().await.unwrap() > earlier_token);
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
    assert_eq!(guard.fencing_token().await.unwrap(), 0);
    guard.release().await.unwrap();
    let counter: bool = conn.exists(format!("lock:{{{key}}}:fence")).unwrap();
    assert!(!counter, "no counter kept with Fencing::Off");

    let bounded = build(Fencing::ExpireAfter(Duration::from_secs(60))).await;
    let key = unique_key("bounded");
    let first = bounded.lock(&key, LockOptions::default()).await.unwrap();
    let token = first.fencing_token().await.unwrap();
    first.release().await.unwrap();
    let second = bounded.lock(&key, LockOptions::default()).await.unwrap();
    assert!(second.fencing_token().await.unwrap() > token);
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
            tokens.push(guard.fencing_token().await.unwrap());
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
    // still down, a `Store` error. Either way it neither waits out the 30 s
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
        Err(err) => assert!(matches!(err, LockError::Store { .. }), "{err:?}"),
    }
    assert!(matches!(
        held.release().await,
        Err(LockError::Lost { .. }) | Err(LockError::Store { .. })
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
    let seen = std::sync::Arc::new(std::sync::Mutex::new(vec![
        first.fencing_token().await.unwrap(),
    ]));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (registry, key, seen) = (registry.clone(), key.clone(), seen.clone());
            tokio::spawn(async move {
                for _ in 0..5 {
                    let guard = registry.lock(&key, LockOptions::default()).await.unwrap();
                    let token = guard.fencing_token().await.unwrap();
                    seen.lock().unwrap().push(token);
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
    // Each holder's read of its token is a script of its own (41).
    let evalsha = calls_of(&calls, "evalsha").saturating_sub(41);
    // Without hand-overs: 41 releases + 40 acquires = 81 calls. With them,
    // most of those pairs are one hand-over script.
    assert!(
        evalsha <= 60,
        "{evalsha} scripts for 41 sections, besides the token reads: {calls:?}"
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
    assert!(matches!(err, LockError::Store { .. }), "{err:?}");
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
    assert!(matches!(err, LockError::Store { .. }), "{err:?}");
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
        tokens.push(guard.fencing_token().await.unwrap());
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
    // Long enough that a loaded machine does not lose a lease between its
    // lock and its release (which the test does not look at); the counters
    // then expire within the 5 s `wait_until` gives them.
    let ttl = Duration::from_secs(2);
    let prefix = unique_key("counters");
    // `LOCK_COUNTER_KEYS=1000000` for the full-size run. By default 25 000:
    // whether counters end with their leases does not depend on how many
    // there are, and a debug build takes a minute per 100 000.
    let keys: usize = std::env::var("LOCK_COUNTER_KEYS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(25_000);
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
