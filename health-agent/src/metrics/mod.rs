//! Prometheus metrics: the collectors read at scrape time and the prober's instruments.
//! Imported by `api`, `web`, `daemon`; imports `membership`, `probe`, `endpoint`, `datapath`.
//!
//! Prometheus metrics, encoded by `prometheus-client` (`OpenMetrics` text).
//!
//! Series are bounded by default: connectivity is counted by path type and
//! status, latency is a histogram by path type, protocol and RTT source;
//! nothing is labelled by peer unless `--metrics-per-peer` asks for it.
//! Most series are read at scrape time from what the agent already
//! publishes (the status, the endpoint view, the node set, the pinned
//! maps); only the prober's instruments are updated as it works.

mod agent;
mod connectivity;
mod datapath;
mod encode;
mod exposition;
mod per_peer;

pub use exposition::ExpositionError;

use std::{path::PathBuf, sync::Arc};

use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::{
    datapath::report::MapsReport,
    endpoint::SharedView,
    membership::published::Nodes,
    probe::{Prober, metrics::ProbeMetrics},
};

/// The `Content-Type` of [`Metrics::exposition`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Every metric name starts with this and an underscore.
pub const PREFIX: &str = "health";

/// What the metrics are read from.
#[derive(Debug, Clone)]
pub struct Sources {
    /// The prober in service (its published status).
    pub prober: watch::Receiver<Arc<Prober>>,
    /// The prober's instruments, shared by every prober of the run.
    pub probe: Arc<ProbeMetrics>,
    pub nodes: Nodes,
    pub endpoint: SharedView,
    /// bpffs directory of the pinned maps.
    pub pin_dir: PathBuf,
    /// The maintenance task's last walk of the maps.
    pub maps: MapsReport,
    /// Series per peer and path (`--metrics-per-peer`).
    pub per_peer: bool,
}

/// The agent's registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// The last encoding, and the turn to make the next: scrapes encode
    /// one at a time, as each may walk every path.
    shared: exposition::Shared,
}

impl Metrics {
    #[must_use]
    pub fn new(sources: Sources) -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        sources.probe.register(&mut registry);
        registry.register_collector(Box::new(connectivity::ConnectivityCollector {
            prober: sources.prober,
            per_peer: sources.per_peer,
        }));
        registry.register_collector(Box::new(datapath::DatapathCollector {
            pin_dir: sources.pin_dir,
            report: sources.maps,
        }));
        registry.register_collector(Box::new(agent::AgentCollector {
            view: sources.endpoint,
            nodes: sources.nodes,
        }));
        Self {
            registry,
            shared: exposition::Shared::default(),
        }
    }

    /// The metrics of the probers of `probers` alone, series per peer
    /// when `per_peer`: no node set, no endpoint, no pinned maps (tests).
    #[cfg(test)]
    #[must_use]
    pub fn of_probers(probers: watch::Receiver<Arc<Prober>>, per_peer: bool) -> Self {
        Self::new(Sources {
            prober: probers,
            probe: Arc::new(ProbeMetrics::default()),
            nodes: Nodes::new("none".into()),
            endpoint: crate::endpoint::shared_view(),
            pin_dir: "/nonexistent".into(),
            maps: MapsReport::default(),
            per_peer,
        })
    }

    /// The `OpenMetrics` exposition of every series, as of now, whole.
    #[cfg(test)]
    #[must_use]
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(8 * 1024);
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!("encoding the metrics: {e}");
        }
        out
    }
}
