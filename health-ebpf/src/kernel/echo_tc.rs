//! ICMP and `ICMPv6` echo responder at tc (tcx ingress): the reply is redirected out of
//! the interface the request came in on, or, on a veth whose peer is in
//! another namespace, straight into the peer's ingress.

use aya_ebpf::{
    EbpfContext as _,
    bindings::{__sk_buff, TC_ACT_SHOT, TC_ACT_UNSPEC},
    helpers::{bpf_redirect, bpf_redirect_peer, bpf_skb_change_tail, bpf_skb_change_type},
    macros::classifier,
    programs::TcContext,
};
use aya_log_ebpf::debug;
use health_common::{
    echo::{PassReason, Verdict, respond},
    headers::{EthHdr, Icmpv6Hdr, Ipv6Hdr},
    maps::EchoConfig,
};

use super::{
    counters::{count, echo_config},
    packet,
};

/// Bytes of an IPv6 echo request (an IPv4 one without options is shorter):
/// all the responder touches.
const HEADERS_LEN: u32 = (EthHdr::LEN + Ipv6Hdr::LEN + Icmpv6Hdr::LEN) as u32;

#[classifier]
pub fn health_echo_tc(ctx: TcContext) -> i32 {
    echo(&ctx)
}

#[inline(always)]
fn echo(ctx: &TcContext) -> i32 {
    let skb = ctx.as_ptr().cast::<__sk_buff>();
    // SAFETY: the context of a classifier is its __sk_buff. The stack took
    // any VLAN tag off before tc ingress and kept it here.
    let tagged = unsafe { (*skb).vlan_present } != 0;
    let mut frame = packet::headers(ctx, HEADERS_LEN);
    let cfg = echo_config();
    let verdict = cfg.map_or(Verdict::Pass(PassReason::NoAddress), |cfg| {
        respond(&mut frame, cfg, tagged)
    });
    count(verdict.counter());
    match verdict {
        Verdict::Reply { len } => {
            let to_peer = cfg.is_some_and(|c| c.flags & EchoConfig::REPLY_TO_PEER != 0);
            reply(skb, ctx.len(), len, to_peer)
        }
        // TCX_NEXT: let any later program on this hook see the packet.
        Verdict::Pass(_) => TC_ACT_UNSPEC,
        Verdict::Malformed(reason) => {
            debug!(
                &ctx,
                "tc: dropped malformed packet, reason {}", reason as u8
            );
            TC_ACT_SHOT
        }
    }
}

/// Trims the request to the reply's `len` and sends the reply on: into the
/// veth peer's ingress (`to_peer`), or out of this interface.
#[inline(always)]
fn reply(skb: *mut __sk_buff, wire_len: u32, len: u16, to_peer: bool) -> i32 {
    // SAFETY: plain helper calls on this program's skb, and a read of its
    // context.
    unsafe {
        if wire_len > u32::from(len) && bpf_skb_change_tail(skb, u32::from(len), 0) != 0 {
            return TC_ACT_SHOT;
        }
        if to_peer {
            // The peer's stack takes the frame without reading its
            // Ethernet header again, and kernels before 6.15 without its
            // fix in their stable releases keep the request's packet
            // type: a reply to a request sent to a group address would
            // arrive as broadcast or multicast.
            if (*skb).pkt_type != PACKET_HOST && bpf_skb_change_type(skb, PACKET_HOST) != 0 {
                return TC_ACT_SHOT;
            }
            // Returns TC_ACT_REDIRECT; the kernel drops the reply if the
            // peer is gone or down.
            return bpf_redirect_peer((*skb).ifindex, 0) as i32;
        }
        // Returns TC_ACT_REDIRECT on success.
        bpf_redirect((*skb).ifindex, 0) as i32
    }
}

/// `PACKET_HOST`: a frame addressed to this host.
const PACKET_HOST: u32 = 0;
