//! `bench-round`: one agent probing N peers in a routed L3 topology.
//!
//! ```text
//! agent node (198.18.0.2) --uplink-- router (198.18.0.1 | 198.18.1.1) --peers-- peers
//! ```
//!
//! The peers namespace holds the node IPs (198.18.128.0/17) and health IPs
//! (198.19.0.0/17) of the answering peers, by local routes, and answers
//! ICMP (its kernel; with `--network-thread` a thread of the lab,
//! [`crate::echo_peers`]) and HTTP :4240 (one `hello` listener). A silent peer's addresses are held by
//! nobody: the router forwards to the peers namespace, which does not
//! forward and drops them without a word, as a host that is down.
//!
//! Reported: first and steady rounds' wall time (the first also from the
//! endpoint's readiness), agent CPU per round, RSS,
//! `GET /v1/status` latency under 8 concurrent clients during the first
//! round, correctness (every answering path OK, no silent path OK), and
//! `fping -i0` over the same ICMP targets in the same run.

use std::{
    fmt::Write as _,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use crate::{echo_peers::EchoPeers, since_ready::SinceReady};
use anyhow::{Context as _, bail};
use health_agent::{
    api::client::Client,
    datapath::remove_pins,
    probe::{path::ProbeResult, status::ClusterStatus},
    sys::{netlink::in_netns, netns::Netns},
};
use health_tests::{
    agent::{daemon_command, socket_in},
    names, process,
    topology::TwoNodes,
};
use ipnet::Ipv4Net;

#[derive(Clone, Copy)]
pub(crate) struct Options {
    pub(crate) peers: usize,
    pub(crate) silent_pct: u32,
    pub(crate) rounds: u32,
    pub(crate) interval: Duration,
    /// The simulated network's work in threads of its own (the router's
    /// NAPI thread, [`crate::napi`], and the peers' echo,
    /// [`crate::echo_peers`]), not in the agent's context.
    pub(crate) network_thread: bool,
}

/// The router's end of the agent node's uplink.
const ROUTER_UPLINK: &str = "r-agent";
/// Packets the agent node's uplink queues with `--network-thread`: a
/// round's burst of every probe's first packet, twice over.
const UPLINK_QUEUE: u32 = 65_536;

/// Everything made for the run, removed on drop.
pub(crate) struct Lab {
    agent: Netns,
    router: Netns,
    pub(crate) peers: Netns,
    dir: PathBuf,
    pins: PathBuf,
    ep_netns: String,
    daemon: Option<Child>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            if let Ok(pid) = i32::try_from(d.id()) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
            let _ = d.wait();
        }
        let _ = Netns::named(&self.ep_netns).map(|n| n.delete());
        for ns in [&self.agent, &self.router, &self.peers] {
            let _ = ns.delete();
        }
        let _ = remove_pins(&self.pins);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Probes a peer takes a round: ICMP and HTTP to its node and health
/// addresses.
pub(crate) const PROBES_A_PEER: u32 = 4;

/// The most peers: the node IPs' and the health IPs' /17s hold 32,768
/// each.
pub(crate) const MAX_PEERS: usize = 32_000;

/// The `k`-th peer's node and health IPs.
fn peer_ips(k: usize) -> (Ipv4Addr, Ipv4Addr) {
    let k = u32::try_from(k).unwrap_or(u32::MAX);
    (
        Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 128, 0)) + k),
        Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 19, 0, 0)) + k),
    )
}

/// The answering peers' node and health IPs as the fewest prefixes: the
/// peers namespace makes them local by route (a real peer holds its own
/// address, not thousands: held as interface addresses, each answer's
/// source check walked one hash chain of thousands of them).
fn answering(n: usize, pct: u32) -> Vec<Ipv4Net> {
    let hosts: Vec<Ipv4Net> = (0..n)
        .filter(|k| !silent(*k, pct))
        .flat_map(|k| {
            let (node, health) = peer_ips(k);
            [node, health].map(Ipv4Net::from)
        })
        .collect();
    Ipv4Net::aggregate(&hosts)
}

/// Whether the `k`-th peer is silent: `pct` percent of them, spread out.
const fn silent(k: usize, pct: u32) -> bool {
    (k % 100) < pct as usize
}

