//! One node of the cluster: its namespace, addresses and directories, its
//! agent's process, and what its agent answers.

use std::{
    fs,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::PathBuf,
    process::{Child, Command},
    time::{Duration, Instant},
};

use health_agent::{
    api::types::NodesView,
    probe::status::ClusterStatus,
    sys::{netlink::in_netns, netns::Netns},
};

use super::{Family, WEB_PORT};
use crate::agent::agent_binary;

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
    pub(super) daemon: Option<Child>,
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

    /// `health-agent nodes --refused` as the operator reads it: what the
    /// agent refused, with why.
    #[must_use]
    pub fn refused_text(&self) -> String {
        self.cli_text(&["nodes", "--refused"])
    }

    /// What `health-agent <args> --socket <this node's>` prints on stdout
    /// (empty when it cannot run).
    fn cli_text(&self, args: &[&str]) -> String {
        Command::new(agent_binary())
            .args(args)
            .arg("--socket")
            .arg(self.socket())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// `health-agent status` as the operator reads it (the table).
    #[must_use]
    pub fn status_text(&self) -> String {
        self.cli_text(&["status"])
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
        self.cli_text(&["status", "--cluster"])
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
