use std::fmt;

use serde::{Deserialize, Serialize};

/// Where the responder runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum AttachMode {
    /// tc ingress through tcx links (kernel >= 6.6); replies are redirected
    /// back out of the interface.
    Tcx,
    /// XDP in the driver; on a veth the peer needs an XDP program too.
    XdpNative,
    /// XDP in the generic (skb) path.
    XdpGeneric,
}

impl AttachMode {
    pub const ALL: [Self; 3] = [Self::Tcx, Self::XdpNative, Self::XdpGeneric];

    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Tcx => "tcx",
            Self::XdpNative => "xdp-native",
            Self::XdpGeneric => "xdp-generic",
        }
    }
}

impl fmt::Display for AttachMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
