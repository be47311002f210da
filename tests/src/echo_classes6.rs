//! The IPv6 frame classes an echo responder must tell apart, each with
//! what the kernel's stack does with it (see [`crate::echo_classes`] for
//! IPv4): the same list drives the `BPF_PROG_TEST_RUN` tests and the
//! namespace tests. Expected replies are built from scratch with the
//! tests' own checksum code ([`crate::packets6`]).

use std::net::Ipv6Addr;

use crate::{
    echo_classes::{Class, Expect},
    packets6::{Echo6, NEXT_ICMPV6, icmpv6_message, ipv6_packet},
};

/// Every class, built around `base`: a valid echo request whose `dst_mac`
/// is the responder's interface MAC and whose `dst` is its address. Each
/// class gets its own sequence number, so replies are told apart.
#[must_use]
pub fn classes6(base: &Echo6) -> Vec<Class> {
    let mut seq = base.sequence;
    let mut next = || {
        seq = seq.wrapping_add(1);
        let mut e = base.clone();
        e.sequence = seq;
        e
    };
    let mut out = Vec::new();
    valid(&mut next, &mut out);
    link_layer(&mut next, base.dst_mac, &mut out);
    checksums_and_lengths(&mut next, &mut out);
    addresses(&mut next, &mut out);
    other_messages(&mut next, &mut out);
    out
}

fn reply(name: &'static str, e: &Echo6) -> Class {
    Class {
        name,
        frame: e.frame(),
        expect: Expect::Reply(e.expected_reply().frame()),
    }
}

fn pass(name: &'static str, frame: Vec<u8>) -> Class {
    Class {
        name,
        frame,
        expect: Expect::Pass,
    }
}

fn drop(name: &'static str, frame: Vec<u8>) -> Class {
    Class {
        name,
        frame,
        expect: Expect::Drop,
    }
}

fn valid(next: &mut impl FnMut() -> Echo6, out: &mut Vec<Class>) {
    out.push(reply("valid ICMPv6 echo request", &next()));
    for (name, len) in [
        ("ICMPv6 message of exactly one 256-byte chunk", 248),
        ("ICMPv6 message one byte past a chunk", 249),
        ("ICMPv6 message of 1,400 bytes", 1392),
        ("ICMPv6 echo without data", 0),
        ("ICMPv6 echo with odd-sized data", 7),
    ] {
        let mut e = next();
        e.payload = (0..len).map(|i: usize| (i * 7 + 3) as u8).collect();
        out.push(reply(name, &e));
    }
    let mut e = next();
    e.code = 9;
    out.push(reply("ICMPv6 echo request with code 9", &e));
    // ip6_rcv_core does not look at the hop limit of a packet for this
    // host: the kernel answers.
    let mut e = next();
    e.hop_limit = 0;
    out.push(reply("ICMPv6 echo request with hop limit 0", &e));
}

fn link_layer(next: &mut impl FnMut() -> Echo6, iface_mac: [u8; 6], out: &mut Vec<Class>) {
    let mut e = next();
    e.dst_mac = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];
    out.push(pass("IPv6: destination MAC of another host", e.frame()));
    for (name, mac) in [
        ("IPv6: broadcast destination MAC", [0xff; 6]),
        (
            "IPv6: all-nodes multicast destination MAC",
            [0x33, 0x33, 0x00, 0x00, 0x00, 0x01],
        ),
    ] {
        let mut e = next();
        e.dst_mac = mac;
        // The kernel answers from the interface's own MAC.
        let mut r = e.expected_reply();
        r.src_mac = iface_mac;
        out.push(Class {
            name,
            frame: e.frame(),
            expect: Expect::Reply(r.frame()),
        });
    }
    let mut e = next();
    e.src_mac = [0x33, 0x33, 0x00, 0x00, 0x00, 0x09];
    out.push(pass("IPv6: multicast source MAC", e.frame()));
}

