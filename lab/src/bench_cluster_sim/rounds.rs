//! The rounds: summaries published as agents write them, the view
//! assembled from what etcd holds, and the figures of each.

use std::time::{Duration, Instant};

use health_agent::{
    cluster::{
        cadence::HEARTBEAT_ROUNDS,
        published_view::PublishedView,
        summary::{Names, Summary},
        summary_writes::SummaryWrites,
    },
    membership::NodeSet,
    probe::path::Thresholds,
};

use super::{Cluster, FAULT_ROUND, INTERVAL_MS, Options, ratio};

use super::faults::{Faults, faulty_states};

use super::summaries::publish;

use super::verdicts::Tracker;

use super::assembly::{assemble_round, view_bytes};

/// The figures of the rounds.
#[derive(Default)]
pub(super) struct Rounds {
    pub(super) tracker: Tracker,
    pub(super) bytes_max: usize,
    pub(super) bytes_mean: f64,
    pub(super) summary_max: usize,
    /// Allocated by the assembly and still held by the view (measured).
    pub(super) view_bytes: usize,
    /// The view's allocations by their capacities (computed).
    pub(super) view_estimate: usize,
    pub(super) peak_bytes: usize,
    pub(super) publish_time: Duration,
    pub(super) assemble_time: Duration,
    pub(super) last_counts: String,
    /// The last round's summaries, as published.
    pub(super) last: Vec<Vec<u8>>,
    /// What the elected assembler holds between rounds, as the agent
    /// holds it: every summary in etcd decoded, by key (measured), and
    /// how many.
    pub(super) held_bytes: usize,
    pub(super) held: usize,
    /// The published view's bytes (what each other agent downloads a
    /// round): the largest before the faults, and the largest after.
    pub(super) view_wire_steady: usize,
    pub(super) view_wire_faults: usize,
    /// Encoding the published view, over every round.
    pub(super) encode_time: Duration,
    /// Summaries written (etcd puts) a round, before the faults and with
    /// them: (mean, max); and the bytes written, mean over all rounds.
    pub(super) puts_steady: (f64, usize),
    pub(super) puts_faults: (f64, usize),
    pub(super) put_bytes_mean: f64,
}

pub(super) fn run_rounds(opts: &Options, c: &Cluster, f: &Faults) -> anyhow::Result<Rounds> {
    let thresholds = Thresholds {
        success: 1,
        failure: opts.failure_threshold.max(1),
    };
    let states = faulty_states(c, f, opts.rounds, thresholds);
    let mut out = Rounds::default();
    // What etcd holds, and each agent's write policy.
    let mut written: Vec<Option<Vec<u8>>> = vec![None; c.len()];
    let mut writes = vec![SummaryWrites::default(); c.len()];
    let mut bytes_total = 0usize;
    let (mut puts, mut put_bytes) = ((Vec::new(), Vec::new()), 0usize);
    for r in 1..=opts.rounds {
        let t0 = Instant::now();
        let current = publish(c, f, r, &states)?;
        out.publish_time += t0.elapsed();
        let bytes: usize = current.iter().flatten().map(|(b, _)| b.len()).sum();
        out.summary_max = out.summary_max.max(
            current
                .iter()
                .flatten()
                .map(|(b, _)| b.len())
                .max()
                .unwrap_or(0),
        );
        out.bytes_max = out.bytes_max.max(bytes);
        bytes_total += bytes;
        let previous = written.clone();
        let mut n_puts = 0usize;
        for (o, cur) in current.into_iter().enumerate() {
            // The node down writes nothing; its last summary stays.
            let Some((b, digest)) = cur else { continue };
            if r == 1 {
                writes[o].written(
                    digest,
                    u64::from(r) + HEARTBEAT_ROUNDS - (o as u64 % HEARTBEAT_ROUNDS),
                );
                written[o] = Some(b);
            } else if writes[o]
                .decide_digest(digest, u64::from(r) + HEARTBEAT_ROUNDS)
                .writes()
            {
                n_puts += 1;
                put_bytes += b.len();
                written[o] = Some(b);
            }
        }
        if r > 1 {
            if r < FAULT_ROUND {
                &mut puts.0
            } else {
                &mut puts.1
            }
            .push(n_puts);
        }
        let current = &written;
        let a = assemble_round(c, current, &previous, r)?;
        out.assemble_time += a.time;
        out.tracker.check(c, f, &a.view, r);
        out.view_bytes = out.view_bytes.max(a.view_bytes);
        out.view_estimate = out.view_estimate.max(view_bytes(&a.view));
        out.peak_bytes = out.peak_bytes.max(a.peak_bytes);
        // The leader's publish: the view as every other agent reads it.
        let t1 = Instant::now();
        let wire = PublishedView::of(
            &c.nodes[0].name,
            u64::from(r),
            u64::from(r) * INTERVAL_MS,
            INTERVAL_MS,
            &a.view,
        )
        .encode()
        .len();
        out.encode_time += t1.elapsed();
        if r < FAULT_ROUND {
            out.view_wire_steady = out.view_wire_steady.max(wire);
        } else {
            out.view_wire_faults = out.view_wire_faults.max(wire);
        }
        let k = &a.view.counts;
        out.last_counts = format!(
            "healthy {}, node down {}, path degraded {}, observer problem {}, unknown {}",
            k.healthy, k.node_down, k.path_degraded, k.observer_problem, k.unknown
        );
        eprintln!(
            "cluster-sim: round {r}: {bytes} bytes of summaries, {n_puts} written, view in {:.0} ms: {}",
            a.time.as_secs_f64() * 1e3,
            out.last_counts
        );
    }
    out.bytes_mean = ratio(bytes_total, opts.rounds as usize);
    out.put_bytes_mean = ratio(put_bytes, opts.rounds.saturating_sub(1) as usize);
    let mean_max = |v: &[usize]| {
        (
            ratio(v.iter().sum(), v.len().max(1)),
            v.iter().copied().max().unwrap_or(0),
        )
    };
    (out.puts_steady, out.puts_faults) = (mean_max(&puts.0), mean_max(&puts.1));
    (out.held, out.held_bytes) = held_decoded(&c.nodes, &written);
    out.last = written.into_iter().flatten().collect();
    Ok(out)
}

/// What the elected assembler holds between rounds: every summary etcd
/// holds, decoded, its peers' names shared, by its key (as
/// `daemon::cluster_view` keeps them); how many, and the bytes they take
/// with the names (measured).
fn held_decoded(nodes: &NodeSet, written: &[Option<Vec<u8>>]) -> (usize, usize) {
    let ((held, _names), _, bytes) = super::alloc_count::counted(|| {
        let mut names = Names::default();
        let held = written
            .iter()
            .flatten()
            .filter_map(|b| Summary::decode(b).ok())
            .map(|s| {
                let key = format!("/health/summaries/{}", s.observer()).into_bytes();
                (key, s.interned(&mut names, |n| nodes.contains(n)).0)
            })
            .collect::<std::collections::HashMap<Vec<u8>, Summary>>();
        (held, names)
    });
    (held.len(), bytes)
}
