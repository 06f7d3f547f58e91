//! Redis behind Sentinel: a `redis+sentinel://` registry follows a failover
//! of the master without a restart, over TLS too (`rediss+sentinel://`);
//! grants can wait for replicas (`WAIT`). A real master, replica and three
//! Sentinels on loopback.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lock_runtime::store::StoreErrorKind;
use lock_runtime::{
    LockError, LockOptions, LockRegistry, RedisStore, distributed_lock, fencing_token,
};
use lock_tests::soak::{Fault, Soak};
use lock_tests::{RedisSentinels, RedisServer, connect_error, time_to_lock, unique_key};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

/// The critical sections run on one key: whether a holder is inside, and
/// when each ended with which token.
#[derive(Default)]
struct Sections {
    inside: AtomicBool,
    log: Mutex<Vec<(Instant, u64)>>,
    stop: AtomicBool,
}

impl Sections {
    /// Enters the critical section with the token a holder read. A holder
    /// whose read failed because the master died under it stays out, as a
    /// fenced client must; any other error fails the test.
    async fn enter(&self, token: Result<u64, LockError>) {
        match token {
            Ok(token) => self.critical(token).await,
            Err(LockError::Store { source, .. })
                if source.kind() == StoreErrorKind::Unavailable => {}
            Err(err) => panic!("reading the holder's token: {err:?}"),
        }
    }

