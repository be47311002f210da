//! What the agent says about a path's encryption.

use std::{collections::HashMap, fmt, net::IpAddr};

use serde::{Deserialize, Serialize};

/// A path's encryption, judged over the last rounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EncState {
    /// Its probes left through the WireGuard device to the node's peer,
    /// whose handshake is recent.
    Encrypted,
    /// Its probes left through another interface, unencrypted.
    Plaintext,
    /// The address is outside every WireGuard peer's AllowedIPs (or in
    /// another node's peer's): WireGuard cannot carry it to its node.
    NotCovered,
    /// Probes went to the WireGuard peer, but its last handshake is older
    /// than the rekey time plus the margin (or there was none).
    Stale,
    /// Covered, but no probe to it was seen leaving in the last rounds
    /// (not probed yet, or not probed by this agent).
    Unobserved,
    /// The WireGuard device could not be read.
    Unknown,
}

impl EncState {
    pub const ALL: [Self; 6] = [
        Self::Encrypted,
        Self::Plaintext,
        Self::NotCovered,
        Self::Stale,
        Self::Unobserved,
        Self::Unknown,
    ];

    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Encrypted => "encrypted",
            Self::Plaintext => "plaintext",
            Self::NotCovered => "not_covered",
            Self::Stale => "stale",
            Self::Unobserved => "unobserved",
            Self::Unknown => "unknown",
        }
    }

    /// A problem an operator must look at.
    #[must_use]
    pub const fn is_problem(self) -> bool {
        matches!(self, Self::Plaintext | Self::NotCovered | Self::Stale)
    }
}

impl fmt::Display for EncState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NotCovered => "not covered",
            other => other.name(),
        })
    }
}

/// One address's encryption, in the status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathEncryption {
    pub state: EncState,
    /// The WireGuard peer (public key, base64) WireGuard sends this
    /// address to, when one covers it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// Why, for every state but `encrypted`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The last judgement over every probed address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EncryptionView {
    /// The WireGuard device judged against.
    pub device: Option<String>,
    /// Why no device could be judged against (every path `unknown`).
    pub error: Option<String>,
    pub paths: HashMap<IpAddr, PathEncryption>,
}

impl EncryptionView {
    /// Paths per state, every state present (zero included).
    #[must_use]
    pub fn counts(&self) -> Vec<(EncState, usize)> {
        EncState::ALL
            .iter()
            .map(|s| (*s, self.paths.values().filter(|p| p.state == *s).count()))
            .collect()
    }
}
