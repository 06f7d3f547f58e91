//! Several keys at once: `keys = [..]` and `LockRegistry::lock_all`. Locks
//! are taken in one canonical order, so opposite transfers never deadlock;
//! all are released on every exit; a lost lease on any cancels the body.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::{LockError, LockOptions, LockRegistry, distributed_lock, fencing_token_for};

/// Balances, and how many bodies are inside per account (must stay <= 1).
#[derive(Default)]
struct Bank {
    balances: Mutex<HashMap<u32, i64>>,
    inside: Mutex<HashMap<u32, usize>>,
    overlaps: AtomicUsize,
}

impl Bank {
    fn enter(&self, account: u32) {
        let mut inside = self.inside.lock().unwrap();
        let count = inside.entry(account).or_default();
        *count += 1;
        if *count > 1 {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn leave(&self, account: u32) {
        *self.inside.lock().unwrap().entry(account).or_default() -= 1;
    }

    fn balance(&self, account: u32) -> i64 {
        self.balances
            .lock()
            .unwrap()
            .get(&account)
            .copied()
            .unwrap_or(0)
    }

    fn set(&self, account: u32, value: i64) {
        self.balances.lock().unwrap().insert(account, value);
    }
}

/// A non-atomic read, pause, write of both balances.
#[distributed_lock(keys = ["acct:{from}", "acct:{to}"], registry = locks)]
async fn transfer(
    locks: &LockRegistry,
    bank: &Bank,
    from: u32,
    to: u32,
    amount: i64,
) -> (u64, u64) {
    bank.enter(from);
    bank.enter(to);
    let (a, b) = (bank.balance(from), bank.balance(to));
    tokio::time::sleep(Duration::from_millis(1)).await;
    bank.set(from, a - amount);
    bank.set(to, b + amount);
    bank.leave(from);
    bank.leave(to);
    let from = fencing_token_for(&format!("acct:{from}")).await;
    let to = fencing_token_for(&format!("acct:{to}")).await;
    (from.expect("held"), to.expect("held"))
}

#[distributed_lock(keys = ["acct:{from}", "acct:{to}"], mode = "skip", registry = locks)]
async fn try_transfer(locks: &LockRegistry, from: u32, to: u32) {}

// A 1 s ttl: a store that does not push losses (Redis) finds it at the
// next renewal, a third of that later.
#[distributed_lock(keys = ["acct:{from}", "acct:{to}"], ttl = "1s", registry = locks)]
async fn long_transfer(
    locks: &LockRegistry,
    from: u32,
    to: u32,
    started: &tokio::sync::Notify,
    done: &AtomicBool,
) {
    started.notify_one();
    tokio::time::sleep(Duration::from_secs(5)).await;
    done.store(true, Ordering::SeqCst);
}

/// 100 transfers, half in each direction between the same two accounts, all
/// at once: none deadlocks (all finish well within the bound), none
/// overlaps another on an account, and the money is all there.
async fn opposite_transfers_never_deadlock_nor_overlap(locks: LockRegistry) {
    let bank = Arc::new(Bank::default());
    bank.set(1, 1_000);
    bank.set(2, 1_000);
    let transfers: Vec<_> = (0..100)
        .map(|i| {
            let (locks, bank) = (locks.clone(), bank.clone());
            let (from, to) = if i % 2 == 0 { (1, 2) } else { (2, 1) };
            tokio::spawn(async move { transfer(&locks, &bank, from, to, 1 + i).await })
        })
        .collect();
    let all = async {
        for transfer in transfers {
            transfer.await.unwrap().unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(30), all)
        .await
        .expect("a deadlock: the transfers did not all finish");
    assert_eq!(bank.overlaps.load(Ordering::SeqCst), 0);
    assert_eq!(bank.balance(1) + bank.balance(2), 2_000);
    // Released on every exit: both keys free.
    let both = locks
        .try_lock_all(&["acct:1", "acct:2"], LockOptions::default())
        .await
        .unwrap();
    both.expect("free after the transfers")
        .release()
        .await
        .unwrap();
}

/// Each key has its own fencing token inside the body, both increasing
/// from one transfer to the next.
async fn each_key_has_its_own_fencing_token(locks: LockRegistry) {
    let bank = Bank::default();
    let (a1, b1) = transfer(&locks, &bank, 1, 2, 5).await.unwrap();
    let (a2, b2) = transfer(&locks, &bank, 2, 1, 5).await.unwrap();
    assert_ne!(a1, b1);
    assert!(a2 > a1 && b2 > b1, "{a1} {b1} -> {a2} {b2}");
}

/// Skip mode: one key held elsewhere is `Ok(None)`, and the other key is
/// not left held.
async fn skip_mode_takes_all_or_nothing(locks: LockRegistry) {
    let held = locks.lock("acct:2", LockOptions::default()).await.unwrap();
    assert_eq!(try_transfer(&locks, 1, 2).await.unwrap(), None);
    let one = locks
        .try_lock("acct:1", LockOptions::default())
        .await
        .unwrap();
    one.expect("acct:1 was given back").release().await.unwrap();
    held.release().await.unwrap();
    assert_eq!(try_transfer(&locks, 1, 2).await.unwrap(), Some(()));
}

/// A lease lost on any of the keys (force-released by an operator)
/// cancels the body with `Lost` (at once on memory, at the next renewal on
/// Redis), and the other key is released.
async fn a_lost_lease_on_any_key_cancels_the_body(locks: LockRegistry) {
    let done = Arc::new(AtomicBool::new(false));
    let started = Arc::new(tokio::sync::Notify::new());
    let running = tokio::spawn({
        let (locks, done, started) = (locks.clone(), done.clone(), started.clone());
        async move { long_transfer(&locks, 1, 2, &started, &done).await }
    });
    started.notified().await;
    assert!(locks.force_release("acct:2").await.unwrap());
    let err = tokio::time::timeout(Duration::from_secs(3), running)
        .await
        .expect("cancelled within a renewal")
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, LockError::Lost { .. }), "{err:?}");
    assert!(err.to_string().contains("acct:2"), "{err}");
    assert!(!done.load(Ordering::SeqCst));
    let one = locks
        .try_lock("acct:1", LockOptions::default())
        .await
        .unwrap();
    assert!(one.is_some(), "acct:1 released with the cancelled body");
}

/// The manual API: canonical order, duplicates once, one wait_timeout for
/// the whole, and nothing kept when it runs out.
async fn lock_all_orders_dedups_and_times_out_as_a_whole(locks: LockRegistry) {
    let guards = locks
        .lock_all(&["b", "a", "b"], LockOptions::default())
        .await
        .unwrap();
    assert_eq!(guards.keys(), ["a", "b"]);
    assert!(guards.fencing_token("a").await.is_ok());
    assert!(matches!(
        guards.fencing_token("c").await,
        Err(LockError::NotHeld { key: Some(key) }) if key == "c"
    ));
    guards.release().await.unwrap();

    let held = locks.lock("b", LockOptions::default()).await.unwrap();
    let started = std::time::Instant::now();
    let err = locks
        .lock_all(
            &["a", "b"],
            LockOptions::default().wait_timeout(Duration::from_millis(200)),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::Timeout { .. }), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
    let a = locks.try_lock("a", LockOptions::default()).await.unwrap();
    assert!(a.is_some(), "`a` was released when `b` timed out");
    held.release().await.unwrap();
    let empty = locks
        .lock_all(&[], LockOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(empty, LockError::InvalidKey { .. }), "{empty:?}");
}

lock_tests::on_memory_and_redis!(
    opposite_transfers_never_deadlock_nor_overlap,
    each_key_has_its_own_fencing_token,
    skip_mode_takes_all_or_nothing,
    a_lost_lease_on_any_key_cancels_the_body,
    lock_all_orders_dedups_and_times_out_as_a_whole
);
