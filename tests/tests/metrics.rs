//! The metrics of a scripted scenario, read back from `metrics-util`'s
//! debugging recorder: every counter and histogram the crate documents,
//! with its labels, counted exactly. One test in this binary, since the
//! recorder is process-wide.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{LockError, LockOptions, LockRegistry, distributed_lock};
use lock_tests::{RedisServer, unique_key, wait_until};
use metrics_util::MetricKind;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tokio::sync::Notify;

struct Shop {
    locks: LockRegistry,
}

impl Shop {
    #[distributed_lock(key = "stock:{item}", name = "scripted", registry = self.locks)]
    async fn buy(&self, item: &str) {
        let _ = item;
    }

    #[distributed_lock(key = "stock:{item}", name = "scripted", mode = "skip", registry = self.locks)]
    async fn try_buy(&self, item: &str) {
        let _ = item;
    }

    #[distributed_lock(key = "stock:{item}", name = "scripted", wait_timeout = "50ms", registry = self.locks)]
    async fn buy_quickly(&self, item: &str) {
        let _ = item;
    }

    #[distributed_lock(key = "stock:{item}", name = "scripted", ttl = "1s", registry = self.locks)]
    async fn hang(&self, item: &str, begun: &Notify) {
        let _ = item;
        begun.notify_one();
        std::future::pending::<()>().await;
    }

    /// No `name`: labelled with its key template.
    #[distributed_lock(key = "report:{day}", registry = self.locks)]
    async fn report(&self, day: &str) {
        let _ = day;
    }
}

/// `(kind, name, labels)` of one metric.
type Id = (MetricKind, String, Vec<(String, String)>);

fn read(
    snapshot: Vec<(
        metrics_util::CompositeKey,
        Option<metrics::Unit>,
        Option<metrics::SharedString>,
        DebugValue,
    )>,
) -> BTreeMap<Id, DebugValue> {
    snapshot
        .into_iter()
        .map(|(key, _, _, value)| {
            let (kind, key) = key.into_parts();
            let mut labels: Vec<(String, String)> = key
                .labels()
                .map(|label| (label.key().to_owned(), label.value().to_owned()))
                .collect();
            labels.sort();
            ((kind, key.name().to_owned(), labels), value)
        })
        .collect()
}

fn labels(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut labels: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    labels.sort();
    labels
}

