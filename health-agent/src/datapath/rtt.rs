//! In-kernel RTT statistics per peer and protocol, and the loss sweep.

use std::{net::IpAddr, path::Path, time::Duration};

use health_common::{
    ct::{IPPROTO_TCP, ip_of, key_addr},
    maps::MapId,
    rtt::{PendingKey, RETRANSMITTED, RttKey, RttStats, sent_at},
};
use serde::Serialize;

use super::{DatapathError, ct::proto_name};

/// One row of `bpf rtt list`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RttRow {
    /// IPv4 or IPv6 (JSON: a string).
    pub peer: IpAddr,
    pub proto: &'static str,
    pub samples: u64,
    pub losses: u64,
    /// The RTT figures: 0 while `samples` is 0 (a peer that has only lost
    /// probes has none).
    pub last_ns: u64,
    pub min_ns: u64,
    pub avg_ns: u64,
    pub max_ns: u64,
    /// Seconds of `CLOCK_MONOTONIC` when the last sample was taken.
    pub last_at_ns: u64,
    /// Log2 histogram of RTTs in µs (bucket i: [2^(i-1), 2^i) µs).
    pub histogram: Vec<u64>,
}

/// Per-peer statistics, with losses; sorted. Both maps are read in
/// batches; a failed read is an error, never a shorter list.
pub fn list(dir: &Path) -> Result<Vec<RttRow>, DatapathError> {
    let mut by_key: std::collections::BTreeMap<RttKey, (RttStats, u64)> =
        std::collections::BTreeMap::new();
    super::maps::hash_entries::<RttKey, RttStats>(dir, MapId::RttStats, |k, s| {
        by_key.entry(*k).or_default().0 = *s;
    })?;
    super::maps::hash_entries::<RttKey, u64>(dir, MapId::RttLosses, |k, n| {
        by_key.entry(*k).or_default().1 = *n;
    })?;
    let mut rows = Vec::with_capacity(by_key.len());
    for (k, (s, lost)) in by_key {
        rows.push(RttRow {
            peer: ip_of(k.peer),
            proto: proto_name(k.proto),
            samples: s.count,
            losses: lost,
            last_ns: s.last_ns,
            min_ns: if s.count == 0 { 0 } else { s.min_ns },
            avg_ns: s.sum_ns.checked_div(s.count).unwrap_or(0),
            max_ns: s.max_ns,
            last_at_ns: s.last_at_ns,
            histogram: s.hist.to_vec(),
        });
    }
    Ok(rows)
}

/// RTT samples and losses summed over every peer and protocol in the
/// maps: (samples, losses).
pub fn totals(dir: &Path) -> Result<(u64, u64), DatapathError> {
    totals_counted(dir).map(|t| (t.samples, t.lost))
}

/// What [`totals_counted`] sums and counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub samples: u64,
    pub lost: u64,
    /// Entries of the statistics map and of the loss counters.
    pub stats_entries: u64,
    pub loss_entries: u64,
}

/// [`totals`], and the entries of the two maps walked.
pub fn totals_counted(dir: &Path) -> Result<Totals, DatapathError> {
    // In batches: two entries per live peer address, each a syscall or two
    // by keys.
    let mut t = Totals::default();
    super::maps::hash_entries(dir, MapId::RttStats, |_: &RttKey, s: &RttStats| {
        t.samples += s.count;
        t.stats_entries += 1;
    })?;
    super::maps::hash_entries(dir, MapId::RttLosses, |_: &RttKey, n: &u64| {
        t.lost += n;
        t.loss_entries += 1;
    })?;
    Ok(t)
}

/// A request still waiting for its reply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PendingRow {
    pub peer: IpAddr,
    pub proto: &'static str,
    /// ICMP and `ICMPv6`: identifier and sequence; TCP: the endpoint's and the peer's ports.
    pub a: u16,
    pub b: u16,
    /// When the request was first sent (`CLOCK_MONOTONIC` ns).
    pub sent_ns: u64,
    /// A SYN sent more than once: its SYN-ACK times no sample.
    pub retransmitted: bool,
    /// TCP: the SYN's sequence number, which its SYN-ACK or reset must
    /// acknowledge (plus one) to close it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub isn: Option<u32>,
    /// ICMP and `ICMPv6`: the request's first 4 payload bytes, in hex,
    /// which its reply must carry back to close it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub echo_data: Option<String>,
}

/// The pending requests (read in batches: the kernel deletes each as its
/// reply comes, which would send a key-by-key walk back to the start).
pub fn pending(dir: &Path) -> Result<Vec<PendingRow>, DatapathError> {
    let mut entries: Vec<(PendingKey, u64)> = Vec::new();
    super::maps::hash_entries::<PendingKey, u64>(dir, MapId::RttPending, |k, v| {
        entries.push((*k, *v));
    })?;
    Ok(entries
        .into_iter()
        .map(|(k, pending)| PendingRow {
            peer: ip_of(k.peer),
            proto: proto_name(k.proto),
            a: u16::from_be_bytes(k.a),
            b: u16::from_be_bytes(k.b),
            sent_ns: sent_at(pending),
            retransmitted: pending & RETRANSMITTED != 0,
            isn: (k.proto == IPPROTO_TCP).then(|| u32::from_be_bytes(k.tag)),
            echo_data: (k.proto != IPPROTO_TCP)
                .then(|| format!("{:08x}", u32::from_be_bytes(k.tag))),
        })
        .collect())
}

