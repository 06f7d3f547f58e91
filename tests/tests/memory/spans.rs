//! The spans a lock makes, captured by a test subscriber and asserted:
//! names, fields, parents, and which events fall inside which span. Each
//! test runs on a current-thread runtime with its own subscriber as the
//! thread's default, so the runtime's spawned work (renewals, releases)
//! reports to it too.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use lock_runtime::{LockError, LockOptions, LockRegistry, distributed_lock};
use lock_tests::unique_key;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Instrument, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::{Layer, Registry};

/// One span as captured: its name, fields (last value recorded), parent
/// (an index into the capture) and whether it closed.
#[derive(Clone, Debug)]
struct SpanRecord {
    name: &'static str,
    fields: BTreeMap<String, String>,
    parent: Option<usize>,
    closed: bool,
}

/// One event: its message and fields, and the span it happened in.
#[derive(Clone, Debug)]
struct EventRecord {
    message: String,
    span: Option<usize>,
}

#[derive(Default)]
struct Captured {
    spans: Vec<SpanRecord>,
    events: Vec<EventRecord>,
}

/// The layer: records into `Captured`; each span's index lives in its
/// extensions (span ids are reused once closed, indices are not).
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Captured>>);

#[derive(Clone, Copy)]
struct Index(usize);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S> Layer<S> for Capture
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let span = ctx.span(id).expect("new span");
        let parent = span
            .parent()
            .and_then(|parent| parent.extensions().get::<Index>().map(|i| i.0));
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let mut captured = self.0.lock().unwrap();
        captured.spans.push(SpanRecord {
            name: attrs.metadata().name(),
            fields,
            parent,
            closed: false,
        });
        span.extensions_mut()
            .insert(Index(captured.spans.len() - 1));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).expect("recorded span");
        let Some(Index(at)) = span.extensions().get::<Index>().copied() else {
            return;
        };
        values.record(&mut Fields(&mut self.0.lock().unwrap().spans[at].fields));
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let span = ctx
            .event_span(event)
            .and_then(|span| span.extensions().get::<Index>().map(|i| i.0));
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        let message = fields.remove("message").unwrap_or_default();
        self.0
            .lock()
            .unwrap()
            .events
            .push(EventRecord { message, span });
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let span = ctx.span(&id).expect("closed span");
        if let Some(Index(at)) = span.extensions().get::<Index>().copied() {
            self.0.lock().unwrap().spans[at].closed = true;
        }
    }
}

impl Capture {
    /// Installs the capture as this thread's subscriber while the guard lives.
    ///
    /// Other tests of this binary run the lock's code at the same time on
    /// threads with no subscriber. tracing caches one interest per callsite
    /// for the whole process, and while only one dispatcher is registered
    /// it asks the registering thread's default: a callsite first reached
    /// on such a thread would be cached as never wanted, and its spans and
    /// events would never reach this capture. An anchor dispatcher that
    /// wants everything and lives as long as the process keeps two
    /// registered, so interests are asked of all of them; the interests
    /// cached before it existed are computed again.
    fn install(&self) -> tracing::subscriber::DefaultGuard {
        static ANCHOR: OnceLock<tracing::Dispatch> = OnceLock::new();
        ANCHOR.get_or_init(|| tracing::Dispatch::new(Registry::default()));
        let guard = tracing::subscriber::set_default(Registry::default().with(self.clone()));
        tracing::callsite::rebuild_interest_cache();
        guard
    }

    fn snapshot(&self) -> (Vec<SpanRecord>, Vec<EventRecord>) {
        let captured = self.0.lock().unwrap();
        (captured.spans.clone(), captured.events.clone())
    }

    /// The spans named `name`.
    fn named(&self, name: &str) -> Vec<(usize, SpanRecord)> {
        self.snapshot()
            .0
            .into_iter()
            .enumerate()
            .filter(|(_, span)| span.name == name)
            .collect()
    }

    /// The only span named `name`.
    fn one(&self, name: &str) -> (usize, SpanRecord) {
        let mut spans = self.named(name);
        assert_eq!(spans.len(), 1, "one `{name}` span: {spans:?}");
        spans.remove(0)
    }

    /// The index of the span the first event whose message starts with
    /// `message` happened in.
    fn event_span(&self, message: &str) -> Option<usize> {
        let (_, events) = self.snapshot();
        events
            .iter()
            .find(|event| event.message.starts_with(message))
            .unwrap_or_else(|| panic!("no event `{message}` in {events:?}"))
            .span
    }

