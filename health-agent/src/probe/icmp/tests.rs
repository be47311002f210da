use std::net::Ipv4Addr;

use super::*;

fn reply(from: Ipv4Addr, id: u16, seq: u16, token: [u8; 8]) -> Vec<u8> {
    let mut p = vec![0x45, 0, 0, 36, 0, 0, 0, 0, 64, 1, 0, 0];
    p.extend_from_slice(&from.octets());
    p.extend_from_slice(&[198, 18, 64, 2]);
    let mut icmp = echo_request(id, seq, token).to_vec();
    icmp[0] = 0;
    p.extend_from_slice(&icmp);
    p
}

#[test]
fn replies_match_by_identifier_sequence_and_source() {
    let v4: Vec<Ipv4Addr> = (1..=3).map(|k| Ipv4Addr::new(198, 18, 1, k)).collect();
    let targets: Vec<IpAddr> = v4.iter().map(|ip| IpAddr::V4(*ip)).collect();
    let base = 0xfffe;
    let one = Numbering::single(base, 3);
    let t = |i| one.token(i);
    assert_eq!(
        match_reply(&reply(v4[2], base, 2, t(2)), one, Addresses::of(&targets)),
        Some(2)
    );
    assert_eq!(
        match_reply(&reply(v4[1], base, 2, t(2)), one, Addresses::of(&targets)),
        None,
        "a reply from another address than the request's"
    );
    assert_eq!(
        match_reply(
            &reply(v4[0], base.wrapping_add(7), 0, t(0)),
            one,
            Addresses::of(&targets)
        ),
        None,
        "an identifier of no flow"
    );
    assert_eq!(
        match_reply(&reply(v4[0], base, 9, t(0)), one, Addresses::of(&targets)),
        None
    );
    let next_round = Numbering {
        seq_base: 40_000,
        nonce: one.nonce.wrapping_add(1),
        ..one
    };
    assert_eq!(
        match_reply(
            &reply(v4[2], base, 2, t(2)),
            next_round,
            Addresses::of(&targets)
        ),
        None,
        "the same request of an earlier round"
    );
    assert_eq!(
        match_reply(
            &reply(v4[2], base, 40_002, next_round.token(2)),
            next_round,
            Addresses::of(&targets)
        ),
        Some(2)
    );
}

/// A reply forged with a target's address, identifier and sequence
/// (32 bits, found in a flood) is not its answer without the request's
/// token: not another request's, nor the last round's, nor a guess.
#[test]
fn a_reply_without_its_requests_token_answers_nothing() {
    let v4: Vec<Ipv4Addr> = (1..=3).map(|k| Ipv4Addr::new(198, 18, 1, k)).collect();
    let targets: Vec<IpAddr> = v4.iter().map(|ip| IpAddr::V4(*ip)).collect();
    let base = 0x2000;
    let one = Numbering::single(base, 3);
    let earlier = Numbering {
        nonce: one.nonce.wrapping_sub(1),
        ..one
    };
    let mut flipped = one.token(1);
    flipped[7] ^= 1;
    for (why, token) in [
        ("another request's", one.token(0)),
        ("the last round's", earlier.token(1)),
        ("one bit off", flipped),
        ("the fixed payload of old", crate::sys::icmp::UNKEYED),
    ] {
        assert_eq!(
            match_reply(&reply(v4[1], base, 1, token), one, Addresses::of(&targets)),
            None,
            "{why}"
        );
    }
    assert_ne!(one.token(0), one.token(1), "a token a request");
    assert_eq!(
        match_reply(
            &reply(v4[1], base, 1, one.token(1)),
            one,
            Addresses::of(&targets)
        ),
        Some(1)
    );
}

