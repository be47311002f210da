//! In-kernel RTT: probe requests leaving the endpoint are timestamped
//! (`RTT_PENDING`), the matching reply closes the sample into the peer's
//! statistics (`RTT_STATS`, one value a key); the agent sweeps requests that were
//! never answered into `RTT_LOSSES`.
//!
//! Peers are 16-byte addresses of either family, IPv4 as IPv4-mapped
//! (`::ffff:a.b.c.d`), as in [`CtKey`](crate::ct::CtKey); `proto` is `IPPROTO_ICMP`,
//! `IPPROTO_ICMPV6` or `IPPROTO_TCP`.

use crate::ct::{Flow, IPPROTO_TCP};

/// The largest frame (bytes on the wire, its link header included) whose
/// request is timed. The agent's echoes and SYNs are under 100 bytes; its
/// path-MTU probes, padded to at least 1280 bytes, follow the small echo
/// to the same peer: timed, they would be every round's last sample, with
/// their size's serialisation in it, and mix two sizes in one histogram.
pub const TIMED_MAX_LEN: u32 = 576;

/// Echo requests sent with a TTL (hop limit) of at most this are path
/// traces', not probes: most are answered on the way by a Time Exceeded,
/// never by an echo reply, so they are not timed (timed, every hop short
/// of the peer would be a loss the sweep counts). The prober's echoes go
/// with 64, set on its sockets.
pub const UNTIMED_MAX_TTL: u8 = 16;

/// Buckets of the log2 histogram of RTTs in microseconds: bucket `i` holds
/// RTTs in `[2^(i-1), 2^i)` µs (bucket 0: under 1 µs), the last one the rest.
pub const HIST_BUCKETS: usize = 24;

/// A request waiting for its reply (28 bytes, no implicit padding).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PendingKey {
    pub peer: [u8; 16],
    /// ICMP: identifier; TCP: the endpoint's port.
    pub a: [u8; 2],
    /// ICMP: sequence; TCP: the peer's port.
    pub b: [u8; 2],
    pub proto: u8,
    pub pad: [u8; 3],
    /// What the answer must carry back, as on the wire. TCP: the SYN's
    /// sequence number (its ISN); a SYN-ACK or a reset answers it only
    /// when it acknowledges exactly that plus one. ICMP: the first 4 bytes
    /// of the echo's payload (the agent's requests carry a token there,
    /// which a reply forged without seeing the request lacks).
    pub tag: [u8; 4],
}

/// Per peer and protocol (20 bytes, no implicit padding).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RttKey {
    pub peer: [u8; 16],
    pub proto: u8,
    pub pad: [u8; 3],
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RttStats {
    pub last_ns: u64,
    /// When `last_ns` was measured (`CLOCK_MONOTONIC` ns).
    pub last_at_ns: u64,
    pub min_ns: u64,
    pub max_ns: u64,
    pub sum_ns: u64,
    pub count: u64,
    pub hist: [u64; HIST_BUCKETS],
}

impl Default for RttStats {
    fn default() -> Self {
        Self {
            last_ns: 0,
            last_at_ns: 0,
            min_ns: u64::MAX,
            max_ns: 0,
            sum_ns: 0,
            count: 0,
            hist: [0; HIST_BUCKETS],
        }
    }
}

/// The histogram bucket of `rtt_ns`.
#[must_use]
#[inline(always)]
pub const fn bucket(rtt_ns: u64) -> usize {
    let us = rtt_ns / 1000;
    let b = us.bit_width() as usize;
    if b >= HIST_BUCKETS {
        HIST_BUCKETS - 1
    } else {
        b
    }
}

impl RttStats {
    #[inline(always)]
    pub fn record(&mut self, rtt_ns: u64, now: u64) {
        self.last_ns = rtt_ns;
        self.last_at_ns = now;
        // A value with no sample yet (all zero, as the kernel zeroes a
        // slot) holds min 0: the first sample sets the min.
        if self.count == 0 || rtt_ns < self.min_ns {
            self.min_ns = rtt_ns;
        }
        if rtt_ns > self.max_ns {
            self.max_ns = rtt_ns;
        }
        self.sum_ns += rtt_ns;
        self.count += 1;
        let b = bucket(rtt_ns);
        if b < HIST_BUCKETS {
            self.hist[b] += 1;
        }
    }

