//! The masquerade table: listing, counters, and the collector that removes
//! a flow's pair of entries together with its connection-tracking entry.

use std::{net::Ipv4Addr, path::Path};

use aya::maps::{Array, HashMap, MapData};
use health_common::{
    ct::{CtConfig, CtEntry, CtKey, DIR_IN, DIR_OUT, TCP_ACK, lifetime_s},
    maps::MapId,
    nat::{
        NatCounter, NatEntry, NatKey, ct_key_of,
        fragments::{FragEntry, FragKey},
        held_by_node, in_key, out_key_of,
    },
};
use serde::Serialize;

use super::{DatapathError, ct::proto_name, maps::open};

/// One entry, decoded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NatRow {
    pub proto: &'static str,
    pub dir: &'static str,
    pub src: Ipv4Addr,
    pub sport: u16,
    pub dst: Ipv4Addr,
    pub dport: u16,
    /// `XLATE_SRC` (OUT: the new source), `XLATE_DST` (IN: the new
    /// destination) or `HELD_BY_NODE` (IN: a port of the range a flow of
    /// the node's own has toward the peer, handed to no endpoint flow).
    pub xlate: &'static str,
    pub xlate_addr: Ipv4Addr,
    pub xlate_port: u16,
    pub created_seconds_ago: u64,
    pub last_used_seconds_ago: u64,
}

impl NatRow {
    /// `cilium bpf nat list` style.
    #[must_use]
    pub fn line(&self) -> String {
        format!(
            "{} {} {}:{} -> {}:{} {} {}:{} Created={}sec ago LastUsed={}sec ago",
            self.proto,
            self.dir,
            self.src,
            self.sport,
            self.dst,
            self.dport,
            self.xlate,
            self.xlate_addr,
            self.xlate_port,
            self.created_seconds_ago,
            self.last_used_seconds_ago
        )
    }
}

fn row(k: &NatKey, e: &NatEntry, now: u64) -> NatRow {
    let out = k.dir == DIR_OUT;
    NatRow {
        proto: proto_name(k.proto),
        dir: if out { "OUT" } else { "IN" },
        src: Ipv4Addr::from(k.saddr),
        sport: u16::from_be_bytes(k.sport),
        dst: Ipv4Addr::from(k.daddr),
        dport: u16::from_be_bytes(k.dport),
        xlate: if out {
            "XLATE_SRC"
        } else if held_by_node(k, e) {
            "HELD_BY_NODE"
        } else {
            "XLATE_DST"
        },
        xlate_addr: Ipv4Addr::from(e.xlate_addr),
        xlate_port: u16::from_be_bytes(e.xlate_port),
        created_seconds_ago: now.saturating_sub(e.created_ns) / 1_000_000_000,
        last_used_seconds_ago: now.saturating_sub(e.last_ns) / 1_000_000_000,
    }
}

fn nat_map(
    map: &mut aya::maps::Map,
) -> Result<HashMap<&mut MapData, NatKey, NatEntry>, DatapathError> {
    HashMap::try_from(map).map_err(|source| DatapathError::Map {
        map: MapId::NatMap,
        source,
    })
}

/// Every entry of the pinned NAT map, `OUT` before `IN`, sorted (read in
/// batches, as [`super::ct::list`] reads).
pub fn list(dir: &Path) -> Result<Vec<NatRow>, DatapathError> {
    let now = super::monotonic_ns()?;
    let mut rows: Vec<NatRow> = Vec::new();
    super::maps::hash_entries::<NatKey, NatEntry>(dir, MapId::NatMap, |k, e| {
        rows.push(row(k, e, now));
    })?;
    rows.sort_by(|a, b| {
        b.dir.cmp(a.dir).then_with(|| {
            (a.proto, a.src, a.sport, a.dst, a.dport)
                .cmp(&(b.proto, b.src, b.sport, b.dst, b.dport))
        })
    });
    Ok(rows)
}

/// One record of the fragment map: a masqueraded datagram whose later
/// fragments are translated like its first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FragRow {
    pub proto: &'static str,
    /// `OUT` (leaving, as the endpoint sent it) or `IN` (arriving).
    pub dir: &'static str,
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    /// The IP identification the datagram's fragments share.
    pub id: u16,
    /// `XLATE_SRC` or `XLATE_DST`, as in the NAT map.
    pub xlate: &'static str,
    pub xlate_addr: Ipv4Addr,
    /// Since the datagram's first fragment passed (a record counts for
    /// 30 s).
    pub created_seconds_ago: u64,
}

fn frag_row(k: &FragKey, e: FragEntry, now: u64) -> FragRow {
    let out = k.dir == DIR_OUT;
    FragRow {
        proto: proto_name(k.proto),
        dir: if out { "OUT" } else { "IN" },
        src: Ipv4Addr::from(k.saddr),
        dst: Ipv4Addr::from(k.daddr),
        id: u16::from_be_bytes(k.id),
        xlate: if out { "XLATE_SRC" } else { "XLATE_DST" },
        xlate_addr: Ipv4Addr::from(e.xlate_addr),
        created_seconds_ago: now.saturating_sub(e.created_ns) / 1_000_000_000,
    }
}

