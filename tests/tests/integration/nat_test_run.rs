//! The masquerade programs (tcx on the node's uplink) run by the kernel on
//! crafted packets: SNAT to the node IP with a collision-free port or echo
//! identifier, valid checksums, the reverse translation of replies, the
//! pair of entries in `NAT_MAP`, and what happens when no port is free.

use health_common::maps::ProgId;
use std::net::Ipv4Addr;

use health_agent::{datapath::Datapath, datapath::nat};
use health_common::{ct::CtConfig, nat::NatConfig};
use health_tests::{
    nat_setup::{EP, EP2, NODE, PEER, PEER_HEALTH, PEER2, config},
    packets::{self, Echo, verify_frame},
    pins::PinDir,
    require_root,
};

use health_tests::tc_run::TCX_NEXT;
const TC_ACT_SHOT: u32 = 2;

fn loaded(cfg: NatConfig) -> (Datapath, PinDir) {
    require_root();
    let pins = PinDir::new();
    let mut r = Datapath::load(pins.path()).expect("load");
    r.set_ct_config(CtConfig::default()).expect("ct config");
    r.set_nat_config(cfg).expect("nat config");
    (r, pins)
}

/// Runs the egress (SNAT) or ingress program: its verdict and the frame.
fn run(r: &mut Datapath, egress: bool, input: &[u8]) -> (u32, Vec<u8>) {
    let prog = if egress {
        ProgId::NatEgress
    } else {
        ProgId::NatIngress
    };
    health_tests::tc_run::run(r, prog, input)
}

/// Runs and asserts the packet went on, returning it checked.
fn pass(r: &mut Datapath, egress: bool, input: &[u8]) -> Vec<u8> {
    let (verdict, out) = run(r, egress, input);
    assert_eq!(verdict, TCX_NEXT, "handed on");
    assert_eq!(out.len(), input.len(), "length kept");
    verify_frame(&out).expect("checksums valid after the rewrite");
    out
}

fn echo_id(frame: &[u8]) -> u16 {
    u16::from_be_bytes([frame[38], frame[39]])
}

fn counter(pins: &PinDir, name: &str) -> u64 {
    health_tests::counter(&nat::counters(pins.path()).expect("counters"), name)
}

#[test]
fn an_echo_is_masqueraded_and_its_reply_translated_back() {
    let (mut r, pins) = loaded(config(61_000, 65_535));
    let req = Echo::request(EP, PEER, 0x0201, 1);
    let out = pass(&mut r, true, &req.frame());
    let (src, dst, _, icmp) = verify_frame(&out).expect("valid");
    assert_eq!((src, dst), (NODE, PEER), "the peer sees the node IP");
    let id = echo_id(&out);
    assert!((61_000..=65_535).contains(&id), "identifier {id} in range");
    assert_eq!(&icmp[6..], &req.frame()[40..], "sequence and payload kept");
    assert_eq!(
        out[..24],
        req.frame()[..24],
        "headers before the checksum untouched"
    );

    // The pair, as `bpf nat list` shows it.
    let rows = nat::list(pins.path()).expect("nat list");
    assert_eq!(rows.len(), 2, "{rows:#?}");
    let (o, i) = (&rows[0], &rows[1]);
    assert_eq!(
        (
            o.proto,
            o.dir,
            o.src,
            o.sport,
            o.dst,
            o.dport,
            o.xlate,
            o.xlate_addr,
            o.xlate_port
        ),
        ("ICMP", "OUT", EP, 0x0201, PEER, 0, "XLATE_SRC", NODE, id)
    );
    assert_eq!(
        (
            i.dir,
            i.src,
            i.sport,
            i.dst,
            i.dport,
            i.xlate,
            i.xlate_addr,
            i.xlate_port
        ),
        ("IN", PEER, 0, NODE, id, "XLATE_DST", EP, 0x0201)
    );

    // The peer's reply, to the node IP and the allocated identifier.
    let mut reply = req.expected_reply();
    reply.dst = NODE;
    reply.identifier = id;
    let back = pass(&mut r, false, &reply.frame());
    let (src, dst, _, _) = verify_frame(&back).expect("valid");
    assert_eq!((src, dst, echo_id(&back)), (PEER, EP, 0x0201));

    // The next request of the flow reuses the pair.
    let again = pass(&mut r, true, &Echo::request(EP, PEER, 0x0201, 2).frame());
    assert_eq!(echo_id(&again), id);
    assert_eq!(nat::list(pins.path()).expect("nat").len(), 2);
    assert_eq!(
        (
            counter(&pins, "snat"),
            counter(&pins, "rev_snat"),
            counter(&pins, "created")
        ),
        (2, 1, 1)
    );
}

