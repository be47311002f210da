//! `health-lab`: what runs on this machine's namespaces rather than in a
//! test: the echo benchmark and the demo. Driven by `cargo xtask`.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command-line tool"
)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench_cluster_sim;
mod bench_datapath;
mod bench_echo;
mod bench_election;
mod bench_etcd_load;
mod bench_linear;
mod bench_page;
mod bench_round;
mod bench_soak;
mod bench_summary_format;
mod blaster;
mod chaos;
mod demo;
mod echo_peers;
mod forward;
mod napi;
mod sim_nodes;
mod since_ready;
mod stop;
mod usage;

#[derive(Debug, Parser)]
#[command(
    name = "health-lab",
    about = "Benchmarks and demos on local network namespaces"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Echo replies per second: eBPF responder modes against the kernel stack.
    BenchEcho {
        #[arg(long, default_value_t = 2)]
        seconds: u32,
        #[arg(long, default_value_t = 5)]
        rounds: u32,
        /// Sender threads (default: one per CPU).
        #[arg(long)]
        senders: Option<usize>,
        /// ICMP echo over IPv4, or `ICMPv6` echo against the kernel's IPv6
        /// echo.
        #[arg(long, value_parser = ["ipv4", "ipv6"], default_value = "ipv4")]
        family: String,
        /// Let the requester's stack take the replies in, instead of
        /// dropping them at its tcx ingress once its veth counted them.
        #[arg(long)]
        replies_to_stack: bool,
    },
    /// Per-packet cost of the CT and masquerade programs (`BPF_PROG_TEST_RUN`).
    BenchDatapath {
        #[arg(long, default_value_t = 100_000)]
        samples: u32,
    },
    /// One agent probing N peers behind a router: round time, agent CPU,
    /// RSS, status latency, correctness, and fping as the reference.
    BenchRound {
        #[arg(long, default_value_t = 5000)]
        peers: usize,
        /// Percent of peers that never answer.
        #[arg(long, default_value_t = 50)]
        silent: u32,
        #[arg(long, default_value_t = 3)]
        rounds: u32,
        /// Probe interval of the agent.
        #[arg(long, default_value = "3s", value_parser = health_agent::util::duration::parse)]
        interval: std::time::Duration,
        /// The simulated network's work (the router's forwarding, the
        /// peers' answers) in threads of its own, not charged to the
        /// agent: threaded NAPI on the router's end of the uplink, and the
        /// peers' echoes answered by a thread of the lab.
        #[arg(long)]
        network_thread: bool,
    },
    /// `bench-round` at each of --sizes in passes of alternating order: the
    /// agent's CPU per round per peer at each size, and their spread.
    BenchLinear {
        /// Peer counts, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "500,2000,5000,10000",
              value_parser = clap::value_parser!(usize))]
        sizes: Vec<usize>,
        /// Percent of peers that never answer.
        #[arg(long, default_value_t = 50)]
        silent: u32,
        /// Rounds at each size in each pass (the first is not counted).
        #[arg(long, default_value_t = 8)]
        rounds: u32,
        /// Probe interval of the agent, the same at every size.
        #[arg(long, default_value = "3s", value_parser = health_agent::util::duration::parse)]
        interval: std::time::Duration,
        /// Passes over the sizes (their order alternates).
        #[arg(long, default_value_t = 2)]
        passes: u32,
        /// The largest spread that passes, in percent.
        #[arg(long, default_value_t = 15.0)]
        within: f64,
        /// The simulated network's work (the router's forwarding, the
        /// peers' answers) in threads of its own, not charged to the
        /// agent: threaded NAPI on the router's end of the uplink, and the
        /// peers' echoes answered by a thread of the lab.
        #[arg(long)]
        network_thread: bool,
    },
    /// The connectivity page of an agent with N silent peers, in headless
    /// Chromium: fetch-to-painted time of the page, against 1 s.
    BenchPage {
        #[arg(long, default_value_t = 5000)]
        peers: usize,
        /// Refreshes measured after the first view.
        #[arg(long, default_value_t = 10)]
        refreshes: u32,
        /// Probe interval of the agent (the page polls at this pace).
        #[arg(long, default_value = "3s", value_parser = health_agent::util::duration::parse)]
        interval: std::time::Duration,
    },
    /// Subset probing and the cluster view at N simulated nodes (no
    /// network): the agent's selection, summaries and verdicts, with
    /// injected faults.
    BenchClusterSim {
        #[arg(long, default_value_t = 50_000)]
        nodes: usize,
        /// K: peers probed outside the zone.
        #[arg(long, default_value_t = 32)]
        peers: usize,
        /// Zones (default: one per 20 nodes).
        #[arg(long)]
        zones: Option<usize>,
        #[arg(long, default_value_t = 16)]
        rounds: u32,
        /// Consecutive failed rounds that make a path Failure (the agent's
        /// --failure-threshold).
        #[arg(long, default_value_t = 3)]
        failure_threshold: u32,
    },
    /// A local etcd under N simulated agents (a lease and the agent's
    /// summary put each per interval) and W watchers of the summaries
    /// (one per agent by default): write rate, watch delivery latency
    /// against 1 s at p99, etcd's database size and CPU.
    BenchEtcdLoad {
        #[arg(long, default_value_t = 1000)]
        agents: usize,
        /// Default: two intervals (every agent publishes at least twice).
        #[arg(long)]
        seconds: Option<u32>,
        /// How often each agent puts its summary (default: the agent's
        /// default probe interval).
        #[arg(long, default_value = bench_etcd_load::DEFAULT_INTERVAL, value_parser = health_agent::util::duration::parse)]
        interval: std::time::Duration,
        /// Watchers of the summaries prefix (default: one per agent).
        #[arg(long)]
        watchers: Option<usize>,
        /// Client connections all the traffic (leases, puts, watches) is
        /// spread over.
        #[arg(long, default_value_t = bench_etcd_load::DEFAULT_CONNECTIONS)]
        connections: usize,
    },
    /// One agent probing N peers for a long run: RSS and descriptors every
    /// 10 s, CPU over windows; flat within ±10 % after the warm-up.
    BenchSoak {
        #[arg(long, default_value_t = 1000)]
        peers: usize,
        #[arg(long, default_value_t = 60)]
        minutes: u64,
        #[arg(long, default_value = "3s", value_parser = health_agent::util::duration::parse)]
        interval: std::time::Duration,
    },
    /// Two nodes, a health-agent answering echo in the kernel, live probes.
    Demo(demo::Options),
    /// Faults injected into a local cluster over a 3-member etcd cluster,
    /// invariants checked every second.
    Chaos(chaos::Options),
}