/// Every record of the pinned fragment map, `OUT` before `IN`, sorted.
pub fn fragments(dir: &Path) -> Result<Vec<FragRow>, DatapathError> {
    let now = super::monotonic_ns()?;
    let mut rows = Vec::new();
    super::maps::hash_entries::<FragKey, FragEntry>(dir, MapId::NatFrags, |k, e| {
        rows.push(frag_row(k, *e, now));
    })?;
    rows.sort_by(|a, b| {
        b.dir
            .cmp(a.dir)
            .then_with(|| (a.proto, a.src, a.dst, a.id).cmp(&(b.proto, b.src, b.dst, b.id)))
    });
    Ok(rows)
}

/// Removes the fragment map's records past their lifetime (the programs
/// ignore them already), in batches as the walk goes: the map holds only
/// datagrams whose later fragments may still come, so its pressure means
/// what it says. Returns how many went.
pub fn gc_fragments(dir: &Path) -> Result<u64, DatapathError> {
    let now = super::monotonic_ns()?;
    let (deleted, _) =
        super::maps::delete_where::<FragKey, FragEntry>(dir, MapId::NatFrags, |_, e| !e.live(now))?;
    Ok(deleted)
}

/// The per-CPU NAT counters, summed, by name.
pub fn counters(dir: &Path) -> Result<Vec<(&'static str, u64)>, DatapathError> {
    let wanted: Vec<_> = NatCounter::ALL
        .iter()
        .map(|c| (c.name(), *c as u32))
        .collect();
    super::maps::read_counters(dir, MapId::NatStats, &wanted)
}

/// Whether the pair of a flow may go, given its connection-tracking entry
/// (on `lxc_health`): while that entry lives, so does the pair; once it
/// expired, the pair goes with it. A flow conntrack never saw (or lost to
/// its LRU) keeps its pair until it has been idle for its protocol's
/// lifetime.
#[must_use]
pub fn collectable(
    ct: Option<&CtEntry>,
    nat: &NatEntry,
    proto: u8,
    cfg: &CtConfig,
    now: u64,
) -> bool {
    if let Some(e) = ct {
        return e.expires_ns < now;
    }
    idle_past(nat, lifetime_s(cfg, proto, 0), now)
}

/// Whether `e` has been idle at `now` for longer than `lifetime_s`.
fn idle_past(e: &NatEntry, lifetime_s: u32, now: u64) -> bool {
    now.saturating_sub(e.last_ns) > u64::from(lifetime_s) * 1_000_000_000
}

/// Whether a port held for a flow of the node's own (no conntrack entry
/// of the agent's sees it) may go: idle for its protocol's lifetime, a
/// TCP connection's being that of an established one (the node's
/// connection may idle for hours; its hold must outlive that) until it
/// sent a FIN or RST, a closed one's from then.
#[must_use]
pub fn hold_over(held: &NatEntry, proto: u8, cfg: &CtConfig, now: u64) -> bool {
    idle_past(held, lifetime_s(cfg, proto, TCP_ACK | held.closing), now)
}

