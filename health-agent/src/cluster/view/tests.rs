use super::*;
use crate::{
    cluster::{
        subset::{ProbePeers, SubsetPlan},
        summary::{PathSample, PeerSummary},
        test_nodes,
    },
    membership::Node,
};

const N: usize = 200;
const ZONE: usize = 20;
const K: usize = 16;

/// The faults of a simulated cluster.
#[derive(Default)]
struct Faults {
    down: Vec<usize>,
    /// Both directions, every path.
    cut: Vec<(usize, usize)>,
    /// A zone cut from every other.
    partition: Option<usize>,
    /// Observers whose probes all fail (outgoing only).
    deaf: Vec<usize>,
    /// Observers whose HTTP probes fail (outgoing only).
    http_deaf: Vec<usize>,
    /// Observers whose summaries predate the partition.
    lagging: Vec<usize>,
    /// The first round of the faults: a failed path is failing (its
    /// last probe failed), not yet in Failure (threshold above 1).
    fresh: bool,
    /// Observers whose summaries predate every fault.
    before: Vec<usize>,
    /// Targets every observer reaches over a lossy host ICMP path.
    lossy: Vec<usize>,
    /// (observer, target): the target's endpoint address reached in
    /// plain text by that observer.
    plaintext: Vec<(usize, usize)>,
    /// (observer, target): the observer says it reaches the target on
    /// every path, whatever happens (a compromised node lying).
    liars: Vec<(usize, usize)>,
    /// Dual-stack targets whose second family is broken: every path
    /// fails over it, the first family reaching them.
    one_family: Vec<usize>,
}

struct Cluster {
    nodes: NodeSet,
    plan: SubsetPlan,
    zone_size: usize,
}

impl Cluster {
    fn new() -> Self {
        Self::with_zones(ZONE)
    }

    fn with_zones(zone_size: usize) -> Self {
        let nodes: Vec<Node> = (0..N)
            .map(|i| {
                test_nodes::node(
                    i,
                    format!("node-{i:03}"),
                    Some(format!("zone-{}", i / zone_size)),
                )
            })
            .collect();
        let nodes = NodeSet::new(nodes).expect("unique");
        let plan = SubsetPlan::new(&nodes);
        Self {
            nodes,
            plan,
            zone_size,
        }
    }

    fn zone(&self, i: usize) -> usize {
        i / self.zone_size
    }

    /// Whether `o`'s probe of `t` on path `p` succeeds.
    fn works(&self, f: &Faults, o: usize, t: usize, p: usize) -> bool {
        let cut = f
            .cut
            .iter()
            .any(|&(a, b)| (a, b) == (o, t) || (b, a) == (o, t));
        let parted = f
            .partition
            .is_some_and(|z| (self.zone(o) == z) != (self.zone(t) == z))
            && !f.lagging.contains(&o);
        let http = p % 2 == 1;
        f.before.contains(&o)
            || f.liars.contains(&(o, t))
            || !(f.down.contains(&t)
                || f.one_family.contains(&t)
                || cut
                || parted
                || f.deaf.contains(&o)
                || (http && f.http_deaf.contains(&o)))
    }

    fn summaries(&self, f: &Faults) -> Vec<Summary> {
        (0..N)
            .filter(|o| !f.down.contains(o))
            .map(|o| {
                let peers = self
                    .plan
                    .assigned_index(o, ProbePeers::Count(K))
                    .into_iter()
                    .map(|t| {
                        PeerSummary::new(
                            self.nodes[t].name.as_str(),
                            std::array::from_fn(|p| {
                                if self.works(f, o, t, p) {
                                    PathSample::new(ProbeResult::Success, Some(200))
                                        .with_lossy(p == 0 && f.lossy.contains(&t))
                                        .with_plaintext(p >= 2 && f.plaintext.contains(&(o, t)))
                                } else if f.fresh {
                                    PathSample::FAILING
                                } else {
                                    PathSample::new(ProbeResult::Failure, None)
                                }
                                .with_split(f.one_family.contains(&t))
                            }),
                        )
                    })
                    .collect();
                Summary::new(self.nodes[o].name.clone(), 1, 1000, peers).expect("valid")
            })
            .collect()
    }