/// A flow whose reverse half the LRU evicted, and whose port another flow
/// claimed since, starts over on a port of its own: the two never share
/// a wire tuple, and the other flow's entry is left to it, by the kernel
/// and by the agent's collector.
#[test]
fn a_flow_whose_port_was_claimed_after_an_eviction_moves_to_a_port_of_its_own() {
    use aya::maps::HashMap;
    use health_common::{
        maps::MapId,
        nat::{NatEntry, NatKey},
    };

    let (mut r, pins) = loaded(config(61_000, 65_535));
    let first = echo_id(&pass(
        &mut r,
        true,
        &Echo::request(EP, PEER, 0x0201, 1).frame(),
    ));
    let mut opened =
        health_agent::datapath::maps::open(pins.path(), MapId::NatMap).expect("NAT_MAP");
    let mut map = HashMap::<_, NatKey, NatEntry>::try_from(&mut opened).expect("NAT_MAP");
    let inbound = map
        .keys()
        .filter_map(Result::ok)
        .find(|k| k.dir == health_common::ct::DIR_IN)
        .expect("the reverse half");
    assert_eq!(u16::from_be_bytes(inbound.dport), first);
    // Evicted, then claimed by another endpoint's flow.
    map.remove(&inbound).expect("evicted");
    let theirs = NatEntry {
        xlate_addr: EP2.octets(),
        xlate_port: 0x0333u16.to_be_bytes(),
        ..NatEntry::default()
    };
    map.insert(&inbound, &theirs, 0).expect("claimed");

    let moved = echo_id(&pass(
        &mut r,
        true,
        &Echo::request(EP, PEER, 0x0201, 2).frame(),
    ));
    assert_ne!(moved, first, "the port is the other flow's");
    assert_eq!(map.get(&inbound, 0).expect("still there"), theirs);
    // The reply to the new port comes back to this flow.
    let mut reply = Echo::request(PEER, NODE, moved, 2);
    reply.kind = 0;
    let back = pass(&mut r, false, &reply.frame());
    let (_, dst, _, _) = verify_frame(&back).expect("valid");
    assert_eq!((dst, echo_id(&back)), (EP, 0x0201));

    // A flow long over whose port another flow (recent) claimed: the
    // collector removes the old flow, not the other's reverse half.
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("clock");
    let now_ns = u64::try_from(now.tv_sec()).expect("time") * 1_000_000_000;
    let old = NatKey {
        sport: 0x0444u16.to_be_bytes(),
        ..inbound_out(&inbound)
    };
    let port = 0x0f00u16.to_be_bytes();
    let over = NatEntry {
        xlate_addr: NODE.octets(),
        xlate_port: port,
        ..NatEntry::default()
    };
    map.insert(&old, &over, 0).expect("an old flow");
    let claimed = health_common::nat::in_key(&old, NODE.octets(), port);
    let recent = NatEntry {
        created_ns: now_ns,
        last_ns: now_ns,
        ..theirs
    };
    map.insert(&claimed, &recent, 0).expect("claimed since");
    assert!(nat::gc(pins.path()).expect("gc") >= 1);
    assert!(map.get(&old, 0).is_err(), "the old flow collected");
    assert_eq!(map.get(&claimed, 0).expect("the other flow's kept"), recent);
}

/// The `OUT` key of the flow `EP -> PEER` whose reverse half is `inbound`
/// (as an endpoint's echo, identifier aside).
fn inbound_out(inbound: &health_common::nat::NatKey) -> health_common::nat::NatKey {
    health_common::nat::NatKey {
        saddr: EP.octets(),
        daddr: inbound.saddr,
        sport: [0, 0],
        dport: inbound.sport,
        proto: inbound.proto,
        dir: health_common::ct::DIR_OUT,
        pad: [0; 2],
    }
}

