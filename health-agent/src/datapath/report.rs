//! What the maps hold, counted by walking them: entries and pressure of
//! every map, CT evictions, RTT samples and losses. The walk costs a
//! syscall per key, so the maintenance task takes it on its pressure
//! cadence and publishes it here for the metrics to read.

use std::{
    path::Path,
    sync::{Arc, RwLock},
};

use super::{DatapathError, ct, maps, rtt};

/// One walk of the maps.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MapsSnapshot {
    /// Every pinned map: entries, size and pressure.
    pub rows: Vec<maps::MapRow>,
    /// CT entries the kernel evicted (LRU) rather than the collector.
    pub ct_evicted: u64,
    /// RTT samples held for the peers in the map.
    pub rtt_samples: u64,
    /// Unanswered requests counted for the peers in the map.
    pub rtt_losses: u64,
}

impl MapsSnapshot {
    /// The entries of map `name`, if it is pinned.
    #[must_use]
    pub fn entries(&self, name: &str) -> Option<u64> {
        self.rows.iter().find(|r| r.name == name).map(|r| r.entries)
    }
}

/// Walks the maps pinned in `dir`.
pub fn snapshot(dir: &Path) -> Result<MapsSnapshot, DatapathError> {
    let rows = maps::list(dir)?;
    let ct_evicted = ct::counters(dir)?
        .into_iter()
        .find(|(name, _)| *name == "evicted")
        .map_or(0, |(_, v)| v);
    let (rtt_samples, rtt_losses) = rtt::totals(dir)?;
    Ok(MapsSnapshot {
        rows,
        ct_evicted,
        rtt_samples,
        rtt_losses,
    })
}

/// The latest snapshot, shared between the maintenance task and readers.
#[derive(Debug, Clone, Default)]
pub struct MapsReport {
    latest: Arc<RwLock<Option<Arc<MapsSnapshot>>>>,
}

impl MapsReport {
    #[must_use]
    pub fn latest(&self) -> Option<Arc<MapsSnapshot>> {
        self.latest.read().ok().and_then(|l| l.clone())
    }

    pub fn publish(&self, snapshot: MapsSnapshot) {
        if let Ok(mut l) = self.latest.write() {
            *l = Some(Arc::new(snapshot));
        }
    }
}
