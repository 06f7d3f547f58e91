//! Semaphores (`permits = N`) and read-write locks (`access = "read"`)
//! through the attribute and the manual API, on the memory store: limits
//! held and reached, readers together and writers alone, a waiting writer
//! ahead of new readers, one limit per key, and re-entrancy across kinds.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use lock_runtime::store::{Acquire, AcquireRequest, HandOver, Lease, Reply, Store};
use lock_runtime::{Access, LockError, LockGuard, LockOptions, LockRegistry, distributed_lock};
use lock_tests::unique_key;
use tokio::sync::{Barrier, Notify};

/// How many bodies are inside, and the most ever seen at once.
#[derive(Default)]
struct Inside {
    now: AtomicUsize,
    most: AtomicUsize,
}

impl Inside {
    fn enter(&self) {
        let now = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Enters, waits until `gate` has as many inside as it counts, leaves.
async fn together(inside: &Inside, gate: &Barrier) {
    inside.enter();
    gate.wait().await;
    inside.leave();
}

#[distributed_lock(key = "export:{k}", registry = locks, permits = 3)]
async fn export(locks: &LockRegistry, k: &str, inside: &Inside, gate: &Barrier) {
    together(inside, gate).await;
}

#[distributed_lock(key = "prices:{k}", registry = locks, access = "read")]
async fn read_prices(locks: &LockRegistry, k: &str, inside: &Inside, gate: &Barrier) {
    together(inside, gate).await;
}

/// Six callers of a semaphore of 3: three at a time get in (a barrier of
/// three lets them out only together, so the limit is reached), never a
/// fourth.
#[tokio::test]
async fn a_semaphore_admits_up_to_its_limit_and_reaches_it() {
    let locks = LockRegistry::memory();
    let k = unique_key("sem");
    let (inside, gate) = (Inside::default(), Barrier::new(3));
    let calls = (0..6).map(|_| export(&locks, &k, &inside, &gate));
    let done = tokio::time::timeout(Duration::from_secs(5), join_all(calls))
        .await
        .expect("three at a time got in together");
    assert!(done.into_iter().all(|result| result.is_ok()));
    assert_eq!(inside.most.load(Ordering::SeqCst), 3);
}

/// Readers of a key run together (three meet at a barrier inside).
#[tokio::test]
async fn readers_run_together() {
    let locks = LockRegistry::memory();
    let k = unique_key("read");
    let (inside, gate) = (Inside::default(), Barrier::new(3));
    let calls = (0..3).map(|_| read_prices(&locks, &k, &inside, &gate));
    let done = tokio::time::timeout(Duration::from_secs(5), join_all(calls))
        .await
        .expect("the readers met inside");
    assert!(done.into_iter().all(|result| result.is_ok()));
    assert_eq!(inside.most.load(Ordering::SeqCst), 3);
}

/// A writer runs alone: no reader and no other writer beside it; a reader
/// keeps writers out; a waiting writer keeps new readers out, and gets
/// the key when the readers leave.
#[tokio::test]
async fn a_writer_runs_alone_and_a_waiting_writer_holds_new_readers_off() {
    let locks = Arc::new(LockRegistry::memory());
    let key = unique_key("rw");
    let read = || LockOptions::default().access(Access::Read);
    let write = LockOptions::default;

    let writer = locks.lock(&key, write()).await.unwrap();
    assert_eq!(writer.access(), Access::Write);
    assert!(locks.try_lock(&key, read()).await.unwrap().is_none());
    assert!(locks.try_lock(&key, write()).await.unwrap().is_none());
    writer.release().await.unwrap();

    let reader = locks.lock(&key, read()).await.unwrap();
    assert_eq!(reader.access(), Access::Read);
    let second = locks
        .try_lock(&key, read())
        .await
        .unwrap()
        .expect("readers share");
    assert!(locks.try_lock(&key, write()).await.unwrap().is_none());
    let waiting = tokio::spawn({
        let (locks, key) = (locks.clone(), key.clone());
        async move { locks.lock(&key, write()).await.unwrap() }
    });
    lock_tests::until_a_reader_is_refused(&locks, &key).await;
    reader.release().await.unwrap();
    second.release().await.unwrap();
    let writer = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the writer got the key when the readers left")
        .unwrap();
    writer.release().await.unwrap();
}

/// Every caller of a semaphore key asks for one limit: another is an
/// error naming both, and nothing is left held.
#[tokio::test]
async fn a_semaphore_key_has_one_limit() {
    let locks = LockRegistry::memory();
    let key = unique_key("limit");
    let three = locks
        .lock(&key, LockOptions::default().permits(3))
        .await
        .unwrap();
    assert_eq!(three.permits(), Some(3));
    let two = locks
        .lock(&key, LockOptions::default().permits(3))
        .await
        .unwrap();
    let info = locks.inspect(&key).await.unwrap().expect("held");
    assert_eq!(
        (info.access, info.permits, info.holders),
        (Access::Write, Some(3), 2)
    );
    two.release().await.unwrap();
    let err = locks
        .try_lock(&key, LockOptions::default().permits(4))
        .await
        .unwrap_err();
    let shown = lock_tests::error_chain(&err);
    assert!(
        shown.contains("3 permits") && shown.contains("4 permits"),
        "{shown}"
    );
    three.release().await.unwrap();
    let mutex = locks.lock(&key, LockOptions::default()).await.unwrap();
    assert_eq!(mutex.permits(), None);
    mutex.release().await.unwrap();
}

/// Options that cannot make a lock are refused when the call runs.
#[tokio::test]
async fn zero_permits_or_permits_with_read_access_are_invalid_options() {
    let locks = LockRegistry::memory();
    for (opts, reason) in [
        (LockOptions::default().permits(0), "at least 1"),
        (
            LockOptions::default().permits(3).access(Access::Read),
            "cannot be combined",
        ),
    ] {
        let err = locks.lock("k", opts).await.unwrap_err();
        assert!(matches!(err, LockError::InvalidOptions { .. }), "{err:?}");
        assert!(err.to_string().contains(reason), "{err}");
    }
    assert_eq!(locks.local_keys(), 0);
}

#[distributed_lock(key = "doc:{k}", registry = locks)]
async fn edit(locks: &LockRegistry, k: &str) -> Result<(), LockError> {
    // Boxed: nested lock futures are large in a debug build.
    Box::pin(view(locks, k)).await??;
    Box::pin(edit_again(locks, k)).await
}

#[distributed_lock(key = "doc:{k}", registry = locks)]
async fn edit_again(locks: &LockRegistry, k: &str) {}

#[distributed_lock(key = "doc:{k}", registry = locks, access = "read")]
async fn view(locks: &LockRegistry, k: &str) -> Result<(), LockError> {
    Box::pin(view_again(locks, k)).await
}

#[distributed_lock(key = "doc:{k}", registry = locks, access = "read")]
async fn view_again(locks: &LockRegistry, k: &str) {}

#[distributed_lock(key = "doc:{k}", registry = locks, access = "read")]
async fn view_then_edit(locks: &LockRegistry, k: &str) -> Result<(), LockError> {
    Box::pin(edit_again(locks, k)).await
}

#[distributed_lock(key = "job:{k}", registry = locks, permits = 3)]
async fn job(locks: &LockRegistry, k: &str, nested: u32) -> Result<u64, LockError> {
    let outer = lock_runtime::fencing_token().await.unwrap();
    let inner = Box::pin(locks.with_lock(
        &format!("job:{k}"),
        LockOptions::default().permits(nested),
        async { lock_runtime::fencing_token().await.unwrap() },
    ))
    .await?;
    assert_eq!(inner, outer, "the nested call shares the permit");
    Ok(inner)
}

/// Holding write, nested reads and writes run; holding read, a nested read
/// runs and a nested write is an error at once (it could never be
/// granted); a nested call on a semaphore shares the permit, and one with
/// another limit is an error.
#[tokio::test]
async fn nested_calls_run_when_the_outer_lock_covers_them() {
    let locks = LockRegistry::memory();
    let k = unique_key("nested");
    tokio::time::timeout(Duration::from_secs(5), async {
        Box::pin(edit(&locks, &k)).await.unwrap().unwrap();
        Box::pin(view(&locks, &k)).await.unwrap().unwrap();
        let err = Box::pin(view_then_edit(&locks, &k))
            .await
            .unwrap()
            .unwrap_err();
        assert!(matches!(err, LockError::InvalidOptions { .. }), "{err:?}");
        assert!(err.to_string().contains("nested"), "{err}");
        Box::pin(job(&locks, &k, 3)).await.unwrap().unwrap();
        let err = Box::pin(job(&locks, &k, 4)).await.unwrap().unwrap_err();
        assert!(matches!(err, LockError::InvalidOptions { .. }), "{err:?}");
    })
    .await
    .expect("no nested call waited for its own task");
}

/// `force_release` frees every share of a key, and every holder is told
/// at once.
#[tokio::test]
async fn a_forced_release_frees_every_share_and_tells_every_holder() {
    let locks = LockRegistry::memory();
    let key = unique_key("forced");
    let read = || LockOptions::default().access(Access::Read);
    let (first, second) = (
        locks.lock(&key, read()).await.unwrap(),
        locks.lock(&key, read()).await.unwrap(),
    );
    assert!(locks.force_release(&key).await.unwrap());
    assert!(!first.is_held() && !second.is_held());
    let writer = locks.try_lock(&key, LockOptions::default()).await.unwrap();
    assert!(writer.is_some(), "the key is free");
}

/// A claim of another kind (a semaphore against a mutex, both ways, a read
/// lock, another limit) is `InvalidOptions` at once; a timed-out waiter
/// leaves nothing behind; a `hold_at_least` ends on time. Two registries
/// over one store.
#[tokio::test]
async fn the_claim_rule_and_a_timed_out_waiter_through_the_registry() {
    let store = lock_runtime::MemoryStore::default();
    let (a, b) = (LockRegistry::new(store.clone()), LockRegistry::new(store));
    lock_tests::scenarios::a_claim_of_another_kind_is_refused_at_once(&a, &b).await;
    lock_tests::scenarios::a_waiter_that_times_out_leaves_nothing(&a, &b).await;
    lock_tests::scenarios::hold_at_least_ends_on_time(&a, &b).await;
}

/// The memory store, counting the acquires and hand-overs that reach it;
/// with a gate, each hand-over waits there until let through.
#[derive(Debug, Default, Clone)]
struct CountingStore {
    inner: lock_runtime::MemoryStore,
    acquires: Arc<AtomicUsize>,
    /// The acquires it granted.
    grants: Arc<AtomicUsize>,
    hand_overs: Arc<AtomicUsize>,
    gate: Option<Arc<HandOverGate>>,
    /// Whether its leases issue fencing tokens on demand, as the memory
    /// store's do (else only with the grant).
    tokens_on_demand: bool,
}

/// Where a hand-over waits: `reached` is told when one arrives, `open`
/// lets it through.
#[derive(Debug, Default)]
struct HandOverGate {
    reached: Notify,
    open: Notify,
}

/// A memory store lease whose hand-overs are counted (and gated). Unless
/// told to, it issues no fencing token on demand, as a store that issues
/// every token with its grant: its holders then hand over through the
/// store (`Lease::hand_over`), never pass a hold on as it is.
#[derive(Debug)]
struct CountingLease {
    inner: Box<dyn Lease>,
    hand_overs: Arc<AtomicUsize>,
    gate: Option<Arc<HandOverGate>>,
    tokens_on_demand: bool,
}

impl Lease for CountingLease {
    fn renew(&self) -> Reply<'_, bool> {
        self.inner.renew()
    }

    fn release(&mut self, linger: Duration) -> Reply<'_, bool> {
        self.inner.release(linger)
    }