impl Lab {
    pub(crate) fn new(opts: &Options) -> anyhow::Result<Self> {
        names::sweep_stale_netns();
        let lab = Self {
            agent: Netns::create(&names::unique("round-agent"))?,
            router: Netns::create(&names::unique("round-router"))?,
            peers: Netns::create(&names::unique("round-peers"))?,
            dir: std::env::temp_dir().join(names::unique("round")),
            pins: Path::new("/sys/fs/bpf").join(names::unique("round-pins")),
            ep_netns: names::unique("round-ep"),
            daemon: None,
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
    fn uplink_bytes(&self) -> anyhow::Result<u64> {
        let s = in_netns(Some(&self.agent), |nl| async move {
            nl.link_stats("uplink").await
        })?;
        Ok(s.rx_bytes + s.tx_bytes)
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

    fn socket(&self) -> PathBuf {
        socket_in(&self.dir)
    }

    pub(crate) fn start_agent(
        &mut self,
        nodes_file: &Path,
        interval: Duration,
    ) -> anyhow::Result<u32> {
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
            .stderr(match std::env::var_os("BENCH_AGENT_LOG_FILE") {
                Some(path) => std::fs::File::create(path)?,
                None => std::fs::File::create(self.dir.join("daemon.log"))?,
            });
        let child = cmd.spawn().context("starting health-agent")?;
        let pid = child.id();
        self.daemon = Some(child);
        Ok(pid)
    }
}

/// CPU time (user + system) of `pid`, its resident set now and the peak of
/// its resident set since the last call (`VmHWM`, reset after reading by
/// writing 5 to `clear_refs`): what a round allocates and frees between two
/// samples counts in the peak, not in the resident set at its end.
pub(crate) fn usage(pid: u32) -> anyhow::Result<(Duration, Rss)> {
    let (user, system) = cpu_times(pid)?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let rss = Rss {
        now_kib: field("VmRSS:"),
        peak_kib: field("VmHWM:"),
        file_kib: field("RssFile:"),
    };
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
        .context("resetting the agent's peak RSS (clear_refs)")?;
    Ok((user + system, rss))
}

/// The CPU time of `pid` (a process or a kernel thread) so far, in user
/// space and in the kernel (on this topology, much of the latter the
/// simulated network's work in its context).
pub(crate) fn cpu_times(pid: u32) -> anyhow::Result<(Duration, Duration)> {
    stat_cpu(&format!("/proc/{pid}/stat"))
}

/// User and system time from a `stat` file of `/proc` (a process's, or
/// one thread's under `task/`).
pub(crate) fn stat_cpu(path: &str) -> anyhow::Result<(Duration, Duration)> {
    let stat = std::fs::read_to_string(path)?;
    // After the command's closing parenthesis: utime is the 12th field
    // and stime the 13th.
    let after = stat.rsplit_once(')').map_or("", |(_, a)| a);
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|t| t.parse::<u64>().ok()).unwrap_or(0);
    let hz = u64::try_from(nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?.unwrap_or(100))
        .unwrap_or(100)
        .max(1);
    let time = |t: u64| Duration::from_millis(t * 1000 / hz);
    Ok((time(ticks(11)), time(ticks(12))))
}

/// The resident set when sampled and its peak since the sample before.
#[derive(Clone, Copy)]
#[expect(
    clippy::struct_field_names,
    reason = "each in KiB, as /proc/PID/status gives them"
)]
pub(crate) struct Rss {
    pub(crate) now_kib: u64,
    peak_kib: u64,
    /// Of `now_kib`, pages of files (the binary's code and the libraries):
    /// the rest is the heap, the stacks and the maps' memory.
    file_kib: u64,
}

/// Per-round figures.
struct Round {
    seq: u64,
    /// When it started, in epoch milliseconds (the agent's record).
    started_ms: u64,
    wall_ms: u64,
    cpu: Duration,
    /// Of which in user space.
    user: Duration,
    rss: Rss,
    /// Bytes on the agent node's uplink, both directions (the probes and
    /// their answers: nothing else crosses it).
    bytes: u64,
    /// CPU of the simulated network's threads, with `--network-thread`.
    network: Duration,
    /// CPU of this process: the peers' HTTP server (with
    /// `--network-thread`, their echo too), the bench's polls (and in the
    /// clients' round, the clients), and the simulated network's softirq
    /// work that ran in their context.
    lab: Duration,
    /// The status clients pulled through this round: not a steady one.
    clients: bool,
}

/// The round (1-based) through which the status clients pull: the second
/// when there are rounds enough for a steady one after it, so that the
/// first round (a node's start) and the steady rounds are each measured
/// as they run without them; else the first.
const fn clients_round(rounds: u32) -> usize {
    if rounds >= 3 { 2 } else { 1 }
}

/// The rounds after the first that the status clients left alone.
fn steady_rounds(rounds: &[Round]) -> impl Iterator<Item = &Round> {
    rounds.iter().skip(1).filter(|r| !r.clients)
}

pub(crate) struct Report {
    text: String,
    /// Agent CPU per round per peer over the steady rounds (every round
    /// after the first), when there were any.
    cpu_per_peer: Option<Duration>,
}

impl Report {
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    pub(crate) const fn cpu_per_peer(&self) -> Option<Duration> {
        self.cpu_per_peer
    }
}

