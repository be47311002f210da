//! `cargo xtask`: the project's developer tasks.
//!
//! Kept free of the agent's dependencies so that `cargo xtask setup` builds
//! and runs on a machine that does not yet have the eBPF toolchain.
#![allow(clippy::print_stderr, reason = "xtask reports progress on stderr")]
#![allow(
    clippy::doc_markdown,
    reason = "clap turns these doc comments into --help text, shown verbatim"
)]

mod cmd;
mod lint;
mod setup;
mod vm;

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
// Serves the library (the package's copyright file).
use serde_json as _;
use xtask::pin;

#[derive(Debug, Parser)]
#[command(
    name = "cargo xtask",
    about = "Developer tasks for the health workspace"
)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Debug, Subcommand)]
enum Task {
    /// Install what the build needs (apt packages, the pinned nightly with
    /// rust-src, bpf-linker against the pinned LLVM); quick when all is there.
    Setup,
    /// Build the workspace (the eBPF object is built by health-agent/build.rs).
    Build {
        #[arg(long)]
        release: bool,
    },
    /// The Debian package (release build): binary, systemd unit, default
    /// config, completions and man pages.
    Package {
        /// Where the .deb goes.
        #[arg(long, value_name = "DIR")]
        out_dir: Option<PathBuf>,
    },
    /// rustfmt check, `clippy -D warnings` (host side and eBPF side) and
    /// the host crates' docs with their links resolved.
    Lint,
    /// setup, lint, then every test: host unit tests and the root-only
    /// namespace and BPF_PROG_TEST_RUN integration tests. With --kernel
    /// 6.1 or 6.12: a focused selection of the integration tests inside
    /// Debian's own kernel of that series, booted in QEMU (virtme-ng).
    Test {
        /// Skip the lint step.
        #[arg(long)]
        no_lint: bool,
        /// The kernel to test on: `host` (every test, on this machine's
        /// kernel), or `6.1` / `6.12` (Debian bookworm's kernel packages in
        /// a VM, the focused selection).
        #[arg(long, default_value = "host", value_name = "6.1|6.12|host")]
        kernel: String,
        /// Extra arguments for `cargo test` (after `--`); with a VM kernel,
        /// arguments for the test binary instead of the selection (e.g.
        /// `-- attach::`).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Benchmarks; results go to BENCHMARKS.md by hand, with the command.
    Bench {
        #[command(subcommand)]
        which: Bench,
    },
    /// The main job: a local cluster on this machine (namespaces as nodes,
    /// one agent each) with a live status view until Ctrl-C.
    Run {
        /// Number of nodes.
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Node discovery: the shared nodes file, or a local etcd.
        #[arg(long, value_parser = ["file", "etcd"], default_value = "file")]
        kvstore: String,
        /// How endpoints reach peers: routes only, or masquerade (SNAT to
        /// the node IP in BPF on each node's uplink).
        #[arg(long, value_parser = ["routed", "masquerade"], default_value = "routed")]
        routing: String,
        /// Address families of nodes and health endpoints: every peer is
        /// probed over each family the cluster has.
        #[arg(long, value_parser = ["ipv4", "ipv6", "dual"], default_value = "dual")]
        ip_family: String,
        /// Extra arguments for `health-lab demo` (e.g. -- --seconds 20).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Faults injected into a local cluster over a 3-member etcd cluster
    /// (the etcd leader killed, an agent cut off from etcd, an agent
    /// killed 50 times, every member stopped, a node replaced), invariants
    /// checked every second: a row per scenario, then `N passed, M failed`.
    Chaos {
        /// One scenario: leader-killed, agent-cut-off, agent-kill-loop,
        /// etcd-down, uplink-flap, state-read-only, bpffs-unmounted or
        /// node-replaced (default: every one).
        #[arg(long)]
        scenario: Option<String>,
        /// How long an outage lasts.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// Nodes of the cluster.
        #[arg(long, default_value_t = 12)]
        nodes: usize,
        /// Times the kill loop kills the agent.
        #[arg(long, default_value_t = 50)]
        kills: usize,
        /// Times the flapping uplink is deleted and made again, in a
        /// minute.
        #[arg(long, default_value_t = 100)]
        flaps: usize,
    },
}

#[derive(Debug, Subcommand)]
enum Bench {
    /// Echo replies per second: the eBPF responder in each attach mode
    /// against the kernel stack's own echo, on one veth, in one run.
    Echo {
        /// Seconds per measurement.
        #[arg(long, default_value_t = 2)]
        seconds: u32,
        /// Interleaved rounds; the median is reported.
        #[arg(long, default_value_t = 5)]
        rounds: u32,
        /// ICMP over IPv4, or ICMPv6 against the kernel's IPv6 echo.
        #[arg(long, value_parser = ["ipv4", "ipv6"], default_value = "ipv4")]
        family: String,
        /// Let the requester's stack take the replies in, instead of
        /// dropping them at its tcx ingress once its veth counted them.
        #[arg(long)]
        replies_to_stack: bool,
    },
    /// One agent probing N peers behind a router (half silent by default):
    /// round wall time, agent CPU and RSS, status latency under 8 clients,
    /// correctness, and fping over the same targets in the same run.
    Round {
        #[arg(long, default_value_t = 5000)]
        peers: usize,
        /// Percent of peers that never answer.
        #[arg(long, default_value_t = 50)]
        silent: u32,
        #[arg(long, default_value_t = 3)]
        rounds: u32,
        /// Probe interval of the agent (the time between round starts).
        #[arg(long, default_value = "3s")]
        interval: String,
        /// The simulated network's work (the router's forwarding, the
        /// peers' answers, the node's receives) in threads of its own,
        /// reported apart: not charged to the agent.
        #[arg(long)]
        network_thread: bool,
    },
    /// Linear cost: `round` at each of --sizes, in passes of alternating
    /// order, then the agent's CPU per round per peer at each size and
    /// their spread against 15 %.
    Linear {
        /// Peer counts, comma-separated.
        #[arg(long, default_value = "500,2000,5000,10000")]
        sizes: String,
        #[arg(long, default_value_t = 50)]
        silent: u32,
        /// Rounds at each size in each pass (the first is not counted).
        #[arg(long, default_value_t = 8)]
        rounds: u32,
        /// Probe interval of the agent, the same at every size.
        #[arg(long, default_value = "3s")]
        interval: String,
        #[arg(long, default_value_t = 2)]
        passes: u32,
        /// The simulated network's work (the router's forwarding, the
        /// peers' answers, the node's receives) in threads of its own,
        /// reported apart: not charged to the agent.
        #[arg(long)]
        network_thread: bool,
    },
    /// The connectivity page of an agent with N silent peers (all failing),
    /// in headless Chromium: fetch-to-painted time against 1 s.
    Page {
        #[arg(long, default_value_t = 5000)]
        peers: usize,
        /// Refreshes measured after the first view.
        #[arg(long, default_value_t = 10)]
        refreshes: u32,
    },
    /// Subset probing and the cluster view at N simulated nodes, in one
    /// process with the agent's own selection, summary and verdict code,
    /// with injected faults (needs no root).
    ClusterSim {
        #[arg(long, default_value_t = 50_000)]
        nodes: usize,
        /// K: peers each node probes outside its zone.
        #[arg(long, default_value_t = 32)]
        peers: usize,
        /// Zones (default: one per 20 nodes).
        #[arg(long)]
        zones: Option<usize>,
        #[arg(long, default_value_t = 16)]
        rounds: u32,
        /// Consecutive failed rounds that make a path Failure.
        #[arg(long, default_value_t = 3)]
        failure_threshold: u32,
    },
    /// A local etcd (loopback, temporary data) under N simulated agents,
    /// each with its lease and its summary (the agent's encoding) put once
    /// per probe interval, and one watcher of the summaries per agent:
    /// write rate, watch delivery latency p50/p99 against 1 s, etcd's
    /// database size and CPU.
    EtcdLoad {
        #[arg(long, default_value_t = 1000)]
        agents: usize,
        /// Default: two intervals (every agent publishes at least twice).
        #[arg(long)]
        seconds: Option<u32>,
        /// Time between an agent's puts (default: the agent's default
        /// probe interval, 60s).
        #[arg(long)]
        interval: Option<String>,
        /// Watchers of the summaries (default: one per agent).
        #[arg(long)]
        watchers: Option<usize>,
    },
    /// Per-packet cost of the CT/RTT and masquerade programs, measured by
    /// the kernel with `BPF_PROG_TEST_RUN`.
    Datapath {
        /// Runs per case; the mean is reported.
        #[arg(long, default_value_t = 100_000)]
        samples: u32,
    },
    /// One agent probing N peers (the `round` topology, half silent) for a
    /// long run: RSS and descriptors sampled every 10 s, CPU over 10-minute
    /// windows; flat within ±10 % after the first 5 minutes.
    Soak {
        #[arg(long, default_value_t = 1000)]
        peers: usize,
        #[arg(long, default_value_t = 60)]
        minutes: u64,
        /// Probe interval of the agent.
        #[arg(long, default_value = "3s")]
        interval: String,
    },
}

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace")
        .to_owned()
}

/// `cargo xtask package`: a release build, then the .deb.
fn package(root: &Path, pin: &pin::EbpfPin, out_dir: Option<PathBuf>) -> anyhow::Result<()> {
    setup::run(pin)?;
    cmd::cargo(root, &["build", "--release", "-p", "health-agent"])?;
    let out_dir = out_dir.unwrap_or_else(|| root.join("target/debian"));
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let binary = target_dir(root).join("release/health-agent");
    let debs = xtask::package::build_deb(&binary, root, &out_dir)
        .context("building the Debian package")?;
    eprintln!("xtask: {}", debs.package.display());
    eprintln!("xtask: {}", debs.dbgsym.display());
    Ok(())
}

/// `cargo xtask bench etcd-load`: no root needed (loopback only).
fn bench_etcd_load(root: &Path, pin: &pin::EbpfPin, which: &Bench) -> anyhow::Result<()> {
    let Bench::EtcdLoad {
        agents,
        seconds,
        interval,
        watchers,
    } = which
    else {
        anyhow::bail!("not the etcd-load bench");
    };
    setup::run(pin)?;
    let mut args = vec![
        "bench-etcd-load".to_owned(),
        "--agents".into(),
        agents.to_string(),
    ];
    let optional = [
        ("--seconds", seconds.map(|s| s.to_string())),
        ("--interval", interval.clone()),
        ("--watchers", watchers.map(|w| w.to_string())),
    ];
    for (flag, value) in optional {
        if let Some(v) = value {
            args.extend([flag.to_owned(), v]);
        }
    }
    lab(root, &args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// `cargo xtask bench cluster-sim`: a simulation in one process, no root.
fn bench_cluster_sim(root: &Path, pin: &pin::EbpfPin, which: &Bench) -> anyhow::Result<()> {
    let Bench::ClusterSim {
        nodes,
        peers,
        zones,
        rounds,
        failure_threshold,
    } = which
    else {
        anyhow::bail!("not the cluster-sim benchmark");
    };
    setup::run(pin)?;
    let mut args = vec!["bench-cluster-sim".to_owned()];
    for (flag, value) in [
        ("--nodes", Some(nodes.to_string())),
        ("--peers", Some(peers.to_string())),
        ("--zones", zones.map(|z| z.to_string())),
        ("--rounds", Some(rounds.to_string())),
        ("--failure-threshold", Some(failure_threshold.to_string())),
    ] {
        if let Some(value) = value {
            args.extend([flag.to_owned(), value]);
        }
    }
    lab(root, &args.iter().map(String::as_str).collect::<Vec<_>>())
}

#[allow(
    clippy::too_many_lines,
    reason = "one arm per task, each a call or a few lines"
)]
fn run() -> anyhow::Result<()> {
    let root = workspace_root();
    let pin = pin::EbpfPin::read(&root).context("reading the eBPF toolchain pin")?;
    match Cli::parse().task {
        Task::Setup => setup::run(&pin),
        Task::Build { release } => {
            setup::run(&pin)?;
            let mut args = vec!["build", "--workspace"];
            if release {
                args.push("--release");
            }
            cmd::cargo(&root, &args)
        }
        Task::Package { out_dir } => package(&root, &pin, out_dir),
        Task::Lint => {
            setup::run(&pin)?;
            lint::run(&root, &pin)
        }
        Task::Test {
            no_lint,
            kernel,
            args,
        } if kernel != "host" => test_in_vm(&root, &pin, &kernel, no_lint, &args),
        Task::Test { no_lint, args, .. } => test_on_host(&root, &pin, no_lint, &args),
        Task::Bench {
            which:
                Bench::Echo {
                    seconds,
                    rounds,
                    family,
                    replies_to_stack,
                },
        } => {
            let (s, r) = (seconds.to_string(), rounds.to_string());
            let mut args = vec!["--seconds", &s, "--rounds", &r, "--family", &family];
            if replies_to_stack {
                args.push("--replies-to-stack");
            }
            lab_in_namespaces(&root, &pin, "bench-echo", &args)
        }
        Task::Bench {
            which:
                Bench::Round {
                    peers,
                    silent,
                    rounds,
                    interval,
                    network_thread,
                },
        } => {
            let (p, s, r) = (peers.to_string(), silent.to_string(), rounds.to_string());
            let mut args = vec![
                "--peers",
                &p,
                "--silent",
                &s,
                "--rounds",
                &r,
                "--interval",
                &interval,
            ];
            if network_thread {
                args.push("--network-thread");
            }
            lab_in_namespaces(&root, &pin, "bench-round", &args)
        }
        Task::Bench {
            which:
                Bench::Linear {
                    sizes,
                    silent,
                    rounds,
                    interval,
                    passes,
                    network_thread,
                },
        } => {
            let (s, r, p) = (silent.to_string(), rounds.to_string(), passes.to_string());
            let mut args = vec![
                "--sizes",
                &sizes,
                "--silent",
                &s,
                "--rounds",
                &r,
                "--interval",
                &interval,
                "--passes",
                &p,
            ];
            if network_thread {
                args.push("--network-thread");
            }
            lab_in_namespaces(&root, &pin, "bench-linear", &args)
        }
        Task::Bench {
            which: Bench::Page { peers, refreshes },
        } => {
            let (p, r) = (peers.to_string(), refreshes.to_string());
            lab_in_namespaces(
                &root,
                &pin,
                "bench-page",
                &["--peers", &p, "--refreshes", &r],
            )
        }
        Task::Bench {
            which: which @ Bench::EtcdLoad { .. },
        } => bench_etcd_load(&root, &pin, &which),
        Task::Bench {
            which: Bench::Datapath { samples },
        } => {
            setup::run(&pin)?;
            cmd::require_root("the benchmark loads BPF programs")?;
            lab(
                &root,
                &["bench-datapath", "--samples", &samples.to_string()],
            )
        }
        Task::Bench {
            which: which @ Bench::ClusterSim { .. },
        } => bench_cluster_sim(&root, &pin, &which),
        Task::Bench {
            which:
                Bench::Soak {
                    peers,
                    minutes,
                    interval,
                },
        } => {
            let (p, m) = (peers.to_string(), minutes.to_string());
            let args = ["--peers", &p, "--minutes", &m, "--interval", &interval];
            lab_in_namespaces(&root, &pin, "bench-soak", &args)
        }
        Task::Run {
            nodes,
            kvstore,
            routing,
            ip_family,
            args,
        } => {
            // Only what the build needs (and etcd, with openssl for its
            // certificates, when the cluster uses it): not the tests'
            // browser, Prometheus and the rest.
            let etcd: &[&str] = if kvstore == "etcd" {
                &["etcd-server", "openssl"]
            } else {
                &[]
            };
            setup::for_build(&pin, etcd)?;
            cmd::require_root("the cluster creates namespaces and loads BPF programs")?;
            let n = nodes.to_string();
            let mut lab_args = vec![
                "demo",
                "--nodes",
                &n,
                "--kvstore",
                &kvstore,
                "--routing",
                &routing,
                "--ip-family",
                &ip_family,
            ];
            lab_args.extend(args.iter().map(String::as_str));
            lab_with_profile(&root, "demo", &lab_args)
        }
        Task::Chaos {
            scenario,
            seconds,
            nodes,
            kills,
            flaps,
        } => {
            setup::for_build(&pin, &["etcd-server", "nftables"])?;
            cmd::require_root("the chaos cluster creates namespaces and loads BPF programs")?;
            let (s, n, k) = (seconds.to_string(), nodes.to_string(), kills.to_string());
            let f = flaps.to_string();
            let mut args = vec![
                "chaos",
                "--seconds",
                &s,
                "--nodes",
                &n,
                "--kills",
                &k,
                "--flaps",
                &f,
            ];
            if let Some(name) = &scenario {
                args.extend(["--scenario", name.as_str()]);
            }
            lab_with_profile(&root, "demo", &args)
        }
    }
}

/// `cargo xtask test`: everything, on this machine's kernel.
fn test_on_host(
    root: &Path,
    pin: &pin::EbpfPin,
    no_lint: bool,
    args: &[String],
) -> anyhow::Result<()> {
    setup::run(pin)?;
    if !no_lint {
        lint::run(root, pin)?;
    }
    cmd::require_root("the integration tests create namespaces and load BPF programs")?;
    // The integration tests run the real binaries (the agent as each
    // node's daemon): `cargo test` alone does not build another
    // package's binaries.
    cmd::cargo(root, &["build", "--workspace", "--bins"])?;
    let mut test = vec!["test", "--workspace", "--all-targets", "--no-fail-fast"];
    if !args.is_empty() {
        test.push("--");
        test.extend(args.iter().map(String::as_str));
    }
    cmd::cargo(root, &test)
}

/// `cargo xtask test --kernel 6.1|6.12`: the focused selection in a VM.
fn test_in_vm(
    root: &Path,
    pin: &pin::EbpfPin,
    kernel: &str,
    no_lint: bool,
    args: &[String],
) -> anyhow::Result<()> {
    let k = vm::kernel(kernel)?;
    setup::run(pin)?;
    vm::ensure_tools(&mut setup::Apt::default())?;
    if !no_lint {
        lint::run(root, pin)?;
    }
    cmd::require_root("the guest's tests create namespaces and load BPF programs")?;
    let binary = vm::build_tests(root)?;
    vm::run(root, &k, &binary, args)
}

/// Builds `health-agent` and `health-lab` (release, side by side: the lab
/// starts the agent binary) and runs the lab.
/// A benchmark of `health-lab` that creates namespaces and loads BPF
/// programs: the toolchain set up, root checked, then `command args`.
fn lab_in_namespaces(
    root: &Path,
    pin: &pin::EbpfPin,
    command: &str,
    args: &[&str],
) -> anyhow::Result<()> {
    setup::run(pin)?;
    cmd::require_root("the benchmark creates namespaces and loads BPF programs")?;
    let mut all = vec![command];
    all.extend_from_slice(args);
    lab(root, &all)
}

fn lab(root: &Path, args: &[&str]) -> anyhow::Result<()> {
    lab_with_profile(root, "release", args)
}

/// `lab` built with `profile`: `release` (fat LTO, as packaged) for the
/// benchmarks, `demo` (quick to build) for `cargo xtask run`.
fn lab_with_profile(root: &Path, profile: &str, args: &[&str]) -> anyhow::Result<()> {
    cmd::cargo(
        root,
        &[
            "build",
            "--profile",
            profile,
            "--quiet",
            "-p",
            "health-agent",
            "-p",
            "health-lab",
            "--bins",
        ],
    )?;
    cmd::run_forwarding_signals(
        std::process::Command::new(target_dir(root).join(profile).join("health-lab")).args(args),
    )
}

/// Where cargo puts what it builds: `CARGO_TARGET_DIR` (relative to the
/// workspace, as cargo run there reads it), or `target`.
fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), |dir| root.join(dir))
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