    fn view(&self, f: &Faults) -> ClusterView {
        // Through the wire format, as the agent gets them.
        let decoded: Vec<Summary> = self
            .summaries(f)
            .iter()
            .map(|s| Summary::decode(&s.encode()).expect("decodes"))
            .collect();
        assemble(&self.nodes, &decoded, &ViewParams::default())
    }

    /// Asserts the verdicts: `expected` for the nodes listed, healthy
    /// for every other.
    fn check(view: &ClusterView, expected: &[(usize, Verdict)]) {
        for (i, v) in view.nodes.iter().enumerate() {
            let want = expected
                .iter()
                .find(|(j, _)| *j == i)
                .map_or(Verdict::Healthy, |(_, v)| *v);
            assert_eq!(v.verdict, want, "node {i}: {v:?}");
        }
    }

    /// Replaces observer `o`'s observation of `t` in `summaries` by
    /// `paths`.
    fn rewrite(&self, summaries: &mut Vec<Summary>, o: usize, t: usize, paths: [PathSample; 4]) {
        let (o, t) = (&self.nodes[o].name, &self.nodes[t].name);
        *summaries = with_paths(summaries, |observer, p| {
            if observer == o && *p.name == **t {
                paths
            } else {
                p.paths()
            }
        });
    }

    fn observes(&self, o: usize, t: usize) -> bool {
        self.plan
            .assigned_index(o, ProbePeers::Count(K))
            .contains(&t)
    }
}

/// `summaries`, each peer's paths made by `paths(observer, peer)`.
fn with_paths(
    summaries: &[Summary],
    paths: impl Fn(&str, &PeerSummary) -> [PathSample; 4],
) -> Vec<Summary> {
    summaries
        .iter()
        .map(|s| {
            let peers = s
                .peers()
                .iter()
                .map(|p| PeerSummary::new(p.name.clone(), paths(s.observer(), p)))
                .collect();
            Summary::new(s.observer().to_owned(), s.seq(), s.at_ms(), peers).expect("valid")
        })
        .collect()
}

#[test]
fn a_healthy_cluster_is_healthy() {
    let c = Cluster::new();
    let view = c.view(&Faults::default());
    Cluster::check(&view, &[]);
    assert_eq!(view.reports, N);
    assert_eq!(view.counts.healthy, N);
    let min = view.nodes.iter().map(|n| n.observers).min().unwrap_or(0);
    assert!(min as usize >= ZONE - 1 + K / 2, "min observers {min}");
    assert!(
        view.nodes
            .iter()
            .all(|n| n.seen_reachable == n.observers && n.reporting)
    );
}

#[test]
fn a_node_down() {
    let c = Cluster::new();
    let view = c.view(&Faults {
        down: vec![57],
        ..Faults::default()
    });
    Cluster::check(&view, &[(57, Verdict::NodeDown)]);
    let v = &view.nodes[57];
    assert!(!v.reporting);
    assert_eq!((v.seen_reachable, v.failing), (0, v.observers));
}

/// A dual-stack node broken over one family only is reached over the
/// other: its paths degraded once they fail, never down; while its
/// failures are below the probers' threshold, reached (as a node failing
/// some of its paths is). Read as plain failures (a reader that predates
/// the marks), it would be down either way.
#[test]
fn a_node_broken_over_one_family_is_degraded_not_down() {
    let c = Cluster::new();
    for fresh in [false, true] {
        let f = Faults {
            one_family: vec![57],
            fresh,
            ..Faults::default()
        };
        let view = c.view(&f);
        let v = &view.nodes[57];
        if fresh {
            Cluster::check(&view, &[]);
        } else {
            Cluster::check(&view, &[(57, Verdict::PathDegraded)]);
            assert!(v.reporting && v.failing == v.observers, "{v:?}");
        }
        let unmarked = with_paths(&c.summaries(&f), |_, p| {
            p.paths().map(|mut path| {
                path.split = false;
                path
            })
        });
        let old = assemble(&c.nodes, &unmarked, &ViewParams::default());
        Cluster::check(&old, &[(57, Verdict::NodeDown)]);
    }
}

