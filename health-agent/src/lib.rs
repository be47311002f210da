//! The health agent as a library: the `health-agent` binary (its CLI lives
//! in `src/bin/health-agent/`) and the integration tests drive it through
//! these modules.
//!
//! Layers, bottom-up; each uses only those below it:
//!
//! | layer | modules | owns |
//! | --- | --- | --- |
//! | helpers | [`util`] | durations, times, CIDRs, error chains |
//! | OS adapters | [`sys`] | namespaces, netlink, pidfile, signals, raw ICMP sockets |
//! | kernel object | [`datapath`] | loading, pinning and attaching every program; typed map access |
//! | membership | [`membership`] | who is in the cluster: node records, nodes file, etcd, routes |
//! | prober | [`probe`] | probing every node, the hello server, probe history |
//! | endpoint | [`endpoint`] | the health endpoint: its veth, addresses, routes and lifecycle |
//! | cluster view | [`cluster`] | what the cluster sees: subsets, summaries, the view and matrix |
//! | tasks | [`supervisor`] | running, watching, restarting and stopping long-lived tasks |
//! | service | [`api`], [`metrics`], [`web`], [`page`], [`config`], [`daemon`] | the unix-socket API; Prometheus metrics; the metrics listener; the connectivity page; the daemon's settings, typed once; the supervisor that runs it all |
//!
//! [`util`] holds small helpers every layer may use (durations, times,
//! error chains).

pub mod api;
pub mod cluster;
pub mod config;
pub mod daemon;
pub mod datapath;
pub mod encryption;
pub mod endpoint;
pub mod membership;
pub mod metrics;
pub mod page;
pub mod probe;
pub mod supervisor;
pub mod sys;
pub mod util;
pub mod web;

// `unused_crate_dependencies` judges each target alone: these serve the
// binary's edge (error reports, the log subscriber and its `log` bridge,
// shell completions and man pages).
use anyhow as _;
use clap_complete as _;
use clap_mangen as _;
use log as _;
use tracing_subscriber as _;