#[test]
fn two_endpoints_with_the_same_identifier_never_share_a_node_port() {
    let (mut r, pins) = loaded(config(61_000, 65_535));
    // 62000 is in the range: the first flow keeps it, the second cannot.
    let a = pass(&mut r, true, &Echo::request(EP, PEER, 62_000, 1).frame());
    let b = pass(&mut r, true, &Echo::request(EP2, PEER, 62_000, 1).frame());
    assert_eq!(echo_id(&a), 62_000, "kept: nothing to rewrite");
    assert_ne!(echo_id(&b), echo_id(&a), "no collision");
    // Many more flows from both, all with the same identifier per source.
    let mut ids = vec![echo_id(&a), echo_id(&b)];
    for n in 0..50u8 {
        let src = Ipv4Addr::new(198, 18, 64, 10 + n);
        ids.push(echo_id(&pass(
            &mut r,
            true,
            &Echo::request(src, PEER, 62_000, 1).frame(),
        )));
    }
    let mut unique = ids.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), ids.len(), "identifiers collide: {ids:?}");
    // Each reply goes back to its own source.
    for (src, id) in [(EP, echo_id(&a)), (EP2, echo_id(&b))] {
        let mut reply = Echo::request(PEER, NODE, id, 1);
        reply.kind = 0;
        let back = pass(&mut r, false, &reply.frame());
        let (_, dst, _, _) = verify_frame(&back).expect("valid");
        assert_eq!((dst, echo_id(&back)), (src, 62_000));
    }
    assert_eq!(nat::list(pins.path()).expect("nat").len(), 2 * ids.len());
}

/// The node's own ping on an identifier of the range, toward a peer an
/// endpoint flow holds that identifier for: the node's flow takes it (its
/// request and reply, and an error about it, pass as they are), the
/// endpoint's flow moves to another identifier, and no endpoint flow is
/// given it while the node's flow lives. The node's flows outside the
/// range, or toward the health range, hold nothing.
#[test]
fn the_nodes_own_flows_in_the_range_keep_their_replies() {
    let (mut r, pins) = loaded(config(61_000, 65_535));
    let taken = echo_id(&pass(
        &mut r,
        true,
        &Echo::request(EP, PEER, 0x0201, 1).frame(),
    ));
    let own = Echo::request(NODE, PEER, taken, 1);
    assert_eq!(run(&mut r, true, &own.frame()), (TCX_NEXT, own.frame()));
    let translated = counter(&pins, "rev_snat");
    let reply = own.expected_reply().frame();
    assert_eq!(
        run(&mut r, false, &reply),
        (TCX_NEXT, reply),
        "the node's reply"
    );
    let err = icmp_error(3, &own.frame(), 28);
    assert_eq!(
        run(&mut r, false, &err),
        (TCX_NEXT, err),
        "an error about it"
    );
    assert_eq!(counter(&pins, "node_held"), 1);
    assert_eq!(counter(&pins, "rev_snat"), translated, "nothing translated");
    let held: Vec<_> = nat::list(pins.path())
        .expect("nat list")
        .into_iter()
        .filter(|row| row.xlate == "HELD_BY_NODE")
        .map(|row| (row.src, row.dst, row.dport, row.xlate_addr))
        .collect();
    assert_eq!(held, [(PEER, NODE, taken, NODE)]);

    // The endpoint's flow moves, and its replies still reach it.
    let moved = echo_id(&pass(
        &mut r,
        true,
        &Echo::request(EP, PEER, 0x0201, 2).frame(),
    ));
    assert_ne!(moved, taken);
    let mut to_ep = Echo::request(PEER, NODE, moved, 2);
    to_ep.kind = 0;
    let back = pass(&mut r, false, &to_ep.frame());
    assert_eq!(verify_frame(&back).expect("valid").1, EP);
    // A new endpoint flow whose own identifier it is goes elsewhere too.
    let other = echo_id(&pass(
        &mut r,
        true,
        &Echo::request(EP2, PEER, taken, 1).frame(),
    ));
    assert_ne!(other, taken);
    // The node's next request keeps its hold, and makes no other; its
    // pings outside the range hold nothing.
    let rows = nat::list(pins.path()).expect("nat").len();
    let again = Echo::request(NODE, PEER, taken, 2).frame();
    assert_eq!(run(&mut r, true, &again), (TCX_NEXT, again));
    let outside = Echo::request(NODE, PEER, 0x0100, 1).frame();
    assert_eq!(run(&mut r, true, &outside), (TCX_NEXT, outside));
    // Toward the health range, where no endpoint flow is masqueraded.
    let routed = Echo::request(NODE, PEER_HEALTH, taken, 1).frame();
    assert_eq!(run(&mut r, true, &routed), (TCX_NEXT, routed));
    assert_eq!(nat::list(pins.path()).expect("nat").len(), rows);
    assert_eq!(counter(&pins, "node_held"), 1);

    // The collector leaves a live hold, and removes one idle past its
    // lifetime: an echo's, and a TCP connection's once it sent its reset
    // (1 s each here); an open connection's is hours.
    r.set_ct_config(CtConfig {
        icmp_s: 1,
        tcp_closed_s: 1,
        ..CtConfig::default()
    })
    .expect("ct config");
    let node_tcp = |port, flags| packets::tcp(NODE, PEER2, (port, 4240), flags, b"");
    for out in [
        Echo::request(NODE, PEER2, 61_777, 1).frame(),
        node_tcp(61_888, 0x02),
        node_tcp(61_889, 0x02),
        node_tcp(61_889, 0x04),
    ] {
        assert_eq!(run(&mut r, true, &out), (TCX_NEXT, out));
    }
    std::thread::sleep(std::time::Duration::from_millis(1_500));
    let live = Echo::request(NODE, PEER, taken, 3).frame();
    assert_eq!(run(&mut r, true, &live), (TCX_NEXT, live));
    nat::gc(pins.path()).expect("gc");
    let mut left: Vec<_> = nat::list(pins.path())
        .expect("nat list")
        .into_iter()
        .filter(|row| row.xlate == "HELD_BY_NODE")
        .map(|row| (row.src, row.dport))
        .collect();
    left.sort_unstable();
    assert_eq!(
        left,
        [(PEER, taken), (PEER2, 61_888)],
        "the idle echo's and the reset connection's holds went"
    );
}

