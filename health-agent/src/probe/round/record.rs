//! A round's outcomes recorded in the paths, their windows and the
//! histories, a chunk of nodes at a time.

use super::Prober;
use crate::membership::NodeSet;
use crate::probe::{
    history::RoundRow,
    order::Failed,
    path::{Outcome, ProbeResult},
    path_record::ErrorTexts,
    published::CHUNK,
};

impl Prober {
    /// Runs `record` (a round's results, MTU probes and flows recorded)
    /// holding `recording`: no reader of every node's history, and no
    /// reload, sees the round half recorded.
    pub(super) fn while_recording<T>(&self, record: impl FnOnce() -> T) -> T {
        let _whole_round = self.recording.lock();
        record()
    }

    /// [`Self::record_in`] as round `seq`, begun at `started_ms`.
    #[cfg(test)]
    pub(crate) fn record(
        &self,
        nodes: &NodeSet,
        keys: &[(u32, u8)],
        outcomes: impl IntoIterator<Item = (Outcome, Outcome)>,
        seq: u64,
        started_ms: u64,
        at: u64,
    ) -> usize {
        self.record_in(nodes, keys, outcomes, Some((seq, started_ms)), at)
    }

    /// Records a round's outcomes (ICMP and HTTP to the address `keys[i]`
    /// names, see [`super::targets::Targets`]) in every path's state and
    /// history; returns the probes recorded. The paths are locked for
    /// [`CHUNK`] nodes at a time, not for the whole round (tens of
    /// milliseconds at 10,000 nodes): a reader of one node's status waits
    /// for a chunk at most. Meanwhile the round is begun in the history,
    /// so a node not recorded yet shows it as not probed: the round runs
    /// this in [`Self::while_recording`]. `round`: the round's number and
    /// start in the history, or `None` for the round of the nodes that
    /// joined, which is in no history (their rounds there begin with the
    /// next).
    pub(super) fn record_in(
        &self,
        nodes: &NodeSet,
        keys: &[(u32, u8)],
        outcomes: impl IntoIterator<Item = (Outcome, Outcome)>,
        round: Option<(u64, u64)>,
        at: u64,
    ) -> usize {
        let mut probes = 0;
        let mut texts = ErrorTexts::default();
        let clock = crate::probe::quality::clock_ms();
        let mut failed = vec![Failed::default(); keys.len()].into_boxed_slice();
        if let Some((seq, started_ms)) = round
            && let Ok(mut history) = self.history.lock()
        {
            history.begin_round(seq, started_ms, at);
        }
        // Only a round of the nodes that joined (unnumbered) gives rounds
        // to come: nodes first probed in a numbered round get none.
        let join_rounds = if round.is_none() {
            self.follow_ups()
        } else {
            0
        };
        let mut outcomes = outcomes.into_iter().peekable();
        let mut next = 0;
        // A node's addresses are consecutive in `keys`: its paths are
        // looked up once for all of them.
        let mut groups = keys.chunk_by(|a, b| a.0 == b.0).peekable();
        while groups.peek().is_some() && outcomes.peek().is_some() {
            let (Ok(mut paths), Ok(mut history), Ok(mut tracing)) =
                (self.paths.lock(), self.history.lock(), self.tracing.lock())
            else {
                break;
            };
            // Read under the paths' lock, which a change of the node set
            // holds: a node removed during the round is not brought back.
            let current = self.nodes();
            for group in groups.by_ref().take(CHUNK) {
                if outcomes.peek().is_none() {
                    break;
                }
                let node = &nodes[group[0].0 as usize];
                let first = next;
                next += group.len();
                let outcomes = outcomes.by_ref().take(group.len());
                // Gone, or its addresses changed since the round read
                // them: these results are of addresses it no longer has.
                let moved = current
                    .get(&node.name)
                    .is_none_or(|now| crate::probe::family::moved(node, now) != 0);
                if moved {
                    outcomes.for_each(drop);
                    continue;
                }
                let entry = if let Some(e) = paths.get_mut(node.name.as_str()) {
                    e
                } else {
                    let e = paths.entry(node.name.as_str().into()).or_default();
                    // First probed by a round of the nodes that joined: its
                    // rounds to come are set with its first results, under
                    // the recording a reload's take-over waits for (so a
                    // reload right after the round keeps them); the round's
                    // bookkeeping clears them when every path is decided.
                    e.join_rounds = join_rounds;
                    e
                };
                let mut row = RoundRow::default();
                for (target, (&(_, address), (icmp, http))) in
                    (first..).zip(group.iter().zip(outcomes))
                {
                    let icmp_slot = 2 * usize::from(address);
                    for (slot, outcome) in [(icmp_slot, icmp), (icmp_slot + 1, http)] {
                        row.set(slot, history.encode(&outcome));
                        let rtt_ns = match &outcome {
                            Outcome::Ok { rtt, .. } => {
                                Some(u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX))
                            }
                            Outcome::Failed(_) => None,
                        };
                        let q = entry.quality_mut(slot);
                        q.record(clock, rtt_ns);
                        let lossy = q.is_degraded(clock, self.cfg.degraded_loss);
                        let state = entry.state_mut(slot);
                        state.record(outcome, self.cfg.thresholds, at, &mut texts);
                        state.degraded = lossy && state.result == ProbeResult::Success;
                        if let Some(f) = failed.get_mut(target) {
                            let failing = state.consecutive_failures > 0;
                            if slot == icmp_slot {
                                f.icmp = failing;
                            } else {
                                f.http = failing;
                            }
                        }
                        if slot == icmp_slot {
                            tracing.note(state, &node.name, slot, target, at);
                        }
                    }
                    probes += 2;
                }
                if let Some((seq, _)) = round {
                    entry.history.record(&history, seq, &row);
                }
            }
        }
        // The next round's order: not from the nodes that joined alone.
        if round.is_some()
            && let Ok(mut last) = self.failed.lock()
        {
            *last = Some((nodes.clone(), failed));
        }
        probes
    }
}
