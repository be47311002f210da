//! Where a failing path breaks. When an ICMP path fails (and again every
//! [`RETRACE_MS`] while it stays failed), the prober traces the way to its
//! address from its own namespace ([`crate::sys::icmp_trace`]) and keeps
//! the hops in the path's state: `status --verbose`, `GET /v1/status` and
//! the page show them. Traces run beside the rounds, never inside one:
//! at most `PER_ROUND` addresses a round, traced together from one
//! socket on one blocking thread, one batch at a time, so an outage of
//! many nodes costs a bounded trickle of probes and no more threads.

use std::{net::IpAddr, sync::Arc};

use tracing::debug;

use super::{
    Prober,
    path::{PathTrace, ProbeResult, TraceHop},
    path_record::PathRecord,
};
use crate::sys::icmp_trace::{self, Hop, HopAnswer};

/// How far a trace goes.
pub const MAX_HOPS: u8 = 16;

// The kernel times no echo sent with a TTL a trace uses: each hop short
// of the peer would be counted lost.
const _: () = assert!(MAX_HOPS <= health_common::rtt::UNTIMED_MAX_TTL);
/// A path still failing is traced again after this long.
pub const RETRACE_MS: u64 = 5 * 60 * 1000;
/// Addresses traced per round at most.
const PER_ROUND: usize = 8;

/// The traces due, and whether a batch runs.
#[derive(Debug, Default)]
pub(super) struct Tracing {
    /// Found due by the last round's record: node, ICMP path slot, the
    /// round's target index (its address).
    due: Vec<(String, usize, usize)>,
    /// A batch is being traced: the next waits (its paths are found due
    /// again at the next round).
    running: bool,
}

impl Tracing {
    /// Path `slot` of `node` (its state after this round) needs a trace.
    pub(super) fn note(
        &mut self,
        state: &PathRecord,
        node: &str,
        slot: usize,
        target: usize,
        at_ms: u64,
    ) {
        let due = state.result == ProbeResult::Failure
            && state
                .trace()
                .is_none_or(|t| at_ms.saturating_sub(t.at_ms) >= RETRACE_MS);
        if due && self.due.len() < PER_ROUND {
            self.due.push((node.to_owned(), slot, target));
        }
    }
}

/// One path to trace: its node, ICMP slot and address.
type Traced = (String, usize, IpAddr);

impl Prober {
    /// Starts a batch of the traces the last round found due (`ips`: the
    /// round's targets), unless one runs.
    pub(super) fn start_traces(self: &Arc<Self>, ips: &[IpAddr]) {
        let Ok(mut tracing) = self.tracing.lock() else {
            return;
        };
        let due = std::mem::take(&mut tracing.due);
        if tracing.running || due.is_empty() {
            return;
        }
        let batch: Vec<Traced> = due
            .into_iter()
            .filter_map(|(node, slot, target)| Some((node, slot, *ips.get(target)?)))
            .collect();
        tracing.running = true;
        let me = self.clone();
        tokio::task::spawn_blocking(move || {
            for family in [true, false] {
                let part: Vec<&Traced> = batch.iter().filter(|t| t.2.is_ipv4() == family).collect();
                me.trace_batch(&part);
            }
            if let Ok(mut tracing) = me.tracing.lock() {
                tracing.running = false;
            }
        });
    }

    /// Traces `batch` (one family) together and keeps each one's hops in
    /// its path, while it still fails.
    fn trace_batch(&self, batch: &[&Traced]) {
        if batch.is_empty() {
            return;
        }
        let ips: Vec<IpAddr> = batch.iter().map(|t| t.2).collect();
        let (identifier, timeout) = (fastrand::u16(..), self.cfg.timeout);
        let traced = match &self.cfg.source_netns {
            Some(ns) => ns
                .run(|| icmp_trace::trace(&ips, identifier, MAX_HOPS, timeout))
                .map_err(|e| std::io::Error::other(e.to_string()))
                .and_then(|r| r),
            None => icmp_trace::trace(&ips, identifier, MAX_HOPS, timeout),
        };
        let ways = match traced {
            Ok(ways) => ways,
            Err(e) => {
                debug!(paths = batch.len(), "tracing failing paths: {e}");
                return;
            }
        };
        let at_ms = crate::util::timefmt::now_ms();
        let Ok(mut paths) = self.paths.lock() else {
            return;
        };
        for ((node, slot, ip), hops) in batch.iter().copied().zip(ways) {
            let trace = path_trace(&hops, at_ms);
            debug!(node, %ip, hops = %trace.line(), "traced a failing path");
            if let Some(entry) = paths.get_mut(node.as_str()) {
                let state = entry.state_mut(*slot);
                if state.result == ProbeResult::Failure {
                    state.set_trace(Some(trace));
                }
            }
        }
    }
}

