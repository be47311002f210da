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
mod per_peer;
mod pieces;

#[cfg(test)]
pub(crate) use pieces::PIECE;

use std::{path::PathBuf, sync::Arc};

use bytes::Bytes;

use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::{
    datapath::report::MapsReport,
    endpoint::SharedView,
    membership::published::Nodes,
    probe::{Prober, metrics::ProbeMetrics},
};

/// The `Content-Type` of [`Metrics::pieces`]' text.
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

/// How long a scrape keeps its turn at most.
const SCRAPE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// The agent's registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Scrapes encode one at a time: each may walk every path.
    turns: Arc<tokio::sync::Semaphore>,
    /// How long a scrape keeps its turn at most (30 s): a client reading
    /// slower than that gets a broken answer.
    deadline: std::time::Duration,
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
            turns: Arc::new(tokio::sync::Semaphore::new(1)),
            deadline: SCRAPE_DEADLINE,
        }
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

    /// A scrape's turn lasting `deadline` at most, not 30 s.
    #[cfg(test)]
    #[must_use]
    pub(crate) fn with_deadline(mut self, deadline: std::time::Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// The `OpenMetrics` exposition of every series as it is written
    /// (see module `pieces`): one scrape encodes at a time, on a blocking
    /// thread, a few pieces of 64 KiB ahead of its client at most, for
    /// 30 s at most.
    pub fn pieces(
        self: &Arc<Self>,
    ) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
        pieces::stream(Arc::clone(self), Arc::clone(&self.turns))
    }
}
