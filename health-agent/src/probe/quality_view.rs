//! `GET /v1/status/quality?node=NAME`: a node's paths over the sliding
//! windows of [`super::quality`], with their verdicts.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use super::{
    Prober,
    family::{self, Family, Shown, path_index},
    history::PATH_NAMES,
    path::ProbeResult,
    path_record::PathRecord,
    quality::{PathQuality, Quality},
};

/// One path's figures over the windows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PathQualityView {
    /// `host-icmp`, `host-http`, `endpoint-icmp` or `endpoint-http`.
    pub path: String,
    pub family: Family,
    pub ip: IpAddr,
    pub result: ProbeResult,
    /// See [`PathState::degraded`](super::path::PathState::degraded).
    pub degraded: bool,
    /// See [`PathState::mtu_blackhole`](super::path::PathState::mtu_blackhole).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu_blackhole: Option<u16>,
    /// See [`PathState::flows`](super::path::PathState::flows): each flow's loss, with `--probe-flows`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flows: Option<Box<super::flows::PathFlows>>,
    /// `1m`, `10m` and `1h`, in that order.
    pub windows: Vec<Quality>,
}

/// A node's paths, in the order of [`PATH_NAMES`], the primary family's
/// four then the secondary's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeQuality {
    pub node: String,
    /// The loss ratio from which a path is degraded (`--degraded-loss`).
    pub degraded_loss: f64,
    pub paths: Vec<PathQualityView>,
}

impl Prober {
    /// `name`'s paths over the windows, now; `None` when it is not in the
    /// node set.
    #[must_use]
    pub fn node_quality(&self, name: &str) -> Option<NodeQuality> {
        let nodes = self.nodes();
        let node = nodes.get(name)?;
        let now_ms = super::quality::clock_ms();
        let paths = self.paths.lock().ok()?;
        let mine = paths.get(name);
        let empty = PathQuality::default();
        let mut out = Vec::new();
        for f in Shown::of(node, self.cfg.families).shown() {
            let (ip, health) =
                family::addresses(node, f).unwrap_or((f.unspecified(), f.unspecified()));
            for (kind, path) in PATH_NAMES.iter().enumerate() {
                let i = path_index(f, kind);
                let state = mine.map_or(&PathRecord::UNKNOWN, |p| p.state(i));
                let quality = mine.and_then(|p| p.quality(i)).unwrap_or(&empty);
                out.push(PathQualityView {
                    path: (*path).to_owned(),
                    family: f,
                    ip: if kind < 2 { ip } else { health },
                    result: state.result,
                    degraded: state.degraded,
                    mtu_blackhole: state.mtu_blackhole(),
                    flows: state.flows().cloned().map(Box::new),
                    windows: quality.windows(now_ms),
                });
            }
        }
        Some(NodeQuality {
            node: name.to_owned(),
            degraded_loss: self.cfg.degraded_loss,
            paths: out,
        })
    }
}