#[test]
fn icmpv6_replies_match_in_the_same_numbering_as_ipv4() {
    let v6: Ipv6Addr = "2001:2:0:1::1".parse().expect("ip");
    let targets = [IpAddr::V4(Ipv4Addr::new(198, 18, 1, 1)), IpAddr::V6(v6)];
    let base = 0x1000;
    let one = Numbering::single(base, 2);
    let mut msg = echo_request_v6(base, 1, one.token(1));
    msg[0] = 129;
    assert_eq!(
        match_reply_v6(&msg, v6, one, Addresses::of(&targets)),
        Some(1)
    );
    let other: Ipv6Addr = "2001:2:0:1::2".parse().expect("ip");
    assert_eq!(
        match_reply_v6(&msg, other, one, Addresses::of(&targets)),
        None
    );
    let mut forged = echo_request_v6(base, 1, one.token(0));
    forged[0] = 129;
    assert_eq!(
        match_reply_v6(&forged, v6, one, Addresses::of(&targets)),
        None,
        "another request's token"
    );
    let mut first = echo_request_v6(base, 0, one.token(0));
    first[0] = 129;
    assert_eq!(
        match_reply_v6(&first, v6, one, Addresses::of(&targets)),
        None,
        "sequence 0 went to the IPv4 address"
    );
}

#[test]
fn a_sending_order_is_taken_only_when_it_holds_every_target_once() {
    assert!(is_permutation(&[2, 0, 1], 3));
    assert!(is_permutation(&[], 0));
    assert!(!is_permutation(&[0, 1], 3), "short");
    assert!(!is_permutation(&[0, 1, 1], 3), "a repeat");
    assert!(!is_permutation(&[0, 1, 3], 3), "past the end");
}

#[test]
fn the_round_waits_a_timeout_after_its_latest_unanswered_request_only() {
    let targets: Vec<IpAddr> = (1..=4)
        .map(|k| IpAddr::V4(Ipv4Addr::new(198, 18, 1, k)))
        .collect();
    // MTU probes 4, 5 and 6 follow the echoes of targets 0, 2 and 3.
    let addresses = Addresses {
        targets: &targets,
        follows: &[0, 2, 3],
    };
    let echoes = Echoes::new(7, Duration::ZERO, Duration::ZERO);
    let mut w = Waiting::new(addresses, &echoes, Duration::from_secs(1));
    let ms = |n: u64| Duration::from_millis(n);
    let t0 = Instant::now();
    // Sent in the order 2, 0, 1, 3, 10 ms apart.
    let order = [2, 0, 1, 3];
    for (at, &i) in (0..).step_by(10).zip(&order) {
        w.sent(i, Ok(t0 + ms(at)));
    }
    let latest = |w: &mut Waiting<'_>| w.latest_unanswered(|p| order[p]);
    assert_eq!(latest(&mut w), Some(t0 + ms(30)), "3, sent last");
    w.answered(3, t0 + ms(31), t0 + ms(31));
    w.answered(1, t0 + ms(21), t0 + ms(32));
    assert_eq!(latest(&mut w), Some(t0 + ms(10)), "0: 3 and 1 answered");
    // 3's MTU probe could not go: nothing waits for it.
    assert_eq!(std::mem::take(&mut w.mtu_due), [6]);
    w.mtu_went(6, Err(io::Error::other("refused")));
    assert_eq!(latest(&mut w), Some(t0 + ms(10)));
    assert!(
        matches!(w.results[6], Err(ProbeError::Io { .. })),
        "{:?}",
        w.results[6]
    );
    // 0 and then 2 answer, and their MTU probes go.
    w.answered(0, t0 + ms(12), t0 + ms(35));
    w.mtu_went(4, Ok(t0 + ms(40)));
    assert_eq!(latest(&mut w), Some(t0 + ms(40)), "MTU probe 4");
    w.answered(2, t0 + ms(2), t0 + ms(45));
    w.mtu_went(5, Ok(t0 + ms(50)));
    assert_eq!(std::mem::take(&mut w.mtu_due), [4, 5]);
    assert_eq!(latest(&mut w), Some(t0 + ms(50)), "MTU probe 5");
    // The later MTU probe answered: the earlier one is still waited for.
    w.answered(5, t0 + ms(51), t0 + ms(51));
    assert_eq!(latest(&mut w), Some(t0 + ms(40)), "MTU probe 4 again");
    w.answered(4, t0 + ms(52), t0 + ms(52));
    assert_eq!(latest(&mut w), None);
    assert_eq!(w.pending, 0);
}

