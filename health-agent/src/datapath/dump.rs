//! `bpf map dump`: a pinned map's content as JSON, decoded by what the map
//! holds, through the typed readers ([`super::ct`], [`super::nat`],
//! [`super::rtt`], the echo statistics) and the configuration arrays.

use std::{collections::BTreeMap, net::Ipv4Addr, path::Path};

use aya::maps::Array;
use health_common::{
    ct::CtConfig,
    maps::{EchoConfig, MapId},
    nat::NatConfig,
};
use serde_json::{Value, json};

use super::{DatapathError, ct, encrypt_watch, maps::open, nat, rtt, stats::read_pinned_stats};

/// Entry 0 of the configuration array `id`.
fn config<T: aya::Pod>(dir: &Path, id: MapId) -> Result<T, DatapathError> {
    let err = |source| DatapathError::Map { map: id, source };
    let map = open(dir, id)?;
    Array::<_, T>::try_from(&map)
        .map_err(err)?
        .get(&0, 0)
        .map_err(err)
}

/// A configuration array, decoded for `bpf map dump`.
fn dump_config(dir: &Path, id: MapId) -> Result<Value, DatapathError> {
    let ip = Ipv4Addr::from;
    let prefix = |m: [u8; 4]| u32::from_be_bytes(m).count_ones();
    Ok(match id {
        MapId::NatConfig => {
            let c: NatConfig = config(dir, id)?;
            json!({
                "enabled": c.enabled == 1,
                "node_ip": ip(c.node_ip).to_string(),
                "masqueraded_sources": format!("{}/{}", ip(c.src_net), prefix(c.src_mask)),
                "health_range": format!("{}/{}", ip(c.exclude_net), prefix(c.exclude_mask)),
                "port_min": c.port_min,
                "port_max": c.port_max,
            })
        }
        MapId::CtConfig => {
            let c: CtConfig = config(dir, id)?;
            json!({
                "icmp_lifetime_s": c.icmp_s, "udp_lifetime_s": c.udp_s, "tcp_syn_lifetime_s": c.tcp_syn_s,
                "tcp_established_lifetime_s": c.tcp_established_s, "tcp_closed_lifetime_s": c.tcp_closed_s,
            })
        }
        MapId::PinLayout => json!({ "layout_version": config::<u32>(dir, id)? }),
        _ => {
            let c: EchoConfig = config(dir, id)?;
            let m = c.mac;
            json!({
                "endpoint_address": ip(c.addr).to_string(),
                "endpoint_address6": std::net::Ipv6Addr::from(c.addr6).to_string(),
                "interface_mac": format!("{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[0], m[1], m[2], m[3], m[4], m[5]),
                "drop_unicast_in_l2_multicast": c.flags & EchoConfig::DROP_UNICAST_IN_L2_MULTICAST != 0,
                "drop_unicast_in_l2_multicast6": c.flags & EchoConfig::DROP_UNICAST_IN_L2_MULTICAST6 != 0,
                "own_addresses": c.own4.iter().filter(|a| **a != [0; 4]).map(|a| ip(*a).to_string())
                    .chain(c.own6.iter().filter(|a| **a != [0; 16]).map(|a| std::net::Ipv6Addr::from(*a).to_string()))
                    .collect::<Vec<_>>(),
                "more_own_addresses": c.flags & (EchoConfig::MORE_OWN4 | EchoConfig::MORE_OWN6) != 0,
                "reply_to_peer": c.flags & EchoConfig::REPLY_TO_PEER != 0,
            })
        }
    })
}

/// A map's content as JSON, decoded by what the map holds (`bpf map dump`).
pub fn dump(dir: &Path, id: MapId) -> Result<Value, DatapathError> {
    let json = |v: Result<Value, serde_json::Error>| {
        v.map_err(|e| DatapathError::Encode {
            map: id,
            detail: e.to_string(),
        })
    };
    let counters = |c: Vec<(&'static str, u64)>| json!(c.into_iter().collect::<BTreeMap<_, _>>());
    match id {
        MapId::CtMap => json(serde_json::to_value(ct::list(dir)?)),
        MapId::RttStats | MapId::RttLosses => json(serde_json::to_value(rtt::list(dir)?)),
        MapId::RttPending => json(serde_json::to_value(rtt::pending(dir)?)),
        MapId::CtStats => Ok(counters(ct::counters(dir)?)),
        MapId::NatMap => json(serde_json::to_value(nat::list(dir)?)),
        MapId::NatFrags => json(serde_json::to_value(nat::fragments(dir)?)),
        MapId::NatStats => Ok(counters(nat::counters(dir)?)),
        MapId::EchoStats => json(serde_json::to_value(read_pinned_stats(dir)?)),
        MapId::EncryptWatch => json(serde_json::to_value(encrypt_watch::list(dir)?)),
        MapId::EchoConfig | MapId::CtConfig | MapId::NatConfig | MapId::PinLayout => {
            dump_config(dir, id)
        }
        MapId::AyaLogs => Err(DatapathError::NoDecoder { map: id }),
    }
}

/// The maps `bpf map dump` decodes.
#[must_use]
pub fn dumpable() -> Vec<&'static str> {
    MapId::ALL
        .into_iter()
        .filter(|m| *m != MapId::AyaLogs)
        .map(MapId::name)
        .collect()
}