/// A dead node that one observer says it reaches (a compromised node
/// lying) is down all the same: it publishes no summary, and its other
/// observers fail it. A node that still publishes is alive somewhere:
/// every reach of it counts, and so do enough reaches of a silent one.
#[test]
fn a_lying_observer_does_not_keep_a_dead_node_from_down() {
    let c = Cluster::new();
    let observers: Vec<usize> = (0..N).filter(|&o| o != 57 && c.observes(o, 57)).collect();
    let down = Faults {
        down: vec![57],
        liars: vec![(observers[0], 57)],
        ..Faults::default()
    };
    let view = c.view(&down);
    Cluster::check(&view, &[(57, Verdict::NodeDown)]);
    let v = &view.nodes[57];
    assert!(!v.reporting);
    assert_eq!(
        (v.seen_reachable, v.failing, v.discounted),
        (0, v.observers - 1, 1),
        "{v:?}"
    );
    assert!(!v.failing_observers.contains(&c.nodes[observers[0]].name));
    // A liar saying less, that some path answers (the others failed, or
    // every one failed over one family only), is discounted the same.
    for (failed, split) in [(3, false), (4, true)] {
        let mut summaries = c.summaries(&down);
        let lie = std::array::from_fn(|i| {
            if i < failed {
                PathSample::new(ProbeResult::Failure, None).with_split(split)
            } else {
                PathSample::new(ProbeResult::Success, Some(200))
            }
        });
        c.rewrite(&mut summaries, observers[0], 57, lie);
        let view = assemble(&c.nodes, &summaries, &ViewParams::default());
        let v = &view.nodes[57];
        assert_eq!(
            (v.verdict, v.discounted),
            (Verdict::NodeDown, 1),
            "{failed} failed, split {split}: {v:?}"
        );
    }
    // Observers that fail some path and know nothing of the others (no
    // path answering) claim no reach: they do not stand beside the liar's.
    let n = observers.len() as u32;
    let unsure = (n - 1).div_ceil(4) as usize;
    assert!(
        n - 1 - unsure as u32 <= 3 * unsure as u32,
        "enough to shield a reach"
    );
    let mut summaries = c.summaries(&down);
    let failed = PathSample::new(ProbeResult::Failure, None);
    for &o in &observers[1..=unsure] {
        let paths = [failed, failed, PathSample::UNKNOWN, PathSample::UNKNOWN];
        c.rewrite(&mut summaries, o, 57, paths);
    }
    let v = &assemble(&c.nodes, &summaries, &ViewParams::default()).nodes[57];
    assert_eq!(v.discounted, 1, "the liar's reach: {v:?}");
    // Cut from every observer but the liar, yet publishing: degraded,
    // the liar's reach counted.
    let cut = Faults {
        cut: observers[1..].iter().map(|&o| (o, 57)).collect(),
        liars: vec![(observers[0], 57)],
        ..Faults::default()
    };
    let v = &c.view(&cut).nodes[57];
    assert!(v.reporting);
    assert_eq!(v.verdict, Verdict::PathDegraded, "{v:?}");
    assert_eq!((v.seen_reachable, v.discounted), (1, 0), "{v:?}");
    // Silent, but reached by over a quarter of its observers: each reach
    // has others beside it, and counts.
    let n = observers.len();
    let reaching = (n + 3).div_ceil(4) + 1;
    assert!(3 * (reaching - 1) >= n - reaching);
    let reached = Faults {
        down: vec![57],
        liars: observers[..reaching].iter().map(|&o| (o, 57)).collect(),
        ..Faults::default()
    };
    let v = &c.view(&reached).nodes[57];
    assert_eq!(v.verdict, Verdict::PathDegraded, "{v:?}");
    assert_eq!((v.seen_reachable, v.discounted), (reaching as u32, 0));
}

