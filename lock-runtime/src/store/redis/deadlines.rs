//! The response timeout of one Redis connection's commands, kept without a
//! timer per command.
//!
//! A command that is not answered when first polled leaves its waker in
//! its thread's shard of a table, and takes it out when it ends. One task
//! per connection looks at the table [`LOOKS_PER_TIMEOUT`] times per
//! timeout: it stamps each command it sees for the first time, and wakes
//! the commands it stamped a whole timeout ago, which then fail as timed
//! out. A command therefore fails after waiting at least the timeout, and
//! at most about an eighth more; an answer that arrives first wins. The
//! error is the one the `redis` crate's own response timeout gives (an I/O
//! error of kind `TimedOut`), so callers tell it apart alike.

use std::future::{Future, poll_fn};
use std::mem;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Poll, Waker};
use std::time::Duration;

use ::redis::{RedisError, RedisResult};
use tokio::time::Instant;

use crate::store::common::lock;

/// How often per timeout the table is looked at.
const LOOKS_PER_TIMEOUT: u32 = 8;

/// The commands of one connection that wait for an answer, and how long
/// each may wait.
pub(super) struct Deadlines {
    timeout: Duration,
    /// One shard per thread (modulo their number), so that two threads
    /// never wait on one lock to start or end a command.
    shards: Box<[Mutex<Shard>]>,
    /// Whether the task that looks at the table runs: cleared when it
    /// ends, as it does with its runtime, so that the next command starts
    /// another.
    watched: AtomicBool,
}

#[derive(Default)]
struct Shard {
    slots: Vec<Slot>,
    free: Vec<usize>,
    /// How many slots are [`Slot::Waiting`].
    waiting: usize,
}

enum Slot {
    Free,
    /// `seen`: when the watching task first saw the command.
    Waiting {
        waker: Waker,
        seen: Option<Instant>,
    },
    /// Waited a whole timeout: the command fails unless its answer is in.
    Expired,
}

impl Deadlines {
    pub(super) fn new(timeout: Duration) -> Arc<Deadlines> {
        let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
        Arc::new(Deadlines {
            timeout,
            shards: (0..threads.clamp(1, 64))
                .map(|_| Mutex::default())
                .collect(),
            watched: AtomicBool::new(false),
        })
    }

    /// The response timeout.
    pub(super) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// `answer`, or a timeout error once it has waited the timeout. Pinned
    /// by the caller, so that the command's future is not moved into this
    /// one's.
    pub(super) async fn bound<T>(
        self: &Arc<Self>,
        mut answer: Pin<&mut impl Future<Output = RedisResult<T>>>,
    ) -> RedisResult<T> {
        let mut waiting: Option<Waiting<'_>> = None;
        poll_fn(|cx| {
            if let Poll::Ready(answer) = answer.as_mut().poll(cx) {
                return Poll::Ready(answer);
            }
            match &waiting {
                None => waiting = Some(self.wait(cx.waker())),
                Some(waiting) if waiting.expired(cx.waker()) => {
                    return Poll::Ready(Err(timed_out()));
                }
                Some(_) => {}
            }
            Poll::Pending
        })
        .await
    }

    /// Puts a command's `waker` in this thread's shard.
    fn wait(self: &Arc<Self>, waker: &Waker) -> Waiting<'_> {
        if !self.watched.load(Ordering::Acquire) && !self.watched.swap(true, Ordering::AcqRel) {
            tokio::spawn(watch(Arc::downgrade(self)));
        }
        let shard = this_thread() % self.shards.len();
        let mut table = lock(&self.shards[shard]);
        let waiting = Slot::Waiting {
            waker: waker.clone(),
            seen: None,
        };
        let slot = match table.free.pop() {
            Some(slot) => {
                table.slots[slot] = waiting;
                slot
            }
            None => {
                table.slots.push(waiting);
                table.slots.len() - 1
            }
        };
        table.waiting += 1;
        Waiting {
            deadlines: self,
            shard,
            slot,
        }
    }
}

/// A command's place in the table, freed when dropped.
struct Waiting<'d> {
    deadlines: &'d Deadlines,
    shard: usize,
    slot: usize,
}

