//! Empty on purpose: this crate's product is the `health` binary, an eBPF
//! object. The library target exists so that `health-agent` can name the crate
//! as a build dependency and be rebuilt when it changes.
#![no_std]

// `unused_crate_dependencies` judges each target alone: the programs that
// use these are the binary's, built for the bpf target only.
use aya_ebpf as _;
use aya_log_ebpf as _;
use health_common as _;
