//! What describes the endpoint's plumbing ([`Plan`]: its namespace, the
//! veth's two ends, its addresses) and what making or checking it may
//! fail with ([`PlumbingError`]), shared by the plumbing and the ownership
//! check.

use crate::{
    sys::{
        netlink::NetlinkError,
        netns::{Netns, NetnsError},
        sysctl::SysctlError,
    },
    util::cidr::Cidr,
};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// The endpoint's address of one family and the CIDR it comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Assigned<C: Cidr> {
    pub addr: C::Addr,
    pub cidr: C,
}

/// The endpoint's IPv4 address and the CIDR it comes from.
pub type V4 = Assigned<Ipv4Net>;

/// The endpoint's IPv6 address and the CIDR it comes from.
pub type V6 = Assigned<Ipv6Net>;

/// Everything that describes the endpoint's plumbing.
#[derive(Debug, Clone)]
pub struct Plan {
    pub netns: Netns,
    pub netns_name: String,
    pub host_iface: String,
    pub ep_iface: String,
    pub v4: Option<V4>,
    pub v6: Option<V6>,
}

#[derive(Debug, thiserror::Error)]
pub enum PlumbingError {
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("switching off duplicate address detection on the endpoint's veth")]
    Sysctl(#[from] SysctlError),
    #[error(
        "{cidr} has no router address (a prefix longer than /{longest} leaves no room for one)"
    )]
    NoRouter { cidr: IpNet, longest: u8 },
    #[error(
        "{iface:?} (index {index}) is not the interface this agent made (index {proven}): left as it is"
    )]
    NotMine {
        iface: String,
        index: u32,
        proven: String,
    },
}
