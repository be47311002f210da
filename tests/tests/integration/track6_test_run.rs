//! The tracking programs run by the kernel on crafted IPv6 packets
//! (`BPF_PROG_TEST_RUN`): `ICMPv6` echo and TCP over IPv6 are tracked in the
//! same table as IPv4 and timed; extension headers, fragments, neighbour
//! discovery, MLD and truncated headers are counted as unparsed and passed
//! on byte for byte; IPv4 is tracked as before next to IPv6.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use health_agent::datapath::{ct, rtt};
use health_tests::{
    packets::{Echo, ethernet},
    packets6::{Echo6, NEXT_ICMPV6, icmpv6_message, ipv6_packet, tcp6, udp6},
    tc_run::{ct_counter, loaded, only_entry, track},
};

const EP: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 0x40, 0, 0, 0, 2);
const PEER: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 0x41, 0, 0, 0, 2);
const EP4: Ipv4Addr = Ipv4Addr::new(198, 18, 64, 2);
const PEER4: Ipv4Addr = Ipv4Addr::new(198, 18, 65, 2);

#[test]
fn an_icmpv6_echo_exchange_is_tracked_and_timed() {
    let (mut r, pins) = loaded();
    let req = Echo6::request(EP, PEER, 0x0abc, 1);
    let reply = req.expected_reply();
    track(&mut r, true, &req.frame());
    let pending = rtt::pending(pins.path()).expect("pending");
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert_eq!(
        (
            pending[0].peer,
            pending[0].proto,
            pending[0].a,
            pending[0].b
        ),
        (IpAddr::V6(PEER), "ICMPv6", 0x0abc, 1)
    );
    track(&mut r, false, &reply.frame());
    let rows = ct::list(pins.path()).expect("ct");
    assert_eq!(rows.len(), 1, "{rows:#?}");
    let e = &rows[0];
    assert_eq!(
        (e.proto, e.dir, e.src, e.dst, e.sport, e.dport),
        ("ICMPv6", "OUT", IpAddr::V6(EP), IpAddr::V6(PEER), 0, 0x0abc)
    );
    let len = req.frame().len() as u64;
    assert_eq!(len, 14 + 40 + 8 + 56);
    assert_eq!(
        (e.tx_packets, e.tx_bytes, e.rx_packets, e.rx_bytes),
        (1, len, 1, len)
    );
    assert!(e.expires_in_seconds > 50, "ICMP lifetime 60 s: {e:?}");
    let samples = rtt::list(pins.path()).expect("rtt");
    assert_eq!(samples.len(), 1, "{samples:?}");
    assert_eq!(
        (samples[0].peer, samples[0].proto, samples[0].samples),
        (IpAddr::V6(PEER), "ICMPv6", 1)
    );
    assert!(samples[0].last_ns > 0 && samples[0].min_ns == samples[0].last_ns);
    assert!(
        rtt::pending(pins.path()).expect("pending").is_empty(),
        "the reply closed it"
    );
    assert_eq!(
        (ct_counter(&pins, "created"), ct_counter(&pins, "unparsed")),
        (1, 0)
    );

    // A reply with another sequence closes nothing and adds no sample.
    let mut stray = reply.clone();
    stray.sequence = 2;
    track(&mut r, false, &stray.frame());
    let samples = rtt::list(pins.path()).expect("rtt");
    assert_eq!(samples[0].samples, 1);
}

#[test]
fn a_peer_probing_the_endpoint_over_ipv6_is_an_in_entry_and_not_timed() {
    let (mut r, pins) = loaded();
    let req = Echo6::request(PEER, EP, 0x0def, 9);
    track(&mut r, false, &req.frame());
    track(&mut r, true, &req.expected_reply().frame());
    assert_eq!(only_entry(&pins), ("IN", IpAddr::V6(PEER), 1, 1));
    assert!(
        rtt::list(pins.path()).expect("rtt").is_empty(),
        "only the endpoint's own probes are timed"
    );
}