/// The agent's CPU over `rounds` (all but the first) per round and peer:
/// the sum of the rounds' CPU, so the clock ticks it is read in round off
/// once over the whole run, not once a round.
fn steady_cpu_per_peer(rounds: &[Round], peers: usize) -> Option<Duration> {
    let steady: Vec<&Round> = steady_rounds(rounds).collect();
    if steady.is_empty() {
        return None;
    }
    let total: Duration = steady.iter().map(|r| r.cpu).sum();
    let per = u32::try_from(steady.len() * peers).ok()?;
    Some(total / per)
}

/// `opts` refused with the flag named when out of range.
fn check(opts: &Options) -> anyhow::Result<()> {
    if opts.peers == 0 || opts.peers > MAX_PEERS {
        bail!("--peers {} is out of range (1 to {MAX_PEERS})", opts.peers);
    }
    if opts.silent_pct > 100 {
        bail!("--silent {} is not a percentage", opts.silent_pct);
    }
    // Peer k is silent when k % 100 < the percentage: a run of no more
    // peers than that would check nothing it claims to.
    if opts.silent_pct < 100 && live_paths(opts.peers, opts.silent_pct) == 0 {
        bail!(
            "--peers {} with --silent {} leaves no answering peer (the first {} of every hundred are silent): use at least {} peers",
            opts.peers,
            opts.silent_pct,
            opts.silent_pct,
            opts.silent_pct + 1
        );
    }
    Ok(())
}

#[expect(
    clippy::too_many_lines,
    reason = "one run's sequence: topology, agent, rounds, clients, reference"
)]
pub(crate) fn run(opts: &Options) -> anyhow::Result<Report> {
    check(opts)?;
    eprintln!(
        "building the topology: {} peers, {}% silent...",
        opts.peers, opts.silent_pct
    );
    let mut lab = Lab::new(opts)?;
    crate::stop::check()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let stop_peers = serve_peers(&rt, &lab.peers)?;
    // With the network in a thread of its own, the peers' echo too: the
    // kernel's shared ICMP socket cannot queue a poll's worth of replies.
    let echo = if opts.network_thread {
        Some(EchoPeers::start(&lab.peers)?)
    } else {
        None
    };
    let nodes_file = lab.nodes_file(opts.peers)?;
    let started = Instant::now();
    let pid = lab.start_agent(&nodes_file, opts.interval)?;
    let client = Client::new(lab.socket());
    let served = served_after(&rt, &client, started, &lab)?;
    // 8 clients hammer GET /v1/status, and one asks for the summary and
    // one node's status, through the clients' round.
    let clients_at = clients_round(opts.rounds);
    let clients_done = Arc::new(AtomicBool::new(false));
    // The clients stop however the run ends, an error included.
    let _stop_clients = SetOnDrop(clients_done.clone());
    let start_clients = || status_clients(&client, &clients_done, &peer_name(opts.peers - 1));
    let mut latencies = if clients_at == 1 {
        start_clients()
    } else {
        Vec::new()
    };
    let mut rounds: Vec<Round> = Vec::new();
    let mut last_seq = 0;
    // The network's thread (found by searching /proc) only with it.
    let network_dev = opts.network_thread.then_some(ROUTER_UPLINK);
    let network_cpu = || {
        network_dev.map(crate::napi::thread_cpu).unwrap_or_default()
            + echo.as_ref().map(EchoPeers::cpu).unwrap_or_default()
    };
    let mut before = (usage(pid)?.0, cpu_times(pid)?.0, lab.uplink_bytes()?);
    let mut network_before = network_cpu();
    let lab_cpu = || cpu_times(std::process::id()).map(|(u, s)| u + s);
    let mut lab_before = lab_cpu()?;
    let deadline = Instant::now() + Duration::from_secs(60) + opts.interval * (opts.rounds + 1);
    let mut first: Option<ClusterStatus> = None;
    let mut since_ready = None;
    while rounds.len() < opts.rounds as usize {
        if Instant::now() > deadline {
            bail!(
                "{} rounds did not finish in time; log in {}",
                opts.rounds,
                lab.dir.display()
            );
        }
        if let Ok(summary) = rt.block_on(client.status_summary())
            && let Some(r) = summary.round
            && r.seq != last_seq
        {
            let ((cpu, rss), (user, _)) = (usage(pid)?, cpu_times(pid)?);
            let bytes = lab.uplink_bytes()?;
            let network = network_cpu();
            let lab_now = lab_cpu()?;
            let clients = rounds.len() + 1 == clients_at;
            if clients {
                clients_done.store(true, Ordering::Relaxed);
            }
            if first.is_none() {
                first = Some(rt.block_on(client.status())?);
                // The agent's first round, when the bench saw it.
                if r.seq == 1
                    && let Ok(endpoints) = rt.block_on(client.endpoints())
                {
                    since_ready = SinceReady::of(&endpoints, r.started_ms, r.duration_ms);
                }
            }
            rounds.push(Round {
                seq: r.seq,
                started_ms: r.started_ms,
                wall_ms: r.duration_ms,
                cpu: cpu.saturating_sub(before.0),
                user: user.saturating_sub(before.1),
                rss,
                bytes: bytes.saturating_sub(before.2),
                network: network.saturating_sub(network_before),
                lab: lab_now.saturating_sub(lab_before),
                clients,
            });
            if rounds.len() + 1 == clients_at {
                latencies = start_clients();
            }
            before = (cpu, user, bytes);
            network_before = network;
            lab_before = lab_now;
            last_seq = r.seq;
        }
        crate::stop::sleep(poll_period(opts.interval))?;
    }
    clients_done.store(true, Ordering::Relaxed);
    let (status_latency, summary_latency) = joined(latencies);
    let first = first.context("no round")?;
    let (live_ok, false_ok) = correctness(&first, opts.silent_pct);
    // The same check after the last round: the steady rounds'. Every link
    // of the topology takes 1500 bytes: an MTU black hole is a wrong
    // verdict too.
    let last_status = rt.block_on(client.status())?;
    let last = correctness(&last_status, opts.silent_pct);
    let false_blackholes = last_status
        .nodes
        .iter()
        .filter(|n| n.host.icmp.mtu_blackhole.is_some())
        .count();
    print_live_failures(&first, opts.silent_pct, &lab.peers);
    if let Some(echo) = &echo {
        let (answered, not_sent) = echo.counts();
        println!("the peers' echo, answered by the lab: {answered} replies, {not_sent} not sent");
    }
    let live_paths = live_paths(opts.peers, opts.silent_pct);
    crate::stop::check()?;
    // The reference, in the same run, from the agent's node.
    let fping = fping(&lab.agent, opts.peers)?;
    // Ctrl-C from a terminal stops fping too: its time is not a sweep's.
    crate::stop::check()?;
    stop_peers.cancel();
    drop(lab);

    let measured = Measured {
        served,
        since_ready,
        rounds,
        clients_at,
        status_latency,
        summary_latency,
        live_ok,
        live_paths,
        false_ok,
        last,
        false_blackholes,
        fping,
    };
    let text = render(opts, &measured);
    if false_ok > 0 || last.1 > 0 || live_ok < live_paths || false_blackholes > 0 {
        bail!("wrong results:\n{text}");
    }
    Ok(Report {
        cpu_per_peer: steady_cpu_per_peer(&measured.rounds, opts.peers),
        text,
    })
}

