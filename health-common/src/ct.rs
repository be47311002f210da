//! Connection tracking on the health endpoint's veth: keys, entries and the
//! per-packet decisions, shared by the tc programs and the agent.
//!
//! Tuples are written from the endpoint's side: an `Out` entry is a flow
//! the endpoint opened (its probes), an `In` entry one a peer opened (probes
//! of this endpoint). Packets from the endpoint count as tx, packets to it
//! as rx. For ICMP echo the identifier stands in for a port: requests carry
//! it as the destination port, replies as the source port, so a reply's
//! reversed tuple is its request's (`ICMPv6` echo likewise).
//!
//! Both families share one map: addresses are 16 bytes, IPv6 as it is and
//! IPv4 as an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, RFC 4291
//! 2.5.5.2), see [`v4_mapped`]. The flow parser never tracks an IPv6
//! packet that carries an IPv4-mapped address itself, so a key's family is
//! known from its addresses alone and the two families never alias.

use crate::headers::{
    ICMP_ECHO_REPLY, ICMP_ECHO_REQUEST, ICMPV6_ECHO_REPLY, ICMPV6_ECHO_REQUEST, IPPROTO_ICMP,
    IPPROTO_ICMPV6,
};

pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;

pub const DIR_OUT: u8 = 1;
pub const DIR_IN: u8 = 2;

/// TCP flag bits as in the header.
pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;

/// The first 12 bytes of an IPv4-mapped IPv6 address.
pub const V4_MAPPED_PREFIX: [u8; 12] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];

/// An IPv4 address as the 16 bytes the keys hold (`::ffff:a.b.c.d`).
#[must_use]
#[inline(always)]
pub const fn v4_mapped(a: [u8; 4]) -> [u8; 16] {
    [
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a[0], a[1], a[2], a[3],
    ]
}

/// Whether `a` is an IPv4-mapped address (a key of an IPv4 flow).
#[must_use]
#[inline(always)]
pub const fn is_v4_mapped(a: &[u8; 16]) -> bool {
    a[0] == 0
        && a[1] == 0
        && a[2] == 0
        && a[3] == 0
        && a[4] == 0
        && a[5] == 0
        && a[6] == 0
        && a[7] == 0
        && a[8] == 0
        && a[9] == 0
        && a[10] == 0xff
        && a[11] == 0xff
}

/// The IPv4 address a key's IPv4-mapped address holds; `None` for IPv6.
#[must_use]
#[inline(always)]
pub const fn as_v4(a: &[u8; 16]) -> Option<[u8; 4]> {
    if is_v4_mapped(a) {
        Some([a[12], a[13], a[14], a[15]])
    } else {
        None
    }
}

/// A key's address as an [`IpAddr`](core::net::IpAddr): IPv4 for an
/// IPv4-mapped one, IPv6 otherwise.
#[must_use]
pub const fn ip_of(a: [u8; 16]) -> core::net::IpAddr {
    let v6 = core::net::Ipv6Addr::from_octets(a);
    match v6.to_ipv4_mapped() {
        Some(v4) => core::net::IpAddr::V4(v4),
        None => core::net::IpAddr::V6(v6),
    }
}

/// The 16 bytes a key holds for `ip` (IPv4 mapped).
#[must_use]
pub const fn key_addr(ip: core::net::IpAddr) -> [u8; 16] {
    match ip {
        core::net::IpAddr::V4(v4) => v4_mapped(v4.octets()),
        core::net::IpAddr::V6(v6) => v6.octets(),
    }
}

/// Map key: 40 bytes, no implicit padding. Addresses of either family
/// (IPv4 as IPv4-mapped, see the module).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtKey {
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    /// Network byte order.
    pub sport: [u8; 2],
    pub dport: [u8; 2],
    pub proto: u8,
    pub dir: u8,
    pub pad: [u8; 2],
}