#[test]
fn a_tcp_handshake_over_ipv6_is_timed_and_its_flags_decide_the_lifetime() {
    let (mut r, pins) = loaded();
    let syn = tcp6(EP, PEER, (40_000, 4240), 0x02, b"");
    track(&mut r, true, &syn);
    track(&mut r, false, &tcp6(PEER, EP, (4240, 40_000), 0x12, b""));
    track(&mut r, true, &tcp6(EP, PEER, (40_000, 4240), 0x10, b""));
    let samples = rtt::list(pins.path()).expect("rtt");
    assert_eq!(samples.len(), 1, "{samples:?}");
    assert_eq!(
        (samples[0].peer, samples[0].proto, samples[0].samples),
        (IpAddr::V6(PEER), "TCP", 1)
    );
    let rows = ct::list(pins.path()).expect("ct");
    assert_eq!(rows.len(), 1, "{rows:#?}");
    let e = &rows[0];
    assert_eq!(
        (e.proto, e.dir, e.src, e.sport, e.dst, e.dport),
        ("TCP", "OUT", IpAddr::V6(EP), 40_000, IpAddr::V6(PEER), 4240)
    );
    assert_eq!((e.tx_flags_seen, e.rx_flags_seen), (0x12, 0x12));
    assert_eq!(
        (e.tx_packets, e.tx_bytes, e.rx_packets),
        (2, 2 * syn.len() as u64, 1)
    );
    assert!(
        e.expires_in_seconds > 3600,
        "established: long lifetime: {e:?}"
    );
    track(&mut r, true, &tcp6(EP, PEER, (40_000, 4240), 0x11, b""));
    let rows = ct::list(pins.path()).expect("ct");
    assert!(
        rows[0].expires_in_seconds <= 10,
        "closing: short lifetime: {:?}",
        rows[0]
    );
    // A SYN-ACK that answers no SYN of the endpoint is not a sample.
    track(&mut r, false, &tcp6(PEER, EP, (4240, 40_001), 0x12, b""));
    assert_eq!(rtt::list(pins.path()).expect("rtt")[0].samples, 1);
}

/// An echo request from the endpoint carrying extension header `ext`
/// (first next header `first`).
fn with_extension(first: u8, ext: &[u8]) -> Vec<u8> {
    Echo6::request(EP, PEER, 0x0777, 1).frame_with_extension(first, ext)
}

/// The IPv6 frames the programs do not track, by name.
fn untracked_ipv6() -> Vec<(&'static str, Vec<u8>)> {
    let e = Echo6::request(EP, PEER, 0x0777, 1);
    // Neighbour solicitation for the peer, to its solicited-node group.
    let t = PEER.octets();
    let group = Ipv6Addr::from([
        0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, t[13], t[14], t[15],
    ]);
    let mut body = vec![0; 4];
    body.extend_from_slice(&t);
    body.extend_from_slice(&[1, 1]);
    body.extend_from_slice(&e.src_mac);
    let ns = icmpv6_message(EP, group, 135, 0, &body);
    let ns = ethernet(
        [0x33, 0x33, 0xff, t[13], t[14], t[15]],
        e.src_mac,
        0x86dd,
        &ipv6_packet(6 << 28, EP, group, NEXT_ICMPV6, 255, &ns),
    );
    // An MLDv2 report (after a hop-by-hop router alert, as sent).
    let mld_group = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 0x16);
    let report = icmpv6_message(EP, mld_group, 143, 0, &[0, 0, 0, 0]);
    let mut hbh = vec![NEXT_ICMPV6, 0, 5, 2, 0, 0, 1, 0];
    hbh.extend_from_slice(&report);
    let mld = ethernet(
        [0x33, 0x33, 0, 0, 0, 0x16],
        e.src_mac,
        0x86dd,
        &ipv6_packet(6 << 28, EP, mld_group, 0, 1, &hbh),
    );
    // The same report without the router alert: ICMPv6 type 143 itself.
    let mld_bare = ethernet(
        [0x33, 0x33, 0, 0, 0, 0x16],
        e.src_mac,
        0x86dd,
        &ipv6_packet(6 << 28, EP, mld_group, NEXT_ICMPV6, 1, &report),
    );
    let mut unreachable = e.clone();
    unreachable.kind = 1;
    let mut cut_tcp = tcp6(EP, PEER, (40_000, 4240), 0x02, b"");
    cut_tcp.truncate(14 + 40 + 12);
    // (A frame cut inside the fixed IPv6 header is refused by the test-run
    // syscall itself; the host unit tests of `flow` cover it.)
    let mut cut_icmp = e.frame();
    cut_icmp.truncate(14 + 40 + 4);
    let mut short_payload = tcp6(EP, PEER, (40_000, 4240), 0x02, b"");
    short_payload[18..20].copy_from_slice(&12u16.to_be_bytes());
    vec![
        (
            "hop-by-hop options",
            with_extension(0, &[NEXT_ICMPV6, 0, 1, 4, 0, 0, 0, 0]),
        ),
        (
            "destination options",
            with_extension(60, &[NEXT_ICMPV6, 0, 1, 4, 0, 0, 0, 0]),
        ),
        (
            "routing header",
            with_extension(43, &[NEXT_ICMPV6, 0, 0, 0, 0, 0, 0, 0]),
        ),
        (
            "atomic fragment",
            with_extension(44, &[NEXT_ICMPV6, 0, 0, 0, 0, 0, 0, 1]),
        ),
        (
            "later fragment",
            with_extension(44, &[NEXT_ICMPV6, 0, 0, 0xb8, 0, 0, 0, 2]),
        ),
        ("neighbour solicitation", ns),
        ("MLDv2 report behind hop-by-hop", mld),
        ("MLDv2 report", mld_bare),
        ("ICMPv6 destination unreachable", unreachable.frame()),
        ("TCP header cut at 12 bytes", cut_tcp),
        ("ICMPv6 header cut at 4 bytes", cut_icmp),
        ("payload length short of the TCP header", short_payload),
    ]
}

