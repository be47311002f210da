//! The agent's API: the unix-socket server, its client and the JSON types they share.
//! Imported by `web`, `daemon` and the CLI; imports the components, `metrics`, `supervisor`.
//!
//! The agent's API: JSON over HTTP/1.1 on a unix socket, shaped after
//! Cilium's health API (`/v1/healthz`, `/v1/endpoints`, ...).

pub mod client;
mod demand;
mod front;
pub(crate) use front::MAX_CONNECTIONS;
mod history_cache;
mod query;
pub mod round_wait;
pub mod server;
mod socket;
mod splice;
pub mod types;
pub mod users;

/// Default socket path.
pub const DEFAULT_SOCKET: &str = "/var/run/health-agent/health.sock";
/// Environment variable that overrides the socket path.
pub const SOCKET_ENV: &str = "HEALTH_AGENT_SOCK";