#[test]
fn the_round_ends_a_timeout_after_the_latest_unanswered_request() {
    let targets: Vec<IpAddr> = (1..=2)
        .map(|k| IpAddr::V4(Ipv4Addr::new(198, 18, 1, k)))
        .collect();
    let echoes = Echoes::new(2, Duration::ZERO, Duration::ZERO);
    let timeout = Duration::from_secs(1);
    let mut w = Waiting::new(Addresses::of(&targets), &echoes, timeout);
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    // 1 went first, 0 a busy 300 ms later: each gets its whole timeout.
    w.sent(1, Ok(t0));
    w.sent(0, Ok(t0 + ms(300)));
    let order = |p: usize| [1, 0][p];
    assert_eq!(w.end(order, t0), t0 + ms(1300));
    // 0 answered: the round waits only for 1's timeout.
    w.answered(0, t0 + ms(301), t0 + ms(301));
    assert_eq!(w.end(order, t0), t0 + timeout);
    w.answered(1, t0 + ms(2), t0 + ms(302));
    assert_eq!(w.end(order, t0 + ms(5)), t0 + ms(5), "none left");
}

/// A reply stamped before its request went carries the request's token
/// all the same: the real-time clock stepped forward while it waited
/// unread, and it answers the request at the time it was read.
#[test]
fn a_reply_stamped_before_its_request_went_answers_it_when_read() {
    let targets = [IpAddr::V4(Ipv4Addr::new(198, 18, 1, 1)); 2];
    let echoes = Echoes::new(2, Duration::ZERO, Duration::ZERO);
    let mut w = Waiting::new(Addresses::of(&targets), &echoes, Duration::from_secs(1));
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    w.sent(0, Ok(t0 + ms(500)));
    w.sent(1, Ok(t0 + ms(500)));
    w.answered(0, t0 + ms(20), t0 + ms(530));
    assert_eq!(w.results[0], Ok(ms(30)), "the read time stands");
    assert!(echoes.is_answered(0));
    // Within the clocks' error of the send: the stamp stands.
    w.answered(1, t0 + ms(500) - STAMP_ERROR / 2, t0 + ms(502));
    assert_eq!(w.results[1], Ok(Duration::ZERO));
    assert!(echoes.is_answered(1));
    assert_eq!(w.pending, 0);
}

#[test]
fn each_flow_has_its_identifier_and_mtu_probes_one_more() {
    let n = Numbering {
        per_flow: 3,
        flows: 4,
        base: 0xfffe,
        seq_base: 0xffff,
        nonce: 1,
    };
    // Flow 2's request to target 1, then the second MTU probe.
    assert_eq!(n.ident(7), (0, 0));
    assert_eq!(n.flow_id(2), 0);
    assert_eq!(n.ident(13), (2, 0));
    for i in 0..14 {
        let (id, seq) = n.ident(i);
        assert_eq!(n.request(id, seq, 14), Some(i), "request {i}");
    }
    assert_eq!(n.request(n.flow_id(1), 2, 14), None, "past flow 1");
    assert_eq!(n.request(n.flow_id(5), 0xffff, 14), None, "no such flow");
}

#[test]
fn flows_past_65536_requests_use_the_next_identifiers() {
    let n = Numbering {
        per_flow: 70_000,
        flows: 2,
        base: 0xffff,
        seq_base: 0,
        nonce: 2,
    };
    assert_eq!(n.ident(0), (0xffff, 0));
    assert_eq!(n.ident(65_535), (0xffff, 65_535));
    assert_eq!(n.ident(65_536), (0, 0), "wraps to the next identifier");
    assert_eq!(n.flow_id(1), 1, "each flow takes two identifiers");
    assert_eq!(n.ident(70_000), (1, 0));
    assert_eq!(n.request(1, 4_464, 140_000), Some(74_464));
    assert_eq!(n.request(2, 0, 140_000), Some(70_000 + 65_536));
    assert_eq!(n.request(2, 4_464, 140_000), None, "past flow 1's targets");
}

/// Runs `f` on a runtime of one thread (the test's own).
fn on_one_thread<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(f)
}

