//! Per-path history: the results of the last R rounds of every path, in
//! bounded memory (about 2 bytes a result).
//!
//! The rounds themselves (number, start, when their results were recorded)
//! are kept once per prober, in a ring of R slots indexed by `seq % R`.
//! Each node has one ring of `4 * F * R` `u16`s (F: the families it is
//! probed over, 1 or 2), allocated at its first result, path-major,
//! indexed the same way: a success stores its RTT as a small float (a
//! 10-bit mantissa and a 5-bit binary exponent of nanoseconds: exact
//! below 1,024 ns, within 0.1 % above, up to about 36 minutes), a failure
//! the index of its error's class (`timeout`, `connect: refused`,
//! `HTTP 503`, ...) in a small bounded table of the prober's. At 10,000
//! peers and 60 rounds the rings are 4.8 MB. The full text of a path's last error is
//! in its [`PathRecord`](super::path_record::PathRecord), not here.

use std::{net::IpAddr, time::Duration};

use serde::{Deserialize, Serialize};

use super::{
    error_class::{ErrorClass, ErrorClasses},
    family::{Family, PER_FAMILY, Shown},
    path::Outcome,
};

/// Rounds kept by default (`--history-length`).
pub const DEFAULT_LENGTH: u16 = 60;
/// The most rounds `--history-length` may ask for: 8 bytes per node and
/// round, 46 MB at 1,440 rounds of 4,000 peers.
pub const MAX_LENGTH: u16 = 1440;
/// The four paths of a family as the history names them, in their order
/// (the same names in both families: each path has its `family`).
pub const PATH_NAMES: [&str; 4] = ["host-icmp", "host-http", "endpoint-icmp", "endpoint-http"];

/// A failure: the low bits are an error class index.
const FAILED: u16 = 1 << 15;
/// A success: the RTT's mantissa bits (the exponent is above them).
const MANTISSA_BITS: u32 = 10;
const MANTISSA: u64 = (1 << MANTISSA_BITS) - 1;
/// The largest exponent of a success.
const MAX_EXPONENT: u32 = 31;
/// A slot of a round the path was not probed in.
const NOT_PROBED: u16 = u16::MAX;
/// One round as the history keeps it (`seq` 0: an empty slot).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct RoundSlot {
    seq: u64,
    started_ms: u64,
    /// When the round's results were recorded (each path's
    /// `last_probe_ms`).
    at_ms: u64,
}

/// The prober's part of the history: the last R rounds and the error
/// classes. Kept beside the paths and locked after them.
#[derive(Debug, Clone)]
pub(super) struct History {
    rounds: Box<[RoundSlot]>,
    last_seq: u64,
    classes: ErrorClasses,
}

/// One node's part: its paths' results in the last R rounds (nothing
/// until its first result), four per family it was probed over.
#[derive(Debug, Clone, Default)]
pub(super) struct NodeRing {
    /// The last round recorded in `slots`.
    last_seq: u64,
    /// `4 * F * R` values, path-major (IPv4's four paths first), at
    /// `seq % R`.
    slots: Box<[u16]>,
    /// The families with rows in `slots`: bit `Family::index()`.
    families: u8,
}

/// An RTT as 15 bits: `exponent << 10 | mantissa`, the nanoseconds being
/// `mantissa << exponent`, rounded to the nearest (exact below 1,024 ns;
/// from there the mantissa keeps 10 significant bits: within 0.1 %).
/// Saturates at the largest value instead of reading as a failure.
fn encode_rtt(rtt: Duration) -> u16 {
    let ns = u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX);
    if ns <= MANTISSA {
        // Below 1,024: the value itself, exponent 0.
        return u16::try_from(ns).unwrap_or(0);
    }
    // Shift so that 10 bits are left, rounding half up.
    let mut exponent = ns.bit_width() - MANTISSA_BITS;
    let mut mantissa = (ns >> exponent) + ((ns >> (exponent - 1)) & 1);
    if mantissa > MANTISSA {
        // Rounded up past 10 bits: one more binary place.
        mantissa >>= 1;
        exponent += 1;
    }
    if exponent > MAX_EXPONENT {
        return u16::try_from((u64::from(MAX_EXPONENT) << MANTISSA_BITS) | MANTISSA).unwrap_or(0);
    }
    u16::try_from((u64::from(exponent) << MANTISSA_BITS) | mantissa).unwrap_or(0)
}

