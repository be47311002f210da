//! Masquerade NAT on the node's uplink: keys, entries and the per-packet
//! decisions shared by the tc programs and the agent.
//!
//! Traffic from the node's health CIDR to destinations outside the health
//! range leaves the uplink with the node IP as source (SNAT on egress) and
//! its replies are translated back on ingress, before the stack sees them.
//! Each translated flow holds a pair of entries in one map:
//!
//! - `OUT` keyed by the original tuple (`endpoint:port -> peer:port`),
//!   value `XLATE_SRC node_ip:allocated_port`;
//! - `IN` keyed by the reply tuple as it arrives (`peer:port ->
//!   node_ip:allocated_port`), value `XLATE_DST endpoint:port`.
//!
//! Unlike connection tracking, ICMP echo puts its identifier on the side of
//! the host that chose it: `OUT 198.18.64.2:513 -> 198.18.0.12:0`, `IN
//! 198.18.0.12:0 -> 198.18.0.11:513`. The `IN` key is what makes an
//! allocation unique: it is inserted with `BPF_NOEXIST`, so two flows can
//! never own the same (peer, protocol, node port).
//!
//! Masquerade is IPv4 only: an IPv6 flow has no NAT key ([`out_key`] and
//! [`arriving_key`] give `None`), so the programs pass IPv6 untouched.

use crate::{
    ct::{
        CtKey, DIR_IN, DIR_OUT, Flow, IPPROTO_TCP, IPPROTO_UDP, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN,
        as_v4, v4_mapped,
    },
    encrypt::HELLO_PORT,
    headers::{ICMP_ECHO_REPLY, ICMP_ECHO_REQUEST, IPPROTO_ICMP},
};

/// NAT map key: the IPv4 tuple of connection tracking (16 bytes, no
/// implicit padding), `dir` is [`DIR_OUT`] or [`DIR_IN`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NatKey {
    pub saddr: [u8; 4],
    pub daddr: [u8; 4],
    /// Network byte order.
    pub sport: [u8; 2],
    pub dport: [u8; 2],
    pub proto: u8,
    pub dir: u8,
    pub pad: [u8; 2],
}

/// The IPv4 tuple of `flow` with direction `dir`; `None` for IPv6.
#[must_use]
#[inline(always)]
pub const fn ipv4_key(flow: &Flow, dir: u8) -> Option<NatKey> {
    let (Some(saddr), Some(daddr)) = (as_v4(&flow.key.saddr), as_v4(&flow.key.daddr)) else {
        return None;
    };
    Some(NatKey {
        saddr,
        daddr,
        sport: flow.key.sport,
        dport: flow.key.dport,
        proto: flow.key.proto,
        dir,
        pad: [0; 2],
    })
}

/// NAT map value: 24 bytes, no implicit padding.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NatEntry {
    /// `bpf_ktime_get_ns` when the pair was made.
    pub created_ns: u64,
    /// Last packet translated through this entry.
    pub last_ns: u64,
    /// `OUT`: the new source; `IN`: the new destination.
    pub xlate_addr: [u8; 4],
    /// Network byte order.
    pub xlate_port: [u8; 2],
    /// A hold's (see [`held_by_node`]): the FIN and RST flags its TCP
    /// connection sent since its last SYN, which shorten its lifetime. 0
    /// in a pair.
    pub closing: u8,
    pub pad: u8,
}

impl NatEntry {
    /// An entry made at `now`, translating to `addr:port`.
    #[must_use]
    pub const fn made(addr: [u8; 4], port: [u8; 2], now: u64) -> Self {
        Self {
            created_ns: now,
            last_ns: now,
            xlate_addr: addr,
            xlate_port: port,
            closing: 0,
            pad: 0,
        }
    }

    /// A hold's `closing` flags after a TCP segment with `tcp_flags` (0
    /// for other protocols) leaves: a SYN starts a connection afresh, a
    /// FIN or RST marks it closing.
    #[must_use]
    pub const fn closing_after(closing: u8, tcp_flags: u8) -> u8 {
        if tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN {
            0
        } else {
            closing | (tcp_flags & (TCP_FIN | TCP_RST))
        }
    }
}

/// Whether a segment of the node's own with TCP flags `tcp_flags` (0
/// for other protocols) makes a hold on its port: not a reset, which the
/// node's kernel sends in answer to any segment for a port without a
/// socket, so that a sender could make it hold every port of the range
/// (and fill the map, evicting the endpoint's pairs). A reset of a flow
/// already held closes the hold.
#[must_use]
pub const fn makes_hold(tcp_flags: u8) -> bool {
    tcp_flags & TCP_RST == 0
}

/// NAT configuration, the only entry of `NAT_CONFIG`. All-zero: disabled.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NatConfig {
    /// 1: masquerade on.
    pub enabled: u32,
    /// The address flows are masqueraded to.
    pub node_ip: [u8; 4],
    /// Sources that are masqueraded (the node's health CIDR).
    pub src_net: [u8; 4],
    pub src_mask: [u8; 4],
    /// Destinations never masqueraded (the cluster's health range).
    pub exclude_net: [u8; 4],
    pub exclude_mask: [u8; 4],
    /// Ports and ICMP identifiers handed out, inclusive, host byte order.
    pub port_min: u16,
    pub port_max: u16,
}