/// The reaches discounted are exactly those the rule names: with a
/// quarter of a dead node's observers saying they reach it (the others
/// fail it just over three times as often as each liar's fellows reach
/// it), the node is down; lossy or plain-text reaches among them count
/// for nothing, the observers whose thresholds are not crossed yet count
/// as failing, and the view publishes and reads back.
#[test]
fn the_reaches_discounted_are_those_the_rule_names_and_the_view_reads_back() {
    let c = Cluster::new();
    let observers_of =
        |t: usize| -> Vec<usize> { (0..N).filter(|&o| o != t && c.observes(o, t)).collect() };
    let t = (0..N)
        .find(|&t| observers_of(t).len() % 4 != 1)
        .expect("a node with a fitting number of observers");
    let observers = observers_of(t);
    let n = observers.len();
    // Each liar's fellows: liars - 1; the others: n - liars, over three
    // times as many, but not over three times the liars.
    let liars = n.div_ceil(4);
    assert!(n - liars > 3 * (liars - 1) && n - liars <= 3 * liars, "{n}");
    for fresh in [false, true] {
        let faults = Faults {
            down: vec![t],
            liars: observers[..liars].iter().map(|&o| (o, t)).collect(),
            lossy: vec![t],
            plaintext: vec![(observers[0], t)],
            fresh,
            ..Faults::default()
        };
        let view = c.view(&faults);
        Cluster::check(&view, &[(t, Verdict::NodeDown)]);
        let v = &view.nodes[t];
        assert_eq!(
            (v.seen_reachable, v.failing, v.discounted),
            (0, (n - liars) as u32, liars as u32),
            "fresh {fresh}: {v:?}"
        );
        assert_eq!((v.lossy, v.plaintext), (0, 0), "fresh {fresh}: {v:?}");
        let published =
            crate::cluster::published_view::PublishedView::of("node-001", 1, 1_000, 1_000, &view);
        let back = crate::cluster::published_view::PublishedView::decode(&published.encode())
            .expect("the view reads back");
        assert_eq!(back.verdict_on(&v.name), Some(Verdict::NodeDown));
    }
}

#[test]
fn a_reach_is_suspect_only_against_enough_failures() {
    // Failures over three times the others' reaches, and enough of them
    // (2 here) to stand for a verdict without it.
    for (reach, fail, suspect) in [
        (0, 1, false),
        (0, 2, true),
        (1, 3, false),
        (1, 4, true),
        (2, 6, false),
        (2, 7, true),
    ] {
        assert_eq!(suspect_reach(reach, fail, 2), suspect, "{reach} {fail}");
    }
}

#[test]
fn a_node_down_shows_before_any_probers_threshold() {
    let c = Cluster::new();
    let down = Faults {
        down: vec![57],
        fresh: true,
        ..Faults::default()
    };
    // The first round after the fault: every observer's paths towards
    // 57 failed their last probe, none is in Failure yet.
    let view = c.view(&down);
    Cluster::check(&view, &[(57, Verdict::NodeDown)]);
    // Shown as failed by every observer, named, as a node down by the
    // states is.
    let v = &view.nodes[57];
    assert_eq!((v.seen_reachable, v.failing), (0, v.observers), "{v:?}");
    assert_eq!(
        v.failing_observers.len(),
        (v.observers as usize).min(MAX_NAMED),
        "{v:?}"
    );
    // Summaries a round apart: observers that have not probed since
    // the fault still reach it. No verdict against the node yet.
    let observers: Vec<usize> = (0..N).filter(|&o| o != 57 && c.observes(o, 57)).collect();
    let half = Faults {
        before: observers[..observers.len() / 2].to_vec(),
        ..down
    };
    Cluster::check(&c.view(&half), &[]);
}

#[test]
fn failing_paths_alone_blame_no_link_zone_or_observer() {
    let c = Cluster::new();
    let b = c
        .plan
        .assigned_index(3, ProbePeers::Count(K))
        .into_iter()
        .find(|&t| c.zone(t) != c.zone(3))
        .expect("a peer in another zone");
    for faults in [
        Faults {
            cut: vec![(3, b)],
            ..Faults::default()
        },
        Faults {
            partition: Some(2),
            ..Faults::default()
        },
        Faults {
            deaf: vec![11],
            ..Faults::default()
        },
    ] {
        // Below the threshold a failing path is still a Success: only
        // the agreement of every observer (a node down) reads it.
        Cluster::check(
            &c.view(&Faults {
                fresh: true,
                ..faults
            }),
            &[],
        );
    }
}

