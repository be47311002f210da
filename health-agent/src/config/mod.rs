//! The daemon's configuration, typed once: each section is a set of
//! `health-agent daemon` flags, defined beside the component it configures
//! (`endpoint::settings`, `datapath::settings`, `membership::settings`,
//! `probe::settings`, `web::settings`; the process's own here), and the
//! same definition gives the config file's keys (one per flag, same name),
//! `config print-defaults`, and what a SIGHUP applies ([`ProbeTuning`], the
//! one reloadable section). Components take their own section by reference.
//!
//! Lives here: the sections composed into [`Config`], and the typed
//! comparison a reload makes. Imported by the daemon and the binary.
#![allow(
    clippy::doc_markdown,
    reason = "clap turns these doc comments into --help text, shown verbatim"
)]

mod process;

use clap::{Args, CommandFactory as _};

pub use self::process::{PinArgs, ProcessSettings, SocketArgs};
pub use crate::{
    datapath::settings::{DatapathSettings, Routing},
    encryption::settings::EncryptionSettings,
    endpoint::settings::EndpointSettings,
    membership::settings::{ClusterSettings, Discovery, Kvstore},
    probe::settings::{ProbeFrom, ProbeSettings, ProbeTuning},
    web::settings::{ServeAddr, WebSettings},
};

/// Everything `health-agent daemon` is told, section by section (the
/// sections' order is the order of `--help` and of `config
/// print-defaults`).
#[derive(Debug, Clone, PartialEq, Eq, Args)]
pub struct Config {
    #[command(flatten)]
    pub endpoint: EndpointSettings,
    #[command(flatten)]
    pub datapath: DatapathSettings,
    #[command(flatten)]
    pub pins: PinArgs,
    #[command(flatten)]
    pub cluster: ClusterSettings,
    #[command(flatten)]
    pub probe: ProbeSettings,
    #[command(flatten)]
    pub tuning: ProbeTuning,
    #[command(flatten)]
    pub encryption: EncryptionSettings,
    #[command(flatten)]
    pub web: WebSettings,
    #[command(flatten)]
    pub socket: SocketArgs,
    #[command(flatten)]
    pub process: ProcessSettings,
}

/// `Config` as a command of its own, to read its arguments' definitions.
#[derive(Debug, clap::Parser)]
#[command(name = "config")]
struct Definition {
    #[command(flatten)]
    config: Config,
}

/// What a reload finds between two configurations: the reloadable keys
/// that changed (applied at once) and the others (applied at a restart).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    pub reloadable: Vec<String>,
    pub need_restart: Vec<String>,
}

impl Config {
    /// The keys (flag names without `--`) whose typed value differs
    /// between `self` and `new`, split into those a reload applies and
    /// the others.
    #[must_use]
    pub fn changes(&self, new: &Self) -> Changes {
        let need_restart = [
            self.endpoint.changed(&new.endpoint),
            self.datapath.changed(&new.datapath),
            self.pins.changed(&new.pins),
            self.cluster.changed(&new.cluster),
            self.encryption.changed(&new.encryption),
            self.probe.changed(&new.probe),
            self.web.changed(&new.web),
            self.socket.changed(&new.socket),
            self.process.changed(&new.process),
        ]
        .concat();
        Changes {
            reloadable: keys(&self.tuning.changed(&new.tuning)),
            need_restart: keys(&need_restart),
        }
    }

    /// The keys a reload applies, in their order of definition.
    #[must_use]
    pub fn reloadable_keys() -> Vec<String> {
        ProbeTuning::augment_args(clap::Command::new("tuning"))
            .get_arguments()
            .filter_map(|a| a.get_long().map(str::to_owned))
            .collect()
    }

    /// The flag name (the config file's key) of the argument `id`.
    #[must_use]
    pub fn key(id: &str) -> String {
        Definition::command()
            .get_arguments()
            .find(|a| a.get_id() == id)
            .and_then(clap::Arg::get_long)
            .map_or_else(|| id.replace('_', "-"), str::to_owned)
    }
}

fn keys(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|id| Config::key(id)).collect()
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    fn parse(args: &[&str]) -> Config {
        Definition::try_parse_from(std::iter::once("config").chain(args.iter().copied()))
            .expect("valid")
            .config
    }

    #[test]
    fn the_definition_is_consistent() {
        Definition::command().debug_assert();
    }

    #[test]
    fn changes_name_each_key_and_split_the_reloadable_ones() {
        let old = parse(&["--health-cidr", "198.18.64.0/24", "--probe-interval", "5s"]);
        assert_eq!(old.changes(&old), Changes::default());
        // The same value written otherwise is no change.
        let same = parse(&[
            "--health-cidr",
            "198.18.64.0/24",
            "--probe-interval",
            "5000ms",
        ]);
        assert_eq!(old.changes(&same), Changes::default());
        let new = parse(&[
            "--health-cidr",
            "198.18.64.0/24",
            "--probe-interval",
            "6s",
            "--history-length",
            "10",
            "--controller-interval",
            "5s",
            "--bpffs-dir",
            "/sys/fs/bpf/other",
            "--socket",
            "/run/other.sock",
        ]);
        let changes = old.changes(&new);
        assert_eq!(changes.reloadable, ["probe-interval", "history-length"]);
        assert_eq!(
            changes.need_restart,
            ["controller-interval", "bpffs-dir", "socket"]
        );
    }

    #[test]
    fn the_reloadable_keys_are_the_tuning_section() {
        assert_eq!(
            Config::reloadable_keys(),
            [
                "probe-interval",
                "liveness-interval",
                "probe-timeout",
                "success-threshold",
                "failure-threshold",
                "history-length"
            ]
        );
    }
}
