//! The daemon's configuration: the settings ([`Config`]) completed from the
//! node (its name, the etcd files), and what is resolved from it at start: the kernel's
//! features before the API serves, then the initial node set, the node IP
//! and masquerade before anything is made in the node's namespace.

use std::{net::Ipv4Addr, time::Duration};

use ipnet::Ipv6Net;
use tracing::info;

pub use crate::config::Discovery;
use crate::{
    config::Config,
    datapath::{
        AttachMode, KernelFeatures, TcHook,
        kernel::KernelError,
        masquerade::{self, Masquerade, MasqueradeError},
    },
    membership::{
        claims::Holders,
        file_settle,
        file_version::FileVersion,
        kvstore::KvConfigError,
        nodes_file,
        record::{LocalNode, Validated},
    },
};

/// Everything `health-agent daemon` is told ([`Config`]), with what is
/// read from the node to complete it when the agent starts.
#[derive(Debug, Clone)]
pub struct DaemonConfig {
    /// The settings as given.
    pub settings: Config,
    /// This node's name in the node set (`--node-name`, or the hostname).
    pub node_name: String,
    /// Where the node set comes from, its etcd TLS and password files read.
    pub discovery: Discovery,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("no --node-name and no hostname to default it to")]
    NoNodeName,
    #[error("--node-name (or the hostname): {0}")]
    NodeName(crate::membership::record::Rule),
    #[error(
        "--kvstore-allocations needs --kvstore etcd: the allocations are read from etcd (a nodes \
         file is written by the admin, and says which addresses are each node's itself)"
    )]
    AllocationsWithoutEtcd,
    #[error(
        "{flag} is read only with --kvstore etcd: without it the agent takes no peers from etcd \
         and never reads {flag}"
    )]
    KvstoreFlagWithoutEtcd { flag: &'static str },
    #[error(
        "--sync-min-interval {min} is longer than --sync-max-interval {max}: node-set changes are \
         applied at most every --sync-min-interval and at least every --sync-max-interval"
    )]
    SyncIntervals { min: String, max: String },
    #[error(
        "--probe-timeout {timeout} is longer than --probe-interval {interval}: a round lasts \
         about one timeout, so rounds would run back to back every {timeout}, and every \
         node's published summary would read stale"
    )]
    ProbeTimeout { timeout: String, interval: String },
    #[error(transparent)]
    Kvstore(#[from] KvConfigError),
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

/// The lease file in `state_dir`, and the keys this node writes under its
/// lease: its record and its summary.
fn lease_file(
    state_dir: &std::path::Path,
    prefix: &str,
    node: &str,
) -> crate::membership::kvstore::LeaseFile {
    crate::membership::kvstore::LeaseFile {
        path: state_dir.join(crate::membership::kvstore::LEASE_FILE),
        own_keys: vec![
            crate::membership::etcd::record_key(prefix, node).into_bytes(),
            super::cluster_view::summary_key(&super::cluster_view::summaries_prefix(prefix), node)
                .into_bytes(),
        ],
    }
}

/// The probe timeout against the interval: a round over silent peers
/// lasts about one timeout, and a timeout past the interval would make the
/// interval a fiction (checked at start and at every reload).
fn check_tuning(tuning: &crate::config::ProbeTuning) -> Result<(), ConfigError> {
    if tuning.probe_timeout > tuning.probe_interval {
        return Err(ConfigError::ProbeTimeout {
            timeout: humantime::format_duration(tuning.probe_timeout).to_string(),
            interval: humantime::format_duration(tuning.probe_interval).to_string(),
        });
    }
    Ok(())
}

/// The cluster flags against each other: etcd's own flags only with etcd,
/// the node-set runner's bounds in order.
fn check_cluster_flags(
    cluster: &crate::membership::settings::ClusterSettings,
    discovery: &Discovery,
) -> Result<(), ConfigError> {
    if !matches!(discovery, Discovery::Etcd(_)) {
        if cluster.kvstore_allocations {
            return Err(ConfigError::AllocationsWithoutEtcd);
        }
        let given = [
            ("--kvstore-ca", cluster.kvstore_ca.is_some()),
            ("--kvstore-cert", cluster.kvstore_cert.is_some()),
            ("--kvstore-key", cluster.kvstore_key.is_some()),
            ("--kvstore-user", cluster.kvstore_user.is_some()),
            (
                "--kvstore-password-file",
                cluster.kvstore_password_file.is_some(),
            ),
        ];
        if let Some((flag, _)) = given.into_iter().find(|(_, set)| *set) {
            return Err(ConfigError::KvstoreFlagWithoutEtcd { flag });
        }
    }
    if cluster.sync_min_interval > cluster.sync_max_interval {
        return Err(ConfigError::SyncIntervals {
            min: humantime::format_duration(cluster.sync_min_interval).to_string(),
            max: humantime::format_duration(cluster.sync_max_interval).to_string(),
        });
    }
    Ok(())
}

/// The node's hostname, when it has one.
fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
}