fn decode_rtt(v: u16) -> u64 {
    let (exponent, mantissa) = (v >> MANTISSA_BITS, u64::from(v) & MANTISSA);
    mantissa << exponent
}

impl History {
    /// A history of `length` rounds (at least 1).
    pub(super) fn new(length: usize) -> Self {
        Self {
            rounds: vec![RoundSlot::default(); length.max(1)].into_boxed_slice(),
            last_seq: 0,
            classes: ErrorClasses::new(),
        }
    }

    /// R: how many rounds are kept.
    pub(super) fn length(&self) -> usize {
        self.rounds.len()
    }

    fn slot(&self, seq: u64) -> usize {
        // The remainder is below R, a usize.
        (seq % self.rounds.len() as u64) as usize
    }

    /// Starts recording round `seq` (numbers only grow).
    pub(super) fn begin_round(&mut self, seq: u64, started_ms: u64, at_ms: u64) {
        let i = self.slot(seq);
        self.rounds[i] = RoundSlot {
            seq,
            started_ms,
            at_ms,
        };
        self.last_seq = self.last_seq.max(seq);
    }

    /// The value a result is kept as.
    pub(super) fn encode(&mut self, outcome: &Outcome) -> u16 {
        match outcome {
            Outcome::Ok { rtt, .. } => encode_rtt(*rtt),
            Outcome::Failed(e) => FAILED | self.classes.intern(ErrorClass::from(e)),
        }
    }

    /// The rounds in the window, oldest first.
    fn window(&self) -> impl Iterator<Item = &RoundSlot> {
        let len = self.rounds.len() as u64;
        let first = self.last_seq.saturating_sub(len - 1).max(1);
        (first..=self.last_seq).filter_map(move |seq| {
            let r = &self.rounds[self.slot(seq)];
            (r.seq == seq).then_some(r)
        })
    }

    /// The same history with `length` rounds: the newest that fit.
    pub(super) fn resized(&self, length: usize) -> Self {
        if length.max(1) == self.length() {
            return self.clone();
        }
        let mut new = Self::new(length);
        new.classes = self.classes.clone();
        new.last_seq = self.last_seq;
        for r in self.window() {
            let i = new.slot(r.seq);
            new.rounds[i] = *r;
        }
        new
    }
}

impl NodeRing {
    /// Paths kept: four per family.
    fn width(&self) -> usize {
        PER_FAMILY * self.families.count_ones() as usize
    }

    fn length(&self) -> usize {
        self.slots.len().checked_div(self.width()).unwrap_or(0)
    }

    /// The row of `path` (0..8: `4 * family + kind`), when its family has
    /// rows.
    fn row(&self, path: usize) -> Option<usize> {
        let bit = 1u8 << (path / PER_FAMILY);
        (self.families & bit != 0).then(|| {
            (self.families & (bit - 1)).count_ones() as usize * PER_FAMILY + path % PER_FAMILY
        })
    }

    /// The same results with rows for the families of `families` (bits):
    /// rows of others dropped, new ones not probed.
    fn with_families(&self, families: u8, length: usize) -> Self {
        let mut new = Self {
            last_seq: self.last_seq,
            slots: Box::default(),
            families,
        };
        new.slots = vec![NOT_PROBED; new.width() * length].into_boxed_slice();
        let len64 = length as u64;
        let keep = length.min(self.length()) as u64;
        if keep > 0 {
            for seq in self.last_seq.saturating_sub(keep - 1).max(1)..=self.last_seq {
                for path in 0..2 * PER_FAMILY {
                    if let (Some(v), Some(row)) = (self.get(path, seq), new.row(path)) {
                        new.slots[row * length + (seq % len64) as usize] = v;
                    }
                }
            }
        }
        new
    }