impl CtKey {
    /// Whether the flow is IPv4 (both addresses IPv4-mapped).
    #[must_use]
    #[inline(always)]
    pub const fn is_ipv4(&self) -> bool {
        is_v4_mapped(&self.saddr) && is_v4_mapped(&self.daddr)
    }

    /// The same flow seen from the other end, with direction `dir`.
    #[must_use]
    pub const fn reversed(&self, dir: u8) -> Self {
        Self {
            saddr: self.daddr,
            daddr: self.saddr,
            sport: self.dport,
            dport: self.sport,
            proto: self.proto,
            dir,
            pad: [0; 2],
        }
    }
}

/// Map value: 72 bytes, no implicit padding.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtEntry {
    /// `bpf_ktime_get_ns` (`CLOCK_MONOTONIC`) at creation.
    pub created_ns: u64,
    /// When the entry may be collected (`CLOCK_MONOTONIC` ns).
    pub expires_ns: u64,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub last_rx_ns: u64,
    pub last_tx_ns: u64,
    pub rx_flags_seen: u8,
    pub tx_flags_seen: u8,
    pub pad: [u8; 6],
}

/// Lifetimes in seconds, set by the agent (one entry of `CT_CONFIG`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtConfig {
    pub icmp_s: u32,
    pub udp_s: u32,
    pub tcp_syn_s: u32,
    pub tcp_established_s: u32,
    pub tcp_closed_s: u32,
    pub pad: u32,
}

impl Default for CtConfig {
    fn default() -> Self {
        Self {
            icmp_s: 60,
            udp_s: 60,
            tcp_syn_s: 60,
            tcp_established_s: 21_600,
            tcp_closed_s: 10,
            pad: 0,
        }
    }
}

/// Indices of the per-CPU `CT_STATS` counters.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtCounter {
    Lookups = 0,
    Created = 1,
    InsertFailures = 2,
    /// Added by the agent's garbage collector.
    Removed = 3,
    /// Packets the programs could not parse (passed on untouched).
    Unparsed = 4,
}

impl CtCounter {
    pub const COUNT: u32 = 5;
    pub const ALL: [Self; 5] = [
        Self::Lookups,
        Self::Created,
        Self::InsertFailures,
        Self::Removed,
        Self::Unparsed,
    ];

    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Lookups => "lookups",
            Self::Created => "created",
            Self::InsertFailures => "insert_failures",
            Self::Removed => "removed",
            Self::Unparsed => "unparsed",
        }
    }
}

/// What the parser extracts from a packet for tracking and RTT.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flow {
    /// The tuple as the packet travels (source = sender).
    pub key: CtKey,
    pub tcp_flags: u8,
    /// ICMP echo: type (8 request, 0 reply; `ICMPv6`: 128, 129) and
    /// sequence.
    pub icmp_type: u8,
    pub icmp_seq: [u8; 2],
    /// TCP: the sequence and acknowledgment numbers, as on the wire.
    pub tcp_seq: [u8; 4],
    pub tcp_ack: [u8; 4],
    /// ICMP echo: the first 4 bytes of the payload (zeros when the
    /// datagram holds fewer), which a reply carries back.
    pub echo_data: [u8; 4],
    pub len: u32,
    /// Offset of the L4 header in the frame.
    pub l4: u16,
    /// The IPv4 TTL or the IPv6 hop limit.
    pub ttl: u8,
}

impl Flow {
    /// An ICMP or `ICMPv6` echo request.
    #[must_use]
    #[inline(always)]
    pub const fn is_echo_request(&self) -> bool {
        match self.key.proto {
            IPPROTO_ICMP => self.icmp_type == ICMP_ECHO_REQUEST,
            IPPROTO_ICMPV6 => self.icmp_type == ICMPV6_ECHO_REQUEST,
            _ => false,
        }
    }

    /// An ICMP or `ICMPv6` echo reply.
    #[must_use]
    #[inline(always)]
    pub const fn is_echo_reply(&self) -> bool {
        match self.key.proto {
            IPPROTO_ICMP => self.icmp_type == ICMP_ECHO_REPLY,
            IPPROTO_ICMPV6 => self.icmp_type == ICMPV6_ECHO_REPLY,
            _ => false,
        }
    }
}

