//! Maps of the echo responder. Pinned by name, so that their contents outlive
//! an agent restart (the agent chooses the bpffs directory).

use aya_ebpf::{
    macros::map,
    maps::{Array, PerCpuArray},
};
use health_common::maps::{EchoConfig, EchoCounter};

/// Per-CPU counters, indexed by `EchoCounter`: no atomics needed (the bpf
/// target has no `fetch_add`), the agent sums the CPUs.
#[map]
pub static ECHO_STATS: PerCpuArray<u64> = PerCpuArray::pinned(EchoCounter::COUNT, 0);

/// The endpoint address the responder answers for.
#[map]
pub static ECHO_CONFIG: Array<EchoConfig> = Array::pinned(1, 0);