    /// The critical section: enter, check nobody else is in, stay a moment.
    async fn critical(&self, token: u64) {
        assert!(
            !self.inside.swap(true, Ordering::SeqCst),
            "two holders inside the critical section at once"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
        self.log.lock().await.push((Instant::now(), token));
        self.inside.store(false, Ordering::SeqCst);
    }

    /// Takes turns on `key` through `registry`'s manual API until stopped.
    fn contend(self: &Arc<Self>, registry: LockRegistry, key: &str) -> JoinHandle<()> {
        let (sections, key) = (self.clone(), key.to_owned());
        tokio::spawn(async move {
            let opts = LockOptions::default()
                .ttl(Duration::from_secs(2))
                .wait_timeout(Duration::from_secs(1));
            while !sections.stop.load(Ordering::SeqCst) {
                match registry.lock(&key, opts.clone()).await {
                    Ok(guard) => {
                        sections.enter(guard.fencing_token().await).await;
                        let _ = guard.release().await;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                }
            }
        })
    }

    /// Lets `contenders` take turns on the group's first master, kills
    /// it, and checks the turns go on on the promoted replica within 10 s,
    /// never two holders at once and the tokens always rising. Returns how
    /// long after the kill the first lock came.
    async fn through_a_failover(
        &self,
        group: &mut RedisSentinels,
        contenders: Vec<JoinHandle<()>>,
    ) -> Duration {
        // Both take turns on the first master for a while...
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before = self.log.lock().await.len();
        assert!(before > 10, "only {before} sections before the failover");
        let old = group.master().announced_port();
        group.master().kill();
        let killed = Instant::now();
        // Tokens are the server's clock in microseconds, and every server
        // here shares this machine's clock: a token above this was granted
        // after the kill, so by the promoted replica.
        let killed_us = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64;
        // ...then on the promoted replica, without a restart.
        let resumed = loop {
            let log = self.log.lock().await;
            if let Some(&(at, _)) = log.iter().find(|&&(_, token)| token > killed_us) {
                break at - killed;
            }
            drop(log);
            assert!(
                killed.elapsed() < Duration::from_secs(15),
                "no lock since the master died"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert!(
            group.failed_over_from(old),
            "the Sentinels promoted the replica"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        self.stop.store(true, Ordering::SeqCst);
        for contender in contenders {
            contender.await.unwrap();
        }
        let log = self.log.lock().await;
        let tokens: Vec<u64> = log.iter().map(|&(_, token)| token).collect();
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "fencing went backwards across the failover: {tokens:?}"
        );
        eprintln!(
            "failover: {} sections, locks resumed {resumed:?} after the master died",
            log.len()
        );
        assert!(
            resumed < Duration::from_secs(10),
            "resumed after {resumed:?}"
        );
        resumed
    }
}

#[distributed_lock(key = "{key}", ttl = "2s", wait_timeout = "1s")]
async fn annotated(key: &str, sections: Arc<Sections>) {
    sections.enter(fencing_token().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_follow_a_failover_without_overlap_or_going_back() {
    let mut group = RedisSentinels::spawn();
    lock_runtime::init(LockRegistry::redis(&group.url()).await.unwrap()).unwrap();
    let key = unique_key("failover");
    let sections = Arc::new(Sections::default());
    let through_attribute = tokio::spawn({
        let (key, sections) = (key.clone(), sections.clone());
        async move {
            while !sections.stop.load(Ordering::SeqCst) {
                if annotated(&key, sections.clone()).await.is_err() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
    });
    // A second "process" on the same group, through the manual API.
    let other = LockRegistry::redis(&group.url()).await.unwrap();
    let through_guard = sections.contend(other, &key);
    sections
        .through_a_failover(&mut group, vec![through_attribute, through_guard])
        .await;
}

/// A group whose Sentinels and servers speak only TLS to clients
/// (`rediss+sentinel://`): certificates that do not fit are clear connect
/// errors naming the URL; with the group's CA, two registries take turns
/// through a failover, the new master reached over TLS too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_group_over_tls_locks_and_follows_a_failover() {
    let mut group = RedisSentinels::spawn_tls();
    let url = group.url();
    assert!(url.starts_with("rediss+sentinel://"), "{url}");
    let certs = group.certs().expect("a group over TLS");
    let (ca, other_ca) = (certs.pem("ca.crt"), certs.pem("other-ca.crt"));
    for (case, builder) in [
        ("another CA", RedisStore::builder(&url).tls_ca(&other_ca)),
        ("the system's roots", RedisStore::builder(&url)),
    ] {
        let started = Instant::now();
        let err = connect_error(builder.connect()).await;
        eprintln!("{case}: {err}");
        assert!(err.contains(&url), "{case}: {err}");
        assert!(err.to_lowercase().contains("certificate"), "{case}: {err}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{case}: {:?}",
            started.elapsed()
        );
    }
    // Plain connections to the Sentinels' TLS ports fail too: the group is
    // really TLS.
    let plain = url.replace("rediss+sentinel://", "redis+sentinel://");
    connect_error(RedisStore::connect(&plain)).await;

    let registry = async || {
        let store = RedisStore::builder(&url).tls_ca(&ca).connect().await;
        LockRegistry::new(store.unwrap())
    };
    let key = unique_key("tls-failover");
    let sections = Arc::new(Sections::default());
    let contenders = vec![
        sections.contend(registry().await, &key),
        sections.contend(registry().await, &key),
    ];
    sections.through_a_failover(&mut group, contenders).await;
}

#[tokio::test]
async fn a_grant_too_few_replicas_confirm_fails_within_its_timeout_and_is_undone() {
    let master = RedisServer::master();
    let replica = RedisServer::replica_of(&master);
    // Generous: on a loaded 2-core machine (the failover test beside it
    // runs seven servers) a healthy replica's ack once took over 500 ms.
    let timeout = Duration::from_secs(1);
    // It must be shorter than the response timeout (default 2 s), or the
    // reply could come too late to undo the grant.
    let err = RedisStore::builder(&master.url())
        .replica_acks(1, Duration::from_secs(2))
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidSettings { .. }), "{err:?}");
    let err = err.to_string();
    assert!(
        err.contains("must be shorter than the response timeout"),
        "{err}"
    );
    let backend = RedisStore::builder(&master.url())
        .replica_acks(1, timeout)
        .connect()
        .await
        .unwrap();
    let acked = LockRegistry::builder(backend).build().unwrap();
    let plain = LockRegistry::redis(&master.url()).await.unwrap();
    let key = unique_key("wait");

    // With the replica up, grants wait for it; measure what that costs.
    let timed = async |registry: &LockRegistry| {
        let started = Instant::now();
        for _ in 0..200 {
            let guard = registry.lock(&key, LockOptions::default()).await.unwrap();
            guard.release().await.unwrap();
        }
        started.elapsed() / 200
    };
    let (with, without) = (timed(&acked).await, timed(&plain).await);
    eprintln!("lock + release: {with:?} waiting for 1 replica, {without:?} without");

    replica.pause();
    let started = Instant::now();
    let err = acked
        .try_lock(&key, LockOptions::default())
        .await
        .unwrap_err();
    let took = started.elapsed();
    replica.resume();
    assert!(matches!(err, LockError::Store { .. }), "{err:?}");
    let source = std::error::Error::source(&err).unwrap().to_string();
    assert!(
        source.contains("reached 0 of the 1 replicas required"),
        "{source}"
    );
    assert!(
        took >= timeout && took < timeout + Duration::from_millis(700),
        "{took:?}"
    );
    // The grant the replica never confirmed was undone: the key is free.
    let waited = time_to_lock(&plain, &key).await;
    assert!(waited < Duration::from_secs(1), "{waited:?}");
}

#[tokio::test]
async fn fencing_survives_a_failover_to_a_replica_that_missed_the_last_grants() {
    let mut group = RedisSentinels::spawn();
    let registry = LockRegistry::redis(&group.url()).await.unwrap();
    let key = unique_key("missed");
    let mut tokens = Vec::new();
    let take = async |registry: &LockRegistry| {
        let opts = LockOptions::default().wait_timeout(Duration::from_secs(1));
        let guard = registry.lock(&key, opts).await?;
        let token = guard.fencing_token().await.unwrap();
        guard.release().await.map(|()| token)
    };
    tokens.push(take(&registry).await.unwrap());
    // Frozen, the replica cannot reconnect once the master drops its link;
    // what the master wrote before is already in the replica's socket
    // buffer, what it writes after never reaches it.
    group.replica().pause();
    let dropped: u64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query(&mut group.master().connection())
        .unwrap();
    assert_eq!(dropped, 1, "the replication link was cut");
    // These grants (and their counters) never reach the replica.
    for _ in 0..3 {
        tokens.push(take(&registry).await.unwrap());
    }
    let old = group.master().announced_port();
    group.master().kill();
    group.replica().resume();
    let deadline = Instant::now() + Duration::from_secs(20);
    let after = loop {
        match take(&registry).await {
            Ok(token) => break token,
            Err(err) => {
                assert!(
                    Instant::now() < deadline,
                    "no lock after the failover: {err}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert!(group.failed_over_from(old), "the replica was promoted");
    tokens.push(after);
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing went backwards after the failover: {tokens:?}"
    );
}

/// What `server` says it is (`ROLE`): `master`, `slave`.
fn role(server: &RedisServer) -> String {
    let reply: Vec<redis::Value> = redis::cmd("ROLE").query(&mut server.connection()).unwrap();
    match reply.first() {
        Some(redis::Value::BulkString(role)) => String::from_utf8_lossy(role).into_owned(),
        other => panic!("an unexpected ROLE reply: {other:?}"),
    }
}

/// A failed master restarted after the failover says it is a master until
/// the Sentinels demote it. A registry whose connection was to it must not
/// reconnect to the same address but ask the Sentinels: a lock it takes is
/// on the new master, where everyone else sees it. (Found by the Sentinel
/// soak: two holders of one key, neither told.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_master_restarted_after_the_failover_is_not_used() {
    let mut group = RedisSentinels::spawn();
    let old = LockRegistry::redis(&group.url()).await.unwrap();
    let key = unique_key("restarted");
    let opts = || LockOptions::default().wait_timeout(Duration::from_secs(1));
    // Its connection is to the first master now, and busy through the
    // failover (its commands failing while the master is away).
    old.lock(&key, opts())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let busy = Arc::new(AtomicBool::new(true));
    let attempts = tokio::spawn({
        let (old, busy, other) = (old.clone(), busy.clone(), unique_key("busy"));
        async move {
            while busy.load(Ordering::SeqCst) {
                if let Ok(Some(guard)) = old.try_lock(&other, LockOptions::default()).await {
                    let _ = guard.release().await;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    });
    tokio::task::block_in_place(|| group.kill_master_until_replaced());
    let restarted = tokio::task::block_in_place(|| group.restart_failed_master());
    assert_eq!(
        role(restarted),
        "master",
        "restarted, it says it is a master"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    let guard = loop {
        match old.lock(&key, opts()).await {
            Ok(guard) => break guard,
            Err(err) => {
                assert!(
                    Instant::now() < deadline,
                    "no lock after the failover: {err}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let restarted_role = role(restarted);
    let fresh = LockRegistry::redis(&group.url()).await.unwrap();
    let other = fresh.try_lock(&key, LockOptions::default()).await.unwrap();
    assert!(
        other.is_none(),
        "a registry that asked the Sentinels got a key held through the old one: \
         the old one locked on the restarted server (which said it was a {restarted_role})"
    );
    guard.release().await.unwrap();
    busy.store(false, Ordering::SeqCst);
    attempts.await.unwrap();
}

/// The Sentinels fail over with the master up (`SENTINEL FAILOVER`): the
/// old master goes on taking writes until they demote it, seconds later,
/// and a connection to it sees no error meanwhile. A holder connected to
/// it must follow the Sentinels on its own: its renewals then reach the
/// new master, and a registry that asks the Sentinels does not get the key
/// once the copy replicated before the failover would have expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_follows_the_sentinels_away_from_a_master_left_up() {
    let mut group = RedisSentinels::spawn();
    let holder = LockRegistry::redis(&group.url()).await.unwrap();
    let key = unique_key("left-up");
    // Renewed every 1.7 s: once the Sentinels moved on, the holder leaves
    // the old master within the scan's second and renews on the new one
    // well before the copy it has (renewed at most 1.7 s before) expires.
    let ttl = Duration::from_secs(5);
    let guard = holder
        .lock(&key, LockOptions::default().ttl(ttl))
        .await
        .unwrap();
    let promoted = {
        let master_port = group.master().announced_port();
        match group.current_master_port() == Some(master_port) {
            true => group.replica().url(),
            false => group.master().url(),
        }
    };
    let asked_before = owner_checks_asked(&promoted);
    let old = tokio::task::block_in_place(|| group.fail_over_leaving_the_master_up());
    let switched = Instant::now();
    // Past the lease the new master was given by replication (the old
    // master is demoted 8 s after the Sentinels first see it, at the
    // earliest).
    tokio::time::sleep(ttl + Duration::from_secs(1)).await;
    assert_eq!(
        role(old),
        "master",
        "the old master was demoted already: the test shows nothing"
    );
    assert!(
        owner_checks_asked(&promoted) > asked_before,
        "the holder did not ask the new master which owner-checked commands it has"
    );
    let fresh = LockRegistry::redis(&group.url()).await.unwrap();
    let other = fresh.try_lock(&key, LockOptions::default()).await.unwrap();
    assert!(
        other.is_none(),
        "{} ms after the Sentinels moved on, a registry that asked them got a key \
         the holder still held through the old master",
        switched.elapsed().as_millis()
    );
    assert!(guard.is_held(), "the holder was told it lost the lock");
    guard.release().await.unwrap();
}

/// How many times the server at `url` was asked which owner-checked
/// commands it has (`COMMAND INFO`).
fn owner_checks_asked(url: &str) -> u64 {
    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut conn)
        .unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_command|info:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// Semaphores and read locks work through a Sentinel group as on one
/// server: a semaphore of 2 admits two and refuses a third, read locks
/// overlap, and a writer waits for them.
#[tokio::test]
async fn semaphores_and_read_locks_work_through_sentinel() {
    let group = RedisSentinels::spawn();
    let (a, b) = (
        LockRegistry::redis(&group.url()).await.unwrap(),
        LockRegistry::redis(&group.url()).await.unwrap(),
    );
    let key = unique_key("claims");
    let two = LockOptions::default().permits(2);
    let first = a.lock(&key, two.clone()).await.unwrap();
    let second = b.lock(&key, two.clone()).await.unwrap();
    assert!(second.fencing_token().await.unwrap() > first.fencing_token().await.unwrap());
    assert!(a.try_lock(&key, two.clone()).await.unwrap().is_none());
    let info = b.inspect(&key).await.unwrap().expect("held");
    assert_eq!((info.permits, info.holders), (Some(2), 2), "{info:?}");
    first.release().await.unwrap();
    second.release().await.unwrap();

    let rw = unique_key("rw");
    let read = LockOptions::default().access(lock_runtime::Access::Read);
    let readers = (
        a.lock(&rw, read.clone()).await.unwrap(),
        b.lock(&rw, read.clone()).await.unwrap(),
    );
    assert!(
        a.try_lock(&rw, LockOptions::default())
            .await
            .unwrap()
            .is_none()
    );
    readers.0.release().await.unwrap();
    readers.1.release().await.unwrap();
    let writer = b.lock(&rw, LockOptions::default()).await.unwrap();
    writer.release().await.unwrap();
}

/// A short soak through Sentinel (see `lock_tests::soak`): worker
/// processes killed, frozen and cut off (every server and Sentinel is
/// behind a proxy) at random, the master killed (the replica promoted, the
/// old master back as its replica). Replication is
/// asynchronous, so a failover may lose the last grants: their holders may
/// overlap with the next until told, and fencing tokens keep rising. The
/// Sentinels' own doings are watched and written into the history too:
/// on a loaded machine they can lose sight of a master for a second and
/// fail over again, a lossy fault the runner did not make.
#[test]
fn workers_killed_frozen_and_cut_off_and_the_master_failed_over_never_overlap_but_as_documented() {
    const WORKER: &str = env!("CARGO_BIN_EXE_lock-worker");
    let mut group = RedisSentinels::spawn_proxied();
    let watch = group.watch();
    let report = Soak::new(WORKER, &group.url(), Duration::from_millis(500), 20)
        .cut_through(group.proxy_switches())
        .watched(watch)
        .run_with("redis sentinel", &mut || {
            group.fail_over();
            Some(Fault::lossy("master-failed-over"))
        });
    assert!(report.history.grants.len() > 50, "no progress");
}
