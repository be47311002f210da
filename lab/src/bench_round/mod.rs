//! `bench-round`: one agent probing N peers in a routed L3 topology.
//!
//! ```text
//! agent node (198.18.0.2) --uplink-- router (198.18.0.1 | 198.18.1.1) --peers-- peers
//! ```
//!
//! The peers namespace holds the node IPs (198.18.128.0/17) and health IPs
//! (198.19.0.0/17) of the answering peers, by local routes, and answers
//! ICMP (its kernel; with `--network-thread` a thread of the lab,
//! [`crate::echo_peers`]) and HTTP :4240 (one `hello` listener). A silent
//! peer's addresses are held by nobody: the router forwards to the peers namespace, which does not
//! forward and drops them without a word, as a host that is down.
//!
//! Reported ([`mod@render`]): first and steady rounds' wall time (the first
//! also from the endpoint's readiness), the agent's CPU and RSS a round
//! ([`usage`]), `GET /v1/status` latency under 8 concurrent clients through
//! the second round, or the first in runs of fewer than 3 ([`clients`]), correctness: every answering path OK,
//! no silent path OK ([`verdict`]), and `fping -i0` over the same ICMP
//! targets in the same run ([`mod@fping`]). The namespaces, the peers' server
//! and the agent are made in [`topology`].

mod clients;
mod fping;
mod peers;
mod render;
mod topology;
mod verdict;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use health_agent::{
    api::client::{Client, ClientError},
    probe::status::ClusterStatus,
};

use self::{
    clients::{Percentiles, joined, status_clients},
    fping::fping,
    peers::{MAX_PEERS, live_paths, peer_name},
    render::render,
    topology::ROUTER_UPLINK,
    verdict::{correctness, print_live_failures},
};
pub(crate) use self::{
    peers::PROBES_A_PEER,
    topology::{Lab, serve_peers},
};
use crate::{
    echo_peers::EchoPeers,
    since_ready::SinceReady,
    usage::{Rss, cpu_times, usage},
};

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
    /// Packets on that uplink, both directions.
    packets: u64,
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
    let served = served_after(&rt, &client, started, &mut lab)?;
    // Read once it serves: the agent raises its limit at start.
    let open_files = crate::usage::open_file_limit(pid)?;
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
    let mut before = (usage(pid)?.0, cpu_times(pid)?.0, lab.uplink()?);
    let mut network_before = network_cpu();
    let lab_cpu = || cpu_times(std::process::id()).map(|(u, s)| u + s);
    let mut lab_before = lab_cpu()?;
    let deadline = Instant::now() + Duration::from_secs(60) + opts.interval * (opts.rounds + 1);
    let mut first: Option<ClusterStatus> = None;
    let mut since_ready = None;
    while rounds.len() < opts.rounds as usize {
        if lab.agent_ended().is_some() {
            bail!(
                "the agent ended after {} of {} rounds: {}",
                rounds.len(),
                opts.rounds,
                lab.agent_report()
            );
        }
        if Instant::now() > deadline {
            bail!(
                "{} rounds did not finish in time; {}",
                opts.rounds,
                lab.agent_report()
            );
        }
        crate::stop::check()?;
        let summary =
            match rt.block_on(client.status_summary_after(last_seq, wait_for(opts.interval))) {
                Ok(summary) => summary,
                // Not serving yet.
                Err(ClientError::Unreachable { .. } | ClientError::Http { .. }) => {
                    crate::stop::sleep(Duration::from_millis(25))?;
                    continue;
                }
                Err(e) => bail!("asking the agent for its rounds: {e}"),
            };
        if let Some(r) = summary.round
            && r.seq != last_seq
        {
            let ((cpu, rss), (user, _)) = (usage(pid)?, cpu_times(pid)?);
            let (bytes, packets) = lab.uplink()?;
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
            // Rounds ended since the last one seen: more than one when the
            // bench was slow to ask, and then each is booked its share.
            let spans: u32 = if last_seq == 0 {
                1
            } else {
                u32::try_from(r.seq.saturating_sub(last_seq).max(1)).unwrap_or(u32::MAX)
            };
            if spans > 1 {
                println!(
                    "  rounds {}..={} ended between two looks: each booked 1/{spans} of their CPU and bytes",
                    last_seq + 1,
                    r.seq
                );
            }
            rounds.push(Round {
                seq: r.seq,
                started_ms: r.started_ms,
                wall_ms: r.duration_ms,
                cpu: cpu.saturating_sub(before.0) / spans,
                user: user.saturating_sub(before.1) / spans,
                rss,
                bytes: bytes.saturating_sub(before.2.0) / u64::from(spans),
                packets: packets.saturating_sub(before.2.1) / u64::from(spans),
                network: network.saturating_sub(network_before) / spans,
                lab: lab_now.saturating_sub(lab_before) / spans,
                clients,
            });
            if rounds.len() + 1 == clients_at {
                latencies = start_clients();
            }
            before = (cpu, user, (bytes, packets));
            network_before = network;
            lab_before = lab_now;
            last_seq = r.seq;
        }
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
        open_files,
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
    lab: &mut Lab,
) -> anyhow::Result<Duration> {
    loop {
        if rt.block_on(client.healthz()).is_ok() {
            return Ok(started.elapsed());
        }
        // An interrupt reaches the agent too: said as such, not as its end.
        crate::stop::check()?;
        if lab.agent_ended().is_some() {
            bail!(
                "the agent ended before its socket served: {}",
                lab.agent_report()
            );
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!(
                "the agent's socket did not serve within 60 s; {}",
                lab.agent_report()
            );
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// What a run measured.
struct Measured {
    served: Duration,
    /// The agent's open-file limit once it served (`None`: unlimited).
    open_files: Option<u64>,
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

/// How long one request waits for the next round: the agent answers as
/// a round ends (one request a round, where asking every fifth of the
/// interval took five, and at 500 peers and 3 s a twentieth of the
/// interval had cost 7 % of the agent's CPU), and at least every 5 s, so
/// that a stop, an agent that ended or the deadline are seen.
fn wait_for(interval: Duration) -> Duration {
    (interval + Duration::from_secs(1)).min(Duration::from_secs(5))
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
            packets: 0,
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
}
