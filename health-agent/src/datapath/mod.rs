//! The datapath's pinned maps, read and maintained from user space: the CT
//! table and its garbage collector, RTT statistics and the loss sweep, and
//! a listing of every map. Everything works from the pins alone, so the
//! `bpf` commands work while no agent runs.

pub mod ct;
pub mod maps;
pub mod nat;
pub mod rtt;

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    #[error("pinned map {path} (is the agent's --bpffs-dir right?)")]
    Pinned {
        path: PathBuf,
        source: aya::maps::MapError,
    },
    #[error("map {name}")]
    Map {
        name: &'static str,
        source: aya::maps::MapError,
    },
    #[error("reading the monotonic clock")]
    Clock(#[source] nix::Error),
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> Result<u64, DatapathError> {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map_err(DatapathError::Clock)?;
    Ok(u64::try_from(ts.tv_sec()).unwrap_or(0) * 1_000_000_000
        + u64::try_from(ts.tv_nsec()).unwrap_or(0))
}
