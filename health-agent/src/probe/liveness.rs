//! Liveness echoes (`--liveness-interval`, 3 s by default): between
//! rounds, one ICMP echo to each probed node's address. An echo is not a
//! probe of the path: it changes no state, history or window. It decides
//! when to probe: a node whose echo is news to its node address's ICMP
//! path (unanswered while the path is in Success, answered while it is in
//! Failure, either while it is not decided yet) is probed in full at
//! once, in a round of its own. A node that stops is then failing on every
//! path within an interval and two timeouts, whatever the probe interval,
//! and the cluster view calls it down within seconds; one that comes back
//! is Success as soon.
//!
//! A node comes back in steps: its address answers before its agent has
//! put its routes back, so the first early round can find its endpoint
//! still unreachable. After news, a node whose paths do not all agree
//! with its echo yet (some in Failure while it answers, some in Success
//! while it is silent) is probed early again at the next echoes, up to
//! [`FOLLOW_UPS`] times (more when the thresholds need more rounds to
//! reach a verdict); then it waits for the rounds, as a node whose
//! endpoint alone is down should. News is an echo that disagrees with its
//! path and says otherwise than the echo before it: one that goes on
//! disagreeing the same way (its flow black holed while other ECMP flows
//! keep the path in Success) sets off no more early rounds.
//!
//! Cost: one echo a node per interval, about 200 bytes both ways (the
//! rounds' other probes, the HTTP ones and the MTU echoes, stay at the
//! probe interval). A node already failing is not probed again early:
//! after `--failure-threshold` early rounds its path is in Failure and the
//! echoes agree with it. The echoes are sent while the agent
//! probes at most [`MAX_NODES`] nodes: a subset always, and a full mesh up
//! to that size.

use std::{
    net::IpAddr,
    sync::{Arc, atomic::Ordering},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use super::{
    Prober,
    family::PER_FAMILY,
    flows::Spread,
    icmp_round::MtuTargets,
    order::Echoes,
    path::{Outcome, ProbeResult},
    targets::{EchoTrack, NodePaths, targets},
};
use crate::membership::{Node, NodeSet};

/// The most nodes probed for liveness echoes to go: at 3 s, 128 echoes
/// are about 70 kbit/s both ways.
pub const MAX_NODES: usize = 128;

/// Early rounds a node gets, after the one its news sets off, while its
/// paths do not all agree with its echoes.
pub const FOLLOW_UPS: u8 = 3;

/// What one pass of liveness echoes found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Liveness {
    /// Echoes sent.
    pub echoes: usize,
    /// Echoes unanswered.
    pub unanswered: usize,
    /// Nodes probed in full at once: their echo said otherwise than
    /// their path.
    pub escalated: usize,
}

impl Prober {
    /// The interval at which liveness echoes go with `nodes` nodes probed,
    /// when they do.
    #[must_use]
    pub fn liveness_interval(&self, nodes: usize) -> Option<Duration> {
        self.cfg.liveness.filter(|_| nodes <= MAX_NODES)
    }

    /// One pass: an echo to every node address of the node set, then a
    /// round over the nodes whose echo says otherwise than their path.
    /// Nothing when the echoes are off for this many nodes.
    pub async fn liveness(self: &Arc<Self>) -> Liveness {
        let nodes = self.nodes();
        if nodes.is_empty() || self.liveness_interval(nodes.len()).is_none() {
            return Liveness::default();
        }
        let (nodes, echoes, unanswered, news, echoed_ms) = {
            let _one_at_a_time = self.turn().await;
            // Read again in the turn, which may have pruned the kernel's
            // entries of nodes gone meanwhile: those are not echoed.
            let nodes = self.nodes();
            let all = targets(&nodes, self.cfg.families);
            // The node addresses (`2 * family`), not the health endpoints'.
            let picked: Vec<usize> = (0..all.keys.len())
                .filter(|&i| all.keys[i].1.is_multiple_of(2))
                .collect();
            let ips: Arc<Vec<IpAddr>> = Arc::new(picked.iter().map(|&i| all.ips[i]).collect());
            let n = ips.len();
            let sockets = self.sockets();
            let none = Arc::new(Echoes::new(n, Duration::ZERO, Duration::ZERO));
            let spread = Spread { n, flows: 1 };
            let (outcomes, _) = self
                .icmp_round(
                    &ips,
                    None,
                    spread,
                    &MtuTargets::default(),
                    sockets.as_ref(),
                    &none,
                )
                .await;
            let echoed_ms = epoch_ms_now();
            let seen: Vec<((u32, u8), bool)> = picked
                .iter()
                .zip(&outcomes)
                .map(|(&i, o)| (all.keys[i], matches!(o, Outcome::Ok { .. })))
                .collect();
            let unanswered = seen.iter().filter(|(_, ok)| !ok).count();
            let news = self.disagreeing(&nodes, &seen);
            (nodes, n, unanswered, news, echoed_ms)
        };
        let escalated = news.len();
        if escalated > 0 {
            tracing::debug!(
                nodes = escalated,
                "liveness: echoes say otherwise than the paths, probing those nodes in full now"
            );
        }
        // The echoes confirm the paths as of when they were seen, once
        // the paths they contradicted were probed again: not before, or
        // a summary written meanwhile would pass old verdicts for new;
        // nor when some of them were not (a node that moved meanwhile).
        if escalated == 0 || self.round_over(nodes.subset(&news)).await {
            self.liveness_ms.store(echoed_ms, Ordering::Relaxed);
        }
        Liveness {
            echoes,
            unanswered,
            escalated,
        }
    }