    fn hand_over(&mut self, sent_at: tokio::time::Instant) -> Reply<'_, HandOver> {
        Reply::new(async move {
            if let Some(gate) = &self.gate {
                gate.reached.notify_one();
                gate.open.notified().await;
            }
            self.hand_overs.fetch_add(1, Ordering::SeqCst);
            self.inner.hand_over(sent_at).await
        })
    }

    fn fencing_token(&self) -> Reply<'_, Option<u64>> {
        if !self.tokens_on_demand {
            return Reply::ready(Err(lock_runtime::store::StoreError::misuse(
                "tokens come with the grant",
            )));
        }
        self.inner.fencing_token()
    }

    fn others_may_wait(&self) -> bool {
        self.inner.others_may_wait()
    }
}

impl Store for CountingStore {
    lock_tests::forward_store_to!(inner);

    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> Reply<'a, Acquire> {
        self.acquires.fetch_add(1, Ordering::SeqCst);
        Reply::new(async move {
            Ok(match self.inner.acquire(request).await? {
                Acquire::Acquired { fencing, lease } => {
                    self.grants.fetch_add(1, Ordering::SeqCst);
                    Acquire::Acquired {
                        fencing,
                        lease: Box::new(CountingLease {
                            inner: lease,
                            hand_overs: self.hand_overs.clone(),
                            gate: self.gate.clone(),
                            tokens_on_demand: self.tokens_on_demand,
                        }),
                    }
                }
                other => other,
            })
        })
    }
}

