//! `ICMPv6` echo: each class of packet, with the expected output built and
//! checksummed by code of this file (not by `checksum` or `respond`).

use std::{vec, vec::Vec};

use super::*;
use crate::frame::SliceFrame;

/// `2001:2::2`, the endpoint.
const LOCAL: [u8; 16] = [0x20, 0x01, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
/// `2001:2::1`, the peer.
const PEER: [u8; 16] = [0x20, 0x01, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
/// `fe80::1`, the peer's link-local address.
const PEER_LL: [u8; 16] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0xa];
const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0xb];
const CFG: EchoConfig = EchoConfig {
    addr: [198, 18, 0, 2],
    mac: MAC_B,
    flags: 0,
    reserved: 0,
    addr6: LOCAL,
    own4: [[0; 4]; OWN_SLOTS],
    own6: [[0; 16]; OWN_SLOTS],
};

/// RFC 1071 checksum over `data`, written independently of `checksum`.
fn inet_sum(data: &[u8]) -> u16 {
    let mut sum: u64 = 0;
    for (i, b) in data.iter().enumerate() {
        sum += if i % 2 == 0 {
            u64::from(*b) << 8
        } else {
            u64::from(*b)
        };
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The `ICMPv6` checksum of `msg` between `src` and `dst` (pseudo-header of
/// RFC 8200 section 8.1).
fn icmp6_sum(src: &[u8; 16], dst: &[u8; 16], msg: &[u8]) -> u16 {
    let mut data = src.to_vec();
    data.extend_from_slice(dst);
    data.extend_from_slice(&u32::try_from(msg.len()).expect("small").to_be_bytes());
    data.extend_from_slice(&[0, 0, 0, 58]);
    data.extend_from_slice(msg);
    inet_sum(&data)
}

/// An IPv6 frame from `src` to `dst` with next header `next` and `body`.
fn ipv6(src: [u8; 16], dst: [u8; 16], next: u8, hop_limit: u8, body: &[u8]) -> Vec<u8> {
    let mut p = MAC_B.to_vec();
    p.extend_from_slice(&MAC_A);
    p.extend_from_slice(&[0x86, 0xdd]);
    // Traffic class 0xb8, flow label 0x12345: both reflected in the reply.
    p.extend_from_slice(&[0x6b, 0x81, 0x23, 0x45]);
    p.extend_from_slice(&u16::try_from(body.len()).expect("small").to_be_bytes());
    p.extend_from_slice(&[next, hop_limit]);
    p.extend_from_slice(&src);
    p.extend_from_slice(&dst);
    p.extend_from_slice(body);
    p
}

/// An `ICMPv6` message of `kind`/`code` with a correct checksum.
fn icmp6(src: [u8; 16], dst: [u8; 16], kind: u8, code: u8, rest: &[u8]) -> Vec<u8> {
    let mut m = vec![kind, code, 0, 0];
    m.extend_from_slice(rest);
    let c = icmp6_sum(&src, &dst, &m);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    m
}

/// Identifier 0x1234, sequence 7, then `payload`.
fn echo_body(payload: &[u8]) -> Vec<u8> {
    let mut rest = vec![0x12, 0x34, 0x00, 0x07];
    rest.extend_from_slice(payload);
    rest
}

fn request(src: [u8; 16], dst: [u8; 16], payload: &[u8]) -> Vec<u8> {
    ipv6(
        src,
        dst,
        58,
        17,
        &icmp6(src, dst, 128, 0, &echo_body(payload)),
    )
}

/// The reply built from scratch: MACs and addresses swapped, hop limit 64,
/// type 129, checksum computed anew.
fn expected_reply(src: [u8; 16], dst: [u8; 16], code: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = ipv6(
        dst,
        src,
        58,
        64,
        &icmp6(dst, src, 129, code, &echo_body(payload)),
    );
    f[0..6].copy_from_slice(&MAC_A);
    f[6..12].copy_from_slice(&MAC_B);
    f
}

fn run(p: Vec<u8>) -> (Verdict, Vec<u8>) {
    run_with(p, &CFG)
}

fn run_with(mut p: Vec<u8>, cfg: &EchoConfig) -> (Verdict, Vec<u8>) {
    let v = respond(&mut SliceFrame::new(&mut p), cfg, false);
    (v, p)
}

fn assert_untouched(input: &[u8], expect: Verdict) {
    let (v, out) = run(input.to_vec());
    assert_eq!(v, expect);
    assert_eq!(out, input, "a {expect:?} packet must not be modified");
}

fn reply_len(f: &[u8]) -> Verdict {
    Verdict::Reply {
        len: u16::try_from(f.len()).expect("small"),
    }
}

#[test]
fn valid_request_becomes_the_exact_reply() {
    for payload in [
        Vec::new(),
        vec![0xab],
        (0..56u8).collect(),
        (0..=255u8).cycle().take(1401).collect::<Vec<_>>(),
    ] {
        for src in [PEER, PEER_LL] {
            let req = request(src, LOCAL, &payload);
            let (v, out) = run(req.clone());
            let want = expected_reply(src, LOCAL, 0, &payload);
            assert_eq!(v, reply_len(&want), "payload {}", payload.len());
            assert_eq!(out, want, "payload {}", payload.len());
            assert_eq!(icmp6_sum(&LOCAL, &src, &out[54..]), 0, "reply checksum");
        }
    }
}

#[test]
fn the_code_is_kept_and_hop_limit_zero_is_answered() {
    let mut m = icmp6(PEER, LOCAL, 128, 5, &echo_body(b"xyz"));
    let req = ipv6(PEER, LOCAL, 58, 0, &m);
    let (v, out) = run(req);
    let want = expected_reply(PEER, LOCAL, 5, b"xyz");
    assert_eq!(v, reply_len(&want));
    assert_eq!(out, want);
    // The same with a wrong checksum: dropped.
    m[3] ^= 1;
    assert_untouched(
        &ipv6(PEER, LOCAL, 58, 0, &m),
        Verdict::Malformed(MalformedReason::BadIcmpChecksum),
    );
}

#[test]
fn bytes_past_the_payload_length_are_cut_from_the_reply() {
    let mut req = request(PEER, LOCAL, b"abcdef");
    req.extend_from_slice(&[0x5a; 11]);
    let (v, out) = run(req);
    let want = expected_reply(PEER, LOCAL, 0, b"abcdef");
    assert_eq!(v, reply_len(&want));
    assert_eq!(out[..want.len()], want[..]);
}

#[test]
fn group_destination_macs_are_answered_from_the_interface_mac() {
    let mut req = request(PEER, LOCAL, b"x");
    req[0..6].copy_from_slice(&[0x33, 0x33, 0, 0, 0, 1]);
    let (v, out) = run(req.clone());
    let want = expected_reply(PEER, LOCAL, 0, b"x");
    assert_eq!(v, reply_len(&want));
    assert_eq!(out, want);
    // Only the IPv6 flag counts for IPv6.
    let v4_only = EchoConfig {
        flags: EchoConfig::DROP_UNICAST_IN_L2_MULTICAST,
        ..CFG
    };
    assert_eq!(run_with(req.clone(), &v4_only).0, reply_len(&want));
    let strict = EchoConfig {
        flags: EchoConfig::DROP_UNICAST_IN_L2_MULTICAST6,
        ..CFG
    };
    let (v, out) = run_with(req.clone(), &strict);
    assert_eq!(v, Verdict::Pass(PassReason::UnicastInL2Multicast));
    assert_eq!(out, req);
}

#[test]
fn link_layer_oddities_are_passed() {
    let mut other = request(PEER, LOCAL, b"x");
    other[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0xc]);
    assert_untouched(&other, Verdict::Pass(PassReason::OtherHost));
    for src in [[0x33, 0x33, 0, 0, 0, 1], [0; 6]] {
        let mut req = request(PEER, LOCAL, b"x");
        req[6..12].copy_from_slice(&src);
        assert_untouched(&req, Verdict::Pass(PassReason::BadSourceMac));
    }
}

#[test]
fn requests_to_other_addresses_are_passed() {
    let all_nodes = [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    let solicited = [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0, 0, 2];
    let ll = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
    let mut other = LOCAL;
    other[15] = 3;
    for dst in [all_nodes, solicited, ll, other] {
        let mut req = request(PEER, dst, b"x");
        req[0..6].copy_from_slice(&[0x33, 0x33, dst[12], dst[13], dst[14], dst[15]]);
        assert_untouched(&req, Verdict::Pass(PassReason::NotForEndpoint));
    }
}

#[test]
fn martian_sources_are_passed() {
    let mut mapped = [0u8; 16];
    mapped[10] = 0xff;
    mapped[11] = 0xff;
    mapped[12..].copy_from_slice(&[198, 18, 0, 1]);
    let mut loopback = [0u8; 16];
    loopback[15] = 1;
    let mcast = [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    for src in [[0; 16], loopback, mcast, mapped, LOCAL] {
        assert_untouched(
            &request(src, LOCAL, b"x"),
            Verdict::Pass(PassReason::MartianSource),
        );
    }
}

/// `fe80::b`, the endpoint interface's own link-local address.
const OWN_LL: [u8; 16] = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xb];

/// The endpoint's configuration with its link-local address (and a second
/// global one) among the interface's own.
fn with_own() -> EchoConfig {
    let mut second = LOCAL;
    second[15] = 9;
    let mut own6 = [[0; 16]; OWN_SLOTS];
    own6[0] = OWN_LL;
    own6[1] = second;
    EchoConfig { own6, ..CFG }
}

#[test]
fn requests_from_any_own_address_link_local_included_are_passed() {
    let cfg = with_own();
    for src in [OWN_LL, cfg.own6[1]] {
        let req = request(src, LOCAL, b"x");
        let (v, out) = run_with(req.clone(), &cfg);
        assert_eq!(v, Verdict::Pass(PassReason::OwnSource), "{src:x?}");
        assert_eq!(out, req, "a passed request must not be modified");
        // Without the interface's addresses it would have been answered.
        assert_eq!(run(req).0, reply_len(&expected_reply(src, LOCAL, 0, b"x")));
    }
    // Another link-local source (the peer's) is still answered, byte for
    // byte, and so is one that differs from the own address in its last
    // byte only.
    let mut near = OWN_LL;
    near[15] = 0xc;
    for src in [PEER_LL, near, PEER] {
        let want = expected_reply(src, LOCAL, 0, b"x");
        let (v, out) = run_with(request(src, LOCAL, b"x"), &cfg);
        assert_eq!(v, reply_len(&want), "{src:x?}");
        assert_eq!(out, want);
    }
}

#[test]
fn an_interface_with_more_addresses_than_slots_passes_every_ipv6_request() {
    let cfg = EchoConfig {
        flags: EchoConfig::MORE_OWN6,
        ..with_own()
    };
    let req = request(PEER, LOCAL, b"x");
    let (v, out) = run_with(req.clone(), &cfg);
    assert_eq!(v, Verdict::Pass(PassReason::OwnSource));
    assert_eq!(out, req);
    // IPv4's flag says nothing of IPv6.
    let v4_flag = EchoConfig {
        flags: EchoConfig::MORE_OWN4,
        ..with_own()
    };
    let want = expected_reply(PEER, LOCAL, 0, b"x");
    assert_eq!(run_with(req, &v4_flag).0, reply_len(&want));
}

#[test]
fn neighbour_discovery_mld_and_other_types_are_passed() {
    // NS, NA, RS, RA, redirect, MLD query/report/done, MLDv2 report, echo
    // reply, destination unreachable.
    for kind in [135u8, 136, 133, 134, 137, 130, 131, 132, 143, 129, 1] {
        let m = icmp6(PEER, LOCAL, kind, 0, &[0; 20]);
        assert_untouched(
            &ipv6(PEER, LOCAL, 58, 255, &m),
            Verdict::Pass(PassReason::NotEchoRequest),
        );
    }
}

#[test]
fn extension_headers_and_fragments_are_passed() {
    let m = icmp6(PEER, LOCAL, 128, 0, &echo_body(b"abcd"));
    // Hop-by-hop (with a router alert, as MLD sends), routing,
    // destination options: each 8 bytes, then the message.
    for (next, reason) in [
        (0u8, PassReason::ExtensionHeader),
        (43, PassReason::ExtensionHeader),
        (60, PassReason::ExtensionHeader),
        (44, PassReason::Fragment),
    ] {
        let mut body = vec![58, 0, 5, 2, 0, 0, 1, 0];
        if next == 44 {
            body = vec![58, 0, 0, 0, 0, 0, 0, 42];
        }
        body.extend_from_slice(&m);
        assert_untouched(&ipv6(PEER, LOCAL, next, 64, &body), Verdict::Pass(reason));
    }
    // Hop-by-hop with payload length 0 (a jumbogram): passed, not judged
    // by its length.
    let mut jumbo = ipv6(PEER, LOCAL, 0, 64, &[58, 0, 0, 0, 0, 0, 0, 0]);
    jumbo[18..20].fill(0);
    assert_untouched(&jumbo, Verdict::Pass(PassReason::ExtensionHeader));
    // Not ICMPv6: UDP, no next header.
    for next in [17u8, 59] {
        assert_untouched(
            &ipv6(PEER, LOCAL, next, 64, &m),
            Verdict::Pass(PassReason::NotIcmp),
        );
    }
}

#[test]
fn wrong_checksums_are_dropped() {
    let good = request(PEER, LOCAL, b"0123");
    for at in [56usize, 57, 58, 61, 62, 65] {
        let mut req = good.clone();
        req[at] ^= 0x10;
        assert_untouched(&req, Verdict::Malformed(MalformedReason::BadIcmpChecksum));
    }
    // A checksum computed without the pseudo-header.
    let mut req = good.clone();
    req[56..58].fill(0);
    let c = inet_sum(&req[54..]);
    req[56..58].copy_from_slice(&c.to_be_bytes());
    assert_untouched(&req, Verdict::Malformed(MalformedReason::BadIcmpChecksum));
    // A payload length cutting into the message: the sum over what it
    // bounds fails.
    let mut cut = good;
    cut[19] -= 2;
    assert_untouched(&cut, Verdict::Malformed(MalformedReason::BadIcmpChecksum));
}

#[test]
fn truncated_headers_and_lengths_are_malformed() {
    let req = request(PEER, LOCAL, b"");
    assert_untouched(
        &req[..14 + 39],
        Verdict::Malformed(MalformedReason::TruncatedIpv6),
    );
    // Payload length 8, only 7 bytes there.
    assert_untouched(
        &req[..req.len() - 1],
        Verdict::Malformed(MalformedReason::BadPayloadLength),
    );
    // Payload length 4 and 0: shorter than an ICMPv6 header.
    for len in [4u8, 0] {
        let mut short = req.clone();
        short[19] = len;
        assert_untouched(&short, Verdict::Malformed(MalformedReason::TruncatedIcmp));
    }
    let mut bad_version = req;
    bad_version[14] = 0x4b;
    assert_untouched(
        &bad_version,
        Verdict::Malformed(MalformedReason::BadVersion),
    );
}

#[test]
fn without_an_ipv6_address_nothing_is_answered() {
    let req = request(PEER, LOCAL, b"x");
    let v4_only = EchoConfig {
        addr6: [0; 16],
        ..CFG
    };
    let (v, out) = run_with(req.clone(), &v4_only);
    assert_eq!(v, Verdict::Pass(PassReason::NoAddress));
    assert_eq!(out, req);
}

#[test]
fn messages_longer_than_the_checked_limit_go_to_the_stack() {
    let too_long = vec![7u8; MAX_CHECKED_ICMP - 8 + 1];
    assert_untouched(
        &request(PEER, LOCAL, &too_long),
        Verdict::Pass(PassReason::TooLong),
    );
    let longest = vec![7u8; MAX_CHECKED_ICMP - 8];
    let (v, out) = run(request(PEER, LOCAL, &longest));
    assert_eq!(out, expected_reply(PEER, LOCAL, 0, &longest));
    assert_eq!(v, reply_len(&out));
}
