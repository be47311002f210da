//! The prober's instruments: probe latency by path type, protocol, RTT
//! source and address family, probes by protocol, result and family, round
//! durations, probes in flight and the rounds the in-flight limit held
//! back. Their series are fixed (27 label sets at most: 16 of latency, 8
//! of probes and one each for the rest), whatever the number of peers.

use std::{
    sync::atomic::{AtomicU64, Ordering},
    time::Duration,
};

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

use super::{
    family::Family as AddressFamily,
    path::{Outcome, RttSource},
};

/// The labels of a latency observation.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LatencyLabels {
    /// `node` (the node's own address) or `endpoint` (its health endpoint).
    r#type: &'static str,
    protocol: &'static str,
    rtt_source: &'static str,
    /// `ipv4` or `ipv6`.
    family: &'static str,
}

/// The labels of a probe count.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    protocol: &'static str,
    result: &'static str,
    family: &'static str,
}

/// A family's latency histograms: `[type][protocol]`, (kernel,
/// userspace).
type LatencyHandles = [[(Histogram, Histogram); 2]; 2];

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
    held: Counter,
    /// Held rounds in a row (not exported): the log's pace.
    held_run: AtomicU64,
}

impl Default for ProbeMetrics {
    fn default() -> Self {
        Self {
            latency: Family::new_with_constructor(latency_histogram),
            probes: Family::default(),
            rounds: round_histogram(),
            in_flight: Gauge::default(),
            held: Counter::default(),
            held_run: AtomicU64::new(0),
        }
    }
}

/// Path types: to the node's address, to its health endpoint's.
const TYPES: [&str; 2] = ["node", "endpoint"];
const PROTOCOLS: [&str; 2] = ["icmp", "http"];