/// Tasks of one process queue in the process for a semaphore's permits,
/// as they do for a mutex: no more of them ask the store at a time than it
/// has permits, and a holder that leaves while others wait hands its
/// permit to the next in the store's one round trip, so the waiters never
/// ask the store themselves.
#[tokio::test]
async fn a_semaphores_waiters_in_one_process_queue_there_for_permits_handed_over() {
    let store = CountingStore::default();
    let (acquires, hand_overs) = (store.acquires.clone(), store.hand_overs.clone());
    let locks = LockRegistry::new(store);
    let k = unique_key("queued-permits");
    let opts = LockOptions::default().permits(2);
    let first = locks.lock(&k, opts.clone()).await.unwrap();
    let second = locks.lock(&k, opts.clone()).await.unwrap();
    let mut tokens = vec![
        first.fencing_token().await.unwrap(),
        second.fencing_token().await.unwrap(),
    ];
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let (locks, k, opts) = (locks.clone(), k.clone(), opts.clone());
            tokio::spawn(async move {
                let guard = locks.lock(&k, opts).await?;
                let token = guard.fencing_token().await?;
                guard.release().await.map(|()| token)
            })
        })
        .collect();
    // Polled: nothing signals that a task joined the queue.
    let queued = async {
        while locks.local_queue_len(&k) < 6 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), queued)
        .await
        .expect("the four waiters queue behind the two holders");
    assert_eq!(
        acquires.load(Ordering::SeqCst),
        2,
        "the waiters wait in the process, not in the store"
    );
    first.release().await.unwrap();
    second.release().await.unwrap();
    for waiter in waiters {
        tokens.push(waiter.await.unwrap().unwrap());
    }
    assert_eq!(
        (
            acquires.load(Ordering::SeqCst),
            hand_overs.load(Ordering::SeqCst)
        ),
        (2, 4),
        "each waiter took up a permit handed over, and asked the store for none"
    );
    let mut distinct = tokens.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len(), 6, "a fencing token each: {tokens:?}");
    assert_eq!(locks.local_keys(), 0);
    assert_eq!(locks.inspect(&k).await.unwrap(), None, "all released");
}

