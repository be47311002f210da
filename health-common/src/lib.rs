//! Types and packet logic shared by the kernel programs (`health-ebpf`) and the
//! agent (`health-agent`).
//!
//! Everything here is `no_std`, allocation-free and free of kernel helpers, so
//! the same code runs in the verifier-checked programs and in host unit tests.
//! Map keys and values are `#[repr(C)]` with explicit padding: no hole in a key
//! may carry stack garbage into a hash.
#![no_std]

#[cfg(test)]
extern crate std;

pub mod checksum;
pub mod ct;
pub mod echo;
pub mod encrypt;
pub mod flow;
pub mod frame;
pub mod headers;
pub mod maps;
pub mod nat;
pub mod rtt;
