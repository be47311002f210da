//! Extracting a tracked flow from a frame: IPv4 or IPv6 with TCP, UDP or
//! ICMP / `ICMPv6` echo.

use crate::{
    ct::{Flow, IPPROTO_TCP, IPPROTO_UDP, is_v4_mapped, v4_mapped},
    frame::Frame,
    headers::{
        EthHdr, ICMP_ECHO_REPLY, ICMP_ECHO_REQUEST, ICMPV6_ECHO_REPLY, ICMPV6_ECHO_REQUEST,
        IPPROTO_ICMP, IPPROTO_ICMPV6, Icmpv4Hdr, Icmpv6Hdr, Ipv4Hdr, Ipv6Hdr, TcpHdr, UdpHdr,
        echo_id_seq, ipv4_header_len, ipv4_total_len, ipv6_payload_len, is_ipv4, is_ipv6,
        is_later_fragment, tcp_flags,
    },
};

/// The flow of `frame`, or `None` for anything not tracked or too short:
/// not IPv4 or IPv6; an IPv4 non-first fragment; an IPv6 packet with an
/// extension header (fragments included) before its L4 header, or with an
/// IPv4-mapped address (it would alias an IPv4 flow's key); another
/// protocol; ICMP or `ICMPv6` other than echo (neighbour discovery, MLD,
/// errors).
#[inline(always)]
pub fn parse<F: Frame>(frame: &mut F) -> Option<Flow> {
    let mut flow = Flow::default();
    parse_into(frame, &mut flow).then_some(flow)
}

/// [`parse`] into `flow` (which must start as `Flow::default()`), `false`
/// when untracked. The kernel programs use this form: every field is
/// written in place, so the flow is one stack slot, not a copy per
/// family and per return.
#[inline(always)]
pub fn parse_into<F: Frame>(frame: &mut F, flow: &mut Flow) -> bool {
    let Some(eth) = frame.read::<EthHdr>(0) else {
        return false;
    };
    let l4 = if is_ipv4(&eth) {
        ipv4_key(frame, flow)
    } else if is_ipv6(&eth) {
        ipv6_key(frame, flow)
    } else {
        None
    };
    match l4 {
        Some(at) => l4_fields(frame, flow, at),
        None => false,
    }
}

/// [`parse_into`] for IPv4 alone: the masquerade programs translate no
/// IPv6, and this way their verifier never walks the IPv6 parser (it
/// cannot tell that an IPv6 flow's key is not an IPv4 one, and would walk
/// the whole translation for it too).
#[inline(always)]
pub fn parse_ipv4_into<F: Frame>(frame: &mut F, flow: &mut Flow) -> bool {
    let Some(eth) = frame.read::<EthHdr>(0) else {
        return false;
    };
    if !is_ipv4(&eth) {
        return false;
    }
    match ipv4_key(frame, flow) {
        Some(at) => l4_fields(frame, flow, at),
        None => false,
    }
}

/// Where a packet's L4 header starts and where its datagram ends (the
/// frame may run on: a link's minimum-size padding).
#[derive(Clone, Copy)]
struct L4At {
    start: usize,
    end: usize,
}

/// Addresses, protocol and TTL of an IPv4 packet into `flow`; where its L4
/// header is.
#[inline(always)]
fn ipv4_key<F: Frame>(frame: &mut F, flow: &mut Flow) -> Option<L4At> {
    let ip = frame.header_mut::<Ipv4Hdr>(EthHdr::LEN)?;
    let ihl = ipv4_header_len(ip);
    if ip.vihl >> 4 != 4 || !(20..=60).contains(&ihl) {
        return None;
    }
    // A non-first fragment carries no L4 header.
    if is_later_fragment(ip) {
        return None;
    }
    // The total length must cover the L4 header: a shorter packet is
    // truncated, and what follows it in the frame (a link's padding) is
    // no header of its.
    let min_l4 = match ip.proto {
        IPPROTO_TCP => TcpHdr::LEN,
        IPPROTO_UDP => UdpHdr::LEN,
        IPPROTO_ICMP => Icmpv4Hdr::LEN,
        _ => return None,
    };
    if ipv4_total_len(ip) < ihl + min_l4 {
        return None;
    }
    flow.key.saddr = v4_mapped(ip.src_addr);
    flow.key.daddr = v4_mapped(ip.dst_addr);
    flow.key.proto = ip.proto;
    flow.ttl = ip.ttl;
    Some(L4At {
        start: EthHdr::LEN + ihl,
        end: EthHdr::LEN + ipv4_total_len(ip),
    })
}