/// Runs a scenario on memory and on Redis and checks every figure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scripted_scenario_is_counted_exactly() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this binary");

    let shop = Arc::new(Shop {
        locks: LockRegistry::memory(),
    });
    let named = LockOptions::default().name("scripted");

    // 3 uncontended calls.
    for _ in 0..3 {
        shop.buy(&unique_key("sku")).await.unwrap();
    }
    // One held by hand: a skip and a timeout find it held.
    let item = unique_key("sku");
    let held = shop
        .locks
        .lock(&format!("stock:{item}"), named.clone())
        .await
        .unwrap();
    assert_eq!(shop.try_buy(&item).await.unwrap(), None);
    let err = shop.buy_quickly(&item).await.unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    held.release().await.unwrap();

    // A hand-over: the holder releases while a task of this process waits.
    let key = unique_key("handed");
    let first = shop.locks.lock(&key, named.clone()).await.unwrap();
    let waiter = tokio::spawn({
        let (shop, key, named) = (shop.clone(), key.clone(), named.clone());
        async move {
            let guard = shop.locks.lock(&key, named).await.unwrap();
            guard.release().await.unwrap();
        }
    });
    wait_until("the waiter queues", || {
        shop.locks.local_queue_len(&key) == 2
    })
    .await;
    first.release().await.unwrap();
    waiter.await.unwrap();

    // A forced release under a running body: lost, reason `store`.
    let item = unique_key("sku");
    let begun = Arc::new(Notify::new());
    let hang = tokio::spawn({
        let (shop, item, begun) = (shop.clone(), item.clone(), begun.clone());
        async move { shop.hang(&item, &begun).await }
    });
    let stuck = format!("stock:{item}");
    begun.notified().await;
    assert!(shop.locks.force_release(&stuck).await.unwrap());
    assert!(matches!(hang.await.unwrap(), Err(LockError::Lost { .. })));

    // max_hold: lost, reason `max_hold`.
    let guard = shop
        .locks
        .lock(
            &unique_key("long"),
            named
                .clone()
                .ttl(Duration::from_millis(50))
                .max_hold(Duration::from_millis(100)),
        )
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("lost at max_hold");
    let _ = guard.release().await;

    // No name: the key template.
    shop.report(&unique_key("day")).await.unwrap();

    // Redis: the key deleted under the holder; its next renewal is refused.
    let server = RedisServer::new();
    let redis = LockRegistry::redis(&server.url()).await.unwrap();
    let key = unique_key("deleted");
    let guard = redis
        .lock(&key, named.clone().ttl(Duration::from_secs(1)))
        .await
        .unwrap();
    let _: i64 = redis::cmd("DEL")
        .arg(format!("lock:{{{key}}}"))
        .query(&mut server.connection())
        .unwrap();
    tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("lost at the next renewal");
    let _ = guard.release().await;
    // A manual lock without a name.
    let guard = redis
        .lock(&unique_key("plain"), LockOptions::default())
        .await
        .unwrap();
    guard.release().await.unwrap();

    let figures = read(snapshotter.snapshot().into_vec());
    let counter = |name: &str, pairs: &[(&str, &str)]| -> u64 {
        match figures.get(&(MetricKind::Counter, name.to_owned(), labels(pairs))) {
            Some(DebugValue::Counter(n)) => *n,
            Some(other) => panic!("{name} {pairs:?} is {other:?}"),
            None => 0,
        }
    };
    let samples = |name: &str, pairs: &[(&str, &str)]| -> usize {
        match figures.get(&(MetricKind::Histogram, name.to_owned(), labels(pairs))) {
            Some(DebugValue::Histogram(values)) => values.len(),
            Some(other) => panic!("{name} {pairs:?} is {other:?}"),
            None => 0,
        }
    };
    let memory = [("store", "memory"), ("lock", "scripted")];
    let on_redis = [("store", "redis"), ("lock", "scripted")];
    let with = |base: &[(&'static str, &'static str)], reason: &'static str| {
        let mut all = base.to_vec();
        all.push(("reason", reason));
        all
    };
    // 3 calls, the hand-held one, both ends of the hand-over, the forced
    // out body, the max_hold one.
    assert_eq!(
        counter("distributed_lock_acquired_total", &memory),
        8,
        "{figures:#?}"
    );
    assert_eq!(samples("distributed_lock_wait_seconds", &memory), 8);
    assert_eq!(
        samples("distributed_lock_hold_seconds", &memory),
        8,
        "{figures:#?}"
    );
    // The skip, the timeout and the hand-over's waiter found their key held.
    assert_eq!(counter("distributed_lock_contended_total", &memory), 3);
    assert_eq!(counter("distributed_lock_skipped_total", &memory), 1);
    assert_eq!(counter("distributed_lock_timeouts_total", &memory), 1);
    assert_eq!(counter("distributed_lock_hand_overs_total", &memory), 1);
    assert_eq!(
        counter("distributed_lock_lost_total", &with(&memory, "store")),
        1
    );
    assert_eq!(
        counter("distributed_lock_lost_total", &with(&memory, "max_hold")),
        1
    );
    assert_eq!(
        counter("distributed_lock_renewals_failed_total", &memory),
        0
    );
    assert_eq!(
        counter(
            "distributed_lock_acquired_total",
            &[("store", "memory"), ("lock", "report:{day}")]
        ),
        1
    );
    assert_eq!(counter("distributed_lock_acquired_total", &on_redis), 1);
    assert_eq!(
        counter("distributed_lock_lost_total", &with(&on_redis, "refused")),
        1
    );
    assert_eq!(
        counter("distributed_lock_renewals_failed_total", &on_redis),
        1
    );
    assert_eq!(samples("distributed_lock_hold_seconds", &on_redis), 1);
    assert_eq!(
        counter(
            "distributed_lock_acquired_total",
            &[("store", "redis"), ("lock", "unnamed")]
        ),
        1
    );
    // Never the rendered key: every `lock` label is a name or a template.
    for (_, _, pairs) in figures.keys() {
        for (label, value) in pairs {
            assert!(
                !(label == "lock" && value.contains(':') && !value.contains('{')),
                "a rendered key as a label: {value}"
            );
        }
    }
}