impl NatConfig {
    /// Whether a packet `src -> dst` is masqueraded.
    #[must_use]
    pub fn masquerades(&self, src: [u8; 4], dst: [u8; 4]) -> bool {
        self.enabled == 1 && in_net(src, self.src_net, self.src_mask) && self.covers(dst)
    }

    /// Whether masquerade covers flows toward `dst`: outside the health
    /// range, and not the node itself.
    fn covers(&self, dst: [u8; 4]) -> bool {
        !in_net(dst, self.exclude_net, self.exclude_mask) && dst != self.node_ip
    }

    /// How many ports the range holds (0 when misconfigured).
    #[must_use]
    pub const fn range_len(&self) -> u32 {
        if self.port_max < self.port_min {
            0
        } else {
            self.port_max as u32 - self.port_min as u32 + 1
        }
    }

    /// Whether `port` lies in the range handed out.
    #[must_use]
    pub const fn holds(&self, port: u16) -> bool {
        self.port_min <= port && port <= self.port_max
    }

    /// Whether `out`, leaving with source port (or echo identifier)
    /// `port`, is a flow of the node's own on a port of the range toward
    /// a peer masquerade covers: masquerade must not hand that port out
    /// toward that peer while the flow lives, or the flow's replies would
    /// go to the endpoint. Toward the health range (or the node itself) no
    /// endpoint flow is masqueraded: nothing to hold there.
    #[must_use]
    pub fn node_flow_in_range(&self, out: &NatKey, port: [u8; 2]) -> bool {
        self.enabled == 1
            && out.saddr == self.node_ip
            && self.covers(out.daddr)
            && self.holds(u16::from_be_bytes(port))
    }

    /// The port to try at `attempt`: first the flow's own port when it lies
    /// in the range (nothing to rewrite then), later a random one.
    #[must_use]
    pub fn candidate(&self, own: u16, attempt: u32, random: u32) -> u16 {
        let len = self.range_len();
        if len == 0 {
            return 0;
        }
        if attempt == 0 && self.holds(own) {
            return own;
        }
        #[allow(clippy::cast_possible_truncation, reason = "below port_max")]
        let port = (u32::from(self.port_min) + random % len) as u16;
        port
    }
}

#[inline(always)]
fn in_net(addr: [u8; 4], net: [u8; 4], mask: [u8; 4]) -> bool {
    u32::from_ne_bytes(addr) & u32::from_ne_bytes(mask) == u32::from_ne_bytes(net)
}

/// Indices of the per-CPU `NAT_STATS` counters.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NatCounter {
    /// Packets whose source was rewritten (egress).
    Snat = 0,
    /// Replies whose destination was rewritten back (ingress).
    RevSnat = 1,
    /// New pairs made.
    Created = 2,
    /// No free port after every retry: the packet was dropped, never sent
    /// with the endpoint's address.
    AllocFailures = 3,
    /// Removed by the agent's garbage collector.
    Removed = 4,
    /// A checksum or store helper failed: the packet was dropped.
    RewriteFailures = 5,
    /// Later fragments whose source was rewritten (egress).
    FragSnat = 6,
    /// Later fragments whose destination was rewritten back (ingress).
    FragRevSnat = 7,
    /// Later fragments leaving that masquerade covers, of a datagram with
    /// no live record (its first fragment not translated, nor passed as an
    /// echo reply, in the last 30 s): dropped, never sent with the
    /// endpoint's address.
    FragDropped = 8,
    /// Ports (or echo identifiers) of the range held for a flow of the
    /// node's own, toward one peer: masquerade hands them out to no
    /// endpoint flow toward it while the node's flow lives, and moves one
    /// that had it.
    NodeHeld = 9,
}

impl NatCounter {
    pub const COUNT: u32 = 10;
    pub const ALL: [Self; 10] = [
        Self::Snat,
        Self::RevSnat,
        Self::Created,
        Self::AllocFailures,
        Self::Removed,
        Self::RewriteFailures,
        Self::FragSnat,
        Self::FragRevSnat,
        Self::FragDropped,
        Self::NodeHeld,
    ];

    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Snat => "snat",
            Self::RevSnat => "rev_snat",
            Self::Created => "created",
            Self::AllocFailures => "alloc_failures",
            Self::Removed => "removed",
            Self::RewriteFailures => "rewrite_failures",
            Self::FragSnat => "frag_snat",
            Self::FragRevSnat => "frag_rev_snat",
            Self::FragDropped => "frag_dropped",
            Self::NodeHeld => "node_held",
        }
    }
}

/// Attempts at finding a free port before the packet is dropped.
pub const ALLOC_RETRIES: u32 = 32;

