//! In-kernel RTT statistics per peer and protocol, and the loss sweep.

use std::{net::IpAddr, path::Path, time::Duration};

use aya::maps::{HashMap, PerCpuHashMap};
use health_common::{
    ct::{ip_of, key_addr},
    maps::MapId,
    rtt::{PendingKey, RttKey, RttStats},
};
use serde::Serialize;

use super::{DatapathError, ct::proto_name, maps::open};

/// One row of `bpf rtt list`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RttRow {
    /// IPv4 or IPv6 (JSON: a string).
    pub peer: IpAddr,
    pub proto: &'static str,
    pub samples: u64,
    pub losses: u64,
    pub last_ns: u64,
    pub min_ns: u64,
    pub avg_ns: u64,
    pub max_ns: u64,
    /// Seconds of `CLOCK_MONOTONIC` when the last sample was taken.
    pub last_at_ns: u64,
    /// Log2 histogram of RTTs in µs (bucket i: [2^(i-1), 2^i) µs).
    pub histogram: Vec<u64>,
}

fn losses_map_err(source: aya::maps::MapError) -> DatapathError {
    DatapathError::Map {
        map: MapId::RttLosses,
        source,
    }
}

fn stats_map_err(source: aya::maps::MapError) -> DatapathError {
    DatapathError::Map {
        map: MapId::RttStats,
        source,
    }
}