/// Lifetime of an entry after a packet with `flags_seen` (both directions
/// merged) of protocol `proto`.
#[must_use]
pub const fn lifetime_s(cfg: &CtConfig, proto: u8, flags_seen: u8) -> u32 {
    match proto {
        IPPROTO_ICMP | IPPROTO_ICMPV6 => cfg.icmp_s,
        IPPROTO_TCP => {
            if flags_seen & (TCP_FIN | TCP_RST) != 0 {
                cfg.tcp_closed_s
            } else if flags_seen & TCP_ACK != 0 {
                cfg.tcp_established_s
            } else {
                cfg.tcp_syn_s
            }
        }
        _ => cfg.udp_s,
    }
}

impl CtEntry {
    /// The earliest this entry (of protocol `proto`) can expire, seen at
    /// `now`: its expiry, or sooner for a TCP connection not closing yet,
    /// whose next FIN or RST cuts its lifetime to `tcp_closed_s` from
    /// then, so to `now` plus that at the earliest.
    #[must_use]
    pub const fn earliest_expiry(&self, proto: u8, now: u64, tcp_closed_s: u32) -> u64 {
        let closing = (self.rx_flags_seen | self.tx_flags_seen) & (TCP_FIN | TCP_RST) != 0;
        if proto != IPPROTO_TCP || closing {
            return self.expires_ns;
        }
        let cut = now.saturating_add(tcp_closed_s as u64 * 1_000_000_000);
        if cut < self.expires_ns {
            cut
        } else {
            self.expires_ns
        }
    }

    /// Accounts one packet of `len` bytes; `from_endpoint` selects tx or rx.
    /// A SYN on a TCP entry that saw a FIN or a reset opens a new
    /// connection on the same ports: the entry starts over, so that the
    /// new one is neither cut to the closed lifetime nor counted with the
    /// old one.
    pub const fn account(
        &mut self,
        now: u64,
        len: u32,
        tcp_flags: u8,
        from_endpoint: bool,
        cfg: &CtConfig,
        proto: u8,
    ) {
        let closed = (self.rx_flags_seen | self.tx_flags_seen) & (TCP_FIN | TCP_RST) != 0;
        if proto == IPPROTO_TCP && closed && tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN {
            *self = Self {
                created_ns: now,
                // Set below; never 0 meanwhile for a collector reading it.
                expires_ns: self.expires_ns,
                rx_packets: 0,
                rx_bytes: 0,
                tx_packets: 0,
                tx_bytes: 0,
                last_rx_ns: 0,
                last_tx_ns: 0,
                rx_flags_seen: 0,
                tx_flags_seen: 0,
                pad: [0; 6],
            };
        }
        if from_endpoint {
            self.tx_packets += 1;
            self.tx_bytes += len as u64;
            self.tx_flags_seen |= tcp_flags;
            self.last_tx_ns = now;
        } else {
            self.rx_packets += 1;
            self.rx_bytes += len as u64;
            self.rx_flags_seen |= tcp_flags;
            self.last_rx_ns = now;
        }
        let seen = self.rx_flags_seen | self.tx_flags_seen;
        self.expires_ns = now + lifetime_s(cfg, proto, seen) as u64 * 1_000_000_000;
    }
}

const _: () = {
    assert!(size_of::<CtKey>() == 40);
    assert!(size_of::<CtEntry>() == 72);
    assert!(size_of::<CtConfig>() == 24);
};

