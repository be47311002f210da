//! The prober's settings: those fixed for the agent's life, and the
//! tuning a SIGHUP applies at once.
#![allow(
    clippy::doc_markdown,
    reason = "clap turns these doc comments into --help text, shown verbatim"
)]

use std::time::Duration;

use clap::Args;

use crate::util::section::section;
use std::sync::Arc;

use super::{
    ProbeConfig,
    family::Families,
    flows::{FlowPlan, MAX_FLOWS},
    history,
    http::HEALTH_PORT,
    metrics::ProbeMetrics,
    path::Thresholds,
    peers::ProbePeers,
};
use crate::sys::netns::Netns;

/// Where probes leave from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProbeFrom {
    Endpoint,
    Node,
}

section! {
    /// The prober, fixed at start.
    #[derive(Debug, Clone, PartialEq, Eq, Args)]
    pub struct ProbeSettings {
        /// Where probes leave from: the health endpoint (so they cross
        /// lxc_health and the datapath tracks and times them) or the node.
        #[arg(long, value_enum, default_value_t = ProbeFrom::Endpoint)]
        pub probe_from: ProbeFrom,
        /// Which peers to probe: `all` (a full mesh), or K: this node's zone
        /// and K other nodes chosen by rendezvous hashing, so each node is
        /// observed by about K others. Default: `all` up to 64 nodes, 32 above.
        #[arg(long, value_name = "all|K")]
        pub probe_peers: Option<ProbePeers>,
        /// Delay before the first round.
        #[arg(long, default_value = "0s", value_parser = parse_delay)]
        pub probe_initial_delay: Duration,
        /// Probe starts are spread uniformly over this window.
        #[arg(long, default_value = "100ms", value_parser = crate::util::duration::parse)]
        pub probe_spread: Duration,
        /// HTTP probes in flight at once (each holds a socket; ICMP probes hold
        /// none). Default: the open-file limit, raised at start (to 1,048,576
        /// with `CAP_SYS_RESOURCE`, else to the hard limit), less 9,024 for
        /// everything else (the servers' connections at most, and 512), and
        /// at least 64.
        /// Probes past it wait for a slot.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
        pub max_in_flight: Option<u64>,
        /// A path that answers (Success) but loses at least this share of
        /// its probes, with 95 % confidence over a window of 1 minute, 10
        /// minutes or 1 hour, is degraded: `1%`, `0.5%` or a ratio such as
        /// `0.01`.
        #[arg(long, value_name = "LOSS", default_value = "1%", value_parser = LossRatio::parse)]
        pub degraded_loss: LossRatio,
        /// Each round, one more echo per node address, of this many bytes
        /// (the IP packet) with Don't Fragment set: a path that answers
        /// the small echo and loses this one is an MTU black hole. `auto`:
        /// the MTU of the node's default-route interface, at most 1500
        /// (the endpoint's veth); `off`: no such probe.
        #[arg(long, value_name = "auto|off|BYTES", default_value = "auto", value_parser = ProbeMtu::parse)]
        pub probe_mtu: ProbeMtu,
        /// Probes per path each round, each from a source of its own that
        /// stays the same from round to round (ICMP identifier, TCP source
        /// port), so each takes one way through an ECMP group and a bad
        /// member shows as partial loss naming its flows. The cost of
        /// probing grows with it.
        #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=i64::from(MAX_FLOWS)))]
        pub probe_flows: u16,
    }
}

/// `--probe-mtu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeMtu {
    Auto,
    Off,
    Bytes(u16),
}

/// The smallest MTU probe: an IPv6 packet of the minimum link MTU.
pub const MIN_PROBE_MTU: u16 = 1280;

// The kernel times no MTU probe, however small.
const _: () = assert!(health_common::rtt::TIMED_MAX_LEN < MIN_PROBE_MTU as u32);

impl ProbeMtu {
    /// `auto`, `off`, or a size of 1280 to 65535 bytes.
    ///
    /// # Errors
    /// Anything else, naming the value.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s.trim() {
            "auto" => Ok(Self::Auto),
            "off" => Ok(Self::Off),
            t => match t.parse::<u16>() {
                Ok(n) if n >= MIN_PROBE_MTU => Ok(Self::Bytes(n)),
                _ => Err(format!(
                    "invalid MTU probe size {s:?}: expected auto, off or a number of bytes from \
                     {MIN_PROBE_MTU} to 65535"
                )),
            },
        }
    }
}

