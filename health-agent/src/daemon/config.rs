//! The daemon's configuration: what the command line (or a test) gives, in
//! one value, and what is resolved from the node at start: the kernel's
//! features before the API serves, then the initial node set, the node IP
//! and masquerade before anything is made in the node's namespace.

use std::{net::Ipv4Addr, path::PathBuf, time::Duration};

use health_common::ct::CtConfig;
use ipnet::{Ipv4Net, Ipv6Net};
use tracing::info;

use crate::{
    datapath::{
        AttachMode, KernelFeatures, TcHook, TcPolicy,
        kernel::KernelError,
        masquerade::{self, Masquerade, MasqueradeError, PortRange},
    },
    membership::{
        claims::Holders,
        etcd::EtcdConfig,
        file_settle,
        file_version::FileVersion,
        nodes_file,
        record::{LocalNode, Validated},
        sync,
    },
    probe::path::Thresholds,
    supervisor::Policy,
};

/// Everything `health-agent daemon` is told.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// This node's name in the node set.
    pub node_name: String,
    /// This node's zone in its etcd record (`--zone`; a nodes file says
    /// it in the node's entry).
    pub zone: Option<String>,
    /// This node's IP (default: its entry in the nodes file, or the source
    /// address toward etcd).
    pub node_ip: Option<Ipv4Addr>,
    /// This node's IPv6 address (default: its entry in the nodes file, or
    /// found toward etcd).
    pub node_ip6: Option<std::net::Ipv6Addr>,
    pub socket: PathBuf,
    /// Group owning the API socket (its members may use the API).
    pub socket_group: Option<String>,
    pub pidfile: PathBuf,
    /// bpffs directory of the pinned maps.
    pub pin_dir: PathBuf,
    /// `--attach`: tcx where the kernel has it, or forced.
    pub attach: TcPolicy,
    pub endpoint: EndpointSettings,
    pub datapath: DatapathSettings,
    pub probe: ProbeSettings,
    pub discovery: Discovery,
    /// The bounded-frequency runner applying node-set changes.
    pub sync: sync::Limits,
    pub supervisor: Policy,
    pub metrics: MetricsSettings,
    /// `--health-range`: the cluster's IPv4 health range; peers' health
    /// addresses are routed only inside it (and masquerade leaves
    /// destinations inside it alone).
    pub health_range: Option<Ipv4Net>,
    /// `--health-range6`: the cluster's IPv6 health range, likewise.
    pub health_range6: Option<Ipv6Net>,
    /// `--max-nodes`: a larger node set is refused whole.
    pub max_nodes: usize,
}

/// The metrics listener.
#[derive(Debug, Clone, Default)]
pub struct MetricsSettings {
    /// Where `/metrics`, the connectivity page and the read-only `/api`
    /// are served (`None`: not served).
    pub serve_addr: Option<std::net::SocketAddr>,
    /// Series per peer and path.
    pub per_peer: bool,
    /// `--web-allowed-hosts`: the `Host` names served besides the listen
    /// address and `localhost`.
    pub allowed_hosts: crate::web::host::AllowedHosts,
}

/// The health endpoint.
#[derive(Debug, Clone)]
pub struct EndpointSettings {
    /// `--health-cidr`: where the endpoint's IPv4 address comes from.
    pub cidr: Option<Ipv4Net>,
    /// `--health-cidr6`: where its IPv6 address comes from. At least one
    /// of the two is given (IPv4 only, IPv6 only, dual stack).
    pub cidr6: Option<Ipv6Net>,
    pub netns_name: String,
    pub host_iface: String,
    pub ep_iface: String,
    pub state_dir: PathBuf,
    /// The echo responder's attach mode; `None`: the tc hook `--attach`
    /// chose (tcx where the kernel has it, classic tc elsewhere).
    pub mode: Option<AttachMode>,
    pub controller_interval: Duration,
    /// On shutdown, leave the namespace, veth, pins and record.
    pub keep: bool,
}

/// The node's datapath.
#[derive(Debug, Clone)]
pub struct DatapathSettings {
    pub ct: CtConfig,
    pub gc_interval: Duration,
    /// Masquerade mode (`None`: routed).
    pub masquerade: Option<MasqueradeFlags>,
    /// Sizes of the maps that grow with the cluster.
    pub map_sizes: health_common::maps::MapSizes,
}

/// Masquerade as asked; the node IP and uplink are found at start.
#[derive(Debug, Clone)]
pub struct MasqueradeFlags {
    /// `--health-range` (`None`: the node's own `--health-cidr`).
    pub health_range: Option<Ipv4Net>,
    pub uplink: Option<String>,
    pub ports: PortRange,
}