impl ProbeMetrics {
    /// Registers the instruments in `registry` (prefix it there).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "node_connectivity_latency_seconds",
            "Round-trip time of successful probes, by path type (node, endpoint), protocol, where it was measured (kernel, userspace) and address family",
            self.latency.clone(),
        );
        registry.register(
            "probes",
            "Paths' results a round (with several flows, one for them together), by protocol, result and address family",
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
        registry.register(
            "probe_rounds_held_by_in_flight_limit",
            "Rounds whose HTTP probes waited for descriptors (their share of --max-in-flight, or none left) until after a probe timeout: each limit's worth of unanswered probes adds a timeout to such a round",
            self.held.clone(),
        );
    }

    /// A family's latency histograms: `[type][protocol]`, (kernel,
    /// userspace).
    fn latency_handles(&self, family: AddressFamily) -> LatencyHandles {
        TYPES.map(|ty| {
            PROTOCOLS.map(|protocol| {
                let h = |rtt_source| {
                    self.latency
                        .get_or_create(&LatencyLabels {
                            r#type: ty,
                            protocol,
                            rtt_source,
                            family: family.as_str(),
                        })
                        .clone()
                };
                (h("kernel"), h("userspace"))
            })
        })
    }

    /// Records a round: `outcomes[i]` is (ICMP, HTTP) to an address of
    /// the family `kind(i).0`, a health endpoint's when `kind(i).1`. The
    /// label sets are looked up once per round and family, not once per
    /// probe, and only for the families the round probed.
    pub fn record_round<'a>(
        &self,
        outcomes: impl IntoIterator<Item = (&'a Outcome, &'a Outcome)>,
        kind: impl Fn(usize) -> (AddressFamily, bool),
        duration: Option<Duration>,
    ) {
        let mut handles: [Option<LatencyHandles>; 2] = [None, None];
        // [family][protocol][success, failure]
        let mut counts = [[[0u64; 2]; 2]; 2];
        let mut probed = [false; 2];
        for (i, (icmp, http)) in outcomes.into_iter().enumerate() {
            let (family, endpoint) = kind(i);
            let f = family.index();
            probed[f] = true;
            for (p, outcome) in [icmp, http].into_iter().enumerate() {
                match outcome {
                    Outcome::Ok { rtt, source, .. } => {
                        let family_handles =
                            handles[f].get_or_insert_with(|| self.latency_handles(family));
                        let (kernel, user) = &family_handles[usize::from(endpoint)][p];
                        let h = match source {
                            RttSource::Kernel => kernel,
                            RttSource::Userspace => user,
                        };
                        h.observe(rtt.as_secs_f64());
                        counts[f][p][0] += 1;
                    }
                    Outcome::Failed(_) => counts[f][p][1] += 1,
                }
            }
        }
        for family in AddressFamily::ALL.into_iter().filter(|f| probed[f.index()]) {
            for (p, protocol) in PROTOCOLS.into_iter().enumerate() {
                for (r, result) in ["success", "failure"].into_iter().enumerate() {
                    self.probes
                        .get_or_create(&ResultLabels {
                            protocol,
                            result,
                            family: family.as_str(),
                        })
                        .inc_by(counts[family.index()][p][r]);
                }
            }
        }
        if let Some(d) = duration {
            self.rounds.observe(d.as_secs_f64());
        }
    }

    /// `n` probes were sent.
    pub fn sent(&self, n: usize) {
        self.in_flight.inc_by(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// `n` probes were answered or timed out.
    pub fn settled(&self, n: usize) {
        self.in_flight.dec_by(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The probes in flight now.
    #[must_use]
    pub fn in_flight(&self) -> i64 {
        self.in_flight.get()
    }

    /// A round's HTTP probes were held back by the in-flight limit past a
    /// probe timeout; returns how many rounds in a row were, this one
    /// included.
    #[must_use = "the count says whether to log"]
    pub fn held_by_limit(&self) -> u64 {
        self.held.inc();
        self.held_run.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// A round's HTTP probes were not held back: a run of held rounds ends.
    pub fn not_held(&self) {
        self.held_run.store(0, Ordering::Relaxed);
    }

    /// The rounds the in-flight limit held back so far.
    #[must_use]
    pub fn rounds_held(&self) -> u64 {
        self.held.get()
    }
}

/// Probes counted in flight (with `metrics`, when there are any) until
/// this is dropped: settled then, whether their round ended or was
/// dropped partway (its prober replaced by a reload).
#[derive(Debug)]
pub struct InFlight<'a> {
    metrics: Option<&'a ProbeMetrics>,
    n: usize,
}

impl<'a> InFlight<'a> {
    /// Counts `n` probes sent.
    #[must_use]
    pub fn sent(metrics: Option<&'a ProbeMetrics>, n: usize) -> Self {
        metrics.inspect(|m| m.sent(n));
        Self { metrics, n }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.metrics.inspect(|m| m.settled(self.n));
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
            [
                // node IP: ICMP from the kernel, HTTP failed
                (ok(2, RttSource::Kernel), fail.clone()),
                // health IP: both from user space
                (ok(3, RttSource::Userspace), ok(4, RttSource::Userspace)),
                // IPv6 node address: ICMPv6 failed, HTTP from the kernel
                (fail.clone(), ok(5, RttSource::Kernel)),
            ]
            .iter()
            .map(|(a, b)| (a, b)),
            |i| match i {
                0 => (AddressFamily::Ipv4, false),
                1 => (AddressFamily::Ipv4, true),
                _ => (AddressFamily::Ipv6, false),
            },
            Some(Duration::from_millis(1200)),
        );
        let t = text(&m);
        for line in [
            r#"health_probes_total{protocol="icmp",result="success",family="ipv4"} 2"#,
            r#"health_probes_total{protocol="http",result="failure",family="ipv4"} 1"#,
            r#"health_probes_total{protocol="http",result="success",family="ipv4"} 1"#,
            r#"health_probes_total{protocol="icmp",result="failure",family="ipv6"} 1"#,
            r#"health_probes_total{protocol="http",result="success",family="ipv6"} 1"#,
            r#"health_node_connectivity_latency_seconds_count{type="node",protocol="icmp",rtt_source="kernel",family="ipv4"} 1"#,
            r#"health_node_connectivity_latency_seconds_count{type="endpoint",protocol="http",rtt_source="userspace",family="ipv4"} 1"#,
            r#"health_node_connectivity_latency_seconds_count{type="node",protocol="http",rtt_source="kernel",family="ipv4"} 0"#,
            r#"health_node_connectivity_latency_seconds_count{type="node",protocol="http",rtt_source="kernel",family="ipv6"} 1"#,
            "health_probe_round_duration_seconds_count 1",
            "health_probe_round_duration_seconds_sum 1.2",
        ] {
            assert!(t.contains(line), "missing {line:?} in\n{t}");
        }
        // The round of nodes that joined: its probes, not its duration.
        let one = ok(1, RttSource::Kernel);
        m.record_round([(&one, &one)], |_| (AddressFamily::Ipv4, false), None);
        let t = text(&m);
        for line in [
            r#"health_probes_total{protocol="icmp",result="success",family="ipv4"} 3"#,
            "health_probe_round_duration_seconds_count 1",
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
            m.record_round(
                round.iter().map(|(a, b)| (a, b)),
                |i| (AddressFamily::ALL[i % 4 / 2], i % 2 == 1),
                Some(Duration::from_secs(1)),
            );
            text(&m).lines().filter(|l| !l.starts_with('#')).count()
        };
        assert_eq!(count(3), count(200));
    }

    #[test]
    fn an_ipv4_only_round_makes_no_ipv6_series() {
        let m = ProbeMetrics::default();
        let one = (ok(1, RttSource::Userspace), ok(1, RttSource::Userspace));
        m.record_round(
            [(&one.0, &one.1)],
            |_| (AddressFamily::Ipv4, false),
            Some(Duration::from_secs(1)),
        );
        let t = text(&m);
        assert!(t.contains(r#"family="ipv4""#), "{t}");
        assert!(!t.contains(r#"family="ipv6""#), "{t}");
    }

    #[test]
    fn in_flight_goes_up_and_down() {
        let m = ProbeMetrics::default();
        m.sent(10);
        m.settled(4);
        assert!(text(&m).contains("health_probes_in_flight 6"));
        let held = InFlight::sent(Some(&m), 3);
        assert_eq!(m.in_flight(), 9);
        drop(held);
        assert_eq!(m.in_flight(), 6, "settled when dropped");
    }

    /// Held rounds are counted for good; the run the log is paced by
    /// starts again after a round that was not held.
    #[test]
    fn held_rounds_count_and_their_runs_start_again() {
        let m = ProbeMetrics::default();
        assert_eq!(
            (m.held_by_limit(), m.held_by_limit(), m.held_by_limit()),
            (1, 2, 3)
        );
        m.not_held();
        assert_eq!(m.held_by_limit(), 1, "a new run");
        assert_eq!(m.rounds_held(), 4);
        assert!(text(&m).contains("health_probe_rounds_held_by_in_flight_limit_total 4"));
    }
}
