//! `health-agent daemon`.

use std::{path::PathBuf, time::Duration};

use clap::Args;

use super::{
    PinArgs, SocketArgs,
    config::{self, Invocation},
};
use health_common::{ct::CtConfig, maps::MapSizes};
use tracing::{error, info, warn};

use anyhow::Context as _;
use health_agent::{
    daemon::{
        self, DaemonConfig, DatapathSettings, Discovery, EndpointSettings, MasqueradeFlags,
        MetricsSettings, ProbeSettings,
        reload::{ProbeTuning, Reload},
    },
    datapath::{AttachMode, TcPolicy, masquerade::PortRange},
    membership::{
        kvstore::{Credentials, EtcdConfig, TlsConfig},
        sync::Limits,
    },
    probe::{history, http::HEALTH_PORT, path::Thresholds},
    supervisor::Policy,
    sys::netns::Netns,
    util::cidr,
};
use ipnet::{Ipv4Net, Ipv6Net};

#[derive(Debug, Clone, Args)]
#[command(group(
    clap::ArgGroup::new("health-cidrs")
        .args(["health_cidr", "health_cidr6"])
        .required(true)
        .multiple(true)
))]
pub(crate) struct DaemonArgs {
    /// YAML file of settings: one key per flag of this command, same name
    /// (`probe-interval: 10s`); flags and their environment variables
    /// override it. Re-read on SIGHUP (see `health-agent config
    /// print-defaults`).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The node's share of the pod range (IPv4); the endpoint's IPv4
    /// address comes from it. At least one of --health-cidr and
    /// --health-cidr6 is given; both: a dual-stack endpoint.
    #[arg(long, value_name = "CIDR", value_parser = cidr::parse::<Ipv4Net>)]
    pub health_cidr: Option<Ipv4Net>,
    /// The node's share of the IPv6 pod range (such as
    /// `2001:db8:0:1::/64`; at most a /126); the endpoint's IPv6 address
    /// comes from it. Not with `--routing masquerade` (IPv4 only).
    #[arg(long, value_name = "CIDR", value_parser = parse_health_cidr6)]
    pub health_cidr6: Option<Ipv6Net>,
    /// How the endpoint reaches peers. `routed`: routes to every peer's
    /// health CIDR via its node IP, no NAT. `masquerade`: additionally,
    /// traffic to destinations outside --health-range leaves with the node
    /// IP as source (SNAT in BPF on the uplink).
    #[arg(long, value_enum, default_value_t = Routing::Routed)]
    pub routing: Routing,
    /// The cluster-wide health range that every node's --health-cidr
    /// comes from. Peers' health addresses are routed only inside it (a
    /// record naming another address is refused), and masquerade leaves
    /// destinations inside it alone. Needed with peers (--nodes-file or
    /// --kvstore) when --health-cidr is given.
    #[arg(long, value_name = "CIDR", value_parser = cidr::parse::<Ipv4Net>)]
    pub health_range: Option<Ipv4Net>,
    /// The cluster-wide IPv6 health range that every node's
    /// --health-cidr6 comes from, likewise: needed with peers when
    /// --health-cidr6 is given.
    #[arg(long, value_name = "CIDR", value_parser = cidr::parse::<Ipv6Net>)]
    pub health_range6: Option<Ipv6Net>,
    /// The node's uplink, where masquerade is attached (default: the
    /// interface that holds the node IP).
    #[arg(long, value_name = "IFACE")]
    pub uplink: Option<String>,
    /// Ports and ICMP echo identifiers masquerade hands out; must not
    /// overlap the node's net.ipv4.ip_local_port_range.
    #[arg(long, value_name = "MIN-MAX", default_value = "61000-65535")]
    pub nat_port_range: PortRange,
    /// Name of the endpoint's network namespace (under /run/netns).
    #[arg(long, default_value = "health", value_parser = validate_netns_name)]
    pub endpoint_netns: String,
    /// Host side of the endpoint's veth.
    #[arg(long, default_value = "lxc_health")]
    pub host_iface: String,
    /// Endpoint side of the veth, inside its namespace.
    #[arg(long, default_value = "eth0")]
    pub endpoint_iface: String,
    /// Where the endpoint record (IP, endpoint ID) is kept across restarts.
    #[arg(long, default_value = "/var/lib/health-agent")]
    pub state_dir: PathBuf,
    #[arg(long, default_value = "/var/run/health-agent/health-agent.pid")]
    pub pidfile: PathBuf,
    /// How often the controller verifies the endpoint (it also runs on link events).
    #[arg(long, default_value = "60s", value_parser = health_agent::util::duration::parse)]
    pub controller_interval: Duration,
    /// Attach mode of the echo responder (default: the tc hook --attach
    /// picks: tcx where the kernel has it, classic tc otherwise).
    #[arg(long, value_enum)]
    pub mode: Option<AttachMode>,
    /// How the tc programs (tracking on lxc_health, masquerade on the
    /// uplink, the echo responder by default) are attached: `tcx` links
    /// (Linux >= 6.6), classic `tc` (clsact qdisc + cls_bpf filter in
    /// direct-action mode), or `auto`: tcx where the kernel has it, tc
    /// otherwise.
    #[arg(long, value_enum, default_value_t = TcPolicy::Auto)]
    pub attach: TcPolicy,
    /// On shutdown, leave the namespace, veth, pins and record for the next agent.
    #[arg(long)]
    pub keep_endpoint: bool,
    /// This node's name in the node set (default: the hostname).
    #[arg(long)]
    pub node_name: Option<String>,
    /// Nodes file (YAML or JSON), watched for changes.
    #[arg(long, value_name = "PATH", conflicts_with = "kvstore")]
    pub nodes_file: Option<PathBuf>,
    /// Discover nodes through a key-value store instead of a file.
    #[arg(long, value_enum)]
    pub kvstore: Option<Kvstore>,
    /// Client address of the kvstore, `host:port`.
    #[arg(long, default_value = "127.0.0.1:2379", value_name = "HOST:PORT")]
    pub kvstore_endpoint: String,
    /// Key prefix under which nodes register.
    #[arg(long, default_value = "/health/nodes/")]
    pub kvstore_prefix: String,
    /// TTL of this node's registration lease (kept alive while the agent
    /// runs; revoked when it stops cleanly). A node that dies stays in the
    /// others' node sets this long, so that they see it fail and the
    /// cluster view says "node down" (as Cilium's 15-minute default).
    #[arg(long, default_value = "15m", value_parser = health_agent::util::duration::parse)]
    pub kvstore_lease_ttl: Duration,
    /// CA certificate (PEM) that signed etcd's server certificate: talk to
    /// etcd over TLS (https).
    #[arg(long, value_name = "FILE")]
    pub kvstore_ca: Option<PathBuf>,
    /// Client certificate (PEM) for etcd's --client-cert-auth; with
    /// --kvstore-key and --kvstore-ca.
    #[arg(long, value_name = "FILE", requires_all = ["kvstore_key", "kvstore_ca"])]
    pub kvstore_cert: Option<PathBuf>,
    /// The private key (PEM) of --kvstore-cert.
    #[arg(long, value_name = "FILE", requires = "kvstore_cert")]
    pub kvstore_key: Option<PathBuf>,
    /// etcd user to authenticate as; the password is read from
    /// --kvstore-password-file.
    #[arg(long, value_name = "NAME", requires = "kvstore_password_file")]
    pub kvstore_user: Option<String>,
    /// File holding the --kvstore-user's password (without its final line
    /// break); there is no flag for the password itself.
    #[arg(long, value_name = "FILE", requires = "kvstore_user")]
    pub kvstore_password_file: Option<PathBuf>,
    /// This node's IP as published in the kvstore (default: the source
    /// address of the route to the kvstore).
    #[arg(long)]
    pub node_ip: Option<std::net::Ipv4Addr>,
    /// This node's IPv6 address as published in the kvstore, with
    /// --health-cidr6 (default: the source address toward the kvstore when
    /// it is reached over IPv6, else a global IPv6 address of the interface
    /// holding the IPv4 node IP).
    #[arg(long)]
    pub node_ip6: Option<std::net::Ipv6Addr>,
    /// Time between probe rounds.
    #[arg(long, default_value = "60s", value_parser = health_agent::util::duration::parse)]
    pub probe_interval: Duration,
    /// Timeout of each probe.
    #[arg(long, default_value = "1s", value_parser = health_agent::util::duration::parse)]
    pub probe_timeout: Duration,
    /// Where probes leave from: the health endpoint (so they cross
    /// lxc_health and the datapath tracks and times them) or the node.
    #[arg(long, value_enum, default_value_t = ProbeFrom::Endpoint)]
    pub probe_from: ProbeFrom,
    /// This node's zone (a rack, a failure domain), written in its etcd
    /// record: nodes of one zone probe each other in full whatever
    /// --probe-peers says. With a nodes file, the node's entry says it.
    #[arg(long, value_name = "NAME", value_parser = parse_zone)]
    pub zone: Option<String>,
    /// The largest node set taken: a nodes file or etcd prefix with more
    /// nodes is refused whole, and the last good set is kept (said in
    /// `GET /v1/nodes`).
    #[arg(long, value_name = "N", default_value_t = 65_536,
          value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub max_nodes: u32,
    /// Which peers to probe: `all` (a full mesh), or K: this node's zone
    /// and K other nodes chosen by rendezvous hashing, so each node is
    /// observed by about K others. Default: `all` up to 64 nodes, 32 above.
    #[arg(long, value_name = "all|K")]
    pub probe_peers: Option<health_agent::cluster::subset::ProbePeers>,
    /// Connection-tracking lifetime of ICMP entries.
    #[arg(long, default_value = "60s", value_parser = health_agent::util::duration::parse)]
    pub ct_lifetime_icmp: Duration,
    /// Connection-tracking lifetime of established TCP entries.
    #[arg(long, default_value = "6h", value_parser = health_agent::util::duration::parse)]
    pub ct_lifetime_tcp: Duration,
    /// Lifetime of TCP entries before the handshake completes, and of UDP.
    #[arg(long, default_value = "60s", value_parser = health_agent::util::duration::parse)]
    pub ct_lifetime_syn: Duration,
    /// Lifetime of closed (FIN/RST) TCP entries.
    #[arg(long, default_value = "10s", value_parser = health_agent::util::duration::parse)]
    pub ct_lifetime_closed: Duration,
    /// How often expired CT entries are collected and unanswered probes
    /// counted as RTT losses (each pass is walked in slices over the
    /// interval).
    #[arg(long, default_value = "10s", value_parser = health_agent::util::duration::parse)]
    pub ct_gc_interval: Duration,
    /// Peers the kernel's RTT maps hold (4 keys each: ICMP and TCP to the
    /// node and the health address); also sets the default CT and NAT map
    /// sizes (8 entries per peer).
    #[arg(long, default_value_t = MapSizes::DEFAULT_MAX_PEERS,
          value_parser = clap::value_parser!(u32).range(16..=1_048_576))]
    pub max_peers: u32,
    /// Connection-tracking map entries (default: 8 per --max-peers).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1024..=16_777_216))]
    pub ct_map_size: Option<u32>,
    /// Masquerade map entries, two per flow (default: 8 per --max-peers).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1024..=16_777_216))]
    pub nat_map_size: Option<u32>,
    /// Delay before the first round.
    #[arg(long, default_value = "0s", value_parser = parse_delay)]
    pub probe_initial_delay: Duration,
    /// Probe starts are spread uniformly over this window.
    #[arg(long, default_value = "100ms", value_parser = health_agent::util::duration::parse)]
    pub probe_spread: Duration,
    /// Consecutive successes that make a path Success.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub success_threshold: u32,
    /// Consecutive failures that make a path Failure.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub failure_threshold: u32,
    /// HTTP probes in flight at once (each holds a socket; ICMP probes hold
    /// none). Default: the open-file limit, raised at start (to 1,048,576
    /// with `CAP_SYS_RESOURCE`, else to the hard limit), less 512 for
    /// everything else. Probes past it wait for a slot.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    pub max_in_flight: Option<u64>,
    /// Results kept per path, one a round (`health-agent status --history
    /// NODE`): about 16 bytes per peer and round.
    #[arg(long, value_name = "ROUNDS", default_value_t = history::DEFAULT_LENGTH,
          value_parser = clap::value_parser!(u16).range(1..=i64::from(history::MAX_LENGTH)))]
    pub history_length: u16,
    /// Node-set changes are applied at most this often (with --sync-burst slack)...
    #[arg(long, default_value = "1s", value_parser = health_agent::util::duration::parse)]
    pub sync_min_interval: Duration,
    /// ...and at least this often.
    #[arg(long, default_value = "60s", value_parser = health_agent::util::duration::parse)]
    pub sync_max_interval: Duration,
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub sync_burst: u32,
    /// On SIGTERM, every task must have stopped (and removed what it made)
    /// within this; the rest are aborted.
    #[arg(long, default_value = "1500ms", value_parser = health_agent::util::duration::parse)]
    pub shutdown_timeout: Duration,
    /// Group owning the API socket (mode 0660): its members may run
    /// `health-agent status` and the other API commands.
    #[arg(long, value_name = "GROUP")]
    pub socket_group: Option<String>,
    /// Where Prometheus scrapes `/metrics` and where the connectivity page
    /// (`/`) is served, read-only; `off` serves neither.
    #[arg(long, value_name = "ADDR:PORT|off", default_value = "127.0.0.1:9962", value_parser = parse_serve_addr)]
    pub prometheus_serve_addr: ServeAddr,
    /// Also export series per peer and path (reachability, RTT): their
    /// number grows with the cluster, so they are off by default.
    #[arg(long)]
    pub metrics_per_peer: bool,
    /// Host names (`NAME` or `NAME:PORT`, comma-separated) the metrics
    /// listener answers besides its listen address and `localhost`: a
    /// request naming any other `Host` is refused (421), which defeats DNS
    /// rebinding. A name without a port is accepted bare or with the listen
    /// port; give the port a forwarded or proxied address uses.
    #[arg(long, value_name = "NAME[:PORT],...", value_parser = parse_allowed_hosts)]
    pub web_allowed_hosts: Option<health_agent::web::host::AllowedHosts>,
    #[command(flatten)]
    pub pins: PinArgs,
    #[command(flatten)]
    pub socket: SocketArgs,
}

