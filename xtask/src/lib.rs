//! What the developer tasks share with the build: the eBPF toolchain pin,
//! read by `cargo xtask setup` (which installs it) and by
//! `health-agent/build.rs` (which builds the kernel programs with it).

pub mod pin;
