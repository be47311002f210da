//! `Frame` over a packet's directly addressable bytes, with the whole
//! packet (linear or not) reachable through the hook's load helper.

use aya_ebpf::{
    EbpfContext as _,
    bindings::{__sk_buff, xdp_md},
    helpers::{bpf_csum_diff, bpf_skb_load_bytes, bpf_xdp_load_bytes},
    programs::{TcContext, XdpContext},
};
use health_common::{echo::MAX_CHECKED_ICMP, frame::Frame};

/// Bytes that cover Ethernet, an IPv4 header with options and the L4
/// header the flow parser reads (TCP's, the longest).
pub const FLOW_HEADERS: u32 = 14 + 60 + 20;

/// Bytes summed per `bpf_csum_diff` call (the helper takes at most 512,
/// and the copy lives on the 512-byte stack).
const CHUNK: usize = 256;
/// The copy's buffer in eight-byte words: a chunk and the three zero
/// bytes after it.
const BUF_WORDS: usize = (CHUNK + 8) / 8;

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
    PacketFrame {
        start: ctx.data(),
        end: ctx.data_end(),
        wire_len: ctx.len() as usize,
        hook: Hook::Skb(ctx.as_ptr().cast()),
    }
}

/// The XDP buffer as a frame (all of it directly addressable).
#[inline(always)]
pub fn xdp_frame(ctx: &XdpContext) -> PacketFrame {
    let (start, end) = (ctx.data(), ctx.data_end());
    PacketFrame {
        start,
        end,
        wire_len: end - start,
        hook: Hook::Xdp(ctx.as_ptr().cast()),
    }
}

/// The context a frame's bytes are loaded through.
#[derive(Clone, Copy)]
enum Hook {
    Skb(*mut __sk_buff),
    Xdp(*mut xdp_md),
}

impl Hook {
    /// Copies `len` (1..=CHUNK) bytes at `offset` to `to`.
    #[inline(always)]
    fn load(self, offset: usize, to: *mut core::ffi::c_void, len: u32) -> bool {
        // SAFETY: `to` holds BUF_WORDS * 8 > len bytes; the helpers bound the
        // packet side themselves.
        let rc = unsafe {
            match self {
                Self::Skb(skb) => bpf_skb_load_bytes(skb.cast(), offset as u32, to, len),
                Self::Xdp(xdp) => bpf_xdp_load_bytes(xdp, offset as u32, to, len),
            }
        };
        rc == 0
    }
}

pub struct PacketFrame {
    start: usize,
    end: usize,
    wire_len: usize,
    hook: Hook,
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

    /// Copies the bytes out CHUNK at a time (linear or not) and sums each
    /// copy with `bpf_csum_diff`, the kernel's `csum_partial`.
    #[inline(always)]
    fn ones_sum(&mut self, offset: usize, len: usize) -> Option<u32> {
        if len > MAX_CHECKED_ICMP || offset + len > self.wire_len {
            return None;
        }
        // Words, not bytes: zeroed by 33 eight-byte stores (a byte array's
        // zeroing is a call to a byte-at-a-time loop, which cost more than
        // the rest of the echo responder). Zeroed at all because the
        // load's length is not a constant, and a verifier before 6.3 may
        // then not count the bytes it writes as written when the sum
        // reads them.
        let mut words_buf = [0u64; BUF_WORDS];
        let buf = words_buf.as_mut_ptr().cast::<u8>();
        let mut sum: u32 = 0;
        let mut done = 0usize;
        for _ in 0..MAX_CHECKED_ICMP / CHUNK {
            if done >= len {
                break;
            }
            let n = chunk_len(len - done);
            if !self.hook.load(offset + done, buf.cast(), n) {
                return None;
            }
            // csum_diff sums whole 32-bit words: zero the bytes after the
            // last chunk's end (only the last one can be short).
            // SAFETY: n <= CHUNK, so n + 2 < BUF_WORDS * 8, inside `buf`; and
            // `buf` then holds `words` (<= CHUNK + 3) initialised bytes.
            let r = unsafe {
                let pad = buf.add(n as usize);
                pad.write(0);
                pad.add(1).write(0);
                pad.add(2).write(0);
                let words = (n + 3) & !3;
                bpf_csum_diff(core::ptr::null_mut(), 0, buf.cast(), words, sum)
            };
            if r < 0 {
                return None;
            }
            #[allow(
                clippy::cast_sign_loss,
                clippy::cast_possible_truncation,
                reason = "a non-negative csum_diff result is a 32-bit __wsum"
            )]
            let r = r as u32;
            sum = r;
            done += CHUNK;
        }
        Some(sum)
    }
}

/// `min(left, CHUNK)` for `left >= 1`, in a form whose bounds (1..=CHUNK)
/// the verifier can see: the volatile read keeps LLVM from folding the
/// mask away.
#[inline(always)]
fn chunk_len(left: usize) -> u32 {
    if left >= CHUNK {
        return CHUNK as u32;
    }
    // SAFETY: a read of a local.
    let left = unsafe { core::ptr::read_volatile(&raw const left) };
    (((left as u32).wrapping_sub(1)) & (CHUNK as u32 - 1)) + 1
}
