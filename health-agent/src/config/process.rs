//! The agent as a process: its API socket, pidfile, pins directory and
//! how long it may take to stop.
#![allow(
    clippy::doc_markdown,
    reason = "clap turns these doc comments into --help text, shown verbatim"
)]

use std::{path::PathBuf, time::Duration};

use clap::Args;

use crate::supervisor::Policy;
use crate::util::section::section;

section! {
    /// bpffs directory of the pinned maps (every command that reads them
    /// takes it too).
    #[derive(Debug, Clone, PartialEq, Eq, Args)]
    pub struct PinArgs {
        /// bpffs directory holding the pinned maps.
        #[arg(long = "bpffs-dir", default_value = crate::datapath::DEFAULT_PIN_DIR, env = "HEALTH_AGENT_BPFFS_DIR")]
        pub dir: PathBuf,
    }
}

section! {
    /// The API socket, for the daemon and every client command.
    #[derive(Debug, Clone, PartialEq, Eq, Args)]
    pub struct SocketArgs {
        /// Unix socket of the agent's API.
        #[arg(long = "socket", default_value = crate::api::DEFAULT_SOCKET, env = crate::api::SOCKET_ENV)]
        pub path: PathBuf,
    }
}

section! {
    /// The process: its pidfile, who may use its socket, how it stops.
    #[derive(Debug, Clone, PartialEq, Eq, Args)]
    pub struct ProcessSettings {
        /// The file holding the agent's process ID while it runs: a second
        /// agent finding it held by a live agent refuses to start.
        #[arg(long, default_value = "/var/run/health-agent/health-agent.pid")]
        pub pidfile: PathBuf,
        /// On SIGTERM, every task must have stopped (and removed what it made)
        /// within this; the rest are aborted.
        #[arg(long, default_value = "1500ms", value_parser = crate::util::duration::parse)]
        pub shutdown_timeout: Duration,
        /// Group owning the API socket (mode 0660): its members may run
        /// `health-agent status` and the other API commands.
        #[arg(long, value_name = "GROUP")]
        pub socket_group: Option<String>,
    }
}

impl ProcessSettings {
    /// How the tasks are supervised: stopped within `--shutdown-timeout`.
    #[must_use]
    pub fn supervisor(&self) -> Policy {
        Policy {
            stop_deadline: self.shutdown_timeout,
            ..Policy::default()
        }
    }
}