/// The prober.
#[derive(Debug, Clone)]
pub struct ProbeSettings {
    pub interval: Duration,
    pub timeout: Duration,
    pub thresholds: Thresholds,
    pub spread: Duration,
    /// HTTP probes in flight at once; `None`: from the open-file limit.
    pub max_in_flight: Option<usize>,
    pub http_port: u16,
    pub initial_delay: Duration,
    /// Probes leave from the endpoint (crossing the datapath, which times
    /// them) or from the node.
    pub from_endpoint: bool,
    /// Rounds of results kept per path (`GET /v1/status/history`).
    pub history_length: usize,
    /// Which peers to probe; `None`: a full mesh up to
    /// [`crate::cluster::subset::FULL_MESH_UP_TO`] nodes, a subset above.
    pub peers: Option<crate::cluster::subset::ProbePeers>,
}

/// Where the node set comes from.
#[derive(Debug, Clone)]
pub enum Discovery {
    File(PathBuf),
    Etcd(EtcdConfig),
    None,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    NodesFile(#[from] nodes_file::NodesFileError),
    #[error(transparent)]
    Masquerade(#[from] MasqueradeError),
    #[error(transparent)]
    Kernel(#[from] KernelError),
    #[error(
        "no health CIDR: give --health-cidr (IPv4), --health-cidr6 (IPv6) or both (dual stack)"
    )]
    NoHealthCidr,
    #[error(
        "--routing masquerade with --health-cidr6 {cidr6}: IPv6 masquerade is not supported \
         (the BPF SNAT on the uplink translates IPv4 only, so the endpoint's IPv6 traffic would \
         leave with its own address); use --routing routed, or drop --health-cidr6"
    )]
    Ipv6Masquerade { cidr6: Ipv6Net },
    #[error(
        "--routing masquerade needs --health-cidr: the endpoint's IPv4 address is what is \
         masqueraded"
    )]
    MasqueradeWithoutIpv4,
    #[error(
        "{flag} is needed with peers: the agent routes peers' health addresses only inside the \
         cluster's health range (the range every node's {cidr_flag} comes from, such as {example})"
    )]
    NoHealthRange {
        flag: &'static str,
        cidr_flag: &'static str,
        example: &'static str,
    },
    #[error("{cidr_flag} {cidr} is not inside {flag} {range}")]
    CidrOutsideRange {
        cidr_flag: &'static str,
        cidr: String,
        flag: &'static str,
        range: String,
    },
}

/// What is found on the kernel at start, before the API serves.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// What the running kernel supports.
    pub kernel: KernelFeatures,
    /// The hook of the tc programs (tracking, masquerade).
    pub tc_hook: TcHook,
    /// The echo responder's attach mode.
    pub echo_mode: AttachMode,
}

/// How often the nodes file is looked at while it settles at start, and
/// for how long at most.
const SETTLE_POLL: Duration = Duration::from_millis(50);
const SETTLE_LIMIT: Duration = Duration::from_secs(10);

/// What is read from the node set at start, once the API serves (a nodes
/// file of 10,000 records takes tens of milliseconds to parse), and before
/// anything is made in the node's namespace.
#[derive(Debug, Clone, Default)]
pub struct NodesAtStart {
    /// The nodes file's set and its rejected records (empty with etcd,
    /// until it answers).
    pub initial_nodes: Validated,
    /// `--node-ip`, or this node's entry in the nodes file.
    pub node_ip: Option<Ipv4Addr>,
    /// `--node-ip6`, or this node's entry in the nodes file.
    pub node_ip6: Option<std::net::Ipv6Addr>,
    pub masquerade: Option<Masquerade>,
    /// The version of the nodes file read, for its watcher to go on from.
    pub file: Option<FileVersion>,
}

impl DaemonConfig {
    /// Checks the flags against each other and probes the kernel: a bad
    /// combination, or a kernel without what the flags ask, fails here,
    /// before anything is created, naming it.
    pub fn resolve(&self) -> Result<Resolved, ConfigError> {
        self.check_families()?;
        let kernel = KernelFeatures::probe()?;
        let tc_hook = kernel.choose(self.attach)?;
        let echo_mode = self.endpoint.mode.unwrap_or(tc_hook.echo_mode());
        if echo_mode == AttachMode::Tcx && !kernel.tcx {
            return Err(KernelError::NoTcx {
                release: kernel.release,
            }
            .into());
        }
        info!(
            kernel = %kernel.release,
            tcx = kernel.tcx,
            btf = kernel.btf,
            attach = %self.attach,
            tc_hook = %tc_hook,
            echo = %echo_mode,
            "kernel features probed: tc programs on {}, the echo responder on {}",
            tc_hook,
            echo_mode
        );
        Ok(Resolved {
            kernel,
            tc_hook,
            echo_mode,
        })
    }

