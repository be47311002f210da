//! The prober: ICMP and HTTP rounds over every node, their history and status, the hello server.
//! Imported by `endpoint`, `cluster` and above; imports `membership`, `datapath`, `sys`, `util`.
//!
//! The full-mesh prober: for every node, ICMP and HTTP to its node IP and to
//! its health IP, all at once (bounded, with jittered starts), so a round
//! over N nodes costs about one timeout plus the spread. Also the :4240
//! hello server ([`hello`]) that answers other nodes' HTTP probes.

mod arrival;
mod config;
pub mod error;
mod error_class;
pub mod family;
pub mod flows;
mod flows_round;
pub mod hello;
pub mod history;
pub mod http;
mod http_round;
pub mod icmp;
mod icmp_round;
mod kernel_rtt;
pub mod liveness;
pub mod metrics;
pub mod order;
mod pace;
pub mod path;
pub mod path_record;
pub mod peers;
mod published;
pub mod quality;
pub mod quality_view;
mod round;
pub mod scheduler;
pub mod settings;
pub mod status;
pub mod status_counts;
mod targets;
pub mod trace;

pub use config::ProbeConfig;
pub use http_round::{RESERVED_FILES, fd_budget};
pub(crate) use published::CHUNK;
pub use round::Prober;
