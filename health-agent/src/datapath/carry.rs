//! Carrying entries across a replaced pin: when an upgrade (or a new size)
//! makes a pinned map incompatible, its entries are read out before the pin
//! goes and written into the map that replaces it, wherever key and value
//! keep their layout. The configuration arrays are not carried: the agent
//! writes them anew at every start. The RTT statistics of the per-CPU
//! layout they had before are carried too, each key's CPUs folded into
//! its one value. The pending echoes of the layout whose pending key held
//! no tag are carried too, tagged with the payload agents of that layout
//! sent; its pending SYNs are not (their answers name an ISN the old key
//! did not keep).

use std::path::Path;

use aya::{
    Ebpf, Pod,
    maps::{HashMap, Map, MapData, MapError, MapInfo, PerCpuArray, PerCpuHashMap, PerCpuValues},
};
use health_common::{
    ct::{CtEntry, CtKey, IPPROTO_TCP},
    maps::MapId,
    nat::{NatEntry, NatKey},
    rtt::{PendingKey, RttKey, RttStats},
};

/// The entries of one replaced map.
pub(super) enum Saved {
    Ct(Vec<(CtKey, CtEntry)>),
    Nat(Vec<(NatKey, NatEntry)>),
    Pending(Vec<(PendingKey, u64)>),
    Losses(Vec<(RttKey, u64)>),
    Rtt(Vec<(RttKey, RttStats)>),
    Counters(Vec<PerCpuValues<u64>>),
}

/// Why the entries of a map were not carried over.
#[derive(Debug, thiserror::Error)]
pub(super) enum NotCarried {
    #[error(
        "its entries changed layout (key {key} bytes, value {value} bytes, per CPU: {per_cpu})"
    )]
    Layout { key: u32, value: u32, per_cpu: bool },
    #[error("the agent writes it anew")]
    Config,
    #[error("its records are of datagrams in flight, soon over")]
    InFlight,
    #[error("reading it: {0}")]
    Read(#[from] MapError),
}

/// Reads the entries of the map pinned at `dir/<map>` when they can be
/// carried into the registry's layout.
pub(super) fn save(dir: &Path, map: MapId) -> Result<Saved, NotCarried> {
    let path = dir.join(map.name());
    let info = MapInfo::from_pin(&path)?;
    let per_cpu = info.map_type().is_ok_and(|t| {
        matches!(
            t,
            aya::maps::MapType::PerCpuHash
                | aya::maps::MapType::LruPerCpuHash
                | aya::maps::MapType::PerCpuArray
        )
    });
    let folded = map == MapId::RttStats && per_cpu;
    if map == MapId::RttPending
        && (info.key_size(), info.value_size(), per_cpu) == (OLD_PENDING_KEY as u32, 8, false)
    {
        let old = Map::from_map_data(MapData::from_pin(&path)?)?;
        return Ok(Saved::Pending(
            entries::<[u8; OLD_PENDING_KEY], u64>(&old)?
                .into_iter()
                .filter_map(|(k, sent)| pending_without_tag(&k).map(|k| (k, sent)))
                .collect(),
        ));
    }
    if (info.key_size(), info.value_size(), per_cpu && !folded)
        != (map.key_size(), map.value_size(), map.kind().is_per_cpu())
    {
        return Err(NotCarried::Layout {
            key: info.key_size(),
            value: info.value_size(),
            per_cpu,
        });
    }
    let old = Map::from_map_data(MapData::from_pin(&path)?)?;
    Ok(match map {
        MapId::CtMap => Saved::Ct(entries(&old)?),
        MapId::NatMap => Saved::Nat(entries(&old)?),
        MapId::RttPending => Saved::Pending(entries(&old)?),
        MapId::RttLosses => Saved::Losses(entries(&old)?),
        MapId::RttStats if folded => Saved::Rtt(
            PerCpuHashMap::<_, RttKey, RttStats>::try_from(&old)?
                .iter()
                .map(|entry| entry.map(|(k, per_cpu)| (k, fold(&per_cpu))))
                .collect::<Result<_, _>>()?,
        ),
        MapId::RttStats => Saved::Rtt(entries(&old)?),
        MapId::EchoStats | MapId::CtStats | MapId::NatStats => Saved::Counters(
            PerCpuArray::<_, u64>::try_from(&old)?
                .iter()
                .collect::<Result<_, _>>()?,
        ),
        MapId::NatFrags => return Err(NotCarried::InFlight),
        _ => return Err(NotCarried::Config),
    })
}

