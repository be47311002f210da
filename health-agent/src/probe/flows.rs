//! ECMP flows (`--probe-flows N`): each path is probed N times a round,
//! each probe from a source of its own that stays the same from round to
//! round (an ICMP identifier, a TCP source port), so a router hashing
//! flows over several next hops sends each flow the same way every time
//! and one bad member of the group shows as one flow failing while the
//! others answer: *partial loss*, with the failing flows named.

use serde::{Deserialize, Serialize};

/// The most flows per path.
pub const MAX_FLOWS: u16 = 64;

/// Rounds of each flow's results kept (one bit a round).
const WINDOW: u32 = u64::BITS;

/// The round's flows: how many, and the sources that name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowPlan {
    /// Probes per path each round (1: no flows, the default).
    pub count: u16,
    /// The ICMP identifier of flow 0 (flow `f` uses `icmp_base + f` while
    /// a flow's requests fit one identifier's 65,536 sequence numbers).
    pub icmp_base: u16,
    /// The TCP source port of flow 0 (flow `f` binds `tcp_base + f`).
    pub tcp_base: u16,
}

impl FlowPlan {
    /// `count` flows from sources chosen once for the prober's life: an
    /// identifier at random, ports at random outside the ephemeral range
    /// of the namespace the probes leave from, so no socket the kernel
    /// numbers for itself (a connection of this process or another's)
    /// holds a flow's port when its probe binds it. From the node's
    /// namespace (`from_endpoint` false) that is the node's
    /// `net.ipv4.ip_local_port_range`, read here; from the endpoint's, a
    /// namespace the agent made and nobody tunes, the kernel's default
    /// (each namespace starts with it, whatever the node's says).
    #[must_use]
    pub fn new(count: u16, from_endpoint: bool) -> Self {
        let range = if from_endpoint {
            KERNEL_EPHEMERAL_RANGE
        } else {
            ephemeral_range()
        };
        Self::outside(count, range)
    }

    /// `count` flows whose ports avoid the ephemeral range `(lo, hi)`:
    /// above it when `MAX_FLOWS` ports fit there, below it (not under
    /// 1024) when they fit there, and within the dynamic range
    /// (49152–65535, IANA) when the range leaves no room either side.
    #[must_use]
    pub fn outside(count: u16, (lo, hi): (u16, u16)) -> Self {
        let count = count.clamp(1, MAX_FLOWS);
        let top = u16::MAX - MAX_FLOWS;
        let ports = if hi < top {
            hi + 1..=top
        } else if lo > 1024 + MAX_FLOWS {
            1024..=lo - MAX_FLOWS
        } else {
            49_152..=top
        };
        Self {
            count,
            icmp_base: fastrand::u16(..),
            tcp_base: fastrand::u16(ports),
        }
    }

    /// Whether each path gets more than one probe a round.
    #[must_use]
    pub const fn many(&self) -> bool {
        self.count > 1
    }

    /// The TCP source port flow `f` binds, with flows on.
    #[must_use]
    pub const fn tcp_port(&self, f: u16) -> u16 {
        self.tcp_base.wrapping_add(f)
    }

    /// The ICMP identifier of flow `f` in a round of `per_flow` targets
    /// (a flow takes one identifier per 65,536 of them; see
    /// [`super::icmp::Numbering`]).
    #[must_use]
    #[allow(
        clippy::cast_possible_truncation,
        reason = "identifiers wrap around 16 bits"
    )]
    pub const fn icmp_id(&self, f: u16, per_flow: usize) -> u16 {
        let blocks = per_flow.div_ceil(1 << 16);
        let blocks = if blocks == 0 { 1 } else { blocks };
        self.icmp_base.wrapping_add((f as usize * blocks) as u16)
    }
}

/// The ephemeral port range every network namespace starts with.
const KERNEL_EPHEMERAL_RANGE: (u16, u16) = (32_768, 60_999);

