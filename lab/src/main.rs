//! `health-lab`: what runs on this machine's namespaces rather than in a
//! test: the echo benchmark and the demo. Driven by `cargo xtask`.
#![allow(
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "a command-line tool"
)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod bench_datapath;
mod bench_echo;
mod bench_round;
mod blaster;
mod demo;

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
        #[arg(long, default_value_t = 3)]
        rounds: u32,
        /// Sender threads (default: one per CPU).
        #[arg(long)]
        senders: Option<usize>,
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
    },
    /// Two nodes, a health-agent answering echo in the kernel, live probes.
    Demo(demo::Options),
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::BenchEcho {
            seconds,
            rounds,
            senders,
        } => {
            let opts = bench_echo::Options {
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
        } => bench_round::run(&bench_round::Options {
            peers,
            silent_pct: silent,
            rounds: rounds.max(1),
            interval,
        })
        .map(|r| print!("{}", r.text())),
        Command::Demo(opts) => demo::run(&opts),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("health-lab: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
