//! Command-line interface of `health-agent`.
#![allow(
    clippy::doc_markdown,
    reason = "clap turns these doc comments into --help text, shown verbatim"
)]

mod bpf;
mod cluster_view;
pub(crate) mod config;
mod daemon;
mod echo;
mod endpoint;
mod nodes;
pub(crate) mod out;
mod quality;
pub(crate) mod status;

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{CommandFactory as _, Parser, Subcommand, ValueEnum};

pub(crate) use health_agent::config::{PinArgs, SocketArgs};
use health_agent::sys::netns::{Netns, NetnsError};

#[derive(Debug, Parser)]
#[command(
    name = "health-agent",
    version,
    about = "eBPF-accelerated node and endpoint health datapath"
)]
pub(crate) struct Cli {
    /// Log filter (`info`, `debug`, `health_agent=trace`, ...); RUST_LOG overrides.
    #[arg(long, global = true, default_value = "info", env = "HEALTH_AGENT_LOG",
          value_parser = crate::logging::parse_filter)]
    pub log_level: String,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the agent: create and keep the health endpoint, serve the API.
    #[command(mut_args = daemon::values_may_start_with_a_hyphen)]
    Daemon(Box<daemon::DaemonArgs>),
    /// The datapath's BPF maps (CT, RTT, counters), read from the pins.
    #[command(subcommand)]
    Bpf(bpf::BpfCommand),
    /// Cluster health as this node's agent sees it.
    Status(status::StatusArgs),
    /// Inspect the health endpoint through the agent's API.
    #[command(subcommand)]
    Endpoint(endpoint::EndpointCommand),
    /// The node set this agent probes, and what it refused or does not
    /// count (records, routes, health allocations; the first 100 of each),
    /// with why.
    Nodes(nodes::NodesArgs),
    /// The kernel ICMP echo responder.
    #[command(subcommand)]
    Responder(echo::ResponderCommand),
    /// The daemon's configuration file.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Print a shell completion script (e.g. `health-agent completions bash
    /// > /usr/share/bash-completion/completions/health-agent`).
    Completions {
        #[arg(value_enum)]
        shell: Shell,
    },
    /// Write the man pages (health-agent.1 and one per subcommand) into a
    /// directory.
    #[command(hide = true)]
    Man {
        #[arg(long, value_name = "DIR")]
        out_dir: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum ConfigCommand {
    /// Print a complete configuration file: every key, commented, at its
    /// default.
    PrintDefaults,
    /// Check a configuration file (keys, values, and the daemon's command
    /// line it makes) without starting anything.
    Check {
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
}

/// Shells completion scripts are made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// Output format of the read commands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub(crate) enum OutputFormat {
    #[default]
    Table,
    Json,
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

    /// Runs the command; `invocation`: how the daemon was started with a
    /// config file, to read it again on SIGHUP.
    pub(crate) async fn run(self, invocation: Option<config::Invocation>) -> anyhow::Result<()> {
        match self.command {
            Command::Responder(cmd) => cmd.run().await,
            Command::Daemon(args) => args.run(invocation).await,
            Command::Endpoint(cmd) => cmd.run().await,
            Command::Nodes(args) => args.run().await,
            Command::Status(args) => args.run().await,
            Command::Bpf(cmd) => cmd.run(),
            Command::Config(cmd) => cmd.run(),
            Command::Completions { shell } => {
                let mut script = Vec::new();
                completions(shell, &mut script);
                out::print(&String::from_utf8_lossy(&script))?;
                Ok(())
            }
            Command::Man { out_dir } => {
                std::fs::create_dir_all(&out_dir)
                    .with_context(|| format!("creating {}", out_dir.display()))?;
                clap_mangen::generate_to(Self::command(), &out_dir)
                    .with_context(|| format!("writing the man pages into {}", out_dir.display()))
            }
        }
    }
}

/// Writes `shell`'s completion script for the whole CLI.
fn completions(shell: Shell, out: &mut dyn std::io::Write) {
    let shell = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    clap_complete::generate(shell, &mut Cli::command(), "health-agent", out);
}

impl ConfigCommand {
    fn run(self) -> anyhow::Result<()> {
        match self {
            Self::PrintDefaults => out::print(&config::defaults())?,
            Self::Check { file } => {
                let checked = config::check(&file)?;
                let mut line = format!("{}: {} settings, valid", file.display(), checked.settings);
                if let Some(flags) = checked.command_line_must_give {
                    line.push_str("; the daemon's command line must give ");
                    line.push_str(&flags);
                }
                out::print_line(&line)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
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
    fn status_flags_that_would_be_ignored_or_refused_by_the_agent_are_refused() {
        let cases: [(&[&str], &str); 10] = [
            (&["--history", ""], "--history"),
            // A negative value is judged by its flag's parser, not taken
            // for a flag.
            (
                &["--probe", "--probe-timeout", "-5s"],
                "invalid value '-5s' for '--probe-timeout",
            ),
            (
                &["--watch", "--rounds", "-1"],
                "invalid value '-1' for '--rounds",
            ),
            (&["--quality", ""], "--quality"),
            (
                &["--probe", "--probe-timeout", "3m"],
                "at most 120s, the agent's limit",
            ),
            (&["--probe", "--probe-timeout", "soon"], "--probe-timeout"),
            // Without --probe there is no round for it to bound.
            (&["--probe-timeout", "5s"], "--probe"),
            (&["-v", "--history", "node-1"], "--verbose"),
            (&["-v", "--cluster"], "--verbose"),
            (&["--all", "--quality", "node-1"], "--all"),
        ];
        for (args, needle) in cases {
            let err = Cli::try_parse_from(
                ["health-agent", "status"]
                    .into_iter()
                    .chain(args.iter().copied()),
            )
            .expect_err(&format!("{args:?} must be refused"))
            .to_string();
            assert!(err.contains(needle), "{args:?}: {err}");
        }
        for ok in [
            &["--probe", "--probe-timeout", "120s"][..],
            &["-v", "-o", "json"][..],
            &["--all", "--cluster"][..],
        ] {
            Cli::try_parse_from(
                ["health-agent", "status"]
                    .into_iter()
                    .chain(ok.iter().copied()),
            )
            .unwrap_or_else(|e| panic!("{ok:?}: {e}"));
        }
    }

    #[test]
    fn bad_observability_and_subset_flags_are_refused_naming_the_flag() {
        let daemon = ["health-agent", "daemon", "--health-cidr", "198.18.64.0/24"];
        for (flag, bad, says) in [
            (
                "--probe-peers",
                "0",
                "expected \"all\" or a positive number",
            ),
            ("--probe-peers", "some", "invalid probe peers \"some\""),
            ("--prometheus-serve-addr", "nope", "is not an ADDR:PORT"),
            (
                "--prometheus-serve-addr",
                "198.18.0.1",
                "is not an ADDR:PORT",
            ),
            ("--zone", "a b", "only letters, digits"),
            ("--zone", "", "not empty"),
            ("--history-length", "0", "--history-length"),
            // A negative value is judged by its flag's parser, as in a
            // config file, not taken for a flag.
            ("--probe-interval", "-5s", "invalid value '-5s'"),
            ("--probe-peers", "-3", "invalid probe peers \"-3\""),
            ("--max-in-flight", "-1", "invalid value '-1'"),
            // A path's value forgotten: the next flag is not taken for it.
            (
                "--state-dir",
                "--keep-endpoint",
                "a value is required for '--state-dir",
            ),
        ] {
            let err = Cli::try_parse_from(daemon.iter().copied().chain([flag, bad]))
                .expect_err(&format!("{flag} {bad:?} must be refused"))
                .to_string();
            assert!(
                err.contains(flag) && err.contains(says),
                "{flag} {bad:?}: {err}"
            );
        }
        for (flag, good) in [
            ("--probe-peers", "all"),
            ("--probe-peers", "32"),
            ("--prometheus-serve-addr", "off"),
            ("--prometheus-serve-addr", "198.18.0.1:9962"),
            ("--zone", "rack-1.a_b"),
        ] {
            Cli::try_parse_from(daemon.iter().copied().chain([flag, good]))
                .unwrap_or_else(|e| panic!("{flag} {good}: {e}"));
        }
    }

    #[test]
    fn completions_cover_every_subcommand_and_daemon_flag() {
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let mut out = Vec::new();
            completions(shell, &mut out);
            let script = String::from_utf8(out).expect("utf-8");
            for word in [
                "daemon",
                "status",
                "print-defaults",
                "probe-interval",
                "socket-group",
            ] {
                assert!(script.contains(word), "{shell:?}: {word} missing");
            }
        }
    }

    #[test]
    fn man_pages_are_made_for_the_cli_and_its_subcommands() {
        let dir = std::env::temp_dir().join(format!("health-agent-man-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        clap_mangen::generate_to(Cli::command(), &dir).expect("man pages");
        let main = std::fs::read_to_string(dir.join("health-agent.1")).expect("health-agent.1");
        let daemon = std::fs::read_to_string(dir.join("health-agent-daemon.1"))
            .expect("health-agent-daemon.1");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            main.starts_with(".ie") || main.contains(".TH health-agent 1"),
            "{main}"
        );
        assert!(main.contains("completions"), "{main}");
        assert!(daemon.contains("probe\\-interval"), "{daemon}");
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