fn checksums_and_lengths(next: &mut impl FnMut() -> Echo6, out: &mut Vec<Class>) {
    let mut f = next().frame();
    f[14 + 40 + 6] ^= 0x01; // the sequence: the sum no longer holds
    out.push(drop("bad ICMPv6 checksum", f));

    // A checksum over the message alone, without the pseudo-header.
    let mut f = next().frame();
    f[56..58].fill(0);
    let c = crate::packets::inet_checksum(&f[54..]);
    f[56..58].copy_from_slice(&c.to_be_bytes());
    out.push(drop("ICMPv6 checksum without the pseudo-header", f));

    // Payload length 6 bytes short: it cuts into the message.
    let mut f = next().frame();
    let len = u16::from_be_bytes([f[18], f[19]]) - 6;
    f[18..20].copy_from_slice(&len.to_be_bytes());
    out.push(drop("payload length cutting into the ICMPv6 message", f));

    // Payload length past the end of the frame.
    let mut f = next().frame();
    let len = u16::from_be_bytes([f[18], f[19]]) + 8;
    f[18..20].copy_from_slice(&len.to_be_bytes());
    out.push(drop("payload length past the frame", f));

    // Payload length 4: shorter than an ICMPv6 header.
    let mut f = next().frame();
    f[18..20].copy_from_slice(&4u16.to_be_bytes());
    out.push(drop("ICMPv6 header cut at 4 bytes", f));

    // Bytes past the payload (a sender's padding): cut from the reply.
    let e = next();
    let mut f = e.frame();
    f.extend_from_slice(&[0x5a; 10]);
    out.push(Class {
        name: "bytes past the IPv6 payload length",
        frame: f,
        expect: Expect::Reply(e.expected_reply().frame()),
    });
}

fn addresses(next: &mut impl FnMut() -> Echo6, out: &mut Vec<Class>) {
    let mut e = next();
    e.dst = Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 0x99);
    out.push(pass("ICMPv6 echo to another address", e.frame()));
    let mut e = next();
    e.dst = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
    e.dst_mac = [0x33, 0x33, 0, 0, 0, 1];
    out.push(pass("ICMPv6 echo to all-nodes multicast", e.frame()));
    let mut e = next();
    e.src = e.dst;
    out.push(pass("IPv6 source is the endpoint's own", e.frame()));
    let mut e = next();
    e.src = Ipv6Addr::UNSPECIFIED;
    out.push(pass("IPv6 source unspecified", e.frame()));
    let mut e = next();
    e.src = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
    out.push(pass("IPv6 multicast source", e.frame()));
}

fn other_messages(next: &mut impl FnMut() -> Echo6, out: &mut Vec<Class>) {
    let e = next();
    // Neighbour solicitation for the endpoint's address, to its
    // solicited-node group, hop limit 255, with a source link-layer
    // address option.
    let t = e.dst.octets();
    let group = Ipv6Addr::from([
        0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, t[13], t[14], t[15],
    ]);
    let mut body = vec![0; 4];
    body.extend_from_slice(&t);
    body.extend_from_slice(&[1, 1]);
    body.extend_from_slice(&e.src_mac);
    let ns = icmpv6_message(e.src, group, 135, 0, &body);
    let ip = ipv6_packet(e.vcf(), e.src, group, NEXT_ICMPV6, 255, &ns);
    let mac = [0x33, 0x33, 0xff, t[13], t[14], t[15]];
    out.push(pass(
        "neighbour solicitation",
        crate::packets::ethernet(mac, e.src_mac, 0x86dd, &ip),
    ));
    // The same solicitation unicast (a reachability check).
    let ns = icmpv6_message(e.src, e.dst, 135, 0, &body);
    let ip = ipv6_packet(e.vcf(), e.src, e.dst, NEXT_ICMPV6, 255, &ns);
    out.push(pass(
        "unicast neighbour solicitation",
        crate::packets::ethernet(e.dst_mac, e.src_mac, 0x86dd, &ip),
    ));
    let mut e = next();
    e.kind = 129;
    out.push(pass("ICMPv6 echo reply", e.frame()));

    // Extension headers before an echo request: destination options (a
    // PadN), routing type 0 with no segments left, hop-by-hop (router
    // alert, as MLD sends it), a first fragment.
    let dst_opts = [NEXT_ICMPV6, 0, 1, 4, 0, 0, 0, 0];
    let routing = [NEXT_ICMPV6, 0, 0, 0, 0, 0, 0, 0];
    let hop_by_hop = [NEXT_ICMPV6, 0, 5, 2, 0, 0, 1, 0];
    let fragment = [NEXT_ICMPV6, 0, 0, 1, 0, 0, 0x12, 0x34];
    for (name, first, ext) in [
        ("destination options header", 60, dst_opts),
        ("routing header", 43, routing),
        ("hop-by-hop header", 0, hop_by_hop),
        ("fragment header", 44, fragment),
    ] {
        out.push(pass(name, next().frame_with_extension(first, &ext)));
    }
}
