//! The renewer: renewals on time, losses on time, no task per lock.

use super::renewer::IDLE_PERIOD;
use super::*;

/// A lease that is always renewed, counting its renewals and losses
/// (clones count together).
#[derive(Clone)]
struct Held {
    span: tracing::Span,
    renewals: Arc<std::sync::atomic::AtomicUsize>,
    losses: Arc<std::sync::atomic::AtomicUsize>,
    /// The last deadline the holder was told.
    ends: Arc<std::sync::Mutex<Option<(Instant, &'static str)>>>,
}

impl Default for Held {
    fn default() -> Self {
        Held {
            span: tracing::Span::none(),
            renewals: Arc::default(),
            losses: Arc::default(),
            ends: Arc::default(),
        }
    }
}

impl Renewable for Held {
    fn key(&self) -> &str {
        "k"
    }

    fn renew(&self) -> Reply<'_, bool> {
        self.renewals.fetch_add(1, Ordering::SeqCst);
        Reply::ready(Ok(true))
    }

    fn lose(&self, _: &'static str) {
        self.losses.fetch_add(1, Ordering::SeqCst);
    }

    fn ends_at(&self, at: i64, why: Deadline) {
        let at = crate::store::ticks::instant(at);
        *self.ends.lock().unwrap() = Some((at, why.reason()));
    }

    fn span(&self) -> &tracing::Span {
        &self.span
    }

    fn renewal_failed(&self) {}

    fn has_signal(&self, _: usize) -> bool {
        false
    }