/// A permit handed over for a waiter that gave up meanwhile, while the
/// semaphore's other holder keeps the key in use in this process, is
/// released at once: another process gets the place without waiting for
/// that holder to leave, or for the permit's ttl.
#[tokio::test(start_paused = true)]
async fn a_permit_handed_over_to_a_waiter_that_gave_up_is_released() {
    let gate = Arc::new(HandOverGate::default());
    let store = CountingStore {
        gate: Some(gate.clone()),
        ..CountingStore::default()
    };
    let (locks, elsewhere) = (LockRegistry::new(store.clone()), LockRegistry::new(store));
    let k = unique_key("stranded-permit");
    let opts = LockOptions::default().permits(2);
    let first = locks.lock(&k, opts.clone()).await.unwrap();
    let second = locks.lock(&k, opts.clone()).await.unwrap();
    let waiter = {
        let (locks, k) = (locks.clone(), k.clone());
        let opts = opts.clone().wait_timeout(Duration::from_secs(1));
        tokio::spawn(async move { locks.lock(&k, opts).await.map(drop) })
    };
    while locks.local_queue_len(&k) < 3 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // The first holder hands its permit over to the waiter; the hand-over
    // waits at the gate until the waiter has given up.
    let release = tokio::spawn(first.release());
    gate.reached.notified().await;
    let gave_up = waiter.await.unwrap().unwrap_err();
    assert!(matches!(gave_up, LockError::Timeout { .. }), "{gave_up:?}");
    gate.open.notify_one();
    release.await.unwrap().unwrap();
    // Released in the background: the other process's waiter is told.
    let other = elsewhere
        .lock(&k, opts.clone().wait_timeout(Duration::from_secs(5)))
        .await
        .expect("the permit nobody took up is released");
    other.release().await.unwrap();
    second.release().await.unwrap();
    assert_eq!(locks.inspect(&k).await.unwrap(), None, "all released");
}