/// Resets the node sends from ports of the range (its kernel's answers
/// to a sender's segments for ports without a socket) hold no port: an
/// endpoint flow toward that peer still gets one, whichever port the
/// resets came from.
#[test]
fn resets_the_node_sends_hold_no_port() {
    let (mut r, pins) = loaded(config(61_000, 61_031));
    for port in 61_000..=61_031 {
        let rst = packets::tcp(NODE, PEER, (port, 4240), 0x14, b"");
        assert_eq!(run(&mut r, true, &rst), (TCX_NEXT, rst));
    }
    assert_eq!(counter(&pins, "node_held"), 0);
    assert_eq!(
        nat::list(pins.path()).expect("nat").len(),
        0,
        "no hold made"
    );
    let syn = packets::tcp(EP, PEER, (40_000, 4240), 0x02, b"");
    let (verdict, out) = run(&mut r, true, &syn);
    assert_eq!(verdict, TCX_NEXT, "translated, not dropped");
    assert_eq!(out[26..30], NODE.octets(), "from the node's address");
    assert_eq!(counter(&pins, "alloc_failures"), 0);
}

#[test]
fn tcp_and_udp_get_ports_and_valid_checksums() {
    let (mut r, pins) = loaded(config(61_000, 65_535));
    let syn = packets::tcp(EP, PEER, (40_000, 4240), 0x02, b"");
    let out = pass(&mut r, true, &syn);
    let (src, _, proto, seg) = verify_frame(&out).expect("valid");
    let port = u16::from_be_bytes([seg[0], seg[1]]);
    assert_eq!(
        (src, proto, u16::from_be_bytes([seg[2], seg[3]])),
        (NODE, 6, 4240)
    );
    assert!((61_000..=65_535).contains(&port));
    let synack = packets::tcp(PEER, NODE, (4240, port), 0x12, b"");
    let back = pass(&mut r, false, &synack);
    let (_, dst, _, seg) = verify_frame(&back).expect("valid");
    assert_eq!((dst, u16::from_be_bytes([seg[2], seg[3]])), (EP, 40_000));
    // Data segments of the same flow keep the port.
    let data = pass(
        &mut r,
        true,
        &packets::tcp(EP, PEER, (40_000, 4240), 0x18, b"GET /hello"),
    );
    assert_eq!(u16::from_be_bytes([data[34], data[35]]), port);
    // A segment of a flow whose pair is gone (evicted, collected) never
    // leaves with the endpoint's own address.
    let orphan = pass(
        &mut r,
        true,
        &packets::tcp(EP, PEER, (40_002, 4240), 0x10, b""),
    );
    assert_eq!(verify_frame(&orphan).expect("valid").0, NODE);

    for checksum in [true, false] {
        let sport = if checksum { 5353 } else { 5354 };
        let out = pass(
            &mut r,
            true,
            &packets::udp_datagram(EP, PEER, (sport, 53), checksum),
        );
        assert_eq!(
            out[40..42] == [0, 0],
            !checksum,
            "a zero UDP checksum stays zero, a real one is updated"
        );
    }
    assert_eq!(counter(&pins, "created"), 4);
}

