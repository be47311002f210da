use super::*;
use crate::{
    ct::{TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN},
    flow,
    frame::SliceFrame,
};
use std::vec::Vec;

const EP: [u8; 4] = [198, 18, 64, 2];
const PEER: [u8; 4] = [198, 18, 0, 12];
const NODE: [u8; 4] = [198, 18, 0, 11];

fn cfg() -> NatConfig {
    NatConfig {
        enabled: 1,
        node_ip: NODE,
        src_net: [198, 18, 64, 0],
        src_mask: [255, 255, 255, 0],
        exclude_net: [198, 18, 64, 0],
        exclude_mask: [255, 255, 192, 0],
        port_min: 61_000,
        port_max: 65_535,
    }
}

fn frame(src: [u8; 4], dst: [u8; 4], proto: u8, l4: &[u8]) -> Vec<u8> {
    let mut f = Vec::from([0u8; 12]);
    let total = u16::try_from(20 + l4.len()).expect("small").to_be_bytes();
    f.extend_from_slice(&[
        0x08, 0x00, 0x45, 0, total[0], total[1], 0, 0, 0x40, 0, 64, proto, 0, 0,
    ]);
    f.extend_from_slice(&src);
    f.extend_from_slice(&dst);
    f.extend_from_slice(l4);
    f
}

fn parse(f: &mut [u8]) -> Flow {
    flow::parse(&mut SliceFrame::new(f)).expect("tracked")
}

#[test]
fn only_health_sources_to_outside_the_health_range_are_masqueraded() {
    let c = cfg();
    assert!(c.masquerades(EP, PEER));
    // Another node's health address: routed, not masqueraded.
    assert!(!c.masquerades(EP, [198, 18, 65, 2]));
    // The node's own traffic.
    assert!(!c.masquerades(NODE, PEER));
    // To the node itself.
    assert!(!c.masquerades(EP, NODE));
    assert!(!NatConfig { enabled: 0, ..c }.masquerades(EP, PEER));
}

#[test]
fn icmp_pair_puts_the_identifier_on_the_choosing_side() {
    let mut req = frame(EP, PEER, IPPROTO_ICMP, &[8, 0, 0, 0, 0x02, 0x01, 0, 1]);
    let (out, port) = out_key(&parse(&mut req)).expect("echo request");
    assert_eq!((out.sport, out.dport, out.dir), ([2, 1], [0, 0], DIR_OUT));
    assert_eq!(port, [2, 1]);
    let inbound = in_key(&out, NODE, 61_234u16.to_be_bytes());
    assert_eq!((inbound.saddr, inbound.daddr), (PEER, NODE));
    assert_eq!(
        (inbound.sport, inbound.dport),
        ([0, 0], 61_234u16.to_be_bytes())
    );

    // The reply as it arrives finds exactly that IN key.
    let mut reply = frame(PEER, NODE, IPPROTO_ICMP, &[0, 0, 0, 0, 0xef, 0x32, 0, 1]);
    assert_eq!(arriving_key(&parse(&mut reply)), Some(inbound));

    // And the IN entry leads back to the OUT key and the CT entry.
    let value = NatEntry {
        xlate_addr: EP,
        xlate_port: [2, 1],
        ..NatEntry::default()
    };
    assert_eq!(out_key_of(&inbound, &value), out);
    let ct = ct_key_of(&out);
    assert_eq!((ct.sport, ct.dport, ct.dir), ([0, 0], [2, 1], DIR_OUT));
    assert_eq!(
        ct,
        CtKey {
            dir: DIR_OUT,
            ..parse(&mut req).key
        }
    );
}

#[test]
fn tcp_pair_round_trips() {
    let mut tcp = [0u8; 20];
    tcp[0..2].copy_from_slice(&40_000u16.to_be_bytes());
    tcp[2..4].copy_from_slice(&4240u16.to_be_bytes());
    tcp[13] = TCP_SYN;
    let mut syn = frame(EP, PEER, IPPROTO_TCP, &tcp);
    let (out, port) = out_key(&parse(&mut syn)).expect("tcp");
    assert_eq!(port, 40_000u16.to_be_bytes());
    let inbound = in_key(&out, NODE, 61_001u16.to_be_bytes());
    let mut synack = [0u8; 20];
    synack[0..2].copy_from_slice(&4240u16.to_be_bytes());
    synack[2..4].copy_from_slice(&61_001u16.to_be_bytes());
    let mut back = frame(PEER, NODE, IPPROTO_TCP, &synack);
    assert_eq!(arriving_key(&parse(&mut back)), Some(inbound));
    let value = NatEntry {
        xlate_addr: EP,
        xlate_port: port,
        ..NatEntry::default()
    };
    assert_eq!(out_key_of(&inbound, &value), out);
    assert_eq!(
        ct_key_of(&out),
        CtKey {
            dir: DIR_OUT,
            ..parse(&mut syn).key
        }
    );
}

