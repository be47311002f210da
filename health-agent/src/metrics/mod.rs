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

/// The agent's registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
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
        Self { registry }
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

    /// The `OpenMetrics` exposition of every series as it is written, in
    /// pieces of about
    /// `PIECE` (64 KiB) bytes: encoded on a blocking thread (the pinned maps'
    /// reads and, with `--metrics-per-peer`, a walk of every path), which
    /// waits while the client has `PIECES_AHEAD` (2) pieces unread. A scrape
    /// at 10,000 peers holds a piece and a chunk of nodes' statuses, not
    /// the megabytes of its text. A client that goes ends the encoding.
    pub fn pieces(self: &Arc<Self>) -> impl futures::Stream<Item = Bytes> + Send + 'static {
        let (tx, mut rx) = tokio::sync::mpsc::channel(PIECES_AHEAD);
        let metrics = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let mut out = Pieces {
                tx,
                piece: String::with_capacity(PIECE),
            };
            let sent = prometheus_client::encoding::text::encode(&mut out, &metrics.registry)
                .and_then(|()| out.send());
            // A client that went is nothing to tell.
            if let Err(e) = sent
                && !out.tx.is_closed()
            {
                tracing::warn!("encoding the metrics: {e}");
            }
        });
        futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }
}

/// The size of the pieces [`Metrics::pieces`] sends.
pub(crate) const PIECE: usize = 64 << 10;
/// Pieces written and not yet sent, at most.
const PIECES_AHEAD: usize = 2;

/// Text written into pieces, each sent once full.
struct Pieces {
    tx: tokio::sync::mpsc::Sender<Bytes>,
    piece: String,
}

impl Pieces {
    /// Sends the piece written so far, waiting for room.
    fn send(&mut self) -> std::fmt::Result {
        let piece = std::mem::replace(&mut self.piece, String::with_capacity(PIECE));
        self.tx
            .blocking_send(Bytes::from(piece))
            .map_err(|_| std::fmt::Error)
    }
}

impl std::fmt::Write for Pieces {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        self.piece.push_str(s);
        if self.piece.len() >= PIECE {
            self.send()?;
        }
        Ok(())
    }
}
