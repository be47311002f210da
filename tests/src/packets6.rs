//! IPv6 test packets: `ICMPv6` echo built and checked with the tests' own
//! checksum code ([`inet_checksum`] over the RFC 8200 pseudo-header),
//! independent of `health_common::checksum`.

use std::net::Ipv6Addr;

use crate::packets::{ethernet, inet_checksum, tcp_numbers, tcp_segment};

/// `ICMPv6`'s next-header value.
pub const NEXT_ICMPV6: u8 = 58;

/// The `ICMPv6` checksum of `msg` (its checksum field zero, or in place for
/// a check: a correct message gives 0) between `src` and `dst`.
#[must_use]
pub fn icmpv6_checksum(src: Ipv6Addr, dst: Ipv6Addr, msg: &[u8]) -> u16 {
    let mut data = src.octets().to_vec();
    data.extend_from_slice(&dst.octets());
    data.extend_from_slice(&u32::try_from(msg.len()).expect("small").to_be_bytes());
    data.extend_from_slice(&[0, 0, 0, NEXT_ICMPV6]);
    data.extend_from_slice(msg);
    inet_checksum(&data)
}

/// The checksum over the IPv6 pseudo-header (RFC 8200 8.1) with next
/// header `next` and `segment` (TCP, UDP or `ICMPv6`; checksum field zero,
/// or in place for a check: a correct one gives 0).
#[must_use]
pub fn l4_checksum6(src: Ipv6Addr, dst: Ipv6Addr, next: u8, segment: &[u8]) -> u16 {
    let mut data = src.octets().to_vec();
    data.extend_from_slice(&dst.octets());
    data.extend_from_slice(&u32::try_from(segment.len()).expect("small").to_be_bytes());
    data.extend_from_slice(&[0, 0, 0, next]);
    data.extend_from_slice(segment);
    inet_checksum(&data)
}

/// A TCP segment (20-byte header, `payload`) over IPv6 in an Ethernet
/// frame, with a correct checksum, numbered as `packets::tcp`'s.
#[must_use]
pub fn tcp6(src: Ipv6Addr, dst: Ipv6Addr, ports: (u16, u16), flags: u8, payload: &[u8]) -> Vec<u8> {
    tcp6_numbered(src, dst, ports, flags, tcp_numbers(flags), payload)
}

/// [`tcp6`] numbered `(seq, ack)`.
#[must_use]
pub fn tcp6_numbered(
    src: Ipv6Addr,
    dst: Ipv6Addr,
    ports: (u16, u16),
    flags: u8,
    numbers: (u32, u32),
    payload: &[u8],
) -> Vec<u8> {
    let mut seg = tcp_segment(ports, flags, numbers, payload);
    let c = l4_checksum6(src, dst, 6, &seg);
    seg[16..18].copy_from_slice(&c.to_be_bytes());
    let ip = ipv6_packet(6 << 28, src, dst, 6, 64, &seg);
    ethernet([2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 1], 0x86dd, &ip)
}

/// A UDP datagram over IPv6 in an Ethernet frame, with a correct
/// checksum (mandatory over IPv6).
#[must_use]
pub fn udp6(src: Ipv6Addr, dst: Ipv6Addr, ports: (u16, u16)) -> Vec<u8> {
    let mut seg = vec![0u8; 8];
    seg[0..2].copy_from_slice(&ports.0.to_be_bytes());
    seg[2..4].copy_from_slice(&ports.1.to_be_bytes());
    seg.extend_from_slice(b"health");
    let len = u16::try_from(seg.len()).expect("small");
    seg[4..6].copy_from_slice(&len.to_be_bytes());
    let c = l4_checksum6(src, dst, 17, &seg);
    seg[6..8].copy_from_slice(&c.to_be_bytes());
    let ip = ipv6_packet(6 << 28, src, dst, 17, 64, &seg);
    ethernet([2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 1], 0x86dd, &ip)
}

/// An `ICMPv6` message of `kind`/`code` and `body` (what follows the
/// checksum) with a correct checksum.
#[must_use]
pub fn icmpv6_message(src: Ipv6Addr, dst: Ipv6Addr, kind: u8, code: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![kind, code, 0, 0];
    m.extend_from_slice(body);
    let c = icmpv6_checksum(src, dst, &m);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    m
}

/// An IPv6 packet: fixed header (`vcf` the version, traffic class and flow
/// label word) and `payload` after it.
#[must_use]
pub fn ipv6_packet(
    vcf: u32,
    src: Ipv6Addr,
    dst: Ipv6Addr,
    next: u8,
    hop_limit: u8,
    payload: &[u8],
) -> Vec<u8> {
    let mut p = vcf.to_be_bytes().to_vec();
    p.extend_from_slice(&u16::try_from(payload.len()).expect("small").to_be_bytes());
    p.extend_from_slice(&[next, hop_limit]);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(payload);
    p
}

/// An `ICMPv6` echo request (or, with `kind = 129`, reply) in an Ethernet
/// frame.
#[derive(Debug, Clone)]
pub struct Echo6 {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub hop_limit: u8,
    pub traffic_class: u8,
    pub flow_label: u32,
    pub kind: u8,
    pub code: u8,
    pub identifier: u16,
    pub sequence: u16,
    pub payload: Vec<u8>,
}

