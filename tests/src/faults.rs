//! Fault injection for tests: a tcx program, assembled here, that drops
//! every IPv4 ICMP packet entering an interface. It stands in for
//! `tc filter ... u32 match ip protocol 1 action drop` on kernels built
//! without `act_gact`, and is detached when the guard is dropped. The
//! echo benchmark uses the same programs to drop the replies its
//! requester is sent, once the interface has counted them.

use std::{
    ffi::CString,
    io,
    os::fd::{FromRawFd as _, OwnedFd},
};

use health_agent::sys::netns::Netns;

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_TEST_RUN: libc::c_long = 10;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
const BPF_TCX_INGRESS: u32 = 46;

/// One `struct bpf_insn`; `off` and `imm` are stored as their
/// two's-complement bits, as the kernel reads them.
#[allow(
    clippy::cast_sign_loss,
    reason = "reinterpreting signed fields as their bits"
)]
const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    let regs = (src << 4) | dst;
    (code as u64)
        | ((regs as u64) << 8)
        | (((off as u16) as u64) << 16)
        | (((imm as u32) as u64) << 32)
}

/// `skb->data`, `skb->data_end` bounds check, then: IPv4 with protocol 1
/// -> `TC_ACT_SHOT`, anything else -> `TCX_NEXT`.
const DROP_ICMP: [u64; 13] = [
    insn(0x61, 2, 1, 76, 0), // r2 = skb->data
    insn(0x61, 3, 1, 80, 0), // r3 = skb->data_end
    insn(0xbf, 4, 2, 0, 0),  // r4 = r2
    insn(0x07, 4, 0, 0, 24), // r4 += 24 (Ethernet + IPv4 up to the protocol byte)
    insn(0x2d, 4, 3, 6, 0),  // if r4 > r3 goto pass
    insn(0x69, 5, 2, 12, 0), // r5 = ethertype (big-endian bytes read little-endian)
    insn(0x55, 5, 0, 4, 8),  // if r5 != 0x0008 goto pass
    insn(0x71, 5, 2, 23, 0), // r5 = IPv4 protocol
    insn(0x55, 5, 0, 2, 1),  // if r5 != ICMP goto pass
    insn(0xb7, 0, 0, 0, 2),  // r0 = TC_ACT_SHOT
    insn(0x95, 0, 0, 0, 0),  // exit
    insn(0xb7, 0, 0, 0, -1), // pass: r0 = TCX_NEXT
    insn(0x95, 0, 0, 0, 0),  // exit
];

/// As [`DROP_ICMP`], only for IPv4 ICMP from one source address (`imm` of
/// instruction 9, a 32-bit compare of the address as read from the packet).
const fn drop_icmp_from(src: [u8; 4]) -> [u64; 15] {
    [
        insn(0x61, 2, 1, 76, 0), // r2 = skb->data
        insn(0x61, 3, 1, 80, 0), // r3 = skb->data_end
        insn(0xbf, 4, 2, 0, 0),  // r4 = r2
        insn(0x07, 4, 0, 0, 34), // r4 += 34 (Ethernet + IPv4 header)
        insn(0x2d, 4, 3, 8, 0),  // if r4 > r3 goto pass
        insn(0x69, 5, 2, 12, 0), // r5 = ethertype
        insn(0x55, 5, 0, 6, 8),  // if r5 != 0x0008 goto pass
        insn(0x71, 5, 2, 23, 0), // r5 = IPv4 protocol
        insn(0x55, 5, 0, 4, 1),  // if r5 != ICMP goto pass
        insn(0x61, 5, 2, 26, 0), // r5 = IPv4 source (network order, read little-endian)
        // if w5 != src goto pass (BPF_JMP32: the low 32 bits only)
        insn(0x56, 5, 0, 2, i32::from_le_bytes(src)),
        insn(0xb7, 0, 0, 0, 2),  // r0 = TC_ACT_SHOT
        insn(0x95, 0, 0, 0, 0),  // exit
        insn(0xb7, 0, 0, 0, -1), // pass: r0 = TCX_NEXT
        insn(0x95, 0, 0, 0, 0),  // exit
    ]
}

/// `ICMPv6` echo replies (type 129) right after a fixed IPv6 header ->
/// `TC_ACT_SHOT`, anything else (neighbour discovery included) ->
/// `TCX_NEXT`.
const DROP_ICMPV6_ECHO_REPLIES: [u64; 15] = [
    insn(0x61, 2, 1, 76, 0),     // r2 = skb->data
    insn(0x61, 3, 1, 80, 0),     // r3 = skb->data_end
    insn(0xbf, 4, 2, 0, 0),      // r4 = r2
    insn(0x07, 4, 0, 0, 55),     // r4 += 55 (Ethernet + IPv6 + the ICMPv6 type)
    insn(0x2d, 4, 3, 8, 0),      // if r4 > r3 goto pass
    insn(0x69, 5, 2, 12, 0),     // r5 = ethertype (big-endian bytes read little-endian)
    insn(0x55, 5, 0, 6, 0xdd86), // if r5 != 0x86dd goto pass
    insn(0x71, 5, 2, 20, 0),     // r5 = IPv6 next header
    insn(0x55, 5, 0, 4, 58),     // if r5 != ICMPv6 goto pass
    insn(0x71, 5, 2, 54, 0),     // r5 = ICMPv6 type
    insn(0x55, 5, 0, 2, 129),    // if r5 != echo reply goto pass
    insn(0xb7, 0, 0, 0, 2),      // r0 = TC_ACT_SHOT
    insn(0x95, 0, 0, 0, 0),      // exit
    insn(0xb7, 0, 0, 0, -1),     // pass: r0 = TCX_NEXT
    insn(0x95, 0, 0, 0, 0),      // exit
];