    /// The nodes (indices, once each) to probe in full now: those whose
    /// echo (`seen`: node index, address, answered) is news to their ICMP
    /// path to that address ([`is_news`]), and, up to [`follow_ups`]
    /// times after news, those some of whose paths still disagree with
    /// their echo ([`settled`]).
    fn disagreeing(&self, nodes: &NodeSet, seen: &[((u32, u8), bool)]) -> Vec<usize> {
        let follow_ups = self.follow_ups();
        let Ok(mut paths) = self.paths.lock() else {
            return Vec::new();
        };
        let nodes: &[Node] = nodes;
        let mut out: Vec<usize> = Vec::new();
        for &((node, address), answered) in seen {
            let Some(n) = nodes.get(node as usize) else {
                continue;
            };
            let icmp = 2 * usize::from(address);
            let early = match paths.get_mut(n.name.as_str()) {
                // Never probed: undecided, so news.
                None => true,
                Some(p) => {
                    let state = p.state(icmp).verdict();
                    let agrees = settled(p, icmp, answered);
                    p.echo
                        .get_mut(usize::from(address / 2))
                        .is_some_and(|track| track.early(state, answered, agrees, follow_ups))
                }
            };
            if early && out.last() != Some(&(node as usize)) {
                out.push(node as usize);
            }
        }
        out
    }

    /// Early rounds a node gets after news (and after it joined, see
    /// `Prober::probe_joined`): [`FOLLOW_UPS`], or as many as its paths
    /// need to reach a verdict when the thresholds ask for more.
    pub(super) fn follow_ups(&self) -> u8 {
        let t = self.cfg.thresholds;
        let need = t.failure.max(t.success);
        FOLLOW_UPS.max(u8::try_from(need).unwrap_or(u8::MAX))
    }
}

impl EchoTrack {
    /// Records an echo (`answered`) to a family whose node ICMP path is in
    /// `state` (`agrees`: every path of the family agrees with the echo);
    /// says whether the node is to be probed early. News sets
    /// `follow_ups` early rounds going; without news they run down, and
    /// stop once the paths agree.
    fn early(&mut self, state: ProbeResult, answered: bool, agrees: bool, follow_ups: u8) -> bool {
        let news = is_news(state, answered, self.last);
        self.last = Some(answered);
        if news {
            self.early_rounds = follow_ups;
            true
        } else if agrees {
            self.early_rounds = 0;
            false
        } else if self.early_rounds > 0 {
            self.early_rounds -= 1;
            true
        } else {
            false
        }
    }
}

/// Whether every path of the family of node path `icmp` (its node
/// address's ICMP path: the family's first) agrees with an echo: all
/// decided in Success when it was answered, all in Failure when it was
/// not.
fn settled(paths: &NodePaths, icmp: usize, answered: bool) -> bool {
    let agreeing = if answered {
        ProbeResult::Success
    } else {
        ProbeResult::Failure
    };
    (icmp..icmp + PER_FAMILY).all(|i| paths.state(i).verdict() == agreeing)
}

