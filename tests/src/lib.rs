//! Fixtures shared by the integration tests (`tests/integration`) and the
//! benchmarks and demo (the `health-lab` crate): namespaces that play
//! nodes, packet builders with their own checksum code, a raw-socket pinger.
//!
//! Everything here runs as root and only ever addresses 198.18.0.0/15,
//! `2001:2::/48` and link-local addresses inside namespaces it created (or
//! loopback).
#![allow(
    clippy::print_stderr,
    reason = "fixtures warn on stderr when cleanup fails in Drop"
)]
#![allow(
    clippy::missing_panics_doc,
    reason = "test fixtures panic on purpose, naming the failed step"
)]

pub mod agent;
pub mod api;
pub mod browser;
pub mod capture;
pub mod capture6;
pub mod chaos;
pub mod cluster;
pub mod echo_check;
pub mod echo_classes;
pub mod echo_classes6;
pub mod etcd;
pub mod etcd_cluster;
pub mod faults;
pub mod names;
pub mod nat_setup;
pub mod netns_guard;
pub mod nft;
pub mod packets;
pub mod packets6;
pub mod pinger;
pub mod pinger6;
pub mod pins;
pub mod process;
pub mod prometheus;
pub mod router_chain;
pub mod scratch;
pub mod tc_run;
pub mod topology;
pub mod watch;
pub mod wireguard;

/// Fails loudly (rather than skipping) when the tests are not run as root:
/// a skipped test proves nothing.
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests need root (network namespaces, BPF): run them with sudo or as root"
    );
}

/// `d` stretched by `HEALTH_TEST_TIME_SCALE` (a number, default 1): the
/// guests of `cargo xtask test --kernel` run under TCG, several times
/// slower than the host, and set it. Deadlines of readiness and
/// convergence go through this; nothing else changes.
#[must_use]
pub fn patience(d: std::time::Duration) -> std::time::Duration {
    let scale = std::env::var("HEALTH_TEST_TIME_SCALE")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 1.0)
        .unwrap_or(1.0);
    d.mul_f64(scale)
}

/// Flags every test agent gets from the environment:
/// `HEALTH_TEST_ATTACH=tc|tcx|auto` adds `--attach VALUE` (to run any
/// selection of the tests on the classic tc hook).
#[must_use]
pub fn agent_env_args() -> Vec<String> {
    std::env::var("HEALTH_TEST_ATTACH")
        .ok()
        .filter(|v| !v.is_empty())
        .map(|v| vec!["--attach".to_owned(), v])
        .unwrap_or_default()
}

/// Counter `name` among `counters` (as the datapath's `counters` functions
/// return them); panics naming a counter that is not there.
#[must_use]
pub fn counter(counters: &[(&str, u64)], name: &str) -> u64 {
    counters.iter().find(|(n, _)| *n == name).map_or_else(
        || panic!("no counter {name:?} in {counters:?}"),
        |(_, v)| *v,
    )
}

// The integration tests' own dependencies, seen by this library's unit
// tests too (`unused_crate_dependencies` judges each target alone).
#[cfg(test)]
use {axum as _, aya as _, tokio_util as _, xtask as _};