/// How the endpoint reaches peers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Routing {
    Routed,
    Masquerade,
}

/// Where probes leave from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ProbeFrom {
    Endpoint,
    Node,
}

fn secs(d: Duration) -> u32 {
    u32::try_from(d.as_secs().max(1)).unwrap_or(u32::MAX)
}

/// Supported key-value stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Kvstore {
    Etcd,
}

fn parse_delay(s: &str) -> Result<Duration, String> {
    if s == "0" || s == "0s" {
        Ok(Duration::ZERO)
    } else {
        health_agent::util::duration::parse(s)
    }
}

/// `--prometheus-serve-addr`: an address and port, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ServeAddr(pub Option<std::net::SocketAddr>);

fn parse_serve_addr(s: &str) -> Result<ServeAddr, String> {
    if s == "off" || s.is_empty() {
        return Ok(ServeAddr(None));
    }
    s.parse()
        .map(|a| ServeAddr(Some(a)))
        .map_err(|_| format!("{s:?} is not an ADDR:PORT (such as 127.0.0.1:9962) or `off`"))
}

/// `--web-allowed-hosts`: `NAME[:PORT],...`.
fn parse_allowed_hosts(s: &str) -> Result<health_agent::web::host::AllowedHosts, String> {
    s.parse()
        .map_err(|e: health_agent::web::host::HostError| e.to_string())
}

