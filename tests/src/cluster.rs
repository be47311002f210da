//! A local cluster: a fabric namespace with a bridge, and N namespaces
//! playing nodes on it (198.18.0.11, .12, ... /24), each running the real
//! `health-agent daemon` with its own health CIDR (198.18.64.0/24,
//! 198.18.65.0/24, ...) and discovering the others through a shared nodes
//! file. With IPv6 ([`Family`]), nodes also (or only) have `2001:2::11`,
//! `::12`, ... /64 and health CIDRs `2001:2:0:40::/64`, `2001:2:0:41::/64`,
//! ... Used by the integration tests and by `cargo xtask run`.

use std::{
    fmt::Write as _,
    fs,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use health_agent::{
    api::types::NodesView,
    datapath::remove_pins,
    probe::status::ClusterStatus,
    sys::{
        netlink::{NetlinkError, in_netns},
        netns::Netns,
    },
};
use ipnet::IpNet;

use crate::{agent::agent_binary, names, process, require_root};

/// Probe settings for the agents.
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

pub struct ClusterNode {
    pub name: String,
    pub ns: Netns,
    /// The node's IPv4 address (on its uplink when the family has IPv4).
    pub ip: Ipv4Addr,
    pub cidr: String,
    /// The node's IPv6 address and health CIDR, when the family has IPv6.
    pub ip6: Option<Ipv6Addr>,
    pub cidr6: Option<String>,
    pub family: Family,
    pub endpoint_netns: String,
    pub dir: PathBuf,
    pub pins: PathBuf,
    daemon: Option<Child>,
}

impl ClusterNode {
    /// The agent's process ID, while it runs.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.daemon.as_ref().map(Child::id)
    }

    #[must_use]
    pub fn socket(&self) -> PathBuf {
        self.dir.join("health.sock")
    }

    #[must_use]
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    /// How many routes of the agent's own (to peers' IPv4 health
    /// addresses) the node's main table holds.
    #[must_use]
    pub fn agent_routes(&self) -> usize {
        in_netns(
            Some(&self.ns),
            |nl| async move { nl.routes::<Ipv4Addr>().await },
        )
        .expect("netlink")
        .iter()
        .filter(|r| {
            r.protocol == health_agent::membership::routes::ROUTE_PROTOCOL && r.prefix == 32
        })
        .count()
    }

    /// The node's health status as its agent publishes it, via the CLI.
    #[must_use]
    pub fn status(&self) -> Option<ClusterStatus> {
        let out = Command::new(agent_binary())
            .args(["status", "-o", "json", "--socket"])
            .arg(self.socket())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).expect("status is JSON"))
    }

    /// The agent's `GET /v1/healthz`.
    #[must_use]
    pub fn healthz(&self) -> Option<health_agent::api::types::Healthz> {
        crate::api::call(&self.socket(), |c| async move { c.healthz().await }).ok()
    }

    /// The node set as the agent serves it (`GET /v1/nodes`).
    #[must_use]
    pub fn nodes_view(&self) -> Option<NodesView> {
        crate::api::call(&self.socket(), |c| async move { c.nodes().await }).ok()
    }

    /// Polls [`Self::nodes_view`] until `accept` holds; panics with the
    /// view and the agent's log after `timeout`.
    pub fn wait_nodes_view(
        &self,
        timeout: Duration,
        accept: impl Fn(&NodesView) -> bool,
    ) -> NodesView {
        let deadline = Instant::now() + crate::patience(timeout);
        loop {
            let view = self.nodes_view();
            if let Some(v) = view.as_ref()
                && accept(v)
            {
                return view.expect("a view");
            }
            assert!(
                Instant::now() < deadline,
                "{}: {view:#?}\n{}",
                self.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// `health-agent status` as the operator reads it (the table).
    #[must_use]
    pub fn status_text(&self) -> String {
        Command::new(agent_binary())
            .arg("status")
            .arg("--socket")
            .arg(self.socket())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// The cluster view as `status --cluster -o json` prints it, read as
    /// `T` (the reply, or the view it flattens); `None` while there is
    /// none.
    #[must_use]
    pub fn cluster_json<T: serde::de::DeserializeOwned>(&self) -> Option<T> {
        let out = Command::new(agent_binary())
            .args(["status", "--cluster", "-o", "json", "--socket"])
            .arg(self.socket())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).expect("the cluster view is JSON"))
    }

    /// Waits until the cluster view read as `T` satisfies `ok`; returns it.
    pub fn wait_cluster_json<T: serde::de::DeserializeOwned + std::fmt::Debug>(
        &self,
        timeout: Duration,
        what: &str,
        ok: impl Fn(&T) -> bool,
    ) -> T {
        let deadline = Instant::now() + crate::patience(timeout);
        loop {
            let v = self.cluster_json::<T>();
            match v {
                Some(v) if ok(&v) => return v,
                _ => {}
            }
            assert!(
                Instant::now() < deadline,
                "{}: {what} not reached; last view: {v:#?}\nlog:\n{}",
                self.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The agent's metrics listener (`/metrics`, the connectivity page,
    /// `/api`), on the node's address: reachable from the fabric namespace
    /// and the other nodes.
    #[must_use]
    pub fn web_addr(&self) -> std::net::SocketAddr {
        let ip = match self.ip6 {
            Some(ip6) if !self.family.has_v4() => IpAddr::V6(ip6),
            _ => IpAddr::V4(self.ip),
        };
        std::net::SocketAddr::from((ip, WEB_PORT))
    }

    /// The connectivity page's address.
    #[must_use]
    pub fn web_url(&self) -> String {
        format!("http://{}/", self.web_addr())
    }

    /// `health-agent status --cluster`: the cluster view as the operator
    /// reads it (with etcd discovery).
    #[must_use]
    pub fn cluster_text(&self) -> String {
        Command::new(agent_binary())
            .args(["status", "--cluster", "--socket"])
            .arg(self.socket())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// Sets the node's uplink up or down.
    pub fn set_uplink(&self, up: bool) {
        in_netns(Some(&self.ns), |nl| async move {
            if up {
                nl.set_up("uplink").await
            } else {
                nl.set_down("uplink").await
            }
        })
        .expect("set uplink");
    }
}

pub struct Cluster {
    pub fabric: Netns,
    pub nodes: Vec<ClusterNode>,
    pub dir: PathBuf,
    pub nodes_file: PathBuf,
    settings: Settings,
    etcd: Option<Child>,
    /// The etcd cluster, with `etcd_members` above 1.
    pub etcd_cluster: Option<crate::etcd_cluster::EtcdCluster>,
    /// Each node's WireGuard keys, with `wireguard`.
    pub wg_keys: Vec<crate::wireguard::Keys>,
}

/// Port of every agent's metrics listener.
pub const WEB_PORT: u16 = 9962;

/// etcd's client address, on the fabric bridge.
pub const ETCD_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
pub const ETCD_ENDPOINT: &str = "198.18.0.1:2379";
/// The agents' `--kvstore-prefix` (their default).
pub const ETCD_PREFIX: &str = "/health/nodes/";

/// The fabric bridge's IPv6 address.
pub const FABRIC_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 1);

impl Cluster {
    /// Builds the namespaces, writes the nodes file and starts every agent.
    #[must_use]
    pub fn start(settings: &Settings) -> Self {
        require_root();
        names::sweep_stale_netns();
        let dir = std::env::temp_dir().join(names::unique("cluster"));
        fs::create_dir_all(&dir).expect("cluster dir");
        let fabric = Netns::create(&names::unique("fabric")).expect("fabric netns");
        let mut cluster = Self {
            fabric,
            nodes: Vec::new(),
            nodes_file: dir.join("nodes.yaml"),
            dir,
            settings: settings.clone(),
            etcd: None,
            etcd_cluster: None,
            wg_keys: Vec::new(),
        };
        let family = settings.family;
        in_netns(Some(&cluster.fabric), |nl| async move {
            nl.add_bridge("br0").await?;
            nl.add_address("br0", ETCD_IP, 24).await?;
            nl.set_up("br0").await?;
            if family.has_v6() {
                nl.add_address("br0", FABRIC_IP6, 64).await?;
            }
            nl.set_up("lo").await
        })
        .expect("fabric bridge");
        for i in 0..settings.nodes {
            let node = cluster.add_node(i);
            cluster.nodes.push(node);
        }
        if settings.wireguard {
            cluster.wg_keys = crate::wireguard::mesh(&cluster);
            for (i, node) in cluster.nodes.iter_mut().enumerate() {
                node.ip = crate::wireguard::node_ip(i);
                if node.ip6.is_some() {
                    node.ip6 = Some(crate::wireguard::node_ip6(i));
                }
            }
        }
        if settings.etcd {
            cluster.start_etcd();
        } else {
            cluster.write_nodes_file(settings.nodes);
        }
        for i in 0..settings.nodes {
            cluster.start_agent(i);
        }
        cluster
    }

    /// Starts etcd in the fabric namespace (same data directory each time)
    /// and waits until it answers; the first time, with
    /// `etcd_security.auth`, switches its authentication on.
    pub fn start_etcd(&mut self) {
        if self.settings.etcd_members > 1 {
            assert!(
                !self.settings.etcd_security.tls && !self.settings.etcd_security.auth,
                "an etcd cluster of several members runs plain http without users"
            );
            assert!(self.etcd_cluster.is_none(), "etcd already running");
            self.etcd_cluster = Some(crate::etcd_cluster::EtcdCluster::start(
                &self.fabric,
                &self.dir,
                self.settings.etcd_members,
            ));
            return;
        }
        assert!(self.etcd.is_none(), "etcd already running");
        let data = self.dir.join("etcd");
        let first = !data.exists();
        let pki = self.etcd_pki();
        self.etcd = Some(crate::etcd::spawn(
            Some(&self.fabric),
            &data,
            ETCD_ENDPOINT,
            2380,
            pki.as_ref(),
            &self.dir.join("etcd.log"),
        ));
        if first && self.settings.etcd_security.auth {
            let names: Vec<String> = (1..=self.settings.nodes)
                .map(|i| format!("node-{i}"))
                .collect();
            crate::etcd::enable_auth(
                Some(&self.fabric),
                ETCD_ENDPOINT,
                pki.as_ref(),
                ETCD_PREFIX,
                &names,
            );
        }
    }

    /// The TLS material of etcd and the agents (made on first use), when
    /// `etcd_security.tls`.
    #[must_use]
    pub fn etcd_pki(&self) -> Option<crate::etcd::Pki> {
        let dir = self.dir.join("pki");
        self.settings.etcd_security.tls.then(|| {
            if dir.join("client.pem").exists() {
                crate::etcd::Pki { dir }
            } else {
                crate::etcd::Pki::generate(&dir, ETCD_IP)
            }
        })
    }

    /// Stops etcd (SIGTERM) and waits for it.
    pub fn stop_etcd(&mut self) {
        if let Some(mut child) = self.etcd.take() {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let _ = child.wait();
        }
    }

    /// A new node joining: its namespace on the bridge (the next
    /// address), its agent started; returns its index.
    pub fn join(&mut self) -> usize {
        let i = self.nodes.len();
        let node = self.add_node(i);
        self.nodes.push(node);
        self.start_agent(i);
        i
    }

    fn add_node(&self, i: usize) -> ClusterNode {
        let name = format!("node-{}", i + 1);
        let ns = Netns::create(&names::unique(&name)).expect("node netns");
        let ip = node_ip(i);
        let family = self.settings.family;
        let ip6 = family.has_v6().then(|| node_ip6(i));
        in_netns(Some(&ns), |nl| async move { nl.set_up("lo").await }).expect("node loopback");
        self.make_uplink(i, &ns).expect("node uplink");
        let dir = self.dir.join(&name);
        fs::create_dir_all(&dir).expect("node dir");
        ClusterNode {
            cidr: health_cidr(i),
            ip6,
            cidr6: family.has_v6().then(|| health_cidr6(i)),
            family,
            endpoint_netns: names::unique(&format!("{name}-ep")),
            pins: Path::new(health_agent::datapath::BPFFS_ROOT)
                .join(names::unique(&format!("{name}-pins"))),
            name,
            ns,
            ip,
            dir,
            daemon: None,
        }
    }

    /// Node `i`'s uplink: a veth from the fabric's bridge into `ns`, with
    /// the node's addresses, up.
    fn make_uplink(&self, i: usize, ns: &Netns) -> Result<(), NetlinkError> {
        let port = format!("n{}", i + 1);
        let node_ns = ns.clone();
        in_netns(Some(&self.fabric), |nl| async move {
            nl.add_veth(&port, "uplink", Some(&node_ns)).await?;
            nl.set_controller(&port, "br0").await?;
            nl.set_up(&port).await
        })?;
        let (family, ip, ip6) = (self.settings.family, node_ip(i), node_ip6(i));
        in_netns(Some(ns), |nl| async move {
            if family.has_v4() {
                nl.add_address("uplink", ip, 24).await?;
            }
            if family.has_v6() {
                nl.add_address("uplink", ip6, 64).await?;
            }
            nl.set_up("uplink").await
        })
    }

    /// Deletes node `i`'s uplink (both ends of the veth) and makes it
    /// again, as a NIC that goes away and comes back.
    pub fn recreate_uplink(&self, i: usize) -> Result<(), NetlinkError> {
        let ns = self.nodes[i].ns.clone();
        in_netns(
            Some(&ns),
            |nl| async move { nl.delete_link("uplink").await },
        )?;
        self.make_uplink(i, &ns)
    }

    /// Writes the nodes file listing the first `n` nodes.
    pub fn write_nodes_file(&self, n: usize) {
        let yaml = nodes_yaml_for(n, self.settings.family);
        if self.settings.wireguard {
            // Node addresses on wg0 (198.18.1.x, 2001:2:0:1::x), not on
            // the uplinks.
            self.write_nodes_text(
                &yaml
                    .replace("node-ip: 198.18.0.", "node-ip: 198.18.1.")
                    .replace("node-ip6: 2001:2::", "node-ip6: 2001:2:0:1::"),
            );
        } else {
            self.write_nodes_text(&yaml);
        }
    }

    /// Replaces the nodes file with `yaml`, at once (a rename).
    pub fn write_nodes_text(&self, yaml: &str) {
        let tmp = self.nodes_file.with_extension("tmp");
        fs::write(&tmp, yaml).expect("write nodes file");
        fs::rename(&tmp, &self.nodes_file).expect("replace nodes file");
    }

    /// Starts node `i`'s agent.
    pub fn start_agent(&mut self, i: usize) {
        let s = self.settings.clone();
        let endpoints = self.etcd_cluster.as_ref().map_or_else(
            || ETCD_ENDPOINT.to_owned(),
            crate::etcd_cluster::EtcdCluster::endpoints,
        );
        let discovery = discovery_args(
            &s,
            &endpoints,
            &self.nodes_file,
            self.etcd_pki(),
            (&self.nodes[i].name, &self.nodes[i].dir),
        );
        let node = &mut self.nodes[i];
        let mut cmd = Command::new(agent_binary());
        cmd.args(["daemon", "--node-name", &node.name]);
        if node.family.has_v4() {
            cmd.args(["--health-cidr", &node.cidr, "--health-range", HEALTH_RANGE]);
        }
        if let Some(cidr6) = &node.cidr6 {
            cmd.args(["--health-cidr6", cidr6, "--health-range6", HEALTH_RANGE6]);
        }
        if s.wireguard {
            // The node's addresses are on wg0, not on the uplink they
            // would otherwise be taken from.
            if node.family.has_v4() {
                cmd.args(["--node-ip", &node.ip.to_string()]);
            }
            if let Some(ip6) = node.ip6 {
                cmd.args(["--node-ip6", &ip6.to_string()]);
            }
        }
        cmd.args(["--endpoint-netns", &node.endpoint_netns])
            .arg("--state-dir")
            .arg(node.dir.join("state"))
            .arg("--pidfile")
            .arg(node.dir.join("agent.pid"))
            .arg("--socket")
            .arg(node.socket())
            .arg("--bpffs-dir")
            .arg(&node.pins)
            .args(["--probe-interval", s.probe_interval])
            .args(probe_args(&s))
            .args(["--prometheus-serve-addr", &node.web_addr().to_string()])
            .args(crate::agent_env_args())
            .args(&s.extra_args)
            .args(discovery)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(fs::File::create(node.dir.join("daemon.log")).expect("log"));
        process::enter(&mut cmd, &node.ns);
        node.daemon = Some(cmd.spawn().expect("spawn health-agent"));
    }

    /// Polls `node`'s status until `accept` holds; panics with the status
    /// and the agent's log after `timeout`.
    pub fn wait_status(
        &self,
        node: usize,
        timeout: Duration,
        accept: impl Fn(&ClusterStatus) -> bool,
    ) -> ClusterStatus {
        let timeout = crate::patience(timeout);
        let deadline = Instant::now() + timeout;
        let mut last = None;
        loop {
            if let Some(s) = self.nodes[node].status() {
                if accept(&s) {
                    return s;
                }
                last = Some(s);
            }
            assert!(
                Instant::now() < deadline,
                "condition not met in {timeout:?}; last status of {}:\n{:#?}\nlog:\n{}",
                self.nodes[node].name,
                last,
                self.nodes[node].log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until every node's health endpoint is ready.
    pub fn wait_endpoints_ready(&self, timeout: Duration) {
        let deadline = Instant::now() + crate::patience(timeout);
        for node in &self.nodes {
            loop {
                let eps =
                    crate::api::call(&node.socket(), |c| async move { c.endpoints().await }).ok();
                if eps.is_some_and(|e| {
                    e.first().is_some_and(|ep| {
                        ep.state == Some(health_agent::endpoint::lifecycle::State::Ready)
                    })
                }) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{}'s endpoint not ready; log:\n{}",
                    node.name,
                    node.log()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// Stops node `i`'s agent with `signal` and waits for it.
    pub fn stop_agent(&mut self, i: usize, signal: nix::sys::signal::Signal) {
        if let Some(mut child) = self.nodes[i].daemon.take() {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
            let _ = nix::sys::signal::kill(pid, signal);
            let _ = child.wait();
        }
    }

    /// Makes node `i`'s agent the one elected to assemble the cluster
    /// view: whichever agent leads is stopped (SIGTERM: it resigns) and
    /// started again (a candidate behind the others), until node `i` leads.
    pub fn make_assembler(&mut self, i: usize) {
        let election = health_agent::cluster::published_view::election_name(ETCD_PREFIX);
        let deadline = Instant::now() + crate::patience(Duration::from_secs(60));
        loop {
            let leader = crate::etcd::election_leader(Some(&self.fabric), ETCD_ENDPOINT, &election);
            match leader.and_then(|l| self.nodes.iter().position(|n| n.name == l)) {
                Some(l) if l == i => return,
                Some(l) => {
                    self.stop_agent(l, nix::sys::signal::Signal::SIGTERM);
                    self.start_agent(l);
                }
                None => std::thread::sleep(Duration::from_millis(200)),
            }
            assert!(
                Instant::now() < deadline,
                "{} not elected to assemble the cluster view",
                self.nodes[i].name
            );
        }
    }

    /// Stops every agent with SIGTERM (they remove their endpoints).
    pub fn stop_agents(&mut self) {
        for i in 0..self.nodes.len() {
            self.stop_agent(i, nix::sys::signal::Signal::SIGTERM);
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop_agents();
        self.stop_etcd();
        drop(self.etcd_cluster.take());
        for node in &self.nodes {
            let _ = Netns::named(&node.endpoint_netns).map(|ns| ns.delete());
            let _ = node.ns.delete();
            let _ = remove_pins(&node.pins);
        }
        let _ = self.fabric.delete();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// The test settings' probe and sync flags, none with
/// `product_defaults`.
fn probe_args(s: &Settings) -> Vec<String> {
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
fn discovery_args(
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

/// The nodes file's text listing the first `n` nodes: a `nodes:` line, then
/// three lines per node (`name`, `node-ip`, `health-cidr`).
#[must_use]
pub fn nodes_yaml(n: usize) -> String {
    nodes_yaml_for(n, Family::V4)
}

/// The nodes file's text listing the first `n` nodes with the addresses
/// of `family` (`node-ip6` and `health-cidr6` lines for IPv6).
#[must_use]
pub fn nodes_yaml_for(n: usize, family: Family) -> String {
    let mut yaml = String::from("nodes:\n");
    for i in 0..n {
        let _ = writeln!(yaml, "  - name: node-{}", i + 1);
        if family.has_v4() {
            let _ = write!(
                yaml,
                "    node-ip: {}\n    health-cidr: {}\n",
                node_ip(i),
                health_cidr(i)
            );
        }
        if family.has_v6() {
            let _ = write!(
                yaml,
                "    node-ip6: {}\n    health-cidr6: {}\n",
                node_ip6(i),
                health_cidr6(i)
            );
        }
    }
    yaml
}

/// Node `i`'s IPv6 address: `2001:2::11`, `::12`, ...
#[must_use]
pub fn node_ip6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(
        0x2001,
        2,
        0,
        0,
        0,
        0,
        0,
        0x11 + u16::try_from(i).expect("fewer than 200 nodes"),
    )
}

/// Node `i`'s IPv6 health CIDR: `2001:2:0:40::/64`, `2001:2:0:41::/64`, ...
#[must_use]
pub fn health_cidr6(i: usize) -> String {
    share(HEALTH_RANGE6, 64, i)
}

#[must_use]
pub fn node_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(
        198,
        18,
        0,
        11 + u8::try_from(i).expect("fewer than 200 nodes"),
    )
}

/// The cluster's health range: every node's [`health_cidr`] is in it.
pub const HEALTH_RANGE: &str = "198.18.64.0/18";

/// The cluster's IPv6 health range: every node's [`health_cidr6`] is in
/// it (64 nodes).
pub const HEALTH_RANGE6: &str = "2001:2:0:40::/58";

/// Node `i`'s IPv4 health CIDR: `198.18.64.0/24`, `198.18.65.0/24`, ...
#[must_use]
pub fn health_cidr(i: usize) -> String {
    share(HEALTH_RANGE, 24, i)
}

/// The `i`-th network of length `prefix` in `range` (either family).
fn share(range: &str, prefix: u8, i: usize) -> String {
    let range: IpNet = range.parse().expect("a health range");
    range
        .subnets(prefix)
        .expect("a longer prefix than the range's")
        .nth(i)
        .unwrap_or_else(|| panic!("{range} holds fewer than {} /{prefix}s", i + 1))
        .to_string()
}