impl Waiting<'_> {
    /// Whether the command waited a whole timeout; else keeps `waker` as
    /// the one to wake.
    fn expired(&self, waker: &Waker) -> bool {
        let mut table = lock(&self.deadlines.shards[self.shard]);
        match &mut table.slots[self.slot] {
            Slot::Waiting { waker: kept, .. } => {
                if !kept.will_wake(waker) {
                    kept.clone_from(waker);
                }
                false
            }
            Slot::Expired | Slot::Free => true,
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut table = lock(&self.deadlines.shards[self.shard]);
        if let Slot::Waiting { .. } = mem::replace(&mut table.slots[self.slot], Slot::Free) {
            table.waiting -= 1;
        }
        table.free.push(self.slot);
    }
}

/// Looks at `deadlines`' table every [`LOOKS_PER_TIMEOUT`]th of its
/// timeout while the connection lives.
async fn watch(deadlines: Weak<Deadlines>) {
    /// Clears [`Deadlines::watched`] however the task ends.
    struct Ending(Weak<Deadlines>);
    impl Drop for Ending {
        fn drop(&mut self) {
            if let Some(deadlines) = self.0.upgrade() {
                deadlines.watched.store(false, Ordering::Release);
            }
        }
    }
    let _ending = Ending(deadlines.clone());
    // At least a millisecond apart, however short the timeout.
    let Some(every) = deadlines
        .upgrade()
        .map(|d| (d.timeout / LOOKS_PER_TIMEOUT).max(Duration::from_millis(1)))
    else {
        return;
    };
    let mut expired = Vec::new();
    loop {
        tokio::time::sleep(every).await;
        let Some(deadlines) = deadlines.upgrade() else {
            return;
        };
        let now = Instant::now();
        for shard in &deadlines.shards {
            let mut table = lock(shard);
            if table.waiting == 0 {
                continue;
            }
            for slot in &mut table.slots {
                match slot {
                    Slot::Waiting {
                        seen: seen @ None, ..
                    } => *seen = Some(now),
                    Slot::Waiting {
                        seen: Some(seen), ..
                    } if now - *seen >= deadlines.timeout => {
                        if let Slot::Waiting { waker, .. } = mem::replace(slot, Slot::Expired) {
                            expired.push(waker);
                        }
                    }
                    _ => {}
                }
            }
            table.waiting -= expired.len();
            drop(table);
            expired.drain(..).for_each(Waker::wake);
        }
    }
}

/// The error of a command that waited the whole timeout.
fn timed_out() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no answer from the Redis server within the response timeout",
    ))
}

/// This thread's number, from 0 in the order threads first ask.
fn this_thread() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static THIS: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    THIS.with(|this| *this)
}

#[cfg(test)]
mod tests {
    use std::pin::pin;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_command_fails_after_its_timeout_and_not_before() {
        let deadlines = Deadlines::new(Duration::from_millis(800));
        let started = Instant::now();
        let never = pin!(std::future::pending::<RedisResult<()>>());
        let err = deadlines.bound(never).await.unwrap_err();
        let waited = started.elapsed();
        assert!(err.is_timeout(), "{err:?}");
        assert!(
            waited >= Duration::from_millis(800) && waited <= Duration::from_millis(900),
            "{waited:?}"
        );
        let table = lock(&deadlines.shards[this_thread() % deadlines.shards.len()]);
        assert_eq!(table.waiting, 0);
        assert!(table.slots.iter().all(|slot| matches!(slot, Slot::Free)));
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_in_time_wins_and_frees_its_place() {
        let deadlines = Deadlines::new(Duration::from_millis(800));
        let answer = pin!(async {
            tokio::time::sleep(Duration::from_millis(700)).await;
            Ok(7)
        });
        assert_eq!(deadlines.bound(answer).await.unwrap(), 7);
        // A later command finds the place free and waits its own timeout.
        let started = Instant::now();
        let late = pin!(async {
            tokio::time::sleep(Duration::from_millis(1200)).await;
            Ok(8)
        });
        assert!(deadlines.bound(late).await.unwrap_err().is_timeout());
        assert!(started.elapsed() >= Duration::from_millis(800));
        let table = lock(&deadlines.shards[this_thread() % deadlines.shards.len()]);
        assert_eq!((table.slots.len(), table.waiting), (1, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_command_leaves_nothing_behind() {
        let deadlines = Deadlines::new(Duration::from_millis(800));
        let never = pin!(std::future::pending::<RedisResult<()>>());
        let gave_up = tokio::time::timeout(Duration::from_millis(100), deadlines.bound(never));
        assert!(gave_up.await.is_err());
        let table = lock(&deadlines.shards[this_thread() % deadlines.shards.len()]);
        assert_eq!(table.waiting, 0);
        assert_eq!(table.free, [0]);
    }
}
