//! The tracking programs (tcx on `lxc_health`) run by the kernel on crafted
//! packets: they never change or drop a packet; they create and account CT
//! entries, time echo and TCP handshakes, and count what they cannot parse.

use std::net::{IpAddr, Ipv4Addr};

use health_agent::datapath::{ct, maps, rtt};
use health_tests::{
    packets::{self, Echo},
    tc_run::{ct_counter, loaded, only_entry, track},
};

const EP: Ipv4Addr = Ipv4Addr::new(198, 18, 64, 2);
const PEER: Ipv4Addr = Ipv4Addr::new(198, 18, 65, 2);

#[test]
fn an_echo_exchange_is_tracked_and_timed() {
    let (mut r, pins) = loaded();
    let req = Echo::request(EP, PEER, 0x0abc, 1);
    let reply = req.expected_reply();
    track(&mut r, true, &req.frame());
    assert_eq!(rtt::pending(pins.path()).expect("pending").len(), 1);
    track(&mut r, false, &reply.frame());
    let rows = ct::list(pins.path()).expect("ct");
    assert_eq!(rows.len(), 1, "{rows:#?}");
    let e = &rows[0];
    assert_eq!(
        (e.proto, e.dir, e.src, e.dst, e.dport),
        ("ICMP", "OUT", IpAddr::V4(EP), IpAddr::V4(PEER), 0x0abc)
    );
    let len = req.frame().len() as u64;
    assert_eq!(
        (e.tx_packets, e.tx_bytes, e.rx_packets, e.rx_bytes),
        (1, len, 1, len)
    );
    assert!(e.expires_in_seconds > 50, "ICMP lifetime 60 s: {e:?}");
    let samples = rtt::list(pins.path()).expect("rtt");
    assert_eq!(samples.len(), 1);
    assert_eq!(
        (samples[0].peer, samples[0].proto, samples[0].samples),
        (IpAddr::V4(PEER), "ICMP", 1)
    );
    assert!(
        rtt::pending(pins.path()).expect("pending").is_empty(),
        "the reply closed it"
    );
    assert_eq!(ct_counter(&pins, "created"), 1);
}

/// An echo reply closes its request only with the request's payload
/// carried back (the agent's token): one forged with the right source,
/// identifier and sequence times nothing and leaves the request pending.
#[test]
fn an_echo_reply_without_its_requests_payload_closes_nothing() {
    let (mut r, pins) = loaded();
    let req = Echo::request(EP, PEER, 0x0abc, 2);
    track(&mut r, true, &req.frame());
    let mut forged = req.expected_reply();
    forged.payload[..4].copy_from_slice(b"heal");
    track(&mut r, false, &forged.frame());
    let pending = rtt::pending(pins.path()).expect("pending");
    let tag: [u8; 4] = req.payload[..4].try_into().expect("4 bytes");
    assert_eq!(
        pending
            .iter()
            .map(|p| p.echo_data.clone())
            .collect::<Vec<_>>(),
        [Some(format!("{:08x}", u32::from_be_bytes(tag)))],
        "the request, shown with its tag"
    );
    assert!(rtt::list(pins.path()).expect("rtt").is_empty(), "no sample");
    track(&mut r, false, &req.expected_reply().frame());
    assert!(
        rtt::pending(pins.path()).expect("pending").is_empty(),
        "closed by the true reply"
    );
    assert_eq!(rtt::list(pins.path()).expect("rtt")[0].samples, 1);
}

/// A path trace's echo (a TTL of at most 16) is tracked but not timed:
/// most die on the way, answered by a Time Exceeded, and each would be a
/// loss for the sweep to count. One sent with a TTL above 16 is timed.
#[test]
fn a_path_traces_echo_is_tracked_but_not_timed() {
    let (mut r, pins) = loaded();
    for ttl in [1, 16] {
        let hop = Echo {
            ttl,
            ..Echo::request(EP, PEER, 0x0abe, u16::from(ttl))
        };
        track(&mut r, true, &hop.frame());
    }
    assert!(
        rtt::pending(pins.path()).expect("pending").is_empty(),
        "no trace echo timed"
    );
    assert_eq!(ct::list(pins.path()).expect("ct").len(), 1, "tracked");
    let probe = Echo {
        ttl: 17,
        ..Echo::request(EP, PEER, 0x0abe, 17)
    };
    track(&mut r, true, &probe.frame());
    assert_eq!(rtt::pending(pins.path()).expect("pending").len(), 1);
}

