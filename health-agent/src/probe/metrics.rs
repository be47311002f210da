//! The prober's instruments: probe latency by path type, protocol and RTT
//! source, probes by result, round durations and probes in flight. Their
//! series are fixed (16 label sets at most), whatever the number of peers.

use std::time::Duration;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

use super::path::{Outcome, RttSource};

/// The labels of a latency observation.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LatencyLabels {
    /// `node` (the node's own address) or `endpoint` (its health endpoint).
    r#type: &'static str,
    protocol: &'static str,
    rtt_source: &'static str,
}

/// The labels of a probe count.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    protocol: &'static str,
    result: &'static str,
}

fn latency_histogram() -> Histogram {
    // 10 µs (a kernel-timed handshake between namespaces) to about 1.3 s,
    // doubling.
    Histogram::new(exponential_buckets(0.000_01, 2.0, 18))
}

fn round_histogram() -> Histogram {
    // 50 ms to about 20 s.
    Histogram::new(exponential_buckets(0.05, 1.6, 14))
}

/// The prober's instruments; shared by the probers that replace each other
/// on a reload, so the series go on.
#[derive(Debug)]
pub struct ProbeMetrics {
    latency: Family<LatencyLabels, Histogram, fn() -> Histogram>,
    probes: Family<ResultLabels, Counter>,
    rounds: Histogram,
    in_flight: Gauge,
}

impl Default for ProbeMetrics {
    fn default() -> Self {
        Self {
            latency: Family::new_with_constructor(latency_histogram),
            probes: Family::default(),
            rounds: round_histogram(),
            in_flight: Gauge::default(),
        }
    }
}

/// Path types, by a result's index in a round (node IP at `2i`, health IP
/// at `2i + 1`).
const TYPES: [&str; 2] = ["node", "endpoint"];
const PROTOCOLS: [&str; 2] = ["icmp", "http"];

impl ProbeMetrics {
    /// Registers the instruments in `registry` (prefix it there).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "node_connectivity_latency_seconds",
            "Round-trip time of successful probes, by path type (node, endpoint), protocol and where it was measured (kernel, userspace)",
            self.latency.clone(),
        );
        registry.register(
            "probes",
            "Probes made, by protocol and result",
            self.probes.clone(),
        );
        registry.register(
            "probe_round_duration_seconds",
            "Wall time of a probe round, from its start to its last result",
            self.rounds.clone(),
        );
        registry.register(
            "probes_in_flight",
            "Probes sent and not yet answered or timed out",
            self.in_flight.clone(),
        );
    }

    /// Records a round: `outcomes[i]` is (ICMP, HTTP) to the node IP of a
    /// node when `i` is even, to its health IP when odd. The label sets are
    /// looked up once per round, not once per probe.
    pub fn record_round(&self, outcomes: &[(Outcome, Outcome)], duration: Duration) {
        let handles: [[(Histogram, Histogram); 2]; 2] = TYPES.map(|ty| {
            PROTOCOLS.map(|protocol| {
                let h = |rtt_source| {
                    self.latency
                        .get_or_create(&LatencyLabels {
                            r#type: ty,
                            protocol,
                            rtt_source,
                        })
                        .clone()
                };
                (h("kernel"), h("userspace"))
            })
        });
        let mut counts = [[0u64; 2]; 2];
        for (i, (icmp, http)) in outcomes.iter().enumerate() {
            for (p, outcome) in [icmp, http].into_iter().enumerate() {
                match outcome {
                    Outcome::Ok { rtt, source, .. } => {
                        let (kernel, user) = &handles[i % 2][p];
                        let h = match source {
                            RttSource::Kernel => kernel,
                            RttSource::Userspace => user,
                        };
                        h.observe(rtt.as_secs_f64());
                        counts[p][0] += 1;
                    }
                    Outcome::Failed(_) => counts[p][1] += 1,
                }
            }
        }
        for (p, protocol) in PROTOCOLS.into_iter().enumerate() {
            for (r, result) in ["success", "failure"].into_iter().enumerate() {
                self.probes
                    .get_or_create(&ResultLabels { protocol, result })
                    .inc_by(counts[p][r]);
            }
        }
        self.rounds.observe(duration.as_secs_f64());
    }

    /// `n` probes were sent.
    pub fn sent(&self, n: usize) {
        self.in_flight.inc_by(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// `n` probes were answered or timed out.
    pub fn settled(&self, n: usize) {
        self.in_flight.dec_by(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::error::ProbeError;

    fn text(m: &ProbeMetrics) -> String {
        let mut reg = Registry::with_prefix("health");
        m.register(&mut reg);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg).expect("encode");
        out
    }

    fn ok(ms: u64, source: RttSource) -> Outcome {
        Outcome::Ok {
            rtt: Duration::from_millis(ms),
            warning: None,
            source,
        }
    }

    #[test]
    fn a_round_is_counted_by_type_protocol_source_and_result() {
        let m = ProbeMetrics::default();
        let fail = Outcome::Failed(ProbeError::Protocol("timeout".into()));
        m.record_round(
            &[
                // node IP: ICMP from the kernel, HTTP failed
                (ok(2, RttSource::Kernel), fail.clone()),
                // health IP: both from user space
                (ok(3, RttSource::Userspace), ok(4, RttSource::Userspace)),
            ],
            Duration::from_millis(1200),
        );
        let t = text(&m);
        for line in [
            r#"health_probes_total{protocol="icmp",result="success"} 2"#,
            r#"health_probes_total{protocol="http",result="failure"} 1"#,
            r#"health_probes_total{protocol="http",result="success"} 1"#,
            r#"health_node_connectivity_latency_seconds_count{type="node",protocol="icmp",rtt_source="kernel"} 1"#,
            r#"health_node_connectivity_latency_seconds_count{type="endpoint",protocol="http",rtt_source="userspace"} 1"#,
            r#"health_node_connectivity_latency_seconds_count{type="node",protocol="http",rtt_source="kernel"} 0"#,
            "health_probe_round_duration_seconds_count 1",
            "health_probe_round_duration_seconds_sum 1.2",
        ] {
            assert!(t.contains(line), "missing {line:?} in\n{t}");
        }
    }

    #[test]
    fn series_do_not_grow_with_peers() {
        let count = |peers: usize| {
            let m = ProbeMetrics::default();
            let round: Vec<_> = (0..peers * 2)
                .map(|_| (ok(1, RttSource::Kernel), ok(1, RttSource::Userspace)))
                .collect();
            m.record_round(&round, Duration::from_secs(1));
            text(&m).lines().filter(|l| !l.starts_with('#')).count()
        };
        assert_eq!(count(3), count(200));
    }

    #[test]
    fn in_flight_goes_up_and_down() {
        let m = ProbeMetrics::default();
        m.sent(10);
        m.settled(4);
        assert!(text(&m).contains("health_probes_in_flight 6"));
    }
}
