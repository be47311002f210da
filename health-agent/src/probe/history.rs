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
//! node's first result is kept so; it gets its ring when a round differs,
//! is missed, or is recorded again, and gives the ring back once a whole
//! window has been alike. A node down from its first round is never
//! given a ring: at 10,000 peers half silent that is 2.4 MB.

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
            // The first result: compact until a round differs.
            self.families = wanted;
            self.slots = self.kept(row).collect();
            self.compact = true;
            self.last_seq = seq;
            self.run = 1;
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
}
