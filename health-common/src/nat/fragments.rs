//! IPv4 fragments of masqueraded datagrams.
//!
//! Only a datagram's first fragment carries its ports or echo identifier,
//! so only it can be matched to a NAT pair. When the first fragment of a
//! datagram is translated, its addresses, IP identification and protocol
//! are recorded with the address it was translated to; the later
//! fragments of that datagram, which carry the same four, are translated
//! from that record (their address alone: they hold no port).
//!
//! - Leaving: a later fragment the masquerade covers whose datagram has no
//!   live record (its first fragment was dropped, evicted or never seen) is
//!   dropped, never sent with the endpoint's address.
//! - Arriving: a later fragment to the node IP whose datagram has no live
//!   record is the node's own and passes.
//!
//! A first fragment leaving that the masquerade covers but does not
//! translate (an echo reply: the only untranslated kind the flow parser
//! reads) is recorded too, to its own source, so that its later fragments
//! pass with it rather than being dropped. A first fragment too short for
//! its L4 header is not parsed at all, and passes as it is.
//!
//! A record counts for [`FRAG_LIFETIME_NS`] (the kernel's default
//! reassembly time): a datagram is whole by then or lost, and an older
//! record must not match a later datagram that happens to reuse the
//! identification. The fragments of a datagram may arrive in any order
//! after the first, so a record is not removed when its last fragment
//! passes: the map is an LRU, and the agent's collector removes records
//! past their lifetime. A later fragment that arrives before its first is
//! not translated (leaving: dropped; arriving: it goes to the node, and
//! its datagram is lost).

use crate::{
    ct::{DIR_IN, DIR_OUT, IPPROTO_TCP, IPPROTO_UDP},
    headers::{IPPROTO_ICMP, Ipv4Hdr, is_later_fragment},
};

/// Entries of the fragment map: datagrams whose later fragments may still
/// come. Fragments are rare in health traffic (probes are small; the MTU
/// probe sets Don't Fragment), so this bounds a burst, not the cluster.
pub const FRAG_ENTRIES: u32 = 8_192;

/// Fragment map key: a datagram as its fragments carry it (12 bytes, no
/// implicit padding). `dir` is [`DIR_OUT`] (leaving, keyed by the
/// endpoint's source) or [`DIR_IN`] (arriving, keyed by the node IP).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FragKey {
    pub saddr: [u8; 4],
    pub daddr: [u8; 4],
    /// The IP identification, network byte order.
    pub id: [u8; 2],
    pub proto: u8,
    pub dir: u8,
}

/// Fragment map value (16 bytes, no implicit padding): the address the
/// datagram's fragments are translated to (leaving: the new source;
/// arriving: the new destination), and when its first fragment passed.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FragEntry {
    /// `bpf_ktime_get_ns` when the first fragment passed (translated, or
    /// an echo reply recorded to its own source).
    pub created_ns: u64,
    pub xlate_addr: [u8; 4],
    pub pad: [u8; 4],
}

/// How long a record counts: the kernel's default `ipfrag_time`, after
/// which a receiver drops a datagram it could not reassemble.
pub const FRAG_LIFETIME_NS: u64 = 30_000_000_000;

impl FragEntry {
    /// A record of a first fragment translated to `xlate_addr` at `now`.
    #[must_use]
    #[inline(always)]
    pub const fn new(xlate_addr: [u8; 4], now: u64) -> Self {
        Self {
            created_ns: now,
            xlate_addr,
            pad: [0; 4],
        }
    }

    /// Whether the record still counts at `now` (a clock read before the
    /// record was made, on another CPU, counts as the same moment).
    #[must_use]
    #[inline(always)]
    pub const fn live(&self, now: u64) -> bool {
        now.saturating_sub(self.created_ns) <= FRAG_LIFETIME_NS
    }
}

/// Where a packet stands among its datagram's fragments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fragment {
    /// A whole datagram.
    Whole,
    /// The first fragment: More Fragments set, offset 0.
    First,
    /// A later fragment: a non-zero offset, no L4 header.
    Later,
}

/// The place of the packet whose IPv4 header is `ip`.
#[must_use]
#[inline(always)]
pub const fn fragment_of(ip: &Ipv4Hdr) -> Fragment {
    if is_later_fragment(ip) {
        Fragment::Later
    } else if u16::from_be_bytes(ip.frags) & 0x2000 != 0 {
        Fragment::First
    } else {
        Fragment::Whole
    }
}

