//! The injected faults, and the path states of the pairs they touch, run
//! through the prober's own state machine.

use std::{collections::HashMap, time::Duration};

use anyhow::Context as _;

use crate::sim_nodes::rtt_us;
use health_agent::{
    cluster::{summary::PathSample, view::Verdict},
    probe::{
        error::{ProbeError, Proto},
        path::{Outcome, RttSource, Thresholds},
        path_record::{ErrorTexts, PathRecord},
    },
};

use super::{Cluster, FAULT_ROUND, FLAP_ROUNDS, INTERVAL_MS, Rng};

/// The injected faults (node indices).
#[derive(Debug, Clone, Copy)]
pub(super) struct Faults {
    pub(super) partition: u32,
    pub(super) down: usize,
    pub(super) a: usize,
    pub(super) b: usize,
    pub(super) flap: usize,
    pub(super) deaf: usize,
}

impl Faults {
    pub(super) fn pick(c: &Cluster, rng: &mut Rng) -> anyhow::Result<Self> {
        let n = c.len();
        let partition = c.zone[rng.below(n)];
        let mut taken: Vec<usize> = Vec::new();
        let fresh = |rng: &mut Rng, taken: &mut Vec<usize>| -> anyhow::Result<usize> {
            for _ in 0..10_000 {
                let i = rng.below(n);
                if c.zone[i] != partition && !taken.contains(&i) {
                    taken.push(i);
                    return Ok(i);
                }
            }
            anyhow::bail!("too few nodes outside the partitioned zone")
        };
        let (down, flap, deaf, a) = (
            fresh(rng, &mut taken)?,
            fresh(rng, &mut taken)?,
            fresh(rng, &mut taken)?,
            fresh(rng, &mut taken)?,
        );
        let b = c.picks[a]
            .iter()
            .map(|&j| j as usize)
            .find(|&j| c.zone[j] != c.zone[a] && c.zone[j] != partition && !taken.contains(&j))
            .context("node A probes no node outside its zone")?;
        Ok(Self {
            partition,
            down,
            a,
            b,
            flap,
            deaf,
        })
    }

    /// Whether `o`'s probes of `t` succeed in round `r` (every path alike).
    fn works(&self, c: &Cluster, o: usize, t: usize, r: u32) -> bool {
        if r < FAULT_ROUND || o == t {
            return true;
        }
        let flapping = ((r - FAULT_ROUND) / FLAP_ROUNDS).is_multiple_of(2);
        let parted = (c.zone[o] == self.partition) != (c.zone[t] == self.partition);
        !(t == self.down
            || (o, t) == (self.a, self.b)
            || (o, t) == (self.b, self.a)
            || parted
            || o == self.deaf
            || (o == self.flap && flapping))
    }

    /// Whether a fault can touch `o`'s probes of `t`.
    fn touches(&self, c: &Cluster, o: usize, t: usize) -> bool {
        (FAULT_ROUND..FAULT_ROUND + 2 * FLAP_ROUNDS).any(|r| !self.works(c, o, t, r))
    }

    /// The verdicts `i` may have once its fault shows (None: healthy only).
    pub(super) fn expected(&self, c: &Cluster, i: usize) -> Option<&'static [Verdict]> {
        if i == self.down {
            Some(&[Verdict::NodeDown])
        } else if i == self.deaf {
            Some(&[Verdict::ObserverProblem])
        } else if i == self.flap {
            Some(&[Verdict::ObserverProblem, Verdict::Healthy])
        } else if c.zone[i] == self.partition
            || i == self.b
            || (i == self.a && c.picks[self.b].contains(&u32::try_from(i).unwrap_or(u32::MAX)))
        {
            Some(&[Verdict::PathDegraded])
        } else {
            None
        }
    }
}

/// The path states of the pairs a fault touches, per round (index r), run
/// through the prober's own state machine.
pub(super) fn faulty_states(
    c: &Cluster,
    f: &Faults,
    rounds: u32,
    thresholds: Thresholds,
) -> HashMap<(u32, u32), Vec<[PathSample; 4]>> {
    let mut states = HashMap::new();
    for (o, picks) in c.picks.iter().enumerate() {
        for &t in picks {
            let t = t as usize;
            if !f.touches(c, o, t) {
                continue;
            }
            let mut paths: [PathRecord; 4] = std::array::from_fn(|_| PathRecord::default());
            let mut texts = ErrorTexts::default();
            let mut per_round = vec![[PathSample::UNKNOWN; 4]];
            for r in 1..=rounds {
                let works = f.works(c, o, t, r);
                for (p, state) in paths.iter_mut().enumerate() {
                    let outcome = if works {
                        Outcome::Ok {
                            rtt: Duration::from_micros(rtt_us(o, t, p, u64::from(r))),
                            warning: None,
                            source: RttSource::Kernel,
                        }
                    } else {
                        let proto = if p.is_multiple_of(2) {
                            Proto::Icmp
                        } else {
                            Proto::Http
                        };
                        Outcome::Failed(ProbeError::Timeout {
                            proto,
                            after: Duration::from_secs(1),
                        })
                    };
                    state.record(outcome, thresholds, u64::from(r) * INTERVAL_MS, &mut texts);
                }
                per_round.push(
                    paths
                        .each_ref()
                        .map(|p| PathSample::from_state(&p.to_state())),
                );
            }
            let key = (
                u32::try_from(o).unwrap_or(u32::MAX),
                u32::try_from(t).unwrap_or(u32::MAX),
            );
            states.insert(key, per_round);
        }
    }
    states
}
