//! Opening the pinned maps, and the `bpf map list` view of all of them.

use std::path::Path;

use aya::maps::{
    HashMap, Map, MapData, MapInfo, MapType, PerCpuArray, PerCpuHashMap, PerCpuValues,
};
use health_common::{
    ct::{CtEntry, CtKey},
    maps::ALL_MAPS,
    nat::NatEntry,
    rtt::{PendingKey, RttKey, RttStats},
};
use serde::Serialize;

use super::DatapathError;

/// Opens the map pinned as `dir/name`.
pub fn open(dir: &Path, name: &str) -> Result<Map, DatapathError> {
    let path = dir.join(name);
    let pinned = |source| DatapathError::Pinned {
        path: path.clone(),
        source,
    };
    let data = MapData::from_pin(&path).map_err(pinned)?;
    Map::from_map_data(data).map_err(pinned)
}

/// The configuration arrays (`ECHO_CONFIG`, `CT_CONFIG`, `NAT_CONFIG`), decoded.
pub fn dump_config(dir: &Path, name: &'static str) -> Result<serde_json::Value, DatapathError> {
    use aya::maps::Array;
    use health_common::{ct::CtConfig, maps::EchoConfig};
    let err = |source| DatapathError::Map { name, source };
    let map = open(dir, name)?;
    Ok(if name == "NAT_CONFIG" {
        let c = Array::<_, health_common::nat::NatConfig>::try_from(&map)
            .map_err(err)?
            .get(&0, 0)
            .map_err(err)?;
        let ip = std::net::Ipv4Addr::from;
        let prefix = |m: [u8; 4]| u32::from_be_bytes(m).count_ones();
        serde_json::json!({
            "enabled": c.enabled == 1,
            "node_ip": ip(c.node_ip).to_string(),
            "masqueraded_sources": format!("{}/{}", ip(c.src_net), prefix(c.src_mask)),
            "health_range": format!("{}/{}", ip(c.exclude_net), prefix(c.exclude_mask)),
            "port_min": c.port_min,
            "port_max": c.port_max,
        })
    } else if name == "CT_CONFIG" {
        let c = Array::<_, CtConfig>::try_from(&map)
            .map_err(err)?
            .get(&0, 0)
            .map_err(err)?;
        serde_json::json!({
            "icmp_lifetime_s": c.icmp_s, "udp_lifetime_s": c.udp_s, "tcp_syn_lifetime_s": c.tcp_syn_s,
            "tcp_established_lifetime_s": c.tcp_established_s, "tcp_closed_lifetime_s": c.tcp_closed_s,
        })
    } else {
        let c = Array::<_, EchoConfig>::try_from(&map)
            .map_err(err)?
            .get(&0, 0)
            .map_err(err)?;
        serde_json::json!({ "endpoint_address": std::net::Ipv4Addr::from(c.addr).to_string() })
    })
}

/// One row of `bpf map list`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MapRow {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub entries: u64,
    pub max_entries: u32,
    /// entries / max entries.
    pub pressure: f64,
}

/// Every pinned map of the datapath in `dir` (missing ones are skipped).
pub fn list(dir: &Path) -> Result<Vec<MapRow>, DatapathError> {
    let mut rows = Vec::new();
    for name in ALL_MAPS {
        let path = dir.join(name);
        if !path.exists() {
            continue;
        }
        let info = MapInfo::from_pin(&path).map_err(|source| DatapathError::Pinned {
            path: path.clone(),
            source,
        })?;
        let kind = info
            .map_type()
            .map_or_else(|_| "unknown".to_owned(), |t| type_name(t).to_owned());
        let entries = count(dir, name, &info)?;
        #[allow(clippy::cast_precision_loss, reason = "a ratio for display")]
        let pressure = if info.max_entries() == 0 {
            0.0
        } else {
            entries as f64 / f64::from(info.max_entries())
        };
        rows.push(MapRow {
            name: name.to_owned(),
            kind,
            entries,
            max_entries: info.max_entries(),
            pressure,
        });
    }
    Ok(rows)
}

fn type_name(t: MapType) -> &'static str {
    match t {
        MapType::Hash => "hash",
        MapType::LruHash => "lru_hash",
        MapType::Array => "array",
        MapType::PerCpuArray => "percpu_array",
        MapType::PerCpuHash => "percpu_hash",
        MapType::RingBuf => "ringbuf",
        _ => "other",
    }
}

/// Entries in a map: every key of a hash map, every slot of an array (as
/// bpftool dumps them); ring buffers hold no entries.
fn count(dir: &Path, name: &'static str, info: &MapInfo) -> Result<u64, DatapathError> {
    let err = |source| DatapathError::Map { name, source };
    let map = open(dir, name)?;
    let n = match (name, &map) {
        (health_common::maps::NAT_MAP, _) => HashMap::<_, CtKey, NatEntry>::try_from(&map)
            .map_err(err)?
            .keys()
            .count(),
        (health_common::maps::CT_MAP, _) => HashMap::<_, CtKey, CtEntry>::try_from(&map)
            .map_err(err)?
            .keys()
            .count(),
        (health_common::maps::RTT_PENDING, _) => HashMap::<_, PendingKey, u64>::try_from(&map)
            .map_err(err)?
            .keys()
            .count(),
        (health_common::maps::RTT_LOSSES, _) => HashMap::<_, RttKey, u64>::try_from(&map)
            .map_err(err)?
            .keys()
            .count(),
        (health_common::maps::RTT_STATS, _) => PerCpuHashMap::<_, RttKey, RttStats>::try_from(&map)
            .map_err(err)?
            .keys()
            .count(),
        (_, Map::Array(_) | Map::PerCpuArray(_)) => info.max_entries() as usize,
        _ => 0,
    };
    Ok(n as u64)
}

/// Per-CPU `u64` counters of array `map`, summed over the CPUs, by name.
pub fn read_counters(
    dir: &Path,
    map: &'static str,
    wanted: &[(&'static str, u32)],
) -> Result<Vec<(&'static str, u64)>, DatapathError> {
    let err = |source| DatapathError::Map { name: map, source };
    let opened = open(dir, map)?;
    let stats = PerCpuArray::<_, u64>::try_from(&opened).map_err(err)?;
    wanted
        .iter()
        .map(|(name, idx)| Ok((*name, stats.get(idx, 0).map_err(err)?.iter().sum())))
        .collect()
}

/// Adds `n` to CPU 0's slot of counter `idx` in `map` (a counter only the
/// agent writes, such as entries removed by its garbage collector).
pub fn add_to_counter(
    dir: &Path,
    map: &'static str,
    idx: u32,
    n: u64,
) -> Result<(), DatapathError> {
    let err = |source| DatapathError::Map { name: map, source };
    let mut opened = open(dir, map)?;
    let mut stats = PerCpuArray::<_, u64>::try_from(&mut opened).map_err(err)?;
    let mut values: Vec<u64> = stats.get(&idx, 0).map_err(err)?.iter().copied().collect();
    if let Some(first) = values.first_mut() {
        *first += n;
    }
    let values = PerCpuValues::try_from(values).map_err(|e| {
        err(aya::maps::MapError::from(std::io::Error::other(
            e.to_string(),
        )))
    })?;
    stats.set(idx, values, 0).map_err(err)
}
