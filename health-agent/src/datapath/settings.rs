//! The node's datapath: routing, masquerade, connection tracking, map
//! sizes, and how the tc programs are attached.
#![allow(
    clippy::doc_markdown,
    reason = "clap turns these doc comments into --help text, shown verbatim"
)]

use std::time::Duration;

use clap::Args;
use health_common::{ct::CtConfig, maps::MapSizes};

use crate::datapath::{TcPolicy, masquerade::PortRange};
use crate::util::section::section;

/// How the endpoint reaches peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Routing {
    Routed,
    Masquerade,
}

section! {
    /// The datapath the agent loads on the node.
    #[derive(Debug, Clone, PartialEq, Eq, Args)]
    pub struct DatapathSettings {
        /// How the endpoint reaches peers. `routed`: routes to every peer's
        /// health CIDR via its node IP, no NAT. `masquerade`: additionally,
        /// traffic to destinations outside --health-range leaves with the node
        /// IP as source (SNAT in BPF on the uplink).
        #[arg(long, value_enum, default_value_t = Routing::Routed)]
        pub routing: Routing,
        /// The node's uplink, where masquerade is attached (default: the
        /// interface that holds the node IP).
        #[arg(long, value_name = "IFACE",
              value_parser = crate::endpoint::settings::interface_name)]
        pub uplink: Option<String>,
        /// Ports and ICMP echo identifiers masquerade hands out; must not
        /// overlap the node's net.ipv4.ip_local_port_range.
        #[arg(long, value_name = "MIN-MAX", default_value = "61000-65535")]
        pub nat_port_range: PortRange,
        /// How the tc programs (tracking on lxc_health, masquerade on the
        /// uplink, the echo responder by default) are attached: `tcx` links
        /// (Linux >= 6.6), classic `tc` (clsact qdisc + cls_bpf filter in
        /// direct-action mode), or `auto`: tcx where the kernel has it, tc
        /// otherwise.
        #[arg(long, value_enum, default_value_t = TcPolicy::Auto)]
        pub attach: TcPolicy,
        /// Connection-tracking lifetime of ICMP entries.
        #[arg(long, default_value = "60s", value_parser = crate::util::duration::parse_whole_secs)]
        pub ct_lifetime_icmp: Duration,
        /// Connection-tracking lifetime of established TCP entries.
        #[arg(long, default_value = "6h", value_parser = crate::util::duration::parse_whole_secs)]
        pub ct_lifetime_tcp: Duration,
        /// Lifetime of TCP entries before the handshake completes, and of UDP.
        #[arg(long, default_value = "60s", value_parser = crate::util::duration::parse_whole_secs)]
        pub ct_lifetime_syn: Duration,
        /// Lifetime of closed (FIN/RST) TCP entries.
        #[arg(long, default_value = "10s", value_parser = crate::util::duration::parse_whole_secs)]
        pub ct_lifetime_closed: Duration,
        /// How often expired CT entries are collected and unanswered probes
        /// counted as RTT losses (each pass is walked in slices over the
        /// interval).
        #[arg(long, default_value = "10s", value_parser = crate::util::duration::parse)]
        pub ct_gc_interval: Duration,
        /// Peers the kernel's RTT maps hold (4 keys each: ICMP and TCP to the
        /// node and the health address); also sets the default CT and NAT map
        /// sizes (8 entries per peer; the CT map 16 in dual stack).
        #[arg(long, default_value_t = MapSizes::DEFAULT_MAX_PEERS,
              value_parser = clap::value_parser!(u32).range(16..=1_048_576))]
        pub max_peers: u32,
        /// Connection-tracking map entries (default: 8 per --max-peers, and
        /// 4 more per flow past the first with --probe-flows; twice that
        /// in dual stack).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1024..=16_777_216))]
        pub ct_map_size: Option<u32>,
        /// Masquerade map entries, two per flow (default: as --ct-map-size
        /// for one family; IPv4 only is masqueraded).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1024..=16_777_216))]
        pub nat_map_size: Option<u32>,
    }
}

fn secs(d: Duration) -> u32 {
    u32::try_from(d.as_secs().max(1)).unwrap_or(u32::MAX)
}

impl DatapathSettings {
    /// Whether traffic leaving the cluster's health range is masqueraded.
    #[must_use]
    pub fn masquerade(&self) -> bool {
        self.routing == Routing::Masquerade
    }

    /// The connection-tracking lifetimes, in whole seconds (at least one).
    #[must_use]
    pub fn ct(&self) -> CtConfig {
        CtConfig {
            icmp_s: secs(self.ct_lifetime_icmp),
            udp_s: secs(self.ct_lifetime_syn),
            tcp_syn_s: secs(self.ct_lifetime_syn),
            tcp_established_s: secs(self.ct_lifetime_tcp),
            tcp_closed_s: secs(self.ct_lifetime_closed),
            pad: 0,
        }
    }

    /// The sizes of the maps that grow with the cluster, for probes over
    /// `flows` flows per path (`--probe-flows`: each flow is a connection
    /// of its own) in `families` address families (2: dual-stack).
    #[must_use]
    pub fn map_sizes(&self, flows: u16, families: u8) -> MapSizes {
        let d = MapSizes::for_peers_and_flows(self.max_peers, flows, families);
        MapSizes {
            ct: self.ct_map_size.unwrap_or(d.ct),
            nat: self.nat_map_size.unwrap_or(d.nat),
            ..d
        }
    }
}

/// What the maintenance task is given beside its section: resolved at start.
#[derive(Debug, Clone)]
pub struct MaintenanceStart {
    /// bpffs directory of the pinned maps (`--bpffs-dir`).
    pub pin_dir: std::path::PathBuf,
    /// Leave the pins for the next agent (`--keep-endpoint`).
    pub keep_pins: bool,
    /// Masquerade on the uplink, resolved against the node.
    pub masquerade: Option<super::masquerade::Masquerade>,
    /// The tc hook chosen for the running kernel.
    pub tc_hook: super::TcHook,
    /// Where each walk of the maps is published.
    pub report: super::report::MapsReport,
    /// The probe timeout for the RTT loss sweep, as reloads leave it.
    pub probe_timeout: tokio::sync::watch::Receiver<super::collect::LossTimeout>,
    /// The sizes of the maps that grow with the cluster.
    pub map_sizes: MapSizes,
}

impl super::maintenance::DatapathConfig {
    /// The maintenance task's configuration: the lifetimes, sizes and
    /// collection period `settings` give, and what `start` resolved.
    #[must_use]
    pub fn new(settings: &DatapathSettings, start: MaintenanceStart) -> Self {
        Self {
            pin_dir: start.pin_dir,
            ct: settings.ct(),
            masquerade: start.masquerade,
            gc_interval: settings.ct_gc_interval,
            probe_timeout: start.probe_timeout,
            keep_pins: start.keep_pins,
            map_sizes: start.map_sizes,
            tc_hook: start.tc_hook,
            report: start.report,
        }
    }
}
