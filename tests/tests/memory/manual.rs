//! The manual API (`lock`, `try_lock`, guards) on the memory backend, and
//! the backend contract for `MemoryStore`.

use std::sync::Arc;
use std::time::Duration;

use lock_runtime::store::Store;
use lock_runtime::store::testkit::Clients;
use lock_runtime::store_contract;
use lock_runtime::{LockError, LockOptions, LockRegistry, MemoryStore};
use lock_tests::{is_held, unique_key};
use tokio::time::Instant;

async fn memory() -> Clients {
    let store = MemoryStore::new();
    Clients::new(Arc::new(store.clone()), Arc::new(store), ())
}

store_contract!(memory_contract, memory);

/// Two registries over one store: two "processes" sharing a lock server.
fn two_processes() -> (LockRegistry, LockRegistry) {
    let store = MemoryStore::new();
    let a = LockRegistry::builder(store.clone()).build().unwrap();
    let b = LockRegistry::builder(store).build().unwrap();
    (a, b)
}

#[tokio::test(start_paused = true)]
async fn a_waiter_is_woken_by_the_release_not_by_the_ttl() {
    let (a, b) = two_processes();
    let key = unique_key("handoff");
    let held = a.lock(&key, LockOptions::default()).await.unwrap();
    let waiter = tokio::spawn({
        let key = key.clone();
        async move {
            let guard = b.lock(&key, LockOptions::default()).await.unwrap();
            let at = Instant::now();
            guard.release().await.unwrap();
            at
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let released_at = Instant::now();
    held.release().await.unwrap();
    let acquired_at = waiter.await.unwrap();
    // The holder's lease had 29.9 s left: only the notification explains this.
    assert!(
        acquired_at - released_at < Duration::from_millis(1),
        "{:?}",
        acquired_at - released_at
    );
}

#[tokio::test(start_paused = true)]
async fn a_waiter_takes_over_a_crashed_holders_lease_at_its_expiry() {
    let (a, b) = two_processes();
    let key = unique_key("crash");
    let opts = LockOptions::default()
        .ttl(Duration::from_millis(300))
        .watchdog(false);
    let guard = a.lock(&key, opts.clone()).await.unwrap();
    // A crash: the holder vanishes without releasing (no runtime to run Drop's release).
    std::mem::forget(guard);
    let started = Instant::now();
    let guard = b.lock(&key, LockOptions::default()).await.unwrap();
    let waited = started.elapsed();
    assert!(waited <= Duration::from_millis(350), "{waited:?}");
    guard.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_holder_whose_lease_expired_gets_lost_and_leaves_the_next_lock_alone() {
    let (a, b) = two_processes();
    let key = unique_key("expired");
    let short = LockOptions::default()
        .ttl(Duration::from_millis(200))
        .watchdog(false);
    let first = a.lock(&key, short).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!first.is_held());
    let second = b
        .try_lock(&key, LockOptions::default())
        .await
        .unwrap()
        .expect("expired lease is free");
    assert!(second.fencing_token().await.unwrap() > first.fencing_token().await.unwrap());
    assert!(matches!(first.release().await, Err(LockError::Lost { .. })));
    assert!(second.is_held());
    assert!(is_held(&a, &key).await, "second lock intact");
    second.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn hold_at_least_keeps_the_lock_after_an_early_release() {
    let (a, b) = two_processes();
    let key = unique_key("hold");
    let opts = LockOptions::default()
        .ttl(Duration::from_secs(10))
        .hold_at_least(Duration::from_secs(2));
    let guard = a.lock(&key, opts).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    guard.release().await.unwrap();
    assert!(is_held(&b, &key).await, "held for the minimum");
    tokio::time::sleep(Duration::from_millis(1400)).await;
    assert!(is_held(&b, &key).await, "still within 2s");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        b.try_lock(&key, LockOptions::default())
            .await
            .unwrap()
            .is_some(),
        "free after 2s"
    );
}

#[tokio::test(start_paused = true)]
async fn tasks_of_one_process_queue_locally_in_order() {
    let registry = LockRegistry::memory();
    let key = unique_key("queue");
    let first = registry.lock(&key, LockOptions::default()).await.unwrap();
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..5 {
        let (registry, key, order) = (registry.clone(), key.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let guard = registry.lock(&key, LockOptions::default()).await.unwrap();
            order.lock().unwrap().push(i);
            guard.release().await.unwrap();
        }));
        // Let waiter i queue before waiter i + 1 starts.
        tokio::task::yield_now().await;
    }
    assert!(is_held(&registry, &key).await);
    first.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
    assert_eq!(
        *order.lock().unwrap(),
        vec![0, 1, 2, 3, 4],
        "first come, first served"
    );
    assert_eq!(registry.local_keys(), 0, "queue freed once unused");
}

#[tokio::test(start_paused = true)]
async fn cancelled_waiters_leave_no_state_behind() {
    let store = MemoryStore::new();
    let registry = LockRegistry::builder(store.clone()).build().unwrap();
    let key = unique_key("cancelled");
    let guard = registry.lock(&key, LockOptions::default()).await.unwrap();
    let waiters: Vec<_> = (0..10)
        .map(|_| {
            let (registry, key) = (registry.clone(), key.clone());
            tokio::spawn(async move { registry.lock(&key, LockOptions::default()).await.map(drop) })
        })
        .collect();
    tokio::task::yield_now().await;
    for waiter in &waiters {
        waiter.abort();
    }
    for waiter in waiters {
        assert!(waiter.await.unwrap_err().is_cancelled());
    }
    let timed_out = registry
        .lock(
            &key,
            LockOptions::default().wait_timeout(Duration::from_millis(20)),
        )
        .await;
    assert!(matches!(timed_out, Err(LockError::Timeout { .. })));
    guard.release().await.unwrap();
    assert_eq!(registry.local_keys(), 0);
    assert_eq!(store.tracked_keys(), 0);
}

#[tokio::test]
async fn a_namespace_separates_registries_on_one_store() {
    let store = MemoryStore::new();
    let shop = LockRegistry::builder(store.clone())
        .namespace("shop")
        .build()
        .unwrap();
    let billing = LockRegistry::builder(store.clone())
        .namespace("billing")
        .build()
        .unwrap();
    let plain = LockRegistry::builder(store).build().unwrap();
    let g1 = shop.lock("stock:1", LockOptions::default()).await.unwrap();
    let g2 = billing
        .lock("stock:1", LockOptions::default())
        .await
        .unwrap();
    // A user key that spells another namespace's key does not reach it...
    assert!(
        plain
            .try_lock("shop:stock:1", LockOptions::default())
            .await
            .unwrap()
            .is_none()
    );
    // ...because namespaced keys are `ns:key` and a namespace has no colon.
    let bad = LockRegistry::builder(MemoryStore::new())
        .namespace("a:b")
        .build();
    assert!(matches!(bad, Err(LockError::InvalidKey { .. })));
    g1.release().await.unwrap();
    g2.release().await.unwrap();
}

#[tokio::test]
async fn invalid_options_name_the_key_and_problem() {
    let registry = LockRegistry::memory();
    let err = registry
        .lock("report", LockOptions::default().ttl(Duration::ZERO))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid options for lock `report`: `ttl` 0ns is shorter than 1ms"
    );
    let err = registry
        .try_lock(
            "report",
            LockOptions::default().wait_timeout(Duration::from_secs(1)),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidOptions { .. }), "{err}");
    assert_eq!(registry.local_keys(), 0, "nothing held after bad input");
}