/// `--health-cidr6`: an IPv6 CIDR that can hold the endpoint.
fn parse_health_cidr6(s: &str) -> Result<Ipv6Net, String> {
    let cidr: Ipv6Net = cidr::parse(s).map_err(|e| e.to_string())?;
    health_agent::endpoint::ipam::check6(cidr).map_err(|e| e.to_string())?;
    Ok(cidr)
}

fn parse_zone(s: &str) -> Result<String, String> {
    health_agent::membership::validate::zone(s).map(str::to_owned)
}

fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
}

fn validate_netns_name(s: &str) -> Result<String, String> {
    Netns::named(s)
        .map(|_| s.to_owned())
        .map_err(|e| e.to_string())
}

impl DaemonArgs {
    /// Where the node set comes from; the etcd TLS and password files are
    /// read and checked here, at start, naming their flag.
    fn discovery(&self) -> anyhow::Result<Discovery> {
        Ok(match (&self.nodes_file, self.kvstore) {
            (Some(path), _) => Discovery::File(path.clone()),
            (None, Some(Kvstore::Etcd)) => Discovery::Etcd(EtcdConfig {
                endpoint: self.kvstore_endpoint.clone(),
                prefix: self.kvstore_prefix.clone(),
                lease_ttl: self.kvstore_lease_ttl,
                tls: self
                    .kvstore_ca
                    .as_deref()
                    .map(|ca| {
                        let pair = self
                            .kvstore_cert
                            .as_deref()
                            .zip(self.kvstore_key.as_deref());
                        TlsConfig::load(ca, pair)
                    })
                    .transpose()?,
                credentials: self
                    .kvstore_user
                    .as_deref()
                    .zip(self.kvstore_password_file.as_deref())
                    .map(|(user, file)| Credentials::load(user, file))
                    .transpose()?,
            }),
            (None, None) => Discovery::None,
        })
    }

