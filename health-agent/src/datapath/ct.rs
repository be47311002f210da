//! The connection tracking table: listing, counters, garbage collection.

use std::{
    fmt,
    net::{IpAddr, SocketAddr},
    path::Path,
};

use health_common::{
    ct::{CtCounter, CtEntry, CtKey, DIR_IN, DIR_OUT, IPPROTO_TCP, IPPROTO_UDP, ip_of},
    headers::{IPPROTO_ICMP, IPPROTO_ICMPV6},
    maps::MapId,
};
use serde::Serialize;

use super::DatapathError;

/// One entry, decoded. IPv4 flows have IPv4 addresses, IPv6 flows IPv6
/// ones (JSON: strings either way).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CtRow {
    pub proto: &'static str,
    pub dir: &'static str,
    pub src: IpAddr,
    pub sport: u16,
    pub dst: IpAddr,
    pub dport: u16,
    /// Seconds of `CLOCK_MONOTONIC` when the entry expires, and how far
    /// ahead of now that is (negative: due for collection).
    pub expires: u64,
    pub expires_in_seconds: i64,
    pub created_seconds_ago: u64,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub rx_flags_seen: u8,
    pub tx_flags_seen: u8,
}

#[must_use]
pub const fn proto_name(p: u8) -> &'static str {
    match p {
        IPPROTO_ICMP => "ICMP",
        IPPROTO_ICMPV6 => "ICMPv6",
        IPPROTO_TCP => "TCP",
        IPPROTO_UDP => "UDP",
        _ => "OTHER",
    }
}

fn row(k: &CtKey, e: &CtEntry, now: u64) -> CtRow {
    CtRow {
        proto: proto_name(k.proto),
        dir: match k.dir {
            DIR_OUT => "OUT",
            DIR_IN => "IN",
            _ => "?",
        },
        src: ip_of(k.saddr),
        sport: u16::from_be_bytes(k.sport),
        dst: ip_of(k.daddr),
        dport: u16::from_be_bytes(k.dport),
        expires: e.expires_ns / 1_000_000_000,
        expires_in_seconds: (i128::from(e.expires_ns) - i128::from(now))
            .clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as i64
            / 1_000_000_000,
        created_seconds_ago: now.saturating_sub(e.created_ns) / 1_000_000_000,
        rx_packets: e.rx_packets,
        rx_bytes: e.rx_bytes,
        tx_packets: e.tx_packets,
        tx_bytes: e.tx_bytes,
        rx_flags_seen: e.rx_flags_seen,
        tx_flags_seen: e.tx_flags_seen,
    }
}

/// `address:port`, IPv6 in brackets (`[2001:2::1]:4240`), as `cilium bpf
/// ct list` prints it.
#[must_use]
pub fn endpoint(ip: IpAddr, port: u16) -> impl fmt::Display {
    SocketAddr::new(ip, port)
}

impl CtRow {
    /// `cilium bpf ct list global` style.
    #[must_use]
    pub fn line(&self) -> String {
        format!(
            "{} {} {} -> {} expires={} ({}s) RxPackets={} RxBytes={} RxFlagsSeen={:#04x} TxPackets={} TxBytes={} TxFlagsSeen={:#04x} Created={}sec ago",
            self.proto,
            self.dir,
            endpoint(self.src, self.sport),
            endpoint(self.dst, self.dport),
            self.expires,
            self.expires_in_seconds,
            self.rx_packets,
            self.rx_bytes,
            self.rx_flags_seen,
            self.tx_packets,
            self.tx_bytes,
            self.tx_flags_seen,
            self.created_seconds_ago
        )
    }
}

/// Every entry of the pinned CT map, sorted: read in batches, bucket by
/// bucket, so that an entry deleted meanwhile (collected, evicted) never
/// sends the walk back to the start, listing entries twice.
pub fn list(dir: &Path) -> Result<Vec<CtRow>, DatapathError> {
    let now = super::monotonic_ns()?;
    let mut rows: Vec<CtRow> = Vec::new();
    super::maps::hash_entries::<CtKey, CtEntry>(dir, MapId::CtMap, |k, e| {
        rows.push(row(k, e, now));
    })?;
    rows.sort_by(|a, b| {
        (a.proto, a.dir, a.src, a.sport, a.dst, a.dport)
            .cmp(&(b.proto, b.dir, b.src, b.sport, b.dst, b.dport))
    });
    Ok(rows)
}

/// The per-CPU CT counters, summed, by name, and `evicted`: entries the
/// LRU map dropped to make room when full. The programs never delete, so
/// every entry created is either still there, removed by the collector
/// (counted), or evicted: `evicted = created - removed - entries`.
pub fn counters(dir: &Path) -> Result<Vec<(&'static str, u64)>, DatapathError> {
    let wanted: Vec<_> = CtCounter::ALL
        .iter()
        .map(|c| (c.name(), *c as u32))
        .collect();
    // The counters before the entries ([`evicted`]).
    let mut out = super::maps::read_counters(dir, MapId::CtStats, &wanted)?;
    let entries = super::maps::entries(dir, MapId::CtMap)?;
    let get = |name| out.iter().find(|(n, _)| *n == name).map_or(0, |(_, v)| *v);
    let (created, removed) = (
        get(CtCounter::Created.name()),
        get(CtCounter::Removed.name()),
    );
    out.push(("evicted", evicted(created, removed, entries)));
    Ok(out)
}

/// The `created` and `removed` counters, summed over CPUs.
pub fn created_and_removed(dir: &Path) -> Result<(u64, u64), DatapathError> {
    let out = super::maps::read_counters(
        dir,
        MapId::CtStats,
        &[
            (CtCounter::Created.name(), CtCounter::Created as u32),
            (CtCounter::Removed.name(), CtCounter::Removed as u32),
        ],
    )?;
    let get = |name| out.iter().find(|(n, _)| *n == name).map_or(0, |(_, v)| *v);
    Ok((
        get(CtCounter::Created.name()),
        get(CtCounter::Removed.name()),
    ))
}

