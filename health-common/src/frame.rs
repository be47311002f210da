//! Bounds-checked access to a packet, the one abstraction the packet logic
//! needs from its environment.
//!
//! The kernel programs implement [`Frame`] over `data..data_end` (each access
//! is a `start + offset + size <= end` check the verifier can follow); the host
//! implements it over a byte slice, so the same logic is unit-tested here.

/// A packet whose headers can be read and written in place.
pub trait Frame {
    /// Length of the whole packet on the wire, including any part that is
    /// not directly addressable (non-linear skb data).
    fn wire_len(&self) -> usize;

    /// A pointer to `size_of::<T>()` addressable bytes at `offset`, or
    /// `None` when the packet is too short. It may be unaligned for `T`.
    fn ptr_at<T>(&mut self, offset: usize) -> Option<*mut T>;

    /// The one's-complement sum of the `len` bytes at `offset` (the whole
    /// packet, linear or not), as a 32-bit accumulator for
    /// [`checksum::fold`](crate::checksum::fold); `None` when they are not
    /// all there or the environment cannot sum that many. The sum is of
    /// 16-bit words in native byte order (as the kernel's `csum_partial`
    /// sums), so words added to it must be native too (`from_ne_bytes`); a
    /// valid checksum folds to `0xffff` in either order.
    fn ones_sum(&mut self, offset: usize, len: usize) -> Option<u32>;

    /// A mutable view of a `T` at `offset`. `T` must have alignment 1 (the
    /// byte-array headers), checked at compile time.
    #[inline(always)]
    fn header_mut<T: Copy>(&mut self, offset: usize) -> Option<&mut T> {
        const {
            assert!(
                align_of::<T>() == 1,
                "view in place only alignment-1 headers"
            );
        };
        // SAFETY: in bounds (ptr_at), alignment 1, and every bit pattern is
        // a valid header.
        self.ptr_at::<T>(offset).map(|p| unsafe { &mut *p })
    }

    /// A copy of the `T` at `offset` (any alignment).
    #[inline(always)]
    fn read<T: Copy>(&mut self, offset: usize) -> Option<T> {
        // SAFETY: in bounds (ptr_at); read_unaligned makes no alignment
        // assumption; header types are valid for every bit pattern.
        self.ptr_at::<T>(offset)
            .map(|p| unsafe { p.read_unaligned() })
    }

    /// Writes `value` at `offset` (any alignment); `false` when out of bounds.
    #[inline(always)]
    fn write<T: Copy>(&mut self, offset: usize, value: T) -> bool {
        match self.ptr_at::<T>(offset) {
            // SAFETY: in bounds (ptr_at); write_unaligned makes no alignment
            // assumption.
            Some(p) => {
                unsafe { p.write_unaligned(value) };
                true
            }
            None => false,
        }
    }
}

/// [`Frame`] over a host byte slice.
pub struct SliceFrame<'a> {
    bytes: &'a mut [u8],
}

impl<'a> SliceFrame<'a> {
    #[must_use]
    pub fn new(bytes: &'a mut [u8]) -> Self {
        Self { bytes }
    }
}

impl Frame for SliceFrame<'_> {
    fn wire_len(&self) -> usize {
        self.bytes.len()
    }

    fn ptr_at<T>(&mut self, offset: usize) -> Option<*mut T> {
        let end = offset.checked_add(size_of::<T>())?;
        let bytes = self.bytes.get_mut(offset..end)?;
        Some(bytes.as_mut_ptr().cast::<T>())
    }

    fn ones_sum(&mut self, offset: usize, len: usize) -> Option<u32> {
        let bytes = self.bytes.get(offset..offset.checked_add(len)?)?;
        let (words, rest) = bytes.as_chunks::<2>();
        let mut sum: u64 = words
            .iter()
            .map(|w| u64::from(u16::from_ne_bytes(*w)))
            .sum();
        if let [last] = rest {
            sum += u64::from(u16::from_ne_bytes([*last, 0]));
        }
        while sum >> 32 != 0 {
            sum = (sum & 0xffff_ffff) + (sum >> 32);
        }
        #[allow(
            clippy::cast_possible_truncation,
            reason = "folded into 32 bits just above"
        )]
        Some(sum as u32)
    }
}

/// A copy of the `T` at `offset` of `bytes` (any alignment), or `None` when
/// `bytes` is too short: for host code reading headers out of a buffer.
#[must_use]
pub fn read_at<T: Copy>(bytes: &[u8], offset: usize) -> Option<T> {
    let end = offset.checked_add(size_of::<T>())?;
    let src = bytes.get(offset..end)?;
    // SAFETY: `src` holds size_of::<T>() bytes; read_unaligned makes no
    // alignment assumption; header types are valid for every bit pattern.
    Some(unsafe { src.as_ptr().cast::<T>().read_unaligned() })
}