// SAFETY: repr(C), explicit padding, every bit pattern valid.
#[cfg(feature = "user")]
unsafe impl aya::Pod for CtKey {}
// SAFETY: as above.
#[cfg(feature = "user")]
unsafe impl aya::Pod for CtEntry {}
// SAFETY: as above.
#[cfg(feature = "user")]
unsafe impl aya::Pod for CtConfig {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_reversed_is_its_request() {
        let req = CtKey {
            saddr: v4_mapped([198, 18, 64, 2]),
            daddr: v4_mapped([198, 18, 65, 2]),
            sport: [0, 0],
            dport: 0x1234u16.to_be_bytes(),
            proto: IPPROTO_ICMP,
            dir: DIR_OUT,
            pad: [0; 2],
        };
        let reply = req.reversed(0);
        assert_eq!(reply.saddr, req.daddr);
        assert_eq!(reply.sport, req.dport);
        assert_eq!(reply.reversed(DIR_OUT), req);
    }

    #[test]
    fn keys_have_no_padding_holes() {
        // Every byte is a named field: the sizes add up exactly.
        assert_eq!(size_of::<CtKey>(), 16 + 16 + 2 + 2 + 1 + 1 + 2);
        assert_eq!(align_of::<CtKey>(), 1);
        assert_eq!(core::mem::offset_of!(CtKey, sport), 32);
        assert_eq!(core::mem::offset_of!(CtKey, pad), 38);
    }

    #[test]
    fn ipv4_is_stored_mapped_and_recognised() {
        let a = v4_mapped([198, 18, 0, 1]);
        assert_eq!(a, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 1]);
        assert_eq!(as_v4(&a), Some([198, 18, 0, 1]));
        let v6 = [0x20, 0x01, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        assert_eq!(as_v4(&v6), None);
        // IPv4-compatible (deprecated, ::a.b.c.d) is not IPv4-mapped.
        assert!(!is_v4_mapped(&[
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 198, 18, 0, 1
        ]));
        let v4 = core::net::IpAddr::from([198, 18, 0, 1]);
        assert_eq!((ip_of(a), key_addr(v4)), (v4, a));
        let ip6 = core::net::IpAddr::from(v6);
        assert_eq!((ip_of(v6), key_addr(ip6)), (ip6, v6));
        let k = CtKey {
            saddr: a,
            daddr: v4_mapped([198, 18, 0, 2]),
            ..CtKey::default()
        };
        assert!(k.is_ipv4());
        assert!(!CtKey { daddr: v6, ..k }.is_ipv4());
    }

    #[test]
    fn echo_types_are_read_per_family() {
        let f = |proto, icmp_type| Flow {
            key: CtKey {
                proto,
                ..CtKey::default()
            },
            icmp_type,
            ..Flow::default()
        };
        assert!(f(IPPROTO_ICMP, 8).is_echo_request());
        assert!(f(IPPROTO_ICMP, 0).is_echo_reply());
        assert!(f(IPPROTO_ICMPV6, 128).is_echo_request());
        assert!(f(IPPROTO_ICMPV6, 129).is_echo_reply());
        assert!(!f(IPPROTO_ICMPV6, 8).is_echo_request());
        assert!(!f(IPPROTO_ICMPV6, 0).is_echo_reply());
        // UDP's icmp_type is 0, which is not an echo reply.
        assert!(!f(IPPROTO_UDP, 0).is_echo_reply());
    }

    /// An open TCP connection can expire as soon as a reset and the
    /// closed lifetime allow; a closing one, ICMP or UDP only when their
    /// expiry says.
    #[test]
    fn only_an_open_tcp_entry_can_expire_before_its_expiry() {
        let cfg = CtConfig::default();
        let s = 1_000_000_000u64;
        let mut e = CtEntry::default();
        e.account(0, 60, TCP_SYN | TCP_ACK, true, &cfg, IPPROTO_TCP);
        assert_eq!(e.expires_ns, 21_600 * s);
        assert_eq!(e.earliest_expiry(IPPROTO_TCP, 5 * s, 10), 15 * s);
        // Closing already: its expiry stands.
        e.account(s, 60, TCP_RST, true, &cfg, IPPROTO_TCP);
        assert_eq!(e.earliest_expiry(IPPROTO_TCP, 2 * s, 10), 11 * s);
        let mut icmp = CtEntry::default();
        icmp.account(0, 84, 0, true, &cfg, IPPROTO_ICMP);
        assert_eq!(icmp.earliest_expiry(IPPROTO_ICMP, 0, 10), 60 * s);
        // Never later than the expiry itself.
        let mut syn = CtEntry::default();
        syn.account(0, 60, TCP_SYN, true, &cfg, IPPROTO_TCP);
        assert_eq!(syn.earliest_expiry(IPPROTO_TCP, 55 * s, 10), 60 * s);
    }

