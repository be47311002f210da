//! What a test asks of the cluster ([`Settings`], the address
//! [`Family`]), and the agent flags that follow from it.

use std::{
    fs,
    path::{Path, PathBuf},
};

/// What a test asks of the cluster: its size and address family, the
/// agents' probe settings, etcd (members, security, lease) or a nodes
/// file, and WireGuard.
#[derive(Debug, Clone)]
pub struct Settings {
    pub nodes: usize,
    pub probe_interval: &'static str,
    pub probe_timeout: &'static str,
    pub failure_threshold: u32,
    pub success_threshold: u32,
    pub extra_args: Vec<String>,
    /// Discover through etcd (run in the fabric namespace) instead of the
    /// nodes file.
    pub etcd: bool,
    /// `--kvstore-lease-ttl`: how long a node that stopped (without
    /// deregistering) stays in the others' node sets; empty: the agent's
    /// default (15 minutes).
    pub lease_ttl: &'static str,
    /// etcd over TLS and/or with authentication (the agents get the flags).
    pub etcd_security: crate::etcd::Security,
    /// The address families of nodes and endpoints.
    pub family: Family,
    /// etcd's members: 1 runs etcd in the fabric namespace; more run an
    /// etcd cluster, each member in a namespace of its own
    /// ([`crate::etcd_cluster`], plain http), and every agent is given
    /// all their endpoints.
    pub etcd_members: usize,
    /// Node addresses on WireGuard ([`crate::wireguard`]): each node's
    /// address is on its `wg0`, its uplink's carries the tunnel.
    pub wireguard: bool,
    /// Flags left out of the agents' command line: the chaos suite runs the
    /// product's defaults (e.g. `--kvstore-lease-ttl`, `--sync-min-interval`,
    /// `--probe-timeout`, `--failure-threshold`, `--success-threshold`).
    pub product_defaults: bool,
}

/// The address families of a cluster's nodes and health endpoints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Family {
    #[default]
    V4,
    V6,
    Dual,
}

impl Family {
    #[must_use]
    pub const fn has_v4(self) -> bool {
        !matches!(self, Self::V6)
    }

    #[must_use]
    pub const fn has_v6(self) -> bool {
        !matches!(self, Self::V4)
    }
}

impl std::str::FromStr for Family {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ipv4" => Ok(Self::V4),
            "ipv6" => Ok(Self::V6),
            "dual" => Ok(Self::Dual),
            other => Err(format!("unknown IP family {other:?}: ipv4, ipv6 or dual")),
        }
    }
}

impl Settings {
    /// The cluster `cargo xtask run` starts: `nodes` nodes probing every
    /// `interval` (1 s timeout), discovering each other through a nodes
    /// file or (`etcd`) through etcd as in production (TLS, a user and a
    /// role per node), on the agent's own registration lease (15 minutes:
    /// a node whose uplink or agent dies stays in the node set and is
    /// called down, as in production, instead of vanishing); masquerade
    /// or routed.
    #[must_use]
    pub fn local(
        nodes: usize,
        interval: &'static str,
        etcd: bool,
        masquerade: bool,
        family: Family,
    ) -> Self {
        Self {
            nodes,
            probe_interval: interval,
            probe_timeout: "1s",
            etcd,
            etcd_security: crate::etcd::Security {
                tls: etcd,
                auth: etcd,
                allocations: etcd,
            },
            family,
            lease_ttl: "",
            extra_args: if masquerade {
                ["--routing", "masquerade"].map(String::from).to_vec()
            } else {
                Vec::new()
            },
            ..Self::default()
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            nodes: 3,
            probe_interval: "1s",
            probe_timeout: "500ms",
            failure_threshold: 3,
            success_threshold: 1,
            extra_args: Vec::new(),
            etcd: false,
            lease_ttl: "3s",
            etcd_security: crate::etcd::Security::default(),
            family: Family::V4,
            etcd_members: 1,
            product_defaults: false,
            wireguard: false,
        }
    }
}

/// The test settings' probe and sync flags, none with
/// `product_defaults`.
pub(super) fn probe_args(s: &Settings) -> Vec<String> {
    if s.product_defaults {
        return Vec::new();
    }
    [
        "--probe-timeout",
        s.probe_timeout,
        "--failure-threshold",
        &s.failure_threshold.to_string(),
        "--success-threshold",
        &s.success_threshold.to_string(),
        "--sync-min-interval",
        "200ms",
    ]
    .map(String::from)
    .to_vec()
}

/// The agent flags for the cluster's node discovery. With etcd's
/// security, each node reads its CA and password from its own directory
/// (`etcd-ca.pem`, `etcd-password`, written here unless present), so that a
/// test can give one node wrong ones; it logs in as the user named after
/// it.
pub(super) fn discovery_args(
    s: &Settings,
    endpoints: &str,
    nodes_file: &Path,
    pki: Option<crate::etcd::Pki>,
    (name, node_dir): (&str, &Path),
) -> Vec<String> {
    if !s.etcd {
        return vec!["--nodes-file".into(), nodes_file.display().to_string()];
    }
    let mut args = ["--kvstore", "etcd", "--kvstore-endpoint", endpoints]
        .map(String::from)
        .to_vec();
    if !s.product_defaults && !s.lease_ttl.is_empty() {
        args.extend(["--kvstore-lease-ttl".to_owned(), s.lease_ttl.to_owned()]);
    }
    if s.etcd_security.allocations {
        args.push("--kvstore-allocations".into());
    }
    let path = |p: PathBuf| p.display().to_string();
    if let Some(pki) = pki {
        let ca = node_dir.join("etcd-ca.pem");
        if !ca.exists() {
            fs::copy(pki.path("ca.pem"), &ca).expect("node's CA");
        }
        args.extend([
            "--kvstore-ca".into(),
            path(ca),
            "--kvstore-cert".into(),
            path(pki.path("client.pem")),
            "--kvstore-key".into(),
            path(pki.path("client-key.pem")),
        ]);
    }
    if s.etcd_security.auth {
        let password = node_dir.join("etcd-password");
        if !password.exists() {
            fs::write(&password, format!("{}\n", crate::etcd::node_password(name)))
                .expect("node's etcd password");
        }
        args.extend([
            "--kvstore-user".into(),
            name.to_owned(),
            "--kvstore-password-file".into(),
            path(password),
        ]);
    }
    args
}
