//! Internet checksum (RFC 1071) and its incremental update (RFC 1624).
//!
//! Checksums are handled as the 16-bit big-endian value read from the wire
//! (`u16::from_be_bytes`), and written back with `to_be_bytes`.

/// Folds a 32-bit one's-complement accumulator into 16 bits (no complement).
#[must_use]
#[inline(always)]
pub const fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

/// Incremental update of a stored checksum `check` when one 16-bit word of
/// the covered data changes from `old` to `new` (RFC 1624, eqn. 3:
/// `HC' = ~(~HC + ~m + m')`).
///
/// A correct incremental update leaves the one's-complement sum of the whole
/// packet unchanged (the data word and the checksum word move by opposite
/// amounts), so an skb's `CHECKSUM_COMPLETE` value stays valid as well.
#[must_use]
#[inline(always)]
pub const fn update16(check: u16, old: u16, new: u16) -> u16 {
    let sum = (!check) as u32 + (!old) as u32 + new as u32;
    !fold(sum)
}

/// One's-complement sum of the IPv4 header, 16 bits at a time, folded.
/// A header with a correct checksum sums to `0xffff`.
#[must_use]
#[inline(always)]
pub fn ipv4_header_sum(header: &[u8; 20]) -> u16 {
    let mut sum: u32 = 0;
    let mut i = 0;
    while i < 20 {
        sum += u32::from(u16::from_be_bytes([header[i], header[i + 1]]));
        i += 2;
    }
    fold(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Full RFC 1071 checksum over any byte string, the reference the
    /// incremental update is checked against.
    fn full(data: &[u8]) -> u16 {
        let mut sum: u32 = 0;
        for chunk in data.chunks(2) {
            let word = if chunk.len() == 2 {
                u16::from_be_bytes([chunk[0], chunk[1]])
            } else {
                u16::from_be_bytes([chunk[0], 0])
            };
            sum += u32::from(word);
        }
        !fold(sum)
    }

    #[test]
    fn fold_carries_twice() {
        assert_eq!(fold(0x0001_ffff), 0x0001);
        assert_eq!(fold(0xffff_ffff), 0xffff);
        assert_eq!(fold(0), 0);
    }

    #[test]
    fn incremental_update_matches_full_recompute() {
        let mut data = [0u8; 16];
        for (i, b) in data.iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(37).wrapping_add(11);
        }
        for (pos, new) in [(0usize, 0x0000u16), (4, 0xffff), (6, 0x1234), (14, 0x0800)] {
            let before = full(&data);
            let old = u16::from_be_bytes([data[pos], data[pos + 1]]);
            data[pos..pos + 2].copy_from_slice(&new.to_be_bytes());
            assert_eq!(update16(before, old, new), full(&data), "word at {pos}");
        }
    }

    #[test]
    fn echo_request_to_reply_type_change() {
        // A classic example: type/code 0x0800 -> 0x0000 raises the checksum by 0x0800.
        assert_eq!(update16(0x1234, 0x0800, 0x0000), 0x1a34);
    }

    #[test]
    fn ipv4_header_sum_of_valid_header_is_all_ones() {
        // 198.18.0.1 -> 198.18.0.2, ICMP, TTL 64, checksum filled in below.
        let mut h = [
            0x45, 0, 0, 84, 0x12, 0x34, 0x40, 0, 64, 1, 0, 0, 198, 18, 0, 1, 198, 18, 0, 2,
        ];
        let c = !ipv4_header_sum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        assert_eq!(ipv4_header_sum(&h), 0xffff);
        assert_eq!(
            c,
            full(&{
                let mut z = h;
                z[10] = 0;
                z[11] = 0;
                z
            })
        );
    }
}
