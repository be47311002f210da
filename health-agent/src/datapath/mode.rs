use std::fmt;

use serde::{Deserialize, Serialize};

/// Where the responder runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum AttachMode {
    /// tc ingress through tcx links (kernel >= 6.6); replies are redirected
    /// back out of the interface.
    Tcx,
    /// tc ingress through the classic hook: a clsact qdisc and a `cls_bpf`
    /// filter in direct-action mode (any supported kernel).
    Tc,
    /// XDP in the driver; on a veth the peer needs an XDP program too.
    XdpNative,
    /// XDP in the generic (skb) path.
    XdpGeneric,
}

impl AttachMode {
    pub const ALL: [Self; 4] = [Self::Tcx, Self::Tc, Self::XdpNative, Self::XdpGeneric];

    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Tcx => "tcx",
            Self::Tc => "tc",
            Self::XdpNative => "xdp-native",
            Self::XdpGeneric => "xdp-generic",
        }
    }
}

impl AttachMode {
    /// The programs the responder attaches in this mode (native XDP also
    /// puts an `XDP_PASS` program on the veth's far end).
    #[must_use]
    pub const fn programs(self) -> &'static [health_common::maps::ProgId] {
        use health_common::maps::ProgId;
        match self {
            Self::Tcx | Self::Tc => &[ProgId::EchoTc],
            Self::XdpNative => &[ProgId::EchoXdp, ProgId::XdpPass],
            Self::XdpGeneric => &[ProgId::EchoXdp],
        }
    }

    /// Whether the responder runs at the tc hook (tcx or classic).
    #[must_use]
    pub const fn is_tc(self) -> bool {
        matches!(self, Self::Tcx | Self::Tc)
    }
}

impl fmt::Display for AttachMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
