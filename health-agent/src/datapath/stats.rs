//! The responder's per-CPU counters.

use std::path::Path;

use aya::{
    Ebpf,
    maps::{Map, MapData, PerCpuArray},
};
use health_common::maps::{EchoCounter, MapId};
use serde::Serialize;

use super::DatapathError;

/// Totals over all CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct EchoStats {
    pub answered: u64,
    pub passed: u64,
    pub malformed: u64,
}

impl EchoStats {
    fn set(&mut self, counter: EchoCounter, value: u64) {
        match counter {
            EchoCounter::Answered => self.answered = value,
            EchoCounter::Passed => self.passed = value,
            EchoCounter::Malformed => self.malformed = value,
        }
    }

    /// Counter-wise difference `self - earlier` (counters only grow).
    #[must_use]
    pub const fn since(self, earlier: Self) -> Self {
        Self {
            answered: self.answered.saturating_sub(earlier.answered),
            passed: self.passed.saturating_sub(earlier.passed),
            malformed: self.malformed.saturating_sub(earlier.malformed),
        }
    }
}

fn sum(map: &PerCpuArray<&MapData, u64>) -> Result<EchoStats, aya::maps::MapError> {
    let mut stats = EchoStats::default();
    for counter in EchoCounter::ALL {
        let per_cpu = map.get(&(counter as u32), 0)?;
        stats.set(counter, per_cpu.iter().sum());
    }
    Ok(stats)
}

pub(super) fn read_from(ebpf: &Ebpf) -> Result<EchoStats, DatapathError> {
    let map = ebpf
        .map(MapId::EchoStats.name())
        .ok_or(DatapathError::MissingMap {
            map: MapId::EchoStats,
        })?;
    let map = PerCpuArray::try_from(map).map_err(|source| DatapathError::Map {
        map: MapId::EchoStats,
        source,
    })?;
    sum(&map).map_err(|source| DatapathError::Map {
        map: MapId::EchoStats,
        source,
    })
}

/// Reads the counters from the pinned map, with or without a running agent.
pub fn read_pinned_stats(pin_dir: &Path) -> Result<EchoStats, DatapathError> {
    let path = pin_dir.join(MapId::EchoStats.name());
    let err = |source| DatapathError::Pinned {
        path: path.clone(),
        source,
    };
    let data = MapData::from_pin(&path).map_err(err)?;
    let map = Map::PerCpuArray(data);
    let map = PerCpuArray::try_from(&map).map_err(err)?;
    sum(&map).map_err(err)
}
