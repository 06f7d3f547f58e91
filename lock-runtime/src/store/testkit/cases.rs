//! The cases of the contract, one public async fn each.

use super::*;
use std::time::Instant;

/// Only one holder at a time; a repeated attempt by the holder's token gets
/// the same answer; a refusal says how long the lease has left.
pub async fn acquire_is_exclusive(store: &Clients) {
    let key = unique_key("contract");
    let (a, b) = (LockToken::random(), LockToken::random());
    let (mut lease, first) = granted(attempt(&store.a, &key, a, TTL).await);
    // A store that counts leases says how long this one has left.
    if let Some(left) = refused(attempt(&store.b, &key, b, TTL).await) {
        assert!(left <= TTL && left > TTL / 2, "{left:?}");
    }
    // The same token again (a retried request) gets the same answer.
    let (_, again) = granted(attempt(&store.a, &key, a, TTL).await);
    assert_eq!(again, first);
    refused(attempt(&store.b, &key, b, TTL).await);
    assert!(lease.release(Duration::ZERO).await.unwrap());
}

/// Keys that a store's naming could fold together are distinct locks:
/// keys that differ only in an escape, a separator, a hash-tag brace, a
/// quote, a NUL or a non-ASCII character, keys that begin with another
/// key, and keys as long as a registry allows ([`MAX_KEY_LEN`](crate::store::MAX_KEY_LEN)).
/// All are held at once, each refuses a second holder, and releasing some
/// leaves the others held.
pub async fn keys_of_any_characters_stay_distinct(store: &Clients) {
    let base = unique_key("contract");
    let long = "k".repeat(crate::store::MAX_KEY_LEN - base.len());
    let shorter = &long[1..];
    let endings = [
        "",
        "x",
        "/x",
        "\0x",
        "\0",
        "%00x",
        "%2500x",
        "%",
        "%25",
        "a{b}c",
        "a%7Bb%7Dc",
        "}{",
        "{",
        "}",
        ":y:z",
        ":y",
        "/..",
        "/.",
        "%2F..",
        " é \u{7}",
        "ключ:🔒:{id}",
        "a'b",
        "'); DROP TABLE lock_leases; --",
        "\"q\"\n\\ *?[]",
        &long,
        shorter,
    ];
    let keys: Vec<String> = endings.iter().map(|end| format!("{base}{end}")).collect();
    let mut leases = Vec::new();
    for key in &keys {
        match attempt(&store.a, key, LockToken::random(), TTL).await {
            Acquire::Acquired { lease, .. } => leases.push(lease),
            other => panic!("{key:?} is held by an earlier key: {other:?}"),
        }
    }
    for key in &keys {
        refused(attempt(&store.b, key, LockToken::random(), TTL).await);
    }
    // Every other key released: the rest are still held.
    for (i, lease) in leases.iter_mut().enumerate() {
        if i % 2 == 0 {
            assert!(
                lease.release(Duration::ZERO).await.unwrap(),
                "{:?}",
                keys[i]
            );
        }
    }
    for (i, key) in keys.iter().enumerate() {
        let answer = attempt(&store.b, key, LockToken::random(), TTL).await;
        if i % 2 == 0 {
            let (mut lease, _) = granted(answer);
            assert!(lease.release(Duration::ZERO).await.unwrap());
        } else {
            refused(answer);
        }
    }
    for (i, lease) in leases.iter_mut().enumerate() {
        if i % 2 == 1 {
            assert!(
                lease.release(Duration::ZERO).await.unwrap(),
                "{:?}",
                keys[i]
            );
        }
    }
}

/// Two clients race for one key many times: exactly one wins each round.
pub async fn racing_clients_never_both_win(store: &Clients) {
    let key = unique_key("contract");
    for round in 0..40 {
        let (ta, tb) = (LockToken::random(), LockToken::random());
        let (ra, rb) = tokio::join!(
            attempt(&store.a, &key, ta, TTL),
            attempt(&store.b, &key, tb, TTL)
        );
        let mut winners: Vec<Box<dyn Lease>> = [ra, rb]
            .into_iter()
            .filter_map(|answer| match answer {
                Acquire::Acquired { lease, .. } => Some(lease),
                _ => None,
            })
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {} winners", winners.len());
        assert!(winners[0].release(Duration::ZERO).await.unwrap());
    }
}

