//! Names, keys and values of the maps the kernel programs share with the agent.

/// Per-CPU array of `u64`, indexed by [`EchoCounter`].
pub const ECHO_STATS: &str = "ECHO_STATS";
/// Array with one [`EchoConfig`] at index 0.
pub const ECHO_CONFIG: &str = "ECHO_CONFIG";

/// Connection tracking and RTT maps (see `ct` and `rtt`).
pub const CT_MAP: &str = "CT_MAP";
pub const CT_CONFIG: &str = "CT_CONFIG";
pub const CT_STATS: &str = "CT_STATS";
pub const RTT_PENDING: &str = "RTT_PENDING";
pub const RTT_STATS: &str = "RTT_STATS";
pub const RTT_LOSSES: &str = "RTT_LOSSES";

/// Masquerade maps (see `nat`).
pub const NAT_MAP: &str = "NAT_MAP";
pub const NAT_CONFIG: &str = "NAT_CONFIG";
pub const NAT_STATS: &str = "NAT_STATS";

/// Every map the object pins, for listing and cleanup.
pub const ALL_MAPS: [&str; 12] = [
    ECHO_STATS,
    ECHO_CONFIG,
    CT_MAP,
    CT_CONFIG,
    CT_STATS,
    RTT_PENDING,
    RTT_STATS,
    RTT_LOSSES,
    NAT_MAP,
    NAT_CONFIG,
    NAT_STATS,
    "AYA_LOGS",
];

/// Program names in the object file.
pub const PROG_ECHO_XDP: &str = "health_echo_xdp";
pub const PROG_ECHO_TC: &str = "health_echo_tc";
/// An `XDP_PASS` program for the far end of a veth: native-mode `XDP_TX` on a
/// veth only delivers when the peer has an XDP program of its own.
pub const PROG_XDP_PASS: &str = "health_xdp_pass";
/// Tracking on the host side of the endpoint's veth: from / to the endpoint.
pub const PROG_LXC_INGRESS: &str = "health_lxc_ingress";
pub const PROG_LXC_EGRESS: &str = "health_lxc_egress";
/// Masquerade on the node's uplink: SNAT leaving, reverse translation arriving.
pub const PROG_NAT_EGRESS: &str = "health_nat_egress";
pub const PROG_NAT_INGRESS: &str = "health_nat_ingress";

/// Indices into [`ECHO_STATS`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EchoCounter {
    /// Echo requests turned into replies in the kernel program.
    Answered = 0,
    /// Packets handed on untouched (not for the responder, or skipped).
    Passed = 1,
    /// Packets dropped because their headers were invalid or truncated.
    Malformed = 2,
}

impl EchoCounter {
    pub const COUNT: u32 = 3;
    pub const ALL: [Self; 3] = [Self::Answered, Self::Passed, Self::Malformed];

    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Answered => "answered",
            Self::Passed => "passed",
            Self::Malformed => "malformed",
        }
    }
}

/// Responder configuration, the only entry of [`ECHO_CONFIG`].
///
/// `addr` is the endpoint's IPv4 address in network byte order; all zeroes
/// means "no address yet": every packet is passed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EchoConfig {
    pub addr: [u8; 4],
}

const _: () = assert!(size_of::<EchoConfig>() == 4);

// SAFETY: repr(C), no padding (asserted above), every bit pattern valid.
#[cfg(feature = "user")]
unsafe impl aya::Pod for EchoConfig {}