/// The prober of the test's namespace; `None` (the test skipped, and
/// said so) for a user who may not open raw ICMP sockets.
#[allow(
    clippy::print_stderr,
    reason = "says why the test is skipped for a user who is not root"
)]
fn prober_if_root() -> Option<IcmpProber> {
    match IcmpProber::new(None, Families::default()) {
        Ok(prober) => Some(prober),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            eprintln!("skipped: a raw ICMP socket needs root (cargo xtask test runs it)");
            None
        }
        Err(e) => panic!("raw ICMP socket: {e}"),
    }
}

#[test]
fn a_reply_that_came_in_time_counts_though_the_agent_reads_it_after_the_timeout() {
    // One thread: once the request is out, the test holds it for three
    // timeouts, as a busy node's agent can be held; the loopback's reply
    // meanwhile waits in the socket.
    on_one_thread(async {
        let Some(prober) = prober_if_root() else {
            return;
        };
        // The kernel switches its arrival stamps on from a work queue,
        // shortly after the first socket asks for them.
        std::thread::sleep(Duration::from_millis(100));
        let timeout = Duration::from_millis(200);
        let echoes = Echoes::new(1, Duration::ZERO, Duration::ZERO);
        let targets = [IpAddr::V4(Ipv4Addr::LOCALHOST)];
        let numbering = Numbering::single(fastrand::u16(..), 1);
        let round = prober.round(
            &targets,
            None,
            numbering,
            None,
            timeout,
            Duration::ZERO,
            &echoes,
        );
        tokio::pin!(round);
        // Polled until its request is out (the socket's first readiness
        // comes through the reactor), then the thread is held.
        let mut done = None;
        while !echoes.is_sent(0) {
            if let std::task::Poll::Ready(r) = futures::poll!(&mut round) {
                done = Some(r);
                break;
            }
            tokio::task::yield_now().await;
        }
        std::thread::sleep(3 * timeout);
        let results = match done {
            Some(r) => r,
            None => round.await,
        };
        let rtt = results[0].as_ref().expect("the reply came in time");
        assert!(*rtt < timeout, "the RTT is the arrival's: {rtt:?}");
    });
}

#[test]
fn mtu_probes_are_addressed_through_the_requests_they_follow() {
    let ip = |d| IpAddr::V4(Ipv4Addr::new(198, 18, 0, d));
    let targets = [ip(1), ip(2), ip(3)];
    let a = Addresses {
        targets: &targets,
        follows: &[2, 0],
    };
    assert_eq!(a.len(), 5);
    let all: Vec<_> = (0..6).map(|i| a.get(i)).collect();
    assert_eq!(
        all,
        [
            Some(ip(1)),
            Some(ip(2)),
            Some(ip(3)),
            Some(ip(3)),
            Some(ip(1)),
            None
        ]
    );
}

#[test]
fn a_send_time_is_kept_to_the_nanosecond_and_taken_once() {
    let base = Instant::now();
    let mut sent = SentAt::new(2, base);
    assert_eq!(sent.take(0), None, "not sent");
    let at = base + Duration::from_nanos(1_234_567);
    sent.set(1, at);
    assert_eq!(sent.take(1), Some(at));
    assert_eq!(sent.take(1), None, "a second reply finds it taken");
    sent.set(0, base);
    assert_eq!(sent.take(0), Some(base), "sent at the base itself");
    assert_eq!(sent.take(7), None, "no such request");
}

#[test]
fn an_mtu_probe_follows_only_a_small_echo_read_within_a_tenth_of_the_timeout() {
    let echoes = Echoes::new(3, Duration::ZERO, Duration::ZERO);
    let timeout = Duration::from_millis(1000);
    let t0 = Instant::now();
    let mut w = Waiting {
        sent_at: {
            let mut sent = SentAt::new(5, t0);
            (0..5).for_each(|i| sent.set(i, t0));
            sent
        },
        echoes: &echoes,
        results: vec![Err(ProbeError::NotSent(MTU_NOT_SENT)); 5],
        pending: 3,
        timeout,
        // Requests 0 and 1 each have an MTU probe (3 and 4), 2 none.
        mtu_after: vec![3, 4, NO_MTU],
        mtu_due: Vec::new(),
        small_tail: 3,
        mtu_sent: Vec::new(),
    };
    let ms = |n| t0 + Duration::from_millis(n);
    w.answered(2, ms(1), ms(1));
    assert!(w.mtu_due.is_empty(), "no MTU probe follows request 2");
    w.answered(1, ms(2), ms(150));
    assert!(w.mtu_due.is_empty(), "read past a tenth of the timeout");
    assert!(w.results[1].is_ok(), "yet the small echo counts");
    w.answered(0, ms(2), ms(90));
    assert_eq!(w.mtu_due, [3]);
    w.answered(0, ms(3), ms(91));
    assert_eq!(w.mtu_due, [3], "a duplicate reply sends nothing more");
    assert_eq!(w.pending, 0);
}