#[test]
fn a_link_down() {
    let c = Cluster::new();
    // An observer and a node it probes in another zone.
    let a = 3;
    let b = c
        .plan
        .assigned_index(a, ProbePeers::Count(K))
        .into_iter()
        .find(|&t| c.zone(t) != c.zone(a))
        .expect("a peer outside the zone");
    let view = c.view(&Faults {
        cut: vec![(a, b)],
        ..Faults::default()
    });
    let mut expected = vec![(b, Verdict::PathDegraded)];
    if c.observes(b, a) {
        expected.push((a, Verdict::PathDegraded));
    }
    Cluster::check(&view, &expected);
    assert_eq!(view.nodes[b].failing_observers, [c.nodes[a].name.clone()]);
}

#[test]
fn a_zone_partition_degrades_the_zone_only() {
    let c = Cluster::new();
    let view = c.view(&Faults {
        partition: Some(4),
        ..Faults::default()
    });
    let zone: Vec<(usize, Verdict)> = (80..100).map(|i| (i, Verdict::PathDegraded)).collect();
    Cluster::check(&view, &zone);
    for i in 80..100 {
        let v = &view.nodes[i];
        assert_eq!(
            v.seen_reachable, 19,
            "node {i}: reached from inside its zone"
        );
        assert!(v.failing >= 1, "node {i}: failed from outside");
        assert!(
            v.failing_observers.iter().all(|o| c
                .nodes
                .get(o)
                .is_some_and(|n| n.zone.as_deref() != Some("zone-4"))),
            "the failing observers named are outside: {v:?}"
        );
        assert!(v.unreached >= 4, "its failures outwards are its own: {v:?}");
    }
}

#[test]
fn a_large_zone_partly_seen_partitioned_blames_the_zone() {
    // Zones of 50: an outside observer probes several nodes of the
    // partitioned zone, and while half the observers' summaries still
    // predate the partition those nodes look reached by most others.
    let c = Cluster::with_zones(50);
    let view = c.view(&Faults {
        partition: Some(1),
        lagging: (0..N).filter(|i| i % 2 == 1).collect(),
        ..Faults::default()
    });
    // A node of the zone that no up-to-date outsider probes is still
    // healthy to all.
    let zone: Vec<(usize, Verdict)> = (50..100)
        .filter(|&i| (0..N).any(|o| c.zone(o) != 1 && o % 2 == 0 && c.observes(o, i)))
        .map(|i| (i, Verdict::PathDegraded))
        .collect();
    assert!(zone.len() > 25, "{} of the zone degraded", zone.len());
    Cluster::check(&view, &zone);
}

#[test]
fn an_observer_that_drops_its_probes() {
    let c = Cluster::new();
    let view = c.view(&Faults {
        deaf: vec![123],
        ..Faults::default()
    });
    Cluster::check(&view, &[(123, Verdict::ObserverProblem)]);
    let v = &view.nodes[123];
    assert_eq!(v.unreached as usize, ZONE - 1 + K, "every peer");
    assert_eq!(v.unreached_nodes.len(), MAX_NAMED);
    assert_eq!(v.seen_reachable, v.observers, "others reach it");
    assert!(view.nodes.iter().all(|n| n.failing == 0));
}

#[test]
fn a_flapping_observer_is_a_problem_only_while_it_fails() {
    let c = Cluster::new();
    // Its failing phases: everything, then HTTP only; between: none.
    for (deaf, http_deaf) in [(vec![9], vec![]), (vec![], vec![9])] {
        let view = c.view(&Faults {
            deaf,
            http_deaf,
            ..Faults::default()
        });
        Cluster::check(&view, &[(9, Verdict::ObserverProblem)]);
    }
    Cluster::check(&c.view(&Faults::default()), &[]);
}

