//! Bounds-checked access to a packet, the one abstraction the echo logic
//! needs from its environment.
//!
//! The kernel programs implement [`Frame`] over `data..data_end` (each access
//! is a `start + offset + size <= end` check the verifier can follow); the host
//! implements it over a byte slice, so the same logic is unit-tested here.

/// A packet whose headers can be viewed in place.
pub trait Frame {
    /// Length of the whole packet on the wire, including any part that is
    /// not directly addressable (non-linear skb data).
    fn wire_len(&self) -> usize;

    /// A mutable view of a `T` at `offset`, or `None` when the packet is too
    /// short. `T` must be a header type of alignment 1 (see `headers`).
    fn header_mut<T: Copy>(&mut self, offset: usize) -> Option<&mut T>;
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

    fn header_mut<T: Copy>(&mut self, offset: usize) -> Option<&mut T> {
        debug_assert_eq!(align_of::<T>(), 1, "header types are byte arrays");
        let end = offset.checked_add(size_of::<T>())?;
        let bytes = self.bytes.get_mut(offset..end)?;
        // SAFETY: `bytes` is exactly size_of::<T>() long, T has alignment 1 and
        // is a plain byte-array struct for which every bit pattern is valid.
        Some(unsafe { &mut *bytes.as_mut_ptr().cast::<T>() })
    }
}