#[test]
fn echoes_sent_in_a_given_order_come_back_to_their_targets_on_the_loopback() {
    on_one_thread(async {
        let Some(prober) = prober_if_root() else {
            return;
        };
        // Three loopback addresses, each answering from itself: a reply
        // taken for another request's would not match its source.
        let targets: Vec<IpAddr> = (1..=3)
            .map(|k| IpAddr::V4(Ipv4Addr::new(127, 0, 0, k)))
            .collect();
        let timeout = Duration::from_secs(1);
        for order in [Some(&[2, 0, 1][..]), Some(&[0, 0, 1][..]), None] {
            let echoes = Echoes::new(3, Duration::ZERO, Duration::ZERO);
            let numbering = Numbering::single(fastrand::u16(..), 3);
            let results = prober
                .round(
                    &targets,
                    order,
                    numbering,
                    None,
                    timeout,
                    Duration::ZERO,
                    &echoes,
                )
                .await;
            assert_eq!(results.len(), 3);
            assert!(results.iter().all(Result::is_ok), "{order:?}: {results:?}");
            assert!((0..3).all(|i| echoes.is_answered(i)), "{order:?}");
        }
    });
}

#[test]
fn an_answered_echo_is_followed_by_its_mtu_probe_on_the_loopback() {
    on_one_thread(async {
        let Some(prober) = prober_if_root() else {
            return;
        };
        let lo = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let echoes = Echoes::new(1, Duration::ZERO, Duration::ZERO);
        let padded = Padded {
            bytes: 1400,
            follows: vec![0].into(),
        };
        let numbering = Numbering::single(fastrand::u16(..), 1);
        let timeout = Duration::from_secs(1);
        let results = prober
            .round(
                &[lo],
                None,
                numbering,
                Some(padded),
                timeout,
                Duration::ZERO,
                &echoes,
            )
            .await;
        assert!(results[0].is_ok(), "{results:?}");
        assert!(
            results[1].is_ok(),
            "the MTU probe went and came back: {results:?}"
        );
    });
}

#[test]
fn a_datagram_is_stamped_when_it_arrives_not_when_it_is_read() {
    let rx = Socket::new(Domain::IPV4, Type::DGRAM, None).expect("socket");
    rx.bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into())
        .expect("bind");
    stamp_arrivals(&rx).expect("SO_TIMESTAMPNS");
    // The kernel turns its stamps on from a work queue.
    std::thread::sleep(Duration::from_millis(100));
    let to = rx.local_addr().expect("address");
    let tx = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).expect("socket");
    tx.send_to(b"stamp", to.as_socket().expect("inet"))
        .expect("send");
    let sent = std::time::Instant::now();
    std::thread::sleep(Duration::from_millis(300));
    let mut buf = [0u8; 64];
    let r = recv_stamped(&rx, &mut buf).expect("the datagram");
    assert_eq!(&buf[..r.len], b"stamp");
    assert_eq!(r.from, None, "an IPv4 source is not an IPv6 one");
    let ago = r.at.elapsed();
    assert!(
        ago >= Duration::from_millis(250) && r.at <= sent + Duration::from_millis(50),
        "stamped {ago:?} before it was read"
    );
}

#[tokio::test]
async fn the_receive_buffer_holds_a_round_of_replies_past_rmem_max() {
    let rmem_max: usize = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
        .expect("rmem_max")
        .trim()
        .parse()
        .expect("a number");
    let Some(prober) = prober_if_root() else {
        return;
    };
    let size = prober.recv_buffer_size().expect("SO_RCVBUF");
    assert!(
        size >= 16 << 20 && size > 2 * rmem_max,
        "receive buffer {size} bytes (rmem_max {rmem_max})"
    );
}