/// Per-peer statistics merged over CPUs, with losses; sorted.
pub fn list(dir: &Path) -> Result<Vec<RttRow>, DatapathError> {
    let map = open(dir, MapId::RttStats)?;
    let stats = PerCpuHashMap::<_, RttKey, RttStats>::try_from(&map).map_err(stats_map_err)?;
    let losses_map = open(dir, MapId::RttLosses)?;
    let losses =
        HashMap::<_, RttKey, u64>::try_from(&losses_map).map_err(|source| DatapathError::Map {
            map: MapId::RttLosses,
            source,
        })?;
    let mut keys: Vec<RttKey> = stats.keys().filter_map(Result::ok).collect();
    keys.extend(losses.keys().filter_map(Result::ok));
    keys.sort();
    keys.dedup();
    let mut rows = Vec::with_capacity(keys.len());
    for k in keys {
        let merged = merged(&stats, k).unwrap_or_default();
        rows.push(RttRow {
            peer: ip_of(k.peer),
            proto: proto_name(k.proto),
            samples: merged.count,
            losses: losses.get(&k, 0).unwrap_or(0),
            last_ns: merged.last_ns,
            min_ns: if merged.count == 0 { 0 } else { merged.min_ns },
            avg_ns: merged.sum_ns.checked_div(merged.count).unwrap_or(0),
            max_ns: merged.max_ns,
            last_at_ns: merged.last_at_ns,
            histogram: merged.hist.to_vec(),
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
    super::maps::per_cpu_entries(dir, MapId::RttStats, |_: &RttKey, per_cpu: &[RttStats]| {
        t.samples += per_cpu.iter().map(|s| s.count).sum::<u64>();
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
    pub sent_ns: u64,
}

/// The pending requests.
pub fn pending(dir: &Path) -> Result<Vec<PendingRow>, DatapathError> {
    let map = open(dir, MapId::RttPending)?;
    let p = HashMap::<_, PendingKey, u64>::try_from(&map).map_err(|source| DatapathError::Map {
        map: MapId::RttPending,
        source,
    })?;
    Ok(p.iter()
        .filter_map(Result::ok)
        .map(|(k, sent_ns)| PendingRow {
            peer: ip_of(k.peer),
            proto: proto_name(k.proto),
            a: u16::from_be_bytes(k.a),
            b: u16::from_be_bytes(k.b),
            sent_ns,
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
        super::maps::per_cpu_entries(dir, MapId::RttStats, |k: &RttKey, per_cpu: &[RttStats]| {
            let mut m = RttStats::default();
            for s in per_cpu {
                m.merge(s);
            }
            if m.count > 0 && m.last_at_ns >= since_ns {
                last.push((*k, m.last_ns));
            }
        })
        .ok()?;
        last.sort_unstable_by_key(|(k, _)| *k);
        Some(Self { last })
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

/// A key's statistics folded over CPUs.
fn merged<T: std::borrow::Borrow<aya::maps::MapData>>(
    stats: &PerCpuHashMap<T, RttKey, RttStats>,
    key: RttKey,
) -> Option<RttStats> {
    let mut m = RttStats::default();
    for s in stats.get(&key, 0).ok()?.iter() {
        m.merge(s);
    }
    Some(m)
}

/// Moves requests unanswered for longer than `timeout` from the pending
/// map into the per-peer loss counters; returns how many.
pub fn sweep(dir: &Path, timeout: Duration) -> Result<u64, DatapathError> {
    sweep_counted(dir, timeout).map(|(lost, _)| lost)
}

/// [`sweep`], and the requests it left pending.
pub fn sweep_counted(dir: &Path, timeout: Duration) -> Result<(u64, u64), DatapathError> {
    use super::maps::{delete_keys, hash_entries, update_entries};
    let now = super::monotonic_ns()?;
    let cutoff = now.saturating_sub(u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX));
    // All in batches: a round of 20,000 probes leaves as many requests,
    // half of them lost when half the peers are silent.
    let mut lost: Vec<PendingKey> = Vec::new();
    let mut seen = 0u64;
    let pending = hash_entries(dir, MapId::RttPending, |k: &PendingKey, sent: &u64| {
        seen += 1;
        if *sent < cutoff {
            lost.push(*k);
        }
    })?;
    if lost.is_empty() {
        return Ok((0, seen));
    }
    // Only the requests this pass removes count (one answered meanwhile
    // is gone already), each once, per peer and protocol: sorted by peer
    // and protocol, the deleted ones are counted in runs (the kernel
    // deletes in order), in two flat lists rather than a map.
    lost.sort_unstable_by_key(|k| (k.peer, k.proto));
    let (mut keys, mut values): (Vec<RttKey>, Vec<u64>) = (Vec::new(), Vec::new());
    let mut n = 0;
    delete_keys(&pending, MapId::RttPending, &lost, |k| {
        let key = RttKey {
            peer: k.peer,
            proto: k.proto,
            pad: [0; 3],
        };
        match (keys.last(), values.last_mut()) {
            (Some(newest), Some(count)) if *newest == key => *count += 1,
            _ => {
                keys.push(key);
                values.push(1);
            }
        }
        n += 1;
    })?;
    drop(lost);
    // The counters are the agent's alone (the kernel never writes them):
    // read, add, write back.
    let losses = hash_entries(dir, MapId::RttLosses, |k: &RttKey, so_far: &u64| {
        if let Ok(i) = keys.binary_search(k) {
            values[i] += so_far;
        }
    })?;
    update_entries(&losses, MapId::RttLosses, &keys, &values)?;
    Ok((n, seen.saturating_sub(n)))
}

/// Removes the RTT statistics and loss counters of every peer address
/// `keep` refuses (peers that left the cluster); returns how many keys went.
pub fn prune(dir: &Path, keep: impl Fn(IpAddr) -> bool) -> Result<u64, DatapathError> {
    let mut removed = 0;
    let mut stats_map = open(dir, MapId::RttStats)?;
    let mut stats =
        PerCpuHashMap::<_, RttKey, RttStats>::try_from(&mut stats_map).map_err(stats_map_err)?;
    for k in departed(stats.keys(), &keep) {
        removed += u64::from(stats.remove(&k).is_ok());
    }
    let mut losses_map = open(dir, MapId::RttLosses)?;
    let mut losses =
        HashMap::<_, RttKey, u64>::try_from(&mut losses_map).map_err(losses_map_err)?;
    for k in departed(losses.keys(), &keep) {
        removed += u64::from(losses.remove(&k).is_ok());
    }
    Ok(removed)
}

/// The keys of peers `keep` refuses, collected before any is removed (a
/// hash map's key walk restarts when the key it stands on goes).
fn departed(
    keys: impl Iterator<Item = Result<RttKey, aya::maps::MapError>>,
    keep: &impl Fn(IpAddr) -> bool,
) -> Vec<RttKey> {
    keys.filter_map(Result::ok)
        .filter(|k| !keep(ip_of(k.peer)))
        .collect()
}