/// Sets its flag when dropped.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// How long after `started` the agent's socket first answered.
fn served_after(
    rt: &tokio::runtime::Runtime,
    client: &Client,
    started: Instant,
    lab: &Lab,
) -> anyhow::Result<Duration> {
    loop {
        if rt.block_on(client.healthz()).is_ok() {
            return Ok(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!(
                "the agent's socket did not serve within 60 s; log in {}",
                lab.dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(2));
        crate::stop::check()?;
    }
}

/// What a run measured.
struct Measured {
    served: Duration,
    /// The first round against the endpoint's readiness.
    since_ready: Option<SinceReady>,
    rounds: Vec<Round>,
    /// The round the status clients pulled through.
    clients_at: usize,
    status_latency: Percentiles,
    /// `?summary=true` and one node's status, asked beside them.
    summary_latency: Percentiles,
    live_ok: usize,
    live_paths: usize,
    false_ok: usize,
    /// Live paths OK and silent paths OK after the last round.
    last: (usize, usize),
    /// Nodes called MTU black holes after the last round (none is).
    false_blackholes: usize,
    fping: Duration,
}

#[allow(
    clippy::cast_precision_loss,
    reason = "MiB and ratios for display, from values far below 2^52"
)]
fn render(opts: &Options, m: &Measured) -> String {
    let (served, rounds, fping) = (m.served, &m.rounds, m.fping);
    let (live_ok, live_paths, false_ok) = (m.live_ok, m.live_paths, m.false_ok);
    let mut text = String::new();
    let _ = writeln!(
        text,
        "bench-round: {} peers ({} probes a round), {}% silent, timeout 1 s{}",
        opts.peers,
        PROBES_A_PEER as usize * opts.peers,
        opts.silent_pct,
        if opts.network_thread {
            "; the simulated network in threads of its own"
        } else {
            ""
        }
    );
    let _ = writeln!(text, "socket served after {} ms", served.as_millis());
    let _ = writeln!(text, "{}", SinceReady::line(m.since_ready));
    for r in rounds {
        let _ = writeln!(
            text,
            "round {:>3}: {:>6} ms wall, {:>6} ms agent CPU, RSS {:>6.1} MiB ({:.1} of files; peak {:>6.1}){}",
            r.seq,
            r.wall_ms,
            r.cpu.as_millis(),
            r.rss.now_kib as f64 / 1024.0,
            r.rss.file_kib as f64 / 1024.0,
            r.rss.peak_kib as f64 / 1024.0,
            if r.clients {
                ", status clients pulling"
            } else {
                ""
            }
        );
    }
    let steady: Vec<&Round> = steady_rounds(rounds).collect();
    if !steady.is_empty() {
        let n = steady.len() as u64;
        let per_peer = steady_cpu_per_peer(rounds, opts.peers).map_or(0.0, ms);
        let _ = writeln!(
            text,
            "steady rounds: mean {} ms wall, {} ms CPU ({per_peer:.3} ms a peer, {:.1} µs a probe)",
            steady.iter().map(|r| r.wall_ms).sum::<u64>() / n,
            steady.iter().map(|r| r.cpu.as_millis() as u64).sum::<u64>() / n,
            per_peer * 1000.0 / f64::from(PROBES_A_PEER)
        );
        render_steady_cpu(&mut text, opts, &steady);
        let bytes: u64 = steady.iter().map(|r| r.bytes).sum();
        let _ = writeln!(
            text,
            "steady network: {:.1} kbit/s on the node's uplink at a {} s interval (both directions, {} B a round, {:.0} B a peer)",
            8.0 * bytes as f64 / (1e3 * opts.interval.as_secs_f64() * steady.len() as f64),
            opts.interval.as_secs_f64(),
            bytes / n,
            bytes as f64 / (n as f64 * opts.peers as f64)
        );
        for (what, kib) in [
            (
                "RSS at the rounds' ends",
                rounds.iter().map(|r| r.rss.now_kib).collect::<Vec<_>>(),
            ),
            (
                "peak RSS within the rounds",
                rounds.iter().map(|r| r.rss.peak_kib).collect(),
            ),
        ] {
            let (lo, hi) = (
                kib.iter().min().copied().unwrap_or(0),
                kib.iter().max().copied().unwrap_or(0),
            );
            let _ = writeln!(
                text,
                "{what} over {} rounds: {:.1} .. {:.1} MiB ({:+.1}% from the lowest)",
                rounds.len(),
                lo as f64 / 1024.0,
                hi as f64 / 1024.0,
                100.0 * (hi as f64 - lo as f64) / (lo.max(1) as f64)
            );
        }
    }
    render_api(&mut text, m);
    let _ = writeln!(
        text,
        "correctness: {live_ok}/{live_paths} live paths OK, {false_ok} silent paths OK (false OK)"
    );
    let _ = writeln!(
        text,
        "after the last round: {}/{live_paths} live paths OK, {} silent paths OK (false OK), {} MTU black holes (false)",
        m.last.0, m.last.1, m.false_blackholes
    );
    let first_ms = rounds.first().map_or(0, |r| r.wall_ms);
    let _ = writeln!(
        text,
        "fping -i0 over the same {} ICMP targets: {} ms; first round / fping = {:.2}x",
        2 * opts.peers,
        fping.as_millis(),
        first_ms as f64 / fping.as_millis().max(1) as f64
    );
    text
}

