use super::*;
use crate::probe::{
    error::{ProbeError, Proto},
    error_class::MAX_CLASSES,
    path::RttSource,
};

use std::net::{Ipv4Addr, Ipv6Addr};

const IPS: [IpAddr; 2] = [
    IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)),
    IpAddr::V4(Ipv4Addr::new(198, 19, 0, 2)),
];
const V4: [(Family, [IpAddr; 2]); 1] = [(Family::Ipv4, IPS)];
const SHOWN_V4: Shown = Shown {
    primary: Family::Ipv4,
    secondary: None,
    probed: true,
};

fn ok(us: u64) -> Outcome {
    Outcome::Ok {
        rtt: Duration::from_micros(us),
        warning: None,
        source: RttSource::Userspace,
    }
}

fn timeout() -> Outcome {
    Outcome::Failed(ProbeError::Timeout {
        proto: Proto::Icmp,
        after: Duration::from_secs(1),
    })
}

/// Round `seq` at `seq * 1000` ms, every path given the same outcome.
fn round(h: &mut History, ring: &mut NodeRing, seq: u64, outcome: &Outcome) {
    h.begin_round(seq, seq * 1000, seq * 1000 + 5);
    let v = h.encode(outcome);
    ring.record(h, seq, &row(&[(0..4, v)]));
}

/// A round's row: each range of paths given its value.
fn row(values: &[(std::ops::Range<usize>, u16)]) -> RoundRow {
    let mut row = RoundRow::default();
    for (paths, v) in values {
        for p in paths.clone() {
            row.set(p, *v);
        }
    }
    row
}

/// An RTT of `ns` nanoseconds as the history keeps it (within 0.1 %).
fn kept(ns: u64) -> u64 {
    decode_rtt(encode_rtt(Duration::from_nanos(ns)))
}

#[test]
fn the_window_keeps_the_last_r_results_oldest_first() {
    let (mut h, mut ring) = (History::new(5), NodeRing::default());
    for seq in 1..=12 {
        round(&mut h, &mut ring, seq, &ok(seq * 10));
    }
    let n = h.node("n1", &V4, &ring);
    assert_eq!(n.window, 5);
    assert_eq!(n.paths.len(), 4);
    for (p, path) in n.paths.iter().enumerate() {
        assert_eq!(path.path, PATH_NAMES[p]);
        assert_eq!(path.ip, IPS[p / 2]);
        let at: Vec<u64> = path.entries.iter().map(|e| e.at_ms).collect();
        assert_eq!(at, [8005, 9005, 10_005, 11_005, 12_005], "{path:?}");
        let rtts: Vec<Option<u64>> = path.entries.iter().map(|e| e.rtt_ns).collect();
        assert_eq!(
            rtts,
            [80_000, 90_000, 100_000, 110_000, 120_000].map(|ns| Some(kept(ns))),
            "{path:?}"
        );
        assert!(path.entries.iter().all(|e| e.error.is_none()));
    }
    assert_eq!(
        h.rounds().iter().map(|r| r.seq).collect::<Vec<_>>(),
        [8, 9, 10, 11, 12]
    );
    // The ring never grows: 4 paths x R slots.
    assert_eq!(ring.slots.len(), 20);
}

#[test]
fn loss_ratio_and_percentiles_over_a_window_with_injected_failures() {
    let (mut h, mut ring) = (History::new(10), NodeRing::default());
    // 30 rounds: only the last 10 count. Failures at 21, 24 and 27 on
    // host-icmp alone, before that failures everywhere (out of the
    // window).
    for seq in 1..=30 {
        h.begin_round(seq, seq, seq);
        let mut r = RoundRow::default();
        for p in 0..4 {
            let outcome = if seq <= 20 || (p == 0 && matches!(seq, 21 | 24 | 27)) {
                timeout()
            } else {
                ok(seq)
            };
            r.set(p, h.encode(&outcome));
        }
        ring.record(&h, seq, &r);
    }
    let n = h.node("n1", &V4, &ring);
    let icmp = &n.paths[0];
    assert_eq!(icmp.entries.len(), 10);
    assert_eq!(icmp.loss_ratio, Some(0.3));
    let failed: Vec<u64> = icmp
        .entries
        .iter()
        .filter(|e| e.outcome == EntryOutcome::Failure)
        .map(|e| e.at_ms)
        .collect();
    assert_eq!(failed, [21, 24, 27]);
    assert!(
        icmp.entries
            .iter()
            .filter(|e| e.outcome == EntryOutcome::Failure)
            .all(|e| e.error.as_deref() == Some("timeout") && e.rtt_ns.is_none())
    );
    // Successes 22, 23, 25, 26, 28, 29, 30 us: nearest rank 4 of 7 and
    // 7 of 7.
    assert_eq!(icmp.rtt_p50_ns, Some(kept(26_000)));
    assert_eq!(icmp.rtt_p99_ns, Some(kept(30_000)));
    let http = &n.paths[1];
    assert_eq!(http.loss_ratio, Some(0.0));
    // 21..=30: rank 5 of 10 and 10 of 10.
    assert_eq!(http.rtt_p50_ns, Some(kept(25_000)));
    assert_eq!(http.rtt_p99_ns, Some(kept(30_000)));
}