    /// The daemon's configuration, in one value (the hostname is read once,
    /// when --node-name is not given).
    fn config(self) -> anyhow::Result<DaemonConfig> {
        let discovery = self.discovery()?;
        let node_name = match self.node_name {
            Some(n) => n,
            None => hostname().context("no --node-name and no hostname to default it to")?,
        };
        Ok(DaemonConfig {
            node_name,
            node_ip: self.node_ip,
            node_ip6: self.node_ip6,
            zone: self.zone,
            socket: self.socket.path,
            socket_group: self.socket_group,
            metrics: MetricsSettings {
                serve_addr: self.prometheus_serve_addr.0,
                per_peer: self.metrics_per_peer,
                allowed_hosts: self.web_allowed_hosts.unwrap_or_default(),
            },
            pidfile: self.pidfile,
            pin_dir: self.pins.dir,
            attach: self.attach,
            endpoint: EndpointSettings {
                cidr: self.health_cidr,
                cidr6: self.health_cidr6,
                netns_name: self.endpoint_netns,
                host_iface: self.host_iface,
                ep_iface: self.endpoint_iface,
                state_dir: self.state_dir,
                mode: self.mode,
                controller_interval: self.controller_interval,
                keep: self.keep_endpoint,
            },
            datapath: DatapathSettings {
                ct: CtConfig {
                    icmp_s: secs(self.ct_lifetime_icmp),
                    udp_s: secs(self.ct_lifetime_syn),
                    tcp_syn_s: secs(self.ct_lifetime_syn),
                    tcp_established_s: secs(self.ct_lifetime_tcp),
                    tcp_closed_s: secs(self.ct_lifetime_closed),
                    pad: 0,
                },
                gc_interval: self.ct_gc_interval,
                map_sizes: {
                    let d = MapSizes::for_peers(self.max_peers);
                    MapSizes {
                        max_peers: self.max_peers,
                        ct: self.ct_map_size.unwrap_or(d.ct),
                        nat: self.nat_map_size.unwrap_or(d.nat),
                    }
                },
                masquerade: (self.routing == Routing::Masquerade).then_some(MasqueradeFlags {
                    health_range: self.health_range,
                    uplink: self.uplink,
                    ports: self.nat_port_range,
                }),
            },
            probe: ProbeSettings {
                interval: self.probe_interval,
                timeout: self.probe_timeout,
                thresholds: Thresholds {
                    success: self.success_threshold,
                    failure: self.failure_threshold,
                },
                spread: self.probe_spread,
                max_in_flight: self.max_in_flight.and_then(|n| usize::try_from(n).ok()),
                http_port: HEALTH_PORT,
                initial_delay: self.probe_initial_delay,
                from_endpoint: self.probe_from == ProbeFrom::Endpoint,
                peers: self.probe_peers,
                history_length: usize::from(self.history_length),
            },
            discovery,
            sync: Limits {
                min_interval: self.sync_min_interval,
                max_interval: self.sync_max_interval,
                burst: self.sync_burst,
            },
            supervisor: Policy {
                stop_deadline: self.shutdown_timeout,
                ..Policy::default()
            },
            health_range: self.health_range,
            health_range6: self.health_range6,
            max_nodes: usize::try_from(self.max_nodes).unwrap_or(usize::MAX),
        })
    }