/// An ICMP error from `ROUTER` to the node, type `t`, quoting the first
/// `quoted` bytes of the IP packet of `frame`.
fn icmp_error(t: u8, frame: &[u8], quoted: usize) -> Vec<u8> {
    const ROUTER: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
    let mut icmp = vec![t, 4, 0, 0, 0, 0, 0x05, 0x00];
    icmp.extend_from_slice(&frame[14..14 + quoted]);
    let c = packets::inet_checksum(&icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    let mut ip = packets::ipv4_header(ROUTER, NODE, 1, 64, 7, icmp.len());
    ip.extend_from_slice(&icmp);
    packets::ethernet([2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 1], 0x0800, &ip)
}

/// A router's error about a masqueraded probe (fragmentation needed, a
/// host unreachable, a TTL exceeded) reaches the endpoint as it would
/// without masquerade: to its address, quoting its own address and port,
/// every checksum valid. An error about the node's own traffic passes as
/// it is.
#[test]
fn icmp_errors_about_masqueraded_flows_are_translated_back() {
    let (mut r, pins) = loaded(config(61_000, 65_535));
    let syn = packets::tcp(EP, PEER, (40_000, 4240), 0x02, b"");
    let out = pass(&mut r, true, &syn);
    let echo = pass(&mut r, true, &Echo::request(EP, PEER, 0x0201, 1).frame());
    let before = counter(&pins, "rev_snat");
    // The whole packet quoted, and only its header and 8 bytes.
    for (t, sent, quoted, port_at) in [
        (3, &out, out.len() - 14, 20),
        (11, &out, 28, 20),
        (3, &echo, 28, 24),
        (12, &echo, echo.len() - 14, 24),
    ] {
        let err = icmp_error(t, sent, quoted);
        let back = pass(&mut r, false, &err);
        let (src, dst, proto, icmp) = verify_frame(&back).expect("checksums valid");
        assert_eq!(
            (src, dst, proto, icmp[0]),
            (Ipv4Addr::new(198, 18, 0, 1), EP, 1, t)
        );
        let quote = &icmp[8..];
        assert_eq!(
            packets::inet_checksum(&quote[..20]),
            0,
            "the quoted header's checksum"
        );
        assert_eq!(
            Ipv4Addr::new(quote[12], quote[13], quote[14], quote[15]),
            EP,
            "the quoted source"
        );
        let original = if port_at == 20 { 40_000 } else { 0x0201 };
        assert_eq!(
            u16::from_be_bytes([quote[port_at], quote[port_at + 1]]),
            original,
            "the quoted port or identifier"
        );
        assert_eq!(&quote[16..20], &sent[30..34], "the quoted destination kept");
    }
    assert_eq!(counter(&pins, "rev_snat"), before + 4);

    // About the node's own traffic (a port NAT never handed out), or cut
    // inside the quoted ports: passed as they are.
    let own = packets::tcp(NODE, PEER, (40_000, 4240), 0x02, b"");
    for err in [icmp_error(3, &own, 28), icmp_error(3, &out, 22)] {
        let (verdict, passed) = run(&mut r, false, &err);
        assert_eq!((verdict, passed), (TCX_NEXT, err));
    }
    assert_eq!(counter(&pins, "rev_snat"), before + 4);
}

#[test]
fn traffic_that_is_not_masqueraded_is_untouched() {
    let (mut r, pins) = loaded(config(61_000, 65_535));
    let cases = [
        // To another node's health address: routed.
        (true, Echo::request(EP, PEER_HEALTH, 7, 1).frame()),
        // The node's own traffic.
        (true, Echo::request(NODE, PEER, 7, 1).frame()),
        (true, packets::tcp(NODE, PEER, (40_000, 4240), 0x02, b"")),
        // Replies to the node's own flows (no NAT entry).
        (false, packets::tcp(PEER, NODE, (4240, 62_000), 0x12, b"")),
        // The endpoint answering a ping: echo replies are not SNATed.
        (true, Echo::request(PEER, EP, 7, 1).expected_reply().frame()),
        // The endpoint answering a connection from outside (a peer that
        // probes from its node): its SYN-ACK, data and reset are no flow
        // it opened, and leave as they are.
        (true, packets::tcp(EP, PEER, (4240, 40_000), 0x12, b"")),
        (true, packets::tcp(EP, PEER, (4240, 40_000), 0x18, b"ok")),
        (true, packets::tcp(EP, PEER, (4240, 40_000), 0x04, b"")),
    ];
    for (egress, input) in &cases {
        let (verdict, out) = run(&mut r, *egress, input);
        assert_eq!((verdict, &out), (TCX_NEXT, input));
    }
    assert_eq!(
        nat::list(pins.path()).expect("nat").len(),
        0,
        "nothing translated"
    );
    // Masquerade off: even the endpoint's traffic to a node IP passes as is.
    r.set_nat_config(NatConfig::default()).expect("off");
    let req = Echo::request(EP, PEER, 7, 1).frame();
    assert_eq!(run(&mut r, true, &req), (TCX_NEXT, req));
}

#[test]
fn no_free_port_drops_the_packet_and_counts_it() {
    // A one-port range: the second flow cannot be masqueraded.
    let (mut r, pins) = loaded(config(61_000, 61_000));
    let first = pass(&mut r, true, &Echo::request(EP, PEER, 9, 1).frame());
    assert_eq!(echo_id(&first), 61_000);
    let (verdict, _) = run(&mut r, true, &Echo::request(EP2, PEER, 9, 1).frame());
    assert_eq!(
        verdict, TC_ACT_SHOT,
        "never sent with the endpoint's address"
    );
    assert_eq!(counter(&pins, "alloc_failures"), 1);
    // The same port toward another peer is free: pairs are per peer.
    let other = pass(&mut r, true, &Echo::request(EP2, PEER2, 9, 1).frame());
    assert_eq!(echo_id(&other), 61_000);
}

#[test]
fn malformed_packets_pass_unchanged() {
    let (mut r, pins) = loaded(config(61_000, 65_535));
    let mut cut_tcp = packets::tcp(EP, PEER, (1, 2), 0x02, b"");
    cut_tcp.truncate(14 + 20 + 6);
    let mut bad_ihl = Echo::request(EP, PEER, 1, 1).frame();
    bad_ihl[14] = 0x43;
    let cases = [
        cut_tcp,
        bad_ihl,
        packets::ipv6_echo(&Echo::request(EP, PEER, 1, 1)),
        packets::ethernet([0xff; 6], [2, 0, 0, 0, 0, 1], 0x0806, &[0; 28]),
        vec![0u8; 14],
    ];
    for input in &cases {
        for egress in [true, false] {
            assert_eq!(run(&mut r, egress, input), (TCX_NEXT, input.clone()));
        }
    }
    assert_eq!(
        nat::list(pins.path()).expect("nat").len(),
        0,
        "nothing translated"
    );
}

/// Runs a fragment and asserts it went on, its length kept and its IPv4
/// header's checksum valid (its L4 checksum covers the whole datagram, so
/// it is checked after reassembly).
fn pass_fragment(r: &mut Datapath, egress: bool, input: &[u8]) -> Vec<u8> {
    let (verdict, out) = run(r, egress, input);
    assert_eq!(verdict, TCX_NEXT, "handed on");
    assert_eq!(out.len(), input.len(), "length kept");
    assert_eq!(
        packets::inet_checksum(&out[14..34]),
        0,
        "header checksum valid"
    );
    out
}

/// Each fragment of `whole` (split after `at` payload bytes) through the
/// program, and the datagram they make at the far end.
fn through_in_fragments(r: &mut Datapath, egress: bool, whole: &[u8], at: usize) -> Vec<u8> {
    let [first, last] = packets::split_fragments(whole, at);
    let first = pass_fragment(r, egress, &first);
    let last = pass_fragment(r, egress, &last);
    packets::reassemble(&first, &last).expect("the fragments make one datagram")
}

/// A datagram in fragments, either way: the first is translated as a whole
/// datagram would be, the later ones take the same address, and the
/// datagram they make has every checksum right.
#[test]
fn the_later_fragments_of_a_masqueraded_datagram_follow_its_first() {
    let (mut r, pins) = loaded(config(61_000, 65_535));
    let udp = packets::udp_datagram(EP, PEER, (5353, 53), true);
    let sent = through_in_fragments(&mut r, true, &udp, 8);
    let (src, dst, _, seg) = verify_frame(&sent).expect("valid at the peer");
    let port = u16::from_be_bytes([seg[0], seg[1]]);
    assert_eq!((src, dst), (NODE, PEER));
    assert!((61_000..=65_535).contains(&port), "port {port}");
    let echo = Echo::request(EP, PEER, 0x0201, 1);
    let sent = through_in_fragments(&mut r, true, &echo.frame(), 16);
    let (src, _, _, _) = verify_frame(&sent).expect("valid at the peer");
    let id = echo_id(&sent);
    assert_eq!(src, NODE);

    // The replies, in fragments too.
    let reply = packets::udp_datagram(PEER, NODE, (53, port), true);
    let back = through_in_fragments(&mut r, false, &reply, 8);
    let (_, dst, _, seg) = verify_frame(&back).expect("valid at the endpoint");
    assert_eq!((dst, u16::from_be_bytes([seg[2], seg[3]])), (EP, 5353));
    let mut reply = Echo::request(PEER, NODE, id, 1);
    reply.kind = 0;
    let back = through_in_fragments(&mut r, false, &reply.frame(), 16);
    let (_, dst, _, _) = verify_frame(&back).expect("valid at the endpoint");
    assert_eq!((dst, echo_id(&back)), (EP, 0x0201));

    let records = nat::fragments(pins.path()).expect("fragment map");
    let seen: Vec<_> = records
        .iter()
        .map(|f| (f.dir, f.proto, f.src, f.dst, f.xlate_addr))
        .collect();
    assert_eq!(
        seen,
        [
            ("OUT", "ICMP", EP, PEER, NODE),
            ("OUT", "UDP", EP, PEER, NODE),
            ("IN", "ICMP", PEER, NODE, EP),
            ("IN", "UDP", PEER, NODE, EP),
        ]
    );
    assert_eq!(
        [
            "snat",
            "rev_snat",
            "frag_snat",
            "frag_rev_snat",
            "frag_dropped"
        ]
        .map(|c| counter(&pins, c)),
        [2, 2, 2, 2, 0]
    );
}

/// The fragment of `whole` after its first `at` payload bytes, with the
/// identification `id`.
fn later_fragment(whole: &[u8], at: usize, id: u16) -> Vec<u8> {
    let [_, mut last] = packets::split_fragments(whole, at);
    last[18..20].copy_from_slice(&id.to_be_bytes());
    packets::fix_ip_checksum(&mut last);
    last
}

/// A later fragment masquerade covers whose first fragment was not
/// translated (never seen, or dropped for want of a port) is dropped, never
/// sent with the endpoint's address; the node's own, those routed, those
/// of protocols masquerade leaves alone and those arriving for the node
/// pass as they are.
#[test]
fn a_later_fragment_without_its_first_translated_is_dropped_leaving_and_passed_arriving() {
    // A one-port range: the second flow cannot be masqueraded.
    let (mut r, pins) = loaded(config(61_000, 61_000));
    let udp = |src, dst| packets::udp_datagram(src, dst, (5353, 53), true);
    let (verdict, _) = run(&mut r, true, &later_fragment(&udp(EP, PEER), 8, 7));
    assert_eq!(verdict, TC_ACT_SHOT, "its first was never seen");

    let [first, _] = packets::split_fragments(&udp(EP, PEER), 8);
    pass_fragment(&mut r, true, &first);
    let mut other = udp(EP2, PEER);
    other[18..20].copy_from_slice(&9u16.to_be_bytes());
    packets::fix_ip_checksum(&mut other);
    let [first, last] = packets::split_fragments(&other, 8);
    assert_eq!(run(&mut r, true, &first).0, TC_ACT_SHOT, "no port for it");
    assert_eq!(run(&mut r, true, &last).0, TC_ACT_SHOT, "nor for its rest");
    assert_eq!(counter(&pins, "frag_dropped"), 2);

    let mut gre = udp(EP, PEER);
    gre[23] = 47;
    packets::fix_ip_checksum(&mut gre);
    let untouched = [
        (true, later_fragment(&udp(NODE, PEER), 8, 7)),
        (true, later_fragment(&udp(EP, PEER_HEALTH), 8, 7)),
        (true, later_fragment(&gre, 8, 7)),
        (false, later_fragment(&udp(PEER, NODE), 8, 7)),
        (false, later_fragment(&udp(PEER, EP), 8, 7)),
    ];
    for (egress, input) in &untouched {
        assert_eq!(run(&mut r, *egress, input), (TCX_NEXT, input.clone()));
    }
    assert_eq!(
        nat::fragments(pins.path()).expect("fragment map").len(),
        1,
        "only the one translated first fragment recorded"
    );

    // An echo reply the endpoint sends in fragments is covered but not
    // translated: its first passes as it is, and so do the others.
    let mut reply = Echo::request(EP, PEER, 0x0303, 1);
    reply.kind = 0;
    let [first, last] = packets::split_fragments(&reply.frame(), 16);
    for part in [first, last] {
        assert_eq!(run(&mut r, true, &part), (TCX_NEXT, part.clone()));
    }
    assert_eq!(
        ["frag_snat", "frag_rev_snat", "frag_dropped"].map(|c| counter(&pins, c)),
        [0, 0, 2]
    );
    stale_records_count_for_nothing(&mut r, &pins);
    // Masquerade off: nothing is dropped.
    r.set_nat_config(NatConfig::default()).expect("off");
    let input = later_fragment(&udp(EP, PEER), 8, 7);
    assert_eq!(run(&mut r, true, &input), (TCX_NEXT, input.clone()));
}

/// A record made by hand under a later fragment's key lets it through
/// while it is live; once older than the reassembly time it counts for
/// nothing: the fragment is dropped, and the collector removes the record,
/// leaving the live ones.
fn stale_records_count_for_nothing(r: &mut Datapath, pins: &PinDir) {
    use aya::maps::HashMap;
    use health_common::{
        maps::MapId,
        nat::fragments::{self, FRAG_LIFETIME_NS, FragEntry},
    };
    let udp = packets::udp_datagram(EP, PEER, (5353, 53), true);
    let fragment = later_fragment(&udp, 8, 11);
    let mut ip = [0u8; 20];
    ip.copy_from_slice(&fragment[14..34]);
    // SAFETY: `Ipv4Hdr` is 20 bytes of plain fields.
    let header = unsafe { std::mem::transmute::<[u8; 20], health_common::headers::Ipv4Hdr>(ip) };
    let key = fragments::out_key(&header);
    let mut opened =
        health_agent::datapath::maps::open(pins.path(), MapId::NatFrags).expect("NAT_FRAGS");
    let mut map = HashMap::<_, _, FragEntry>::try_from(&mut opened).expect("NAT_FRAGS");
    let now = health_agent::datapath::monotonic_ns().expect("clock");
    let record = |at| FragEntry::new(NODE.octets(), at);
    map.insert(&key, &record(now), 0).expect("a live record");
    let (verdict, out) = run(r, true, &fragment);
    assert_eq!(verdict, TCX_NEXT, "a live record");
    assert_eq!(&out[26..30], &NODE.octets(), "the source translated");
    let long_ago = now
        .checked_sub(FRAG_LIFETIME_NS + 1)
        .expect("the machine is up for over 30 s");
    map.insert(&key, &record(long_ago), 0)
        .expect("a stale record");
    let before = nat::fragments(pins.path()).expect("fragment map").len();
    assert_eq!(run(r, true, &fragment).0, TC_ACT_SHOT, "a stale record");
    assert_eq!(nat::gc_fragments(pins.path()).expect("collected"), 1);
    assert_eq!(
        nat::fragments(pins.path()).expect("fragment map").len(),
        before - 1,
        "the live records kept"
    );
}