/// The largest `auto` MTU probe: the MTU of the endpoint's veth, which
/// probes from the endpoint cross.
const ENDPOINT_MTU: u16 = 1500;

impl ProbeMtu {
    /// The probe size in bytes against this node: `auto` reads the MTU
    /// of the interface of the IPv4 default route (at most 1500; 1500
    /// without such a route or when it cannot be read).
    #[must_use]
    pub fn resolve(self) -> Option<u16> {
        match self {
            Self::Off => None,
            Self::Bytes(n) => Some(n),
            Self::Auto => Some(default_route_mtu().map_or(ENDPOINT_MTU, |m| {
                u16::try_from(m)
                    .unwrap_or(u16::MAX)
                    .clamp(MIN_PROBE_MTU, ENDPOINT_MTU)
            })),
        }
    }
}

/// The MTU of the interface of this namespace's IPv4 default route.
fn default_route_mtu() -> Option<u32> {
    crate::sys::netlink::in_netns(None, |nl| async move {
        let oif = nl
            .routes::<std::net::Ipv4Addr>()
            .await?
            .into_iter()
            .find(|r| r.prefix == 0 && r.table == 254)
            .and_then(|r| r.oif);
        match oif {
            Some(i) => nl.link_mtu(i).await,
            None => Ok(None),
        }
    })
    .ok()
    .flatten()
}

impl std::fmt::Display for ProbeMtu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Off => f.write_str("off"),
            Self::Bytes(n) => write!(f, "{n}"),
        }
    }
}

/// A loss ratio, kept in parts per million (so that settings compare
/// exactly).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LossRatio(u32);

impl LossRatio {
    /// `N%` (0 < N ≤ 100) or a ratio in (0, 1].
    ///
    /// # Errors
    /// Anything else, naming the value.
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let (number, scale) = match t.strip_suffix('%') {
            Some(n) => (n.trim(), 10_000.0),
            None => (t, 1_000_000.0),
        };
        let limit = if scale > 100_000.0 { 1.0 } else { 100.0 };
        match number.parse::<f64>() {
            Ok(v) if v > 0.0 && v <= limit => {
                #[expect(
                    clippy::cast_possible_truncation,
                    clippy::cast_sign_loss,
                    reason = "v * scale is in (0, 1e6]"
                )]
                let ppm = (v * scale).round() as u32;
                Ok(Self(ppm.max(1)))
            }
            _ => Err(format!(
                "invalid loss {s:?}: expected a percentage such as 1% (above 0, at most 100%) or a \
                 ratio such as 0.01 (above 0, at most 1)"
            )),
        }
    }

    /// The ratio, in (0, 1].
    #[must_use]
    pub fn ratio(self) -> f64 {
        f64::from(self.0) / 1_000_000.0
    }
}

impl std::fmt::Display for LossRatio {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}%", f64::from(self.0) / 10_000.0)
    }
}

section! {
    /// The prober's tuning: the settings a SIGHUP applies at once (a change
    /// to any other key needs a restart).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Args)]
    pub struct ProbeTuning {
        /// Time between probe rounds.
        #[arg(long, default_value = "60s", value_parser = crate::util::duration::parse)]
        pub probe_interval: Duration,
        /// Time between liveness echoes: between rounds, one ICMP echo to
        /// each probed node's address; a node whose echo goes unanswered
        /// while that path answered is probed in full at once, so a node
        /// that stops shows within seconds, not rounds. Sent while this
        /// agent probes at most 128 nodes (the default subset and full mesh
        /// always) and when shorter than --probe-interval; 0s: none.
        #[arg(long, default_value = "3s", value_parser = parse_delay)]
        pub liveness_interval: Duration,
        /// Timeout of each probe; at most --probe-interval (a round lasts
        /// about one timeout).
        #[arg(long, default_value = "1s", value_parser = crate::util::duration::parse)]
        pub probe_timeout: Duration,
        /// Consecutive successes that make a path Success.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        pub success_threshold: u32,
        /// Consecutive failures that make a path Failure.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
        pub failure_threshold: u32,
        /// Results kept per path, one a round (`health-agent status --history
        /// NODE`): about 8 bytes per peer, address family and round.
        #[arg(long, value_name = "ROUNDS", default_value_t = history::DEFAULT_LENGTH,
              value_parser = clap::value_parser!(u16).range(1..=i64::from(history::MAX_LENGTH)))]
        pub history_length: u16,
    }
}