    /// Forgets the rows of the families not in `families` (bits): a node
    /// whose addresses of a family are gone.
    pub(super) fn retain_families(&mut self, families: u8) {
        let kept = self.families & families;
        if kept != self.families {
            *self = if kept == 0 {
                Self::default()
            } else {
                self.with_families(kept, self.length())
            };
        }
    }

    /// Records `value` (from [`History::encode`]) for `path` (0..8: `4 *
    /// family + kind`) in round `seq`, the history's latest. The first
    /// result of a family allocates its rows.
    pub(super) fn record(&mut self, history: &History, seq: u64, path: usize, value: u16) {
        let bit = 1u8 << (path / PER_FAMILY);
        if self.families & bit == 0 {
            *self = self.with_families(self.families | bit, history.length());
        }
        let (len, width) = (self.length(), self.width());
        let len64 = len as u64;
        if seq > self.last_seq {
            // The rounds since the last recorded were not probed.
            let gap = (seq - self.last_seq).min(len64);
            for s in seq + 1 - gap..=seq {
                let i = (s % len64) as usize;
                for p in 0..width {
                    self.slots[p * len + i] = NOT_PROBED;
                }
            }
            self.last_seq = seq;
        } else if seq + len64 <= self.last_seq {
            return;
        }
        if let Some(row) = self.row(path) {
            self.slots[row * len + (seq % len64) as usize] = value;
        }
    }

    /// `path`'s value in round `seq`, when it was probed in it.
    fn get(&self, path: usize, seq: u64) -> Option<u16> {
        let len = self.length() as u64;
        if len == 0 || seq > self.last_seq || seq + len <= self.last_seq {
            return None;
        }
        let v = self.slots[self.row(path)? * self.length() + (seq % len) as usize];
        (v != NOT_PROBED).then_some(v)
    }

    /// The same results in a ring of `length` rounds: the newest that fit.
    pub(super) fn resized(&self, length: usize) -> Self {
        let length = length.max(1);
        if self.slots.is_empty() || length == self.length() {
            return self.clone();
        }
        self.with_families(self.families, length)
    }
}

/// A path's result in one round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryOutcome {
    Success,
    Failure,
}

/// One result of a path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryEntry {
    /// Epoch milliseconds when the round's results were recorded.
    pub at_ms: u64,
    pub outcome: EntryOutcome,
    /// The RTT of a success (to the microsecond past a second).
    pub rtt_ns: Option<u64>,
    /// The class of a failure's error (`timeout`, `connect: refused`,
    /// `HTTP 503`, ...): the path's `last_error` has the last one in full.
    pub error: Option<String>,
}

/// Figures over a path's results in the window.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct WindowStats {
    /// Results in the window.
    pub results: usize,
    /// Failures over results; `None` without results.
    pub loss_ratio: Option<f64>,
    /// Nearest-rank percentiles of the successes' RTTs; `None` without
    /// successes.
    pub rtt_p50_ns: Option<u64>,
    pub rtt_p99_ns: Option<u64>,
}

/// One path's results, oldest first, and its figures over them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PathHistory {
    /// `host-icmp`, `host-http`, `endpoint-icmp` or `endpoint-http`.
    pub path: String,
    /// The family of `ip`.
    #[serde(default)]
    pub family: Family,
    pub ip: IpAddr,
    pub entries: Vec<HistoryEntry>,
    pub loss_ratio: Option<f64>,
    pub rtt_p50_ns: Option<u64>,
    pub rtt_p99_ns: Option<u64>,
}

/// `GET /v1/status/history?node=NAME`: a node's paths, in the order of
/// [`PATH_NAMES`], the primary family's four then the secondary's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeHistory {
    pub node: String,
    /// R: the rounds kept.
    pub window: usize,
    pub paths: Vec<PathHistory>,
}

/// A round of the window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryRound {
    pub seq: u64,
    pub started_ms: u64,
}