    fn lease_lost(&self, _: &'static str) {}
}

/// A 30 s lease taken now, renewed every 10 s.
fn schedule() -> Schedule {
    Schedule {
        ttl: Duration::from_secs(30),
        valid_for: Duration::from_secs(29),
        renew: true,
        max_hold: None,
        started_at: Instant::now(),
    }
}

/// `owner` as a registry's identity.
fn weak(owner: &Arc<()>) -> Weak<dyn Send + Sync> {
    Arc::downgrade(owner) as Weak<dyn Send + Sync>
}

fn hold(owner: &Arc<()>) -> Renewal<Held> {
    Renewal::start(&weak(owner), schedule(), Held::default(), None)
}

/// Short locks taken after the renewer went idle wake its task once,
/// not once each (each wake-up costs thread wake-ups on a multi-thread
/// runtime).
#[tokio::test(start_paused = true)]
async fn short_locks_after_an_idle_spell_wake_the_task_once() {
    let owner = Arc::new(());
    let first = hold(&owner);
    let renewer = first.looked_after().0.clone();
    first.stop();
    drop(first);
    // Idle for longer than its idle period.
    tokio::time::sleep(IDLE_PERIOD * 3).await;
    let before = renewer.wakes.load(Ordering::SeqCst);
    for _ in 0..100 {
        let lock = hold(&owner);
        lock.stop();
        drop(lock);
        // The task runs after the release (on a multi-thread runtime,
        // on another thread meanwhile), and finds the slab empty.
        tokio::task::yield_now().await;
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let wakes = renewer.wakes.load(Ordering::SeqCst) - before;
    assert!(wakes <= 1, "{wakes} wake-ups for 100 short locks");
}

/// Timers freed by releases are taken again, the task renews what is
/// still held (and only that), and the timers a burst left free at the
/// end of the slab are given back when the task next looks.
#[tokio::test(start_paused = true)]
async fn freed_timers_are_taken_again_and_a_burst_gives_them_back() {
    let owner = Arc::new(());
    let burst: Vec<Renewal<Held>> = (0..64).map(|_| hold(&owner)).collect();
    let renewer = burst[0].looked_after().0.clone();
    let timers = || lock(&renewer.state).timers.len();
    assert_eq!(timers(), 64);
    for renewal in &burst[1..] {
        renewal.stop();
    }
    // Freed timers are taken again before the slab grows.
    let again = hold(&owner);
    assert_eq!(timers(), 64, "a freed timer was taken");
    again.stop();
    drop(again);
    // The first lock is still held: the task renews it at ttl / 3,
    // and gives back the free timers past it.
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(timers(), 1, "the burst's timers were given back");
    let held = lock(&renewer.state).timers[0]
        .as_ref()
        .and_then(|timer| timer.due)
        .expect("the held lock is due again after its renewal");
    assert!(held.at > Instant::now(), "its next renewal is ahead");
    drop(burst);
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(timers(), 0);
}

/// Many leases taken at different times: the task renews them in
/// batches (each may go a sixteenth of its interval early), so it looks
/// at the slab a few times per interval, not once per lease (each look
/// reads every timer), and every lease is still renewed in time.
#[tokio::test(start_paused = true)]
async fn many_leases_are_renewed_in_batches() {
    let owner = Arc::new(());
    let held = Held::default();
    let (renewals, losses) = (held.renewals.clone(), held.losses.clone());
    let mut leases = Vec::new();
    for _ in 0..1_000 {
        leases.push(Renewal::start(
            &weak(&owner),
            schedule(),
            held.clone(),
            None,
        ));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let renewer = leases[0].looked_after().0.clone();
    let before = lock(&renewer.state).looks;
    // Three intervals: every lease is due three times.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let looks = lock(&renewer.state).looks - before;
    let renewed = renewals.load(Ordering::SeqCst);
    assert!(renewed >= 3 * 1_000, "{renewed} renewals of 1000 leases");
    assert_eq!(losses.load(Ordering::SeqCst), 0, "a lease was lost");
    assert!(looks <= 60, "the task looked {looks} times");
    for lease in &leases {
        lease.stop();
    }
}

/// The holder is told when it stops counting on its lease: at the start,
/// again after each renewal, and `max_hold` when that comes first.
#[tokio::test(start_paused = true)]
async fn the_holder_is_told_its_deadline_and_each_new_one() {
    let owner = Arc::new(());
    let held = Held::default();
    let ends = held.ends.clone();
    let start = Instant::now();
    let renewal = Renewal::start(&weak(&owner), schedule(), held, None);
    let told = || *ends.lock().unwrap();
    assert_eq!(
        told(),
        Some((start + Duration::from_secs(29), reason::LATE))
    );
    // Renewed at 10 s: valid 29 s from then.
    tokio::time::sleep(Duration::from_millis(10_500)).await;
    let (at, why) = told().unwrap();
    assert!(at >= start + Duration::from_secs(38), "{:?}", at - start);
    assert_eq!(why, reason::LATE);
    drop(renewal);
    let capped = Held::default();
    let ends = capped.ends.clone();
    let mut schedule = schedule();
    schedule.max_hold = Some(Duration::from_secs(5));
    let _renewal = Renewal::start(&weak(&owner), schedule, capped, None);
    let told = *ends.lock().unwrap();
    assert_eq!(
        told,
        Some((
            start + Duration::from_millis(10_500) + Duration::from_secs(5),
            reason::MAX_HOLD
        ))
    );
}

/// A released lease's renewal looks after the next lease of the same
/// registry, renewing it as a new one; another registry's lease gets
/// one of its own.
#[tokio::test(start_paused = true)]
async fn a_released_renewal_serves_the_next_lease_of_its_registry_only() {
    let (owner, other) = (Arc::new(()), Arc::new(()));
    let owner_id = Arc::as_ptr(&owner) as usize;
    let mut first = hold(&owner);
    let first_entry = Arc::as_ptr(first.entry());
    first.take_held().await;
    let spare = first
        .into_spare(owner_id, None)
        .expect("unshared once taken");

    let next = Held::default();
    let renewals = next.renewals.clone();
    let second = Renewal::start(&weak(&owner), schedule(), next, Some(spare));
    assert_eq!(Arc::as_ptr(second.entry()), first_entry);
    let reuses = |renewal: &Renewal<Held>| renewal.looked_after().0.reuses.load(Ordering::SeqCst);
    assert_eq!(reuses(&second), 1, "the allocation is used again");
    assert!(!second.entry().is_stopped(), "and started again");
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(renewals.load(Ordering::SeqCst), 1, "renewed as a new lease");

    let owners_renewer = second.looked_after().0.clone();
    let mut second = second;
    second.take_held().await;
    let spare = second
        .into_spare(owner_id, None)
        .expect("unshared once taken");
    let third = Renewal::start(&weak(&other), schedule(), Held::default(), Some(spare));
    assert_eq!(reuses(&third), 0);
    assert!(
        !Arc::ptr_eq(&third.looked_after().0, &owners_renewer),
        "another registry's lease has a renewer of its own"
    );
}
