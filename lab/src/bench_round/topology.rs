//! The run's namespaces and links: the agent's node, the router and the
//! peers (see [`super`]), the peers' one HTTP server, the agent's start,
//! and the kernel counters that tell whether the simulated network kept
//! up.

use std::{
    fmt::Write as _,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Child, ExitStatus, Stdio},
    time::Duration,
};

use super::{
    Options,
    peers::{answering, peer_ips, peer_name},
};
use anyhow::Context as _;
use health_agent::{
    datapath::remove_pins,
    sys::{netlink::in_netns, netns::Netns},
};
use health_tests::{
    agent::{daemon_command, socket_in},
    names,
    netns_guard::NetnsGuard,
    topology::TwoNodes,
};

/// The agent's log lines a failed run prints.
const LOG_TAIL: usize = 20;
/// The end of the agent's log read for them.
const LOG_TAIL_BYTES: u64 = 64 << 10;

/// The router's end of the agent node's uplink.
pub(super) const ROUTER_UPLINK: &str = "r-agent";
/// Packets the agent node's uplink queues with `--network-thread`: a
/// round's burst of every probe's first packet, twice over.
const UPLINK_QUEUE: u32 = 65_536;

/// Everything made for the run, removed on drop.
pub(crate) struct Lab {
    pub(super) agent: Netns,
    router: Netns,
    pub(crate) peers: Netns,
    pub(super) dir: PathBuf,
    pins: PathBuf,
    ep_netns: String,
    daemon: Option<Child>,
    /// The agent's exit status, once it ended.
    ended: Option<ExitStatus>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            health_tests::process::stop(&mut d, nix::sys::signal::Signal::SIGTERM);
        }
        let _ = Netns::named(&self.ep_netns).map(|n| n.delete());
        for ns in [&self.agent, &self.router, &self.peers] {
            let _ = ns.delete();
        }
        let _ = remove_pins(&self.pins);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Lab {
    pub(crate) fn new(opts: &Options) -> anyhow::Result<Self> {
        names::sweep_stale_netns();
        // Each removed if a later one cannot be made.
        let agent = NetnsGuard::try_create(&names::unique("round-agent"))?;
        let router = NetnsGuard::try_create(&names::unique("round-router"))?;
        let peers = NetnsGuard::try_create(&names::unique("round-peers"))?;
        let lab = Self {
            agent: agent.keep(),
            router: router.keep(),
            peers: peers.keep(),
            dir: std::env::temp_dir().join(names::unique("round")),
            pins: Path::new("/sys/fs/bpf").join(names::unique("round-pins")),
            ep_netns: names::unique("round-ep"),
            daemon: None,
            ended: None,
        };
        std::fs::create_dir_all(&lab.dir)?;
        let (router, peers) = (lab.router.clone(), lab.peers.clone());
        in_netns(Some(&lab.agent), |nl| async move {
            nl.set_up("lo").await?;
            nl.add_veth("uplink", ROUTER_UPLINK, Some(&router)).await?;
            nl.add_address("uplink", Ipv4Addr::new(198, 18, 0, 2), 24)
                .await?;
            nl.set_up("uplink").await?;
            nl.replace_route_via(Ipv4Addr::UNSPECIFIED, 0, Ipv4Addr::new(198, 18, 0, 1))
                .await
        })?;
        in_netns(Some(&lab.router), |nl| async move {
            nl.set_up("lo").await?;
            nl.add_veth("r-peers", "peers", Some(&peers)).await?;
            nl.add_address(ROUTER_UPLINK, Ipv4Addr::new(198, 18, 0, 1), 24)
                .await?;
            nl.add_address("r-peers", Ipv4Addr::new(198, 18, 1, 1), 24)
                .await?;
            nl.set_up(ROUTER_UPLINK).await?;
            nl.set_up("r-peers").await?;
            let via_peers = Ipv4Addr::new(198, 18, 1, 2);
            nl.replace_route_via(Ipv4Addr::new(198, 18, 128, 0), 17, via_peers)
                .await?;
            nl.replace_route_via(Ipv4Addr::new(198, 19, 0, 0), 17, via_peers)
                .await?;
            // The agent's health CIDR is behind the agent's node.
            nl.replace_route_via(
                Ipv4Addr::new(198, 19, 255, 0),
                24,
                Ipv4Addr::new(198, 18, 0, 2),
            )
            .await
        })?;
        TwoNodes::sysctl(&lab.router, "net/ipv4/ip_forward", "1");
        if opts.network_thread {
            crate::napi::threaded((&lab.router, ROUTER_UPLINK), (&lab.agent, "uplink"))?;
            // A queue on the uplink, as a NIC has: a round's burst waits
            // for the network's thread instead of overflowing the veth's
            // ring (tens of thousands of probes lost a round without).
            in_netns(Some(&lab.agent), |nl| async move {
                nl.set_fifo_queue("uplink", UPLINK_QUEUE).await
            })?;
        }
        let (n, pct) = (opts.peers, opts.silent_pct);
        in_netns(Some(&lab.peers), |nl| async move {
            nl.set_up("lo").await?;
            nl.add_address("peers", Ipv4Addr::new(198, 18, 1, 2), 24)
                .await?;
            nl.set_up("peers").await?;
            for net in answering(n, pct) {
                nl.add_local_route(net.addr().into(), net.prefix_len(), "lo")
                    .await?;
            }
            nl.replace_route_via(Ipv4Addr::UNSPECIFIED, 0, Ipv4Addr::new(198, 18, 1, 1))
                .await
        })?;
        Ok(lab)
    }

    /// Bytes received and sent on the agent node's uplink so far.
    /// Bytes and packets on the agent node's uplink so far, both
    /// directions.
    pub(super) fn uplink(&self) -> anyhow::Result<(u64, u64)> {
        let s = in_netns(Some(&self.agent), |nl| async move {
            nl.link_stats("uplink").await
        })?;
        Ok((s.rx_bytes + s.tx_bytes, s.rx_packets + s.tx_packets))
    }

    pub(crate) fn nodes_file(&self, n: usize) -> anyhow::Result<PathBuf> {
        let mut yaml = String::with_capacity(n * 80);
        yaml.push_str("nodes:\n");
        for k in 0..n {
            let (node, health) = peer_ips(k);
            let _ = writeln!(
                yaml,
                "  - name: {}\n    node-ip: {node}\n    health-ip: {health}",
                peer_name(k)
            );
        }
        let path = self.dir.join("nodes.yaml");
        std::fs::write(&path, yaml)?;
        Ok(path)
    }

    pub(super) fn socket(&self) -> PathBuf {
        socket_in(&self.dir)
    }

    /// Where the agent's log goes: `BENCH_AGENT_LOG_FILE`, else the run's
    /// directory (removed with the lab).
    fn daemon_log(&self) -> PathBuf {
        std::env::var_os("BENCH_AGENT_LOG_FILE")
            .map_or_else(|| self.dir.join("daemon.log"), PathBuf::from)
    }

    /// What a failed run says of the agent: its exit status if it ended,
    /// and its log's last lines (the run's directory goes with the lab; a
    /// `BENCH_AGENT_LOG_FILE` stays, and is named).
    pub(crate) fn agent_report(&mut self) -> String {
        let exited = self
            .agent_ended()
            .map_or_else(String::new, |s| format!("the agent exited ({s}); "));
        let path = self.daemon_log();
        let kept = std::env::var_os("BENCH_AGENT_LOG_FILE")
            .map_or_else(String::new, |_| format!(" ({})", path.display()));
        match log_tail(&path) {
            Ok(tail) if tail.is_empty() => format!("{exited}its log{kept} is empty"),
            Ok(tail) => format!("{exited}the last lines of its log{kept}:\n{tail}"),
            Err(e) => format!("{exited}its log {} could not be read: {e}", path.display()),
        }
    }

    /// The agent's exit status once it has ended, on its own or killed
    /// (reaped then, so that no signal goes to its process ID afterwards).
    pub(crate) fn agent_ended(&mut self) -> Option<ExitStatus> {
        if let Some(status) = self
            .daemon
            .as_mut()
            .and_then(|d| d.try_wait().ok().flatten())
        {
            self.daemon = None;
            self.ended = Some(status);
        }
        self.ended
    }

    pub(crate) fn start_agent(
        &mut self,
        nodes_file: &Path,
        interval: Duration,
    ) -> anyhow::Result<u32> {
        self.ended = None;
        let mut cmd = daemon_command(
            &self.agent,
            &self.dir,
            &self.pins,
            &self.ep_netns,
            "198.19.255.0/24",
        );
        // The agent's CIDR and every peer's health IP (198.19.0.0/17).
        cmd.args(["--node-name", "bench", "--health-range", "198.19.0.0/16"])
            .arg("--nodes-file")
            .arg(nodes_file)
            .args(["--probe-interval", &format!("{}ms", interval.as_millis())])
            .args(["--probe-timeout", "1s", "--failure-threshold", "1"])
            // A full mesh: the round over every peer is what is measured.
            .args(["--probe-peers", "all"])
            // More agent flags for an A/B run (`--probe-mtu off`).
            .args(
                std::env::var("BENCH_AGENT_ARGS")
                    .unwrap_or_default()
                    .split_whitespace(),
            )
            .env(
                "RUST_LOG",
                std::env::var("BENCH_AGENT_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(self.daemon_log())
                    .with_context(|| format!("creating {}", self.daemon_log().display()))?,
            );
        let child = cmd.spawn().context("starting health-agent")?;
        let pid = child.id();
        self.daemon = Some(child);
        Ok(pid)
    }
}

/// The last [`LOG_TAIL`] lines of the log at `path`, read from its last
/// [`LOG_TAIL_BYTES`] (a debug log may be large). Only a regular file is
/// read: a terminal or a pipe given as `BENCH_AGENT_LOG_FILE` would block.
fn log_tail(path: &Path) -> std::io::Result<String> {
    use std::io::{Read as _, Seek as _, SeekFrom};
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Ok(format!("(not a regular file: {})", path.display()));
    }
    let mut file = std::fs::File::open(path)?;
    file.seek(SeekFrom::Start(meta.len().saturating_sub(LOG_TAIL_BYTES)))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    Ok(lines[lines.len().saturating_sub(LOG_TAIL)..].join("\n"))
}