/// Whether masquerade translates protocol `proto` at all: the fragments of
/// anything else pass as their first fragment did.
#[must_use]
#[inline(always)]
pub const fn translated_proto(proto: u8) -> bool {
    matches!(proto, IPPROTO_TCP | IPPROTO_UDP | IPPROTO_ICMP)
}

/// The key of the datagram of the fragment whose header is `ip`, in
/// direction `dir`.
#[must_use]
#[inline(always)]
pub const fn key_of(ip: &Ipv4Hdr, dir: u8) -> FragKey {
    FragKey {
        saddr: ip.src_addr,
        daddr: ip.dst_addr,
        id: ip.id,
        proto: ip.proto,
        dir,
    }
}

/// The key under which a translated first fragment leaving is recorded:
/// as the endpoint sent it.
#[must_use]
#[inline(always)]
pub const fn out_key(ip: &Ipv4Hdr) -> FragKey {
    key_of(ip, DIR_OUT)
}

/// The key under which a translated first fragment arriving is recorded:
/// as it arrived, to the node IP.
#[must_use]
#[inline(always)]
pub const fn in_key(ip: &Ipv4Hdr) -> FragKey {
    key_of(ip, DIR_IN)
}

const _: () = {
    assert!(size_of::<FragKey>() == 12);
    assert!(size_of::<FragEntry>() == 16);
};

// SAFETY: repr(C), no padding, every bit pattern valid.
#[cfg(feature = "user")]
unsafe impl aya::Pod for FragKey {}
// SAFETY: as above.
#[cfg(feature = "user")]
unsafe impl aya::Pod for FragEntry {}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(frags: u16, proto: u8) -> Ipv4Hdr {
        let mut b = [0u8; 20];
        b[0] = 0x45;
        b[4..6].copy_from_slice(&0xbeefu16.to_be_bytes());
        b[6..8].copy_from_slice(&frags.to_be_bytes());
        b[9] = proto;
        b[12..16].copy_from_slice(&[198, 18, 64, 2]);
        b[16..20].copy_from_slice(&[198, 18, 0, 12]);
        // SAFETY: Ipv4Hdr is 20 bytes of plain fields.
        unsafe { core::mem::transmute::<[u8; 20], Ipv4Hdr>(b) }
    }

    #[test]
    fn a_packet_is_whole_first_or_later_by_its_flags_and_offset() {
        for (frags, want) in [
            (0x0000, Fragment::Whole),
            // Don't Fragment alone.
            (0x4000, Fragment::Whole),
            (0x2000, Fragment::First),
            (0x20b9, Fragment::Later),
            // The last fragment: More Fragments clear, an offset.
            (0x00b9, Fragment::Later),
            // The reserved bit counts for nothing.
            (0x8000, Fragment::Whole),
        ] {
            assert_eq!(fragment_of(&header(frags, 17)), want, "{frags:#06x}");
        }
    }

    #[test]
    fn a_datagrams_fragments_share_a_key_and_each_direction_has_its_own() {
        let first = header(0x2000, 17);
        let later = header(0x00b9, 17);
        assert_eq!(out_key(&first), out_key(&later));
        assert_eq!(in_key(&first), in_key(&later));
        assert_ne!(out_key(&first), in_key(&first));
        let k = out_key(&first);
        assert_eq!(
            (k.saddr, k.daddr, k.id, k.proto),
            (
                [198, 18, 64, 2],
                [198, 18, 0, 12],
                0xbeefu16.to_be_bytes(),
                17
            )
        );
        // Another datagram of the same flow: another identification.
        let mut other = header(0x00b9, 17);
        other.id = [0, 1];
        assert_ne!(out_key(&other), out_key(&later));
    }

    #[test]
    fn a_record_counts_for_the_reassembly_time_and_no_longer() {
        let e = FragEntry::new([198, 18, 0, 11], 5_000);
        assert!(e.live(5_000));
        assert!(e.live(4_000), "a clock read just before, elsewhere");
        assert!(e.live(5_000 + FRAG_LIFETIME_NS));
        assert!(!e.live(5_001 + FRAG_LIFETIME_NS));
    }

    #[test]
    fn only_the_protocols_masquerade_translates_are_followed() {
        for (proto, want) in [(6, true), (17, true), (1, true), (47, false), (58, false)] {
            assert_eq!(translated_proto(proto), want, "{proto}");
        }
    }
}