/// Addresses, next header and hop limit of an IPv6 packet whose L4 header
/// follows the fixed one into `flow`; where its L4 header is. The payload
/// length must cover that header (a shorter one is a truncated packet).
#[inline(always)]
fn ipv6_key<F: Frame>(frame: &mut F, flow: &mut Flow) -> Option<L4At> {
    // Read in place: a copy of the 40-byte header would cost the programs
    // stack they do not have.
    let ip = frame.header_mut::<Ipv6Hdr>(EthHdr::LEN)?;
    if ip.vcf[0] >> 4 != 6 || is_v4_mapped(&ip.src_addr) || is_v4_mapped(&ip.dst_addr) {
        return None;
    }
    let min_l4 = match ip.next_hdr {
        IPPROTO_TCP => TcpHdr::LEN,
        IPPROTO_UDP => UdpHdr::LEN,
        IPPROTO_ICMPV6 => Icmpv6Hdr::LEN,
        // Extension headers (fragments too) and every other protocol.
        _ => return None,
    };
    if ipv6_payload_len(ip) < min_l4 {
        return None;
    }
    flow.key.saddr = ip.src_addr;
    flow.key.daddr = ip.dst_addr;
    flow.key.proto = ip.next_hdr;
    flow.ttl = ip.hop_limit;
    Some(L4At {
        start: EthHdr::LEN + Ipv6Hdr::LEN,
        end: EthHdr::LEN + Ipv6Hdr::LEN + ipv6_payload_len(ip),
    })
}

/// The L4 part of the flow: ports, TCP flags and numbers, or the echo
/// identifier as a port (requests: destination, replies: source), the
/// sequence and the payload's first 4 bytes (within the datagram).
#[inline(always)]
fn l4_fields<F: Frame>(frame: &mut F, flow: &mut Flow, at: L4At) -> bool {
    let l4 = at.start;
    flow.len = u32::try_from(frame.wire_len()).unwrap_or(u32::MAX);
    flow.l4 = u16::try_from(l4).unwrap_or(0);
    let key = &mut flow.key;
    match key.proto {
        IPPROTO_TCP => {
            let Some(tcp) = frame.header_mut::<TcpHdr>(l4) else {
                return false;
            };
            key.sport = tcp.source;
            key.dport = tcp.dest;
            flow.tcp_flags = tcp_flags(tcp);
            flow.tcp_seq = tcp.seq;
            flow.tcp_ack = tcp.ack_seq;
        }
        IPPROTO_UDP => {
            let Some(udp) = frame.header_mut::<UdpHdr>(l4) else {
                return false;
            };
            key.sport = udp.src;
            key.dport = udp.dst;
        }
        IPPROTO_ICMP | IPPROTO_ICMPV6 => {
            // The two headers share their layout (type, code, checksum,
            // identifier, sequence).
            let Some(icmp) = frame.header_mut::<Icmpv4Hdr>(l4) else {
                return false;
            };
            let (identifier, sequence) = echo_id_seq(icmp);
            match (key.proto, icmp.type_) {
                (IPPROTO_ICMP, ICMP_ECHO_REQUEST) | (IPPROTO_ICMPV6, ICMPV6_ECHO_REQUEST) => {
                    key.dport = identifier;
                }
                (IPPROTO_ICMP, ICMP_ECHO_REPLY) | (IPPROTO_ICMPV6, ICMPV6_ECHO_REPLY) => {
                    key.sport = identifier;
                }
                _ => return false,
            }
            flow.icmp_type = icmp.type_;
            flow.icmp_seq = sequence;
            // Within the datagram: a reply the link padded must give what
            // its request gave.
            let data = l4 + Icmpv4Hdr::LEN;
            if data + 4 <= at.end {
                flow.echo_data = frame.read::<[u8; 4]>(data).unwrap_or([0; 4]);
            }
        }
        _ => return false,
    }
    true
}

#[cfg(test)]
mod tests {
    use std::vec::Vec;

    use super::*;
    use crate::{ct::TCP_SYN, frame::SliceFrame};