#[test]
fn untracked_ipv6_is_counted_and_passed_unchanged() {
    let (mut r, pins) = loaded();
    let cases = untracked_ipv6();
    for (i, (what, input)) in cases.iter().enumerate() {
        let before = ct_counter(&pins, "unparsed");
        track(&mut r, i % 2 == 0, input);
        assert_eq!(ct_counter(&pins, "unparsed"), before + 1, "{what}");
    }
    assert_eq!(ct_counter(&pins, "unparsed"), cases.len() as u64);
    let rows = ct::list(pins.path()).expect("ct");
    assert!(rows.is_empty(), "nothing tracked: {rows:#?}");
    assert_eq!(ct_counter(&pins, "created"), 0);
    let pending = rtt::pending(pins.path()).expect("pending");
    assert!(pending.is_empty(), "nothing timed: {pending:?}");
}

#[test]
fn ipv4_is_still_tracked_next_to_ipv6() {
    let (mut r, pins) = loaded();
    let req4 = Echo::request(EP4, PEER4, 0x0abc, 1);
    let req6 = Echo6::request(EP, PEER, 0x0abc, 1);
    track(&mut r, true, &req4.frame());
    track(&mut r, true, &req6.frame());
    track(&mut r, true, &udp6(EP, PEER, (5353, 53)));
    track(&mut r, false, &req6.expected_reply().frame());
    track(&mut r, false, &req4.expected_reply().frame());
    let rows = ct::list(pins.path()).expect("ct");
    assert_eq!(rows.len(), 3, "{rows:#?}");
    let find = |proto| {
        rows.iter()
            .find(|r| r.proto == proto)
            .unwrap_or_else(|| panic!("no {proto} entry: {rows:#?}"))
    };
    let v4 = find("ICMP");
    assert_eq!(
        (v4.src, v4.dst, v4.dport, v4.tx_packets, v4.rx_packets),
        (IpAddr::V4(EP4), IpAddr::V4(PEER4), 0x0abc, 1, 1)
    );
    assert_eq!(v4.tx_bytes, req4.frame().len() as u64);
    let v6 = find("ICMPv6");
    assert_eq!(
        (v6.src, v6.dst, v6.dport, v6.tx_packets, v6.rx_packets),
        (IpAddr::V6(EP), IpAddr::V6(PEER), 0x0abc, 1, 1)
    );
    let udp = find("UDP");
    assert_eq!((udp.src, udp.sport, udp.dport), (IpAddr::V6(EP), 5353, 53));
    // Same identifier and sequence in both families: two samples, two peers.
    let samples = rtt::list(pins.path()).expect("rtt");
    let peers: Vec<_> = samples
        .iter()
        .map(|s| (s.peer, s.proto, s.samples))
        .collect();
    assert_eq!(
        peers,
        vec![
            (IpAddr::V4(PEER4), "ICMP", 1),
            (IpAddr::V6(PEER), "ICMPv6", 1)
        ]
    );
    assert_eq!(
        (ct_counter(&pins, "created"), ct_counter(&pins, "unparsed")),
        (3, 0)
    );
}
