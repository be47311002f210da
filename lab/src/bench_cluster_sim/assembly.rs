//! One round's view as one agent assembles it, with the memory it takes.

use std::time::{Duration, Instant};

use anyhow::ensure;

use health_agent::cluster::{
    cadence::STALE_ROUNDS,
    summary::Summary,
    view::{ClusterView, NodeView, ViewParams, assemble},
};

use super::{Cluster, INTERVAL_MS};

use super::alloc_count::counted;

/// Bytes a view's allocations take (its own, by their capacities).
pub(super) fn view_bytes(view: &ClusterView) -> usize {
    let strings = |v: &Vec<String>| {
        v.iter().map(String::capacity).sum::<usize>() + v.capacity() * size_of::<String>()
    };
    view.nodes.capacity() * size_of::<NodeView>()
        + view
            .nodes
            .iter()
            .map(|n| {
                n.name.capacity()
                    + n.zone.as_ref().map_or(0, String::capacity)
                    + strings(&n.failing_observers)
                    + strings(&n.unreached_nodes)
            })
            .sum::<usize>()
}

/// One round's view as one agent assembles it, with its memory.
pub(super) struct Assembled {
    pub(super) view: ClusterView,
    pub(super) time: Duration,
    /// The most bytes allocated at once while assembling it (decoding one
    /// summary at a time, the observations, the view).
    pub(super) peak_bytes: usize,
    /// Bytes still allocated after: the view.
    pub(super) view_bytes: usize,
}

pub(super) fn assemble_round(
    c: &Cluster,
    current: &[Option<Vec<u8>>],
    previous: &[Option<Vec<u8>>],
    r: u32,
) -> anyhow::Result<Assembled> {
    let latest = (0..c.len()).filter_map(|o| {
        let (cur, prev) = (current[o].as_ref(), previous[o].as_ref());
        // A lagging node's latest is its previous round; a node that no
        // longer publishes leaves its last summary.
        if c.lag[o] { prev.or(cur) } else { cur.or(prev) }
    });
    let params = ViewParams {
        oldest_ms: (u64::from(r).saturating_sub(u64::from(STALE_ROUNDS))) * INTERVAL_MS,
        ..ViewParams::default()
    };
    let t0 = Instant::now();
    let mut bad = 0usize;
    let (view, peak_bytes, view_bytes) = counted(|| {
        assemble(
            &c.nodes,
            latest.filter_map(|b| {
                let s = Summary::decode(b);
                bad += usize::from(s.is_err());
                s.ok()
            }),
            &params,
        )
    });
    let time = t0.elapsed();
    ensure!(bad == 0, "{bad} summaries did not decode");
    Ok(Assembled {
        view,
        time,
        peak_bytes,
        view_bytes,
    })
}
