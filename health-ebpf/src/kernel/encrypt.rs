//! The encryption check's counters: probe packets to watched destinations
//! leaving through the WireGuard device (before encryption) and through
//! any other interface (in plain text). Never drops, never changes a
//! packet.

use aya_ebpf::{bindings::TC_ACT_UNSPEC, macros::classifier, programs::TcContext};
use health_common::encrypt::{self, Link, WatchCounts};

use super::{maps::ENCRYPT_WATCH, packet};

/// Bytes that cover Ethernet, an IPv6 header (an IPv4 one with options
/// is shorter) and a TCP header.
const HEADERS: u32 = 14 + 60 + 20;

/// Egress of the WireGuard device: no link-layer header.
#[classifier]
pub fn health_tunnel_egress(ctx: TcContext) -> i32 {
    count(&ctx, Link::None, true);
    TC_ACT_UNSPEC
}

/// Egress of every other interface of the node (Ethernet).
#[classifier]
pub fn health_plain_egress(ctx: TcContext) -> i32 {
    count(&ctx, Link::Ethernet, false);
    TC_ACT_UNSPEC
}

#[inline(always)]
fn count(ctx: &TcContext, link: Link, tunnel: bool) {
    let mut frame = packet::headers(ctx, HEADERS);
    let Some(key) = encrypt::probe_destination(&mut frame, link) else {
        return;
    };
    let Some(slot) = ENCRYPT_WATCH.get_ptr_mut(&key) else {
        // Not a destination the agent watches.
        return;
    };
    // SAFETY: a valid map value pointer, from this program's lookup. The
    // value is shared by the CPUs: two packets to one destination counted
    // on two CPUs at once may count once (no atomics on this target), never
    // none, so a destination that was sent to in plain text reads so.
    unsafe { bump(&mut *slot, tunnel) };
}

#[inline(always)]
fn bump(c: &mut WatchCounts, tunnel: bool) {
    if tunnel {
        c.tunnel += 1;
    } else {
        c.plain += 1;
    }
}