    pub(crate) async fn run(self, invocation: Option<Invocation>) -> anyhow::Result<()> {
        daemon::run(self.config()?, invocation.map(reloader)).await?;
        Ok(())
    }
}

/// What SIGHUP does: reads the file again with the same command line over
/// it; applies the log level here and hands the probe settings to the
/// daemon; names every other changed key as needing a restart. A file
/// that no longer parses changes nothing.
fn reloader(mut inv: Invocation) -> Reload {
    Box::new(move || {
        let (cli, values) = match inv.reread() {
            Ok(v) => v,
            Err(e) => {
                error!("config file refused, the running settings stay: {e:#}");
                return None;
            }
        };
        let super::Command::Daemon(args) = cli.command else {
            return None;
        };
        let (now, later): (Vec<String>, Vec<String>) = config::changed(&inv.values, &values)
            .into_iter()
            .partition(|k| config::RELOADABLE.contains(&k.as_str()));
        if !later.is_empty() {
            warn!(
                keys = %later.join(", "),
                "config file: these changes need a restart of the agent to take effect"
            );
        }
        for key in &now {
            if key == "log-level"
                && let Err(e) = crate::logging::set_level(&cli.log_level)
            {
                error!("log-level: {e:#}");
                continue;
            }
            match values.get(key) {
                Some(v) => inv.values.insert(key.clone(), v.clone()),
                None => inv.values.remove(key),
            };
        }
        info!(applied = %now.join(", "), "config file re-read");
        Some(ProbeTuning {
            interval: args.probe_interval,
            timeout: args.probe_timeout,
            thresholds: Thresholds {
                success: args.success_threshold,
                failure: args.failure_threshold,
            },
            history_length: usize::from(args.history_length),
        })
    })
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, SocketAddr};

    use clap::Parser as _;

    use super::*;
    use crate::cli::{Cli, Command};

    /// `health-agent daemon ARGS` as the binary parses it (no config file).
    fn daemon(args: &[&str]) -> DaemonArgs {
        let command_line = ["health-agent", "daemon"].iter().chain(args);
        match Cli::try_parse_from(command_line).expect("valid").command {
            Command::Daemon(d) => *d,
            other => unreachable!("parsed {other:?}"),
        }
    }

    #[test]
    fn the_metrics_listener_defaults_to_loopback_port_9962() {
        let d = daemon(&["--health-cidr", "198.18.64.0/24"]);
        let want = SocketAddr::from((Ipv4Addr::LOCALHOST, 9962));
        assert_eq!(d.prometheus_serve_addr, ServeAddr(Some(want)));
        assert!(!d.metrics_per_peer, "per-peer series are opt-in");
        // What the daemon is handed: the same address, on loopback.
        let cfg = daemon(&["--health-cidr", "198.18.64.0/24", "--node-name", "n"])
            .config()
            .expect("a daemon configuration");
        assert_eq!(cfg.metrics.serve_addr, Some(want));
        assert!(cfg.metrics.serve_addr.is_some_and(|a| a.ip().is_loopback()));
        assert!(!cfg.metrics.per_peer);
        // Given, it is used as given; `off` serves nothing.
        let given = daemon(&[
            "--health-cidr",
            "198.18.64.0/24",
            "--prometheus-serve-addr",
            "198.18.0.11:9000",
        ]);
        assert_eq!(
            given.prometheus_serve_addr.0,
            Some(SocketAddr::from((Ipv4Addr::new(198, 18, 0, 11), 9000)))
        );
        let off = daemon(&[
            "--health-cidr",
            "198.18.64.0/24",
            "--prometheus-serve-addr",
            "off",
        ]);
        assert_eq!(off.prometheus_serve_addr, ServeAddr(None));
    }

    #[test]
    fn web_allowed_hosts_are_parsed_and_bad_ones_named() {
        let none = daemon(&["--health-cidr", "198.18.64.0/24", "--node-name", "n"])
            .config()
            .expect("a daemon configuration");
        assert_eq!(none.metrics.allowed_hosts.to_string(), "");
        let given = daemon(&[
            "--health-cidr",
            "198.18.64.0/24",
            "--node-name",
            "n",
            "--web-allowed-hosts",
            "Health.example,node-1.example:8080",
        ])
        .config()
        .expect("a daemon configuration");
        assert_eq!(
            given.metrics.allowed_hosts.to_string(),
            "health.example,node-1.example:8080"
        );
        let err = Cli::try_parse_from([
            "health-agent",
            "daemon",
            "--health-cidr",
            "198.18.64.0/24",
            "--web-allowed-hosts",
            "ok.example,http://evil.example",
        ])
        .expect_err("a URL is not a host")
        .to_string();
        assert!(
            err.contains("--web-allowed-hosts") && err.contains("\"http://evil.example\""),
            "{err}"
        );
    }
}
