//! The datapath: the one kernel object and typed access to its pinned maps.
//! Imported by `probe`, `endpoint` and above; imports only `sys` and `util`.
//!
//! The datapath: the one kernel object (`health-ebpf`, embedded in the
//! binary) and everything user space does with it.
//!
//! - [`Datapath`] loads the object with its maps pinned (pins carry a
//!   layout version; an incompatible pin is replaced, never a reason not to
//!   start), attaches the echo responder and CT/RTT on the endpoint's veth
//!   and masquerade on the uplink (tcx or classic tc, as [`kernel`] chose
//!   for the running kernel), and hands programs to `BPF_PROG_TEST_RUN`.
//! - [`DatapathOwner`] owns the agent's one object: the node's datapath
//!   task and the endpoint's controller get [`DatapathHandle`]s and attach
//!   through them, each its own [`Attachments`]; attachments no longer in
//!   place are a typed list ([`MissingAttachment`]).
//! - [`maps`], [`ct`], [`nat`], [`rtt`] read and maintain the pinned maps
//!   through the registry of `health_common::maps`, from the pins alone, so
//!   the `bpf` commands work while no agent runs; [`dump`] decodes a
//!   map for `bpf map dump` through them.
//! - [`maintenance`] is the node's long-lived datapath task: masquerade on
//!   the uplink, the CT and NAT collectors, the RTT loss sweep.

mod carry;
pub mod classic;
pub mod collect;
pub mod ct;
pub mod dump;
mod echo_target;
pub mod encrypt_watch;
mod error;
mod interface;
pub mod kernel;
mod links;
mod loader;
pub mod maintenance;
pub mod maps;
pub mod masquerade;
mod missing;
mod mode;
pub mod nat;
mod object;
mod owner;
mod pins;
mod programs;
pub mod report;
pub mod rtt;
pub mod settings;
mod stats;

pub use self::{
    error::DatapathError,
    interface::Interface,
    kernel::{KernelFeatures, KernelReport, TcHook, TcPolicy},
    links::attached_programs,
    loader::Datapath,
    missing::{Hook, MissingAttachment, Why, render as render_missing},
    mode::AttachMode,
    owner::{Attachments, DatapathHandle, DatapathOwner},
    pins::{BPFFS_ROOT, DEFAULT_PIN_DIR, ensure_pin_dir, recorded_layout, remove_pins},
    stats::{EchoStats, read_pinned_stats},
};

/// `CLOCK_MONOTONIC` in nanoseconds: the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> Result<u64, DatapathError> {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map_err(DatapathError::Clock)?;
    Ok(u64::try_from(ts.tv_sec()).unwrap_or(0) * 1_000_000_000
        + u64::try_from(ts.tv_nsec()).unwrap_or(0))
}