    /// Folds other statistics of the same key into these: one CPU's, from
    /// pins of the per-CPU layout the map had before. A CPU that never took
    /// a sample holds an all-zero slot, which is skipped.
    pub fn merge(&mut self, other: &Self) {
        if other.count == 0 {
            return;
        }
        if other.last_at_ns > self.last_at_ns {
            self.last_ns = other.last_ns;
            self.last_at_ns = other.last_at_ns;
        }
        self.min_ns = self.min_ns.min(other.min_ns);
        self.max_ns = self.max_ns.max(other.max_ns);
        // Read from pins: counts that would overflow wrap, as the kernel's
        // own additions do, never panic.
        self.sum_ns = self.sum_ns.wrapping_add(other.sum_ns);
        self.count = self.count.wrapping_add(other.count);
        for (a, b) in self.hist.iter_mut().zip(other.hist.iter()) {
            *a = a.wrapping_add(*b);
        }
    }
}

/// Set in a pending request's value once its SYN has been sent again:
/// the SYN-ACK may answer either SYN, so it times no sample (Karn's rule).
/// The rest of the value is the first SYN's timestamp, which the agent's
/// sweep ages as any other (`CLOCK_MONOTONIC` ns stay far below 2^63).
pub const RETRANSMITTED: u64 = 1 << 63;

/// How long after a SYN another of the same key (ports and ISN) is taken
/// as its retransmission: longer than Linux's default handshake (6
/// retries, 127 s). An older pending SYN is one the sweep has not reached
/// yet; a SYN of its key later than that (an ISN met again, which Linux's
/// clock-driven ISNs make unlikely) is timed on its own.
pub const SYN_RETRANSMIT_WINDOW_NS: u64 = 130_000_000_000;

/// When a pending value's request was first sent.
#[must_use]
#[inline(always)]
pub const fn sent_at(pending: u64) -> u64 {
    pending & !RETRANSMITTED
}

/// The pending value a SYN leaving at `now` leaves, given the value
/// already pending under its key (ports and ISN).
#[must_use]
#[inline(always)]
pub const fn after_syn(pending: Option<u64>, now: u64) -> u64 {
    match pending {
        Some(v) if now.saturating_sub(sent_at(v)) < SYN_RETRANSMIT_WINDOW_NS => {
            sent_at(v) | RETRANSMITTED
        }
        _ => now,
    }
}

/// The sample a reply at `now` closes on a pending value: none when the
/// request was sent more than once.
#[must_use]
#[inline(always)]
pub const fn sample(pending: u64, now: u64) -> Option<u64> {
    if pending & RETRANSMITTED == 0 {
        Some(now.saturating_sub(pending))
    } else {
        None
    }
}

/// The pending key a request leaving the endpoint opens: ICMP echo by
/// (peer, identifier, sequence, payload's first 4 bytes), TCP SYN by
/// (peer, ports, ISN). A SYN
/// sent again keeps its ISN, so it finds its first one's key; a new
/// connection on the same ports has another ISN, and a key of its own.
#[must_use]
#[inline(always)]
pub const fn request_key(flow: &Flow) -> PendingKey {
    let k = &flow.key;
    if k.proto == IPPROTO_TCP {
        PendingKey {
            peer: k.daddr,
            a: k.sport,
            b: k.dport,
            proto: IPPROTO_TCP,
            pad: [0; 3],
            tag: flow.tcp_seq,
        }
    } else {
        PendingKey {
            peer: k.daddr,
            a: k.dport,
            b: flow.icmp_seq,
            proto: k.proto,
            pad: [0; 3],
            tag: flow.echo_data,
        }
    }
}

/// The pending key the reply coming back to the endpoint closes. A
/// SYN-ACK or a reset names its SYN by its acknowledgment number, the ISN
/// plus one: one for another connection on the same ports, stale or
/// forged, finds no key. An echo reply names its request by the payload
/// it carries back as well.
#[must_use]
#[inline(always)]
pub const fn reply_key(flow: &Flow) -> PendingKey {
    let k = &flow.key;
    if k.proto == IPPROTO_TCP {
        PendingKey {
            peer: k.saddr,
            a: k.dport,
            b: k.sport,
            proto: IPPROTO_TCP,
            pad: [0; 3],
            tag: u32::from_be_bytes(flow.tcp_ack)
                .wrapping_sub(1)
                .to_be_bytes(),
        }
    } else {
        PendingKey {
            peer: k.saddr,
            a: k.sport,
            b: flow.icmp_seq,
            proto: k.proto,
            pad: [0; 3],
            tag: flow.echo_data,
        }
    }
}