/// The status clients' latencies, and when in their round each
/// kind's slowest answer was asked for.
fn render_api(text: &mut String, m: &Measured) {
    let which = if m.clients_at == 1 { "first" } else { "second" };
    let started = m.rounds.get(m.clients_at - 1).map(|r| r.started_ms);
    let slowest = |p: &Percentiles| {
        started.map_or_else(String::new, |s| {
            format!(
                "; the slowest asked {:+.3} s from the round's start",
                p.max_from(s)
            )
        })
    };
    let _ = writeln!(
        text,
        "GET /v1/status during the {which} round, 8 clients: {} (to the body's last byte, as sent{})",
        m.status_latency.line(),
        slowest(&m.status_latency)
    );
    let _ = writeln!(
        text,
        "GET /v1/status?summary=true and ?node=NAME beside them, 1 client: {}{}",
        m.summary_latency.line(),
        slowest(&m.summary_latency)
    );
}

/// The steady rounds' CPU: the agent's share of a core, its user-space
/// part, and the simulated network's thread with `--network-thread`.
#[allow(
    clippy::cast_precision_loss,
    reason = "percentages for display, from values far below 2^52"
)]
fn render_steady_cpu(text: &mut String, opts: &Options, steady: &[&Round]) {
    let n = steady.len() as u64;
    let cpu: Duration = steady.iter().map(|r| r.cpu).sum();
    let user: Duration = steady.iter().map(|r| r.user).sum();
    let _ = writeln!(
        text,
        "steady CPU: {:.2} % of a core at a {} s interval, {:.0} % of it in user space",
        100.0 * cpu.as_secs_f64() / (opts.interval.as_secs_f64() * steady.len() as f64),
        opts.interval.as_secs_f64(),
        100.0 * user.as_secs_f64() / cpu.as_secs_f64().max(1e-9)
    );
    if opts.network_thread {
        let network: Duration = steady.iter().map(|r| r.network).sum();
        let _ = writeln!(
            text,
            "steady CPU of the simulated network (router, peers and the agent node's receives, in the napi/{ROUTER_UPLINK} kernel thread and the peers' echo thread): {:.2} % of a core, {} ms a round",
            100.0 * network.as_secs_f64() / (opts.interval.as_secs_f64() * steady.len() as f64),
            network.as_millis() / u128::from(n)
        );
    }
    let lab: Duration = steady.iter().map(|r| r.lab).sum();
    let probes = f64::from(PROBES_A_PEER) * opts.peers as f64 * steady.len() as f64;
    let _ = writeln!(
        text,
        "steady CPU of the bench's process (the peers' HTTP server{}, and the simulated network's softirq work in its context): {} ms a round; with the agent's, {:.1} µs a probe",
        if opts.network_thread {
            " and their echo"
        } else {
            ""
        },
        lab.as_millis() / u128::from(n),
        (cpu + lab).as_secs_f64() * 1e6 / probes.max(1.0)
    );
}

