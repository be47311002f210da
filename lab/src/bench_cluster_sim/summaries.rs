//! Every node's summary of a round, made and encoded as the agent does.

use std::collections::HashMap;

use crate::sim_nodes::rtt_us;
use health_agent::cluster::{
    summary::{PathSample, PeerSummary, Summary},
    summary_writes::verdicts_digest,
};

use super::{Cluster, FAULT_ROUND, INTERVAL_MS};

use super::faults::Faults;

/// Node `o`'s summary of round `r`, encoded, and the digest of its
/// verdicts.
fn summary(
    c: &Cluster,
    o: usize,
    r: u32,
    states: &HashMap<(u32, u32), Vec<[PathSample; 4]>>,
) -> anyhow::Result<(Vec<u8>, u64)> {
    let o32 = u32::try_from(o).unwrap_or(u32::MAX);
    let peers = c.picks[o]
        .iter()
        .map(|&t| {
            let paths = states.get(&(o32, t)).map_or_else(
                || {
                    std::array::from_fn(|p| {
                        PathSample::new(
                            health_agent::probe::path::ProbeResult::Success,
                            Some(rtt_us(o, t as usize, p, u64::from(r))),
                        )
                    })
                },
                |per_round| per_round[r as usize],
            );
            PeerSummary::new(c.nodes[t as usize].name.as_str(), paths)
        })
        .collect();
    let s = Summary::new(
        c.nodes[o].name.clone(),
        u64::from(r),
        u64::from(r) * INTERVAL_MS,
        peers,
    )?;
    Ok((s.encode(), verdicts_digest(&s)))
}

/// A summary encoded, and the digest of its verdicts.
type Encoded = (Vec<u8>, u64);

/// Every node's summary of round `r` (None for the node down), on every CPU.
pub(super) fn publish(
    c: &Cluster,
    f: &Faults,
    r: u32,
    states: &HashMap<(u32, u32), Vec<[PathSample; 4]>>,
) -> anyhow::Result<Vec<Option<Encoded>>> {
    let n = c.len();
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let chunk = n.div_ceil(threads).max(1);
    let mut out = Vec::with_capacity(n);
    std::thread::scope(|s| -> anyhow::Result<()> {
        let handles: Vec<_> = (0..n)
            .step_by(chunk)
            .map(|start| {
                s.spawn(move || {
                    (start..(start + chunk).min(n))
                        .map(|o| {
                            if o == f.down && r >= FAULT_ROUND {
                                Ok(None)
                            } else {
                                summary(c, o, r, states).map(Some)
                            }
                        })
                        .collect::<anyhow::Result<Vec<_>>>()
                })
            })
            .collect();
        for h in handles {
            let part = h
                .join()
                .map_err(|_| anyhow::anyhow!("a summary thread panicked"))??;
            out.extend(part);
        }
        Ok(())
    })?;
    Ok(out)
}