#[allow(clippy::too_many_lines, reason = "one arm per subcommand")]
fn main() -> ExitCode {
    let command = Cli::parse().command;
    // Ctrl-C stops the commands that poll for it and removes what they
    // made (the chaos suite installs its own handler); the others end at
    // once, as by default.
    let polls = matches!(
        command,
        Command::BenchEcho { .. }
            | Command::BenchRound { .. }
            | Command::BenchLinear { .. }
            | Command::BenchPage { .. }
            | Command::BenchSoak { .. }
            | Command::BenchEtcdLoad { .. }
            | Command::BenchDatapath { .. }
            | Command::Demo(_)
    );
    if polls && let Err(e) = stop::install() {
        eprintln!("error: {e:#}");
        return ExitCode::FAILURE;
    }
    let result = match command {
        Command::BenchEcho {
            seconds,
            rounds,
            senders,
            family,
            replies_to_stack,
        } => {
            let opts = bench_echo::Options {
                replies_to_stack,
                ipv6: family == "ipv6",
                seconds: seconds.max(1),
                rounds: rounds.max(1),
                senders: senders
                    .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from)),
            };
            bench_echo::run(&opts, &mut |line| eprintln!("{line}"))
                .map(|r| print!("{}", bench_echo::render(&r, &opts)))
        }
        Command::BenchDatapath { samples } => bench_datapath::run(samples.max(1))
            .map(|r| print!("{}", bench_datapath::render(&r, samples.max(1)))),
        Command::BenchRound {
            peers,
            silent,
            rounds,
            interval,
            network_thread,
        } => bench_round::run(&bench_round::Options {
            peers,
            silent_pct: silent,
            rounds: rounds.max(1),
            interval,
            network_thread,
        })
        .map(|r| print!("{}", r.text())),
        Command::BenchLinear {
            sizes,
            silent,
            rounds,
            interval,
            passes,
            within,
            network_thread,
        } => bench_linear::run(
            &bench_linear::Options {
                sizes,
                each: bench_round::Options {
                    peers: 0,
                    silent_pct: silent,
                    rounds,
                    interval,
                    network_thread,
                },
                passes,
                within_pct: within,
            },
            &mut |line| eprintln!("{line}"),
        )
        .map(|text| print!("{text}")),
        Command::BenchPage {
            peers,
            refreshes,
            interval,
        } => bench_page::run(&bench_page::Options {
            peers,
            refreshes: refreshes.max(1),
            interval,
        })
        .map(|text| print!("{text}")),
        Command::BenchClusterSim {
            nodes,
            peers,
            zones,
            rounds,
            failure_threshold,
        } => bench_cluster_sim::run(&bench_cluster_sim::Options {
            nodes,
            peers,
            zones,
            rounds,
            failure_threshold,
        })
        .map(|text| print!("{text}")),
        Command::BenchEtcdLoad {
            agents,
            seconds,
            interval,
            watchers,
            connections,
        } => bench_etcd_load::run(&bench_etcd_load::Options {
            agents: agents.max(1),
            seconds: seconds.map(|s| s.max(1)),
            interval,
            watchers,
            connections,
        })
        .map(|text| print!("{text}")),
        Command::BenchSoak {
            peers,
            minutes,
            interval,
        } => bench_soak::run(&bench_soak::Options {
            peers,
            minutes,
            interval,
        })
        .map(|text| print!("{text}")),
        Command::Demo(opts) => demo::run(&opts),
        Command::Chaos(opts) => chaos::run(&opts),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("health-lab: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
