use std::{vec, vec::Vec};

use super::*;
use crate::frame::SliceFrame;

const LOCAL: [u8; 4] = [198, 18, 0, 2];
const PEER: [u8; 4] = [198, 18, 0, 1];
const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 0xa];
const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 0xb];
const CFG: EchoConfig = EchoConfig {
    addr: LOCAL,
    mac: MAC_B,
    flags: 0,
    reserved: 0,
    addr6: [0; 16],
    own4: [[0; 4]; OWN_SLOTS],
    own6: [[0; 16]; OWN_SLOTS],
};

/// Reference RFC 1071 checksum, written separately from `checksum`.
fn inet_sum(data: &[u8]) -> u16 {
    let mut sum: u64 = 0;
    let (words, rest) = data.as_chunks::<2>();
    for w in words {
        sum += u64::from(u16::from_be_bytes(*w));
    }
    if let [last] = rest {
        sum += u64::from(*last) << 8;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

fn echo_request(src: [u8; 4], dst: [u8; 4], payload: &[u8]) -> Vec<u8> {
    let total = 20 + 8 + payload.len();
    let mut p = Vec::new();
    p.extend_from_slice(&MAC_B);
    p.extend_from_slice(&MAC_A);
    p.extend_from_slice(&[0x08, 0x00]);
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    ip[4..6].copy_from_slice(&0x4242u16.to_be_bytes());
    ip[6] = 0x40; // DF
    ip[8] = 17; // an odd TTL, so the reply's TTL change is visible
    ip[9] = 1;
    ip[12..16].copy_from_slice(&src);
    ip[16..20].copy_from_slice(&dst);
    let c = inet_sum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    p.extend_from_slice(&ip);
    let mut icmp = Vec::from([8u8, 0, 0, 0, 0x12, 0x34, 0x00, 0x07]);
    icmp.extend_from_slice(payload);
    let c = inet_sum(&icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    p.extend_from_slice(&icmp);
    p
}

fn run(p: Vec<u8>) -> (Verdict, Vec<u8>) {
    run_with(p, &CFG)
}

fn run_with(mut p: Vec<u8>, cfg: &EchoConfig) -> (Verdict, Vec<u8>) {
    let v = respond(&mut SliceFrame::new(&mut p), cfg, false);
    (v, p)
}

fn reply_len(req: &[u8]) -> Verdict {
    Verdict::Reply {
        len: u16::try_from(req.len()).expect("small"),
    }
}

fn assert_untouched(input: &[u8], expect: Verdict) {
    let (v, out) = run(input.to_vec());
    assert_eq!(v, expect);
    assert_eq!(out, input, "a {expect:?} packet must not be modified");
}

#[test]
fn valid_request_becomes_reply_with_valid_checksums() {
    let payload: Vec<u8> = (0..56u8).collect();
    let req = echo_request(PEER, LOCAL, &payload);
    let (v, out) = run(req.clone());
    assert_eq!(v, reply_len(&req));
    assert_eq!(out.len(), req.len());
    assert_eq!(out[0..6], MAC_A, "dst MAC is the requester");
    assert_eq!(out[6..12], MAC_B);
    assert_eq!(out[26..30], LOCAL, "reply source");
    assert_eq!(out[30..34], PEER, "reply destination");
    assert_eq!(out[22], REPLY_TTL);
    assert_eq!(inet_sum(&out[14..34]), 0, "IP header checksum");
    assert_eq!(out[34], ICMP_ECHO_REPLY);
    assert_eq!(out[35], 0);
    assert_eq!(inet_sum(&out[34..]), 0, "ICMP checksum");
    assert_eq!(out[38..42], req[38..42], "identifier and sequence kept");
    assert_eq!(out[42..], payload[..], "payload kept");
}

#[test]
fn odd_length_payload_and_padding_survive() {
    let mut req = echo_request(PEER, LOCAL, &[0xff; 3]);
    req.extend_from_slice(&[0; 15]); // Ethernet minimum-frame padding
    let (v, out) = run(req);
    // The reply is cut to the datagram: the padding is not echoed.
    assert_eq!(v, Verdict::Reply { len: 14 + 20 + 11 });
    assert_eq!(inet_sum(&out[34..34 + 11]), 0);
}

#[test]
fn bytes_past_the_total_length_are_not_checksummed_or_echoed() {
    // Non-zero trailing bytes (not link padding): the ICMP checksum covers
    // only what the IPv4 total length bounds, as the kernel's does after
    // trimming the skb.
    let mut req = echo_request(PEER, LOCAL, b"abcdef");
    let datagram = req.len();
    req.extend_from_slice(&[0xa5; 9]);
    let (v, out) = run(req);
    assert_eq!(
        v,
        Verdict::Reply {
            len: u16::try_from(datagram).expect("small")
        }
    );
    assert_eq!(inet_sum(&out[34..datagram]), 0, "reply checksum");

    // Total length cutting into the ICMP message: the checksum of what is
    // left no longer holds, and the kernel drops it.
    let mut cut = echo_request(PEER, LOCAL, b"abcdefgh");
    let total = u16::from_be_bytes([cut[16], cut[17]]) - 4;
    cut[16..18].copy_from_slice(&total.to_be_bytes());
    refresh_ip_checksum(&mut cut);
    assert_untouched(&cut, Verdict::Malformed(MalformedReason::BadIcmpChecksum));
}

#[test]
fn a_wrong_icmp_checksum_is_dropped() {
    for at in [36usize, 37, 42, 45] {
        let mut req = echo_request(PEER, LOCAL, b"0123");
        req[at] ^= 0x10;
        assert_untouched(&req, Verdict::Malformed(MalformedReason::BadIcmpChecksum));
    }
}

#[test]
fn an_echo_with_a_nonzero_code_is_answered_keeping_the_code() {
    let mut req = echo_request(PEER, LOCAL, b"xy");
    req[35] = 7;
    let sum = inet_sum(&{
        let mut m = req[34..].to_vec();
        m[2] = 0;
        m[3] = 0;
        m
    });
    req[36..38].copy_from_slice(&sum.to_be_bytes());
    let (v, out) = run(req.clone());
    assert_eq!(v, reply_len(&req));
    assert_eq!((out[34], out[35]), (ICMP_ECHO_REPLY, 7));
    assert_eq!(inet_sum(&out[34..]), 0);
}

#[test]
fn frames_for_another_host_are_passed() {
    let mut req = echo_request(PEER, LOCAL, b"x");
    req[0..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 0xc]);
    assert_untouched(&req, Verdict::Pass(PassReason::OtherHost));
}

#[test]
fn group_addressed_frames_are_answered_from_the_interface_mac() {
    for dst in [
        [0xff; 6],
        [0x01, 0x00, 0x5e, 0x00, 0x00, 0x01],
        [0x33, 0x33, 0x00, 0x00, 0x00, 0x01],
    ] {
        let mut req = echo_request(PEER, LOCAL, b"x");
        req[0..6].copy_from_slice(&dst);
        let (v, out) = run(req.clone());
        assert_eq!(v, reply_len(&req), "{dst:02x?}");
        assert_eq!(out[0..6], MAC_A, "to the requester");
        assert_eq!(out[6..12], MAC_B, "from the interface, not {dst:02x?}");
        // Where the interface drops unicast IP in L2 multicast, the stack
        // decides (and drops it).
        let strict = EchoConfig {
            flags: EchoConfig::DROP_UNICAST_IN_L2_MULTICAST,
            ..CFG
        };
        let (v, out) = run_with(req.clone(), &strict);
        assert_eq!(v, Verdict::Pass(PassReason::UnicastInL2Multicast));
        assert_eq!(out, req);
    }
}

#[test]
fn group_or_zero_source_macs_are_passed() {
    for src in [[0xff; 6], [0x01, 0x00, 0x5e, 0, 0, 1], [0; 6]] {
        let mut req = echo_request(PEER, LOCAL, b"x");
        req[6..12].copy_from_slice(&src);
        assert_untouched(&req, Verdict::Pass(PassReason::BadSourceMac));
    }
}

#[test]
fn vlan_tagged_frames_are_passed() {
    let plain = echo_request(PEER, LOCAL, b"x");
    for tpid in [0x8100u16, 0x88a8] {
        // Tag still in the frame (XDP sees it so).
        let mut tagged = plain[..12].to_vec();
        tagged.extend_from_slice(&tpid.to_be_bytes());
        tagged.extend_from_slice(&[0x00, 0x05]);
        tagged.extend_from_slice(&plain[12..]);
        assert_untouched(&tagged, Verdict::Pass(PassReason::Vlan));
    }
    // Tag already taken off by the stack (tc sees it so).
    let mut p = plain.clone();
    let v = respond(&mut SliceFrame::new(&mut p), &CFG, true);
    assert_eq!(v, Verdict::Pass(PassReason::Vlan));
    assert_eq!(p, plain);
}

#[test]
fn messages_longer_than_the_checked_limit_go_to_the_stack() {
    let req = echo_request(PEER, LOCAL, &vec![7u8; MAX_CHECKED_ICMP - 8 + 1]);
    assert_untouched(&req, Verdict::Pass(PassReason::TooLong));
    let req = echo_request(PEER, LOCAL, &vec![7u8; MAX_CHECKED_ICMP - 8]);
    assert_eq!(run(req.clone()).0, reply_len(&req));
}

#[test]
fn request_to_another_address_is_passed() {
    let req = echo_request(PEER, [198, 18, 0, 3], b"x");
    assert_untouched(&req, Verdict::Pass(PassReason::NotForEndpoint));
}

#[test]
fn no_configured_address_passes_everything() {
    let mut req = echo_request(PEER, LOCAL, b"x");
    let v = respond(
        &mut SliceFrame::new(&mut req),
        &EchoConfig::default(),
        false,
    );
    assert_eq!(v, Verdict::Pass(PassReason::NoAddress));
    let no_mac = EchoConfig { mac: [0; 6], ..CFG };
    let v = respond(&mut SliceFrame::new(&mut req), &no_mac, false);
    assert_eq!(v, Verdict::Pass(PassReason::NoAddress));
}

#[test]
fn non_ip_is_passed() {
    let mut req = echo_request(PEER, LOCAL, b"x");
    req[12..14].copy_from_slice(&0x0806u16.to_be_bytes());
    assert_untouched(&req, Verdict::Pass(PassReason::NotIp));
}

#[test]
fn non_icmp_is_passed() {
    let mut req = echo_request(PEER, LOCAL, b"x");
    req[23] = 17; // UDP
    let c = inet_sum(&{
        let mut h = req[14..34].to_vec();
        h[10] = 0;
        h[11] = 0;
        h
    });
    req[24..26].copy_from_slice(&c.to_be_bytes());
    assert_untouched(&req, Verdict::Pass(PassReason::NotIcmp));
}

#[test]
fn echo_reply_and_other_icmp_types_are_passed() {
    for kind in [0u8, 3, 11, 13] {
        let mut req = echo_request(PEER, LOCAL, b"x");
        req[34] = kind;
        assert_untouched(&req, Verdict::Pass(PassReason::NotEchoRequest));
    }
}

fn refresh_ip_checksum(p: &mut [u8]) {
    let ihl = usize::from(p[14] & 0x0f) * 4;
    p[24] = 0;
    p[25] = 0;
    let c = inet_sum(&p[14..14 + ihl]);
    p[24..26].copy_from_slice(&c.to_be_bytes());
}

#[test]
fn fragments_are_passed() {
    for frag in [0x2000u16, 0x0001, 0x20b9] {
        let mut req = echo_request(PEER, LOCAL, b"x");
        req[20..22].copy_from_slice(&frag.to_be_bytes());
        refresh_ip_checksum(&mut req);
        assert_untouched(&req, Verdict::Pass(PassReason::Fragment));
    }
}

#[test]
fn ip_options_are_passed() {
    let base = echo_request(PEER, LOCAL, b"abcd");
    // Insert a 4-byte NOP/EOL option block after the fixed header.
    let mut req = base[..34].to_vec();
    req.extend_from_slice(&[1, 1, 1, 0]);
    req.extend_from_slice(&base[34..]);
    req[14] = 0x46;
    let total = (req.len() - 14) as u16;
    req[16..18].copy_from_slice(&total.to_be_bytes());
    refresh_ip_checksum(&mut req);
    assert_untouched(&req, Verdict::Pass(PassReason::IpOptions));
}

#[test]
fn martian_sources_are_passed() {
    for src in [
        [0, 0, 0, 0],
        [0, 1, 2, 3],
        LOCAL,
        [127, 0, 0, 1],
        [224, 0, 0, 1],
        [255, 255, 255, 255],
    ] {
        let req = echo_request(src, LOCAL, b"x");
        assert_untouched(&req, Verdict::Pass(PassReason::MartianSource));
    }
}

#[test]
fn requests_from_the_interfaces_other_addresses_are_passed() {
    let second = [198, 18, 0, 9];
    let mut own4 = [[0; 4]; OWN_SLOTS];
    own4[OWN_SLOTS - 1] = second;
    let cfg = EchoConfig { own4, ..CFG };
    let req = echo_request(second, LOCAL, b"x");
    let (v, out) = run_with(req.clone(), &cfg);
    assert_eq!(v, Verdict::Pass(PassReason::MartianSource));
    assert_eq!(out, req);
    assert_eq!(run(req.clone()).0, reply_len(&req), "answered without it");
    // Another source is still answered.
    let other = echo_request(PEER, LOCAL, b"x");
    assert_eq!(run_with(other.clone(), &cfg).0, reply_len(&other));
    // More addresses than slots: every IPv4 request goes to the stack.
    let more = EchoConfig {
        flags: EchoConfig::MORE_OWN4,
        ..cfg
    };
    let (v, out) = run_with(other.clone(), &more);
    assert_eq!(v, Verdict::Pass(PassReason::OwnSource));
    assert_eq!(out, other);
}

#[test]
fn truncated_headers_are_malformed() {
    let req = echo_request(PEER, LOCAL, b"");
    for (len, reason) in [
        (0, MalformedReason::TruncatedEthernet),
        (13, MalformedReason::TruncatedEthernet),
        (14, MalformedReason::TruncatedIpv4),
        (33, MalformedReason::TruncatedIpv4),
        // IP total length says 28, the frame holds less.
        (40, MalformedReason::BadTotalLength),
    ] {
        assert_untouched(&req[..len], Verdict::Malformed(reason));
    }
}

#[test]
fn icmp_shorter_than_its_header_is_malformed() {
    let mut req = echo_request(PEER, LOCAL, b"");
    req.truncate(38);
    req[16..18].copy_from_slice(&24u16.to_be_bytes());
    refresh_ip_checksum(&mut req);
    assert_untouched(&req, Verdict::Malformed(MalformedReason::TruncatedIcmp));
}

#[test]
fn invalid_ip_headers_are_malformed() {
    let good = echo_request(PEER, LOCAL, b"x");

    let mut bad_version = good.clone();
    bad_version[14] = 0x65;
    refresh_ip_checksum(&mut bad_version);
    assert_untouched(
        &bad_version,
        Verdict::Malformed(MalformedReason::BadVersion),
    );

    let mut short_ihl = good.clone();
    short_ihl[14] = 0x44;
    assert_untouched(
        &short_ihl,
        Verdict::Malformed(MalformedReason::BadHeaderLength),
    );

    let mut short_total = good.clone();
    short_total[16..18].copy_from_slice(&10u16.to_be_bytes());
    refresh_ip_checksum(&mut short_total);
    assert_untouched(
        &short_total,
        Verdict::Malformed(MalformedReason::BadTotalLength),
    );

    // Total length 0: a BIG TCP packet is passed to the stack, an ICMP
    // message so marked is malformed.
    let mut big_tcp = good.clone();
    big_tcp[16..18].copy_from_slice(&0u16.to_be_bytes());
    big_tcp[23] = 6;
    refresh_ip_checksum(&mut big_tcp);
    assert_untouched(&big_tcp, Verdict::Pass(PassReason::NotIcmp));
    let mut zero_total = good.clone();
    zero_total[16..18].copy_from_slice(&0u16.to_be_bytes());
    refresh_ip_checksum(&mut zero_total);
    assert_untouched(
        &zero_total,
        Verdict::Malformed(MalformedReason::BadTotalLength),
    );

    let mut bad_sum = good;
    bad_sum[24] ^= 0x55;
    assert_untouched(&bad_sum, Verdict::Malformed(MalformedReason::BadIpChecksum));
}

#[test]
fn verdicts_map_to_counters() {
    assert_eq!(Verdict::Reply { len: 42 }.counter(), EchoCounter::Answered);
    assert_eq!(
        Verdict::Pass(PassReason::NotIcmp).counter(),
        EchoCounter::Passed
    );
    assert_eq!(
        Verdict::Malformed(MalformedReason::BadVersion).counter(),
        EchoCounter::Malformed
    );
}
