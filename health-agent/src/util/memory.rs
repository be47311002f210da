//! Keeping the agent's resident memory close to what it uses: a round over
//! thousands of peers allocates and frees tens of megabytes (sockets,
//! futures, the status it publishes) on several threads, and glibc keeps
//! freed memory in per-thread arenas instead of returning it. Fewer arenas
//! and a trim after each round keep RSS flat from round to round.

/// Limits glibc to two malloc arenas (default: eight per CPU). Call once,
/// before the runtime's threads start. A no-op on other C libraries.
pub fn limit_arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets an allocator parameter; M_ARENA_MAX takes
    // any positive count and is read when a thread first allocates.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
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
