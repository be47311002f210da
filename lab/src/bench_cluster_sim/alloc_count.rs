//! The lab's allocator: the system's, counting what the view's assembly
//! allocates while asked to.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    sync::atomic::{AtomicBool, AtomicIsize, Ordering::Relaxed},
};

/// The system allocator, counting the bytes allocated while [`COUNTING`]
/// is set (one relaxed load per allocation otherwise): what the view's
/// assembly allocates, measured rather than estimated.
struct Counting;

static COUNTING: AtomicBool = AtomicBool::new(false);
/// Bytes allocated less bytes freed since counting started (frees of older
/// allocations make it negative).
static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn count(delta: isize) {
    if COUNTING.load(Relaxed) {
        let live = LIVE.fetch_add(delta, Relaxed) + delta;
        PEAK.fetch_max(live, Relaxed);
    }
}

fn signed(n: usize) -> isize {
    isize::try_from(n).unwrap_or(isize::MAX)
}

// SAFETY: every call goes to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is the system allocator's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            count(signed(layout.size()));
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            count(signed(layout.size()));
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as `alloc`.
        unsafe { System.dealloc(ptr, layout) };
        count(-signed(layout.size()));
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as `alloc`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            count(signed(new_size) - signed(layout.size()));
        }
        p
    }
}

/// Runs `f` counting its allocations: its result, the peak of bytes
/// allocated and not yet freed during it, and those still allocated after.
pub(super) fn counted<T>(f: impl FnOnce() -> T) -> (T, usize, usize) {
    LIVE.store(0, Relaxed);
    PEAK.store(0, Relaxed);
    COUNTING.store(true, Relaxed);
    let out = f();
    COUNTING.store(false, Relaxed);
    let (peak, live) = (PEAK.load(Relaxed), LIVE.load(Relaxed));
    (
        out,
        usize::try_from(peak).unwrap_or(0),
        usize::try_from(live).unwrap_or(0),
    )
}
