//! `Frame` over a packet's directly addressable bytes.

use health_common::frame::Frame;

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
    fn header_mut<T: Copy>(&mut self, offset: usize) -> Option<&mut T> {
        let at = self.start + offset;
        // The check the verifier needs before any access through `at`.
        if at + size_of::<T>() > self.end {
            return None;
        }
        // SAFETY: in bounds (checked above); header types have alignment 1.
        Some(unsafe { &mut *(at as *mut T) })
    }
}