/// The size of the pending key before it held the answer's tag.
const OLD_PENDING_KEY: usize = 24;

/// The payload agents of that layout gave every echo: its replies carry
/// it back.
const OLD_ECHO_PAYLOAD: [u8; 8] = *b"health!!";

/// A pending key of that layout (the peer, `a`, `b`, the protocol, three
/// bytes of padding) in today's: an echo's, tagged with the first bytes of
/// the payload its reply carries back; `None` for a SYN's.
fn pending_without_tag(old: &[u8; OLD_PENDING_KEY]) -> Option<PendingKey> {
    let proto = old[20];
    if proto == IPPROTO_TCP {
        return None;
    }
    let mut peer = [0; 16];
    peer.copy_from_slice(&old[..16]);
    Some(PendingKey {
        peer,
        a: [old[16], old[17]],
        b: [old[18], old[19]],
        proto,
        pad: [0; 3],
        tag: [
            OLD_ECHO_PAYLOAD[0],
            OLD_ECHO_PAYLOAD[1],
            OLD_ECHO_PAYLOAD[2],
            OLD_ECHO_PAYLOAD[3],
        ],
    })
}

/// One key's statistics over every CPU.
fn fold(per_cpu: &PerCpuValues<RttStats>) -> RttStats {
    let mut all = RttStats::default();
    for s in per_cpu.iter() {
        all.merge(s);
    }
    all
}

fn entries<K: Pod, V: Pod>(map: &Map) -> Result<Vec<(K, V)>, MapError> {
    HashMap::<_, K, V>::try_from(map)?.iter().collect()
}

/// Writes `saved` into the object's map `map`; returns how many entries
/// went in and how many did not (a smaller map that is full).
pub(super) fn restore(
    ebpf: &mut Ebpf,
    map: MapId,
    saved: Saved,
) -> Result<(usize, usize), MapError> {
    let Some(m) = ebpf.map_mut(map.name()) else {
        return Ok((0, 0));
    };
    let mut tally = (0, 0);
    let mut count = |ok: bool| {
        if ok {
            tally.0 += 1;
        } else {
            tally.1 += 1;
        }
    };
    match saved {
        Saved::Ct(v) => put(m, v, &mut count)?,
        Saved::Nat(v) => put(m, v, &mut count)?,
        Saved::Pending(v) => put(m, v, &mut count)?,
        Saved::Losses(v) => put(m, v, &mut count)?,
        Saved::Rtt(v) => put(m, v, &mut count)?,
        Saved::Counters(v) => {
            let mut a = PerCpuArray::<_, u64>::try_from(m)?;
            for (i, vals) in (0u32..).zip(v) {
                count(a.set(i, vals, 0).is_ok());
            }
        }
    }
    Ok(tally)
}

/// Inserts `entries` into the new map (nothing else writes it yet: its
/// programs are not attached), counted by what it holds after: a full LRU
/// map evicts an entry for each insert rather than refuse it.
fn put<K: Pod, V: Pod>(
    m: &mut Map,
    entries: Vec<(K, V)>,
    count: &mut impl FnMut(bool),
) -> Result<(), MapError> {
    let mut h = HashMap::<_, K, V>::try_from(m)?;
    let total = entries.len();
    for (k, v) in entries {
        let _ = h.insert(&k, &v, 0);
    }
    let kept = h.keys().flatten().count().min(total);
    (0..total).for_each(|i| count(i < kept));
    Ok(())
}