#[test]
fn a_path_without_successes_has_no_percentiles_and_without_results_no_ratio() {
    let (mut h, mut ring) = (History::new(4), NodeRing::default());
    round(&mut h, &mut ring, 1, &timeout());
    let n = h.node("n1", &V4, &ring);
    assert_eq!(n.paths[0].loss_ratio, Some(1.0));
    assert_eq!((n.paths[0].rtt_p50_ns, n.paths[0].rtt_p99_ns), (None, None));
    let fresh = h.node("n2", &V4, &NodeRing::default());
    assert!(
        fresh
            .paths
            .iter()
            .all(|p| p.entries.is_empty() && p.loss_ratio.is_none())
    );
}

#[test]
fn strips_mark_rounds_a_node_was_not_probed_in() {
    let mut h = History::new(6);
    let (mut a, mut b) = (NodeRing::default(), NodeRing::default());
    for seq in 1..=8 {
        h.begin_round(seq, seq * 10, seq * 10);
        let v = h.encode(&if seq == 7 { timeout() } else { ok(5) });
        a.record(&h, seq, &row(&[(0..4, v)]));
        // b: added at round 4, not probed in round 6.
        if seq >= 4 && seq != 6 {
            b.record(&h, seq, &row(&[(0..1, v)]));
        }
    }
    let rounds = h.rounds();
    assert_eq!(
        rounds,
        (3..=8)
            .map(|seq| HistoryRound {
                seq,
                started_ms: seq * 10
            })
            .collect::<Vec<_>>()
    );
    let sa = History::strips("a", &rounds, Some(&a), SHOWN_V4);
    assert_eq!(
        sa.paths,
        ["SSSSFS", "SSSSFS", "SSSSFS", "SSSSFS"].map(String::from)
    );
    let sb = History::strips("b", &rounds, Some(&b), SHOWN_V4);
    assert_eq!(sb.paths[0], ".SS.FS");
    assert_eq!(sb.paths[1], "......");
    let none = History::strips("c", &rounds, None, SHOWN_V4);
    assert!(none.paths.iter().all(|s| s == "......"));
}

#[test]
fn a_dual_stack_node_keeps_eight_paths_and_drops_a_family_that_goes() {
    let v6: [IpAddr; 2] = [
        IpAddr::V6(Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, 2)),
        IpAddr::V6(Ipv6Addr::new(0x2001, 2, 0, 2, 0, 0, 0, 2)),
    ];
    let both = [(Family::Ipv4, IPS), (Family::Ipv6, v6)];
    let shown = Shown {
        primary: Family::Ipv4,
        secondary: Some(Family::Ipv6),
        probed: true,
    };
    let (mut h, mut ring) = (History::new(4), NodeRing::default());
    for seq in 1..=3 {
        h.begin_round(seq, seq, seq);
        let good = h.encode(&ok(seq));
        let bad = h.encode(&timeout());
        let mut r = row(&[(0..4, good)]);
        // IPv6: the host paths fail in round 3, and the family's rows
        // start at round 2.
        for p in 4..8 {
            if seq >= 2 {
                r.set(p, if seq == 3 && p < 6 { bad } else { good });
            }
        }
        ring.record(&h, seq, &r);
    }
    assert_eq!(ring.slots.len(), 8 * 4, "two families of four paths");
    let n = h.node("n", &both, &ring);
    assert_eq!(n.paths.len(), 8);
    assert_eq!(n.paths[4].family, Family::Ipv6);
    assert_eq!(n.paths[4].path, "host-icmp");
    assert_eq!(n.paths[4].ip, v6[0]);
    assert_eq!(n.paths[6].ip, v6[1]);
    assert_eq!(n.paths[4].loss_ratio, Some(0.5));
    assert_eq!(n.paths[0].loss_ratio, Some(0.0));
    assert_eq!(n.paths[0].entries.len(), 3);
    let strips = History::strips("n", &h.rounds(), Some(&ring), shown);
    assert_eq!(strips.paths, ["SSS", "SSS", "SSS", "SSS"].map(String::from));
    assert_eq!(
        strips.secondary,
        Some([".SF", ".SF", ".SS", ".SS"].map(String::from))
    );
    let stats = h.stats("n", Some(&ring), &mut Vec::new(), shown);
    assert_eq!(stats.secondary.map(|s| s[1].results), Some(2));
    // The node's IPv6 addresses went: its IPv6 rows go, IPv4's stay.
    ring.retain_families(1);
    assert_eq!(ring.slots.len(), 4 * 4);
    assert_eq!(ring.get(5, 3), None);
    let strips = History::strips("n", &h.rounds(), Some(&ring), shown);
    assert_eq!(strips.paths[0], "SSS");
    assert_eq!(strips.secondary.expect("shown")[0], "...");
}