/// The answering peers' :4240, one listener in the peers' namespace.
pub(crate) fn serve_peers(
    rt: &tokio::runtime::Runtime,
    peers: &Netns,
) -> anyhow::Result<tokio_util::sync::CancellationToken> {
    // The one server stands in for every peer: up to 20,000 connections
    // reach it within a round's spread, past the namespace's default
    // `somaxconn` (4,096) that caps the listener's queue; `listen` raises
    // it in the peers' own namespace, for the listen only.
    let listener = peers.run(|| health_agent::probe::hello::listen(4240))??;
    let stop = tokio_util::sync::CancellationToken::new();
    let _guard = rt.enter();
    let listener = tokio::net::TcpListener::from_std(listener)?;
    // One server answers for every peer: each peer's server would see one
    // connection per round from the agent, so no per-source share applies.
    let limits = health_agent::probe::hello::Limits {
        total: 65_536,
        per_source: 65_536,
    };
    // Naming no node: every peer's answer is its own node's.
    rt.spawn(health_agent::probe::hello::serve_with(
        listener,
        stop.clone(),
        limits,
        None,
    ));
    Ok(stop)
}

/// The peers' namespace's TCP listen overflows and drops (`TcpExt`
/// `ListenOverflows`, `ListenDrops`): SYNs or handshakes the one server
/// could not queue, which the agent would see as failed live paths.
pub(super) fn listen_overflows(peers: &Netns) -> Option<(u64, u64)> {
    Some((
        counter(
            peers,
            "/proc/thread-self/net/netstat",
            "TcpExt:",
            "ListenOverflows",
        )?,
        counter(
            peers,
            "/proc/thread-self/net/netstat",
            "TcpExt:",
            "ListenDrops",
        )?,
    ))
}

/// A counter of the kernel's in `ns`: in `file`, the line pair whose
/// names line starts with `prefix`, the value named `name`.
pub(super) fn counter(ns: &Netns, file: &str, prefix: &str, name: &str) -> Option<u64> {
    let text = ns.run(|| std::fs::read_to_string(file)).ok()?.ok()?;
    let mut lines = text.lines().filter(|l| l.starts_with(prefix));
    let (names, values) = (lines.next()?, lines.next()?);
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == name)
        .and_then(|(_, v)| v.parse().ok())
}