const _: () = {
    assert!(size_of::<PendingKey>() == 28);
    assert!(size_of::<RttKey>() == 20);
    assert!(size_of::<RttStats>() == 48 + 8 * HIST_BUCKETS);
};

// SAFETY: repr(C), explicit padding, every bit pattern valid.
#[cfg(feature = "user")]
unsafe impl aya::Pod for PendingKey {}
// SAFETY: as above.
#[cfg(feature = "user")]
unsafe impl aya::Pod for RttKey {}
// SAFETY: as above.
#[cfg(feature = "user")]
unsafe impl aya::Pod for RttStats {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        ct::{CtKey, v4_mapped},
        headers::{IPPROTO_ICMP, IPPROTO_ICMPV6},
    };

    #[test]
    fn a_retransmitted_syn_times_no_sample() {
        let first = 5_000_000_000;
        let again = after_syn(Some(first), first + 1_000_000_000);
        assert_eq!(sent_at(again), first, "the first SYN's time is kept");
        assert_eq!(sample(again, first + 1_200_000_000), None);
        let thrice = after_syn(Some(again), first + 3_000_000_000);
        assert_eq!(
            (thrice, sample(thrice, first + 3_100_000_000)),
            (again, None)
        );
        let once = after_syn(None, first);
        assert_eq!(sample(once, first + 250_000), Some(250_000));
    }

    #[test]
    fn a_syn_long_after_a_pending_one_is_a_new_connection() {
        let old = 1_000_000_000;
        let now = old + SYN_RETRANSMIT_WINDOW_NS;
        assert_eq!(after_syn(Some(old), now), now);
        assert_eq!(after_syn(Some(old | RETRANSMITTED), now), now);
        assert_eq!(sample(after_syn(Some(old), now), now + 7), Some(7));
    }

    #[test]
    fn keys_have_no_padding_holes() {
        assert_eq!(size_of::<PendingKey>(), 16 + 2 + 2 + 1 + 3 + 4);
        assert_eq!(size_of::<RttKey>(), 16 + 1 + 3);
        assert_eq!(align_of::<PendingKey>(), 1);
        assert_eq!(align_of::<RttKey>(), 1);
    }

    /// A flow of `key`, with an echo's sequence and TCP's numbers.
    fn flow(key: CtKey, icmp_seq: u16, seq: u32, ack: u32) -> Flow {
        Flow {
            key,
            icmp_seq: icmp_seq.to_be_bytes(),
            tcp_seq: seq.to_be_bytes(),
            tcp_ack: ack.to_be_bytes(),
            ..Flow::default()
        }
    }

    /// An echo reply closes its request only when it carries back the
    /// request's payload (the token the agent put there): one forged
    /// with the right identifier and sequence does not.
    #[test]
    fn an_echo_reply_meets_its_request_only_with_its_payload() {
        let req = CtKey {
            saddr: v4_mapped([198, 18, 64, 2]),
            daddr: v4_mapped([198, 18, 65, 2]),
            dport: [0xab, 0xcd],
            proto: IPPROTO_ICMP,
            ..CtKey::default()
        };
        let with = |key, data| Flow {
            echo_data: data,
            ..flow(key, 9, 0, 0)
        };
        let sent = request_key(&with(req, *b"tokn"));
        assert_eq!(sent.tag, *b"tokn");
        assert_eq!(sent, reply_key(&with(req.reversed(0), *b"tokn")));
        assert_ne!(sent, reply_key(&with(req.reversed(0), *b"heal")));
        assert_ne!(sent, reply_key(&with(req.reversed(0), [0; 4])));
    }

    #[test]
    fn ipv6_request_and_reply_keys_meet() {
        let ep = [0x20, 0x01, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        let peer = [0x20, 0x01, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
        let req = CtKey {
            saddr: ep,
            daddr: peer,
            dport: [0x12, 0x34],
            proto: IPPROTO_ICMPV6,
            ..CtKey::default()
        };
        let k = request_key(&flow(req, 3, 0, 0));
        assert_eq!(
            (k.peer, k.a, k.b, k.proto, k.tag),
            (peer, [0x12, 0x34], [0, 3], 58, [0; 4])
        );
        assert_eq!(k, reply_key(&flow(req.reversed(0), 3, 0, 0)));
        let syn = CtKey {
            sport: [0x9c, 0x40],
            dport: [0x10, 0x90],
            proto: IPPROTO_TCP,
            ..req
        };
        let k = request_key(&flow(syn, 0, 0xdead_beef, 0));
        assert_eq!((k.peer, k.tag), (peer, [0xde, 0xad, 0xbe, 0xef]));
        assert_eq!(k, reply_key(&flow(syn.reversed(0), 0, 7, 0xdead_bef0)));
    }

    #[test]
    fn buckets_are_log2_microseconds() {
        assert_eq!(bucket(500), 0);
        assert_eq!(bucket(1_000), 1);
        assert_eq!(bucket(3_999), 2);
        assert_eq!(bucket(1_000_000), 10);
        assert_eq!(bucket(u64::MAX), HIST_BUCKETS - 1);
    }

    #[test]
    fn request_and_reply_keys_meet() {
        let req = CtKey {
            saddr: v4_mapped([198, 18, 64, 2]),
            daddr: v4_mapped([198, 18, 65, 2]),
            sport: [0, 0],
            dport: [0xab, 0xcd],
            proto: IPPROTO_ICMP,
            ..CtKey::default()
        };
        let reply = req.reversed(0);
        assert_eq!(
            request_key(&flow(req, 9, 0, 0)),
            reply_key(&flow(reply, 9, 0, 0))
        );
        assert_ne!(
            request_key(&flow(req, 9, 0, 0)),
            reply_key(&flow(reply, 8, 0, 0))
        );
        let syn = CtKey {
            sport: [0x9c, 0x40],
            dport: [0x10, 0x90],
            proto: IPPROTO_TCP,
            ..req
        };
        let sent = request_key(&flow(syn, 0, 41, 0));
        assert_eq!(sent, reply_key(&flow(syn.reversed(0), 0, 900, 42)));
    }

    /// A SYN-ACK or reset names the SYN it answers by its acknowledgment
    /// number: one acknowledging anything else (another connection on the
    /// same ports, stale or forged) meets no pending SYN, and a SYN of a
    /// new connection on those ports opens a key of its own.
    #[test]
    fn a_tcp_answer_meets_only_the_syn_it_acknowledges() {
        let syn = CtKey {
            saddr: v4_mapped([198, 18, 64, 2]),
            daddr: v4_mapped([198, 18, 65, 2]),
            sport: [0x9c, 0x40],
            dport: [0x10, 0x90],
            proto: IPPROTO_TCP,
            ..CtKey::default()
        };
        let sent = request_key(&flow(syn, 0, 1000, 0));
        let answer = |ack| reply_key(&flow(syn.reversed(0), 0, 5, ack));
        assert_eq!(sent, answer(1001));
        for other in [1000, 1002, 0, u32::MAX] {
            assert_ne!(sent, answer(other), "ack {other}");
        }
        assert_ne!(sent, request_key(&flow(syn, 0, 77_000, 0)));
        // The sequence space wraps: an ISN of 2^32 - 1 is acknowledged by 0.
        assert_eq!(request_key(&flow(syn, 0, u32::MAX, 0)), answer(0));
    }

    #[test]
    fn stats_record_and_merge() {
        let mut a = RttStats::default();
        a.record(2_000, 10);
        a.record(4_000, 20);
        let mut b = RttStats::default();
        b.record(1_000, 30);
        a.merge(&b);
        assert_eq!(
            (a.count, a.sum_ns, a.min_ns, a.max_ns),
            (3, 7_000, 1_000, 4_000)
        );
        assert_eq!((a.last_ns, a.last_at_ns), (1_000, 30));
        assert_eq!(a.hist.iter().sum::<u64>(), 3);
        // The zeroed slot of a CPU that never sampled changes nothing.
        let zeroed = RttStats {
            min_ns: 0,
            ..RttStats::default()
        };
        a.merge(&zeroed);
        assert_eq!((a.count, a.min_ns), (3, 1_000));
    }

    #[test]
    fn a_zeroed_per_cpu_slot_takes_its_first_sample_as_the_minimum() {
        // The entry was created on another CPU: this CPU's slot is all zero.
        let mut slot = RttStats {
            min_ns: 0,
            ..RttStats::default()
        };
        slot.record(5_000, 1);
        slot.record(7_000, 2);
        assert_eq!((slot.count, slot.min_ns, slot.max_ns), (2, 5_000, 7_000));
        let mut merged = RttStats::default();
        merged.merge(&slot);
        assert_eq!(merged.min_ns, 5_000, "never 0 for real samples");
    }
}