impl Echo6 {
    #[must_use]
    pub fn request(src: Ipv6Addr, dst: Ipv6Addr, identifier: u16, sequence: u16) -> Self {
        Self {
            src_mac: [0x02, 0, 0, 0, 0, 0x01],
            dst_mac: [0x02, 0, 0, 0, 0, 0x02],
            src,
            dst,
            hop_limit: 33,
            traffic_class: 0,
            flow_label: 0,
            kind: 128,
            code: 0,
            identifier,
            sequence,
            payload: (0..56u8).collect(),
        }
    }

    /// The `ICMPv6` message, checksummed.
    #[must_use]
    pub fn message(&self) -> Vec<u8> {
        let mut body = self.identifier.to_be_bytes().to_vec();
        body.extend_from_slice(&self.sequence.to_be_bytes());
        body.extend_from_slice(&self.payload);
        icmpv6_message(self.src, self.dst, self.kind, self.code, &body)
    }

    /// The version, traffic class and flow label word.
    #[must_use]
    pub fn vcf(&self) -> u32 {
        (6 << 28) | (u32::from(self.traffic_class) << 20) | (self.flow_label & 0xf_ffff)
    }

    /// The IPv6 packet.
    #[must_use]
    pub fn ip_packet(&self) -> Vec<u8> {
        ipv6_packet(
            self.vcf(),
            self.src,
            self.dst,
            NEXT_ICMPV6,
            self.hop_limit,
            &self.message(),
        )
    }

    /// The whole Ethernet frame.
    #[must_use]
    pub fn frame(&self) -> Vec<u8> {
        ethernet(self.dst_mac, self.src_mac, 0x86dd, &self.ip_packet())
    }

    /// The same frame carrying `ext` (extension headers whose last next
    /// header is 58) between the fixed header and the message; `first` is
    /// the fixed header's next header.
    #[must_use]
    pub fn frame_with_extension(&self, first: u8, ext: &[u8]) -> Vec<u8> {
        let mut payload = ext.to_vec();
        payload.extend_from_slice(&self.message());
        let ip = ipv6_packet(
            self.vcf(),
            self.src,
            self.dst,
            first,
            self.hop_limit,
            &payload,
        );
        ethernet(self.dst_mac, self.src_mac, 0x86dd, &ip)
    }

    /// The reply a correct responder produces, built from scratch: MACs
    /// and addresses swapped, hop limit 64, type 129, checksum computed
    /// anew; traffic class and flow label reflected.
    #[must_use]
    pub fn expected_reply(&self) -> Self {
        Self {
            src_mac: self.dst_mac,
            dst_mac: self.src_mac,
            src: self.dst,
            dst: self.src,
            hop_limit: 64,
            kind: 129,
            ..self.clone()
        }
    }
}

/// Checks an Ethernet frame carrying IPv6 + `ICMPv6` (no extension header):
/// the lengths agree and the `ICMPv6` checksum (pseudo-header included)
/// holds. Returns the source, destination and message.
pub fn verify_icmpv6_frame(frame: &[u8]) -> Result<(Ipv6Addr, Ipv6Addr, &[u8]), String> {
    if frame.len() < 14 + 40 + 8 || frame[12..14] != [0x86, 0xdd] {
        return Err(format!("{} bytes: not IPv6 + ICMPv6", frame.len()));
    }
    let ip = &frame[14..];
    let payload_len = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
    if ip[0] >> 4 != 6 || ip[6] != NEXT_ICMPV6 || payload_len != ip.len() - 40 {
        return Err(format!(
            "bad IPv6 header: version {}, next header {}, payload length {payload_len} of {}",
            ip[0] >> 4,
            ip[6],
            ip.len() - 40
        ));
    }
    let octets = |b: &[u8]| -> [u8; 16] { b.try_into().unwrap_or([0; 16]) };
    let src = Ipv6Addr::from(octets(&ip[8..24]));
    let dst = Ipv6Addr::from(octets(&ip[24..40]));
    let msg = &ip[40..];
    if icmpv6_checksum(src, dst, msg) != 0 {
        return Err("ICMPv6 checksum is wrong".into());
    }
    Ok((src, dst, msg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_known_checksum() {
        // fe80::1 -> fe80::2, echo request id 1 seq 1, no data: the sum by
        // hand over the non-zero words (0xfe80 twice, 1, 2, length 8, next
        // header 58, type/code 0x8000, id 1, seq 1).
        let (src, dst): (Ipv6Addr, Ipv6Addr) = (
            "2001:2::1".parse().expect("addr"),
            "2001:2::2".parse().expect("addr"),
        );
        let syn = tcp6(src, dst, (40_000, 4240), 0x02, b"");
        assert_eq!((syn.len(), syn[14 + 6]), (14 + 40 + 20, 6));
        assert_eq!(l4_checksum6(src, dst, 6, &syn[54..]), 0);
        let udp = udp6(src, dst, (1, 2));
        assert_eq!(l4_checksum6(src, dst, 17, &udp[54..]), 0);
        let echo = icmpv6_message(src, dst, 128, 0, &[0, 1, 0, 1]);
        assert_eq!(l4_checksum6(src, dst, NEXT_ICMPV6, &echo), 0);
    }
}
