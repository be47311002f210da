//! Test packets, built and checked with checksum code of their own
//! (independent of `health_common::checksum`, the code under test).

use std::net::Ipv4Addr;

/// RFC 1071 Internet checksum of `data` (odd lengths padded with a zero).
#[must_use]
pub fn inet_checksum(data: &[u8]) -> u16 {
    let mut sum: u64 = data
        .chunks(2)
        .map(|c| u64::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)])))
        .sum();
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An ICMP echo request (or, with `kind = 0`, reply) in an Ethernet frame.
#[derive(Debug, Clone)]
pub struct Echo {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub ttl: u8,
    pub ip_id: u16,
    pub kind: u8,
    pub identifier: u16,
    pub sequence: u16,
    pub payload: Vec<u8>,
}

impl Echo {
    #[must_use]
    pub fn request(src: Ipv4Addr, dst: Ipv4Addr, identifier: u16, sequence: u16) -> Self {
        Self {
            src_mac: [0x02, 0, 0, 0, 0, 0x01],
            dst_mac: [0x02, 0, 0, 0, 0, 0x02],
            src,
            dst,
            ttl: 33,
            ip_id: 0x1c46,
            kind: 8,
            identifier,
            sequence,
            payload: (0..56u8).collect(),
        }
    }

    /// The IPv4 packet (header without options, ICMP header, payload).
    #[must_use]
    pub fn ip_packet(&self) -> Vec<u8> {
        let mut icmp = vec![self.kind, 0, 0, 0];
        icmp.extend_from_slice(&self.identifier.to_be_bytes());
        icmp.extend_from_slice(&self.sequence.to_be_bytes());
        icmp.extend_from_slice(&self.payload);
        let c = inet_checksum(&icmp);
        icmp[2..4].copy_from_slice(&c.to_be_bytes());
        let mut ip = ipv4_header(self.src, self.dst, 1, self.ttl, self.ip_id, icmp.len());
        ip.extend_from_slice(&icmp);
        ip
    }

    /// The whole Ethernet frame.
    #[must_use]
    pub fn frame(&self) -> Vec<u8> {
        ethernet(self.dst_mac, self.src_mac, 0x0800, &self.ip_packet())
    }

    /// The reply a correct responder produces for this request, built from
    /// scratch: addresses swapped, TTL 64, type 0, checksums recomputed.
    #[must_use]
    pub fn expected_reply(&self) -> Self {
        Self {
            src_mac: self.dst_mac,
            dst_mac: self.src_mac,
            src: self.dst,
            dst: self.src,
            ttl: 64,
            kind: 0,
            ..self.clone()
        }
    }
}

/// A 20-byte IPv4 header (DF set) with a correct checksum.
#[must_use]
pub fn ipv4_header(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    proto: u8,
    ttl: u8,
    id: u16,
    payload_len: usize,
) -> Vec<u8> {
    let total = u16::try_from(20 + payload_len).expect("packet fits in 64 KiB");
    let mut h = vec![0x45, 0];
    h.extend_from_slice(&total.to_be_bytes());
    h.extend_from_slice(&id.to_be_bytes());
    h.extend_from_slice(&[0x40, 0, ttl, proto, 0, 0]);
    h.extend_from_slice(&src.octets());
    h.extend_from_slice(&dst.octets());
    let c = inet_checksum(&h);
    h[10..12].copy_from_slice(&c.to_be_bytes());
    h
}

