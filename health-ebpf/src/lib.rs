//! Empty on purpose: this crate's product is the `health` binary, an eBPF
//! object. The library target exists so that `health-agent` can name the crate
//! as a build dependency and be rebuilt when it changes.
#![no_std]