/// The node's ephemeral port range (the kernel's default when it cannot
/// be read).
fn ephemeral_range() -> (u16, u16) {
    crate::sys::sysctl::local_port_range().unwrap_or(KERNEL_EPHEMERAL_RANGE)
}

impl Default for FlowPlan {
    fn default() -> Self {
        Self::new(1, false)
    }
}

/// One flow of a path, as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlowLoss {
    pub flow: u16,
    /// What names it on the wire: the ICMP identifier or the TCP source
    /// port.
    pub source: u16,
    /// Rounds in the window (at most 64).
    pub probes: u32,
    pub lost: u32,
    /// Lost its last `failure_threshold` probes in a row, and at least
    /// half of the window's.
    #[serde(default, skip_serializing_if = "is_false")]
    pub failing: bool,
    /// The window, a bit a round, newest lowest: set when lost.
    #[serde(skip)]
    bits: u64,
}

#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's skip_serializing_if passes a reference"
)]
const fn is_false(b: &bool) -> bool {
    !*b
}

impl FlowLoss {
    /// The share of the window's probes lost.
    #[must_use]
    pub fn ratio(&self) -> f64 {
        if self.probes == 0 {
            0.0
        } else {
            f64::from(self.lost) / f64::from(self.probes)
        }
    }
}

/// A path's flows over their windows.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathFlows {
    pub flows: Vec<FlowLoss>,
}

impl PathFlows {
    /// Records a round: flow `f` answered when bit `f` of `answered` is
    /// set; `sources(f)` names flow `f` this round. A flow is failing
    /// once it lost its last `threshold` probes and half its window.
    pub fn record(
        &mut self,
        count: u16,
        answered: u64,
        sources: impl Fn(u16) -> u16,
        threshold: u32,
    ) {
        let count = usize::from(count.min(MAX_FLOWS));
        if self.flows.len() != count {
            self.flows = (0..count)
                .map(|f| FlowLoss {
                    flow: u16::try_from(f).unwrap_or(u16::MAX),
                    source: 0,
                    probes: 0,
                    lost: 0,
                    failing: false,
                    bits: 0,
                })
                .collect();
        }
        let run = threshold.clamp(1, WINDOW);
        let last_run = if run == WINDOW {
            u64::MAX
        } else {
            (1u64 << run) - 1
        };
        for (f, flow) in self.flows.iter_mut().enumerate() {
            let lost = answered & (1 << f) == 0;
            flow.bits = (flow.bits << 1) | u64::from(lost);
            flow.probes = (flow.probes + 1).min(WINDOW);
            let window = if flow.probes == WINDOW {
                u64::MAX
            } else {
                (1u64 << flow.probes) - 1
            };
            flow.lost = (flow.bits & window).count_ones();
            flow.source = sources(flow.flow);
            flow.failing = flow.probes >= run
                && flow.bits & last_run == last_run
                && 2 * flow.lost >= flow.probes;
        }
    }

    /// The failing flows, when some answer: partial loss. Empty when none
    /// fails, or when every flow does (the path is down, not partly).
    #[must_use]
    pub fn partial(&self) -> Vec<&FlowLoss> {
        let failing: Vec<_> = self.flows.iter().filter(|f| f.failing).collect();
        if failing.len() == self.flows.len() {
            Vec::new()
        } else {
            failing
        }
    }

    /// The failing flows as one line: `flow 3 (source 51234) lost 12 of
    /// 12`.
    #[must_use]
    pub fn partial_line(&self) -> Option<String> {
        let failing = self.partial();
        if failing.is_empty() {
            return None;
        }
        let named: Vec<String> = failing
            .iter()
            .map(|f| {
                format!(
                    "flow {} (source {}) lost {} of {}",
                    f.flow, f.source, f.lost, f.probes
                )
            })
            .collect();
        Some(format!(
            "partial loss: {} of {} flows failing: {}",
            failing.len(),
            self.flows.len(),
            named.join(", ")
        ))
    }
}

