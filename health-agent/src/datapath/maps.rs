//! Typed access to the pinned maps, through the registry in
//! `health_common::maps` ([`MapId`]): opening, batched reads and writes,
//! `bpf map list` (with pressure) and the per-CPU counters.

use std::{os::fd::AsFd as _, path::Path};

use aya::maps::{Map, MapData, MapInfo, PerCpuArray, PerCpuValues};
use health_common::maps::{MapId, MapKind};
use serde::Serialize;

use super::DatapathError;
pub use crate::sys::bpf_batch::Cursor;

/// Opens the map pinned as `dir/<name>`.
pub fn open(dir: &Path, id: MapId) -> Result<Map, DatapathError> {
    let path = dir.join(id.name());
    let pinned = |source| DatapathError::Pinned {
        path: path.clone(),
        source,
    };
    let data = MapData::from_pin(&path).map_err(pinned)?;
    Map::from_map_data(data).map_err(pinned)
}

/// The map pinned as `dir/<name>`, checked to be a hash map (not per CPU)
/// of keys `K` and values `V`, as aya's typed maps check.
fn pinned_hash<K: aya::Pod, V: aya::Pod>(dir: &Path, id: MapId) -> Result<MapData, DatapathError> {
    use aya::maps::{MapError, MapType};
    let path = dir.join(id.name());
    let data = MapData::from_pin(&path).map_err(|source| DatapathError::Pinned {
        path: path.clone(),
        source,
    })?;
    let err = |source| DatapathError::Map { map: id, source };
    let info = data.info().map_err(err)?;
    let kind = info.map_type().map_err(err)?;
    if !matches!(kind, MapType::Hash | MapType::LruHash) {
        return Err(err(MapError::InvalidMapType {
            map_type: kind as u32,
        }));
    }
    let (key, value) = (info.key_size() as usize, info.value_size() as usize);
    if key != size_of::<K>() {
        return Err(err(MapError::InvalidKeySize {
            size: key,
            expected: size_of::<K>(),
        }));
    }
    if value != size_of::<V>() {
        return Err(err(MapError::InvalidValueSize {
            size: value,
            expected: size_of::<V>(),
        }));
    }
    Ok(data)
}

fn batch_read_err(id: MapId) -> impl Fn(std::io::Error) -> DatapathError {
    move |source| DatapathError::MapBatch {
        map: id,
        op: "reading the entries in batches",
        source,
    }
}

fn batch_delete_err(id: MapId) -> impl Fn(std::io::Error) -> DatapathError {
    move |source| DatapathError::MapBatch {
        map: id,
        op: "deleting entries in batches",
        source,
    }
}

/// A pinned hash map's entries (keys `K`, values `V`, checked against the
/// map), read in batches; the map is returned for [`update_entries`].
pub fn hash_entries<K: aya::Pod, V: aya::Pod>(
    dir: &Path,
    id: MapId,
    mut each: impl FnMut(&K, &V),
) -> Result<MapData, DatapathError> {
    let data = pinned_hash::<K, V>(dir, id)?;
    crate::sys::bpf_batch::for_each(data.fd().as_fd(), &mut each).map_err(batch_read_err(id))?;
    Ok(data)
}

/// Deletes the entries of a pinned hash map that `gone` picks, in the same
/// walk: the keys picked are deleted a batch at a time as the walk goes
/// (a batch holds entries of buckets the walk has passed), so no more than
/// [`crate::sys::bpf_batch::CHUNK`] keys are held at once, not every
/// expired entry of a large map. Returns how many were deleted, and how
/// many the walk saw.
pub fn delete_where<K: aya::Pod, V: aya::Pod>(
    dir: &Path,
    id: MapId,
    gone: impl FnMut(&K, &V) -> bool,
) -> Result<(u64, u64), DatapathError> {
    let slice = delete_where_slice(dir, id, Cursor::START, usize::MAX, gone)?;
    Ok((slice.deleted, slice.seen))
}

/// What a slice of a walk did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slice {
    /// Entries deleted.
    pub deleted: u64,
    /// Entries the slice saw.
    pub seen: u64,
    /// Where the next slice starts; `None`: this one reached the map's end.
    pub next: Option<Cursor>,
}

/// [`delete_where`] over a slice of the map: from `from`, about `budget`
/// entries ([`crate::sys::bpf_batch::for_each_slice`]).
pub fn delete_where_slice<K: aya::Pod, V: aya::Pod>(
    dir: &Path,
    id: MapId,
    from: Cursor,
    budget: usize,
    gone: impl FnMut(&K, &V) -> bool,
) -> Result<Slice, DatapathError> {
    delete_where_each(dir, id, from, budget, gone, |_| {})
}

/// [`delete_where_slice`], calling `deleted_key` with each key it deleted
/// (not those gone meanwhile).
pub fn delete_where_each<K: aya::Pod, V: aya::Pod>(
    dir: &Path,
    id: MapId,
    from: Cursor,
    budget: usize,
    mut gone: impl FnMut(&K, &V) -> bool,
    mut deleted_key: impl FnMut(&K),
) -> Result<Slice, DatapathError> {
    use crate::sys::bpf_batch::{CHUNK, delete, for_each_slice};
    let data = pinned_hash::<K, V>(dir, id)?;
    let fd = data.fd().as_fd();
    let mut picked: Vec<K> = Vec::with_capacity(CHUNK);
    let mut slice = Slice::default();
    let mut failed = None;
    let mut flush = |picked: &mut Vec<K>, deleted: &mut u64| {
        if failed.is_none()
            && let Err(e) = delete(fd, picked, |k| {
                *deleted += 1;
                deleted_key(k);
            })
        {
            failed = Some(e);
        }
        picked.clear();
    };
    let mut deleted = 0u64;
    slice.next = for_each_slice(fd, from, budget, |k: &K, v: &V| {
        slice.seen += 1;
        if gone(k, v) {
            picked.push(*k);
            if picked.len() == CHUNK {
                flush(&mut picked, &mut deleted);
            }
        }
    })
    .map_err(batch_read_err(id))?;
    flush(&mut picked, &mut deleted);
    slice.deleted = deleted;
    failed.map_or(Ok(slice), |e| Err(batch_delete_err(id)(e)))
}