#[tokio::test(start_paused = true)]
async fn a_guard_whose_lease_is_lost_no_longer_blocks_its_own_process() {
    let registry = LockRegistry::memory();
    let key = unique_key("lost-local");
    let short = LockOptions::default()
        .ttl(Duration::from_millis(200))
        .watchdog(false);
    let stale = registry.lock(&key, short).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!stale.is_held());
    // Same process, same task, stale guard not yet released: not blocked.
    let opts = LockOptions::default().wait_timeout(Duration::from_millis(50));
    let fresh = registry.lock(&key, opts).await.unwrap();
    assert!(matches!(stale.release().await, Err(LockError::Lost { .. })));
    assert!(fresh.is_held());
    fresh.release().await.unwrap();
    assert_eq!(registry.local_keys(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_overs_within_a_process_give_other_processes_their_turn() {
    let (a, b) = two_processes();
    let key = unique_key("fair");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (done, mut progress) = tokio::sync::watch::channel(0u64);
    // Process A: four tasks that take the lock again and again, so there is
    // always a local waiter to hand the lease to.
    let hammers: Vec<_> = (0..4)
        .map(|_| {
            let (a, key, stop, done) = (a.clone(), key.clone(), stop.clone(), done.clone());
            tokio::spawn(async move {
                let mut sections = 0u64;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let guard = a.lock(&key, LockOptions::default()).await.unwrap();
                    tokio::task::yield_now().await;
                    guard.release().await.unwrap();
                    sections += 1;
                    done.send_modify(|done| *done += 1);
                }
                sections
            })
        })
        .collect();
    // Once every hammer has been through the lock, process B asks for it.
    progress.wait_for(|done| *done >= 4).await.unwrap();
    // Process B still gets the lock: A releases for real every few hand-overs.
    let opts = LockOptions::default().wait_timeout(Duration::from_secs(5));
    let mut fencing = Vec::new();
    for _ in 0..5 {
        let guard = b
            .lock(&key, opts.clone())
            .await
            .expect("B starved by A's hand-overs");
        fencing.push(guard.fencing_token().await.unwrap());
        guard.release().await.unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut total = 0;
    for hammer in hammers {
        total += hammer.await.unwrap();
    }
    assert!(total > 0);
    assert!(fencing.windows(2).all(|w| w[0] < w[1]), "{fencing:?}");
}

#[tokio::test(start_paused = true)]
async fn a_lease_handed_to_a_waiter_that_left_is_released() {
    let store = MemoryStore::new();
    let registry = LockRegistry::builder(store.clone()).build().unwrap();
    let other = LockRegistry::builder(store.clone()).build().unwrap();
    let key = unique_key("baton");
    let held = registry.lock(&key, LockOptions::default()).await.unwrap();
    let waiter = tokio::spawn({
        let (registry, key) = (registry.clone(), key.clone());
        async move { registry.lock(&key, LockOptions::default()).await.map(drop) }
    });
    tokio::task::yield_now().await;
    // The release hands the lease to the waiter, which is cancelled before
    // it runs again: the lease must be released, not left for its 30 s ttl.
    held.release().await.unwrap();
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    let started = Instant::now();
    let guard = other
        .lock(
            &key,
            LockOptions::default().wait_timeout(Duration::from_secs(1)),
        )
        .await
        .unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(10),
        "took {:?}, over the {:?} bound",
        started.elapsed(),
        Duration::from_millis(10)
    );
    guard.release().await.unwrap();
    assert_eq!(registry.local_keys(), 0);
    assert_eq!(store.tracked_keys(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_forced_release_tells_the_holder_at_once_and_frees_its_turn() {
    let (a, b) = two_processes();
    let key = unique_key("forced");
    let held = a.lock(&key, LockOptions::default()).await.unwrap();
    assert!(b.force_release(&key).await.unwrap());
    // Pushed by the store: known lost without waiting for a renewal.
    assert!(!held.is_held());
    // The process's turn was given back with it: another task of A gets in.
    let opts = LockOptions::default().wait_timeout(Duration::from_millis(50));
    let next = a.lock(&key, opts).await.unwrap();
    assert!(next.fencing_token().await.unwrap() > held.fencing_token().await.unwrap());
    assert!(matches!(held.release().await, Err(LockError::Lost { .. })));
    assert!(
        next.is_held(),
        "the stale guard's release left the new lock alone"
    );
    next.release().await.unwrap();
    assert!(
        !b.force_release(&key).await.unwrap(),
        "nothing left to free"
    );
}

#[tokio::test(start_paused = true)]
async fn options_a_store_cannot_honour_name_the_store_and_the_reason() {
    let registry = LockRegistry::memory();
    let err = registry
        .lock(
            "report",
            LockOptions::default().ttl(Duration::from_micros(20_500)),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid options for lock `report`: ttl 20.5ms is not a whole number of 1ms, the unit the memory store counts ttls in"
    );
    let err = registry
        .lock(
            "report",
            LockOptions::default().ttl(Duration::from_millis(5)),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid options for lock `report`: ttl 5ms is shorter than the memory store's minimum 10ms"
    );
    assert_eq!(registry.local_keys(), 0, "nothing held after bad input");
}

/// A store whose renewals wait at a gate (or a set time), whose grants may
/// come late, and which records, in order, when a renewal was sent and
/// answered and when a release was sent.
mod gated {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use lock_runtime::MemoryStore;
    use lock_runtime::store::{Acquire, AcquireRequest, Lease, Reply, Store};
    use tokio::sync::Notify;

    #[derive(Debug, Default)]
    pub(super) struct Gate {
        pub(super) events: Mutex<Vec<&'static str>>,
        /// Told when a renewal reaches the gate.
        pub(super) renewing: Notify,
        /// Lets the renewal waiting at the gate through.
        pub(super) open: Notify,
    }

    impl Gate {
        fn record(&self, event: &'static str) {
            self.events.lock().unwrap().push(event);
        }
    }

    #[derive(Debug)]
    pub(super) struct GatedStore {
        pub(super) inner: MemoryStore,
        pub(super) gate: Arc<Gate>,
        /// How many of the next grants are answered late.
        pub(super) late_grants: AtomicU32,
        /// How long after the memory store's answer a late grant is answered.
        pub(super) grant_delay: Duration,
        /// How long a renewal takes; `None`: it waits at the gate.
        pub(super) renewal_delay: Option<Duration>,
    }

    #[derive(Debug)]
    struct GatedLease {
        inner: Box<dyn Lease>,
        gate: Arc<Gate>,
        renewal_delay: Option<Duration>,
    }

    impl Lease for GatedLease {
        fn renew(&self) -> Reply<'_, bool> {
            Reply::new(async move {
                self.gate.record("renewal sent");
                match self.renewal_delay {
                    Some(delay) => tokio::time::sleep(delay).await,
                    None => {
                        self.gate.renewing.notify_one();
                        self.gate.open.notified().await;
                    }
                }
                let renewed = self.inner.renew().await;
                self.gate.record("renewal answered");
                renewed
            })
        }

        fn release(&mut self, linger: Duration) -> Reply<'_, bool> {
            Reply::new(async move {
                self.gate.record("release sent");
                self.inner.release(linger).await
            })
        }

        fn fencing_token(&self) -> Reply<'_, Option<u64>> {
            self.inner.fencing_token()
        }

        fn others_may_wait(&self) -> bool {
            self.inner.others_may_wait()
        }
    }

    impl Store for GatedStore {
        lock_tests::forward_store_to!(inner);

        fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> Reply<'a, Acquire> {
            Reply::new(async move {
                Ok(match self.inner.acquire(request).await? {
                    Acquire::Acquired { fencing, lease } => {
                        let late = self.late_grants.fetch_update(
                            Ordering::SeqCst,
                            Ordering::SeqCst,
                            |late| late.checked_sub(1),
                        );
                        if late.is_ok() {
                            tokio::time::sleep(self.grant_delay).await;
                        }
                        Acquire::Acquired {
                            fencing,
                            lease: Box::new(GatedLease {
                                inner: lease,
                                gate: self.gate.clone(),
                                renewal_delay: self.renewal_delay,
                            }),
                        }
                    }
                    other => other,
                })
            })
        }
    }
}