/// An expired lease can be taken by another holder, with a larger fencing
/// token (where the store promises that), and its old handle can no longer
/// renew or release it.
pub async fn an_expired_lease_is_free_and_stale(store: &Clients) {
    let key = unique_key("contract");
    let short = short_ttl(store.caps());
    let (mut stale, first) = granted(attempt(&store.a, &key, LockToken::random(), short).await);
    let first = token_of(&*stale, first).await;
    // Expiry is the thing under test: sleeping past it is the point.
    tokio::time::sleep(short * 3).await;
    assert!(!stale.renew().await.unwrap(), "expired lease renewed");
    let (mut lease, second) = granted(attempt(&store.b, &key, LockToken::random(), TTL).await);
    let second = token_of(&*lease, second).await;
    if store.caps().fencing.increasing {
        assert!(
            second > first,
            "fencing must grow across expiry: {first} then {second}"
        );
    }
    assert!(!stale.release(Duration::ZERO).await.unwrap());
    refused(attempt(&store.a, &key, LockToken::random(), TTL).await);
    assert!(lease.release(Duration::ZERO).await.unwrap());
}

/// Another token cannot undo the lease; the holder's renewal extends it;
/// a second release is refused.
pub async fn only_the_holder_renews_or_releases(store: &Clients) {
    let key = unique_key("contract");
    let (owner, other) = (LockToken::random(), LockToken::random());
    let short = short_ttl(store.caps()) * 4;
    let (mut lease, _) = granted(attempt(&store.a, &key, owner, short).await);
    assert!(!store.b.abandon(&key, other).await.unwrap());
    refused(attempt(&store.b, &key, other, TTL).await);
    assert!(lease.renew().await.unwrap());
    if let Some(left) = refused(attempt(&store.b, &key, other, TTL).await) {
        assert!(left > short / 2, "renewal extended the lease: {left:?}");
    }
    assert!(lease.release(Duration::ZERO).await.unwrap());
    assert!(
        !lease.release(Duration::ZERO).await.unwrap(),
        "released twice"
    );
    let (mut next, _) = granted(attempt(&store.b, &key, other, TTL).await);
    assert!(next.release(Duration::ZERO).await.unwrap());
}

