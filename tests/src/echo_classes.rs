//! The classes of frames an echo responder must tell apart, each with what
//! the kernel's own stack does with it: the same list drives the
//! `BPF_PROG_TEST_RUN` tests and the namespace tests in every attach mode.
//! Expected replies are built from scratch with the tests' own checksum
//! code ([`crate::packets`]), never by the code under test.

use crate::packets::{Echo, inet_checksum};

/// What the responder must do with a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// Answer with exactly this frame.
    Reply(Vec<u8>),
    /// Hand it on untouched: the stack decides.
    Pass,
    /// Drop it, as the kernel does (counted malformed).
    Drop,
}

/// One frame class.
#[derive(Debug, Clone)]
pub struct Class {
    pub name: &'static str,
    pub frame: Vec<u8>,
    pub expect: Expect,
}

/// Recomputes the ICMP checksum of an Ethernet + 20-byte IPv4 frame, over
/// the message as the IPv4 total length bounds it.
fn fix_icmp_checksum(frame: &mut [u8]) {
    let total = usize::from(u16::from_be_bytes([frame[16], frame[17]]));
    frame[36..38].fill(0);
    let c = inet_checksum(&frame[34..14 + total]);
    frame[36..38].copy_from_slice(&c.to_be_bytes());
}

/// Inserts a VLAN tag with `tpid` and VLAN ID 5 after the MAC addresses.
fn tagged(frame: &[u8], tpid: u16) -> Vec<u8> {
    let mut f = frame[..12].to_vec();
    f.extend_from_slice(&tpid.to_be_bytes());
    f.extend_from_slice(&[0x00, 0x05]);
    f.extend_from_slice(&frame[12..]);
    f
}

/// Every class, built around `base`: a valid echo request whose `dst_mac`
/// is the responder's interface MAC and whose `dst` is its address. Each
/// class gets its own sequence number (base's plus its index), so replies
/// are told apart.
#[must_use]
pub fn classes(base: &Echo) -> Vec<Class> {
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
    lengths_and_checksums(&mut next, &mut out);
    addresses(&mut next, &mut out);
    out
}

fn valid(next: &mut impl FnMut() -> Echo, out: &mut Vec<Class>) {
    let e = next();
    out.push(Class {
        name: "valid echo request",
        frame: e.frame(),
        expect: Expect::Reply(e.expected_reply().frame()),
    });
    for (name, len) in [
        ("ICMP message of exactly one 256-byte chunk", 248),
        ("ICMP message one byte past a chunk", 249),
        ("ICMP message of 1,400 bytes", 1392),
    ] {
        let mut e = next();
        e.payload = (0..len).map(|i: usize| (i * 7 + 3) as u8).collect();
        out.push(Class {
            name,
            frame: e.frame(),
            expect: Expect::Reply(e.expected_reply().frame()),
        });
    }
    // The kernel answers an echo request whatever its code, keeping it.
    let e = next();
    let mut f = e.frame();
    f[35] = 9;
    fix_icmp_checksum(&mut f);
    let mut r = e.expected_reply().frame();
    r[35] = 9;
    fix_icmp_checksum(&mut r);
    out.push(Class {
        name: "echo request with code 9",
        frame: f,
        expect: Expect::Reply(r),
    });
}

fn link_layer(next: &mut impl FnMut() -> Echo, iface_mac: [u8; 6], out: &mut Vec<Class>) {
    let mut e = next();
    e.dst_mac = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];
    out.push(Class {
        name: "destination MAC of another host",
        frame: e.frame(),
        expect: Expect::Pass,
    });
    for (name, mac) in [
        ("broadcast destination MAC", [0xff; 6]),
        (
            "IPv4 multicast destination MAC",
            [0x01, 0x00, 0x5e, 0x00, 0x00, 0x01],
        ),
        (
            "IPv6 multicast destination MAC",
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
    for (name, tpid) in [("802.1Q tag", 0x8100), ("802.1ad tag", 0x88a8)] {
        out.push(Class {
            name,
            frame: tagged(&next().frame(), tpid),
            expect: Expect::Pass,
        });
    }
    let mut e = next();
    e.src_mac = [0x01, 0x00, 0x5e, 0x00, 0x00, 0x09];
    out.push(Class {
        name: "multicast source MAC",
        frame: e.frame(),
        expect: Expect::Pass,
    });
}

fn lengths_and_checksums(next: &mut impl FnMut() -> Echo, out: &mut Vec<Class>) {
    let mut f = next().frame();
    f[40] ^= 0x01; // the sequence: the ICMP sum no longer holds
    out.push(Class {
        name: "bad ICMP checksum",
        frame: f,
        expect: Expect::Drop,
    });

    // IPv4 total length 6 bytes short: it cuts into the ICMP payload, so
    // the checksum of the message it bounds fails.
    let mut f = next().frame();
    let total = u16::from_be_bytes([f[16], f[17]]) - 6;
    f[16..18].copy_from_slice(&total.to_be_bytes());
    crate::packets::fix_ip_checksum(&mut f);
    out.push(Class {
        name: "total length cutting into the ICMP message",
        frame: f,
        expect: Expect::Drop,
    });

    // Bytes past the datagram (a sender's padding): the datagram is valid,
    // the reply carries the datagram only.
    let e = next();
    let mut f = e.frame();
    f.extend_from_slice(&[0x5a; 10]);
    out.push(Class {
        name: "bytes past the IPv4 total length",
        frame: f,
        expect: Expect::Reply(e.expected_reply().frame()),
    });
}

fn addresses(next: &mut impl FnMut() -> Echo, out: &mut Vec<Class>) {
    let mut e = next();
    e.src = e.dst;
    out.push(Class {
        name: "source address is the endpoint's own",
        frame: e.frame(),
        expect: Expect::Pass,
    });
    let mut e = next();
    e.src = std::net::Ipv4Addr::new(0, 1, 2, 3);
    out.push(Class {
        name: "source in 0.0.0.0/8",
        frame: e.frame(),
        expect: Expect::Pass,
    });
}