#[test]
fn every_fault_at_once() {
    let c = Cluster::new();
    let (a, b) = (150, 170);
    assert!(
        c.observes(a, b) || c.observes(b, a),
        "the cut link is observed"
    );
    let view = c.view(&Faults {
        down: vec![57],
        cut: vec![(a, b)],
        partition: Some(4),
        deaf: vec![123, 9],
        ..Faults::default()
    });
    let mut expected: Vec<(usize, Verdict)> =
        (80..100).map(|i| (i, Verdict::PathDegraded)).collect();
    expected.extend([
        (57, Verdict::NodeDown),
        (123, Verdict::ObserverProblem),
        (9, Verdict::ObserverProblem),
    ]);
    for (x, y) in [(a, b), (b, a)] {
        if c.observes(x, y) {
            expected.push((y, Verdict::PathDegraded));
        }
    }
    Cluster::check(&view, &expected);
}

#[test]
fn too_few_observers_is_unknown() {
    let c = Cluster::new();
    let all = c.summaries(&Faults::default());
    let lone = &c.nodes[0].name;
    // Only the first two zones report: nodes outside them have few
    // observers or none; node 0 hears only from its zone.
    let some: Vec<&Summary> = all.iter().filter(|s| s.observer() < "node-040").collect();
    let view = assemble(&c.nodes, some, &ViewParams::default());
    assert_eq!(view.node(lone).map(|n| n.verdict), Some(Verdict::Healthy));
    let unobserved = view.nodes.iter().filter(|n| n.observers < 2);
    for n in unobserved {
        assert_eq!(n.verdict, Verdict::Unknown, "{n:?}");
    }
    assert!(view.counts.unknown > 0);
    // Every path still unknown (a first round): unknown everywhere.
    let fresh = with_paths(&all, |_, _| [PathSample::UNKNOWN; 4]);
    let view = assemble(&c.nodes, &fresh, &ViewParams::default());
    assert_eq!(view.counts.unknown, N);
}

#[test]
fn stale_superseded_and_foreign_summaries_are_left_out() {
    let c = Cluster::new();
    let down = Faults {
        down: vec![57],
        ..Faults::default()
    };
    // Newer summaries see 57 down; older ones (at 500) saw it up.
    let mut summaries = c.summaries(&down);
    let old: Vec<Summary> = c
        .summaries(&Faults::default())
        .into_iter()
        .map(|s| Summary::new(s.observer().into(), 0, 500, s.peers().to_vec()).expect("valid"))
        .collect();
    summaries.extend(old);
    summaries.push(Summary::new("stranger".into(), 1, 1000, vec![]).expect("valid"));
    let view = assemble(&c.nodes, &summaries, &ViewParams::default());
    assert!(view.nodes[57].reporting, "57's own old summary is in");
    Cluster::check(&view, &[(57, Verdict::NodeDown)]);
    let params = ViewParams {
        oldest_ms: 600,
        ..ViewParams::default()
    };
    let view = assemble(&c.nodes, summaries.iter().rev(), &params);
    Cluster::check(&view, &[(57, Verdict::NodeDown)]);
    assert_eq!(view.reports, N - 1);
    assert_eq!(view.ignored, N + 1, "every old one and the stranger");
    assert!(!view.nodes[57].reporting);
}

/// Summaries older than the reader's window count while their
/// observers say they summarise less often and they are within that
/// cadence's window.
#[test]
fn observers_that_summarise_less_often_are_judged_by_their_own_cadence() {
    let c = Cluster::new();
    let slow: Vec<Summary> = c
        .summaries(&Faults::default())
        .into_iter()
        .map(|s| {
            Summary::new(s.observer().into(), 1, 500, s.peers().to_vec())
                .expect("valid")
                .with_cadence(std::time::Duration::from_secs(60))
        })
        .collect();
    let params = |now_ms| ViewParams {
        oldest_ms: 600,
        now_ms,
        ..ViewParams::default()
    };
    let view = assemble(&c.nodes, &slow, &params(60_000));
    assert_eq!((view.reports, view.ignored), (N, 0));
    let later = 500 + u64::from(crate::cluster::cadence::STALE_ROUNDS) * 60_000 + 1;
    let view = assemble(&c.nodes, &slow, &params(later));
    assert_eq!((view.reports, view.ignored), (0, N));
}