/// The `OUT` key of a packet leaving the node, and the port it carries
/// (the echo identifier for ICMP). `None`: not translatable (IPv6, ICMP
/// other than an echo request).
#[must_use]
pub fn out_key(flow: &Flow) -> Option<(NatKey, [u8; 2])> {
    let mut key = ipv4_key(flow, DIR_OUT)?;
    match flow.key.proto {
        IPPROTO_ICMP if flow.icmp_type == ICMP_ECHO_REQUEST => {
            // Conntrack's request tuple has the identifier as dport.
            key.sport = flow.key.dport;
            key.dport = [0, 0];
        }
        IPPROTO_TCP | IPPROTO_UDP => {}
        _ => return None,
    }
    Some((key, key.sport))
}

/// Whether a packet leaving the endpoint answers a connection made to it
/// from outside: a TCP segment from its hello server's port (a peer that
/// probes from its node connects there). Those leave as they are: given a
/// node port, they would leave under a tuple the peer never sent to. The
/// endpoint's own connections come from ephemeral ports, never this one.
#[must_use]
pub const fn answers_inbound(flow: &Flow) -> bool {
    let hello = HELLO_PORT.to_be_bytes();
    flow.key.proto == IPPROTO_TCP && flow.key.sport[0] == hello[0] && flow.key.sport[1] == hello[1]
}

/// The `IN` key of the replies to `out` once its source is `node_ip:port`.
#[must_use]
pub const fn in_key(out: &NatKey, node_ip: [u8; 4], port: [u8; 2]) -> NatKey {
    NatKey {
        saddr: out.daddr,
        daddr: node_ip,
        sport: out.dport,
        dport: port,
        proto: out.proto,
        dir: DIR_IN,
        pad: [0; 2],
    }
}

/// Whether the `IN` entry `back` under key `inbound` holds its port for a
/// flow of the node's own (it translates to itself), not an endpoint's.
#[must_use]
pub fn held_by_node(inbound: &NatKey, back: &NatEntry) -> bool {
    back.xlate_addr == inbound.daddr
}

/// The `IN` key of a packet arriving on the uplink. `None`: not a reply
/// NAT could have made (IPv6, ICMP other than an echo reply).
#[must_use]
pub fn arriving_key(flow: &Flow) -> Option<NatKey> {
    let mut key = ipv4_key(flow, DIR_IN)?;
    match flow.key.proto {
        IPPROTO_ICMP if flow.icmp_type == ICMP_ECHO_REPLY => {
            // Conntrack's reply tuple has the identifier as sport.
            key.dport = flow.key.sport;
            key.sport = [0, 0];
        }
        IPPROTO_TCP | IPPROTO_UDP => {}
        _ => return None,
    }
    Some(key)
}

/// The connection-tracking key (on `lxc_health`) of the flow an `OUT` entry
/// translates: NAT entries live as long as it does.
#[must_use]
pub const fn ct_key_of(out: &NatKey) -> CtKey {
    let mut key = CtKey {
        saddr: v4_mapped(out.saddr),
        daddr: v4_mapped(out.daddr),
        sport: out.sport,
        dport: out.dport,
        proto: out.proto,
        dir: DIR_OUT,
        pad: [0; 2],
    };
    if out.proto == IPPROTO_ICMP {
        key.dport = out.sport;
        key.sport = [0, 0];
    }
    key
}

/// The `OUT` key an `IN` entry answers, from its key and value.
#[must_use]
pub const fn out_key_of(inbound: &NatKey, value: &NatEntry) -> NatKey {
    NatKey {
        saddr: value.xlate_addr,
        daddr: inbound.saddr,
        sport: value.xlate_port,
        dport: inbound.sport,
        proto: inbound.proto,
        dir: DIR_OUT,
        pad: [0; 2],
    }
}

/// Byte offset of the L4 checksum from the start of the L4 header.
#[must_use]
pub const fn l4_csum_offset(proto: u8) -> Option<usize> {
    match proto {
        IPPROTO_TCP => Some(16),
        IPPROTO_UDP => Some(6),
        IPPROTO_ICMP => Some(2),
        _ => None,
    }
}

/// Byte offset, from the start of the L4 header, of the port NAT rewrites:
/// the source port (SNAT) or destination port (reverse); ICMP's identifier
/// sits at 4 either way.
#[must_use]
pub const fn port_offset(proto: u8, source: bool) -> usize {
    match (proto, source) {
        (IPPROTO_ICMP, _) => 4,
        (_, true) => 0,
        (_, false) => 2,
    }
}

const _: () = {
    assert!(size_of::<NatKey>() == 16);
    assert!(size_of::<NatEntry>() == 24);
    assert!(size_of::<NatConfig>() == 28);
};

// SAFETY: repr(C), explicit padding, every bit pattern valid.
#[cfg(feature = "user")]
unsafe impl aya::Pod for NatKey {}
// SAFETY: as above.
#[cfg(feature = "user")]
unsafe impl aya::Pod for NatEntry {}
// SAFETY: as above.
#[cfg(feature = "user")]
unsafe impl aya::Pod for NatConfig {}

pub mod fragments;
pub mod quoted;

#[cfg(test)]
mod tests;