/// A node's paths over the window, one character a round.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStrips {
    pub name: String,
    /// The primary family's paths (the status's `host` and `endpoint`), in
    /// the order of [`PATH_NAMES`], each one character per round of
    /// [`HistoryStrips::rounds`]: `S` success, `F` failure, `.` not probed.
    pub paths: [String; 4],
    /// The secondary family's (`host_secondary`, `endpoint_secondary`),
    /// when it is probed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secondary: Option<[String; 4]>,
}

/// `GET /v1/status/history`: every node's results over the window, as
/// strings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistoryStrips {
    pub window: usize,
    /// Oldest first.
    pub rounds: Vec<HistoryRound>,
    /// In the node set's order.
    pub nodes: Vec<NodeStrips>,
}

/// A node's figures over the window, paths in the order of [`PATH_NAMES`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeStats {
    pub name: String,
    /// The primary family's paths.
    pub paths: [WindowStats; 4],
    /// The secondary family's, when it is probed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secondary: Option<[WindowStats; 4]>,
}

/// `GET /v1/status/history?stats=true`: every node's figures over the
/// window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HistoryStats {
    pub window: usize,
    /// In the node set's order.
    pub nodes: Vec<NodeStats>,
}

/// Nearest-rank percentile `p` of `sorted` (not empty).
fn nearest_rank(sorted: &[u64], p: usize) -> u64 {
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    sorted[rank.min(sorted.len()) - 1]
}

/// Figures over `path`'s results in the window; `rtts` is scratch space.
fn window_stats(
    history: &History,
    ring: &NodeRing,
    path: usize,
    rtts: &mut Vec<u64>,
) -> WindowStats {
    rtts.clear();
    let (mut results, mut failures) = (0usize, 0usize);
    for r in history.window() {
        match ring.get(path, r.seq) {
            None => {}
            Some(v) if v & FAILED != 0 => {
                results += 1;
                failures += 1;
            }
            Some(v) => {
                results += 1;
                rtts.push(decode_rtt(v));
            }
        }
    }
    rtts.sort_unstable();
    #[expect(
        clippy::cast_precision_loss,
        reason = "counts of at most MAX_LENGTH rounds are exact in an f64"
    )]
    let loss_ratio = (results > 0).then(|| failures as f64 / results as f64);
    WindowStats {
        results,
        loss_ratio,
        rtt_p50_ns: (!rtts.is_empty()).then(|| nearest_rank(rtts, 50)),
        rtt_p99_ns: (!rtts.is_empty()).then(|| nearest_rank(rtts, 99)),
    }
}

impl History {
    /// A node's paths, four per family of `families` (each with the node
    /// address and the health address), in that order.
    pub(super) fn node(
        &self,
        name: &str,
        families: &[(Family, [IpAddr; 2])],
        ring: &NodeRing,
    ) -> NodeHistory {
        let mut rtts = Vec::with_capacity(self.length());
        let paths = families
            .iter()
            .flat_map(|&(family, ips)| (0..PER_FAMILY).map(move |k| (family, ips[k / 2], k)))
            .map(|(family, ip, k)| {
                let p = family.index() * PER_FAMILY + k;
                let entries = self
                    .window()
                    .filter_map(|r| {
                        ring.get(p, r.seq).map(|v| {
                            let failed = v & FAILED != 0;
                            HistoryEntry {
                                at_ms: r.at_ms,
                                outcome: if failed {
                                    EntryOutcome::Failure
                                } else {
                                    EntryOutcome::Success
                                },
                                rtt_ns: (!failed).then(|| decode_rtt(v)),
                                error: failed.then(|| self.classes.get(v & !FAILED).to_string()),
                            }
                        })
                    })
                    .collect();
                let stats = window_stats(self, ring, p, &mut rtts);
                PathHistory {
                    path: PATH_NAMES[k].to_owned(),
                    family,
                    ip,
                    entries,
                    loss_ratio: stats.loss_ratio,
                    rtt_p50_ns: stats.rtt_p50_ns,
                    rtt_p99_ns: stats.rtt_p99_ns,
                }
            })
            .collect();
        NodeHistory {
            node: name.to_owned(),
            window: self.length(),
            paths,
        }
    }

