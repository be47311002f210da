//! A round's ICMP pass: one echo to every address (one per flow with
//! `--probe-flows`), and, with
//! `--probe-mtu`, one more echo of the probe size with Don't Fragment to
//! every node address, in the same engine call (the same timeout); then
//! the MTU verdicts: a path that answers the small echo and loses the
//! large one `failure_threshold` rounds in a row is an MTU black hole.

use std::{net::IpAddr, sync::Arc, time::Duration};

use super::{
    Prober,
    error::ProbeError,
    flows::Spread,
    icmp::{IcmpProber, Numbering, Padded},
    metrics::InFlight,
    order::{Echoes, Suspects},
    path::{Outcome, ProbeResult, RttSource},
    published::CHUNK,
    targets::Targets,
};
use crate::{membership::NodeSet, sys::socket_factory::SocketFactory};

/// The round's MTU probes: which targets get one, and their size.
#[derive(Debug, Default)]
pub(super) struct MtuTargets {
    bytes: Option<u16>,
    /// Indices into the round's targets: the node addresses (shared with
    /// the engine, which addresses each MTU probe through them).
    indices: Arc<[usize]>,
}

impl MtuTargets {
    /// The node addresses of `targets` (not the health endpoints'), when
    /// MTU probes are on.
    pub(super) fn of(targets: &Targets, bytes: Option<u16>) -> Self {
        let Some(b) = bytes else {
            return Self::default();
        };
        Self {
            bytes: Some(b),
            indices: targets
                .keys
                .iter()
                .enumerate()
                .filter(|(_, (_, address))| address % 2 == 0)
                .map(|(i, _)| i)
                .collect(),
        }
    }
}

/// What became of one MTU probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MtuOutcome {
    Answered,
    /// No answer within the timeout.
    Lost,
    /// Not sent (refused by this node: larger than a local interface's
    /// MTU), or no socket: no verdict.
    NotSent,
}

pub(super) type IcmpSockets<'a> =
    Result<&'a (Arc<IcmpProber>, Option<Arc<SocketFactory>>), &'a ProbeError>;

/// A round's echo results as its outcomes, in place: the same size, the
/// same buffer (30,000 at 10,000 peers are not copied).
fn outcomes_of(results: Vec<Result<Duration, ProbeError>>) -> Vec<Outcome> {
    results
        .into_iter()
        .map(|r| match r {
            Ok(rtt) => Outcome::Ok {
                rtt,
                warning: None,
                source: RttSource::Userspace,
            },
            Err(e) => Outcome::Failed(e),
        })
        .collect()
}