/// Entries the kernel evicted (LRU): created, less removed by the
/// collector, less still in the map. Exact when the counters are read
/// before the map is counted: an entry created in between is counted in
/// the map and not yet as created, which only lowers the figure until the
/// next count; read the other way round it would count as evicted.
#[must_use]
pub const fn evicted(created: u64, removed: u64, entries: u64) -> u64 {
    created.saturating_sub(removed).saturating_sub(entries)
}

/// [`evicted`] as a counter: never below the figure of the walk before
/// (`previous`). Entries created while a walk counts the map lower the
/// figure for that walk, and counters that could not be read read zero;
/// a counter going back would read as a reset, and a rate over it as a
/// burst of evictions that never happened.
#[must_use]
pub fn evicted_since(previous: u64, created: u64, removed: u64, entries: u64) -> u64 {
    previous.max(evicted(created, removed, entries))
}

/// Removes expired entries; returns how many, also added to the
/// `removed` counter.
pub fn gc(dir: &Path) -> Result<u64, DatapathError> {
    gc_counted(dir).map(|(removed, _)| removed)
}

/// [`gc`], and the entries it left.
pub fn gc_counted(dir: &Path) -> Result<(u64, u64), DatapathError> {
    let closed = health_common::ct::CtConfig::default().tcp_closed_s;
    let (slice, _) = gc_slice(dir, super::maps::Cursor::START, usize::MAX, closed)?;
    Ok((slice.deleted, slice.seen.saturating_sub(slice.deleted)))
}

/// [`gc`] over a slice of the map (from `from`, about `budget` entries),
/// so that a pass over a large map is spread over time; with the earliest
/// any entry it kept can expire (`u64::MAX` when it kept none): its expiry,
/// or, for an open TCP connection, as soon as a reset could cut it to
/// `tcp_closed_s` ([`CtEntry::earliest_expiry`]).
pub fn gc_slice(
    dir: &Path,
    from: super::maps::Cursor,
    budget: usize,
    tcp_closed_s: u32,
) -> Result<(super::maps::Slice, u64), DatapathError> {
    let now = super::monotonic_ns()?;
    let mut earliest = u64::MAX;
    // In batches: a pass over the tens of thousands of entries of a large
    // cluster in a few syscalls, not two per entry, deleting as it goes.
    let mut deleted = 0u64;
    let slice = super::maps::delete_where_each(
        dir,
        MapId::CtMap,
        from,
        budget,
        |k: &CtKey, e: &CtEntry| {
            let gone = e.expires_ns < now;
            if !gone {
                earliest = earliest.min(e.earliest_expiry(k.proto, now, tcp_closed_s));
            }
            gone
        },
        |_: &CtKey| deleted += 1,
    );
    // Entries deleted before a failure are counted all the same: they are
    // gone, and uncounted they would read as evicted.
    if deleted > 0 {
        super::maps::add_to_counter(dir, MapId::CtStats, CtCounter::Removed as u32, deleted)?;
    }
    Ok((slice?, earliest))
}

#[cfg(test)]
mod tests {
    use super::*;
    use health_common::ct::{key_addr, v4_mapped};

    #[test]
    fn evictions_never_go_back() {
        assert_eq!(evicted_since(0, 100, 10, 80), 10);
        // More entries counted this walk (created while it counted).
        assert_eq!(evicted_since(10, 120, 10, 105), 10);
        // Counters unread (zero).
        assert_eq!(evicted_since(10, 0, 0, 50), 10);
        assert_eq!(evicted_since(10, 200, 20, 160), 20);
    }

    #[test]
    fn evictions_are_what_was_created_and_is_neither_removed_nor_there() {
        assert_eq!(evicted(100, 30, 60), 10);
        assert_eq!(evicted(100, 30, 70), 0);
        // Counted the wrong way round (entries created after the counters
        // were read): never below zero.
        assert_eq!(evicted(100, 30, 75), 0);
    }

    #[test]
    fn rows_show_either_family_readably() {
        let v6: IpAddr = "2001:2::1".parse().expect("addr");
        let peer: IpAddr = "2001:2::2".parse().expect("addr");
        let k = CtKey {
            saddr: key_addr(v6),
            daddr: key_addr(peer),
            dport: 0x0102u16.to_be_bytes(),
            proto: IPPROTO_ICMPV6,
            dir: DIR_OUT,
            ..CtKey::default()
        };
        let r = row(&k, &CtEntry::default(), 0);
        assert_eq!((r.proto, r.src, r.dst, r.dport), ("ICMPv6", v6, peer, 258));
        assert!(
            r.line()
                .starts_with("ICMPv6 OUT [2001:2::1]:0 -> [2001:2::2]:258 expires="),
            "{}",
            r.line()
        );
        let json = serde_json::to_value(&r).expect("json");
        assert_eq!(
            (json["src"].as_str(), json["dst"].as_str()),
            (Some("2001:2::1"), Some("2001:2::2"))
        );

        let v4 = CtKey {
            saddr: v4_mapped([198, 18, 64, 2]),
            daddr: v4_mapped([198, 18, 65, 2]),
            proto: IPPROTO_TCP,
            ..k
        };
        let r = row(&v4, &CtEntry::default(), 0);
        assert!(
            r.line()
                .starts_with("TCP OUT 198.18.64.2:0 -> 198.18.65.2:258 "),
            "{}",
            r.line()
        );
        assert_eq!(
            serde_json::to_value(&r).expect("json")["src"],
            "198.18.64.2"
        );
    }
}
