//! What the maps hold, counted by walking them: entries and pressure of
//! every map, CT evictions, RTT samples and losses. The walks are batched,
//! and the maps the collectors walk anyway are counted by them; still,
//! the maintenance task takes the rest on its pressure cadence (once a
//! minute) and publishes it here for the metrics to read.

use std::{
    path::Path,
    sync::{Arc, RwLock},
};

use health_common::maps::MapId;

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
    snapshot_counted(dir, Vec::new(), None)
}

/// [`snapshot`], taking the entries of the maps in `counted` (walked by
/// the collectors just before) from there: each map is walked once.
/// `ct_evicted` is the collector's figure for the CT evictions, counted
/// with its walk; `None`: counted here (the counters read before the map
/// is walked, as [`ct::evicted`] needs).
pub fn snapshot_counted(
    dir: &Path,
    mut counted: maps::Counted,
    ct_evicted: Option<u64>,
) -> Result<MapsSnapshot, DatapathError> {
    // The counters before the map is walked, as `ct::evicted` needs.
    let before = ct_evicted
        .is_none()
        .then(|| ct::created_and_removed(dir))
        .transpose()?;
    let totals = rtt::totals_counted(dir)?;
    counted.push((MapId::RttStats, totals.stats_entries));
    counted.push((MapId::RttLosses, totals.loss_entries));
    let rows = maps::list_counted(dir, &counted)?;
    let ct_entries = rows
        .iter()
        .find(|r| r.name == MapId::CtMap.name())
        .map_or(0, |r| r.entries);
    let ct_evicted = ct_evicted.unwrap_or_else(|| {
        before.map_or(0, |(created, removed)| {
            ct::evicted(created, removed, ct_entries)
        })
    });
    Ok(MapsSnapshot {
        rows,
        ct_evicted,
        rtt_samples: totals.samples,
        rtt_losses: totals.lost,
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
