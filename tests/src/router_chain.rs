//! A peer three routers away from an agent, for faults on the way:
//!
//! ```text
//! agent node --- r1 --- r2 --- r3 --- peer
//!  .10.2   .10.1 .11.1 .11.2 .12.1 .12.2 .13.1 .13.2   (198.18.x.y)
//! ```
//!
//! Each router's interfaces are `west` (toward the agent) and `east`. The
//! agent's endpoint is 198.19.255.0/24, the peer's health address
//! 198.19.1.2. Everything is removed on drop, panics included.

use std::{
    fs,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use health_agent::{
    probe::{path::PathState, status::ClusterStatus},
    sys::{netlink::in_netns, netns::Netns},
};

use crate::{
    agent::{daemon_command, socket_in},
    api, names, patience,
    topology::TwoNodes,
};

pub const AGENT_CIDR: &str = "198.19.255.0/24";
pub const PEER_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 13, 2);
pub const PEER_HEALTH: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 2);
pub const R1_NEAR: Ipv4Addr = Ipv4Addr::new(198, 18, 10, 1);

/// `198.18.c.d`.
#[must_use]
pub const fn ip(c: u8, d: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, c, d)
}

/// The namespaces (agent node, three routers, the peer) and the agent;
/// all removed on drop, panics included.
pub struct Chain {
    /// The agent's node, r1, r2, r3, the peer.
    pub ns: Vec<Netns>,
    pub dir: PathBuf,
    pins: PathBuf,
    agent: Option<Child>,
    /// The agent's endpoint namespace, once it started.
    endpoint_netns: Option<String>,
}