/// The answering peers' :4240, one listener in the peers' namespace.
pub(crate) fn serve_peers(
    rt: &tokio::runtime::Runtime,
    peers: &Netns,
) -> anyhow::Result<tokio_util::sync::CancellationToken> {
    // The one server stands in for every peer: up to 20,000 connections
    // reach it within a round's spread, past the namespace's default
    // `somaxconn` (4,096) that caps the listener's queue. Raised in the
    // peers' own namespace, for the listen only.
    let listener = peers.run(|| {
        let _queue = health_agent::sys::sysctl::Sysctl::set("net/core/somaxconn", "65535")?;
        health_agent::probe::hello::listen(4240)
    })??;
    let stop = tokio_util::sync::CancellationToken::new();
    let _guard = rt.enter();
    let listener = tokio::net::TcpListener::from_std(listener)?;
    // One server answers for every peer: each peer's server would see one
    // connection per round from the agent, so no per-source share applies.
    let limits = health_agent::probe::hello::Limits {
        total: 65_536,
        per_source: 65_536,
    };
    rt.spawn(health_agent::probe::hello::serve_with(
        listener,
        stop.clone(),
        limits,
    ));
    Ok(stop)
}

/// The peers' namespace's TCP listen overflows and drops (`TcpExt`
/// `ListenOverflows`, `ListenDrops`): SYNs or handshakes the one server
/// could not queue, which the agent would see as failed live paths.
fn listen_overflows(peers: &Netns) -> Option<(u64, u64)> {
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
fn counter(ns: &Netns, file: &str, prefix: &str, name: &str) -> Option<u64> {
    let text = ns.run(|| std::fs::read_to_string(file)).ok()?.ok()?;
    let mut lines = text.lines().filter(|l| l.starts_with(prefix));
    let (names, values) = (lines.next()?, lines.next()?);
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == name)
        .and_then(|(_, v)| v.parse().ok())
}

/// An answer's latency, and when its request was sent (epoch ms).
type Sample = (Duration, u64);

/// Each status client's thread, and whether it asks the small queries.
type StatusClient = (std::thread::JoinHandle<Vec<Sample>>, bool);

/// 8 clients asking `GET /v1/status` (the whole body) as fast as they can
/// until `done`, and a ninth asking by turns for the summary
/// (`?summary=true`) and one node's status (`?node=NAME`); each returns
/// its latencies: to the last byte of the body as sent (gzip), as a load
/// generator measures, not the client's own decoding, which on 2 vCPUs
/// would take the agent's CPU.
fn status_clients(client: &Client, done: &Arc<AtomicBool>, node: &str) -> Vec<StatusClient> {
    (0..9)
        .map(|i| {
            let small = i == 8;
            let (client, done) = (client.clone(), done.clone());
            let node = format!("/v1/status?node={node}");
            let handle = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                let mut samples = Vec::new();
                let mut turn = 0_usize;
                while !done.load(Ordering::Relaxed) {
                    let path = match (small, turn % 2) {
                        (false, _) => "/v1/status",
                        (true, 0) => "/v1/status?summary=true",
                        (true, _) => node.as_str(),
                    };
                    turn += 1;
                    let (t, sent_ms) = (Instant::now(), health_agent::util::timefmt::now_ms());
                    if rt
                        .block_on(client.raw_as_sent("GET", path))
                        .is_ok_and(|(status, _, _)| status.is_success())
                    {
                        samples.push((t.elapsed(), sent_ms));
                    }
                }
                samples
            });
            (handle, small)
        })
        .collect()
}

/// The status clients' latencies, once they stopped: the whole status's,
/// and the small queries'.
fn joined(clients: Vec<StatusClient>) -> (Percentiles, Percentiles) {
    let (mut full, mut small) = (Vec::new(), Vec::new());
    for (h, summary) in clients {
        let samples = h.join().unwrap_or_default();
        if summary {
            small.extend(samples);
        } else {
            full.extend(samples);
        }
    }
    (Percentiles::of(full), Percentiles::of(small))
}