    /// Ports used again after a close: the SYN starts the entry over; a
    /// SYN on an open connection (a retransmission) does not.
    #[test]
    fn a_syn_after_a_close_starts_the_entry_over() {
        let cfg = CtConfig::default();
        let s = 1_000_000_000u64;
        let mut e = CtEntry::default();
        e.account(0, 60, TCP_SYN, true, &cfg, IPPROTO_TCP);
        e.account(0, 60, TCP_SYN | TCP_ACK, false, &cfg, IPPROTO_TCP);
        e.account(s, 60, TCP_SYN, true, &cfg, IPPROTO_TCP);
        assert_eq!((e.tx_packets, e.rx_packets), (2, 1), "a retransmitted SYN");
        e.account(2 * s, 52, TCP_FIN | TCP_ACK, true, &cfg, IPPROTO_TCP);
        assert_eq!(e.expires_ns, 2 * s + u64::from(cfg.tcp_closed_s) * s);
        e.account(5 * s, 60, TCP_SYN, true, &cfg, IPPROTO_TCP);
        assert_eq!(
            (e.created_ns, e.tx_packets, e.tx_bytes, e.rx_packets),
            (5 * s, 1, 60, 0),
            "a new connection"
        );
        e.account(5 * s, 60, TCP_SYN | TCP_ACK, false, &cfg, IPPROTO_TCP);
        assert_eq!(
            e.expires_ns,
            5 * s + u64::from(cfg.tcp_established_s) * s,
            "established again, not closed"
        );
    }

    #[test]
    fn tcp_lifetimes_follow_the_flags() {
        let cfg = CtConfig::default();
        assert_eq!(lifetime_s(&cfg, IPPROTO_TCP, TCP_SYN), cfg.tcp_syn_s);
        assert_eq!(
            lifetime_s(&cfg, IPPROTO_TCP, TCP_SYN | TCP_ACK),
            cfg.tcp_established_s
        );
        assert_eq!(
            lifetime_s(&cfg, IPPROTO_TCP, TCP_SYN | TCP_ACK | TCP_FIN),
            cfg.tcp_closed_s
        );
        assert_eq!(lifetime_s(&cfg, IPPROTO_TCP, TCP_RST), cfg.tcp_closed_s);
        assert_eq!(lifetime_s(&cfg, IPPROTO_ICMP, 0), cfg.icmp_s);
        assert_eq!(lifetime_s(&cfg, IPPROTO_ICMPV6, 0), cfg.icmp_s);
        assert_eq!(lifetime_s(&cfg, IPPROTO_UDP, 0), cfg.udp_s);
    }

    #[test]
    fn accounting_splits_directions_and_extends_expiry() {
        let cfg = CtConfig::default();
        let mut e = CtEntry::default();
        e.account(1_000, 98, 0, true, &cfg, IPPROTO_ICMP);
        e.account(2_000, 98, 0, false, &cfg, IPPROTO_ICMP);
        e.account(3_000, 60, 0, true, &cfg, IPPROTO_ICMP);
        assert_eq!(
            (e.tx_packets, e.tx_bytes, e.rx_packets, e.rx_bytes),
            (2, 158, 1, 98)
        );
        assert_eq!(e.expires_ns, 3_000 + 60 * 1_000_000_000);
        assert_eq!((e.last_tx_ns, e.last_rx_ns), (3_000, 2_000));
    }
}