impl Default for Chain {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Chain {
    fn drop(&mut self) {
        if let Some(mut child) = self.agent.take() {
            // An orderly stop removes the agent's endpoint; one that does not
            // come within the stop deadline is killed.
            crate::process::stop(&mut child, nix::sys::signal::Signal::SIGTERM);
        }
        // Left by an agent that crashed or was killed.
        if let Some(ep) = self.endpoint_netns.take()
            && let Ok(ns) = Netns::named(&ep)
        {
            let _ = ns.delete();
        }
        for ns in &self.ns {
            let _ = ns.delete();
        }
        let _ = health_agent::datapath::remove_pins(&self.pins);
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// One end of a link: its namespace, interface and address (/24).
type End<'a> = (&'a Netns, &'a str, Ipv4Addr);

/// Links `near` to `far` by a veth, both ends addressed and up.
fn link(near: End<'_>, far: End<'_>) {
    let (near_name, far_name) = (near.1.to_owned(), far.1.to_owned());
    let (other, address) = (far.0.clone(), near.2);
    let peer_name = far_name.clone();
    in_netns(Some(near.0), |nl| async move {
        nl.add_veth(&near_name, &peer_name, Some(&other)).await?;
        nl.add_address(&near_name, address, 24).await?;
        nl.set_up(&near_name).await?;
        nl.set_up("lo").await
    })
    .expect("the near end");
    let address = far.2;
    in_netns(Some(far.0), |nl| async move {
        nl.add_address(&far_name, address, 24).await?;
        nl.set_up(&far_name).await?;
        nl.set_up("lo").await
    })
    .expect("the far end");
}

/// Routes in `ns`: each destination /prefix via its gateway.
fn routes(ns: &Netns, routes: &[(Ipv4Addr, u8, Ipv4Addr)]) {
    let routes = routes.to_vec();
    in_netns(Some(ns), |nl| async move {
        for (dst, prefix, via) in routes {
            nl.replace_route_via(dst, prefix, via).await?;
        }
        Ok(())
    })
    .expect("routes");
}

impl Chain {
    /// Builds the chain; panics naming the failing step.
    #[must_use]
    pub fn new() -> Self {
        crate::require_root();
        names::sweep_stale_netns();
        let dir = std::env::temp_dir().join(names::unique("trace"));
        fs::create_dir_all(&dir).expect("dir");
        let mut chain = Self {
            ns: Vec::new(),
            pins: Path::new(health_agent::datapath::BPFFS_ROOT).join(names::unique("trace-pins")),
            dir,
            agent: None,
            endpoint_netns: None,
        };
        for name in [
            "trace-node",
            "trace-r1",
            "trace-r2",
            "trace-r3",
            "trace-peer",
        ] {
            chain
                .ns
                .push(Netns::create(&names::unique(name)).expect("netns"));
        }
        let [node, r1, r2, r3, peer] = [0, 1, 2, 3, 4].map(|i| chain.ns[i].clone());
        link((&node, "uplink", ip(10, 2)), (&r1, "west", ip(10, 1)));
        link((&r1, "east", ip(11, 1)), (&r2, "west", ip(11, 2)));
        link((&r2, "east", ip(12, 1)), (&r3, "west", ip(12, 2)));
        link((&r3, "east", ip(13, 1)), (&peer, "west", PEER_IP));
        let agent_net = Ipv4Addr::new(198, 19, 255, 0);
        let peer_net = Ipv4Addr::new(198, 19, 1, 0);
        routes(&node, &[(Ipv4Addr::UNSPECIFIED, 0, ip(10, 1))]);
        routes(
            &r1,
            &[
                (ip(12, 0), 24, ip(11, 2)),
                (ip(13, 0), 24, ip(11, 2)),
                (peer_net, 24, ip(11, 2)),
                (agent_net, 24, ip(10, 2)),
            ],
        );
        routes(
            &r2,
            &[
                (ip(10, 0), 24, ip(11, 1)),
                (agent_net, 24, ip(11, 1)),
                (ip(13, 0), 24, ip(12, 2)),
                (peer_net, 24, ip(12, 2)),
            ],
        );
        routes(
            &r3,
            &[
                (ip(10, 0), 24, ip(12, 1)),
                (ip(11, 0), 24, ip(12, 1)),
                (agent_net, 24, ip(12, 1)),
                (peer_net, 24, PEER_IP),
            ],
        );
        routes(&peer, &[(Ipv4Addr::UNSPECIFIED, 0, ip(13, 1))]);
        in_netns(Some(&peer), |nl| async move {
            nl.add_address("lo", PEER_HEALTH, 32).await
        })
        .expect("the peer's health address");
        for r in [&r1, &r2, &r3] {
            TwoNodes::sysctl(r, "net/ipv4/ip_forward", "1");
        }
        chain
    }

    /// Starts the agent on the first node (500 ms rounds), `extra`
    /// flags after the chain's own.
    pub fn start_agent(&mut self, extra: &[&str]) {
        let nodes = self.dir.join("nodes.yaml");
        fs::write(
            &nodes,
            format!(
                "nodes:\n  - name: peer\n    node-ip: {PEER_IP}\n    health-ip: {PEER_HEALTH}\n"
            ),
        )
        .expect("nodes file");
        let ep = names::unique("trace-ep");
        self.endpoint_netns = Some(ep.clone());
        let mut cmd = daemon_command(&self.ns[0], &self.dir, &self.pins, &ep, AGENT_CIDR);
        cmd.args(["--node-name", "agent", "--health-range", "198.19.0.0/16"])
            .arg("--nodes-file")
            .arg(&nodes)
            .args(["--probe-interval", "500ms", "--probe-timeout", "400ms"])
            .args(crate::agent_env_args())
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(fs::File::create(self.dir.join("daemon.log")).expect("log"));
        self.agent = Some(cmd.spawn().expect("spawn the agent"));
    }

    #[must_use]
    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    /// The ICMP path to the peer's node address, once `accept` holds.
    /// Polls until `accept` holds for it; panics with it and the log
    /// after 30 s.
    pub fn wait_path(&self, what: &str, accept: impl Fn(&PathState) -> bool) -> PathState {
        let socket = socket_in(&self.dir);
        let deadline = Instant::now() + patience(Duration::from_secs(30));
        loop {
            let status: Option<ClusterStatus> =
                api::call(&socket, |c| async move { c.status().await }).ok();
            let path = status.and_then(|s| {
                s.nodes
                    .into_iter()
                    .find(|n| n.name == "peer")
                    .map(|n| n.host.icmp)
            });
            if let Some(p) = path.as_ref().filter(|p| accept(p)) {
                return p.clone();
            }
            assert!(
                Instant::now() < deadline,
                "{what}: the path is {path:#?}; the agent's log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}