    /// Reads the nodes file and checks masquerade against the node: a file
    /// that does not parse, or a bad masquerade flag, fails here, before
    /// anything is made in the node's namespace, naming it (bad records of
    /// a file that parses are rejected one by one, and the agent starts
    /// with the others).
    pub fn resolve_nodes(&self) -> Result<NodesAtStart, ConfigError> {
        let (initial_nodes, file) = match &self.discovery {
            Discovery::File(path) => {
                // Taken once stable: never half a file being written.
                let (text, version) = file_settle::read_settled(path, SETTLE_POLL, SETTLE_LIMIT)
                    .map_err(|e| nodes_file::NodesFileError {
                        path: path.display().to_string(),
                        line: None,
                        message: format!("cannot read: {e}"),
                    })?;
                let update =
                    nodes_file::parse(path, &text, &self.local_node(), &Holders::default())?;
                info!(
                    path = %path.display(),
                    nodes = update.nodes.len(),
                    rejected = update.rejected.len(),
                    "nodes file loaded"
                );
                (update, Some(version))
            }
            Discovery::Etcd(_) | Discovery::None => (Validated::default(), None),
        };
        let own = initial_nodes.nodes.get(&self.node_name);
        let node_ip = self.node_ip.or_else(|| own.and_then(|n| n.node_ip));
        let node_ip6 = self.node_ip6.or_else(|| own.and_then(|n| n.node_ip6));
        let masquerade = match &self.datapath.masquerade {
            None => None,
            Some(flags) => {
                let node_ip = node_ip.ok_or_else(|| MasqueradeError::NoNodeIp {
                    name: self.node_name.clone(),
                })?;
                let health_cidr = self
                    .endpoint
                    .cidr
                    .ok_or(ConfigError::MasqueradeWithoutIpv4)?;
                let m = masquerade::resolve(&masquerade::Request {
                    node_ip,
                    uplink: flags.uplink.clone(),
                    health_cidr,
                    health_range: flags.health_range.unwrap_or(health_cidr),
                    ports: flags.ports,
                })?;
                info!(uplink = %m.uplink, %node_ip, ports = %flags.ports, "masquerade on");
                Some(m)
            }
        };
        Ok(NodesAtStart {
            initial_nodes,
            node_ip,
            node_ip6,
            masquerade,
            file,
        })
    }

    /// The endpoint's address families: at least one, and no IPv6 with
    /// masquerade (its SNAT is IPv4 only); with peers, each family's
    /// health range, holding this node's health CIDR.
    pub fn check_families(&self) -> Result<(), ConfigError> {
        match (self.endpoint.cidr, self.endpoint.cidr6) {
            (None, None) => return Err(ConfigError::NoHealthCidr),
            (_, Some(cidr6)) if self.datapath.masquerade.is_some() => {
                return Err(ConfigError::Ipv6Masquerade { cidr6 });
            }
            _ => {}
        }
        self.check_ranges()
    }

    /// With peers, a health range for each family the endpoint has, each
    /// holding this node's health CIDR.
    fn check_ranges(&self) -> Result<(), ConfigError> {
        let peers = !matches!(self.discovery, Discovery::None);
        // Each family's CIDR, and its range with whether the CIDR is in it.
        let families = [
            (
                self.endpoint.cidr.map(|c| {
                    let range = self.health_range.map(|r| (r.to_string(), r.contains(&c)));
                    (c.to_string(), range)
                }),
                ("--health-cidr", "--health-range", "198.18.64.0/18"),
            ),
            (
                self.endpoint.cidr6.map(|c| {
                    let range = self.health_range6.map(|r| (r.to_string(), r.contains(&c)));
                    (c.to_string(), range)
                }),
                ("--health-cidr6", "--health-range6", "2001:db8:0:40::/58"),
            ),
        ];
        for (cidr, (cidr_flag, flag, example)) in families {
            match cidr {
                Some((_, None)) if peers => {
                    return Err(ConfigError::NoHealthRange {
                        flag,
                        cidr_flag,
                        example,
                    });
                }
                Some((cidr, Some((range, false)))) => {
                    return Err(ConfigError::CidrOutsideRange {
                        cidr_flag,
                        cidr,
                        flag,
                        range,
                    });
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// This node, as node records are validated against it: its own record
    /// is exempt from the rule that no peer's address is inside its health
    /// CIDR.
    #[must_use]
    pub fn local_node(&self) -> LocalNode {
        LocalNode {
            name: Some(self.node_name.clone()),
            health_cidr: self.endpoint.cidr,
            health_cidr6: self.endpoint.cidr6,
            health_range: self.health_range,
            health_range6: self.health_range6,
        }
    }

    /// How the node set's source is named in `GET /v1/nodes`.
    #[must_use]
    pub fn source_name(&self) -> String {
        match &self.discovery {
            Discovery::File(p) => format!("file:{}", p.display()),
            Discovery::Etcd(e) => format!("etcd:{}{}", e.endpoint, e.prefix),
            Discovery::None => "none".into(),
        }
    }
}
