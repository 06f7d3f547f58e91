//! Counting every allocation the process makes, so each row can say how
//! many one critical section cost (the lock, its release, the contender's
//! background work, and the section's own bookkeeping, the same for every
//! contender).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, AtomicUsize, Ordering};

/// The system allocator, counting.
pub(crate) struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// Whether `LIVE` follows the bytes allocated (the scaling run's memory
/// per held lock); off elsewhere, so the rows pay one load, not an add.
static TRACK_BYTES: AtomicBool = AtomicBool::new(false);

/// Bytes allocated less bytes freed while `TRACK_BYTES` was set, one
/// counter per thread (a thread frees what another allocated, so only the
/// sum means anything, and only its changes): no line the threads share
/// on the allocator's path.
static LIVE: [Slot; SLOTS] = [const { Slot(AtomicI64::new(0)) }; SLOTS];

const SLOTS: usize = 64;

/// One thread's counter, on a cache line of its own.
#[repr(align(64))]
struct Slot(AtomicI64);

/// The next thread's slot.
static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's slot; `usize::MAX` until its first tracked
    /// allocation. Const-initialised: reading it never allocates.
    static SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
}

fn track(bytes: usize, sign: i64) {
    if !TRACK_BYTES.load(Ordering::Relaxed) {
        return;
    }
    let slot = SLOT
        .try_with(|slot| {
            if slot.get() == usize::MAX {
                slot.set(NEXT_SLOT.fetch_add(1, Ordering::Relaxed) % SLOTS);
            }
            slot.get()
        })
        // A thread ending: any slot will do.
        .unwrap_or(0);
    LIVE[slot]
        .0
        .fetch_add(sign * bytes as i64, Ordering::Relaxed);
}

// SAFETY: every call is forwarded to `System` unchanged; the count is an
// atomic add beside it.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        track(layout.size(), 1);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        track(layout.size(), 1);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        track(new_size, 1);
        track(layout.size(), -1);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        track(layout.size(), -1);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Allocations (and reallocations) made so far by the whole process.
pub(crate) fn so_far() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}

/// Starts following the bytes allocated less those freed ([`live_bytes`]).
pub(crate) fn track_bytes() {
    TRACK_BYTES.store(true, Ordering::Relaxed);
}

/// Bytes allocated less bytes freed since [`track_bytes`]: compare two
/// readings.
pub(crate) fn live_bytes() -> i64 {
    LIVE.iter().map(|slot| slot.0.load(Ordering::Relaxed)).sum()
}