#[must_use]
pub fn ethernet(dst: [u8; 6], src: [u8; 6], ether_type: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = dst.to_vec();
    f.extend_from_slice(&src);
    f.extend_from_slice(&ether_type.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Recomputes the IPv4 header checksum of a frame in place.
pub fn fix_ip_checksum(frame: &mut [u8]) {
    let ihl = usize::from(frame[14] & 0x0f) * 4;
    frame[24..26].fill(0);
    let c = inet_checksum(&frame[14..14 + ihl]);
    frame[24..26].copy_from_slice(&c.to_be_bytes());
}

/// An IPv4 frame (20-byte header) with a 4-byte IP option (NOP, NOP, NOP,
/// EOL) block inserted.
#[must_use]
pub fn with_ip_options(frame: &[u8]) -> Vec<u8> {
    let mut out = frame[..34].to_vec();
    out.extend_from_slice(&[1, 1, 1, 0]);
    out.extend_from_slice(&frame[34..]);
    out[14] = 0x46;
    let total = u16::try_from(out.len() - 14).expect("small");
    out[16..18].copy_from_slice(&total.to_be_bytes());
    fix_ip_checksum(&mut out);
    out
}

/// The request as a first fragment (more-fragments set).
#[must_use]
pub fn as_fragment(echo: &Echo) -> Vec<u8> {
    let mut f = echo.frame();
    f[20] = 0x20;
    f[21] = 0;
    fix_ip_checksum(&mut f);
    f
}

/// The IPv4 frame `frame` (20-byte header) as two fragments: the first
/// carrying the first `at` bytes of its payload (a multiple of 8), More
/// Fragments set; the last the rest, at offset `at`. Both keep the
/// datagram's identification; each has its own header checksum.
#[must_use]
pub fn split_fragments(frame: &[u8], at: usize) -> [Vec<u8>; 2] {
    assert!(
        at.is_multiple_of(8) && frame.len() > 34 + at,
        "split at {at}"
    );
    let piece = |payload: &[u8], frags: u16| {
        let mut f = frame[..34].to_vec();
        f.extend_from_slice(payload);
        let total = u16::try_from(f.len() - 14).expect("small");
        f[16..18].copy_from_slice(&total.to_be_bytes());
        f[20..22].copy_from_slice(&frags.to_be_bytes());
        fix_ip_checksum(&mut f);
        f
    };
    let offset = u16::try_from(at / 8).expect("small");
    [
        piece(&frame[34..34 + at], 0x2000),
        piece(&frame[34 + at..], offset),
    ]
}

/// The datagram of two fragments as one frame (the first's Ethernet and IP
/// header, flags cleared, length and checksum made anew), after checking
/// that they belong together: the same addresses, protocol and
/// identification, each header's checksum valid, the first with More
/// Fragments at offset 0 and the second ending the datagram where the
/// first ends.
pub fn reassemble(first: &[u8], last: &[u8]) -> Result<Vec<u8>, String> {
    for f in [first, last] {
        if f.len() < 34 || inet_checksum(&f[14..34]) != 0 {
            return Err("a fragment's IPv4 header checksum is wrong".into());
        }
    }
    if first[26..34] != last[26..34] || first[23] != last[23] || first[18..20] != last[18..20] {
        return Err(format!(
            "not one datagram: {:?} and {:?}",
            &first[18..34],
            &last[18..34]
        ));
    }
    let frags = |f: &[u8]| u16::from_be_bytes([f[20], f[21]]);
    let first_len = first.len() - 34;
    if frags(first) != 0x2000 || usize::from(frags(last)) * 8 != first_len {
        return Err(format!(
            "fragment fields {:#06x} and {:#06x} for a first part of {first_len} bytes",
            frags(first),
            frags(last)
        ));
    }
    let mut whole = first.to_vec();
    whole.extend_from_slice(&last[34..]);
    let total = u16::try_from(whole.len() - 14).expect("small");
    whole[16..18].copy_from_slice(&total.to_be_bytes());
    whole[20..22].copy_from_slice(&[0, 0]);
    fix_ip_checksum(&mut whole);
    Ok(whole)
}

/// A UDP datagram between the same addresses.
#[must_use]
pub fn udp(echo: &Echo) -> Vec<u8> {
    let mut udp = vec![0x30, 0x39, 0x10, 0x90, 0, 12, 0, 0];
    udp.extend_from_slice(b"ping");
    let mut ip = ipv4_header(echo.src, echo.dst, 17, 64, 1, udp.len());
    ip.extend_from_slice(&udp);
    ethernet(echo.dst_mac, echo.src_mac, 0x0800, &ip)
}

/// An `ICMPv6` echo request (checksum left zero: it is never looked at).
#[must_use]
pub fn ipv6_echo(echo: &Echo) -> Vec<u8> {
    let mut p = vec![0x60, 0, 0, 0, 0, 8, 58, 64];
    p.extend_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
    p.extend_from_slice(&[0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
    p.extend_from_slice(&[128, 0, 0, 0, 0, 1, 0, 1]);
    ethernet(echo.dst_mac, echo.src_mac, 0x86dd, &p)
}

/// Checks an IPv4 packet carrying ICMP (as a raw socket returns it): both
/// checksums, and that the lengths agree. Returns the ICMP part.
pub fn verify_ipv4_icmp(packet: &[u8]) -> Result<&[u8], String> {
    if packet.len() < 28 {
        return Err(format!(
            "{} bytes is too short for IPv4 + ICMP",
            packet.len()
        ));
    }
    let ihl = usize::from(packet[0] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([packet[2], packet[3]]));
    if packet[0] >> 4 != 4 || ihl < 20 || total != packet.len() {
        return Err(format!(
            "bad IPv4 header: version/ihl {:#x}, total {total}, got {}",
            packet[0],
            packet.len()
        ));
    }
    if inet_checksum(&packet[..ihl]) != 0 {
        return Err("IPv4 header checksum is wrong".into());
    }
    let icmp = &packet[ihl..];
    if inet_checksum(icmp) != 0 {
        return Err("ICMP checksum is wrong".into());
    }
    Ok(icmp)
}

/// Checksum over the IPv4 pseudo-header and `segment` (TCP or UDP).
#[must_use]
pub fn l4_checksum(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, segment: &[u8]) -> u16 {
    let mut data = src.octets().to_vec();
    data.extend_from_slice(&dst.octets());
    data.extend_from_slice(&[0, proto]);
    data.extend_from_slice(&u16::try_from(segment.len()).expect("small").to_be_bytes());
    data.extend_from_slice(segment);
    inet_checksum(&data)
}

/// The initial sequence number of both sides of [`tcp`]'s connections.
pub const TCP_ISN: u32 = 0x0102_0304;

/// A TCP header (20 bytes) and `payload`, numbered `(seq, ack)`, its
/// checksum left zero.
#[must_use]
pub fn tcp_segment(
    ports: (u16, u16),
    flags: u8,
    (seq, ack): (u32, u32),
    payload: &[u8],
) -> Vec<u8> {
    let mut seg = vec![0u8; 20];
    seg[0..2].copy_from_slice(&ports.0.to_be_bytes());
    seg[2..4].copy_from_slice(&ports.1.to_be_bytes());
    seg[4..8].copy_from_slice(&seq.to_be_bytes());
    seg[8..12].copy_from_slice(&ack.to_be_bytes());
    seg[12] = 0x50;
    seg[13] = flags;
    seg[14..16].copy_from_slice(&64_240u16.to_be_bytes());
    seg.extend_from_slice(payload);
    seg
}

/// The numbers of [`tcp`]'s segments: both sides started at [`TCP_ISN`],
/// and a segment with ACK acknowledges the other side's SYN.
#[must_use]
pub const fn tcp_numbers(flags: u8) -> (u32, u32) {
    if flags & 0x10 == 0 {
        (TCP_ISN, 0)
    } else {
        (TCP_ISN, TCP_ISN.wrapping_add(1))
    }
}

/// A TCP segment (20-byte header, `payload`) in an Ethernet frame, with
/// correct checksums, numbered by [`tcp_numbers`].
#[must_use]
pub fn tcp(src: Ipv4Addr, dst: Ipv4Addr, ports: (u16, u16), flags: u8, payload: &[u8]) -> Vec<u8> {
    tcp_numbered(src, dst, ports, flags, tcp_numbers(flags), payload)
}

/// [`tcp`] numbered `(seq, ack)`.
#[must_use]
pub fn tcp_numbered(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    ports: (u16, u16),
    flags: u8,
    numbers: (u32, u32),
    payload: &[u8],
) -> Vec<u8> {
    let mut seg = tcp_segment(ports, flags, numbers, payload);
    let c = l4_checksum(src, dst, 6, &seg);
    seg[16..18].copy_from_slice(&c.to_be_bytes());
    let mut ip = ipv4_header(src, dst, 6, 64, 1, seg.len());
    ip.extend_from_slice(&seg);
    ethernet([2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 1], 0x0800, &ip)
}

/// A UDP datagram in an Ethernet frame; `checksum` false leaves it zero
/// ("none", allowed for UDP over IPv4).
#[must_use]
pub fn udp_datagram(src: Ipv4Addr, dst: Ipv4Addr, ports: (u16, u16), checksum: bool) -> Vec<u8> {
    let mut seg = vec![0u8; 8];
    seg[0..2].copy_from_slice(&ports.0.to_be_bytes());
    seg[2..4].copy_from_slice(&ports.1.to_be_bytes());
    seg.extend_from_slice(b"health");
    let len = u16::try_from(seg.len()).expect("small");
    seg[4..6].copy_from_slice(&len.to_be_bytes());
    if checksum {
        let c = l4_checksum(src, dst, 17, &seg);
        seg[6..8].copy_from_slice(&c.to_be_bytes());
    }
    let mut ip = ipv4_header(src, dst, 17, 64, 1, seg.len());
    ip.extend_from_slice(&seg);
    ethernet([2, 0, 0, 0, 0, 2], [2, 0, 0, 0, 0, 1], 0x0800, &ip)
}

/// An IPv4 frame's addresses, protocol and L4 bytes, after checking the
/// IPv4 checksum and the L4 checksum (ICMP over its message; TCP and UDP
/// over the pseudo-header; a zero UDP checksum is "none").
pub fn verify_frame(frame: &[u8]) -> Result<(Ipv4Addr, Ipv4Addr, u8, &[u8]), String> {
    let ip = frame.get(14..).ok_or("no IPv4 header")?;
    let ihl = usize::from(ip.first().ok_or("empty")? & 0x0f) * 4;
    if ip.len() < ihl || inet_checksum(&ip[..ihl]) != 0 {
        return Err("IPv4 header checksum is wrong".into());
    }
    let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
    let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    let proto = ip[9];
    let l4 = &ip[ihl..];
    let ok = match proto {
        1 => inet_checksum(l4) == 0,
        17 if l4.get(6..8) == Some(&[0, 0]) => true,
        6 | 17 => l4_checksum(src, dst, proto, l4) == 0,
        _ => return Err(format!("protocol {proto}")),
    };
    if ok {
        Ok((src, dst, proto, l4))
    } else {
        Err(format!("protocol {proto} checksum is wrong"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_of_known_header() {
        // The classic example header from RFC 791 era tutorials.
        let h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(inet_checksum(&h), 0xb861);
    }

    #[test]
    fn fragments_split_and_reassemble_to_the_datagram() {
        let whole = udp_datagram(
            Ipv4Addr::new(198, 18, 0, 1),
            Ipv4Addr::new(198, 18, 0, 2),
            (1, 2),
            true,
        );
        let [first, last] = split_fragments(&whole, 8);
        assert_eq!(first.len(), 34 + 8);
        let back = reassemble(&first, &last).expect("one datagram");
        let mut want = whole.clone();
        want[20..22].fill(0);
        fix_ip_checksum(&mut want);
        assert_eq!(back, want);
        assert!(reassemble(&last, &first).is_err(), "out of place");
        let mut other = last.clone();
        other[19] ^= 1;
        fix_ip_checksum(&mut other);
        assert!(reassemble(&first, &other).is_err(), "another datagram");
        let mut broken = last;
        broken[26] ^= 1;
        assert!(reassemble(&first, &broken).is_err(), "a bad checksum");
    }

    #[test]
    fn built_packets_verify() {
        let e = Echo::request(
            Ipv4Addr::new(198, 18, 0, 1),
            Ipv4Addr::new(198, 18, 0, 2),
            7,
            9,
        );
        let ip = e.ip_packet();
        let icmp = verify_ipv4_icmp(&ip).expect("valid");
        assert_eq!(icmp[0], 8);
        let mut broken = ip.clone();
        broken[40] ^= 1;
        assert!(verify_ipv4_icmp(&broken).is_err());
    }

    #[test]
    fn built_segments_verify_and_damage_is_caught() {
        let (a, b) = (Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2));
        for frame in [
            tcp(a, b, (40_000, 4240), 0x02, b"x"),
            udp_datagram(a, b, (1, 2), true),
            udp_datagram(a, b, (1, 2), false),
            Echo::request(a, b, 1, 1).frame(),
        ] {
            let (src, dst, _, _) = verify_frame(&frame).expect("valid");
            assert_eq!((src, dst), (a, b));
            let mut moved = frame.clone();
            moved[26..30].copy_from_slice(&[198, 18, 0, 9]);
            fix_ip_checksum(&mut moved);
            let icmp = frame[23] == 1;
            let no_udp_sum = frame[23] == 17 && frame[40..42] == [0, 0];
            // A new source breaks TCP and UDP (pseudo-header), not ICMP.
            assert_eq!(verify_frame(&moved).is_ok(), icmp || no_udp_sum);
        }
    }
}