/// The runtime renews a lease with no lock around the store's handle, yet
/// a release never overtakes a renewal in flight: it waits for its answer,
/// so no renewal reaches the store after the release (which could extend
/// a lease just released, or one shortened for `hold_at_least`).
#[tokio::test(start_paused = true)]
async fn a_release_waits_for_the_renewal_in_flight() {
    let gate = Arc::new(gated::Gate::default());
    let store = gated::GatedStore {
        inner: MemoryStore::new(),
        gate: gate.clone(),
        late_grants: 0.into(),
        grant_delay: Duration::ZERO,
        renewal_delay: None,
    };
    let registry = LockRegistry::new(store);
    let key = unique_key("renewing");
    let options = LockOptions::default().ttl(Duration::from_millis(300));
    let guard = registry.lock(&key, options).await.unwrap();
    // The first renewal, a third of the ttl in, waits at the gate.
    gate.renewing.notified().await;
    let release = tokio::spawn(guard.release());
    // Every chance to overtake the renewal.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!release.is_finished(), "the release waits for the renewal");
    gate.open.notify_one();
    release.await.unwrap().unwrap();
    assert_eq!(
        *gate.events.lock().unwrap(),
        ["renewal sent", "renewal answered", "release sent"]
    );
    assert!(!is_held(&registry, &key).await, "released");
}