fn parse_delay(s: &str) -> Result<Duration, String> {
    crate::util::duration::parse_or_zero(s)
}

impl ProbeSettings {
    /// HTTP probes in flight at once; `None`: from the open-file limit.
    #[must_use]
    pub fn max_in_flight(&self) -> Option<usize> {
        self.max_in_flight.and_then(|n| usize::try_from(n).ok())
    }

    /// Whether probes leave from the endpoint (crossing the datapath,
    /// which times them) rather than the node.
    #[must_use]
    pub fn from_endpoint(&self) -> bool {
        self.probe_from == ProbeFrom::Endpoint
    }
}

impl ProbeTuning {
    /// The liveness echoes' interval, when they are on: not zero and
    /// shorter than the probe interval.
    #[must_use]
    pub fn liveness(&self) -> Option<Duration> {
        let every = self.liveness_interval;
        (!every.is_zero() && every < self.probe_interval).then_some(every)
    }

    #[must_use]
    pub const fn thresholds(&self) -> Thresholds {
        Thresholds {
            success: self.success_threshold,
            failure: self.failure_threshold,
        }
    }

    /// Rounds of results kept per path.
    #[must_use]
    pub fn history_length(&self) -> usize {
        usize::from(self.history_length)
    }
}

/// What the prober is given beside its sections: resolved at start.
#[derive(Debug, Clone)]
pub struct ProberStart {
    /// HTTP probes in flight at most, from the open-file limit in force
    /// (`--max-in-flight` lowers it, never raises it).
    pub fd_budget: usize,
    /// This node's name.
    pub local_node: String,
    /// The endpoint's namespace, where probes leave from with
    /// `--probe-from endpoint`.
    pub endpoint_netns: Option<Netns>,
    /// bpffs directory of the datapath maps.
    pub pin_dir: std::path::PathBuf,
    /// The endpoint's families: peers are probed over those.
    pub families: Families,
    /// The MTU probes' size in bytes, `--probe-mtu` resolved against the
    /// node; `None`: off.
    pub mtu_probe: Option<u16>,
}

impl ProbeConfig {
    /// The prober as `settings` and `tuning` say, with what `start`
    /// resolved; one set of instruments for the run (probers made by a
    /// reload clone this configuration, and with it the instruments).
    #[must_use]
    pub fn new(settings: &ProbeSettings, tuning: &ProbeTuning, start: ProberStart) -> Self {
        let from_endpoint = settings.from_endpoint();
        let mut cfg = Self {
            spread: settings.probe_spread,
            max_in_flight: settings
                .max_in_flight()
                .map_or(start.fd_budget, |m| m.min(start.fd_budget)),
            http_port: HEALTH_PORT,
            local_node: Some(start.local_node),
            source_netns: start.endpoint_netns.filter(|_| from_endpoint),
            kernel_rtt: from_endpoint.then_some(start.pin_dir),
            metrics: Some(Arc::new(ProbeMetrics::default())),
            families: start.families,
            degraded_loss: settings.degraded_loss.ratio(),
            mtu_probe: start.mtu_probe,
            flows: FlowPlan::new(settings.probe_flows, from_endpoint),
            ..Self::default()
        };
        cfg.retune(tuning);
        cfg
    }

    /// Whether `tuning` differs from what this configuration runs with.
    #[must_use]
    pub fn is_tuned_as(&self, tuning: &ProbeTuning) -> bool {
        (
            self.interval,
            self.liveness,
            self.timeout,
            self.thresholds,
            self.history_length,
        ) == (
            tuning.probe_interval,
            tuning.liveness(),
            tuning.probe_timeout,
            tuning.thresholds(),
            tuning.history_length(),
        )
    }

    /// Applies the reloadable section.
    pub fn retune(&mut self, tuning: &ProbeTuning) {
        self.interval = tuning.probe_interval;
        self.liveness = tuning.liveness();
        self.timeout = tuning.probe_timeout;
        self.thresholds = tuning.thresholds();
        self.history_length = tuning.history_length();
    }
}