/// Writes `keys[i]` = `values[i]` into the map `data` (opened by
/// [`hash_entries`]) in batches.
pub fn update_entries<K: aya::Pod, V: aya::Pod>(
    data: &MapData,
    id: MapId,
    keys: &[K],
    values: &[V],
) -> Result<(), DatapathError> {
    crate::sys::bpf_batch::update(data.fd().as_fd(), keys, values).map_err(|source| {
        DatapathError::MapBatch {
            map: id,
            op: "writing entries in batches",
            source,
        }
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

impl MapRow {
    /// Whether the map can fill up: a hash map (an array is full by
    /// construction, a ring buffer holds no entries).
    #[must_use]
    pub fn fills_up(&self) -> bool {
        self.kind.contains("hash")
    }
}

/// Every pinned map of the datapath in `dir` (missing ones are skipped).
pub fn list(dir: &Path) -> Result<Vec<MapRow>, DatapathError> {
    list_counted(dir, &[])
}

/// Entries of maps counted by walks made for another purpose (the
/// collectors', the loss sweep's), so that a listing need not walk those
/// maps again.
pub type Counted = Vec<(MapId, u64)>;

/// [`list`], taking the entries of the maps in `counted` from there.
pub fn list_counted(dir: &Path, counted: &[(MapId, u64)]) -> Result<Vec<MapRow>, DatapathError> {
    let mut rows = Vec::new();
    for id in MapId::ALL {
        let path = dir.join(id.name());
        // Missing is skipped; unreadable (a user without access to the
        // directory) is an error, not an empty listing.
        match path.try_exists() {
            Ok(true) => {}
            Ok(false) => continue,
            Err(source) => return Err(DatapathError::PinDir { path, source }),
        }
        let info = MapInfo::from_pin(&path).map_err(|source| DatapathError::Pinned {
            path: path.clone(),
            source,
        })?;
        let entries = match counted.iter().find(|(m, _)| *m == id) {
            Some(&(_, n)) => n,
            None => count(dir, id, &info)?,
        };
        #[allow(clippy::cast_precision_loss, reason = "a ratio for display")]
        let pressure = if info.max_entries() == 0 {
            0.0
        } else {
            entries as f64 / f64::from(info.max_entries())
        };
        rows.push(MapRow {
            name: id.name().to_owned(),
            kind: id.kind().name().to_owned(),
            entries,
            max_entries: info.max_entries(),
            pressure,
        });
    }
    Ok(rows)
}

/// Entries in pinned map `id`, counted in batches.
pub fn entries(dir: &Path, id: MapId) -> Result<u64, DatapathError> {
    let path = dir.join(id.name());
    let info = MapInfo::from_pin(&path).map_err(|source| DatapathError::Pinned { path, source })?;
    count(dir, id, &info)
}

/// Entries in a map: every key of a hash map, every slot of an array (as
/// bpftool dumps them); ring buffers hold no entries.
fn count(dir: &Path, id: MapId, info: &MapInfo) -> Result<u64, DatapathError> {
    let err = |source| DatapathError::Map { map: id, source };
    if !id.kind().is_hash() {
        return Ok(match id.kind() {
            MapKind::RingBuf => 0,
            _ => u64::from(info.max_entries()),
        });
    }
    let path = dir.join(id.name());
    let data = MapData::from_pin(&path).map_err(|source| DatapathError::Pinned {
        path: path.clone(),
        source,
    })?;
    // In batches: the CT map of a large cluster holds tens of thousands of
    // entries, a syscall each by keys.
    let per_cpu = matches!(
        info.map_type().map_err(err)?,
        aya::maps::MapType::PerCpuHash | aya::maps::MapType::LruPerCpuHash
    );
    let value = if per_cpu {
        let cpus = aya::util::nr_cpus().map_err(|(_, source)| DatapathError::MapBatch {
            map: id,
            op: "reading the possible CPUs",
            source,
        })?;
        (info.value_size() as usize).next_multiple_of(8) * cpus.get() as usize
    } else {
        info.value_size() as usize
    };
    crate::sys::bpf_batch::count(data.fd().as_fd(), info.key_size() as usize, value).map_err(
        |source| DatapathError::MapBatch {
            map: id,
            op: "counting the entries in batches",
            source,
        },
    )
}

/// Per-CPU `u64` counters of array `map`, summed over the CPUs, by name.
pub fn read_counters(
    dir: &Path,
    map: MapId,
    wanted: &[(&'static str, u32)],
) -> Result<Vec<(&'static str, u64)>, DatapathError> {
    let err = |source| DatapathError::Map { map, source };
    let opened = open(dir, map)?;
    let stats = PerCpuArray::<_, u64>::try_from(&opened).map_err(err)?;
    wanted
        .iter()
        .map(|(name, idx)| Ok((*name, stats.get(idx, 0).map_err(err)?.iter().sum())))
        .collect()
}

/// Adds `n` to CPU 0's slot of counter `idx` in `map` (a counter only the
/// agent writes, such as entries removed by its garbage collector).
pub fn add_to_counter(dir: &Path, map: MapId, idx: u32, n: u64) -> Result<(), DatapathError> {
    let err = |source| DatapathError::Map { map, source };
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