impl Prober {
    /// ICMP (IPv4 or `ICMPv6`) to every address of `targets` (the round's
    /// addresses once per flow, as `spread` lays them out), sent in
    /// `order`'s ICMP order (index order when `None`), each answer
    /// marked in `echoes` as it comes, and the MTU probes of `mtu`. The
    /// engine runs as a task of its own, beside the HTTP ones.
    pub(super) async fn icmp_round(
        &self,
        targets: &Arc<Vec<IpAddr>>,
        order: Option<&Arc<Suspects>>,
        spread: Spread,
        mtu: &MtuTargets,
        sockets: IcmpSockets<'_>,
        echoes: &Arc<Echoes>,
    ) -> (Vec<Outcome>, Vec<MtuOutcome>) {
        let n = targets.len();
        let numbering = Numbering {
            per_flow: spread.n,
            flows: spread.flows,
            base: self.cfg.flows.icmp_base,
            seq_base: fastrand::u16(..),
            nonce: fastrand::u64(..),
        };
        let icmp = match sockets {
            Ok((icmp, _)) => icmp.clone(),
            Err(e) => {
                return (
                    vec![Outcome::Failed(e.clone()); n],
                    vec![MtuOutcome::NotSent; mtu.indices.len()],
                );
            }
        };
        // The MTU probes go to the same addresses, after the others.
        let padded = match mtu.bytes {
            Some(bytes) if !mtu.indices.is_empty() => Some(Padded {
                bytes: usize::from(bytes),
                follows: mtu.indices.clone(),
            }),
            _ => None,
        };
        let total = n + padded.as_ref().map_or(0, |p| p.follows.len());
        let targets = targets.clone();
        let order = order.cloned();
        let echoes = echoes.clone();
        let (timeout, spread) = (self.cfg.timeout, self.cfg.spread);
        let in_flight = InFlight::sent(self.cfg.metrics.as_deref(), total);
        // In a set, so that a round dropped (its prober replaced by a
        // reload, or the agent stopping) stops sending: dropping the set
        // aborts the task.
        let mut task = tokio::task::JoinSet::new();
        task.spawn(async move {
            let order = order.as_deref().map(Suspects::icmp);
            icmp.round(&targets, order, numbering, padded, timeout, spread, &echoes)
                .await
        });
        let mut results = task
            .join_next()
            .await
            .and_then(Result::ok)
            .unwrap_or_else(|| vec![Err(ProbeError::ReceiverStopped); total]);
        drop(in_flight);
        // The MTU probes' results, taken off the end in place, and their
        // pages handed back.
        let mtu_results = results
            .drain(n.min(results.len())..)
            .map(|r| match r {
                Ok(_) => MtuOutcome::Answered,
                Err(ProbeError::Timeout { .. }) => MtuOutcome::Lost,
                Err(_) => MtuOutcome::NotSent,
            })
            .collect();
        results.shrink_to_fit();
        (outcomes_of(results), mtu_results)
    }

    /// Applies the MTU probes' outcomes to the ICMP paths of the node
    /// addresses they went to (after [`Prober::record`] took the round's
    /// small echoes).
    pub(super) fn record_mtu(
        &self,
        nodes: &NodeSet,
        keys: &[(u32, u8)],
        mtu: &MtuTargets,
        outcomes: &[MtuOutcome],
    ) {
        let Some(bytes) = mtu.bytes else {
            return;
        };
        let threshold = self.cfg.thresholds.failure.max(1);
        // The paths are locked a chunk of probes at a time, as
        // `Prober::record` does.
        for (indices, outcomes) in mtu
            .indices
            .chunks(2 * CHUNK)
            .zip(outcomes.chunks(2 * CHUNK))
        {
            let Ok(mut paths) = self.paths.lock() else {
                return;
            };
            for (&i, outcome) in indices.iter().zip(outcomes) {
                let (node, address) = keys[i];
                let Some(entry) = paths.get_mut(nodes[node as usize].name.as_str()) else {
                    continue;
                };
                let state = entry.state_mut(2 * usize::from(address));
                // Judged only when this round's small echo was answered.
                let small_answered =
                    state.result == ProbeResult::Success && state.consecutive_failures == 0;
                match outcome {
                    MtuOutcome::Answered => {
                        state.mtu_failures = 0;
                        state.set_mtu_blackhole(None);
                    }
                    MtuOutcome::Lost if small_answered => {
                        state.mtu_failures = state.mtu_failures.saturating_add(1);
                        if state.mtu_failures >= threshold {
                            state.set_mtu_blackhole(Some(bytes));
                        }
                    }
                    // No verdict this round: the row of losses is broken.
                    MtuOutcome::Lost | MtuOutcome::NotSent => state.mtu_failures = 0,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn echo_results_become_outcomes_in_their_own_buffer() {
        let results = vec![
            Ok(Duration::from_micros(250)),
            Err(ProbeError::Timeout {
                proto: super::super::error::Proto::Icmp,
                after: Duration::from_secs(1),
            }),
        ];
        let buffer = results.as_ptr().addr();
        let outcomes = outcomes_of(results);
        assert_eq!(outcomes.as_ptr().addr(), buffer);
        assert_eq!(
            outcomes[0],
            Outcome::Ok {
                rtt: Duration::from_micros(250),
                warning: None,
                source: RttSource::Userspace,
            }
        );
        assert!(matches!(
            outcomes[1],
            Outcome::Failed(ProbeError::Timeout { .. })
        ));
    }
}