/// A release with a linger keeps the lease for that long, then frees it
/// within a fraction of a second: a linger is kept to the millisecond on
/// every store, never rounded up to a coarser unit of its ttls.
pub async fn a_lingering_release_keeps_the_lease_that_long(store: &Clients) {
    store
        .needs("a_lingering_release_keeps_the_lease_that_long")
        .await;
    let key = unique_key("contract");
    let (mut lease, _) = granted(attempt(&store.a, &key, LockToken::random(), TTL).await);
    let linger = Duration::from_millis(250);
    let released_at = Instant::now();
    assert!(lease.release(linger).await.unwrap());
    let left = refused(attempt(&store.b, &key, LockToken::random(), TTL).await);
    if let Some(left) = left {
        // A store that counts leases in coarser units says so in them.
        let unit = store.caps().ttl_granularity;
        assert!(
            left <= unit.mul_f64(linger.div_duration_f64(unit).ceil()),
            "{left:?}"
        );
    }
    // Asked again every 20 ms until granted: when it frees is the point.
    let mut next = loop {
        match attempt(&store.b, &key, LockToken::random(), TTL).await {
            Acquire::Acquired { lease, .. } => break lease,
            Acquire::Held { .. } => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    let freed = released_at.elapsed();
    assert!(
        freed >= linger,
        "freed {freed:?} into a linger of {linger:?}"
    );
    // etcd's whole-second leases would free it after a second or more.
    let bound = linger + Duration::from_millis(750);
    assert!(freed < bound, "a linger of {linger:?} held {freed:?}");
    assert!(next.release(Duration::ZERO).await.unwrap());
}

/// Fencing tokens strictly increase from one holder to the next, across
/// both clients, where the store promises that.
pub async fn fencing_tokens_increase_across_holders(store: &Clients) {
    store.needs("fencing_tokens_increase_across_holders").await;
    let key = unique_key("contract");
    let mut last = 0;
    for round in 0..20 {
        let client = if round % 2 == 0 { &store.a } else { &store.b };
        let (mut lease, next) = granted(attempt(client, &key, LockToken::random(), TTL).await);
        let next = token_of(&*lease, next).await;
        assert!(next > last, "{last} then {next}");
        last = next;
        assert!(lease.release(Duration::ZERO).await.unwrap());
    }
}

/// A fencing token issued on demand ([`Lease::fencing_token`]) is the
/// holder's alone: read after the grant it is still larger than the
/// previous holder's (where the store promises that), a lease that lost
/// its key gets none, and inspection shows no token (0) for the holder
/// until it reads one, never an earlier holder's. A store that issues
/// every token with the grant keeps this trivially.
pub async fn a_token_issued_on_demand_is_the_holders_alone(store: &Clients) {
    let key = unique_key("contract");
    let short = short_ttl(store.caps());
    let (mut first, token) = granted(attempt(&store.a, &key, LockToken::random(), TTL).await);
    let first_token = token_of(&*first, token).await;
    assert!(first.release(Duration::ZERO).await.unwrap());
    let (stale, stale_token) = granted(attempt(&store.a, &key, LockToken::random(), short).await);
    // Expiry is the thing under test: sleeping past it is the point.
    tokio::time::sleep(short * 3).await;
    let (mut next, next_token) = granted(attempt(&store.b, &key, LockToken::random(), TTL).await);
    if stale_token.is_none() {
        let issued = stale.fencing_token().await.unwrap();
        assert_eq!(issued, None, "a lease that lost its key was issued a token");
    }
    let unread = store.b.inspect(&key).await.unwrap().expect("held");
    assert_eq!(
        unread.fencing,
        next_token.unwrap_or(0),
        "inspected before the holder read its token (the previous holder's was {first_token})"
    );
    // Read late, after a pause the grant did not see.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let next_token = token_of(&*next, next_token).await;
    let read = store.a.inspect(&key).await.unwrap().expect("held");
    assert_eq!(
        read.fencing, next_token,
        "inspected after the holder read its token"
    );
    if store.caps().fencing.increasing {
        assert!(next_token > first_token, "{first_token} then {next_token}");
    }
    assert!(next.release(Duration::ZERO).await.unwrap());
}

/// A watch made before a release reports it; one made when nothing is
/// released stays quiet (while the holder renews and others are refused).
pub async fn a_watch_fires_on_release_and_only_then(store: &Clients) {
    store.needs("a_watch_fires_on_release_and_only_then").await;
    let key = unique_key("contract");
    let (mut lease, _) = granted(attempt(&store.a, &key, LockToken::random(), TTL).await);
    let mut watch = store.b.watch(&key).await.unwrap();
    // As a waiter does: subscribed, it asks again (`Store::watch`).
    refused(waiting_attempt(&store.b, &key, LockToken::random(), TTL).await);
    assert!(lease.renew().await.unwrap());
    // Nothing is released: the watch must stay quiet for this whole window.
    let quiet = tokio::time::timeout(Duration::from_millis(300), watch.released()).await;
    assert!(quiet.is_err(), "the watch fired without a release");
    assert!(lease.release(Duration::ZERO).await.unwrap());
    tokio::time::timeout(Duration::from_secs(5), watch.released())
        .await
        .expect("release notification");
}

/// A lease never says nobody else waits for its key while a waiter of
/// another client does (watching it, and refused): the runtime would
/// otherwise hand the lease on along one process's tasks past that
/// waiter's turn ([`Lease::others_may_wait`]).
pub async fn a_lease_knows_when_others_may_wait(store: &Clients) {
    let key = unique_key("contract");
    let (mut lease, _) = granted(attempt(&store.a, &key, LockToken::random(), TTL).await);
    // As a waiter does: subscribed, it asks again (`Store::watch`).
    let watch = store.b.watch(&key).await.unwrap();
    let waiter = LockToken::random();
    refused(waiting_attempt(&store.b, &key, waiter, TTL).await);
    assert!(
        lease.others_may_wait(),
        "the lease says nobody waits while another client does"
    );
    // The waiter gives up, as a timed-out one does: nothing of it stays queued.
    drop(watch);
    store.b.abandon(&key, waiter).await.unwrap();
    assert!(lease.release(Duration::ZERO).await.unwrap());
}

/// A hand-over moves the lease to a new token with a larger fencing token:
/// the old token is refused from then on, the handle goes on as the new
/// holder.
pub async fn a_hand_over_moves_the_lease_to_a_new_token(store: &Clients) {
    store
        .needs("a_hand_over_moves_the_lease_to_a_new_token")
        .await;
    let key = unique_key("contract");
    let old = LockToken::random();
    let (mut lease, first) = granted(attempt(&store.a, &key, old, TTL).await);
    let first = token_of(&*lease, first).await;
    let second = moved(lease.hand_over(tokio::time::Instant::now()).await.unwrap());
    let second = token_of(&*lease, second).await;
    if store.caps().fencing.increasing {
        assert!(second > first, "{first} then {second}");
    }
    assert!(
        !store.a.abandon(&key, old).await.unwrap(),
        "the old token still releases the handed-over lease"
    );
    refused(attempt(&store.b, &key, LockToken::random(), TTL).await);
    refused(attempt(&store.a, &key, old, TTL).await);
    assert!(lease.renew().await.unwrap());
    assert!(lease.release(Duration::ZERO).await.unwrap());
    let (mut next, _) = granted(attempt(&store.b, &key, LockToken::random(), TTL).await);
    assert!(next.release(Duration::ZERO).await.unwrap());
}

/// A store that pushes losses raises the holder's loss signal when its
/// lease is forcibly released, without being asked.
pub async fn a_forced_release_is_pushed_to_the_holder(store: &Clients) {
    store
        .needs("a_forced_release_is_pushed_to_the_holder")
        .await;
    let key = unique_key("contract");
    let loss = LossSignal::new();
    let _lease = granted(attempt_with(&store.a, &key, LockToken::random(), TTL, &loss).await);
    assert!(store.b.force_release(&key).await.unwrap());
    tokio::time::timeout(Duration::from_secs(5), loss.raised())
        .await
        .expect("the store pushed the loss to the holder");
}

/// A forced release frees the key and wakes waiters; the holder's handle is
/// refused from then on.
pub async fn a_forced_release_frees_the_key_and_tells_the_holder(store: &Clients) {
    let key = unique_key("contract");
    let (mut lease, _) = granted(attempt(&store.a, &key, LockToken::random(), TTL).await);
    let mut watch = store.b.watch(&key).await.unwrap();
    assert!(store.b.force_release(&key).await.unwrap());
    if store.caps().release_poll.is_none() {
        tokio::time::timeout(Duration::from_secs(5), watch.released())
            .await
            .expect("release notification");
    }
    // Not even with the key free: a forced release is never undone.
    assert!(
        !lease.renew().await.unwrap(),
        "the forced-out holder took its lease back"
    );
    let (mut next, _) = granted(attempt(&store.b, &key, LockToken::random(), TTL).await);
    assert!(
        !lease.renew().await.unwrap(),
        "the forced-out holder renewed"
    );
    assert!(!lease.release(Duration::ZERO).await.unwrap());
    assert!(next.release(Duration::ZERO).await.unwrap());
    assert!(
        !store.b.force_release(&key).await.unwrap(),
        "nothing to free"
    );
}

/// An acquire whose answer nobody took up is undone by its token, and only
/// by its token: the key is free at once, not after the ttl.
pub async fn an_abandoned_acquire_leaves_no_lease(store: &Clients) {
    let key = unique_key("contract");
    let token = LockToken::random();
    // The answer is dropped unread, as when the caller gave up.
    drop(attempt(&store.a, &key, token, TTL).await);
    assert!(!store.a.abandon(&key, LockToken::random()).await.unwrap());
    refused(attempt(&store.b, &key, LockToken::random(), TTL).await);
    assert!(store.a.abandon(&key, token).await.unwrap());
    let (mut lease, _) = granted(attempt(&store.b, &key, LockToken::random(), TTL).await);
    assert!(
        !store.a.abandon(&key, token).await.unwrap(),
        "abandoned twice"
    );
    assert!(lease.release(Duration::ZERO).await.unwrap());
}

/// A waiter that gives up is undone by its token while the key is still
/// held: whatever its waiting attempt left (a place in the store's queue,
/// a mark) is gone once `abandon` returns, so after the holder's release
/// the key is free at once for anyone else.
pub async fn an_abandoned_waiter_leaves_nothing_queued(store: &Clients) {
    let key = unique_key("contract");
    let (holder, _) = granted(attempt(&store.a, &key, LockToken::random(), TTL).await);
    let waiter = LockToken::random();
    refused(waiting_attempt(&store.b, &key, waiter, TTL).await);
    assert!(
        !store.b.abandon(&key, waiter).await.unwrap(),
        "a waiter that never held the key released it"
    );
    let left = "the abandoned waiter is still on the key";
    released_leaves_it_free(store, holder, &key, (&store.a, Claim::Exclusive), left).await;
}

/// Releases `holder`'s lease on `key`, then checks that nothing is left on
/// the key (`left` says what that would mean) and that `next` takes it at
/// once as its claim, and releases that.
async fn released_leaves_it_free(
    store: &Clients,
    mut holder: Box<dyn Lease>,
    key: &str,
    next: (&Arc<dyn Store>, Claim),
    left: &str,
) {
    assert!(holder.release(Duration::ZERO).await.unwrap());
    assert_eq!(store.a.inspect(key).await.unwrap(), None, "{left}");
    let (mut after, _) = granted(claim(next.0, key, next.1).await);
    assert!(after.release(Duration::ZERO).await.unwrap());
}

/// Inspection reports the live holder from either client (its token, its
/// fencing token, what its lease has left), follows a hand-over, and finds
/// the key free after a release or a forced release.
pub async fn inspect_reports_the_holder(store: &Clients) {
    let key = unique_key("contract");
    assert_eq!(store.b.inspect(&key).await.unwrap(), None, "never taken");
    let token = LockToken::random();
    let (mut lease, fencing) = granted(attempt(&store.a, &key, token, TTL).await);
    let fencing = token_of(&*lease, fencing).await;
    for client in [&store.a, &store.b] {
        let info = client.inspect(&key).await.unwrap().expect("held");
        assert_eq!(info.token, Some(token), "{info:?}");
        assert_eq!(info.fencing, fencing, "{info:?}");
        if let Some(left) = info.remaining {
            assert!(left <= TTL && left >= TTL / 2, "{info:?}");
        }
    }
    match lease.hand_over(tokio::time::Instant::now()).await.unwrap() {
        HandOver::Moved { fencing: next } => {
            let next = token_of(&*lease, next).await;
            let info = store.b.inspect(&key).await.unwrap().expect("held");
            assert_eq!(info.fencing, next, "{info:?}");
            let moved = info.token.expect("a token");
            assert_ne!(moved, token, "the hand-over moved the lease to a new token");
            assert!(moved.is_from_this_process());
            assert!(lease.release(Duration::ZERO).await.unwrap());
        }
        HandOver::Released => {}
        other => panic!("a held lease was not handed over: {other:?}"),
    }
    assert_eq!(store.b.inspect(&key).await.unwrap(), None, "released");
    let (_stuck, _) = granted(attempt(&store.a, &key, LockToken::random(), TTL).await);
    assert!(store.b.inspect(&key).await.unwrap().is_some());
    assert!(store.b.force_release(&key).await.unwrap());
    assert_eq!(store.a.inspect(&key).await.unwrap(), None, "force-released");
}

/// The capabilities make sense together: a linger or margin no larger than
/// the shortest ttl, a ttl unit that divides it.
pub async fn the_capabilities_are_consistent(store: &Clients) {
    let caps = store.caps();
    assert_eq!(caps, store.b.capabilities(), "two clients, one store");
    assert!(!caps.store.is_empty());
    assert!(caps.ttl_granularity > Duration::ZERO);
    assert!(
        caps.check(Claim::Exclusive, caps.min_ttl, None).is_ok(),
        "{caps:?}"
    );
    assert!(
        caps.check(Claim::Exclusive, caps.min_ttl / 2, None)
            .is_err()
    );
    assert!(caps.valid_for(TTL) < TTL, "a margin is kept: {caps:?}");
}

/// Shares join each other and an exclusive claim waits for all of them,
/// as a read-write lock's readers and writer.
pub async fn shares_hold_together_and_an_exclusive_claim_alone(store: &Clients) {
    store
        .needs("shares_hold_together_and_an_exclusive_claim_alone")
        .await;
    let key = unique_key("contract");
    let (mut first, _) = granted(claim(&store.a, &key, Claim::Shared).await);
    let (mut second, _) = granted(claim(&store.b, &key, Claim::Shared).await);
    refused(claim(&store.a, &key, Claim::Exclusive).await);
    assert!(first.release(Duration::ZERO).await.unwrap());
    refused(claim(&store.b, &key, Claim::Exclusive).await);
    assert!(second.release(Duration::ZERO).await.unwrap());
    let (mut writer, _) = granted(claim(&store.b, &key, Claim::Exclusive).await);
    refused(claim(&store.a, &key, Claim::Shared).await);
    assert!(writer.release(Duration::ZERO).await.unwrap());
}

/// A semaphore admits holders up to its limit across clients, each with
/// its own lease, and admits the next when one is released.
pub async fn a_semaphore_admits_up_to_its_limit(store: &Clients) {
    store.needs("a_semaphore_admits_up_to_its_limit").await;
    let key = unique_key("contract");
    let three = Claim::permits(NonZeroU32::new(3).unwrap());
    let mut held = Vec::new();
    for client in [&store.a, &store.b, &store.a] {
        held.push(granted(claim(client, &key, three).await).0);
    }
    refused(claim(&store.b, &key, three).await);
    assert!(held[1].release(Duration::ZERO).await.unwrap());
    held[1] = granted(claim(&store.b, &key, three).await).0;
    refused(claim(&store.a, &key, three).await);
    for lease in &mut held {
        assert!(lease.release(Duration::ZERO).await.unwrap());
    }
}

/// A permit handed over keeps its place among the key's holders: moved
/// to a new token with a larger fencing token, the key still full (a
/// further permit refused, the old token refused), the handle going on as
/// the new holder until its release frees the place; or, from a store
/// that does not move permits, released, the place free at once.
pub async fn a_handed_over_permit_keeps_its_place(store: &Clients) {
    store.needs("a_handed_over_permit_keeps_its_place").await;
    let key = unique_key("contract");
    let two = Claim::permits(NonZeroU32::new(2).unwrap());
    let (old, loss) = (LockToken::random(), LossSignal::new());
    let request = AcquireRequest::new(&key, old, TTL, &loss).claiming(two);
    let (mut handed, first) = granted(store.a.acquire(request).await.expect("acquire"));
    let first = token_of(&*handed, first).await;
    let (mut other, second) = granted(claim(&store.b, &key, two).await);
    let second = token_of(&*other, second).await;
    refused(claim(&store.b, &key, two).await);
    match handed.hand_over(tokio::time::Instant::now()).await.unwrap() {
        HandOver::Moved { fencing } => {
            let moved = token_of(&*handed, fencing).await;
            if store.caps().fencing.increasing {
                assert!(moved > first.max(second), "{first}, {second}, then {moved}");
            }
            refused(claim(&store.b, &key, two).await);
            assert!(
                !store.a.abandon(&key, old).await.unwrap(),
                "the old token still releases the handed-over permit"
            );
            refused(claim(&store.b, &key, two).await);
            assert!(handed.renew().await.unwrap(), "the moved permit renews");
            assert!(handed.release(Duration::ZERO).await.unwrap());
        }
        HandOver::Released => {
            assert!(!handed.renew().await.unwrap(), "released, yet renewed");
        }
        HandOver::Lost => panic!("a held permit was lost in its hand-over"),
    }
    let (mut next, _) = granted(claim(&store.b, &key, two).await);
    refused(claim(&store.a, &key, two).await);
    assert!(next.release(Duration::ZERO).await.unwrap());
    assert!(other.release(Duration::ZERO).await.unwrap());
    assert_eq!(store.b.inspect(&key).await.unwrap(), None, "all released");
}

/// Each permit is a lease of its own: one not renewed expires alone and
/// its place is taken, its handle then refused, while the other renews;
/// fencing tokens rise with every grant; inspection counts the holders.
pub async fn each_permit_expires_renews_and_fences_alone(store: &Clients) {
    store
        .needs("each_permit_expires_renews_and_fences_alone")
        .await;
    let key = unique_key("contract");
    let two = Claim::permits(NonZeroU32::new(2).unwrap());
    let short = short_ttl(store.caps());
    let loss = LossSignal::new();
    let request = AcquireRequest::new(&key, LockToken::random(), short, &loss).claiming(two);
    let sent = tokio::time::Instant::now();
    let (mut crashed, first) = granted(store.a.acquire(request).await.expect("acquire"));
    let first = token_of(&*crashed, first).await;
    let (mut live, second) = granted(claim(&store.b, &key, two).await);
    let second = token_of(&*live, second).await;
    if store.caps().fencing.increasing {
        assert!(second > first, "{first} then {second}");
    }
    let info = store.a.inspect(&key).await.unwrap().expect("held");
    if sent.elapsed() < short {
        assert_eq!((info.claim, info.holders), (two, 2), "{info:?}");
    }
    // A third permit is refused while both are live. The first's ttl is
    // short (it is to expire below), and a busy machine may take longer
    // than that to get here: a grant is then a bug only if it came before
    // the first permit could have expired.
    match claim(&store.a, &key, two).await {
        Acquire::Held { .. } => {}
        Acquire::Acquired { mut lease, .. } => {
            let after = sent.elapsed();
            assert!(
                after >= short,
                "a third permit of two granted {after:?} after the first was asked for, within its ttl of {short:?}"
            );
            assert!(lease.release(Duration::ZERO).await.unwrap());
        }
    }
    // Expiry is the thing under test: sleeping past it is the point.
    tokio::time::sleep(short * 3).await;
    assert!(live.renew().await.unwrap(), "the live permit renews");
    assert!(!crashed.renew().await.unwrap(), "an expired permit renewed");
    let (mut next, third) = granted(claim(&store.a, &key, two).await);
    let third = token_of(&*next, third).await;
    if store.caps().fencing.increasing {
        assert!(third > second, "{second} then {third}");
    }
    assert!(!crashed.release(Duration::ZERO).await.unwrap());
    refused(claim(&store.b, &key, two).await);
    assert!(next.release(Duration::ZERO).await.unwrap());
    assert!(live.release(Duration::ZERO).await.unwrap());
    assert_eq!(store.b.inspect(&key).await.unwrap(), None, "all released");
}

/// The claim rule ([`Claim::meets`]) on every pair of the claims the
/// store serves (exclusive, shared, 3 permits, 4 permits), asked of a free
/// key and of a key held under each: a free key grants any; a claim that
/// joins is granted beside the holder, one that waits is refused, and a
/// mismatch is an error at once, of kind
/// [`Misuse`](crate::store::StoreErrorKind::Misuse), naming both claims,
/// whether the caller would wait or not, and leaving nothing behind (once
/// the holder releases, the key is free and the refused claim is granted
/// at once). Prints the table it found on the test's standard error.
pub async fn the_claim_rule_holds_for_every_pair(store: &Clients) {
    let caps = store.caps();
    let permits = |n| Claim::permits(NonZeroU32::new(n).unwrap());
    let claims: Vec<Claim> = [Claim::Exclusive, Claim::Shared, permits(3), permits(4)]
        .into_iter()
        .filter(|&claim| caps.check(claim, TTL, None).is_ok())
        .collect();
    let mut table = format!(
        "the claim rule ({} store), held \\ asked: {}\n",
        caps.store,
        claims
            .iter()
            .map(|c| c.to_string())
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let mut row = vec!["free:".to_owned()];
    for &asked in &claims {
        let key = unique_key("contract");
        let (mut lease, _) = granted(claim(&store.a, &key, asked).await);
        assert!(lease.release(Duration::ZERO).await.unwrap());
        row.push("granted".to_owned());
    }
    table.push_str(&format!("  {}\n", row.join(" ")));
    for &held in &claims {
        let mut row = vec![format!("{held}:")];
        for &asked in &claims {
            row.push(meet_held(store, held, asked).await.to_owned());
        }
        table.push_str(&format!("  {}\n", row.join(" ")));
    }
    let _ = std::io::Write::write_all(&mut std::io::stderr(), table.as_bytes());
}

/// `asked` against a key `store.a` holds under `held`, by `store.b`, as
/// [`the_claim_rule_holds_for_every_pair`] checks it; what happened.
async fn meet_held(store: &Clients, held: Claim, asked: Claim) -> &'static str {
    let key = unique_key("contract");
    let (holder, _) = granted(claim(&store.a, &key, held).await);
    let outcome = match asked.meets(held) {
        Meeting::Joins => {
            let (mut joined, _) = granted(claim(&store.b, &key, asked).await);
            assert!(joined.release(Duration::ZERO).await.unwrap());
            "joins"
        }
        Meeting::Waits => {
            refused(claim(&store.b, &key, asked).await);
            "waits"
        }
        Meeting::Mismatch => {
            for waits in [false, true] {
                let loss = LossSignal::new();
                let request = AcquireRequest::new(&key, LockToken::random(), TTL, &loss)
                    .claiming(asked)
                    .waiting(waits);
                let answer = store.b.acquire(request).await;
                let err = match answer {
                    Err(err) => err,
                    Ok(other) => panic!(
                        "{asked} against {held} (waits: {waits}): expected a mismatch, got {other:?}"
                    ),
                };
                assert_eq!(
                    err.kind(),
                    crate::store::StoreErrorKind::Misuse,
                    "{asked} against {held}: {err}"
                );
                let said = err.to_string();
                for named in [kind_word(held), kind_word(asked)] {
                    assert!(said.contains(named), "{asked} against {held}: {said}");
                }
            }
            "mismatch"
        }
    };
    let left = format!("{asked} against {held}: something was left on the key");
    released_leaves_it_free(store, holder, &key, (&store.b, asked), &left).await;
    outcome
}

/// The word a mismatch's message uses for the kind of lock `claim` makes.
fn kind_word(claim: Claim) -> &'static str {
    match claim {
        Claim::Exclusive => "mutex",
        Claim::Shared => "read lock",
        Claim::Permit { limit } if limit.get() == 3 => "3 permits",
        Claim::Permit { .. } => "4 permits",
    }
}

/// A forced release frees every share of the key at once: the key takes a
/// writer, and each old share's handle is refused.
pub async fn a_forced_release_frees_every_share(store: &Clients) {
    store.needs("a_forced_release_frees_every_share").await;
    let key = unique_key("contract");
    let (mut first, _) = granted(claim(&store.a, &key, Claim::Shared).await);
    let (mut second, _) = granted(claim(&store.b, &key, Claim::Shared).await);
    assert!(store.b.force_release(&key).await.unwrap());
    assert_eq!(store.a.inspect(&key).await.unwrap(), None, "force-released");
    let (mut writer, _) = granted(claim(&store.a, &key, Claim::Exclusive).await);
    for share in [&mut first, &mut second] {
        assert!(!share.renew().await.unwrap(), "a forced-out share renewed");
        assert!(!share.release(Duration::ZERO).await.unwrap());
    }
    assert!(writer.release(Duration::ZERO).await.unwrap());
}

/// An exclusive claim that waits while shares hold the key stops new
/// shares from joining, so a stream of readers cannot starve a writer; it
/// gets the key once the shares it waited for are released.
pub async fn a_waiting_exclusive_claim_stops_new_shares(store: &Clients) {
    store
        .needs("a_waiting_exclusive_claim_stops_new_shares")
        .await;
    let key = unique_key("contract");
    let (mut reader, _) = granted(claim(&store.a, &key, Claim::Shared).await);
    let (loss, writer) = (LossSignal::new(), LockToken::random());
    let waiting = || {
        AcquireRequest::new(&key, writer, TTL, &loss)
            .claiming(Claim::Exclusive)
            .waiting(true)
    };
    refused(store.b.acquire(waiting()).await.expect("acquire"));
    refused(claim(&store.a, &key, Claim::Shared).await);
    assert!(reader.release(Duration::ZERO).await.unwrap());
    let (mut lease, _) = granted(store.b.acquire(waiting()).await.expect("acquire"));
    refused(claim(&store.a, &key, Claim::Shared).await);
    assert!(lease.release(Duration::ZERO).await.unwrap());
    let (mut next, _) = granted(claim(&store.a, &key, Claim::Shared).await);
    assert!(next.release(Duration::ZERO).await.unwrap());
}
