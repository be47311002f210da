//! The health datapath's kernel programs. Built only for the bpf target; on
//! the host this is an empty binary so `cargo clippy --workspace` still works.
#![cfg_attr(target_arch = "bpf", no_std, no_main)]

#[cfg(target_arch = "bpf")]
mod kernel;

// The library target exists only so that health-agent can name this crate
// as a build dependency (`unused_crate_dependencies` judges each target).
#[cfg(target_arch = "bpf")]
use health_ebpf as _;

#[cfg(not(target_arch = "bpf"))]
fn main() {}

// On the host this binary is empty: its dependencies serve the bpf build.
#[cfg(not(target_arch = "bpf"))]
use {aya_ebpf as _, aya_log_ebpf as _, health_common as _, health_ebpf as _};
