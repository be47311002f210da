//! Wire headers as byte arrays: alignment 1, so a pointer anywhere into a
//! packet may be viewed as one, and no field ever needs a byte swap to move.

/// `ETH_P_IP`.
pub const ETH_P_IP: u16 = 0x0800;
/// `IPPROTO_ICMP`.
pub const IPPROTO_ICMP: u8 = 1;
/// ICMP echo request type.
pub const ICMP_ECHO_REQUEST: u8 = 8;
/// ICMP echo reply type.
pub const ICMP_ECHO_REPLY: u8 = 0;
/// TTL the responder gives its replies, like the kernel's `ip_default_ttl`.
pub const REPLY_TTL: u8 = 64;

/// Ethernet II header.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EthHdr {
    pub dst: [u8; 6],
    pub src: [u8; 6],
    pub ether_type: [u8; 2],
}

impl EthHdr {
    pub const LEN: usize = 14;

    #[must_use]
    #[inline(always)]
    pub const fn ether_type(&self) -> u16 {
        u16::from_be_bytes(self.ether_type)
    }
}

/// IPv4 header without options (options are never parsed: packets carrying
/// them are left to the kernel).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv4Hdr {
    pub bytes: [u8; 20],
}

impl Ipv4Hdr {
    pub const LEN: usize = 20;

    #[must_use]
    #[inline(always)]
    pub const fn version(&self) -> u8 {
        self.bytes[0] >> 4
    }

    /// Header length in bytes (IHL * 4).
    #[must_use]
    #[inline(always)]
    pub const fn header_len(&self) -> usize {
        ((self.bytes[0] & 0x0f) as usize) * 4
    }

    #[must_use]
    #[inline(always)]
    pub const fn total_len(&self) -> usize {
        u16::from_be_bytes([self.bytes[2], self.bytes[3]]) as usize
    }

    /// More-fragments flag set or a non-zero fragment offset.
    #[must_use]
    #[inline(always)]
    pub const fn is_fragment(&self) -> bool {
        let frag = u16::from_be_bytes([self.bytes[6], self.bytes[7]]);
        frag & 0x3fff != 0
    }

    #[must_use]
    #[inline(always)]
    pub const fn ttl(&self) -> u8 {
        self.bytes[8]
    }

    #[must_use]
    #[inline(always)]
    pub const fn protocol(&self) -> u8 {
        self.bytes[9]
    }

    #[must_use]
    #[inline(always)]
    pub const fn checksum(&self) -> u16 {
        u16::from_be_bytes([self.bytes[10], self.bytes[11]])
    }

    #[must_use]
    #[inline(always)]
    pub const fn src(&self) -> [u8; 4] {
        [
            self.bytes[12],
            self.bytes[13],
            self.bytes[14],
            self.bytes[15],
        ]
    }

    #[must_use]
    #[inline(always)]
    pub const fn dst(&self) -> [u8; 4] {
        [
            self.bytes[16],
            self.bytes[17],
            self.bytes[18],
            self.bytes[19],
        ]
    }
}

/// ICMP header of an echo request or reply.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IcmpEchoHdr {
    pub kind: u8,
    pub code: u8,
    pub checksum: [u8; 2],
    pub identifier: [u8; 2],
    pub sequence: [u8; 2],
}

impl IcmpEchoHdr {
    pub const LEN: usize = 8;
}

const _: () = {
    assert!(size_of::<EthHdr>() == EthHdr::LEN);
    assert!(size_of::<Ipv4Hdr>() == Ipv4Hdr::LEN);
    assert!(size_of::<IcmpEchoHdr>() == IcmpEchoHdr::LEN);
    assert!(align_of::<EthHdr>() == 1);
    assert!(align_of::<Ipv4Hdr>() == 1);
    assert!(align_of::<IcmpEchoHdr>() == 1);
};
