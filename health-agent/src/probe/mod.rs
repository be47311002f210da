//! The full-mesh prober: for every node, ICMP and HTTP to its node IP and to
//! its health IP, all at once (bounded, with jittered starts), so a round
//! over N nodes costs about one timeout plus the spread. Also the :4240
//! hello server ([`hello`]) that answers other nodes' HTTP probes.

pub mod error;
pub mod family;
pub mod hello;
pub mod history;
pub mod http;
mod http_round;
pub mod icmp;
pub mod metrics;
pub mod order;
mod pace;
pub mod path;
mod round;
pub mod scheduler;
pub mod status;

pub use http_round::RESERVED_FILES;
pub use round::{ProbeConfig, Prober};