    /// The spans and events as an indented tree, for reading.
    fn tree(&self) -> String {
        let (spans, events) = self.snapshot();
        let mut out = String::new();
        fn walk(
            out: &mut String,
            spans: &[SpanRecord],
            events: &[EventRecord],
            parent: Option<usize>,
            depth: usize,
        ) {
            for event in events.iter().filter(|e| e.span == parent) {
                let _ = writeln!(out, "{}- event: {}", "  ".repeat(depth), event.message);
            }
            for (at, span) in spans.iter().enumerate().filter(|(_, s)| s.parent == parent) {
                let fields: Vec<String> = span
                    .fields
                    .iter()
                    .map(|(name, value)| format!("{name}={value}"))
                    .collect();
                let _ = writeln!(
                    out,
                    "{}{} {{{}}}",
                    "  ".repeat(depth),
                    span.name,
                    fields.join(", ")
                );
                walk(out, spans, events, Some(at), depth + 1);
            }
        }
        walk(&mut out, &spans, &events, None, 0);
        out
    }
}

struct Shop {
    locks: LockRegistry,
}

impl Shop {
    #[distributed_lock(key = "stock:{item}", wait_timeout = "2s", registry = self.locks)]
    async fn buy(&self, item: &str) -> u64 {
        tracing::info!("body ran");
        lock_runtime::fencing_token().await.unwrap_or(0)
    }

    #[distributed_lock(key = "stock:{item}", wait_timeout = "100ms", registry = self.locks)]
    async fn buy_quickly(&self, item: &str) {
        let _ = item;
    }

    #[distributed_lock(key = "report:{day}", mode = "skip", registry = self.locks)]
    async fn report(&self, day: &str) {
        let _ = day;
    }

    #[distributed_lock(key = "stock:{item}", ttl = "1s", registry = self.locks)]
    async fn hang(&self, item: &str) {
        let _ = item;
        std::future::pending::<()>().await;
    }

    #[distributed_lock(keys = ["acct:{from}", "acct:{to}"], registry = self.locks)]
    async fn transfer(&self, from: &str, to: &str) {
        tracing::info!(from, to, "moved");
    }
}

/// The flagship case: a wait-mode call inside the user's request span.
/// The lock's span is a child of the request, its wait a child of it, the
/// body's event inside the lock's span, the runtime's "acquired" event
/// inside the wait; every field as documented; all closed at the end.
#[tokio::test]
async fn a_locked_call_is_a_span_inside_the_request_with_its_wait_as_a_child() {
    let capture = Capture::default();
    let _installed = capture.install();
    let shop = Shop {
        locks: LockRegistry::memory(),
    };
    let item = unique_key("sku");
    let fencing = shop
        .buy(&item)
        .instrument(tracing::info_span!("request", path = "/buy"))
        .await
        .unwrap();

    let (request, _) = capture.one("request");
    let (lock, span) = capture.one("distributed_lock");
    assert_eq!(span.parent, Some(request), "{span:?}");
    let fields: Vec<(&str, String)> = vec![
        ("key", format!("stock:{item}")),
        ("mode", "wait".into()),
        ("store", "memory".into()),
        ("fencing", fencing.to_string()),
        ("outcome", "acquired".into()),
    ];
    for (name, value) in fields {
        assert_eq!(span.fields.get(name), Some(&value), "{name}: {span:?}");
    }
    let (wait, wait_span) = capture.one("lock_wait");
    assert_eq!(wait_span.parent, Some(lock));
    assert_eq!(capture.event_span("lock acquired"), Some(wait));
    assert_eq!(capture.event_span("body ran"), Some(lock));
    assert_eq!(capture.event_span("lock released"), Some(lock));
    let (spans, _) = capture.snapshot();
    assert!(spans.iter().all(|span| span.closed), "{spans:?}");
    eprintln!("captured span tree:\n{}", capture.tree());
}