#[test]
fn icmp_errors_and_wrong_echo_direction_are_not_translated() {
    let mut unreachable = frame(PEER, NODE, IPPROTO_ICMP, &[3, 1, 0, 0, 0, 0, 0, 0]);
    assert!(flow::parse(&mut SliceFrame::new(&mut unreachable)).is_none());
    let mut reply_out = frame(EP, PEER, IPPROTO_ICMP, &[0, 0, 0, 0, 0, 9, 0, 1]);
    assert!(out_key(&parse(&mut reply_out)).is_none());
    let mut request_in = frame(PEER, NODE, IPPROTO_ICMP, &[8, 0, 0, 0, 0, 9, 0, 1]);
    assert!(arriving_key(&parse(&mut request_in)).is_none());
}

#[test]
fn candidates_stay_in_the_range() {
    let c = cfg();
    assert_eq!(c.range_len(), 4536);
    // The flow's own port first when it is in the range.
    assert_eq!(c.candidate(62_000, 0, 7), 62_000);
    assert_eq!(c.candidate(62_000, 1, 7), 61_007);
    // Out of range: random from the start.
    assert_eq!(c.candidate(513, 0, 4536 + 3), 61_003);
    for r in [0, 1, 4535, 4536, u32::MAX] {
        let p = c.candidate(1, 3, r);
        assert!((61_000..=65_535).contains(&p), "{p}");
    }
    let bad = NatConfig {
        port_min: 10,
        port_max: 9,
        ..c
    };
    assert_eq!((bad.range_len(), bad.candidate(10, 0, 1)), (0, 0));
    let full = NatConfig {
        port_min: 0,
        port_max: u16::MAX,
        ..c
    };
    assert_eq!(full.range_len(), 65_536);
}

/// The node's own flows on a port (or identifier) of the range are held
/// for it; its flows on other ports, and the endpoint's, are not. An
/// `IN` entry translating to the node itself is such a hold.
#[test]
fn the_nodes_own_flows_in_the_range_are_held() {
    let c = cfg();
    let ping = |src, dst, id: u16| {
        let [hi, lo] = id.to_be_bytes();
        let mut f = frame(src, dst, IPPROTO_ICMP, &[8, 0, 0, 0, hi, lo, 0, 1]);
        out_key(&parse(&mut f)).expect("echo request")
    };
    let held = |src, dst, id| {
        let (out, port) = ping(src, dst, id);
        c.node_flow_in_range(&out, port)
    };
    assert!(held(NODE, PEER, 61_000));
    assert!(held(NODE, PEER, 65_535));
    assert!(!held(NODE, PEER, 60_999), "outside the range");
    assert!(!held(EP, PEER, 61_500), "the endpoint's");
    assert!(
        !held(NODE, [198, 18, 65, 2], 61_500),
        "toward the health range"
    );
    assert!(!held(NODE, NODE, 61_500), "toward the node itself");
    let (out, port) = ping(NODE, PEER, 61_456);
    assert!(!NatConfig { enabled: 0, ..c }.node_flow_in_range(&out, port));
    let inbound = in_key(&out, NODE, port);
    let held = NatEntry {
        xlate_addr: NODE,
        xlate_port: port,
        ..NatEntry::default()
    };
    assert!(held_by_node(&inbound, &held));
    assert_eq!(
        out_key_of(&inbound, &held),
        out,
        "its owner is the node's flow"
    );
    let endpoint = NatEntry {
        xlate_addr: EP,
        ..held
    };
    assert!(!held_by_node(&inbound, &endpoint));
}

/// A hold's connection is closing once it sent a FIN or RST, and new at
/// its next SYN; an echo (no flags) changes nothing.
#[test]
fn a_holds_closing_flags_follow_its_connection() {
    let fin = NatEntry::closing_after(0, TCP_FIN | TCP_ACK);
    assert_eq!(fin, TCP_FIN);
    assert_eq!(NatEntry::closing_after(fin, TCP_ACK), TCP_FIN, "kept");
    assert_eq!(NatEntry::closing_after(fin, TCP_RST), TCP_FIN | TCP_RST);
    assert_eq!(NatEntry::closing_after(fin, TCP_SYN), 0, "a new connection");
    assert_eq!(NatEntry::closing_after(fin, 0), TCP_FIN, "an echo");
    assert_eq!(NatEntry::closing_after(0, TCP_SYN | TCP_ACK), 0);
}

