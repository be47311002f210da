//! `Frame` over a packet's directly addressable bytes.

use aya_ebpf::programs::TcContext;
use health_common::frame::Frame;

/// Bytes that cover Ethernet, an IPv4 header with options and the L4
/// header the flow parser reads (TCP's, the longest).
pub const FLOW_HEADERS: u32 = 14 + 60 + 20;

/// The packet as a frame whose first `want` bytes (all of it, when it is
/// shorter) are directly addressable. The pull helper is only called when
/// some of those bytes lie outside the linear part: it makes the head
/// writable, which copies the head of a cloned skb (every TCP segment a
/// local socket sends), so calling it on every packet costs a copy each.
#[inline(always)]
pub fn headers(ctx: &TcContext, want: u32) -> PacketFrame {
    let linear = (ctx.data_end() - ctx.data()) as u32;
    let need = if ctx.len() < want { ctx.len() } else { want };
    if linear < need {
        let _ = ctx.pull_data(need);
    }
    PacketFrame::new(ctx.data(), ctx.data_end(), ctx.len() as usize)
}

pub struct PacketFrame {
    start: usize,
    end: usize,
    wire_len: usize,
}

impl PacketFrame {
    #[inline(always)]
    pub const fn new(start: usize, end: usize, wire_len: usize) -> Self {
        Self {
            start,
            end,
            wire_len,
        }
    }
}

impl Frame for PacketFrame {
    #[inline(always)]
    fn wire_len(&self) -> usize {
        self.wire_len
    }

    #[inline(always)]
    fn ptr_at<T>(&mut self, offset: usize) -> Option<*mut T> {
        let at = self.start + offset;
        // The check the verifier needs before any access through `at`.
        if at + size_of::<T>() > self.end {
            return None;
        }
        Some(at as *mut T)
    }
}
