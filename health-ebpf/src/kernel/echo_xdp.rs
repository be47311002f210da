//! ICMP echo responder at XDP (native or generic).

use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};
use aya_log_ebpf::debug;
use health_common::echo::{Verdict, respond};

use super::{
    counters::{count, endpoint_addr},
    packet::PacketFrame,
};

#[xdp]
pub fn health_echo_xdp(ctx: XdpContext) -> u32 {
    echo(&ctx)
}

#[inline(always)]
fn echo(ctx: &XdpContext) -> u32 {
    let (start, end) = (ctx.data(), ctx.data_end());
    let mut frame = PacketFrame::new(start, end, end - start);
    let verdict = respond(&mut frame, endpoint_addr());
    count(verdict.counter());
    match verdict {
        Verdict::Reply => xdp_action::XDP_TX,
        Verdict::Pass(_) => xdp_action::XDP_PASS,
        Verdict::Malformed(reason) => {
            debug!(
                &ctx,
                "xdp: dropped malformed packet, reason {}", reason as u8
            );
            xdp_action::XDP_DROP
        }
    }
}

/// For the far end of a veth when the responder runs in native mode: a veth
/// only delivers `XDP_TX`ed frames to a peer that has an XDP program.
#[xdp]
pub fn health_xdp_pass(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}
