//! The paths' histories as the API reads them: one node's rounds, every
//! node's strips, and the counts over them.

use std::net::IpAddr;

use super::Prober;
use crate::probe::{
    family::{self, Family, Shown},
    history::{History, HistoryStats, HistoryStrips, NodeHistory, NodeRing},
    published::CHUNK,
};

impl Prober {
    /// `name`'s paths (four per family probed) over the history's window;
    /// `None` when it is not in the node set.
    #[must_use]
    pub fn node_history(&self, name: &str) -> Option<NodeHistory> {
        let nodes = self.nodes();
        let node = nodes.get(name)?;
        // A round is begun in the history before its nodes are recorded, a
        // chunk at a time: read between the two, the window would name a
        // round this node has no result of yet.
        let _whole_rounds = self.recording.lock();
        let paths = self.paths.lock().ok()?;
        let history = self.history.lock().ok()?;
        let empty = NodeRing::default();
        let ring = paths.get(name).map_or(&empty, |p| &p.history);
        let families: Vec<(Family, [IpAddr; 2])> = Shown::of(node, self.cfg.families)
            .shown()
            .map(|f| {
                let (ip, health) =
                    family::addresses(node, f).unwrap_or((f.unspecified(), f.unspecified()));
                (f, [ip, health])
            })
            .collect();
        Some(history.node(name, &families, ring))
    }

    /// Every node's paths over the history's window, one character a
    /// round, in the node set's order.
    #[must_use]
    pub fn history_strips(&self) -> HistoryStrips {
        let nodes = self.nodes();
        let _whole_rounds = self.recording.lock();
        let Some((window, rounds)) = self.history.lock().ok().map(|h| (h.length(), h.rounds()))
        else {
            return HistoryStrips {
                window: self.cfg.history_length,
                rounds: Vec::new(),
                nodes: Vec::new(),
            };
        };
        let mut strips = Vec::with_capacity(nodes.len());
        for chunk in nodes.chunks(CHUNK) {
            let Ok(paths) = self.paths.lock() else { break };
            strips.extend(chunk.iter().map(|n| {
                History::strips(
                    &n.name,
                    &rounds,
                    paths.get(n.name.as_str()).map(|p| &p.history),
                    Shown::of(n, self.cfg.families),
                )
            }));
        }
        HistoryStrips {
            window,
            rounds,
            nodes: strips,
        }
    }

    /// Every node's loss ratio and RTT percentiles over the history's
    /// window, per path, in the node set's order.
    #[must_use]
    pub fn history_stats(&self) -> HistoryStats {
        let nodes = self.nodes();
        let _whole_rounds = self.recording.lock();
        let mut rtts = Vec::with_capacity(self.cfg.history_length);
        let mut stats = Vec::with_capacity(nodes.len());
        let mut window = self.cfg.history_length;
        for chunk in nodes.chunks(CHUNK) {
            let (Ok(paths), Ok(history)) = (self.paths.lock(), self.history.lock()) else {
                return HistoryStats {
                    window,
                    nodes: Vec::new(),
                };
            };
            window = history.length();
            stats.extend(chunk.iter().map(|n| {
                history.stats(
                    &n.name,
                    paths.get(n.name.as_str()).map(|p| &p.history),
                    &mut rtts,
                    Shown::of(n, self.cfg.families),
                )
            }));
        }
        HistoryStats {
            window,
            nodes: stats,
        }
    }
}