/// A round's requests of every flow, flow after flow: request `f * n + t`
/// is flow `f`'s probe of target `t`.
#[derive(Debug, Clone, Copy)]
pub struct Spread {
    /// Targets a flow.
    pub n: usize,
    pub flows: usize,
}

impl Spread {
    /// Target `t`'s request of flow `f`.
    #[must_use]
    pub const fn request(&self, f: usize, t: usize) -> usize {
        f * self.n + t
    }

    /// Flow and target of request `i`.
    #[must_use]
    pub const fn of(&self, i: usize) -> (usize, usize) {
        match (i.checked_div(self.n), i.checked_rem(self.n)) {
            (Some(f), Some(t)) => (f, t),
            _ => (0, 0),
        }
    }

    /// Target `t`'s flows that answered, a bit each, from the results of
    /// every request.
    pub fn answered<T>(&self, t: usize, results: &[T], ok: impl Fn(&T) -> bool) -> u64 {
        (0..self.flows.min(64)).fold(0, |bits, f| {
            let hit = results.get(self.request(f, t)).is_some_and(&ok);
            bits | (u64::from(hit) << f)
        })
    }
}

/// The round's addresses (or what each has, its node's tag) once per
/// flow, flow after flow (themselves, shared, with one flow).
#[must_use]
pub fn per_flow<T: Copy>(spread: Spread, ips: &std::sync::Arc<Vec<T>>) -> std::sync::Arc<Vec<T>> {
    if spread.flows <= 1 {
        return ips.clone();
    }
    let mut all = Vec::with_capacity(ips.len() * spread.flows);
    for _ in 0..spread.flows {
        all.extend_from_slice(ips);
    }
    std::sync::Arc::new(all)
}

/// A flow's probe that got no answer, in [`FlowSamples`].
const LOST: u64 = u64::MAX;

/// The round's results of every flow (one engine's), as RTTs in
/// nanoseconds.
#[derive(Debug)]
pub struct FlowSamples {
    spread: Spread,
    rtt_ns: Vec<u64>,
}

impl FlowSamples {
    /// The samples of a round's requests, laid out as `spread` says: each
    /// request's RTT, or `None` when it was lost.
    #[must_use]
    pub(super) fn new(
        spread: Spread,
        rtts: impl Iterator<Item = Option<std::time::Duration>>,
    ) -> Self {
        let rtt_ns = rtts
            .map(|rtt| rtt.map_or(LOST, |d| u64::try_from(d.as_nanos()).unwrap_or(LOST - 1)))
            .collect();
        Self { spread, rtt_ns }
    }

    /// Target `t`'s flows that answered, a bit each.
    #[must_use]
    pub fn answered(&self, t: usize) -> u64 {
        self.spread.answered(t, &self.rtt_ns, |&r| r != LOST)
    }

    /// The flow whose outcome stands for target `t`'s round: the first
    /// that answered, else flow 0.
    #[must_use]
    pub fn picked(&self, t: usize) -> usize {
        (0..self.spread.flows)
            .find(|&f| self.rtt_ns[self.spread.request(f, t)] != LOST)
            .unwrap_or(0)
    }

    /// Target `t`'s samples of every flow but the picked one (its RTT, or
    /// `None` when lost): with the picked one's, each probe of the path
    /// counts in its loss and percentiles.
    pub fn others(&self, t: usize) -> impl Iterator<Item = Option<u64>> + '_ {
        let picked = self.picked(t);
        (0..self.spread.flows)
            .filter(move |&f| f != picked)
            .map(move |f| Some(self.rtt_ns[self.spread.request(f, t)]).filter(|&r| r != LOST))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(p: &mut PathFlows, answered: u64) {
        p.record(4, answered, |f| 1000 + f, 3);
    }