/// The `bpf` system call: its non-negative result.
fn bpf_call(cmd: libc::c_long, attr: &mut [u8; 128]) -> io::Result<i64> {
    // SAFETY: attr is a zero-padded bpf_attr of the size passed.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc)
}

/// A `bpf` command that returns a new descriptor.
fn bpf(cmd: libc::c_long, attr: &mut [u8; 128]) -> io::Result<OwnedFd> {
    let fd = i32::try_from(bpf_call(cmd, attr)?).map_err(io::Error::other)?;
    // SAFETY: the kernel returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The program that drops echo replies of the family.
const fn echo_replies_program(ipv6: bool) -> &'static [u64] {
    if ipv6 {
        &DROP_ICMPV6_ECHO_REPLIES
    } else {
        &DROP_ICMP
    }
}

/// Loads `insns` as a tc classifier.
fn load(insns: &[u64]) -> io::Result<OwnedFd> {
    let license = CString::new("GPL").map_err(io::Error::other)?;
    let mut attr = [0u8; 128];
    put(&mut attr, 0, &BPF_PROG_TYPE_SCHED_CLS.to_ne_bytes());
    put(
        &mut attr,
        4,
        &u32::try_from(insns.len())
            .map_err(io::Error::other)?
            .to_ne_bytes(),
    );
    put(&mut attr, 8, &(insns.as_ptr() as u64).to_ne_bytes());
    put(&mut attr, 16, &(license.as_ptr() as u64).to_ne_bytes());
    bpf(BPF_PROG_LOAD, &mut attr)
}

fn put(attr: &mut [u8; 128], at: usize, bytes: &[u8]) {
    attr[at..at + bytes.len()].copy_from_slice(bytes);
}

/// Drops ICMP entering `iface` in `ns` until dropped.
pub struct DropIcmp {
    _prog: OwnedFd,
    _link: OwnedFd,
}

impl DropIcmp {
    pub fn attach(ns: &Netns, iface: &str) -> io::Result<Self> {
        Self::attach_program(ns, iface, &DROP_ICMP)
    }

    /// Drops only the ICMP that `src` sends into `iface`: one node's path
    /// to this one, the others' untouched.
    pub fn attach_from(ns: &Netns, iface: &str, src: std::net::Ipv4Addr) -> io::Result<Self> {
        Self::attach_program(ns, iface, &drop_icmp_from(src.octets()))
    }

    /// Drops the echo replies entering `iface` in `ns`: all IPv4 ICMP, or
    /// with `ipv6` the `ICMPv6` echo replies only, so that neighbour
    /// discovery still passes.
    pub fn attach_echo_replies(ns: &Netns, iface: &str, ipv6: bool) -> io::Result<Self> {
        Self::attach_program(ns, iface, echo_replies_program(ipv6))
    }

    /// What the program [`Self::attach_echo_replies`] attaches returns
    /// for `frame`, run by the kernel (`BPF_PROG_TEST_RUN`): 2
    /// (`TC_ACT_SHOT`) when it drops it, `u32::MAX` (`TCX_NEXT`) when it
    /// hands it on.
    pub fn echo_replies_verdict(ipv6: bool, frame: &[u8]) -> io::Result<u32> {
        let prog = load(echo_replies_program(ipv6))?;
        let mut attr = [0u8; 128];
        put(
            &mut attr,
            0,
            &std::os::fd::AsRawFd::as_raw_fd(&prog).to_ne_bytes(),
        );
        put(
            &mut attr,
            8,
            &u32::try_from(frame.len())
                .map_err(io::Error::other)?
                .to_ne_bytes(),
        );
        put(&mut attr, 16, &(frame.as_ptr() as u64).to_ne_bytes());
        put(&mut attr, 32, &1u32.to_ne_bytes());
        // The kernel only reads `frame`: no output buffer is given.
        bpf_call(BPF_PROG_TEST_RUN, &mut attr)?;
        let mut retval = [0u8; 4];
        retval.copy_from_slice(&attr[4..8]);
        Ok(u32::from_ne_bytes(retval))
    }

    fn attach_program(ns: &Netns, iface: &str, insns: &[u64]) -> io::Result<Self> {
        let prog = load(insns)?;
        let name = CString::new(iface).map_err(io::Error::other)?;
        let prog_fd = std::os::fd::AsRawFd::as_raw_fd(&prog);
        let link = ns
            .run(|| {
                // SAFETY: plain libc call on a valid C string.
                let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
                if ifindex == 0 {
                    return Err(io::Error::last_os_error());
                }
                let mut attr = [0u8; 128];
                put(&mut attr, 0, &prog_fd.to_ne_bytes());
                put(&mut attr, 4, &ifindex.to_ne_bytes());
                put(&mut attr, 8, &BPF_TCX_INGRESS.to_ne_bytes());
                bpf(BPF_LINK_CREATE, &mut attr)
            })
            .map_err(io::Error::other)??;
        Ok(Self {
            _prog: prog,
            _link: link,
        })
    }
}
