//! When an agent writes its summary to etcd: when what it says about its
//! peers changed (a path's state, failing or lossy; a peer came or went),
//! and otherwise every [`HEARTBEAT_ROUNDS`] of the publisher's ticks
//! (probe intervals, or liveness intervals when those are on: see
//! [`crate::probe::liveness`]), so that the assembler
//! tells an observer whose view did not change from one that stopped.
//! RTTs alone never cause a write: they change every round, and the
//! view's verdicts do not read them. etcd's writes then grow with change,
//! not with the number of agents times the rate of rounds.

use std::hash::{DefaultHasher, Hash as _, Hasher as _};

use super::cadence::HEARTBEAT_ROUNDS;
use super::summary::Summary;

/// Why a summary is written, or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// The first of this agent's process, or a peer's verdict changed.
    Changed,
    /// Unchanged for [`HEARTBEAT_ROUNDS`] rounds.
    Heartbeat,
    /// Unchanged, the last write recent: not written.
    Skip,
}

impl Write {
    #[must_use]
    pub const fn writes(self) -> bool {
        !matches!(self, Self::Skip)
    }
}

/// One agent's last written summary, as a digest of what the view reads.
#[derive(Debug, Clone, Copy, Default)]
pub struct SummaryWrites {
    /// (digest, round) of the last write.
    last: Option<(u64, u64)>,
}

impl SummaryWrites {
    /// Whether `summary`, made at the publisher's tick `tick`, is to be
    /// written; when it is, it is taken as written. A tick number that
    /// went back (the count restarted) writes.
    pub fn decide(&mut self, summary: &Summary, tick: u64) -> Write {
        self.decide_digest(verdicts_digest(summary), tick)
    }

    /// [`Self::decide`] for a summary made at tick `seq` whose
    /// [`verdicts_digest`] is `digest`.
    pub fn decide_digest(&mut self, digest: u64, seq: u64) -> Write {
        let write = match self.last {
            Some((d, _)) if d != digest => Write::Changed,
            None => Write::Changed,
            Some((_, at)) if seq < at || seq - at >= HEARTBEAT_ROUNDS => Write::Heartbeat,
            Some(_) => Write::Skip,
        };
        if write.writes() {
            self.last = Some((digest, seq));
        }
        write
    }

    /// Takes a summary of round `seq` with `digest` as written then (a
    /// simulation that starts from a cluster that has run a while).
    pub const fn written(&mut self, digest: u64, seq: u64) {
        self.last = Some((digest, seq));
    }

    /// A write that failed: the next round writes again.
    pub const fn failed(&mut self) {
        self.last = None;
    }
}

