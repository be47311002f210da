//! The prober's configuration: timing, bounds, where probes leave from and
//! what is kept of their results.

use std::{sync::Arc, time::Duration};

use super::{
    family::Families, flows::FlowPlan, history, http::HEALTH_PORT, metrics::ProbeMetrics,
    path::Thresholds,
};
use crate::sys::netns::Netns;

/// `--degraded-loss`'s default: 1 %.
pub(super) const DEFAULT_DEGRADED_LOSS: f64 = 0.01;

#[derive(Debug, Clone)]
pub struct ProbeConfig {
    pub interval: Duration,
    /// Time between liveness echoes (see [`super::liveness`]); `None`:
    /// none (`--liveness-interval 0s`, or not shorter than `interval`).
    pub liveness: Option<Duration>,
    pub timeout: Duration,
    pub thresholds: Thresholds,
    /// Probe starts are spread uniformly over this window.
    pub spread: Duration,
    /// HTTP probes in flight at once (each holds a socket).
    pub max_in_flight: usize,
    pub http_port: u16,
    pub local_node: Option<String>,
    /// Namespace the probes leave from (the health endpoint's); the
    /// caller's when `None`.
    pub source_netns: Option<Netns>,
    /// bpffs directory of the datapath maps: RTTs are taken from the
    /// kernel's samples when there are any.
    pub kernel_rtt: Option<std::path::PathBuf>,
    /// Rounds of results kept per path (R of `GET /v1/status/history`).
    pub history_length: usize,
    /// Where rounds are counted (`None`: not instrumented).
    pub metrics: Option<Arc<ProbeMetrics>>,
    /// The families of this agent's endpoint: peers are probed over these
    /// only (an IPv6-only agent does not probe peers' IPv4 addresses).
    pub families: Families,
    /// The loss ratio from which a path in Success is degraded
    /// (`--degraded-loss`).
    pub degraded_loss: f64,
    /// Size of the Don't-Fragment echo sent to each node address every
    /// round (`--probe-mtu`); `None`: none.
    pub mtu_probe: Option<u16>,
    /// Probes per path each round and the sources naming them
    /// (`--probe-flows`).
    pub flows: FlowPlan,
    /// The encryption check, run after each round (`--encryption`).
    pub encryption: Option<Arc<crate::encryption::EncryptionMonitor>>,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(60),
            liveness: None,
            timeout: Duration::from_secs(1),
            thresholds: Thresholds::default(),
            spread: Duration::from_millis(100),
            max_in_flight: 1024,
            http_port: HEALTH_PORT,
            local_node: None,
            source_netns: None,
            kernel_rtt: None,
            history_length: usize::from(history::DEFAULT_LENGTH),
            metrics: None,
            families: Families::default(),
            degraded_loss: DEFAULT_DEGRADED_LOSS,
            mtu_probe: None,
            flows: FlowPlan::default(),
            encryption: None,
        }
    }
}