impl DaemonConfig {
    /// Completes `settings` from the node: the hostname when no
    /// `--node-name` is given (read once), the etcd TLS and password files.
    ///
    /// # Errors
    /// No node name, a node name no record could hold, or an etcd file that
    /// cannot be used (naming its flag).
    pub fn new(settings: Config) -> Result<Self, ConfigError> {
        let mut discovery = settings.cluster.discovery()?;
        let node_name = match &settings.cluster.node_name {
            Some(n) => n.clone(),
            None => hostname().ok_or(ConfigError::NoNodeName)?,
        };
        // Its record would be refused by every agent, this one included.
        crate::membership::validate::check_name(&node_name).map_err(ConfigError::NodeName)?;
        check_cluster_flags(&settings.cluster, &discovery)?;
        check_tuning(&settings.tuning)?;
        if let Discovery::Etcd(etcd) = &mut discovery {
            etcd.lease_file = Some(lease_file(
                &settings.endpoint.state_dir,
                &etcd.prefix,
                &node_name,
            ));
        }
        Ok(Self {
            settings,
            node_name,
            discovery,
        })
    }

    /// Checks the flags against each other and probes the kernel: a bad
    /// combination, or a kernel without what the flags ask, fails here,
    /// before anything is created, naming it.
    pub fn resolve(&self) -> Result<Resolved, ConfigError> {
        self.check_families()?;
        let kernel = KernelFeatures::probe()?;
        let tc_hook = kernel.choose(self.settings.datapath.attach)?;
        let echo_mode = self.settings.endpoint.mode.unwrap_or(tc_hook.echo_mode());
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
            attach = %self.settings.datapath.attach,
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
                let text = nodes_file::text(path, &text)?;
                let update =
                    nodes_file::parse(path, text, &self.local_node(), &Holders::default())?;
                info!(
                    path = %path.display(),
                    nodes = update.nodes.len(),
                    rejected = update.rejected.len(),
                    "nodes file loaded"
                );
                nodes_file::warn_if_unnamed(path, &update, &self.local_node());
                (update, Some(version))
            }
            Discovery::Etcd(_) | Discovery::None => (Validated::default(), None),
        };
        let own = initial_nodes.nodes.get(&self.node_name);
        let node_ip = self
            .settings
            .cluster
            .node_ip
            .or_else(|| own.and_then(|n| n.node_ip));
        let node_ip6 = self
            .settings
            .cluster
            .node_ip6
            .or_else(|| own.and_then(|n| n.node_ip6));
        let datapath = &self.settings.datapath;
        let masquerade = if datapath.masquerade() {
            let node_ip = node_ip.ok_or_else(|| MasqueradeError::NoNodeIp {
                name: self.node_name.clone(),
            })?;
            let health_cidr = self
                .settings
                .endpoint
                .health_cidr
                .ok_or(ConfigError::MasqueradeWithoutIpv4)?;
            let ports = datapath.nat_port_range;
            let m = masquerade::resolve(&masquerade::Request {
                node_ip,
                uplink: datapath.uplink.clone(),
                health_cidr,
                health_range: self.settings.endpoint.health_range.unwrap_or(health_cidr),
                ports,
            })?;
            info!(uplink = %m.uplink, %node_ip, %ports, "masquerade on");
            Some(m)
        } else {
            None
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
        let e = &self.settings.endpoint;
        match (e.health_cidr, e.health_cidr6) {
            (None, None) => return Err(ConfigError::NoHealthCidr),
            (_, Some(cidr6)) if self.settings.datapath.masquerade() => {
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
        let e = &self.settings.endpoint;
        // Each family's CIDR, and its range with whether the CIDR is in it.
        let families = [
            (
                e.health_cidr.map(|c| {
                    let range = e.health_range.map(|r| (r.to_string(), r.contains(&c)));
                    (c.to_string(), range)
                }),
                ("--health-cidr", "--health-range", "198.18.64.0/18"),
            ),
            (
                e.health_cidr6.map(|c| {
                    let range = e.health_range6.map(|r| (r.to_string(), r.contains(&c)));
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
            health_cidr: self.settings.endpoint.health_cidr,
            health_cidr6: self.settings.endpoint.health_cidr6,
            health_range: self.settings.endpoint.health_range,
            health_range6: self.settings.endpoint.health_range6,
        }
    }

    /// How the node set's source is named in `GET /v1/nodes`.
    #[must_use]
    pub fn source_name(&self) -> String {
        match &self.discovery {
            Discovery::File(p) => format!("file:{}", p.display()),
            Discovery::Etcd(e) => format!("etcd:{}{}", e.endpoints_text(), e.prefix),
            Discovery::None => "none".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::lease_file;

    /// The keys a kept lease may hold are those the agent writes under
    /// it: its record and its summary, each by the function its writer
    /// names it with.
    #[test]
    fn a_lease_is_this_nodes_when_it_holds_its_record_and_summary() {
        let file = lease_file(std::path::Path::new("/var/lib/h"), "/health/nodes/", "n-1");
        assert_eq!(file.path, std::path::Path::new("/var/lib/h/etcd-lease"));
        let keys: Vec<_> = file
            .own_keys
            .iter()
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect();
        assert_eq!(keys, ["/health/nodes/n-1", "/health/summaries/n-1"]);
    }
}
