//! A round's flows: each target's outcome folded from its flows' (the
//! first that answered), then every flow recorded in the path it probed:
//! each flow's window (which names the failing ones) and every flow's
//! probe in the path's loss and percentiles.

use super::{
    Prober,
    error::ProbeError,
    flows::{FlowSamples, Spread},
    path::{Outcome, ProbeResult},
    published::CHUNK,
};
use crate::membership::NodeSet;

/// Each target's outcome from its flows' (`outcomes`, laid out as
/// `spread` says): the first flow that answered, else flow 0's failure;
/// with more than one flow, every flow's result too.
#[must_use]
pub(super) fn fold(
    spread: Spread,
    mut outcomes: Vec<Outcome>,
) -> (Vec<Outcome>, Option<FlowSamples>) {
    if spread.flows <= 1 {
        return (outcomes, None);
    }
    let samples = FlowSamples::new(
        spread,
        outcomes.iter().map(|o| match o {
            Outcome::Ok { rtt, .. } => Some(*rtt),
            Outcome::Failed(_) => None,
        }),
    );
    let folded = (0..spread.n)
        .map(|t| {
            let i = spread.request(samples.picked(t), t);
            std::mem::replace(
                &mut outcomes[i],
                Outcome::Failed(ProbeError::ReceiverStopped),
            )
        })
        .collect();
    (folded, Some(samples))
}

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
        // The paths are locked a chunk of targets at a time, as
        // `Prober::record` does: with 8 flows at 10,000 peers, this is
        // 300,000 samples.
        for (chunk, targets) in keys.chunks(2 * CHUNK).enumerate() {
            let Ok(mut paths) = self.paths.lock() else {
                return;
            };
            // Under the paths' lock, which a change of the set holds.
            let current = self.nodes();
            for (t, &(node, address)) in (chunk * 2 * CHUNK..).zip(targets) {
                let node = &nodes[node as usize];
                // Gone, or its addresses moved since the round read them.
                let moved = current
                    .get(&node.name)
                    .is_none_or(|now| super::family::moved(node, now) != 0);
                if moved {
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
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::probe::{
        ProbeConfig,
        flows::FlowPlan,
        path::{RttSource, Thresholds},
        targets::targets,
    };

    /// Over more targets than a chunk takes, each target's flows are
    /// recorded in its own path: only the target whose second flow is
    /// lost, in the second chunk, has a failing flow.
    #[test]
    fn each_targets_flows_land_in_its_path_across_chunks() {
        let prober = Prober::new(ProbeConfig {
            flows: FlowPlan::new(2, true),
            thresholds: Thresholds {
                success: 1,
                failure: 1,
            },
            ..ProbeConfig::default()
        });
        prober.set_nodes(NodeSet::numbered(u16::try_from(CHUNK + 44).expect("small")));
        let set = prober.nodes();
        let t = targets(&set, prober.cfg.families);
        let n = t.keys.len();
        assert!(n > 2 * CHUNK, "{n} targets: more than one chunk");
        let lossy = 2 * CHUNK + 7;
        let spread = Spread { n, flows: 2 };
        let outcome = |i: usize| {
            if spread.of(i) == (1, lossy) {
                Outcome::Failed(ProbeError::ReceiverStopped)
            } else {
                Outcome::Ok {
                    rtt: Duration::from_micros(50),
                    warning: None,
                    source: RttSource::Userspace,
                }
            }
        };
        let (icmp, icmp_flows) = fold(spread, (0..2 * n).map(outcome).collect());
        let (http, http_flows) = fold(spread, (0..2 * n).map(outcome).collect());
        prober.record(&set, &t.keys, icmp.into_iter().zip(http), 1, 1000, 1007);
        prober.record_flows(&set, &t.keys, &[icmp_flows, http_flows]);
        let paths = prober.paths.lock().expect("paths");
        for (i, &(node, address)) in t.keys.iter().enumerate() {
            let p = &paths[set[node as usize].name.as_str()];
            for kind in 0..2 {
                let flows = p.state(2 * usize::from(address) + kind).flows();
                let failing: Vec<u16> = flows
                    .map(|f| f.partial().iter().map(|l| l.flow).collect())
                    .unwrap_or_default();
                let want: &[u16] = if i == lossy { &[1] } else { &[] };
                assert_eq!(failing, want, "target {i}, kind {kind}");
            }
        }
    }

    #[test]
    fn a_target_stands_for_the_first_flow_that_answered() {
        let ok = |us| Outcome::Ok {
            rtt: Duration::from_micros(us),
            warning: None,
            source: RttSource::Userspace,
        };
        let lost = || Outcome::Failed(ProbeError::ReceiverStopped);
        // Two targets, three flows: target 0 loses flow 0, target 1 all.
        let outcomes = vec![lost(), lost(), ok(5), lost(), ok(7), lost()];
        let (folded, samples) = fold(Spread { n: 2, flows: 3 }, outcomes);
        let samples = samples.expect("flows");
        assert_eq!(folded[0], ok(5));
        assert!(matches!(folded[1], Outcome::Failed(_)));
        assert_eq!((samples.answered(0), samples.answered(1)), (0b110, 0));
        assert_eq!(
            samples.others(0).collect::<Vec<_>>(),
            vec![None, Some(7_000)],
            "flow 0 lost, flow 2 answered"
        );
        assert_eq!(samples.others(1).count(), 2);
        let (one, none) = fold(Spread { n: 2, flows: 1 }, vec![ok(1), lost()]);
        assert!(none.is_none() && one.len() == 2);
    }
}
