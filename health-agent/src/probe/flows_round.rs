//! A round's flows recorded in the paths they probed: each flow's window
//! (which names the failing ones) and every flow's probe in the path's
//! loss and percentiles.

use super::{Prober, flows::FlowSamples, path::ProbeResult};
use crate::membership::NodeSet;

impl Prober {
    /// Records the flows of the round's ICMP and HTTP probes (`samples`,
    /// in that order; `None` with one flow) in the paths of `keys`, after
    /// [`Prober::record`] took each path's picked outcome.
    pub(super) fn record_flows(
        &self,
        nodes: &NodeSet,
        keys: &[(u32, u8)],
        samples: &[Option<FlowSamples>; 2],
    ) {
        if samples.iter().all(Option::is_none) {
            return;
        }
        let plan = self.cfg.flows;
        let per_flow = keys.len();
        let threshold = self.cfg.thresholds.failure;
        let degraded_loss = self.cfg.degraded_loss;
        let at = super::quality::clock_ms();
        let current = self.nodes();
        let Ok(mut paths) = self.paths.lock() else {
            return;
        };
        for (t, &(node, address)) in keys.iter().enumerate() {
            let node = &nodes[node as usize];
            if !current.contains(&node.name) {
                continue;
            }
            let Some(entry) = paths.get_mut(node.name.as_str()) else {
                continue;
            };
            for (kind, flows) in samples.iter().enumerate() {
                let Some(flows) = flows else { continue };
                let slot = 2 * usize::from(address) + kind;
                let q = entry.quality_mut(slot);
                for sample in flows.others(t) {
                    q.record(at, sample);
                }
                let lossy = q.is_degraded(at, degraded_loss);
                let state = entry.state_mut(slot);
                let source = |f| {
                    if kind == 0 {
                        plan.icmp_id(f, per_flow)
                    } else {
                        plan.tcp_port(f)
                    }
                };
                state
                    .flows_mut()
                    .record(plan.count, flows.answered(t), source, threshold);
                state.degraded = lossy && state.result == ProbeResult::Success;
            }
        }
    }
}