#[test]
fn the_view_serialises_for_the_api() {
    let c = Cluster::new();
    let view = c.view(&Faults {
        down: vec![1],
        ..Faults::default()
    });
    let json = serde_json::to_value(&view).expect("serialises");
    assert_eq!(json["nodes"][1]["verdict"], "node-down");
    assert_eq!(json["nodes"][0]["verdict"], "healthy");
    assert_eq!(json["counts"]["node_down"], 1);
    let back: ClusterView = serde_json::from_value(json).expect("deserialises");
    assert_eq!(back, view);
}

#[test]
fn lossy_paths_are_counted_through_the_wire_without_changing_a_verdict() {
    let cluster = Cluster::new();
    let lossy = [7, 150];
    let v = cluster.view(&Faults {
        lossy: lossy.to_vec(),
        ..Faults::default()
    });
    Cluster::check(&v, &[]);
    assert_eq!(v.counts.lossy, 2, "{:?}", v.counts);
    for (i, n) in v.nodes.iter().enumerate() {
        if lossy.contains(&i) {
            assert_eq!(n.lossy, n.seen_reachable, "every observer sees it: {n:?}");
            assert!(n.lossy > 0, "{n:?}");
        } else {
            assert_eq!(n.lossy, 0, "{n:?}");
        }
    }
    // A lossy node that is also down by its other observers' states:
    // counted lossy by those that still reach it, its verdict its own.
    let v = cluster.view(&Faults {
        lossy: vec![7],
        cut: vec![(7, 8)],
        ..Faults::default()
    });
    assert_eq!(v.counts.lossy, 1);
    assert_eq!(v.nodes[7].lossy, v.nodes[7].seen_reachable);
}

#[test]
fn nodes_reached_in_plain_text_are_counted_and_named_whatever_their_verdict() {
    let cluster = Cluster::new();
    // Two observers of node 9 and one of node 120 reach them in plain
    // text; an observation of a node that does not reach it is no
    // plain-text evidence.
    let observers = |t: usize| -> Vec<usize> {
        (0..N)
            .filter(|&o| {
                cluster
                    .plan
                    .assigned_index(o, ProbePeers::Count(K))
                    .contains(&t)
            })
            .collect()
    };
    let (of9, of120) = (observers(9), observers(120));
    let v = cluster.view(&Faults {
        plaintext: vec![(of9[0], 9), (of9[1], 9), (of120[0], 120)],
        ..Faults::default()
    });
    Cluster::check(&v, &[]);
    assert_eq!(v.counts.plaintext, 2, "{:?}", v.counts);
    assert_eq!((v.nodes[9].plaintext, v.nodes[120].plaintext), (2, 1));
    assert_eq!(v.nodes[9].verdict, Verdict::Healthy, "not a verdict");
    assert_eq!(
        v.plaintext_nodes,
        [v.nodes[9].name.clone(), v.nodes[120].name.clone()]
    );
    let v = cluster.view(&Faults {
        plaintext: vec![(of9[0], 9)],
        cut: vec![(of9[0], 9)],
        ..Faults::default()
    });
    assert_eq!(v.nodes[9].plaintext, 0, "a failed path is not reached");
    assert_eq!(v.plaintext_nodes, Vec::<String>::new());
    // Reached in plain text while another path to it fails (its
    // health address outside the AllowedIPs, say): still counted.
    let v = cluster.view(&Faults {
        plaintext: vec![(of9[0], 9)],
        http_deaf: vec![of9[0]],
        ..Faults::default()
    });
    assert_eq!(v.nodes[9].plaintext, 1, "{:?}", v.nodes[9]);
    assert_eq!(v.plaintext_nodes, [v.nodes[9].name.clone()]);
}
