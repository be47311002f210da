//! ICMP and `ICMPv6` echo responder at XDP (native or generic).

use aya_ebpf::{
    EbpfContext as _, bindings::xdp_action, helpers::bpf_xdp_adjust_tail, macros::xdp,
    programs::XdpContext,
};
use aya_log_ebpf::debug;
use health_common::echo::{PassReason, Verdict, respond};

use super::{
    counters::{count, echo_config},
    packet::xdp_frame,
};

#[xdp]
pub fn health_echo_xdp(ctx: XdpContext) -> u32 {
    echo(&ctx)
}

#[inline(always)]
fn echo(ctx: &XdpContext) -> u32 {
    let mut frame = xdp_frame(ctx);
    // A tag is still in the frame at XDP: `respond` sees it.
    let verdict = echo_config().map_or(Verdict::Pass(PassReason::NoAddress), |cfg| {
        respond(&mut frame, cfg, false)
    });
    count(verdict.counter());
    match verdict {
        Verdict::Reply { len } => {
            #[allow(
                clippy::cast_possible_wrap,
                clippy::cast_possible_truncation,
                reason = "an XDP buffer is at most a page"
            )]
            let extra = (ctx.data_end() - ctx.data()) as i32 - i32::from(len);
            // SAFETY: plain helper call; shrinks the buffer by `extra`.
            if extra > 0 && unsafe { bpf_xdp_adjust_tail(ctx.as_ptr().cast(), -extra) } != 0 {
                return xdp_action::XDP_DROP;
            }
            xdp_action::XDP_TX
        }
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