/// The kernel's last RTT samples of a round, read in one batched walk of
/// the statistics map (a round asks for every path's: at 10,000 peers,
/// 20,000 lookups of one syscall and one allocation each before).
pub struct KernelRtt {
    /// Each key's last sample at or after the round's start, sorted by key.
    last: Vec<(RttKey, u64)>,
}

impl KernelRtt {
    /// The last sample of every peer and protocol taken at or after
    /// `since_ns` (`CLOCK_MONOTONIC`); `None` when the map is not pinned
    /// in `dir` (no datapath loaded) or cannot be read.
    #[must_use]
    pub fn since(dir: &Path, since_ns: u64) -> Option<Self> {
        let mut last = Vec::new();
        super::maps::hash_entries(dir, MapId::RttStats, |k: &RttKey, s: &RttStats| {
            if s.count > 0 && s.last_at_ns >= since_ns {
                last.push((*k, s.last_ns));
            }
        })
        .ok()?;
        last.sort_unstable_by_key(|(k, _)| *k);
        Some(Self { last })
    }

    /// Samples as a walk would have found them: `(peer, proto, ns)`.
    #[cfg(test)]
    #[must_use]
    pub fn from_samples(samples: &[(IpAddr, u8, u64)]) -> Self {
        let mut last: Vec<(RttKey, u64)> = samples
            .iter()
            .map(|&(peer, proto, ns)| {
                let key = RttKey {
                    peer: key_addr(peer),
                    proto,
                    pad: [0; 3],
                };
                (key, ns)
            })
            .collect();
        last.sort_unstable_by_key(|(k, _)| *k);
        Self { last }
    }

    /// The last sample for `peer`/`proto` since the round's start, if any.
    #[must_use]
    pub fn last_sample(&self, peer: IpAddr, proto: u8) -> Option<Duration> {
        let key = RttKey {
            peer: key_addr(peer),
            proto,
            pad: [0; 3],
        };
        let i = self.last.binary_search_by_key(&key, |(k, _)| *k).ok()?;
        Some(Duration::from_nanos(self.last[i].1))
    }
}

/// Moves requests unanswered for longer than `timeout` from the pending
/// map into the per-peer loss counters; returns how many.
pub fn sweep(dir: &Path, timeout: Duration) -> Result<u64, DatapathError> {
    sweep_counted(dir, timeout).map(|(lost, _)| lost)
}

/// Held by a sweep and a prune from their first read to their last write:
/// a sweep that read a departed peer's lost requests before a prune would
/// otherwise write its loss counter back after it.
static UPKEEP: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// [`sweep`], and the requests it left pending.
pub fn sweep_counted(dir: &Path, timeout: Duration) -> Result<(u64, u64), DatapathError> {
    use super::maps::{Cursor, delete_where_each, hash_entries, update_entries};
    let _one_at_a_time = UPKEEP.lock();
    let now = super::monotonic_ns()?;
    let cutoff = now.saturating_sub(u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX));
    // In one batched walk that deletes as it goes: a round of 20,000
    // probes leaves as many requests, half of them lost when half the
    // peers are silent, and the sweep may run during a round. Only the
    // requests this walk deletes count (one answered meanwhile is gone
    // already), each once, per peer and protocol.
    let mut tally = LossTally::default();
    let walked = delete_where_each(
        dir,
        MapId::RttPending,
        Cursor::START,
        usize::MAX,
        |_: &PendingKey, pending: &u64| sent_at(*pending) < cutoff,
        |k: &PendingKey| {
            tally.add(RttKey {
                peer: k.peer,
                proto: k.proto,
                pad: [0; 3],
            });
        },
    );
    // What was deleted before a failure is counted all the same: the
    // requests are gone from the pending map.
    let (keys, mut values) = tally.finish();
    if !keys.is_empty() {
        // The counters are the agent's alone (the kernel never writes
        // them): read, add, write back.
        let losses = hash_entries(dir, MapId::RttLosses, |k: &RttKey, so_far: &u64| {
            if let Ok(i) = keys.binary_search(k) {
                values[i] += so_far;
            }
        })?;
        update_entries(&losses, MapId::RttLosses, &keys, &values)?;
    }
    let walked = walked?;
    Ok((walked.deleted, walked.seen.saturating_sub(walked.deleted)))
}

