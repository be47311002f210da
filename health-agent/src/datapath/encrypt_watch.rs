//! The encryption check's map: which destinations the egress programs
//! watch, and the probe packets they counted to each, through the tunnel
//! and in plain text.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    path::Path,
};

use aya::maps::HashMap;
use health_common::{
    ct::{ip_of, key_addr},
    encrypt::{WatchCounts, WatchKey},
    maps::MapId,
};
use serde::Serialize;

use super::{DatapathError, maps::open};

/// One row of `bpf map dump ENCRYPT_WATCH`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WatchRow {
    pub destination: IpAddr,
    /// Probe packets that left through the WireGuard device.
    pub tunnel: u64,
    /// Probe packets that left through another interface.
    pub plain: u64,
}

fn key(ip: IpAddr) -> WatchKey {
    WatchKey { addr: key_addr(ip) }
}

fn map_err(source: aya::maps::MapError) -> DatapathError {
    DatapathError::Map {
        map: MapId::EncryptWatch,
        source,
    }
}

/// Every watched destination with its counts (in batches: one entry per
/// watched address).
pub fn counts(dir: &Path) -> Result<BTreeMap<IpAddr, WatchCounts>, DatapathError> {
    let mut out = BTreeMap::new();
    super::maps::hash_entries(dir, MapId::EncryptWatch, |k: &WatchKey, c: &WatchCounts| {
        out.insert(ip_of(k.addr), *c);
    })?;
    Ok(out)
}

/// [`counts`] as rows, for `bpf map dump`.
pub fn list(dir: &Path) -> Result<Vec<WatchRow>, DatapathError> {
    Ok(counts(dir)?
        .into_iter()
        .map(|(destination, c)| WatchRow {
            destination,
            tunnel: c.tunnel,
            plain: c.plain,
        })
        .collect())
}

/// `bpf(2)`'s flag: insert only where no entry is.
const BPF_NOEXIST: u64 = 1;

/// Makes the watched destinations `wanted`: new ones start at zero, ones
/// no longer wanted are removed (their counts with them), the others keep
/// counting. `present` is what [`counts`] just read. Returns how many were
/// added and removed.
pub fn set_watched(
    dir: &Path,
    present: &BTreeMap<IpAddr, WatchCounts>,
    wanted: &BTreeSet<IpAddr>,
) -> Result<(usize, usize), DatapathError> {
    let add: Vec<IpAddr> = wanted
        .iter()
        .filter(|ip| !present.contains_key(ip))
        .copied()
        .collect();
    let remove: Vec<IpAddr> = present
        .keys()
        .filter(|ip| !wanted.contains(ip))
        .copied()
        .collect();
    if add.is_empty() && remove.is_empty() {
        return Ok((0, 0));
    }
    let map = open(dir, MapId::EncryptWatch)?;
    let mut m = HashMap::<_, WatchKey, WatchCounts>::try_from(map).map_err(map_err)?;
    // Removed first: a full map makes room for the new ones, and is never
    // left full of destinations no longer wanted.
    for ip in &remove {
        match m.remove(&key(*ip)) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
            Err(e) => return Err(map_err(e)),
        }
    }
    // Never over an entry that is there (`present` read short, or an
    // entry made meanwhile): its counts stand.
    let mut added = 0;
    for ip in &add {
        match m.insert(&key(*ip), &WatchCounts::default(), BPF_NOEXIST) {
            Ok(()) => added += 1,
            Err(aya::maps::MapError::SyscallError(e))
                if e.io_error.raw_os_error() == Some(libc::EEXIST) => {}
            Err(e) => return Err(map_err(e)),
        }
    }
    Ok((added, remove.len()))
}