    const EP6: [u8; 16] = [0x20, 0x01, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    const PEER6: [u8; 16] = [0x20, 0x01, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];

    /// An IPv6 frame `src -> dst`, next header `next`, the payload length
    /// that of `l4`.
    fn frame6(src: [u8; 16], dst: [u8; 16], next: u8, l4: &[u8]) -> Vec<u8> {
        let mut f = Vec::from([0u8; 12]);
        f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
        f.extend_from_slice(&u16::try_from(l4.len()).expect("small").to_be_bytes());
        f.extend_from_slice(&[next, 64]);
        f.extend_from_slice(&src);
        f.extend_from_slice(&dst);
        f.extend_from_slice(l4);
        f
    }

    fn tcp_syn() -> [u8; 20] {
        let mut tcp = [0u8; 20];
        tcp[0..2].copy_from_slice(&40000u16.to_be_bytes());
        tcp[2..4].copy_from_slice(&4240u16.to_be_bytes());
        tcp[4..8].copy_from_slice(&0x0102_0304u32.to_be_bytes());
        tcp[8..12].copy_from_slice(&0x0a0b_0c0du32.to_be_bytes());
        tcp[12] = 0x50;
        tcp[13] = TCP_SYN;
        tcp
    }

    #[test]
    fn ipv4_addresses_are_keyed_ipv4_mapped() {
        let mut f = frame(IPPROTO_UDP, &[0, 53, 0, 53, 0, 8, 0, 0], 0);
        let flow = parse(&mut SliceFrame::new(&mut f)).expect("tracked");
        assert_eq!(flow.key.saddr, v4_mapped([198, 18, 64, 2]));
        assert_eq!(flow.key.daddr, v4_mapped([198, 18, 65, 2]));
        assert!(flow.key.is_ipv4());
    }

    #[test]
    fn the_ipv4_parser_leaves_ipv6_alone() {
        let mut v4 = frame(IPPROTO_UDP, &[0, 53, 0, 53, 0, 8, 0, 0], 0);
        let mut flow = Flow::default();
        assert!(parse_ipv4_into(&mut SliceFrame::new(&mut v4), &mut flow));
        assert_eq!(Some(flow), parse(&mut SliceFrame::new(&mut v4)));
        let mut v6 = frame6(EP6, PEER6, IPPROTO_TCP, &tcp_syn());
        let mut flow = Flow::default();
        assert!(!parse_ipv4_into(&mut SliceFrame::new(&mut v6), &mut flow));
        assert!(parse(&mut SliceFrame::new(&mut v6)).is_some());
    }

    #[test]
    fn ipv6_tcp_gives_addresses_ports_and_flags() {
        let mut f = frame6(EP6, PEER6, IPPROTO_TCP, &tcp_syn());
        let flow = parse(&mut SliceFrame::new(&mut f)).expect("tracked");
        assert_eq!((flow.key.saddr, flow.key.daddr), (EP6, PEER6));
        assert_eq!(flow.key.sport, 40000u16.to_be_bytes());
        assert_eq!(flow.key.dport, 4240u16.to_be_bytes());
        assert_eq!((flow.key.proto, flow.tcp_flags), (IPPROTO_TCP, TCP_SYN));
        assert_eq!(
            (flow.tcp_seq, flow.tcp_ack),
            ([1, 2, 3, 4], [0x0a, 0x0b, 0x0c, 0x0d])
        );
        assert_eq!(flow.len as usize, f.len());
        assert_eq!(flow.l4, 54);
        assert!(!flow.key.is_ipv4());
    }

    #[test]
    fn ipv6_udp_gives_ports() {
        let mut f = frame6(PEER6, EP6, IPPROTO_UDP, &[0x30, 0x39, 0, 53, 0, 8, 0, 0]);
        let flow = parse(&mut SliceFrame::new(&mut f)).expect("tracked");
        assert_eq!((flow.key.sport, flow.key.dport), ([0x30, 0x39], [0, 53]));
        assert_eq!(flow.key.proto, IPPROTO_UDP);
    }

    #[test]
    fn icmpv6_echo_identifier_stands_in_for_a_port() {
        let mut req = frame6(
            EP6,
            PEER6,
            IPPROTO_ICMPV6,
            &[128, 0, 0, 0, 0x12, 0x34, 0, 7],
        );
        let r = parse(&mut SliceFrame::new(&mut req)).expect("request");
        assert_eq!((r.key.sport, r.key.dport), ([0, 0], [0x12, 0x34]));
        assert_eq!((r.icmp_type, r.icmp_seq), (128, [0, 7]));
        assert!(r.is_echo_request() && !r.is_echo_reply());
        let mut rep = frame6(
            PEER6,
            EP6,
            IPPROTO_ICMPV6,
            &[129, 0, 0, 0, 0x12, 0x34, 0, 7],
        );
        let p = parse(&mut SliceFrame::new(&mut rep)).expect("reply");
        assert_eq!((p.key.sport, p.key.dport), ([0x12, 0x34], [0, 0]));
        assert!(p.is_echo_reply());
        // The reply's reversed tuple is the request's.
        assert_eq!(p.key.reversed(0), r.key);
    }

    #[test]
    fn ipv6_that_is_not_a_plain_tracked_packet_gives_none() {
        let echo = [128, 0, 0, 0, 0x12, 0x34, 0, 7];
        let mut hop_by_hop = [58, 0, 1, 4, 0, 0, 0, 0].to_vec();
        hop_by_hop.extend_from_slice(&echo);
        let mut fragment = [58, 0, 0, 1, 0, 0, 0, 9].to_vec();
        fragment.extend_from_slice(&echo);
        let mut dest_opts = [6, 0, 1, 4, 0, 0, 0, 0].to_vec();
        dest_opts.extend_from_slice(&tcp_syn());
        let mut cut_tcp = frame6(EP6, PEER6, IPPROTO_TCP, &tcp_syn());
        cut_tcp.truncate(14 + 40 + 12);
        let mut short_payload = frame6(EP6, PEER6, IPPROTO_TCP, &tcp_syn());
        short_payload[18..20].copy_from_slice(&12u16.to_be_bytes());
        let mut version4 = frame6(EP6, PEER6, IPPROTO_ICMPV6, &echo);
        version4[14] = 0x40;
        let mut mapped = v4_mapped([198, 18, 0, 1]);
        let cases: [(&str, Vec<u8>); 12] = [
            ("hop-by-hop", frame6(EP6, PEER6, 0, &hop_by_hop)),
            ("fragment", frame6(EP6, PEER6, 44, &fragment)),
            ("destination options", frame6(EP6, PEER6, 60, &dest_opts)),
            (
                "neighbour solicitation",
                frame6(EP6, PEER6, IPPROTO_ICMPV6, &[135, 0, 0, 0, 0, 0, 0, 0]),
            ),
            (
                "MLDv2 report",
                frame6(EP6, PEER6, IPPROTO_ICMPV6, &[143, 0, 0, 0, 0, 0, 0, 0]),
            ),
            (
                "destination unreachable",
                frame6(EP6, PEER6, IPPROTO_ICMPV6, &[1, 4, 0, 0, 0, 0, 0, 0]),
            ),
            (
                "ICMPv4 echo type over ICMPv6",
                frame6(EP6, PEER6, IPPROTO_ICMPV6, &[8, 0, 0, 0, 0, 1, 0, 1]),
            ),
            ("truncated TCP", cut_tcp),
            ("payload length short of TCP's header", short_payload),
            ("version 4 in an IPv6 frame", version4),
            ("GRE", frame6(EP6, PEER6, 47, &[0; 8])),
            ("IPv4-mapped source", {
                mapped[15] = 1;
                frame6(mapped, PEER6, IPPROTO_ICMPV6, &echo)
            }),
        ];
        for (what, mut f) in cases {
            assert!(parse(&mut SliceFrame::new(&mut f)).is_none(), "{what}");
        }
        let mut cut_fixed = frame6(EP6, PEER6, IPPROTO_ICMPV6, &echo);
        cut_fixed.truncate(14 + 30);
        assert!(parse(&mut SliceFrame::new(&mut cut_fixed)).is_none());
    }

    fn frame(proto: u8, l4: &[u8], frag: u16) -> Vec<u8> {
        let mut f = Vec::from([0u8; 12]);
        f.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
        f.extend_from_slice(&u16::try_from(20 + l4.len()).expect("small").to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(&frag.to_be_bytes());
        f.extend_from_slice(&[64, proto, 0, 0, 198, 18, 64, 2, 198, 18, 65, 2]);
        f.extend_from_slice(l4);
        f
    }

    #[test]
    fn tcp_syn_gives_ports_and_flags() {
        let mut tcp = [0u8; 20];
        tcp[0..2].copy_from_slice(&40000u16.to_be_bytes());
        tcp[2..4].copy_from_slice(&4240u16.to_be_bytes());
        tcp[4..8].copy_from_slice(&7u32.to_be_bytes());
        tcp[13] = TCP_SYN;
        let mut f = frame(IPPROTO_TCP, &tcp, 0x4000);
        let flow = parse(&mut SliceFrame::new(&mut f)).expect("tracked");
        assert_eq!(flow.key.sport, 40000u16.to_be_bytes());
        assert_eq!(flow.key.dport, 4240u16.to_be_bytes());
        assert_eq!(flow.tcp_flags, TCP_SYN);
        assert_eq!((flow.tcp_seq, flow.tcp_ack), ([0, 0, 0, 7], [0; 4]));
        assert_eq!(flow.len as usize, f.len());
        assert_eq!(flow.l4, 34);
    }

    #[test]
    fn icmp_echo_identifier_stands_in_for_a_port() {
        let mut req = frame(IPPROTO_ICMP, &[8, 0, 0, 0, 0x12, 0x34, 0, 7], 0);
        let r = parse(&mut SliceFrame::new(&mut req)).expect("request");
        assert_eq!((r.key.sport, r.key.dport), ([0, 0], [0x12, 0x34]));
        assert_eq!((r.icmp_type, r.icmp_seq), (8, [0, 7]));
        let mut rep = frame(IPPROTO_ICMP, &[0, 0, 0, 0, 0x12, 0x34, 0, 7], 0);
        let p = parse(&mut SliceFrame::new(&mut rep)).expect("reply");
        assert_eq!((p.key.sport, p.key.dport), ([0x12, 0x34], [0, 0]));
        assert_eq!(p.echo_data, [0; 4], "no payload");
    }

    #[test]
    fn an_echos_first_payload_bytes_are_its_data() {
        let echo = [8, 0, 0, 0, 0x12, 0x34, 0, 7, b't', b'o', b'k', b'n', b'!'];
        let mut req = frame(IPPROTO_ICMP, &echo, 0);
        let r = parse(&mut SliceFrame::new(&mut req)).expect("request");
        assert_eq!(r.echo_data, *b"tokn");
        assert_eq!(r.ttl, 64);
        // Three bytes of payload: too short to carry a tag, whatever
        // padding the link put after the datagram.
        let mut short = frame(IPPROTO_ICMP, &echo[..11], 0);
        let r = parse(&mut SliceFrame::new(&mut short)).expect("request");
        assert_eq!(r.echo_data, [0; 4]);
        short.extend_from_slice(&[0xee; 20]);
        let padded = parse(&mut SliceFrame::new(&mut short)).expect("padded");
        assert_eq!(padded.echo_data, [0; 4]);
        assert_eq!(padded.key, r.key);
        let v6 = [128, 0, 0, 0, 0x12, 0x34, 0, 7, b't', b'o', b'k', b'n'];
        let mut req6 = frame6(EP6, PEER6, IPPROTO_ICMPV6, &v6);
        let r6 = parse(&mut SliceFrame::new(&mut req6)).expect("ICMPv6 request");
        assert_eq!((r6.echo_data, r6.ttl), (*b"tokn", 64));
    }

    #[test]
    fn untracked_and_truncated_packets_give_none() {
        let mut unreachable = frame(IPPROTO_ICMP, &[3, 1, 0, 0, 0, 0, 0, 0], 0);
        assert!(parse(&mut SliceFrame::new(&mut unreachable)).is_none());
        let mut later_fragment = frame(IPPROTO_UDP, &[0; 8], 0x00b9);
        assert!(parse(&mut SliceFrame::new(&mut later_fragment)).is_none());
        let mut short = frame(IPPROTO_TCP, &[0; 6], 0);
        assert!(parse(&mut SliceFrame::new(&mut short)).is_none());
        let mut gre = frame(47, &[0; 8], 0);
        assert!(parse(&mut SliceFrame::new(&mut gre)).is_none());
        // A header alone (total length 20) in a frame padded with what
        // would read as ports: no L4 header of its own.
        for (proto, l4) in [
            (IPPROTO_TCP, &tcp_syn()[..]),
            (IPPROTO_UDP, &[0, 53, 0, 53, 0, 8, 0, 0][..]),
            (IPPROTO_ICMP, &[8, 0, 0, 0, 0x12, 0x34, 0, 1][..]),
        ] {
            let mut padded = frame(proto, l4, 0);
            padded[16..18].copy_from_slice(&20u16.to_be_bytes());
            assert!(
                parse(&mut SliceFrame::new(&mut padded)).is_none(),
                "{proto}"
            );
            // The same with its whole length is parsed.
            let mut whole = frame(proto, l4, 0);
            assert!(parse(&mut SliceFrame::new(&mut whole)).is_some(), "{proto}");
        }
    }
}