#[test]
fn offsets_name_the_right_fields() {
    assert_eq!(l4_csum_offset(IPPROTO_TCP), Some(16));
    assert_eq!(l4_csum_offset(IPPROTO_UDP), Some(6));
    assert_eq!(l4_csum_offset(IPPROTO_ICMP), Some(2));
    assert_eq!(l4_csum_offset(47), None);
    assert_eq!(port_offset(IPPROTO_TCP, true), 0);
    assert_eq!(port_offset(IPPROTO_UDP, false), 2);
    assert_eq!(port_offset(IPPROTO_ICMP, true), 4);
    assert_eq!(port_offset(IPPROTO_ICMP, false), 4);
}

/// An IPv6 frame: fixed header from `src` to `dst` (`2001:2::x`) and `l4`.
fn frame6(src: u8, dst: u8, next: u8, l4: &[u8]) -> Vec<u8> {
    let mut f = Vec::from([0u8; 12]);
    f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
    f.extend_from_slice(&u16::try_from(l4.len()).expect("small").to_be_bytes());
    f.extend_from_slice(&[next, 64]);
    for last in [src, dst] {
        f.extend_from_slice(&[0x20, 0x01, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, last]);
    }
    f.extend_from_slice(l4);
    f
}

#[test]
fn ipv6_flows_have_no_nat_keys() {
    let mut tcp = [0u8; 20];
    tcp[0..2].copy_from_slice(&40_000u16.to_be_bytes());
    tcp[2..4].copy_from_slice(&4240u16.to_be_bytes());
    tcp[13] = TCP_SYN;
    let mut syn = frame6(1, 2, IPPROTO_TCP, &tcp);
    let flow = parse(&mut syn);
    assert!(!flow.key.is_ipv4());
    assert_eq!(out_key(&flow), None);
    assert_eq!(arriving_key(&flow), None);
    let mut echo = frame6(1, 2, 58, &[128, 0, 0, 0, 0, 9, 0, 1]);
    let flow = parse(&mut echo);
    assert_eq!((out_key(&flow), arriving_key(&flow)), (None, None));
    let mut reply = frame6(2, 1, 58, &[129, 0, 0, 0, 0, 9, 0, 1]);
    assert_eq!(arriving_key(&parse(&mut reply)), None);
    // The IPv4 flows still have theirs.
    let mut req = frame(EP, PEER, IPPROTO_ICMP, &[8, 0, 0, 0, 0x02, 0x01, 0, 1]);
    let (out, _) = out_key(&parse(&mut req)).expect("IPv4 echo");
    assert_eq!((out.saddr, out.daddr), (EP, PEER));
}

/// The hello server's segments answer connections from outside; the
/// endpoint's own flows, from other ports, are masqueraded.
#[test]
fn segments_from_the_hello_port_answer_inbound_connections() {
    let segment = |sport: u16, flags: u8| {
        let mut tcp = [0u8; 20];
        tcp[0..2].copy_from_slice(&sport.to_be_bytes());
        tcp[2..4].copy_from_slice(&40_000u16.to_be_bytes());
        tcp[12] = 0x50;
        tcp[13] = flags;
        let mut f = frame(EP, PEER, IPPROTO_TCP, &tcp);
        answers_inbound(&parse(&mut f))
    };
    for flags in [TCP_SYN | TCP_ACK, TCP_ACK, 0x04, 0x18, 0x11] {
        assert!(segment(4240, flags), "{flags:#x}");
        assert!(!segment(40_001, flags), "{flags:#x}");
    }
    let mut udp = frame(EP, PEER, IPPROTO_UDP, &[0x10, 0x90, 0, 53, 0, 8, 0, 0]);
    assert!(!answers_inbound(&parse(&mut udp)), "UDP from 4240");
}

#[test]
fn a_reset_makes_no_hold() {
    assert!(makes_hold(0), "an echo or a datagram");
    assert!(makes_hold(TCP_SYN) && makes_hold(TCP_ACK) && makes_hold(TCP_FIN | TCP_ACK));
    assert!(!makes_hold(TCP_RST) && !makes_hold(TCP_RST | TCP_ACK));
}