/// A store whose leases issue fencing tokens at once, counting what
/// reaches it, and two registries over it.
fn passing_on() -> (CountingStore, LockRegistry, LockRegistry) {
    let store = CountingStore {
        tokens_on_demand: true,
        ..CountingStore::default()
    };
    let (here, elsewhere) = (
        LockRegistry::new(store.clone()),
        LockRegistry::new(store.clone()),
    );
    (store, here, elsewhere)
}

/// The lock on `key` in `locks`, taken after waiting for `elsewhere` to
/// release it: a contended lock, which passes its hold on to the tasks
/// queued behind it.
async fn after_waiting(locks: &LockRegistry, elsewhere: &LockRegistry, key: &str) -> LockGuard {
    let blocker = elsewhere.lock(key, LockOptions::default()).await.unwrap();
    let waiter = tokio::spawn({
        let (locks, key) = (locks.clone(), key.to_owned());
        async move { locks.lock(&key, LockOptions::default()).await.unwrap() }
    });
    while locks.local_queue_len(key) < 1 {
        tokio::task::yield_now().await;
    }
    blocker.release().await.unwrap();
    waiter.await.unwrap()
}

/// Tasks of one process that wait for a key and take it in turn pass the
/// hold on as it is, asking the store only for each holder's fencing
/// token: the lease stays renewed across holders that together keep it
/// for many ttls, and each holder's token is larger than the last. With
/// nobody else waiting, the hold passes on past eight in a row: one grant
/// serves all twelve holds.
#[tokio::test(start_paused = true)]
async fn a_hold_passed_on_in_a_process_stays_renewed_and_fenced_above_the_last() {
    let (store, locks, elsewhere) = passing_on();
    let key = unique_key("passed-on");
    let opts = LockOptions::default().ttl(Duration::from_millis(300));
    let blocker = elsewhere.lock(&key, opts.clone()).await.unwrap();
    let tokens = Arc::new(std::sync::Mutex::new(vec![
        blocker.fencing_token().await.unwrap(),
    ]));
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let (locks, key, opts, tokens) =
                (locks.clone(), key.clone(), opts.clone(), tokens.clone());
            tokio::spawn(async move {
                for _ in 0..3 {
                    let guard = locks.lock(&key, opts.clone()).await.unwrap();
                    let token = guard.fencing_token().await.unwrap();
                    tokens.lock().unwrap().push(token);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    assert!(guard.is_held(), "lost while passed on");
                    guard.release().await.unwrap();
                }
            })
        })
        .collect();
    while locks.local_queue_len(&key) < 4 {
        tokio::task::yield_now().await;
    }
    blocker.release().await.unwrap();
    join_all(tasks).await.into_iter().for_each(Result::unwrap);
    let tokens = tokens.lock().unwrap().clone();
    assert_eq!(tokens.len(), 13);
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    assert_eq!(
        store.hand_overs.load(Ordering::SeqCst),
        0,
        "passed on, not handed over"
    );
    assert_eq!(
        store.grants.load(Ordering::SeqCst),
        2,
        "one grant elsewhere, one for the 12 holds in this process"
    );
    assert_eq!(
        locks.inspect(&key).await.unwrap(),
        None,
        "released at the end"
    );
}