/// A path-MTU probe (an echo padded to 1280 bytes and more) is tracked
/// but not timed: the small echo's sample is the peer's, alone.
#[test]
fn an_mtu_probe_is_tracked_but_not_timed() {
    let (mut r, pins) = loaded();
    let small = Echo::request(EP, PEER, 0x0abc, 1);
    let mtu = Echo {
        payload: vec![0; 1252],
        ..Echo::request(EP, PEER, 0x0abd, 1)
    };
    assert_eq!(mtu.ip_packet().len(), 1280);
    track(&mut r, true, &small.frame());
    track(&mut r, true, &mtu.frame());
    assert_eq!(
        rtt::pending(pins.path()).expect("pending").len(),
        1,
        "the small echo alone"
    );
    track(&mut r, false, &small.expected_reply().frame());
    track(&mut r, false, &mtu.expected_reply().frame());
    let samples = rtt::list(pins.path()).expect("rtt");
    assert_eq!(samples.len(), 1);
    assert_eq!(samples[0].samples, 1, "{samples:?}");
    assert_eq!(ct::list(pins.path()).expect("ct").len(), 2, "both tracked");
}

#[test]
fn a_peer_probing_the_endpoint_is_an_in_entry() {
    let (mut r, pins) = loaded();
    let req = Echo::request(PEER, EP, 0x0def, 9);
    track(&mut r, false, &req.frame());
    track(&mut r, true, &req.expected_reply().frame());
    assert_eq!(only_entry(&pins), ("IN", IpAddr::V4(PEER), 1, 1));
    assert!(
        rtt::list(pins.path()).expect("rtt").is_empty(),
        "only the endpoint's own probes are timed"
    );
}

/// A segment of a connection both sides of which started at
/// [`packets::TCP_ISN`] (an answer acknowledges the endpoint's SYN).
fn tcp(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, flags: u8) -> Vec<u8> {
    packets::tcp(src, dst, (sport, dport), flags, b"")
}

/// A segment numbered `(seq, ack)`.
fn numbered(src: Ipv4Addr, dst: Ipv4Addr, ports: (u16, u16), flags: u8, n: (u32, u32)) -> Vec<u8> {
    packets::tcp_numbered(src, dst, ports, flags, n, b"")
}

#[test]
fn a_tcp_handshake_is_timed_and_its_flags_decide_the_lifetime() {
    let (mut r, pins) = loaded();
    track(&mut r, true, &tcp(EP, PEER, 40_000, 4240, 0x02));
    track(&mut r, false, &tcp(PEER, EP, 4240, 40_000, 0x12));
    track(&mut r, true, &tcp(EP, PEER, 40_000, 4240, 0x10));
    let samples = rtt::list(pins.path()).expect("rtt");
    assert_eq!(
        (samples.len(), samples[0].proto, samples[0].samples),
        (1, "TCP", 1)
    );
    let rows = ct::list(pins.path()).expect("ct");
    assert_eq!((rows[0].tx_flags_seen, rows[0].rx_flags_seen), (0x12, 0x12));
    assert!(
        rows[0].expires_in_seconds > 3600,
        "established: long lifetime: {:?}",
        rows[0]
    );
    track(&mut r, true, &tcp(EP, PEER, 40_000, 4240, 0x11));
    let rows = ct::list(pins.path()).expect("ct");
    assert!(
        rows[0].expires_in_seconds <= 10,
        "closing: short lifetime: {:?}",
        rows[0]
    );
}

/// Karn's rule: the SYN-ACK after a retransmitted SYN could answer either
/// SYN, so it times nothing; the next connection is timed again.
#[test]
fn a_handshake_whose_syn_was_sent_again_times_no_sample() {
    let (mut r, pins) = loaded();
    track(&mut r, true, &tcp(EP, PEER, 40_001, 4240, 0x02));
    let first = rtt::pending(pins.path()).expect("pending");
    track(&mut r, true, &tcp(EP, PEER, 40_001, 4240, 0x02));
    let again = rtt::pending(pins.path()).expect("pending");
    assert_eq!(
        (again.len(), again[0].sent_ns, again[0].retransmitted),
        (1, first[0].sent_ns, true),
        "the first SYN's time, marked: {first:?} then {again:?}"
    );
    track(&mut r, false, &tcp(PEER, EP, 4240, 40_001, 0x12));
    assert!(rtt::list(pins.path()).expect("rtt").is_empty(), "no sample");
    assert!(
        rtt::pending(pins.path()).expect("pending").is_empty(),
        "closed"
    );
    track(&mut r, true, &tcp(EP, PEER, 40_002, 4240, 0x02));
    assert!(!rtt::pending(pins.path()).expect("pending")[0].retransmitted);
    track(&mut r, false, &tcp(PEER, EP, 4240, 40_002, 0x12));
    let samples = rtt::list(pins.path()).expect("rtt");
    assert_eq!((samples.len(), samples[0].samples), (1, 1), "{samples:?}");
}