/// Skipped, timed out: the outcome says so, and no fencing token.
#[tokio::test]
async fn skipped_and_timed_out_calls_say_so() {
    let capture = Capture::default();
    let _installed = capture.install();
    let shop = Shop {
        locks: LockRegistry::memory(),
    };
    let (day, item) = (unique_key("day"), unique_key("sku"));
    let held = shop
        .locks
        .lock(&format!("report:{day}"), LockOptions::default())
        .await
        .unwrap();
    assert_eq!(shop.report(&day).await.unwrap(), None);
    let busy = shop
        .locks
        .lock(&format!("stock:{item}"), LockOptions::default())
        .await
        .unwrap();
    let err = shop.buy_quickly(&item).await.unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err}");
    held.release().await.unwrap();
    busy.release().await.unwrap();

    let outcome = |key: String| {
        let spans = capture.named("distributed_lock");
        let calls: Vec<_> = spans
            .iter()
            .filter(|(_, span)| span.fields.get("key") == Some(&key))
            .map(|(_, span)| span.clone())
            .collect();
        // The manual holder's span, then the call's.
        assert_eq!(calls.len(), 2, "{calls:?}");
        assert!(!calls[1].fields.contains_key("fencing"), "{:?}", calls[1]);
        (
            calls[1].fields["mode"].clone(),
            calls[1].fields["outcome"].clone(),
        )
    };
    assert_eq!(
        outcome(format!("report:{day}")),
        ("skip".into(), "skipped".into())
    );
    assert_eq!(
        outcome(format!("stock:{item}")),
        ("wait".into(), "timeout".into())
    );
}

/// A lease lost under a running body: the outcome becomes `lost` and the
/// runtime's warning is an event of the lock's span.
#[tokio::test]
async fn a_lost_lease_is_recorded_on_its_span() {
    let capture = Capture::default();
    let _installed = capture.install();
    let shop = Arc::new(Shop {
        locks: LockRegistry::memory(),
    });
    let item = unique_key("sku");
    let running = tokio::spawn({
        let (shop, item) = (shop.clone(), item.clone());
        async move { shop.hang(&item).await }
    });
    let key = format!("stock:{item}");
    // The store holds the lease: the body runs, or is told of the loss as
    // it starts.
    tokio::time::timeout(Duration::from_secs(5), async {
        while shop.locks.inspect(&key).await.unwrap().is_none() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the body holds the lock");
    assert!(shop.locks.force_release(&key).await.unwrap());
    let result = running.await.unwrap();
    assert!(matches!(result, Err(LockError::Lost { .. })), "{result:?}");
    let (lock, span) = capture.one("distributed_lock");
    assert_eq!(span.fields.get("outcome").map(String::as_str), Some("lost"));
    assert_eq!(capture.event_span("lease lost"), Some(lock));
}

/// `keys = [..]`: one `distributed_locks` span around a `distributed_lock`
/// per key (in locking order) and the body.
#[tokio::test]
async fn several_keys_are_one_span_around_one_per_key() {
    let capture = Capture::default();
    let _installed = capture.install();
    let shop = Shop {
        locks: LockRegistry::memory(),
    };
    let (from, to) = (unique_key("b"), unique_key("a"));
    shop.transfer(&from, &to).await.unwrap();
    let (all, span) = capture.one("distributed_locks");
    assert_eq!(
        span.fields.get("outcome").map(String::as_str),
        Some("acquired")
    );
    let each = capture.named("distributed_lock");
    assert_eq!(each.len(), 2, "{each:?}");
    assert!(
        each.iter().all(|(_, lock)| lock.parent == Some(all)),
        "{each:?}"
    );
    let keys: Vec<&str> = each
        .iter()
        .map(|(_, lock)| lock.fields["key"].as_str())
        .collect();
    let mut sorted = keys.clone();
    sorted.sort_unstable();
    assert_eq!(keys, sorted, "taken in canonical order");
    assert_eq!(capture.event_span("moved"), Some(all));
}

/// The manual API: the guard keeps the lock's span open until the
/// release, and exposes it so work under the lock can be instrumented.
#[tokio::test]
async fn a_guard_keeps_its_span_until_the_release() {
    let capture = Capture::default();
    let _installed = capture.install();
    let locks = LockRegistry::memory();
    let guard = locks
        .lock(&unique_key("manual"), LockOptions::default())
        .await
        .unwrap();
    async { tracing::info!("work under the lock") }
        .instrument(guard.span().clone())
        .await;
    let (lock, span) = capture.one("distributed_lock");
    assert!(!span.closed, "open while held");
    assert_eq!(capture.event_span("work under the lock"), Some(lock));
    guard.release().await.unwrap();
    let (_, span) = capture.one("distributed_lock");
    assert!(span.closed, "closed by the release");
    assert_eq!(capture.event_span("lock released"), Some(lock));
}
