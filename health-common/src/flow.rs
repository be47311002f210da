//! Extracting a tracked flow from a frame: IPv4 with TCP, UDP or ICMP echo.

use crate::{
    ct::{CtKey, Flow, IPPROTO_TCP, IPPROTO_UDP},
    frame::Frame,
    headers::{
        EthHdr, ICMP_ECHO_REPLY, ICMP_ECHO_REQUEST, IPPROTO_ICMP, Icmpv4Hdr, Ipv4Hdr, TcpHdr,
        UdpHdr, echo_id_seq, ipv4_header_len, is_ipv4, is_later_fragment, tcp_flags,
    },
};

/// The flow of `frame`, or `None` for anything not tracked (not IPv4, a
/// non-first fragment, another protocol, ICMP other than echo) or too short.
#[inline(always)]
pub fn parse<F: Frame>(frame: &mut F) -> Option<Flow> {
    let eth = frame.read::<EthHdr>(0)?;
    if !is_ipv4(&eth) {
        return None;
    }
    let ip = *frame.header_mut::<Ipv4Hdr>(EthHdr::LEN)?;
    let ihl = ipv4_header_len(&ip);
    if ip.vihl >> 4 != 4 || !(20..=60).contains(&ihl) {
        return None;
    }
    // A non-first fragment carries no L4 header.
    if is_later_fragment(&ip) {
        return None;
    }
    let l4 = EthHdr::LEN + ihl;
    let mut key = CtKey {
        saddr: ip.src_addr,
        daddr: ip.dst_addr,
        proto: ip.proto,
        ..CtKey::default()
    };
    let mut flow = Flow {
        len: u32::try_from(frame.wire_len()).unwrap_or(u32::MAX),
        l4: u16::try_from(l4).unwrap_or(0),
        ..Flow::default()
    };
    match ip.proto {
        IPPROTO_TCP => {
            let tcp = *frame.header_mut::<TcpHdr>(l4)?;
            key.sport = tcp.source;
            key.dport = tcp.dest;
            flow.tcp_flags = tcp_flags(&tcp);
        }
        IPPROTO_UDP => {
            let udp = *frame.header_mut::<UdpHdr>(l4)?;
            key.sport = udp.src;
            key.dport = udp.dst;
        }
        IPPROTO_ICMP => {
            let icmp = *frame.header_mut::<Icmpv4Hdr>(l4)?;
            let (identifier, sequence) = echo_id_seq(&icmp);
            match icmp.type_ {
                ICMP_ECHO_REQUEST => key.dport = identifier,
                ICMP_ECHO_REPLY => key.sport = identifier,
                _ => return None,
            }
            flow.icmp_type = icmp.type_;
            flow.icmp_seq = sequence;
        }
        _ => return None,
    }
    flow.key = key;
    Some(flow)
}

#[cfg(test)]
mod tests {
    use std::vec::Vec;

    use super::*;
    use crate::{ct::TCP_SYN, frame::SliceFrame};

    fn frame(proto: u8, l4: &[u8], frag: u16) -> Vec<u8> {
        let mut f = Vec::from([0u8; 12]);
        f.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 0, 0, 0]);
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
        tcp[13] = TCP_SYN;
        let mut f = frame(IPPROTO_TCP, &tcp, 0x4000);
        let flow = parse(&mut SliceFrame::new(&mut f)).expect("tracked");
        assert_eq!(flow.key.sport, 40000u16.to_be_bytes());
        assert_eq!(flow.key.dport, 4240u16.to_be_bytes());
        assert_eq!(flow.tcp_flags, TCP_SYN);
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
    }
}