/// Whether an echo answered (or not) disagrees with a path in `state`:
/// all but an answer to a path in Success and silence from one in
/// Failure. A path not decided yet (Unknown: never probed, or failing
/// below the failure threshold) disagrees with either, so a node that
/// joins between rounds is decided within seconds.
const fn disagrees(state: ProbeResult, answered: bool) -> bool {
    !matches!(
        (state, answered),
        (ProbeResult::Success, true) | (ProbeResult::Failure, false)
    )
}

/// Whether an echo is news: it disagrees with its path and says
/// otherwise than the echo before it (`last`; none yet: news). An echo
/// that goes on disagreeing the same way is not news again: a path kept
/// in Success by other ECMP flows while the echo's own flow is black
/// holed (or whose endpoint alone is down) gets its follow-ups once, not
/// an early round at every echo.
const fn is_news(state: ProbeResult, answered: bool, last: Option<bool>) -> bool {
    let changed = match last {
        Some(was) => was != answered,
        None => true,
    };
    changed && disagrees(state, answered)
}

fn epoch_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::probe::{ProbeConfig, path::RttSource};

    fn ok() -> Outcome {
        Outcome::Ok {
            rtt: Duration::from_micros(300),
            warning: None,
            source: RttSource::Userspace,
        }
    }

    fn failed() -> Outcome {
        Outcome::Failed(crate::probe::error::ProbeError::Timeout {
            proto: crate::probe::error::Proto::Icmp,
            after: Duration::from_secs(1),
        })
    }

    /// A prober of `names` whose paths turn at the first result.
    fn probing(names: &[&str]) -> (NodeSet, Arc<Prober>) {
        probing_with(names, 1)
    }

    /// A prober of `names` whose paths turn Failure after `failure`
    /// failures in a row, Success at the first answer.
    fn probing_with(names: &[&str], failure: u32) -> (NodeSet, Arc<Prober>) {
        let nodes = NodeSet::named(names);
        let prober = Prober::new(ProbeConfig {
            thresholds: crate::probe::path::Thresholds {
                success: 1,
                failure,
            },
            ..ProbeConfig::default()
        });
        prober.set_nodes(nodes.clone());
        (nodes, prober)
    }

    #[test]
    fn only_news_is_probed_at_once() {
        assert!(disagrees(ProbeResult::Success, false));
        assert!(disagrees(ProbeResult::Failure, true));
        assert!(!disagrees(ProbeResult::Success, true));
        assert!(!disagrees(ProbeResult::Failure, false));
        assert!(disagrees(ProbeResult::Unknown, false));
        assert!(disagrees(ProbeResult::Unknown, true));
    }

    #[test]
    fn the_nodes_whose_echo_disagrees_with_their_path_are_picked_once() {
        let (nodes, prober) = probing(&["a", "b", "c", "d", "e"]);
        // a and b answer, c and d do not: their node ICMP paths.
        let keys = [(0, 0), (1, 0), (2, 0), (3, 0)];
        let outcomes = vec![
            (ok(), ok()),
            (ok(), ok()),
            (failed(), ok()),
            (failed(), ok()),
        ];
        prober.record(&nodes, &keys, outcomes, 1, 0, 1);
        // Echoes: a unanswered (news), b answered, c unanswered, d
        // answered (news), e never probed (news); a twice (a second
        // family's address).
        let seen = [
            ((0, 0), false),
            ((0, 2), false),
            ((1, 0), true),
            ((2, 0), false),
            ((3, 0), true),
            ((4, 0), true),
        ];
        assert_eq!(prober.disagreeing(&nodes, &seen), vec![0, 3, 4]);
    }

    #[test]
    fn a_node_coming_back_is_probed_early_until_its_paths_agree_then_waits() {
        let (nodes, prober) = probing(&["a"]);
        // Down: every path in Failure; silent echoes agree.
        let both = [(0, 0), (0, 1)];
        prober.record(&nodes, &both, vec![(failed(), failed()); 2], 1, 0, 1);
        let answered = [((0, 0), true)];
        assert_eq!(
            prober.disagreeing(&nodes, &[((0, 0), false)]),
            Vec::<usize>::new()
        );
        // Its address answers: news, and its first early round finds the
        // endpoint not routed yet.
        assert_eq!(prober.disagreeing(&nodes, &answered), vec![0]);
        prober.record(
            &nodes,
            &both,
            vec![(ok(), ok()), (failed(), failed())],
            1,
            0,
            1,
        );
        // The ICMP path agrees now, the endpoint's do not: follow-ups,
        // then none (an endpoint alone down waits for the rounds).
        for _ in 0..FOLLOW_UPS {
            assert_eq!(prober.disagreeing(&nodes, &answered), vec![0]);
        }
        assert_eq!(prober.disagreeing(&nodes, &answered), Vec::<usize>::new());
        // Settled once every path agrees: the next news starts afresh.
        prober.record(&nodes, &both, vec![(ok(), ok()); 2], 1, 0, 1);
        assert_eq!(prober.disagreeing(&nodes, &answered), Vec::<usize>::new());
        prober.record(&nodes, &both, vec![(ok(), ok()), (failed(), ok())], 1, 0, 1);
        assert_eq!(
            prober.disagreeing(&nodes, &answered),
            Vec::<usize>::new(),
            "no news, no follow-ups left"
        );
    }

    /// A node cut off for less than the failure threshold's rounds: its
    /// paths still in Success but failing, as its summary says. Its
    /// address answering again is news, so that it is probed and read as
    /// reached within an echo, not at the next round.
    #[test]
    fn a_node_back_before_its_paths_turned_is_probed_at_once() {
        let (nodes, prober) = probing_with(&["a"], 3);
        let both = [(0, 0), (0, 1)];
        prober.record(&nodes, &both, vec![(ok(), ok()); 2], 1, 0, 1);
        let (silent, answered) = ([((0, 0), false)], [((0, 0), true)]);
        assert_eq!(prober.disagreeing(&nodes, &silent), vec![0], "cut off");
        // One early round: every path fails once, still in Success.
        prober.record(&nodes, &both, vec![(failed(), failed()); 2], 2, 0, 1);
        let icmp = prober.node_status("a").map(|n| n.host.icmp);
        assert_eq!(
            icmp.map(|p| (p.result, p.consecutive_failures)),
            Some((ProbeResult::Success, 1))
        );
        // Back: its answer is news.
        assert_eq!(prober.disagreeing(&nodes, &answered), vec![0], "back");
        prober.record(&nodes, &both, vec![(ok(), ok()); 2], 3, 0, 1);
        assert_eq!(
            prober.disagreeing(&nodes, &answered),
            Vec::<usize>::new(),
            "settled once every path answered"
        );
    }

    /// A path kept in Success (by other ECMP flows, say) while every echo
    /// goes unanswered: news once, its follow-ups, then no early rounds
    /// however long it lasts; an echo answered again and lost again is
    /// news again.
    #[test]
    fn an_echo_that_keeps_disagreeing_the_same_way_is_news_once() {
        let (nodes, prober) = probing(&["a"]);
        let both = [(0, 0), (0, 1)];
        prober.record(&nodes, &both, vec![(ok(), ok()); 2], 1, 0, 1);
        let silent = [((0, 0), false)];
        assert_eq!(prober.disagreeing(&nodes, &silent), vec![0], "news");
        for _ in 0..FOLLOW_UPS {
            assert_eq!(prober.disagreeing(&nodes, &silent), vec![0]);
        }
        for _ in 0..20 {
            assert_eq!(
                prober.disagreeing(&nodes, &silent),
                Vec::<usize>::new(),
                "the same silence is not news again"
            );
        }
        assert_eq!(
            prober.disagreeing(&nodes, &[((0, 0), true)]),
            Vec::<usize>::new()
        );
        assert_eq!(prober.disagreeing(&nodes, &silent), vec![0], "news again");
    }

    /// With thresholds above [`FOLLOW_UPS`], news buys as many early rounds
    /// as a path needs to reach its verdict.
    #[test]
    fn follow_ups_cover_the_failure_threshold() {
        let prober = Prober::new(ProbeConfig {
            thresholds: crate::probe::path::Thresholds {
                success: 1,
                failure: 7,
            },
            ..ProbeConfig::default()
        });
        assert_eq!(prober.follow_ups(), 7);
        let (_, default) = probing(&["a"]);
        assert_eq!(default.follow_ups(), FOLLOW_UPS);
    }

    #[test]
    fn echoes_go_with_at_most_128_nodes_and_when_on() {
        let on = Prober::new(ProbeConfig {
            liveness: Some(Duration::from_secs(3)),
            ..ProbeConfig::default()
        });
        assert_eq!(
            on.liveness_interval(MAX_NODES),
            Some(Duration::from_secs(3))
        );
        assert_eq!(on.liveness_interval(MAX_NODES + 1), None);
        let off = Prober::new(ProbeConfig::default());
        assert_eq!(off.liveness_interval(3), None);
    }
}