/// A SYN answered by a reset (a closed port) is answered: closed at
/// once, timing nothing, and never counted lost by the sweep.
#[test]
fn a_syn_answered_by_a_reset_is_closed_not_lost() {
    let (mut r, pins) = loaded();
    track(&mut r, true, &tcp(EP, PEER, 40_003, 4240, 0x02));
    assert_eq!(rtt::pending(pins.path()).expect("pending").len(), 1);
    // A reset for another connection closes nothing, nor a bare reset
    // (no ACK: TCP takes none in SYN-SENT).
    track(&mut r, false, &tcp(PEER, EP, 4240, 40_004, 0x14));
    track(&mut r, false, &tcp(PEER, EP, 4240, 40_003, 0x04));
    assert_eq!(rtt::pending(pins.path()).expect("pending").len(), 1);
    track(&mut r, false, &tcp(PEER, EP, 4240, 40_003, 0x14));
    assert!(
        rtt::pending(pins.path()).expect("pending").is_empty(),
        "closed by the reset"
    );
    assert!(rtt::list(pins.path()).expect("rtt").is_empty(), "no sample");
    assert_eq!(
        rtt::sweep(pins.path(), std::time::Duration::ZERO).expect("sweep"),
        0,
        "nothing left to count lost"
    );
    // Unanswered, a SYN is the sweep's.
    track(&mut r, true, &tcp(EP, PEER, 40_005, 4240, 0x02));
    assert_eq!(
        rtt::sweep(pins.path(), std::time::Duration::ZERO).expect("sweep"),
        1
    );
}

/// A SYN-ACK or reset answers only the SYN it acknowledges: one for
/// another connection on the same ports (stale, or forged by someone who
/// does not know the ISN) neither times a sample nor closes the request,
/// which the right answer then closes.
#[test]
fn only_an_answer_acknowledging_the_syn_closes_it() {
    let (mut r, pins) = loaded();
    let ports = (40_006, 4240);
    let back = (ports.1, ports.0);
    track(&mut r, true, &numbered(EP, PEER, ports, 0x02, (7_000, 0)));
    for (flags, ack) in [(0x12, 7_000), (0x12, 7_002), (0x14, 0), (0x14, 9_001)] {
        track(&mut r, false, &numbered(PEER, EP, back, flags, (50, ack)));
        let pending = rtt::pending(pins.path()).expect("pending");
        assert_eq!(
            pending.len(),
            1,
            "flags {flags:#x} ack {ack} closed it: {pending:?}"
        );
        assert_eq!(pending[0].isn, Some(7_000));
    }
    assert!(rtt::list(pins.path()).expect("rtt").is_empty(), "no sample");
    track(&mut r, false, &numbered(PEER, EP, back, 0x12, (50, 7_001)));
    assert!(
        rtt::pending(pins.path()).expect("pending").is_empty(),
        "closed by the SYN-ACK that acknowledges it"
    );
    let samples = rtt::list(pins.path()).expect("rtt");
    assert_eq!((samples.len(), samples[0].samples), (1, 1), "{samples:?}");
}

/// A new connection on the ports of an unanswered SYN (another ISN) is
/// timed on its own, not taken for that SYN sent again; the old SYN is
/// left for the sweep to count lost.
#[test]
fn a_new_connection_on_the_ports_of_a_lost_syn_is_timed_on_its_own() {
    let (mut r, pins) = loaded();
    let ports = (40_007, 4240);
    track(&mut r, true, &numbered(EP, PEER, ports, 0x02, (1_000, 0)));
    track(&mut r, true, &numbered(EP, PEER, ports, 0x02, (900_000, 0)));
    let mut pending = rtt::pending(pins.path()).expect("pending");
    pending.sort_by_key(|p| p.isn);
    assert_eq!(
        pending
            .iter()
            .map(|p| (p.isn, p.retransmitted))
            .collect::<Vec<_>>(),
        [(Some(1_000), false), (Some(900_000), false)],
        "two connections, neither sent again"
    );
    track(
        &mut r,
        false,
        &numbered(PEER, EP, (4240, 40_007), 0x12, (5, 900_001)),
    );
    let samples = rtt::list(pins.path()).expect("rtt");
    assert_eq!((samples.len(), samples[0].samples), (1, 1), "{samples:?}");
    assert_eq!(
        rtt::sweep(pins.path(), std::time::Duration::ZERO).expect("sweep"),
        1,
        "the first SYN, lost"
    );
}

