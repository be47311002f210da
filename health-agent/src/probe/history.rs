//! Per-path history: the results of the last R rounds of every path, in
//! bounded memory (about 2 bytes a result).
//!
//! The rounds themselves (number, start, when their results were recorded)
//! are kept once per prober, in a ring of R slots indexed by `seq % R`.
//! A node's results are a ring of `4 * F * R` `u16`s (F: the families it
//! is probed over, 1 or 2), path-major, indexed the same way: a success
//! stores its RTT as a small float (a 10-bit mantissa and a 5-bit binary
//! exponent of nanoseconds: exact below 1,024 ns, within 0.1 % above, up
//! to about 36 minutes), a failure the index of its error's class
//! (`timeout`, `connect: refused`, `HTTP 503`, ...) in a small bounded
//! table of the prober's. At 10,000 peers and 60 rounds the rings are
//! 4.8 MB. The full text of a path's last error is in its
//! [`PathRecord`](super::path_record::PathRecord), not here.
//!
//! A node whose rounds all give the same values (a node that is down:
//! the same error class on every path, round after round) is kept
//! compact: one value a path and how many rounds in a row it held. A
//! node's first result is kept so unless it holds an answer (whose RTT
//! the next round's will differ from: such a node gets its ring at
//! once); it gets its ring when a round differs, is missed, or is
//! recorded again, and gives the ring back once a whole window has been
//! alike. A node down from its first round is never given a ring: at
//! 10,000 peers half silent that is 2.4 MB.

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
    /// A ring: `4 * F * R` values, path-major (IPv4's four paths first),
    /// at `seq % R`. Compact: `4 * F` values, each path's in every one of
    /// the last `run` rounds.
    slots: Box<[u16]>,
    /// The families with rows in `slots`: bit `Family::index()`.
    families: u8,
    /// `slots` holds one value a path, not a ring.
    compact: bool,
    /// How many rounds in a row, up to `last_seq`, were each recorded
    /// whole with the same values (at most R; 0 when not known): in a
    /// compact ring, the rounds it holds.
    run: u16,
}

/// A node's results in one round, four paths per family (`4 * family +
/// kind`), not probed until set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RoundRow([u16; 2 * PER_FAMILY]);

impl Default for RoundRow {
    fn default() -> Self {
        Self([NOT_PROBED; 2 * PER_FAMILY])
    }
}

impl RoundRow {
    /// Sets `path`'s value (from [`History::encode`]); a path out of range
    /// is ignored.
    pub(super) fn set(&mut self, path: usize, value: u16) {
        if let Some(v) = self.0.get_mut(path) {
            *v = value;
        }
    }

    /// The families with a value: bit `Family::index()`.
    fn families(&self) -> u8 {
        self.0
            .chunks(PER_FAMILY)
            .enumerate()
            .filter(|(_, f)| f.iter().any(|&v| v != NOT_PROBED))
            .fold(0, |bits, (i, _)| bits | 1 << i)
    }
}