/// Losses counted per peer and protocol as the sweep deletes them, in
/// memory of the peers that lost some, not of the requests lost: the keys
/// come a few thousand at a time, each batch sorted and merged into the
/// sorted counts so far. A batch grows to the size of the counts before it
/// is merged, so that many distinct keys (a sweep over 100,000 silent
/// peers) cost O(n log n), not a merge of them all every few thousand.
#[derive(Debug, Default)]
struct LossTally {
    keys: Vec<RttKey>,
    counts: Vec<u64>,
    batch: Vec<RttKey>,
    merges: usize,
}

impl LossTally {
    /// Keys held before they are merged.
    const BATCH: usize = 4096;

    fn add(&mut self, key: RttKey) {
        self.batch.push(key);
        if self.batch.len() >= Self::BATCH.max(self.keys.len()) {
            self.merge();
        }
    }

    /// Merges the batch into the counts.
    fn merge(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        self.merges += 1;
        self.batch.sort_unstable();
        let n = self.keys.len() + self.batch.len();
        let (mut keys, mut counts) = (Vec::with_capacity(n), Vec::with_capacity(n));
        let mut old = self.keys.iter().zip(&self.counts).peekable();
        let mut new = self.batch.iter().peekable();
        loop {
            let (key, count) = match (old.peek(), new.peek()) {
                (Some(&(k, &c)), Some(&b)) if k <= b => {
                    old.next();
                    (*k, c)
                }
                (_, Some(&b)) => {
                    new.next();
                    (*b, 1)
                }
                (Some(&(k, &c)), None) => {
                    old.next();
                    (*k, c)
                }
                (None, None) => break,
            };
            match (keys.last(), counts.last_mut()) {
                (Some(last), Some(total)) if *last == key => *total += count,
                _ => {
                    keys.push(key);
                    counts.push(count);
                }
            }
        }
        keys.shrink_to_fit();
        counts.shrink_to_fit();
        (self.keys, self.counts) = (keys, counts);
        self.batch.clear();
    }

    /// The keys, sorted, and each one's count.
    fn finish(mut self) -> (Vec<RttKey>, Vec<u64>) {
        self.merge();
        (self.keys, self.counts)
    }
}

/// Removes the RTT statistics, loss counters and pending requests of
/// every peer address `keep` refuses (peers that left the cluster; their
/// requests, swept once lost, would count their losses anew); returns how
/// many statistics and counters went.
pub fn prune(dir: &Path, keep: impl Fn(IpAddr) -> bool) -> Result<u64, DatapathError> {
    let _one_at_a_time = UPKEEP.lock();
    super::maps::delete_where_each(
        dir,
        MapId::RttPending,
        super::maps::Cursor::START,
        usize::MAX,
        |k: &PendingKey, _: &u64| !keep(ip_of(k.peer)),
        |_: &PendingKey| {},
    )?;
    let gone = |k: &RttKey| !keep(ip_of(k.peer));
    let (stats, _) =
        super::maps::delete_where::<RttKey, RttStats>(dir, MapId::RttStats, |k, _| gone(k))?;
    let (losses, _) =
        super::maps::delete_where::<RttKey, u64>(dir, MapId::RttLosses, |k, _| gone(k))?;
    Ok(stats + losses)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(peer: u8, proto: u8) -> RttKey {
        let mut k = RttKey {
            proto,
            ..RttKey::default()
        };
        k.peer[15] = peer;
        k
    }

    #[test]
    fn losses_are_counted_per_key_across_batches() {
        let mut t = LossTally::default();
        // 10,000 losses over 50 keys, in a scattered order: three batches.
        let mut want = std::collections::BTreeMap::new();
        for i in 0..10_000u32 {
            let k = key(
                u8::try_from(i * 7 % 25).unwrap_or(0),
                1 + u8::from(i % 2 == 0),
            );
            *want.entry(k).or_insert(0u64) += 1;
            t.add(k);
        }
        assert!(t.batch.len() < LossTally::BATCH, "merged as it went");
        let (keys, counts) = t.finish();
        assert!(keys.is_sorted(), "sorted for the lookups");
        let got: std::collections::BTreeMap<_, _> = keys.into_iter().zip(counts).collect();
        assert_eq!(got, want);
    }

    /// 400,000 losses of distinct keys: merged a number of times that
    /// grows with the log of their number, not a merge of all so far
    /// every 4,096 (about 100).
    #[test]
    fn many_distinct_losses_are_merged_a_logarithmic_number_of_times() {
        let mut t = LossTally::default();
        for i in 0..400_000u32 {
            let mut k = key(0, 1);
            k.peer[..4].copy_from_slice(&i.to_be_bytes());
            t.add(k);
        }
        assert!(t.merges <= 12, "{} merges", t.merges);
        let (keys, counts) = t.finish();
        assert_eq!(keys.len(), 400_000);
        assert!(keys.is_sorted() && counts.iter().all(|c| *c == 1));
    }

    #[test]
    fn no_losses_make_no_keys() {
        assert_eq!(LossTally::default().finish(), (Vec::new(), Vec::new()));
    }
}