    /// The rounds of the window, oldest first.
    pub(super) fn rounds(&self) -> Vec<HistoryRound> {
        self.window()
            .map(|r| HistoryRound {
                seq: r.seq,
                started_ms: r.started_ms,
            })
            .collect()
    }

    /// A node's strips over `rounds` (from [`Self::rounds`]), for the
    /// families `shown`; `None`: the node has no result yet.
    pub(super) fn strips(
        name: &str,
        rounds: &[HistoryRound],
        ring: Option<&NodeRing>,
        shown: Shown,
    ) -> NodeStrips {
        let family = |f: Family| -> [String; 4] {
            std::array::from_fn(|k| {
                let p = f.index() * PER_FAMILY + k;
                let mut s = String::with_capacity(rounds.len());
                for r in rounds {
                    s.push(match ring.and_then(|ring| ring.get(p, r.seq)) {
                        None => '.',
                        Some(v) if v & FAILED != 0 => 'F',
                        Some(_) => 'S',
                    });
                }
                s
            })
        };
        NodeStrips {
            name: name.to_owned(),
            paths: family(shown.primary),
            secondary: shown.secondary.map(family),
        }
    }

    /// A node's figures over the window, for the families `shown`; `rtts`
    /// is scratch space.
    pub(super) fn stats(
        &self,
        name: &str,
        ring: Option<&NodeRing>,
        rtts: &mut Vec<u64>,
        shown: Shown,
    ) -> NodeStats {
        let empty = NodeRing::default();
        let ring = ring.unwrap_or(&empty);
        let mut family = |f: Family| -> [WindowStats; 4] {
            std::array::from_fn(|k| window_stats(self, ring, f.index() * PER_FAMILY + k, rtts))
        };
        NodeStats {
            name: name.to_owned(),
            paths: family(shown.primary),
            secondary: shown.secondary.map(family),
        }
    }
}

#[cfg(test)]
mod tests {
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
        for p in 0..4 {
            ring.record(h, seq, p, v);
        }
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
            for p in 0..4 {
                let outcome = if seq <= 20 || (p == 0 && matches!(seq, 21 | 24 | 27)) {
                    timeout()
                } else {
                    ok(seq)
                };
                let v = h.encode(&outcome);
                ring.record(&h, seq, p, v);
            }
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
            for p in 0..4 {
                a.record(&h, seq, p, v);
            }
            // b: added at round 4, not probed in round 6.
            if seq >= 4 && seq != 6 {
                b.record(&h, seq, 0, v);
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
            IpAddr::V6(Ipv6Addr::new(0x2001, 2, 1, 0, 0, 0, 0, 2)),
            IpAddr::V6(Ipv6Addr::new(0x2001, 2, 2, 0, 0, 0, 0, 2)),
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
            for p in 0..4 {
                ring.record(&h, seq, p, good);
            }
            // IPv6: the host paths fail in round 3, and the family's rows
            // start at round 2.
            for p in 4..8 {
                if seq >= 2 {
                    ring.record(&h, seq, p, if seq == 3 && p < 6 { bad } else { good });
                }
            }
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

    /// The history of 5,000 nodes x 4 paths x 60 rounds: heap and inline
    /// bytes per result (the ring's pointer and last round live in the
    /// node's map value).
    #[test]
    fn five_thousand_nodes_of_sixty_rounds_cost_under_2_2_bytes_a_result() {
        const NODES: usize = 5000;
        let mut h = History::new(usize::from(DEFAULT_LENGTH));
        let mut rings = vec![NodeRing::default(); NODES];
        for seq in 1..=70 {
            h.begin_round(seq, seq, seq);
            let v = h.encode(&ok(seq));
            for ring in &mut rings {
                for p in 0..4 {
                    ring.record(&h, seq, p, v);
                }
            }
        }
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
}
