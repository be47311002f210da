//! What the developer tasks share with the build and the tests: the eBPF
//! toolchain pin, read by `cargo xtask setup` (which installs it) and by
//! `health-agent/build.rs` (which builds the kernel programs with it); the
//! Debian package, built by `cargo xtask package` and by the package test;
//! the commands the docs quote, checked against the binaries' `--help`.

pub mod copyright;
pub mod docs;
pub mod package;
pub mod pin;

// `unused_crate_dependencies` judges each target alone: these serve the
// `cargo xtask` binary.
use anyhow as _;
use clap as _;
use libc as _;