/// A latency distribution's count and percentiles.
struct Percentiles {
    count: usize,
    p50: Duration,
    p90: Duration,
    p99: Duration,
    max: Duration,
    /// When the slowest answer's request was sent (epoch ms).
    max_sent_ms: u64,
}

impl Percentiles {
    /// "N answers, p99 X ms (p50, p90, max)".
    fn line(&self) -> String {
        format!(
            "{} answers, p99 {:.2} ms (p50 {:.2}, p90 {:.2}, max {:.2} ms)",
            self.count,
            ms(self.p99),
            ms(self.p50),
            ms(self.p90),
            ms(self.max)
        )
    }

    fn of(mut samples: Vec<Sample>) -> Self {
        samples.sort_unstable();
        let at = |pct: usize| {
            samples
                .get((samples.len() * pct / 100).min(samples.len().saturating_sub(1)))
                .map(|s| s.0)
                .unwrap_or_default()
        };
        let (max, max_sent_ms) = samples.last().copied().unwrap_or_default();
        Self {
            count: samples.len(),
            p50: at(50),
            p90: at(90),
            p99: at(99),
            max,
            max_sent_ms,
        }
    }

    /// When the slowest answer's request was sent, in seconds from
    /// `started_ms` (a round's start): where in the round the answers
    /// wait longest.
    #[allow(
        clippy::cast_precision_loss,
        reason = "seconds for display, from milliseconds far below 2^52"
    )]
    fn max_from(&self, started_ms: u64) -> f64 {
        (self.max_sent_ms as f64 - started_ms as f64) / 1000.0
    }
}

/// Milliseconds, for display.
fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The index `k` of the node `peer-k` (`usize::MAX` for any other name).
/// The `k`-th peer's name.
fn peer_name(k: usize) -> String {
    format!("peer-{k:05}")
}

fn peer_index(name: &str) -> usize {
    name.trim_start_matches("peer-")
        .parse()
        .unwrap_or(usize::MAX)
}

/// Why live paths failed: (path, error) with counts, most frequent first.
fn live_failures(status: &ClusterStatus, pct: u32) -> Vec<(String, usize)> {
    let mut tally: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for n in &status.nodes {
        let k = peer_index(&n.name);
        if silent(k, pct) {
            continue;
        }
        for (path, p) in [
            ("node ICMP", &n.host.icmp),
            ("node HTTP", &n.host.http),
            ("endpoint ICMP", &n.endpoint.icmp),
            ("endpoint HTTP", &n.endpoint.http),
        ] {
            if p.result != ProbeResult::Success {
                let why = p.last_error.as_deref().unwrap_or("never probed");
                *tally.entry(format!("{path}: {why}")).or_default() += 1;
            }
        }
    }
    let mut v: Vec<_> = tally.into_iter().collect();
    v.sort_by_key(|e| std::cmp::Reverse(e.1));
    v
}

/// How often the agent is asked whether a round ended: often enough to
/// catch every round (a fifth of the interval: two rounds never end within
/// one period), seldom enough not to weigh on the agent it measures (at a
/// 60 s interval, polling every 25 ms cost the agent more CPU than its
/// rounds did; at 500 peers and 3 s, a twentieth of the interval was 7 %
/// of the agent's CPU). Rounds are timed by the agent, not by this.
fn poll_period(interval: Duration) -> Duration {
    (interval / 5).clamp(Duration::from_millis(25), Duration::from_secs(1))
}

/// The most frequent reasons live paths failed in `status`, and whether the
/// peers' one server could queue every connection.
fn print_live_failures(status: &ClusterStatus, pct: u32, peers: &Netns) {
    for (why, n) in live_failures(status, pct).iter().take(5) {
        println!("first round: {n} live paths not OK: {why}");
    }
    if let Some((overflows, drops)) = listen_overflows(peers) {
        println!("the peers' server: {overflows} listen overflows, {drops} listen drops");
    }
    // The one host that answers for every peer has one ICMP socket: a
    // reply it cannot queue (its send buffer full of replies waiting for
    // the network's thread) is an echo lost, which an agent rightly counts.
    if let Some(errors) = counter(peers, "/proc/thread-self/net/snmp", "Icmp:", "OutErrors") {
        println!("the peers' ICMP: {errors} replies not sent");
    }
}

/// The paths of the answering ones among `peers` peers, `pct` % silent.
fn live_paths(peers: usize, pct: u32) -> usize {
    PROBES_A_PEER as usize * (0..peers).filter(|k| !silent(*k, pct)).count()
}

/// Live paths that are OK, and silent paths that are (wrongly) OK.
fn correctness(status: &ClusterStatus, pct: u32) -> (usize, usize) {
    let (mut live_ok, mut false_ok) = (0, 0);
    for n in &status.nodes {
        let k = peer_index(&n.name);
        let ok = [
            &n.host.icmp,
            &n.host.http,
            &n.endpoint.icmp,
            &n.endpoint.http,
        ]
        .iter()
        .filter(|p| p.result == ProbeResult::Success)
        .count();
        if silent(k, pct) {
            false_ok += ok;
        } else {
            live_ok += ok;
        }
    }
    (live_ok, false_ok)
}