    #[test]
    fn one_flow_that_stops_answering_is_partial_loss_named() {
        let mut p = PathFlows::default();
        for _ in 0..5 {
            round(&mut p, 0b1111);
        }
        assert_eq!(p.partial().len(), 0);
        round(&mut p, 0b1011);
        round(&mut p, 0b1011);
        assert_eq!(p.partial().len(), 0, "two losses in a row are not yet");
        for _ in 0..4 {
            round(&mut p, 0b1011);
        }
        let failing = p.partial();
        assert_eq!(failing.len(), 1);
        assert_eq!((failing[0].flow, failing[0].source), (2, 1002));
        assert_eq!((failing[0].lost, failing[0].probes), (6, 11));
        assert!(
            p.partial_line().is_some_and(
                |l| l.contains("1 of 4 flows failing: flow 2 (source 1002) lost 6 of 11")
            ),
            "{:?}",
            p.partial_line()
        );
        // It answers again: no longer failing.
        round(&mut p, 0b1111);
        assert_eq!(p.partial().len(), 0);
    }

    #[test]
    fn scattered_loss_is_not_a_failing_flow_and_all_failing_is_not_partial() {
        let mut p = PathFlows::default();
        for k in 0..64u64 {
            // Every flow loses one round in 8.
            round(&mut p, if k % 8 == 0 { 0 } else { 0b1111 });
        }
        assert_eq!(p.partial().len(), 0);
        assert_eq!(p.flows[0].lost, 8);
        assert!((p.flows[0].ratio() - 0.125).abs() < 1e-9);
        for _ in 0..40 {
            round(&mut p, 0);
        }
        assert!(p.flows.iter().all(|f| f.failing));
        assert_eq!(p.partial().len(), 0, "a path down is not partial loss");
    }

    #[test]
    fn a_late_failing_flow_needs_half_its_window() {
        let mut p = PathFlows::default();
        for _ in 0..60 {
            round(&mut p, 0b1111);
        }
        for _ in 0..3 {
            round(&mut p, 0b0111);
        }
        assert_eq!(p.partial().len(), 0, "3 of 63 lost: not yet failing");
        for _ in 0..29 {
            round(&mut p, 0b0111);
        }
        assert_eq!(p.partial().len(), 1, "32 of 64 lost");
    }

    #[test]
    fn requests_run_flow_after_flow_and_answers_fold_per_target() {
        let s = Spread { n: 3, flows: 4 };
        assert_eq!(s.request(2, 1), 7);
        assert_eq!(s.of(7), (2, 1));
        let results: Vec<bool> = (0..12).map(|i| i != 7 && i != 1).collect();
        assert_eq!(s.answered(1, &results, |&ok| ok), 0b1010);
        assert_eq!(s.answered(0, &results, |&ok| ok), 0b1111);
    }

    #[test]
    fn plans_stay_within_their_ranges() {
        let p = FlowPlan::new(200, false);
        assert_eq!(p.count, MAX_FLOWS);
        assert!(!FlowPlan::new(0, true).many());
        // From the endpoint's namespace: outside the range it starts with.
        let endpoint = FlowPlan::new(MAX_FLOWS, true);
        assert!(endpoint.tcp_base > KERNEL_EPHEMERAL_RANGE.1);
        for _ in 0..1000 {
            let above = FlowPlan::outside(MAX_FLOWS, (32_768, 60_999));
            assert!(above.tcp_base > 60_999 && above.tcp_port(MAX_FLOWS - 1) > above.tcp_base);
            let below = FlowPlan::outside(MAX_FLOWS, (40_000, 65_535));
            assert!(below.tcp_base >= 1024 && below.tcp_port(MAX_FLOWS - 1) < 40_000);
            let within = FlowPlan::outside(MAX_FLOWS, (1024, 65_535));
            assert!(within.tcp_base >= 49_152 && within.tcp_port(MAX_FLOWS - 1) > within.tcp_base);
        }
    }
}