/// A grant answered after its lease could no longer be counted on (the ttl
/// less the store's margin, from the request), though the store still
/// holds it for another moment, is renewed at once and counts from the
/// renewal. Not renewed in time, it is no lock: it is given back and asked
/// for again, by a waiter while its wait lasts (then `Timeout`), in skip
/// mode three times before the call fails with a store error naming the
/// key.
#[tokio::test(start_paused = true)]
async fn a_grant_answered_after_its_lease_ran_out_is_renewed_or_given_back() {
    let ttl = Duration::from_secs(1);
    let margin = ttl - MemoryStore::new().capabilities().valid_for(ttl);
    let registry = |gate: &Arc<gated::Gate>, late_grants: u32, renewal: Duration| {
        LockRegistry::new(gated::GatedStore {
            inner: MemoryStore::new(),
            gate: gate.clone(),
            late_grants: late_grants.into(),
            grant_delay: ttl - margin / 2,
            renewal_delay: Some(renewal),
        })
    };
    let key = unique_key("late");
    let options = LockOptions::default().ttl(ttl);
    let round = ["renewal sent", "renewal answered", "release sent"];

    let gate = Arc::new(gated::Gate::default());
    let renewed = registry(&gate, 1, Duration::ZERO);
    let guard = renewed.lock(&key, options.clone()).await.unwrap();
    assert_eq!(
        *gate.events.lock().unwrap(),
        ["renewal sent", "renewal answered"]
    );
    assert!(guard.release().await.is_ok(), "held from the renewal");

    let gate = Arc::new(gated::Gate::default());
    let slow = registry(&gate, u32::MAX, ttl);
    let waiting = options.clone().wait_timeout(ttl * 9 / 2);
    let err = slow.lock(&key, waiting).await.unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    assert_eq!(*gate.events.lock().unwrap(), round.repeat(2));

    let gate = Arc::new(gated::Gate::default());
    let slow = registry(&gate, u32::MAX, ttl);
    let err = slow.try_lock(&key, options).await.unwrap_err();
    assert!(matches!(err, LockError::Store { .. }), "{err:?}");
    let cause = std::error::Error::source(&err).map(ToString::to_string);
    assert!(
        err.to_string().contains(&key)
            && cause
                .as_ref()
                .is_some_and(|c| c.contains("did not renew it in time (3 times running)")),
        "{err}: {cause:?}"
    );
    assert_eq!(*gate.events.lock().unwrap(), round.repeat(3));
    assert_eq!(slow.local_keys(), 0, "nothing held");
}