#[test]
fn a_node_missing_from_later_rounds_leaves_the_window() {
    let mut h = History::new(3);
    let mut ring = NodeRing::default();
    round(&mut h, &mut ring, 1, &ok(1));
    for seq in 2..=5 {
        h.begin_round(seq, seq, seq);
    }
    let n = h.node("n1", &V4, &ring);
    assert!(n.paths.iter().all(|p| p.entries.is_empty()), "{n:?}");
}

#[test]
fn resizing_keeps_the_newest_results_that_fit() {
    let (mut h, mut ring) = (History::new(5), NodeRing::default());
    for seq in 1..=7 {
        round(&mut h, &mut ring, seq, &ok(seq));
    }
    let at = |h: &History, ring: &NodeRing| -> Vec<u64> {
        h.node("n", &V4, ring).paths[3]
            .entries
            .iter()
            .map(|e| e.at_ms)
            .collect()
    };
    let (small, small_ring) = (h.resized(2), ring.resized(2));
    assert_eq!(at(&small, &small_ring), [6005, 7005]);
    assert_eq!(small_ring.slots.len(), 8);
    let (mut big, mut big_ring) = (h.resized(8), ring.resized(8));
    assert_eq!(at(&big, &big_ring), [3005, 4005, 5005, 6005, 7005]);
    // And goes on recording in the new ring.
    for seq in 8..=12 {
        round(&mut big, &mut big_ring, seq, &ok(seq));
    }
    assert_eq!(
        at(&big, &big_ring),
        [5005, 6005, 7005, 8005, 9005, 10_005, 11_005, 12_005]
    );
}

#[test]
fn rtts_are_exact_below_a_microsecond_and_within_a_thousandth_above() {
    for ns in [0, 1, 999, 1023] {
        assert_eq!(decode_rtt(encode_rtt(Duration::from_nanos(ns))), ns);
    }
    let mut ns = 1024u64;
    while ns < 2_000_000_000_000 {
        for x in [ns - 1, ns, ns + 1, ns * 3 / 2, ns * 2 - 1] {
            let v = encode_rtt(Duration::from_nanos(x));
            assert_eq!(v & FAILED, 0, "a success: {x} ns");
            let back = decode_rtt(v);
            assert!(back.abs_diff(x) * 1000 <= x, "{x} ns read back as {back}");
        }
        ns *= 2;
    }
    // Saturates (about 36 minutes) instead of reading as a failure.
    let huge = encode_rtt(Duration::from_secs(1 << 40));
    assert_eq!(huge & FAILED, 0);
    assert_eq!(decode_rtt(huge), MANTISSA << MAX_EXPONENT);
    assert_ne!(huge, NOT_PROBED);
}

#[test]
fn error_classes_are_bounded_and_named() {
    let mut h = History::new(1);
    let refused = Outcome::Failed(ProbeError::io(
        "connect",
        &std::io::Error::from_raw_os_error(libc::ECONNREFUSED),
    ));
    let a = h.encode(&refused);
    assert_eq!(h.encode(&refused), a, "the same class, the same index");
    assert_eq!(h.classes.get(a & !FAILED).to_string(), "connect: refused");
    for code in 0..1000u16 {
        h.encode(&Outcome::Failed(ProbeError::HttpStatus(code)));
    }
    assert_eq!(h.classes.list.len(), MAX_CLASSES);
    let late = h.encode(&Outcome::Failed(ProbeError::HttpStatus(999)));
    assert_eq!(h.classes.get(late & !FAILED), ErrorClass::Other);
    assert_eq!(h.classes.get(a & !FAILED).to_string(), "connect: refused");
}

/// The nodes of the two tests below.
const NODES: usize = 5000;