/// The hops as the path's state keeps them.
fn path_trace(hops: &[Hop], at_ms: u64) -> PathTrace {
    PathTrace {
        at_ms,
        reached: hops
            .last()
            .is_some_and(|h| matches!(h.answer, Some((_, HopAnswer::EchoReply)))),
        hops: hops
            .iter()
            .map(|h| TraceHop {
                ttl: h.ttl,
                ip: h.answer.map(|(ip, _)| ip),
                rtt_ns: h
                    .rtt
                    .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
                unreachable: match h.answer {
                    Some((_, HopAnswer::Unreachable(code))) => Some(code),
                    _ => None,
                },
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use std::{net::Ipv4Addr, time::Duration};

    use super::*;

    fn failing(trace_at: Option<u64>) -> PathRecord {
        let mut p = PathRecord::UNKNOWN;
        p.result = ProbeResult::Failure;
        p.set_trace(trace_at.map(|at_ms| PathTrace {
            at_ms,
            hops: Vec::new(),
            reached: false,
        }));
        p
    }

    #[test]
    fn a_failed_path_is_traced_once_then_again_after_the_retrace_time() {
        let ip = 3;
        let mut t = Tracing::default();
        t.note(&failing(None), "n", 0, ip, 1_000);
        assert_eq!(t.due.len(), 1, "a failure without a trace");
        t.note(&failing(Some(1_000)), "n", 0, ip, 1_000 + RETRACE_MS - 1);
        assert_eq!(t.due.len(), 1, "a fresh trace is kept");
        t.note(&failing(Some(1_000)), "n", 0, ip, 1_000 + RETRACE_MS);
        assert_eq!(t.due.len(), 2, "a stale one is taken again");
        let mut ok = PathRecord::UNKNOWN;
        ok.result = ProbeResult::Success;
        t.note(&ok, "n", 0, ip, 1_000);
        assert_eq!(t.due.len(), 2, "a path that answers is not traced");
        for _ in 0..100 {
            t.note(&failing(None), "n", 0, ip, 1_000);
        }
        assert_eq!(t.due.len(), PER_ROUND, "bounded per round");
    }

    #[test]
    fn hops_read_as_a_line_that_says_where_the_way_ends() {
        let r1 = IpAddr::V4(Ipv4Addr::new(198, 18, 10, 1));
        let dst = IpAddr::V4(Ipv4Addr::new(198, 18, 13, 2));
        let hop = |ttl, answer| Hop {
            ttl,
            answer,
            rtt: answer.map(|_| Duration::from_micros(250)),
        };
        let r3 = IpAddr::V4(Ipv4Addr::new(198, 18, 12, 2));
        let ends = path_trace(
            &[
                hop(1, Some((r1, HopAnswer::TimeExceeded))),
                hop(2, None),
                hop(3, Some((r3, HopAnswer::TimeExceeded))),
            ],
            5,
        );
        assert!(!ends.reached);
        assert_eq!(
            ends.line(),
            "1 198.18.10.1 0.2ms, 2 *, 3 198.18.12.2 0.2ms; no answer past hop 3"
        );
        let reached = path_trace(
            &[
                hop(1, Some((r1, HopAnswer::TimeExceeded))),
                hop(2, Some((dst, HopAnswer::EchoReply))),
            ],
            5,
        );
        assert!(reached.reached);
        assert!(reached.line().ends_with("the address answers the trace"));
        let unreachable = path_trace(&[hop(1, Some((r1, HopAnswer::Unreachable(1))))], 5);
        assert_eq!(unreachable.hops[0].unreachable, Some(1));
        assert!(unreachable.line().contains("(unreachable)"));
        assert_eq!(path_trace(&[], 5).line(), "no hop answered");
    }
}
