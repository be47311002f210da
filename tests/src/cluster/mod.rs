//! A local cluster: a fabric namespace with a bridge, and N namespaces
//! playing nodes on it (198.18.0.11, .12, ... /24), each running the real
//! `health-agent daemon` with its own health CIDR (198.18.64.0/24,
//! 198.18.65.0/24, ...) and discovering the others through a shared nodes
//! file. With IPv6 ([`Family`]), nodes also (or only) have `2001:2::11`,
//! `::12`, ... /64 and health CIDRs `2001:2:0:40::/64`, `2001:2:0:41::/64`,
//! ... Used by the integration tests and by `cargo xtask run`.

mod addresses;
mod node;
mod settings;

use std::{
    fs,
    net::{Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use health_agent::{
    datapath::remove_pins,
    probe::status::ClusterStatus,
    sys::{
        netlink::{NetlinkError, in_netns},
        netns::Netns,
    },
};

use self::settings::{discovery_args, probe_args};
pub use self::{
    addresses::{
        HEALTH_RANGE, HEALTH_RANGE6, MAX_NODES, health_cidr, health_cidr6, node_ip, node_ip6,
        nodes_yaml, nodes_yaml_for,
    },
    node::ClusterNode,
    settings::{Family, Settings},
};
use crate::{agent::agent_binary, names, netns_guard::NetnsGuard, process, require_root};

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
                !self.settings.etcd_security.tls
                    && !self.settings.etcd_security.auth
                    && !self.settings.etcd_security.allocations,
                "an etcd cluster of several members runs plain http without users or allocations"
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
        if first && self.settings.etcd_security.allocations {
            for i in 0..self.nodes.len() {
                self.allocate(i);
            }
        }
    }

    /// Writes node `i`'s health CIDRs and node addresses as its allocation
    /// (as root when auth is on), where `--kvstore-allocations` reads them.
    pub fn allocate(&self, i: usize) {
        let node = &self.nodes[i];
        let key = format!(
            "{}{}",
            health_agent::membership::kvstore::beside(ETCD_PREFIX, "allocations"),
            node.name
        );
        let mut value = serde_json::Map::new();
        if node.family.has_v4() {
            value.insert("health_cidr".into(), node.cidr.clone().into());
            value.insert("node_ip".into(), node.ip.to_string().into());
        }
        if let (Some(cidr6), Some(ip6)) = (&node.cidr6, node.ip6) {
            value.insert("health_cidr6".into(), cidr6.clone().into());
            value.insert("node_ip6".into(), ip6.to_string().into());
        }
        let value = serde_json::Value::Object(value).to_string();
        let pki = self.etcd_pki();
        crate::etcd::put(
            Some(&self.fabric),
            ETCD_ENDPOINT,
            (pki.as_ref(), self.settings.etcd_security.auth),
            (&key, &value),
        );
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
            process::stop(&mut child, nix::sys::signal::Signal::SIGTERM);
        }
    }

    /// A new node joining: its namespace on the bridge (the next
    /// address), its agent started; returns its index.
    pub fn join(&mut self) -> usize {
        let i = self.nodes.len();
        let node = self.add_node(i);
        self.nodes.push(node);
        if self.settings.etcd && self.settings.etcd_security.allocations {
            self.allocate(i);
        }
        self.start_agent(i);
        i
    }

    fn add_node(&self, i: usize) -> ClusterNode {
        let name = format!("node-{}", i + 1);
        // Removed if a step fails before the node is the cluster's.
        let guard = NetnsGuard::create(&names::unique(&name), "node");
        let ip = node_ip(i);
        let family = self.settings.family;
        let ip6 = family.has_v6().then(|| node_ip6(i));
        in_netns(Some(guard.ns()), |nl| async move { nl.set_up("lo").await })
            .expect("node loopback");
        self.make_uplink(i, guard.ns()).expect("node uplink");
        let dir = self.dir.join(&name);
        fs::create_dir_all(&dir).expect("node dir");
        let (cidr, cidr6) = (health_cidr(i), family.has_v6().then(|| health_cidr6(i)));
        let ns = guard.keep();
        ClusterNode {
            cidr,
            ip6,
            cidr6,
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

    /// Stops node `i`'s agent with `signal` and waits for it (killed
    /// past [`process::STOP_WITHIN`]).
    pub fn stop_agent(&mut self, i: usize, signal: nix::sys::signal::Signal) {
        if let Some(mut child) = self.nodes[i].daemon.take() {
            process::stop(&mut child, signal);
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