/// [`NODES`] nodes in a history of the default length after 70
/// rounds, round `seq` at `seq * 1000` ms giving every path
/// `outcome(seq)`.
fn seventy_rounds(outcome: impl Fn(u64) -> Outcome) -> (History, Vec<NodeRing>) {
    let mut h = History::new(usize::from(DEFAULT_LENGTH));
    let mut rings = vec![NodeRing::default(); NODES];
    for seq in 1..=70 {
        h.begin_round(seq, seq * 1000, seq * 1000 + 5);
        let r = row(&[(0..4, h.encode(&outcome(seq)))]);
        for ring in &mut rings {
            ring.record(&h, seq, &r);
        }
    }
    (h, rings)
}

/// A node down from its first round is never given a ring: one value
/// a path, read back as every round of the window.
#[test]
fn five_thousand_nodes_down_cost_a_value_a_path() {
    let (h, rings) = seventy_rounds(|_| timeout());
    let heap = rings.iter().map(|r| size_of_val(&*r.slots)).sum::<usize>();
    assert_eq!(heap, NODES * 4 * size_of::<u16>(), "one value a path");
    let n = h.node("n1", &V4, &rings[0]);
    for path in &n.paths {
        let at: Vec<u64> = path.entries.iter().map(|e| e.at_ms).collect();
        assert_eq!(at, (11..=70).map(|s| s * 1000 + 5).collect::<Vec<_>>());
        assert!(
            path.entries
                .iter()
                .all(|e| e.error.as_deref() == Some("timeout"))
        );
        assert_eq!(path.loss_ratio, Some(1.0));
    }
    let strips = History::strips("n1", &h.rounds(), Some(&rings[0]), SHOWN_V4);
    assert!(strips.paths.iter().all(|s| s == &"F".repeat(60)));
}

/// A node that answers gets a ring; down for a whole window, it gives
/// it back; answering again, it gets one again with the window whole.
#[test]
fn a_ring_down_for_a_whole_window_turns_compact_and_back() {
    let (mut h, mut ring) = (History::new(5), NodeRing::default());
    for seq in 1..=6 {
        round(&mut h, &mut ring, seq, &ok(seq));
    }
    assert_eq!(ring.slots.len(), 20, "answers that differ: a ring");
    for seq in 7..=10 {
        round(&mut h, &mut ring, seq, &timeout());
    }
    assert_eq!(ring.slots.len(), 20, "one answer still in the window");
    round(&mut h, &mut ring, 11, &timeout());
    assert_eq!(ring.slots.len(), 4, "five timeouts: compact");
    round(&mut h, &mut ring, 12, &ok(3));
    assert_eq!(ring.slots.len(), 20);
    let n = h.node("n", &V4, &ring);
    let outcomes: Vec<EntryOutcome> = n.paths[2].entries.iter().map(|e| e.outcome).collect();
    assert_eq!(
        outcomes,
        [
            EntryOutcome::Failure,
            EntryOutcome::Failure,
            EntryOutcome::Failure,
            EntryOutcome::Failure,
            EntryOutcome::Success
        ]
    );
    assert_eq!(n.paths[2].rtt_p50_ns, Some(kept(3000)));
}

/// A node answering its first round holds its ring from that round (its
/// next round's RTTs will differ), read back as that one round; a node
/// failing its first round stays one value a path.
#[test]
fn a_first_answer_takes_the_ring_at_once_a_first_failure_does_not() {
    let mut h = History::new(5);
    let (mut up, mut down) = (NodeRing::default(), NodeRing::default());
    round(&mut h, &mut up, 1, &ok(4));
    round(&mut h, &mut down, 1, &timeout());
    assert_eq!(up.slots.len(), 20, "an answer: the ring, at once");
    assert_eq!(down.slots.len(), 4, "a failure: compact");
    let n = h.node("n", &V4, &up);
    for path in &n.paths {
        let outcomes: Vec<_> = path.entries.iter().map(|e| e.outcome).collect();
        assert_eq!(outcomes, [EntryOutcome::Success]);
        assert_eq!(path.rtt_p50_ns, Some(kept(4000)));
    }
    // The next round fills the ring's next slot.
    round(&mut h, &mut up, 2, &ok(5));
    assert_eq!(up.slots.len(), 20);
    let n = h.node("n", &V4, &up);
    assert_eq!(n.paths[0].entries.len(), 2);
    // A window of one round: one value a path either way.
    let (mut one, mut ring) = (History::new(1), NodeRing::default());
    round(&mut one, &mut ring, 1, &ok(4));
    round(&mut one, &mut ring, 2, &ok(6));
    assert_eq!(ring.slots.len(), 4);
    let n = one.node("n", &V4, &ring);
    assert_eq!(n.paths[0].rtt_p50_ns, Some(kept(6000)));
}