/// Removes the pairs whose flows are over (see [`collectable`]) and
/// reverse halves no `OUT` entry points to any more; returns how many
/// entries went, also added to the `removed` counter. Run it before the CT
/// collector, so an expired CT entry is still there to be seen.
pub fn gc(dir: &Path) -> Result<u64, DatapathError> {
    let now = super::monotonic_ns()?;
    let cfg = {
        let map = open(dir, MapId::CtConfig)?;
        Array::<_, CtConfig>::try_from(&map)
            .and_then(|a| a.get(&0, 0))
            .map_err(|source| DatapathError::Map {
                map: MapId::CtConfig,
                source,
            })?
    };
    let ct_map = open(dir, MapId::CtMap)?;
    let ct =
        HashMap::<_, CtKey, CtEntry>::try_from(&ct_map).map_err(|source| DatapathError::Map {
            map: MapId::CtMap,
            source,
        })?;
    let mut map = open(dir, MapId::NatMap)?;
    let mut nat = nat_map(&mut map)?;
    let entries: Vec<(NatKey, NatEntry)> = nat.iter().filter_map(Result::ok).collect();
    let mut doomed = Vec::new();
    for (k, e) in &entries {
        if k.dir == DIR_OUT {
            let tracked = ct.get(&ct_key_of(k), 0).ok();
            if collectable(tracked.as_ref(), e, k.proto, &cfg, now) {
                doomed.push(*k);
                // Its reverse half, unless another flow claimed the port
                // after an eviction: that one is the other flow's.
                let back = in_key(k, e.xlate_addr, e.xlate_port);
                if nat.get(&back, 0).is_ok_and(|b| out_key_of(&back, &b) == *k) {
                    doomed.push(back);
                }
            }
        } else if held_by_node(k, e) {
            if hold_over(e, k.proto, &cfg, now) {
                doomed.push(*k);
            }
        } else if k.dir == DIR_IN {
            let owner = out_key_of(k, e);
            let paired = nat
                .get(&owner, 0)
                .is_ok_and(|o| o.xlate_port == k.dport && o.xlate_addr == k.daddr);
            if !paired && collectable(None, e, k.proto, &cfg, now) {
                doomed.push(*k);
            }
        }
    }
    // A key listed twice fails its second removal and is counted once.
    let mut removed = 0u64;
    for k in &doomed {
        if nat.remove(k).is_ok() {
            removed += 1;
        }
    }
    if removed > 0 {
        super::maps::add_to_counter(dir, MapId::NatStats, NatCounter::Removed as u32, removed)?;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use health_common::ct::{IPPROTO_TCP, TCP_RST};

    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_pair_lives_as_long_as_its_ct_entry() {
        let cfg = CtConfig::default();
        let nat = NatEntry {
            last_ns: 0,
            ..NatEntry::default()
        };
        let live = CtEntry {
            expires_ns: 100 * S,
            ..CtEntry::default()
        };
        // Idle far beyond any lifetime, but the CT entry still lives.
        assert!(!collectable(Some(&live), &nat, IPPROTO_TCP, &cfg, 99 * S));
        assert!(collectable(Some(&live), &nat, IPPROTO_TCP, &cfg, 101 * S));
    }

    #[test]
    fn an_untracked_pair_goes_after_its_idle_lifetime() {
        let cfg = CtConfig::default();
        let nat = NatEntry {
            last_ns: 10 * S,
            ..NatEntry::default()
        };
        let icmp = health_common::headers::IPPROTO_ICMP;
        assert!(!collectable(None, &nat, icmp, &cfg, (10 + 60) * S));
        assert!(collectable(None, &nat, icmp, &cfg, (10 + 61) * S));
    }

    /// A port held for a TCP connection of the node's own lasts an
    /// established connection's idle lifetime, not a SYN's, until it
    /// closes; an echo's, the ICMP lifetime.
    #[test]
    fn a_hold_lasts_its_flows_idle_lifetime() {
        let cfg = CtConfig::default();
        let held = NatEntry {
            last_ns: 10 * S,
            ..NatEntry::default()
        };
        let syn_s = u64::from(cfg.tcp_syn_s);
        let established_s = u64::from(cfg.tcp_established_s);
        assert!(syn_s < established_s, "the defaults differ");
        assert!(!hold_over(&held, IPPROTO_TCP, &cfg, (11 + syn_s) * S));
        assert!(hold_over(
            &held,
            IPPROTO_TCP,
            &cfg,
            (11 + established_s) * S
        ));
        // Closed (a reset sent): a closed connection's lifetime.
        let closed_s = u64::from(cfg.tcp_closed_s);
        let closed = NatEntry {
            closing: NatEntry::closing_after(0, TCP_RST),
            ..held
        };
        assert!(!hold_over(&closed, IPPROTO_TCP, &cfg, (9 + closed_s) * S));
        assert!(hold_over(&closed, IPPROTO_TCP, &cfg, (11 + closed_s) * S));
        let icmp_s = u64::from(cfg.icmp_s);
        assert!(!hold_over(&held, 1, &cfg, (9 + icmp_s) * S));
        assert!(hold_over(&held, 1, &cfg, (11 + icmp_s) * S));
    }

    #[test]
    fn rows_read_like_cilium() {
        let k = NatKey {
            saddr: [198, 18, 64, 2],
            daddr: [198, 18, 0, 12],
            sport: 513u16.to_be_bytes(),
            dport: [0, 0],
            proto: 1,
            dir: DIR_OUT,
            pad: [0; 2],
        };
        let e = NatEntry {
            created_ns: S,
            last_ns: 3 * S,
            xlate_addr: [198, 18, 0, 11],
            xlate_port: 61_001u16.to_be_bytes(),
            closing: 0,
            pad: 0,
        };
        assert_eq!(
            row(&k, &e, 5 * S).line(),
            "ICMP OUT 198.18.64.2:513 -> 198.18.0.12:0 XLATE_SRC 198.18.0.11:61001 Created=4sec ago LastUsed=2sec ago"
        );
        let back = in_key(&k, e.xlate_addr, e.xlate_port);
        assert_eq!(back.dir, DIR_IN);
        let r = row(
            &back,
            &NatEntry {
                xlate_addr: k.saddr,
                xlate_port: k.sport,
                ..e
            },
            5 * S,
        );
        assert_eq!(
            (r.dir, r.xlate, r.xlate_addr, r.xlate_port),
            ("IN", "XLATE_DST", Ipv4Addr::new(198, 18, 64, 2), 513)
        );
    }
}
