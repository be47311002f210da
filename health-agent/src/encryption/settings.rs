//! The encryption check's flags.
#![allow(
    clippy::doc_markdown,
    reason = "clap turns these doc comments into --help text, shown verbatim"
)]

use std::time::Duration;

use clap::Args;

use crate::util::section::section;

/// What protects node-to-node traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Encryption {
    /// Nothing checked.
    #[default]
    None,
    /// WireGuard: each path is checked to go through the WireGuard device
    /// to its node's peer, with a live handshake.
    Wireguard,
}

section! {
    /// Encryption of the paths to peers.
    #[derive(Debug, Clone, PartialEq, Eq, Args)]
    pub struct EncryptionSettings {
        /// The encryption the cluster runs: `wireguard` routes health
        /// addresses into the WireGuard device and says for every path
        /// whether its probes were encrypted (encrypted, plaintext, not
        /// covered, stale).
        #[arg(long, value_enum, default_value_t = Encryption::None)]
        pub encryption: Encryption,
        /// The WireGuard device (default: the node's only one; with
        /// several, name one).
        #[arg(long, value_name = "NAME", value_parser = crate::endpoint::settings::interface_name)]
        pub encryption_device: Option<String>,
        /// A peer that probes went to is stale when its last handshake is
        /// older than WireGuard's rekey time (2 minutes) plus this margin.
        #[arg(long, default_value = "1m", value_parser = crate::util::duration::parse)]
        pub encryption_handshake_margin: Duration,
    }
}

/// WireGuard's `REKEY_AFTER_TIME`: a session in use is renewed by a new
/// handshake after this long.
pub const REKEY_AFTER: Duration = Duration::from_secs(120);

impl EncryptionSettings {
    /// Whether the check runs.
    #[must_use]
    pub fn enabled(&self) -> bool {
        self.encryption == Encryption::Wireguard
    }

    /// How old a handshake may be while probes flow.
    #[must_use]
    pub fn stale_after(&self) -> Duration {
        REKEY_AFTER + self.encryption_handshake_margin
    }
}