/// Compact or not, a ring answers as the plain list of the rounds
/// recorded would, over random runs: rows repeated, rounds skipped or
/// recorded again out of order, paths and families coming and going,
/// windows resized.
#[test]
fn a_ring_answers_as_the_rounds_recorded_whatever_its_form() {
    let mut random = fastrand::Rng::with_seed(31);
    let mut checked_compact = 0usize;
    for run in 0..400 {
        let mut length = random.usize(1..8);
        let mut h = History::new(length);
        let values = [
            NOT_PROBED,
            h.encode(&timeout()),
            h.encode(&ok(7)),
            h.encode(&ok(9)),
        ];
        let mut ring = NodeRing::default();
        let mut model = std::collections::BTreeMap::<u64, RoundRow>::new();
        let (mut model_last, mut model_families) = (0u64, 0u8);
        let mut previous = RoundRow::default();
        let mut seq = 0;
        for step in 0..60 {
            seq += if random.u8(..8) == 0 { 2 } else { 1 };
            h.begin_round(seq, seq, seq);
            match random.u8(..24) {
                0 => {
                    let keep = random.u8(0..4);
                    ring.retain_families(keep);
                    if model_families & keep == 0 {
                        if model_families != 0 {
                            model.clear();
                            (model_last, model_families) = (0, 0);
                        }
                    } else {
                        for r in model.values_mut() {
                            for p in 0..2 * PER_FAMILY {
                                if keep & (1 << (p / PER_FAMILY)) == 0 {
                                    r.0[p] = NOT_PROBED;
                                }
                            }
                        }
                        model_families &= keep;
                    }
                }
                1 => {
                    length = random.usize(1..8);
                    h = h.resized(length);
                    ring = ring.resized(length);
                }
                _ => {}
            }
            let r = if random.u8(..4) != 0 {
                previous
            } else {
                let v6 = random.bool();
                let mut r = RoundRow::default();
                for p in 0..if v6 { 8 } else { 4 } {
                    r.set(p, values[random.usize(..values.len())]);
                }
                r
            };
            previous = r;
            // Now and then an earlier round again, maybe out of the
            // window.
            let at = if random.u8(..8) == 0 {
                seq.saturating_sub(random.u64(0..=length as u64 + 1)).max(1)
            } else {
                seq
            };
            ring.record(&h, at, &r);
            if r.families() != 0 {
                // A family gets its rows even from a round too old
                // to keep.
                model_families |= r.families();
                if model_last == 0 || at + length as u64 > model_last {
                    model.insert(at, r);
                    model_last = model_last.max(at);
                }
            }
            model.retain(|&s, _| s + length as u64 > model_last);
            for s in seq.saturating_sub(length as u64 + 2)..=seq {
                for p in 0..2 * PER_FAMILY {
                    let want = model.get(&s).map(|r| r.0[p]).filter(|&v| v != NOT_PROBED);
                    assert_eq!(
                        ring.get(p, s),
                        want,
                        "run {run} step {step}: path {p} in round {s}, window {length}, {ring:?}"
                    );
                }
            }
            checked_compact += usize::from(ring.compact && length > 1);
        }
    }
    assert!(
        checked_compact > 2000,
        "compact rings checked {checked_compact} times"
    );
}

/// The history of 5,000 nodes x 4 paths x 60 rounds: heap and inline
/// bytes per result (the ring's pointer and last round live in the
/// node's map value).
#[test]
fn five_thousand_nodes_of_sixty_rounds_cost_under_2_2_bytes_a_result() {
    let (h, rings) = seventy_rounds(ok);
    let results = NODES * 4 * usize::from(DEFAULT_LENGTH);
    let per_node = rings
        .iter()
        .map(|r| size_of::<NodeRing>() + size_of_val(&*r.slots))
        .sum::<usize>();
    let prober = size_of::<History>()
        + size_of_val(&*h.rounds)
        + h.classes.list.capacity() * size_of::<ErrorClass>()
        + h.classes.index.capacity() * (size_of::<ErrorClass>() + 4);
    let total = per_node + prober;
    println!(
        "history of {NODES} nodes x 4 paths x {DEFAULT_LENGTH} rounds: {total} bytes, {} thousandths of a byte a result",
        total * 1000 / results
    );
    assert!(
        total * 10 < results * 22,
        "{total} bytes for {results} results"
    );
    assert!(
        rings
            .iter()
            .all(|r| r.slots.len() == 4 * usize::from(DEFAULT_LENGTH)),
        "fixed rings"
    );
}