#[test]
fn a_connection_a_peer_opens_is_one_in_entry_and_a_crossing_syn_one_more() {
    let (mut r, pins) = loaded();
    track(&mut r, false, &tcp(PEER, EP, 50_000, 4240, 0x02));
    track(&mut r, true, &tcp(EP, PEER, 4240, 50_000, 0x12));
    track(&mut r, false, &tcp(PEER, EP, 50_000, 4240, 0x10));
    assert_eq!(
        only_entry(&pins),
        ("IN", IpAddr::V4(PEER), 2, 1),
        "the endpoint's SYN-ACK found the peer's entry"
    );
    // A bare SYN of the endpoint on the same ports, reversed (the ports
    // reused, or a simultaneous open), opens a flow of its own.
    track(&mut r, true, &tcp(EP, PEER, 4240, 50_000, 0x02));
    let rows = ct::list(pins.path()).expect("ct");
    assert_eq!(rows.len(), 2, "{rows:#?}");
    assert!(
        rows.iter()
            .any(|row| row.dir == "OUT" && row.src == IpAddr::V4(EP) && row.tx_packets == 1),
        "{rows:#?}"
    );
    assert_eq!(ct_counter(&pins, "created"), 2);
}

#[test]
fn unparsable_packets_are_counted_and_passed_unchanged() {
    let (mut r, pins) = loaded();
    let mut cut_tcp = tcp(EP, PEER, 1, 2, 0x02);
    cut_tcp.truncate(14 + 20 + 6);
    let cases = [
        cut_tcp,
        {
            // A later fragment: no L4 header to track. (IPv6 is tracked:
            // track6_test_run.)
            let mut later = Echo::request(EP, PEER, 1, 1).frame();
            later[20..22].copy_from_slice(&0x00b9u16.to_be_bytes());
            packets::fix_ip_checksum(&mut later);
            later
        },
        packets::ethernet([0xff; 6], [2, 0, 0, 0, 0, 1], 0x0806, &[0; 28]),
        {
            let mut unreachable = Echo::request(EP, PEER, 1, 1);
            unreachable.kind = 3;
            unreachable.frame()
        },
    ];
    for (i, input) in cases.iter().enumerate() {
        track(&mut r, i % 2 == 0, input);
    }
    assert_eq!(ct_counter(&pins, "unparsed"), cases.len() as u64);
    assert_eq!(
        ct::list(pins.path()).expect("ct").len(),
        0,
        "nothing tracked"
    );
}

/// More flows than the table holds: every packet is still handed on
/// unchanged, the table stays within its size, the newest flows are
/// tracked, and what the LRU dropped is counted as evicted.
#[test]
fn a_full_table_evicts_old_flows_and_keeps_passing_packets() {
    let (mut r, pins) = loaded();
    let size = maps::list(pins.path())
        .expect("maps")
        .into_iter()
        .find(|m| m.name == "CT_MAP")
        .expect("CT_MAP")
        .max_entries;
    let flows = size + 2_000;
    let frame = |i: u32| {
        let [_, a, b, c] = i.to_be_bytes();
        let src = Ipv4Addr::new(198, 18, 64, 2);
        let dst = Ipv4Addr::new(198, 19, a, b);
        packets::udp_datagram(src, dst, (10_000 + u16::from(c), 53), true)
    };
    for i in 0..flows {
        track(&mut r, true, &frame(i));
    }
    let c = |name| ct_counter(&pins, name);
    let rows = ct::list(pins.path()).expect("ct");
    let entries = rows.len() as u64;
    assert!(entries <= u64::from(size), "{entries} > {size}");
    assert_eq!(
        c("created"),
        u64::from(flows),
        "every new flow got an entry"
    );
    assert_eq!(c("evicted"), u64::from(flows) - entries);
    assert!(c("evicted") >= 2_000);
    let last = frame(flows - 1);
    let newest = rows.iter().any(|r| {
        r.dst == Ipv4Addr::new(last[30], last[31], last[32], last[33])
            && r.sport == u16::from_be_bytes([last[34], last[35]])
    });
    assert!(newest, "the newest flow is tracked");
}
