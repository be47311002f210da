//! The masquerade table: listing, counters, and the collector that removes
//! a flow's pair of entries together with its connection-tracking entry.

use std::{net::Ipv4Addr, os::fd::AsFd as _, path::Path};

use aya::maps::{Array, HashMap};
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

/// The entries a collection removes from `entries` (the NAT map, read
/// whole): the pairs whose flows are over (see [`collectable`]; `ct` gives
/// a pair's connection-tracking entry), the holds that are over
/// ([`hold_over`]), and reverse halves no `OUT` entry points to any more.
/// A reverse half another flow claimed after an eviction is that flow's,
/// and stays.
pub fn doomed<E, S: std::hash::BuildHasher>(
    entries: &std::collections::HashMap<NatKey, NatEntry, S>,
    mut ct: impl FnMut(&CtKey) -> Result<Option<CtEntry>, E>,
    cfg: &CtConfig,
    now: u64,
) -> Result<Vec<NatKey>, E> {
    let mut doomed = Vec::new();
    for (k, e) in entries {
        if k.dir == DIR_OUT {
            let tracked = ct(&ct_key_of(k))?;
            if collectable(tracked.as_ref(), e, k.proto, cfg, now) {
                doomed.push(*k);
                let back = in_key(k, e.xlate_addr, e.xlate_port);
                if entries
                    .get(&back)
                    .is_some_and(|b| out_key_of(&back, b) == *k)
                {
                    doomed.push(back);
                }
            }
        } else if held_by_node(k, e) {
            if hold_over(e, k.proto, cfg, now) {
                doomed.push(*k);
            }
        } else if k.dir == DIR_IN {
            let paired = entries
                .get(&out_key_of(k, e))
                .is_some_and(|o| o.xlate_port == k.dport && o.xlate_addr == k.daddr);
            if !paired && collectable(None, e, k.proto, cfg, now) {
                doomed.push(*k);
            }
        }
    }
    // A hold can also be the reverse half of a pair that is over.
    doomed.sort_unstable_by_key(|k| (k.dir, k.proto, k.saddr, k.daddr, k.sport, k.dport));
    doomed.dedup();
    Ok(doomed)
}

/// Removes what [`doomed`] picks; returns how many entries went, also
/// added to the `removed` counter, even when a removal fails part way.
/// The map is read in batches, a few system calls for the whole table;
/// a failed read or removal is an error, never a shorter collection. Run
/// it before the CT collector, so an expired CT entry is still there to
/// be seen.
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
    let ct_err = |source| DatapathError::Map {
        map: MapId::CtMap,
        source,
    };
    let ct = HashMap::<_, CtKey, CtEntry>::try_from(&ct_map).map_err(ct_err)?;
    let mut entries = std::collections::HashMap::new();
    let nat = super::maps::hash_entries::<NatKey, NatEntry>(dir, MapId::NatMap, |k, e| {
        entries.insert(*k, *e);
    })?;
    let doomed = doomed(
        &entries,
        |k| match ct.get(k, 0) {
            Ok(e) => Ok(Some(e)),
            Err(aya::maps::MapError::KeyNotFound) => Ok(None),
            Err(e) => Err(ct_err(e)),
        },
        &cfg,
        now,
    )?;
    drop(entries);
    let mut removed = 0u64;
    let deleted = crate::sys::bpf_batch::delete(nat.fd().as_fd(), &doomed, |_| removed += 1);
    if removed > 0 {
        super::maps::add_to_counter(dir, MapId::NatStats, NatCounter::Removed as u32, removed)?;
    }
    deleted.map_err(|source| DatapathError::MapBatch {
        map: MapId::NatMap,
        op: "deleting entries in batches",
        source,
    })?;
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

    const EP: [u8; 4] = [198, 18, 65, 2];
    const NODE: [u8; 4] = [198, 18, 0, 12];
    const PEER: [u8; 4] = [198, 18, 0, 11];

    /// A flow of the endpoint from `sport` to the peer's hello port, given
    /// the node's `port`, last used at `last_ns`: its `OUT` and `IN` halves.
    fn pair(sport: u16, port: u16, last_ns: u64) -> [(NatKey, NatEntry); 2] {
        let out = NatKey {
            saddr: EP,
            daddr: PEER,
            sport: sport.to_be_bytes(),
            dport: 4240u16.to_be_bytes(),
            proto: IPPROTO_TCP,
            dir: DIR_OUT,
            pad: [0; 2],
        };
        let back = in_key(&out, NODE, port.to_be_bytes());
        let mut o = NatEntry::made(NODE, port.to_be_bytes(), last_ns);
        let mut i = NatEntry::made(EP, sport.to_be_bytes(), last_ns);
        o.last_ns = last_ns;
        i.last_ns = last_ns;
        [(out, o), (back, i)]
    }

    /// An idle pair goes whole; a live pair stays whole; an `IN` half
    /// whose port a later flow claimed after its `OUT` half was evicted is
    /// that flow's and stays with it; an orphaned `IN` half goes once idle.
    #[test]
    fn a_collection_takes_whole_pairs_and_orphans_never_another_flows_half() {
        let cfg = CtConfig::default();
        let idle_s = u64::from(lifetime_s(&cfg, IPPROTO_TCP, 0));
        let now = (idle_s + 100) * S;
        let [old_out, old_in] = pair(40_000, 61_000, 0);
        let [live_out, live_in] = pair(40_001, 61_001, now);
        // A flow of the node's own made after an old flow's OUT was evicted
        // took port 61_002 with an IN half that is still in use.
        let [_, claimed_in] = pair(40_002, 61_002, now);
        let [stale_out, _] = pair(40_003, 61_002, 0);
        // An orphan: its OUT half was evicted long ago.
        let [_, orphan_in] = pair(40_004, 61_004, 0);
        let entries: std::collections::HashMap<_, _> = [
            old_out, old_in, live_out, live_in, claimed_in, stale_out, orphan_in,
        ]
        .into_iter()
        .collect();
        let got = doomed(&entries, |_| Ok::<_, ()>(None), &cfg, now).expect("no ct error");
        let mut want = vec![old_out.0, old_in.0, stale_out.0, orphan_in.0];
        want.sort_unstable_by_key(|k| (k.dir, k.proto, k.saddr, k.daddr, k.sport, k.dport));
        assert_eq!(got, want);
    }

    /// A connection-tracking entry that cannot be read fails the whole
    /// collection: nothing is picked on a partial view.
    #[test]
    fn a_failed_ct_lookup_fails_the_collection() {
        let cfg = CtConfig::default();
        let entries: std::collections::HashMap<_, _> =
            pair(40_000, 61_000, 0).into_iter().collect();
        let got = doomed(&entries, |_| Err("EPERM"), &cfg, u64::MAX / 2);
        assert_eq!(got, Err("EPERM"));
    }

    /// A pair whose CT entry lives stays however long it idles.
    #[test]
    fn a_pair_whose_ct_entry_lives_stays() {
        let cfg = CtConfig::default();
        let now = 10_000 * S;
        let entries: std::collections::HashMap<_, _> =
            pair(40_000, 61_000, 0).into_iter().collect();
        let live = CtEntry {
            expires_ns: now + S,
            ..CtEntry::default()
        };
        let got = doomed(&entries, |_| Ok::<_, ()>(Some(live)), &cfg, now).expect("no error");
        assert_eq!(got, Vec::new());
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