/// A digest of everything in `summary` the view's verdicts read: the
/// observer, its cadence (by which the assembler tells a stale summary:
/// a lengthened cadence not written would make it stale within a few of
/// the old ticks), each peer's name and each path's state, failing,
/// lossy, plain-text and one-family marks; not the round, the time or the
/// RTTs.
#[must_use]
pub fn verdicts_digest(summary: &Summary) -> u64 {
    let mut h = DefaultHasher::new();
    summary.observer().hash(&mut h);
    summary.cadence_ms().hash(&mut h);
    for p in summary.peers() {
        p.name.hash(&mut h);
        for s in &p.paths() {
            (s.code(), s.lossy, s.plaintext, s.split).hash(&mut h);
        }
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        cluster::{
            cadence::STALE_ROUNDS,
            summary::{PathSample, PeerSummary},
        },
        probe::path::ProbeResult,
    };

    fn summary(seq: u64, peers: &[(&str, PathSample)]) -> Summary {
        Summary::new(
            "node-1".into(),
            seq,
            1_000 * seq,
            peers
                .iter()
                .map(|(name, s)| PeerSummary::new(*name, [*s; 4]))
                .collect(),
        )
        .expect("summary")
    }

    fn ok(rtt: u64) -> PathSample {
        PathSample::new(ProbeResult::Success, Some(rtt))
    }

    #[test]
    fn the_first_is_written_then_rtts_alone_wait_for_the_heartbeat() {
        let mut w = SummaryWrites::default();
        assert_eq!(w.decide(&summary(1, &[("a", ok(10))]), 1), Write::Changed);
        for seq in 2..=HEARTBEAT_ROUNDS {
            assert_eq!(
                w.decide(&summary(seq, &[("a", ok(10 + seq))]), seq),
                Write::Skip,
                "round {seq}"
            );
        }
        assert_eq!(
            w.decide(
                &summary(1 + HEARTBEAT_ROUNDS, &[("a", ok(99))]),
                1 + HEARTBEAT_ROUNDS
            ),
            Write::Heartbeat
        );
        assert_eq!(
            w.decide(
                &summary(2 + HEARTBEAT_ROUNDS, &[("a", ok(99))]),
                2 + HEARTBEAT_ROUNDS
            ),
            Write::Skip
        );
    }

    #[test]
    fn a_state_a_failing_probe_a_mark_or_a_peer_change_writes_at_once() {
        let mut w = SummaryWrites::default();
        w.decide(&summary(1, &[("a", ok(10))]), 1);
        let failed = PathSample::new(ProbeResult::Failure, None);
        let changes = [
            summary(2, &[("a", PathSample::FAILING)]),
            summary(3, &[("a", failed)]),
            summary(4, &[("a", failed.with_split(true))]),
            summary(5, &[("a", ok(10))]),
            summary(6, &[("a", ok(10).with_lossy(true))]),
            summary(7, &[("a", ok(10).with_plaintext(true))]),
            summary(8, &[("a", ok(10)), ("b", ok(10))]),
            summary(9, &[("b", ok(10))]),
        ];
        for s in &changes {
            assert_eq!(w.decide(s, s.seq()), Write::Changed, "round {}", s.seq());
        }
        assert_eq!(w.decide(&summary(10, &[("b", ok(12))]), 10), Write::Skip);
    }

    /// A reload that lengthens the cadence (3 s echoes turned off, rounds
    /// at 60 s) is written at once: the assembler, reading the old cadence,
    /// would count the summary stale within a few of its ticks.
    #[test]
    fn a_changed_cadence_writes_at_once() {
        let mut w = SummaryWrites::default();
        let at = |seq, cadence| summary(seq, &[("a", ok(10))]).with_cadence(cadence);
        let (short, long) = (Duration::from_secs(3), Duration::from_secs(60));
        assert_eq!(w.decide(&at(1, short), 1), Write::Changed);
        assert_eq!(w.decide(&at(2, short), 2), Write::Skip);
        assert_eq!(w.decide(&at(3, long), 3), Write::Changed);
        assert_eq!(w.decide(&at(4, long), 4), Write::Skip);
    }

    #[test]
    fn a_restarted_count_or_a_failed_write_writes_again() {
        let mut w = SummaryWrites::default();
        w.decide(&summary(40, &[("a", ok(10))]), 40);
        assert_eq!(w.decide(&summary(1, &[("a", ok(10))]), 1), Write::Heartbeat);
        w.failed();
        assert_eq!(w.decide(&summary(2, &[("a", ok(10))]), 2), Write::Changed);
        assert_eq!(w.decide(&summary(3, &[("a", ok(10))]), 3), Write::Skip);
    }

    #[test]
    fn an_observer_whose_summary_never_changes_is_never_stale() {
        // 100 ticks of the same verdicts (RTTs moving): the assembler,
        // a tick or two behind, must always hold a write younger than
        // STALE_ROUNDS ticks.
        let mut w = SummaryWrites::default();
        let (mut last, mut widest) = (0, 0);
        for seq in 1..=100 {
            if w.decide(&summary(seq, &[("a", ok(10 + seq % 7))]), seq)
                .writes()
            {
                widest = widest.max(seq - last);
                last = seq;
            }
        }
        widest = widest.max(100 - last);
        assert!(
            widest + 2 <= u64::from(STALE_ROUNDS),
            "{widest} ticks between writes leave no room for 2 ticks of lag before {STALE_ROUNDS}"
        );
        assert!(widest > 1, "unchanged summaries are not written every tick");
    }
}