/// A hold passed on in a process goes back to the store for a waiter in
/// another process: at most eight passes in a row once it waits (the
/// hold under way when it began, and the chain's eight), and it is the
/// waiter that takes the key then, long before the process's tasks are
/// done with it.
#[tokio::test(start_paused = true)]
async fn a_hold_passed_on_goes_back_to_the_store_for_a_waiter_elsewhere() {
    const TASKS: usize = 4;
    const ROUNDS: usize = 8;
    let (_, locks, elsewhere) = passing_on();
    let key = unique_key("passed-on-fair");
    let holds = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (locks, key, holds) = (locks.clone(), key.clone(), holds.clone());
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let guard = locks.lock(&key, LockOptions::default()).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    holds.fetch_add(1, Ordering::SeqCst);
                    guard.release().await.unwrap();
                }
            })
        })
        .collect();
    while holds.load(Ordering::SeqCst) < 3 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let began = holds.load(Ordering::SeqCst);
    let guard = elsewhere.lock(&key, LockOptions::default()).await.unwrap();
    let granted = holds.load(Ordering::SeqCst);
    guard.release().await.unwrap();
    join_all(tasks).await.into_iter().for_each(Result::unwrap);
    assert!(
        granted - began <= 1 + 8,
        "the waiter elsewhere began at hold {began} and got the key at hold {granted}"
    );
    assert_eq!(holds.load(Ordering::SeqCst), TASKS * ROUNDS);
}

/// A hold passed on to a task is lost there (the store forgets it): that
/// task is told, and its turn goes to the next task of the process at
/// once, while it still has its guard.
#[tokio::test(start_paused = true)]
async fn a_hold_passed_on_and_then_lost_tells_its_holder_and_frees_its_turn() {
    let (store, locks, elsewhere) = passing_on();
    let key = unique_key("passed-on-lost");
    let first = after_waiting(&locks, &elsewhere, &key).await;
    let (holds, held) = tokio::sync::oneshot::channel();
    let (let_go, go) = tokio::sync::oneshot::channel::<()>();
    let second = tokio::spawn({
        let (locks, key) = (locks.clone(), key.clone());
        async move {
            let guard = locks.lock(&key, LockOptions::default()).await.unwrap();
            holds.send(()).unwrap();
            go.await.unwrap();
            (guard.is_held(), guard.release().await)
        }
    });
    while locks.local_queue_len(&key) < 2 {
        tokio::task::yield_now().await;
    }
    first.release().await.unwrap();
    held.await.unwrap();
    assert_eq!(
        store.hand_overs.load(Ordering::SeqCst),
        0,
        "passed on, not handed over"
    );
    let third = tokio::spawn({
        let (locks, key) = (locks.clone(), key.clone());
        let opts = LockOptions::default().wait_timeout(Duration::from_secs(1));
        async move { locks.lock(&key, opts).await?.release().await }
    });
    while locks.local_queue_len(&key) < 2 {
        tokio::task::yield_now().await;
    }
    assert!(elsewhere.force_release(&key).await.unwrap());
    third
        .await
        .unwrap()
        .expect("the lost holder's turn was given back");
    let_go.send(()).unwrap();
    let (was_held, released) = second.await.unwrap();
    assert!(!was_held);
    assert!(
        matches!(released, Err(LockError::Lost { .. })),
        "{released:?}"
    );
}

/// A waiter whose own lock would end otherwise (here a `max_hold`) does
/// not take over a hold passed on as it is: it gives it back and takes
/// its own lease, at once and fenced above the last.
#[tokio::test(start_paused = true)]
async fn a_waiter_with_other_ends_takes_its_own_lease_rather_than_a_hold_passed_on() {
    let (store, locks, elsewhere) = passing_on();
    let key = unique_key("passed-on-refused");
    let first = after_waiting(&locks, &elsewhere, &key).await;
    let before = first.fencing_token().await.unwrap();
    let acquires = store.acquires.load(Ordering::SeqCst);
    let waiter = tokio::spawn({
        let (locks, key) = (locks.clone(), key.clone());
        let opts = LockOptions::default().max_hold(Duration::from_secs(60));
        async move {
            let guard = locks.lock(&key, opts).await.unwrap();
            let token = guard.fencing_token().await.unwrap();
            guard.release().await.unwrap();
            token
        }
    });
    while locks.local_queue_len(&key) < 2 {
        tokio::task::yield_now().await;
    }
    let started = tokio::time::Instant::now();
    first.release().await.unwrap();
    let token = waiter.await.unwrap();
    assert!(token > before, "{token} after {before}");
    assert!(
        started.elapsed() < Duration::from_millis(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        store.hand_overs.load(Ordering::SeqCst),
        0,
        "passed on, then given back"
    );
    assert_eq!(
        store.acquires.load(Ordering::SeqCst),
        acquires + 1,
        "its own lease"
    );
    assert_eq!(
        locks.inspect(&key).await.unwrap(),
        None,
        "nothing left held"
    );
}
