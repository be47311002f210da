//! Command-line interface of `health-agent`.
#![allow(
    clippy::doc_markdown,
    reason = "clap turns these doc comments into --help text, shown verbatim"
)]

mod bpf;
mod daemon;
mod echo;
mod endpoint;
pub(crate) mod status;

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use health_agent::{
    datapath::DEFAULT_PIN_DIR,
    sys::netns::{Netns, NetnsError},
};

#[derive(Debug, Parser)]
#[command(
    name = "health-agent",
    version,
    about = "eBPF-accelerated node and endpoint health datapath"
)]
pub(crate) struct Cli {
    /// Log filter (`info`, `debug`, `health_agent=trace`, ...); RUST_LOG overrides.
    #[arg(long, global = true, default_value = "info", env = "HEALTH_AGENT_LOG")]
    pub log_level: String,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the agent: create and keep the health endpoint, serve the API.
    Daemon(Box<daemon::DaemonArgs>),
    /// The datapath's BPF maps (CT, RTT, counters), read from the pins.
    #[command(subcommand)]
    Bpf(bpf::BpfCommand),
    /// Cluster health as this node's agent sees it.
    Status(status::StatusArgs),
    /// Inspect the health endpoint through the agent's API.
    #[command(subcommand)]
    Endpoint(endpoint::EndpointCommand),
    /// The kernel ICMP echo responder.
    #[command(subcommand)]
    Responder(echo::ResponderCommand),
}

/// Output format of the read commands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub(crate) enum OutputFormat {
    #[default]
    Table,
    Json,
}

/// Options shared by every command that touches the pinned maps.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct PinArgs {
    /// bpffs directory holding the pinned maps.
    #[arg(long = "bpffs-dir", default_value = DEFAULT_PIN_DIR, env = "HEALTH_AGENT_BPFFS_DIR")]
    pub dir: PathBuf,
}

/// The API socket, for the daemon and every client command.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct SocketArgs {
    /// Unix socket of the agent's API.
    #[arg(long = "socket", default_value = health_agent::api::DEFAULT_SOCKET, env = health_agent::api::SOCKET_ENV)]
    pub path: PathBuf,
}

/// Parses `--netns`: a name under /run/netns, or a path to an nsfs file.
pub(crate) fn parse_netns(s: &str) -> Result<Netns, NetnsError> {
    if s.contains('/') {
        Ok(Netns::at(s))
    } else {
        Netns::named(s)
    }
}

impl Cli {
    /// Whether this runs the long-lived agent.
    pub(crate) const fn is_daemon(&self) -> bool {
        matches!(self.command, Command::Daemon(_))
    }

    pub(crate) async fn run(self) -> anyhow::Result<()> {
        match self.command {
            Command::Responder(cmd) => cmd.run().await,
            Command::Daemon(args) => args.run().await,
            Command::Endpoint(cmd) => cmd.run().await,
            Command::Status(args) => args.run().await,
            Command::Bpf(cmd) => cmd.run(),
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::*;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn bad_arguments_are_rejected_naming_the_argument() {
        let cases: [(&[&str], &str); 4] = [
            (
                &[
                    "responder",
                    "run",
                    "--iface",
                    "eth0",
                    "--address",
                    "198.18.0.300",
                ],
                "--address",
            ),
            (
                &[
                    "responder",
                    "run",
                    "--iface",
                    "eth0",
                    "--address",
                    "198.18.0.2",
                    "--mode",
                    "fast",
                ],
                "--mode",
            ),
            (&["responder", "run", "--address", "198.18.0.2"], "--iface"),
            (
                &[
                    "responder",
                    "run",
                    "--iface",
                    "e",
                    "--address",
                    "198.18.0.2",
                    "--netns",
                    "a b",
                ],
                "--netns",
            ),
        ];
        for (args, needle) in cases {
            let err =
                Cli::try_parse_from(std::iter::once("health-agent").chain(args.iter().copied()))
                    .expect_err(&format!("{args:?} must be rejected"))
                    .to_string();
            assert!(err.contains(needle), "{args:?}: {err}");
        }
    }

    #[test]
    fn netns_accepts_names_and_paths() {
        assert_eq!(
            parse_netns("health").expect("name").path(),
            std::path::Path::new("/run/netns/health")
        );
        assert_eq!(
            parse_netns("/proc/1/ns/net").expect("path").path(),
            std::path::Path::new("/proc/1/ns/net")
        );
        assert!(parse_netns("no such").is_err());
    }
}
