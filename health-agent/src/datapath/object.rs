//! The kernel object built from `health-ebpf`, embedded at compile time.

/// The ELF object holding every program and map of the datapath.
pub(super) static HEALTH_EBPF: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/health"));