/// Whether a round's row holds a success (an answer, with its RTT).
fn answered(row: &RoundRow) -> bool {
    row.0.iter().any(|&v| v != NOT_PROBED && v & FAILED == 0)
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

    /// The rounds the ring answers for, up to `last_seq`: R for a ring,
    /// `run` when compact.
    fn held(&self) -> usize {
        if self.compact {
            usize::from(self.run)
        } else {
            self.slots.len().checked_div(self.width()).unwrap_or(0)
        }
    }

    /// The row of `path` (0..8: `4 * family + kind`), when its family has
    /// rows.
    fn row(&self, path: usize) -> Option<usize> {
        let bit = 1u8 << (path / PER_FAMILY);
        (self.families & bit != 0).then(|| {
            (self.families & (bit - 1)).count_ones() as usize * PER_FAMILY + path % PER_FAMILY
        })
    }

    /// The values of `row` for the families with rows here, in their
    /// order.
    fn kept<'a>(&self, row: &'a RoundRow) -> impl Iterator<Item = u16> + use<'a> {
        let families = self.families;
        row.0
            .chunks(PER_FAMILY)
            .enumerate()
            .filter(move |(f, _)| families & (1 << f) != 0)
            .flat_map(|(_, v)| v.iter().copied())
    }

    /// A ring of `length` rounds holding the same results, for the
    /// families of `families` (bits): rows of others dropped, new ones
    /// not probed.
    fn with_families(&self, families: u8, length: usize) -> Self {
        let mut new = Self {
            last_seq: self.last_seq,
            slots: Box::default(),
            families,
            compact: false,
            // The rows of fewer families are as alike as they were.
            run: if families & !self.families == 0 {
                self.run.min(u16::try_from(length).unwrap_or(u16::MAX))
            } else {
                0
            },
        };
        new.slots = vec![NOT_PROBED; new.width() * length].into_boxed_slice();
        let len64 = length as u64;
        let keep = length.min(self.held()) as u64;
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
        if kept == self.families {
            return;
        }
        if kept == 0 {
            *self = Self::default();
        } else if self.compact {
            let mut row = RoundRow::default();
            for path in 0..2 * PER_FAMILY {
                if let Some(r) = self.row(path) {
                    row.set(path, self.slots[r]);
                }
            }
            self.families = kept;
            self.slots = self.kept(&row).collect();
        } else {
            *self = self.with_families(kept, self.held());
        }
    }

    /// Whether round `seq` was recorded whole with `row`'s values.
    fn holds(&self, seq: u64, row: &RoundRow) -> bool {
        (0..2 * PER_FAMILY).all(|path| {
            self.row(path).is_none() || self.get(path, seq).unwrap_or(NOT_PROBED) == row.0[path]
        })
    }

    /// Records a node's results in round `seq` (each path's from
    /// [`History::encode`], not probed where not set), replacing what an
    /// earlier call recorded for that round; a round older than the
    /// window is ignored. A family's first result gives it rows (a
    /// compact ring turns into a ring for it).
    pub(super) fn record(&mut self, history: &History, seq: u64, row: &RoundRow) {
        let length = history.length();
        let wanted = row.families();
        if wanted == 0 {
            // Nothing probed: as a round the node was not in.
            return;
        }
        if self.families == 0 {
            self.families = wanted;
            self.last_seq = seq;
            self.run = 1;
            if answered(row) {
                // An answering node's RTTs differ from round to round: it
                // takes its ring now, not a round later, so what a node
                // costs is held from its first round on.
                self.slots = vec![NOT_PROBED; self.width() * length].into_boxed_slice();
                self.compact = false;
                let i = (seq % length as u64) as usize;
                for (r, v) in self.kept(row).enumerate() {
                    self.slots[r * length + i] = v;
                }
            } else {
                // A node down: compact until a round differs.
                self.slots = self.kept(row).collect();
                self.compact = true;
            }
            return;
        }
        let max_run = u16::try_from(length).unwrap_or(u16::MAX);
        let next = seq == self.last_seq + 1;
        let same = next && wanted & !self.families == 0 && self.holds(self.last_seq, row);
        if self.compact && same {
            self.last_seq = seq;
            self.run = self.run.saturating_add(1).min(max_run);
            return;
        }
        if self.compact || wanted & !self.families != 0 {
            *self = self.with_families(self.families | wanted, length);
        }
        let len = self.held();
        let len64 = len as u64;
        if seq > self.last_seq {
            // The rounds since the last recorded were not probed.
            let gap = (seq - self.last_seq).min(len64);
            for s in seq + 1 - gap..=seq {
                let i = (s % len64) as usize;
                for p in 0..self.width() {
                    self.slots[p * len + i] = NOT_PROBED;
                }
            }
            self.last_seq = seq;
            self.run = if same {
                self.run.saturating_add(1).min(max_run)
            } else {
                1
            };
        } else if seq + len64 <= self.last_seq {
            return;
        } else {
            // An earlier round again: how alike the rounds are is not known.
            self.run = 0;
        }
        let i = (seq % len64) as usize;
        for (r, v) in self.kept(row).enumerate() {
            self.slots[r * len + i] = v;
        }
        if usize::from(self.run) >= len {
            // The whole window is one value a path: compact again.
            self.slots = self.kept(row).collect();
            self.compact = true;
        }
    }

    /// `path`'s value in round `seq`, when it was probed in it.
    fn get(&self, path: usize, seq: u64) -> Option<u16> {
        let held = self.held() as u64;
        if held == 0 || seq > self.last_seq || seq + held <= self.last_seq {
            return None;
        }
        let row = self.row(path)?;
        let v = if self.compact {
            self.slots[row]
        } else {
            self.slots[row * self.held() + (seq % held) as usize]
        };
        (v != NOT_PROBED).then_some(v)
    }

    /// The same results in a ring of `length` rounds: the newest that fit.
    pub(super) fn resized(&self, length: usize) -> Self {
        let length = length.max(1);
        if self.compact {
            let mut new = self.clone();
            new.run = new.run.min(u16::try_from(length).unwrap_or(u16::MAX));
            return new;
        }
        if self.slots.is_empty() || length == self.held() {
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
mod tests;
