//! Keeping the agent's resident memory close to what it uses: a round over
//! thousands of peers allocates and frees tens of megabytes (sockets,
//! futures, the status it publishes) on several threads, and glibc keeps
//! freed memory in per-thread arenas instead of returning it. Fewer arenas,
//! a fixed threshold for mapping large blocks on their own, and a trim
//! after each round keep RSS flat from round to round.

/// Allocations from this size up are mapped on their own and unmapped when
/// freed.
const MMAP_THRESHOLD: libc::c_int = 128 << 10;

/// Limits glibc to two malloc arenas (default: eight per CPU) and fixes the
/// size from which allocations are mapped on their own at 128 KiB. glibc's
/// default threshold slides up (to 32 MiB) after the first large block is
/// freed, after which a round's large buffers (the targets, the outcomes,
/// the status) come from the heaps and leave them fragmented: RSS then
/// wanders by 10 MiB from round to round at 5,000 peers. Call once, before
/// the runtime's threads start. A no-op on other C libraries.
pub fn tune_allocator() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets allocator parameters; M_ARENA_MAX takes any
    // positive count and is read when a thread first allocates, and
    // M_MMAP_THRESHOLD any size up to 32 MiB.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}

/// Returns freed memory at the top of the heaps and in whole free pages to
/// the kernel. Costs a walk of the free lists (milliseconds at 5,000 peers):
/// once per probe round, off the round's timing. A no-op on other C
/// libraries.
pub fn release_free() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns unused memory; it takes the arenas'
    // locks like any allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}