/// Wall time of `fping -i0 -q -t 1000 -r 0` over every node and health IP.
fn fping(from: &Netns, n: usize) -> anyhow::Result<Duration> {
    let mut targets = String::with_capacity(n * 32);
    for k in 0..n {
        let (a, b) = peer_ips(k);
        let _ = writeln!(targets, "{a}\n{b}");
    }
    let mut cmd = Command::new("fping");
    cmd.args(["-i0", "-q", "-t", "1000", "-r", "0"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    process::enter(&mut cmd, from);
    let t = Instant::now();
    let mut child = cmd
        .spawn()
        .context("starting fping (apt-get install fping)")?;
    if let Some(mut stdin) = child.stdin.take() {
        std::io::Write::write_all(&mut stdin, targets.as_bytes())?;
    }
    child.wait()?;
    Ok(t.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(seq: u64, cpu_ms: u64) -> Round {
        Round {
            seq,
            started_ms: 0,
            wall_ms: 1_100,
            cpu: Duration::from_millis(cpu_ms),
            user: Duration::from_millis(cpu_ms / 2),
            rss: Rss {
                now_kib: 0,
                peak_kib: 0,
                file_kib: 0,
            },
            bytes: 0,
            network: Duration::ZERO,
            lab: Duration::ZERO,
            clients: false,
        }
    }

    #[test]
    fn a_run_that_leaves_no_answering_peer_is_refused() {
        let opts = |peers, silent_pct| Options {
            peers,
            silent_pct,
            rounds: 3,
            interval: Duration::from_secs(1),
            network_thread: false,
        };
        let err = check(&opts(40, 50)).expect_err("40 peers, the first 50 silent");
        assert!(err.to_string().contains("use at least 51 peers"), "{err}");
        check(&opts(51, 50)).expect("one answers");
        check(&opts(40, 100)).expect("all silent, as asked");
        check(&opts(1, 0)).expect("none silent");
        assert!(check(&opts(100, 101)).is_err());
    }

    #[test]
    fn local_prefixes_cover_the_answering_peers_and_no_silent_one() {
        let nets = answering(1_000, 50);
        let held = |ip: Ipv4Addr| nets.iter().any(|n| n.contains(&ip));
        for k in 0..1_100 {
            let (node, health) = peer_ips(k);
            let answers = k < 1_000 && !silent(k, 50);
            assert_eq!((held(node), held(health)), (answers, answers), "peer {k}");
        }
        // Runs of 50 addresses: a few prefixes each, not one per address
        // (1,000 addresses held).
        assert!(nets.len() <= 100, "{} prefixes", nets.len());
    }

    #[test]
    fn cpu_per_peer_leaves_the_first_round_out_and_sums_the_others() {
        // The first round (its sockets, the status clients) is not steady.
        let rounds = [round(1, 2_000), round(2, 50), round(3, 70)];
        assert_eq!(
            steady_cpu_per_peer(&rounds, 500),
            Some(Duration::from_micros(120))
        );
        assert_eq!(steady_cpu_per_peer(&rounds[..1], 500), None);
        assert_eq!(steady_cpu_per_peer(&[], 500), None);
    }

    #[test]
    fn the_status_clients_round_is_not_a_steady_one() {
        // With three rounds or more the clients pull through the second,
        // which the steady figures leave out with the first.
        assert_eq!((clients_round(2), clients_round(3)), (1, 2));
        let mut rounds = [round(1, 2_000), round(2, 900), round(3, 50), round(4, 70)];
        rounds[1].clients = true;
        assert_eq!(
            steady_cpu_per_peer(&rounds, 500),
            Some(Duration::from_micros(120))
        );
        assert_eq!(steady_cpu_per_peer(&rounds[..2], 500), None);
    }

    #[test]
    fn percentiles_of_a_distribution() {
        let ms = Duration::from_millis;
        // Sample k was sent at 1,000 + k ms: the slowest (100 ms) at
        // 1,100, 0.6 s after a round that started at 500.
        let p = Percentiles::of((1..=100).rev().map(|k| (ms(k), 1_000 + k)).collect());
        assert_eq!(p.count, 100);
        assert_eq!(
            (p.p50, p.p90, p.p99, p.max),
            (ms(51), ms(91), ms(100), ms(100))
        );
        assert!((p.max_from(500) - 0.6).abs() < 1e-9, "{}", p.max_from(500));
        let none = Percentiles::of(Vec::new());
        assert_eq!(
            (none.count, none.p99, none.max),
            (0, Duration::ZERO, Duration::ZERO)
        );
    }
}
