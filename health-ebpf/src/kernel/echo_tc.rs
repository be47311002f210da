//! ICMP and `ICMPv6` echo responder at tc (tcx ingress): the reply is redirected out of
//! the interface the request came in on.

use aya_ebpf::{
    EbpfContext as _,
    bindings::{__sk_buff, TC_ACT_SHOT, TC_ACT_UNSPEC},
    helpers::{bpf_redirect, bpf_skb_change_tail},
    macros::classifier,
    programs::TcContext,
};
use aya_log_ebpf::debug;
use health_common::{
    echo::{PassReason, Verdict, respond},
    headers::{EthHdr, Icmpv6Hdr, Ipv6Hdr},
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
    let verdict = echo_config().map_or(Verdict::Pass(PassReason::NoAddress), |cfg| {
        respond(&mut frame, cfg, tagged)
    });
    count(verdict.counter());
    match verdict {
        Verdict::Reply { len } => {
            // SAFETY: plain helper calls on this program's skb.
            unsafe {
                if ctx.len() > u32::from(len) && bpf_skb_change_tail(skb, u32::from(len), 0) != 0 {
                    return TC_ACT_SHOT;
                }
                // Returns TC_ACT_REDIRECT on success.
                bpf_redirect((*skb).ifindex, 0) as i32
            }
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
