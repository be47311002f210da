//! A path's samples over the windows of [`super::WINDOWS`]: a probe is
//! recorded in one epoch, not in one epoch a window.
//!
//! The windows are levels, finest first: epochs of 10 s, 1 min and
//! 10 min. A probe is counted in the finest level's newest epoch only. A
//! coarser level's newest epoch is not stored: it is read from the finer
//! level's epochs since it began, and when it ends it is sealed, merged
//! from them into an epoch of its own. That works because each level
//! keeps at least as many epochs as one epoch of the next level spans (6
//! of 10 s make a minute, 10 of a minute make 10 minutes: checked when
//! the crate is built), so the finer epochs are still there when the
//! coarser one ends. An answer is held again by each longer window once
//! its epoch there has ended (a minute's answers in their minute, and
//! once their 10 minutes end, in those as well); what no window holds
//! twice is its newest epoch, where every probe lands.
//!
//! An epoch keeps its losses (a `u16`) and its answers' RTT buckets in
//! the smaller of two forms: raw, a byte per answer (its bucket), or
//! pairs, two bytes per distinct bucket (the bucket and its answers, 1 to
//! 255; a bucket with more has one more pair per 255). A few answers
//! spread over many buckets are smaller raw, many answers in few buckets
//! as pairs. Only the shorter windows' 16 epochs have a bit to say which
//! form they hold: the hour's hold pairs. Every epoch's bytes share one exactly sized slice, epoch after
//! epoch.

use super::{
    ALL_EPOCHS, DEGRADED_MIN_PROBES, FIRST_EPOCH, Quality, WINDOWS, bucket, ratio_of, wilson,
};

/// The epochs that may hold raw bytes: the first two windows' (one bit
/// each in [`PathQuality::raw`]).
const RAW_EPOCHS: usize = 16;

const _: () = {
    assert!(FIRST_EPOCH[WINDOWS.len() - 1] <= RAW_EPOCHS);
    assert!(ALL_EPOCHS <= 32, "a window's epochs are a u32 mask");
    // A coarser level's epoch spans a whole number of the finer level's,
    // and no more of them than the finer level keeps.
    let mut t = 1;
    while t < WINDOWS.len() {
        let (fine, coarse) = (
            WINDOWS[t - 1].epoch.as_millis(),
            WINDOWS[t].epoch.as_millis(),
        );
        assert!(coarse.is_multiple_of(fine));
        assert!(coarse / fine <= WINDOWS[t - 1].epochs as u128);
        t += 1;
    }
};

/// A path's samples over the three windows, in bounded memory: 88 bytes
/// and its epochs' bytes (40,000 of these at 10,000 peers).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PathQuality {
    /// The finest level's newest epoch number (32 bits: 1,300 years of
    /// 10 s epochs); the other levels' follow from it.
    newest: u32,
    /// Bit `e`: epoch `e` holds raw bytes, not pairs.
    raw: u16,
    /// Each epoch's length: its bytes when raw, its pairs otherwise;
    /// window after window (see [`FIRST_EPOCH`]), each at slot
    /// `epoch % epochs`.
    lens: [u8; ALL_EPOCHS],
    /// Each epoch's lost probes, in the order of `lens`.
    lost: [u16; ALL_EPOCHS],
    /// The epochs' bytes, epoch after epoch in the order of `lens`.
    /// Exactly as long as they are: no spare capacity.
    entries: Box<[u8]>,
}

/// Where each epoch's bytes start in `entries`, and where they end.
type Offsets = [usize; ALL_EPOCHS + 1];

thread_local! {
    /// The bytes an epoch's turn keeps, gathered before they go back into
    /// the path's block: one buffer per thread, reused for every path.
    static KEPT: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Window `t`'s epoch count.
fn epochs_of(t: usize) -> u32 {
    u32::try_from(WINDOWS[t].epochs).unwrap_or(1)
}

/// The index (in `lens`) of level `t`'s epoch number `n`.
fn slot(t: usize, n: u32) -> usize {
    // The remainder is below the window's epochs, at most 10.
    FIRST_EPOCH[t] + (n % epochs_of(t)) as usize
}

/// The epochs in a mask, lowest first.
fn each_bit(mut mask: u32) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (mask != 0).then(|| {
            let e = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            e
        })
    })
}

impl PathQuality {
    /// Records one probe at `at_ms`: its RTT, or `None` when it was lost.
    pub fn record(&mut self, at_ms: u64, rtt_ns: Option<u64>) {
        self.advance(at_ms);
        let e = slot(0, self.newest);
        match rtt_ns.map(bucket) {
            None => self.lost[e] = self.lost[e].saturating_add(1),
            Some(b) => self.count(e, b),
        }
    }

    /// Level `t`'s newest epoch number.
    fn newest_of(&self, t: usize) -> u32 {
        self.newest / ratio_of(t)
    }

    fn is_raw(&self, e: usize) -> bool {
        e < RAW_EPOCHS && self.raw & (1 << e) != 0
    }

    fn set_raw(&mut self, e: usize, raw: bool) {
        if e < RAW_EPOCHS {
            if raw {
                self.raw |= 1 << e;
            } else {
                self.raw &= !(1 << e);
            }
        }
    }

    /// Epoch `e`'s bytes.
    fn bytes_of(&self, e: usize) -> usize {
        usize::from(self.lens[e]) * if self.is_raw(e) { 1 } else { 2 }
    }

    fn offsets(&self) -> Offsets {
        let mut at = [0; ALL_EPOCHS + 1];
        for e in 0..ALL_EPOCHS {
            at[e + 1] = at[e] + self.bytes_of(e);
        }
        at
    }

    /// Calls `f` with each bucket of epoch `e` and its answers.
    fn each_answer(&self, e: usize, at: &Offsets, mut f: impl FnMut(u8, u32)) {
        let held = &self.entries[at[e]..at[e + 1]];
        if self.is_raw(e) {
            for &b in held {
                f(b, 1);
            }
        } else {
            for &[b, c] in held.as_chunks::<2>().0 {
                f(b, u32::from(c));
            }
        }
    }

    /// Epoch `e`'s answers.
    fn answered(&self, e: usize, at: &Offsets) -> u64 {
        if self.is_raw(e) {
            return u64::from(self.lens[e]);
        }
        self.entries[at[e]..at[e + 1]]
            .as_chunks::<2>()
            .0
            .iter()
            .map(|&[_, c]| u64::from(c))
            .sum()
    }

    /// Calls `visit` with the epochs that make level `t`'s newest epoch:
    /// its own slot (empty above the finest level: it is not stored), and
    /// the finer levels' epochs since it began.
    fn current_parts(&self, t: usize, visit: &mut impl FnMut(usize)) {
        visit(slot(t, self.newest_of(t)));
        for level in (1..=t).rev() {
            let span = ratio_of(level) / ratio_of(level - 1);
            for n in self.newest_of(level) * span..self.newest_of(level - 1) {
                visit(slot(level - 1, n));
            }
        }
        if t > 0 {
            visit(slot(0, self.newest));
        }
    }

    /// The epochs window `t` reads at `now_ms`, as a mask of their
    /// indices: its level's epochs that started within it, the newest
    /// read from the finer levels.
    fn window_epochs(&self, t: usize, now_ms: u64) -> u32 {
        let w = WINDOWS[t];
        let now = w.epoch_of(now_ms);
        let epochs = u64::from(epochs_of(t));
        let newest = u64::from(self.newest_of(t));
        let mut mask = 0u32;
        for back in 1..epochs.min(newest + 1) {
            if newest - back + epochs > now {
                // Below `newest`, a u32.
                mask |= 1 << slot(t, (newest - back) as u32);
            }
        }
        if newest + epochs > now {
            self.current_parts(t, &mut |e| mask |= 1 << e);
        }
        mask
    }

    /// The merged answers and losses of level `t`'s newest epoch, from
    /// its parts.
    fn merged(&self, t: usize, at: &Offsets) -> (Tally, u16) {
        let mut tally = Tally::default();
        let mut lost = 0u16;
        self.current_parts(t, &mut |e| {
            lost = lost.saturating_add(self.lost[e]);
            self.each_answer(e, at, |b, c| tally.add(b, c));
        });
        (tally, lost)
    }

    /// Moves the levels to the epoch of `at_ms`: the coarser levels'
    /// newest epochs that end are sealed from the finer ones, then the
    /// slots the new epochs take are cleared (what they held has left
    /// its window). A time before the newest epoch counts in the newest
    /// (the windows' clock, [`super::clock_ms`], never steps back).
    fn advance(&mut self, at_ms: u64) {
        let epoch = u32::try_from(WINDOWS[0].epoch_of(at_ms)).unwrap_or(u32::MAX);
        if epoch <= self.newest {
            return;
        }
        let at = self.offsets();
        let mut sealed: [Option<Sealed>; WINDOWS.len()] = Default::default();
        let mut ended = [false; ALL_EPOCHS];
        for t in 0..WINDOWS.len() {
            let (old, new) = (self.newest_of(t), epoch / ratio_of(t));
            // An epoch older than its window when it ends is not sealed.
            if t > 0 && new > old && new - old < epochs_of(t) {
                let (tally, lost) = self.merged(t, &at);
                let e = slot(t, old);
                sealed[t] = Some(Sealed::new(&tally, lost, e < RAW_EPOCHS, e));
            }
            for i in 0..(new - old).min(epochs_of(t)) {
                ended[slot(t, new - i)] = true;
            }
        }
        self.newest = epoch;
        let changed = sealed.iter().any(Option::is_some)
            || ended
                .iter()
                .zip(&self.lens)
                .any(|(&gone, &n)| gone && n > 0);
        if changed {
            KEPT.with_borrow_mut(|kept| {
                kept.clear();
                for e in 0..ALL_EPOCHS {
                    if let Some(s) = sealed.iter_mut().flatten().find(|s| s.epoch == e) {
                        kept.extend_from_slice(&s.bytes);
                        (self.lens[e], self.lost[e]) = (s.len, s.lost);
                        self.set_raw(e, s.raw);
                    } else if !ended[e] {
                        kept.extend_from_slice(&self.entries[at[e]..at[e + 1]]);
                    }
                }
                // In the block that holds them now, resized where it
                // lies: a new block for every live path each 10 s landed
                // among the blocks a round frees, and left pages partly
                // used when it ended.
                let all = 0..self.entries.len();
                self.splice(all, kept);
            });
        }
        for (e, &gone) in ended.iter().enumerate() {
            if gone {
                (self.lens[e], self.lost[e]) = (0, 0);
            }
        }
    }

    /// Puts `with` in place of `entries[range]`, keeping the slice
    /// exactly sized: resized where it lies (the allocator moves it only
    /// when its block has no room, a block being 16 bytes apart from the
    /// next size), the bytes after `range` moved within it.
    fn splice(&mut self, range: std::ops::Range<usize>, with: &[u8]) {
        let mut held = std::mem::take(&mut self.entries).into_vec();
        held.reserve_exact(with.len().saturating_sub(range.len()));
        held.splice(range, with.iter().copied());
        self.entries = held.into_boxed_slice();
    }

    /// Counts an answer in bucket `b` of the finest level's epoch `e`:
    /// one more byte while it is raw (and, at 16, 32, 64 and 128 of them,
    /// pairs instead when they are smaller; at 255 always); in place
    /// where it holds pairs with the bucket and room, else in a new pair.
    fn count(&mut self, e: usize, b: u8) {
        if self.lens[e] == 0 {
            self.set_raw(e, true);
        }
        let at = self.offsets();
        let held = at[e]..at[e + 1];
        if self.is_raw(e) {
            let n = self.lens[e] + 1;
            if n == u8::MAX || (n >= 16 && n.is_power_of_two()) {
                let mut tally = Tally::default();
                tally.add(b, 1);
                for &x in &self.entries[held.clone()] {
                    tally.add(x, 1);
                }
                let s = Sealed::new(&tally, 0, n < u8::MAX, e);
                self.splice(held, &s.bytes);
                self.lens[e] = s.len;
                self.set_raw(e, s.raw);
            } else {
                self.splice(held.end..held.end, &[b]);
                self.lens[e] = n;
            }
            return;
        }
        let room = |p: &&mut [u8; 2]| p[1] < u8::MAX;
        if let Some(p) = self.entries[held.clone()]
            .as_chunks_mut::<2>()
            .0
            .iter_mut()
            .find(|p| p[0] == b && room(p))
        {
            p[1] += 1;
        } else if self.lens[e] < u8::MAX {
            self.splice(held.end..held.end, &[b, 1]);
            self.lens[e] += 1;
        } else if let Some(p) = nearest_with_room(&mut self.entries[held], b) {
            // An epoch has at most 255 pairs (255 distinct buckets fill
            // them): past that, an answer counts in the nearest bucket
            // with room (it is still an answer). Past 255 pairs of 255
            // answers each (65,025 in one epoch), an answer is not
            // counted, as a loss past a `u16` is not.
            p[1] += 1;
        }
    }

    /// The figures of window `t` at `now_ms`; `scratch` is reused across
    /// paths.
    #[must_use]
    pub fn stats(&self, t: usize, now_ms: u64, scratch: &mut Vec<(u8, u32)>) -> Quality {
        let at = self.offsets();
        scratch.clear();
        let mut lost = 0u64;
        for e in each_bit(self.window_epochs(t, now_ms)) {
            lost += u64::from(self.lost[e]);
            self.each_answer(e, &at, |b, c| scratch.push((b, c)));
        }
        scratch.sort_unstable_by_key(|&(b, _)| b);
        let answered: u64 = scratch.iter().map(|&(_, c)| u64::from(c)).sum();
        Quality::from_parts(WINDOWS[t].name, answered + lost, lost, scratch)
    }

    /// Probes and losses of window `t` at `now_ms`.
    fn counts(&self, t: usize, now_ms: u64, at: &Offsets) -> (u64, u64) {
        let (mut probes, mut lost) = (0u64, 0u64);
        for e in each_bit(self.window_epochs(t, now_ms)) {
            probes += self.answered(e, at) + u64::from(self.lost[e]);
            lost += u64::from(self.lost[e]);
        }
        (probes, lost)
    }

    /// Every window's figures at `now_ms`.
    #[must_use]
    pub fn windows(&self, now_ms: u64) -> Vec<Quality> {
        let mut scratch = Vec::new();
        (0..WINDOWS.len())
            .map(|t| self.stats(t, now_ms, &mut scratch))
            .collect()
    }

    /// Whether the path loses at least `threshold` of its probes with
    /// confidence in a window at `now_ms` (see [`super::is_degraded`]),
    /// from the windows' losses and answer counts (no percentile is made).
    #[must_use]
    pub fn is_degraded(&self, now_ms: u64, threshold: f64) -> bool {
        // Without a loss, every window's interval starts at 0.
        if threshold > 0.0 && self.lost.iter().all(|&n| n == 0) {
            return false;
        }
        let at = self.offsets();
        (0..WINDOWS.len()).any(|t| {
            let (probes, lost) = self.counts(t, now_ms, &at);
            probes >= DEGRADED_MIN_PROBES
                && wilson(lost, probes).is_some_and(|(low, _)| low >= threshold)
        })
    }

    /// Bytes held beyond the struct itself.
    #[must_use]
    pub fn heap_bytes(&self) -> usize {
        self.entries.len()
    }
}

/// An epoch's answers and losses, encoded in the smaller form it may take.
#[derive(Debug, Default)]
struct Sealed {
    /// Its index in `lens`.
    epoch: usize,
    bytes: Vec<u8>,
    len: u8,
    raw: bool,
    lost: u16,
}

/// The pair (in `pairs`) nearest bucket `b` whose count has room: where
/// an answer goes once an epoch's 255 pairs are taken.
fn nearest_with_room(pairs: &mut [u8], b: u8) -> Option<&mut [u8; 2]> {
    pairs
        .as_chunks_mut::<2>()
        .0
        .iter_mut()
        .filter(|p| p[1] < u8::MAX)
        .min_by_key(|p| p[0].abs_diff(b))
}

/// Answers per bucket, with the range of buckets that have any.
struct Tally {
    counts: [u32; 256],
    lo: u8,
    hi: u8,
    answers: u32,
}

impl Default for Tally {
    fn default() -> Self {
        Self {
            counts: [0; 256],
            lo: u8::MAX,
            hi: 0,
            answers: 0,
        }
    }
}

impl Tally {
    fn add(&mut self, b: u8, c: u32) {
        self.counts[usize::from(b)] += c;
        self.answers += c;
        self.lo = self.lo.min(b);
        self.hi = self.hi.max(b);
    }

    /// The buckets from the lowest with answers to the highest, and
    /// their answers.
    fn buckets(&self) -> impl Iterator<Item = (u8, u32)> + '_ {
        (self.lo..=self.hi)
            .zip(&self.counts[usize::from(self.lo)..])
            .map(|(b, &c)| (b, c))
            .filter(|&(_, c)| c > 0)
    }
}

impl Sealed {
    /// Encodes a tally raw when `raw_ok` and that is no larger, as pairs
    /// otherwise: at most 255 of them, answers past that in the nearest
    /// pair with room, past 65,025 not counted.
    fn new(tally: &Tally, lost: u16, raw_ok: bool, epoch: usize) -> Self {
        let pairs: u32 = tally.buckets().map(|(_, c)| c.div_ceil(255)).sum();
        let mut bytes = Vec::new();
        if let (true, Ok(len)) = (
            raw_ok && tally.answers <= 2 * pairs,
            u8::try_from(tally.answers),
        ) {
            for (b, c) in tally.buckets() {
                bytes.extend(std::iter::repeat_n(b, c as usize));
            }
            return Self {
                epoch,
                bytes,
                len,
                raw: true,
                lost,
            };
        }
        let mut len = 0u8;
        let mut left = Vec::new();
        for (b, mut c) in tally.buckets() {
            while c > 0 && len < u8::MAX {
                let n = u8::try_from(c).unwrap_or(u8::MAX);
                bytes.extend_from_slice(&[b, n]);
                c -= u32::from(n);
                len += 1;
            }
            if c > 0 {
                left.push((b, c));
            }
        }
        for (b, mut c) in left {
            while c > 0 {
                let Some(p) = nearest_with_room(&mut bytes, b) else {
                    break;
                };
                let n = c.min(u32::from(u8::MAX - p[1]));
                p[1] += n as u8;
                c -= n;
            }
        }
        Self {
            epoch,
            bytes,
            len,
            raw: false,
            lost,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{
        super::{Quality, WINDOWS, bucket, bucket_value, is_degraded},
        PathQuality,
    };

    const SEC: u64 = 1000;

    #[test]
    fn an_epochs_turn_keeps_the_path_in_its_block() {
        let mut q = PathQuality::default();
        q.record(0, Some(1_000_000));
        q.record(SEC, Some(1_000_000));
        let block = q.entries.as_ptr();
        // A minute on, the first 10 s leave the minute's window and are
        // sealed into the 10 minutes': as many bytes as before, in the same
        // block (a new one for every live path at every turn scattered
        // them over the pages a round frees).
        q.record(60 * SEC, None);
        assert_eq!(q.heap_bytes(), 2);
        assert_eq!(q.entries.as_ptr(), block);
        assert_eq!(q.stats(1, 60 * SEC, &mut Vec::new()).probes, 3);
    }

    /// The bytes a path's histograms hold after `hours` of probes every
    /// `interval_ms`, its RTTs spread evenly (in log scale) over a factor
    /// of `spread` from 100 µs.
    fn held_after(hours: u64, interval_ms: u64, spread: f64) -> usize {
        let mut p = PathQuality::default();
        let mut rng = fastrand::Rng::with_seed(7);
        let mut t = 0;
        while t < hours * 3600 * SEC {
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "at most 100 µs times the spread"
            )]
            let rtt = (100_000.0 * spread.powf(rng.f64())) as u64;
            p.record(t, Some(rtt));
            t += interval_ms;
        }
        p.heap_bytes()
    }

    fn all(p: &PathQuality, now: u64) -> Vec<Quality> {
        let mut s = Vec::new();
        (0..WINDOWS.len())
            .map(|t| p.stats(t, now, &mut s))
            .collect()
    }

    #[test]
    fn a_bucket_past_255_answers_in_an_epoch_takes_more_pairs_and_loses_none() {
        let mut p = PathQuality::default();
        // 600 answers in one 10 s epoch, all in one bucket: raw up to
        // 255, then pairs of 255, 255 and 90, in that epoch only.
        for i in 0..600u64 {
            p.record(i * 10, Some(100_000));
        }
        assert_eq!(p.heap_bytes(), 3 * 2);
        for q in all(&p, 6 * SEC) {
            assert_eq!(q.probes, 600, "{q:?}");
            assert_eq!(q.rtt_p999_ns, None, "600 answers are too few for p99.9");
            assert_eq!(q.rtt_p99_ns, Some(bucket_value(bucket(100_000))));
        }
        // Sealed into the minute and the 10 minutes, they are still 600.
        p.record(11 * 60 * SEC, None);
        let later = all(&p, 11 * 60 * SEC);
        assert_eq!((later[2].probes, later[2].lost), (601, 1), "{later:?}");
        assert_eq!(later[1].probes, 1, "{later:?}");
    }

    #[test]
    fn an_epoch_with_every_bucket_counts_every_answer() {
        let mut p = PathQuality::default();
        // 256 answers in one 10 s epoch, one in each bucket: the last
        // finds the epoch's 255 pairs taken and counts in the nearest.
        for b in 0..=u8::MAX {
            p.record(u64::from(b), Some(bucket_value(b)));
        }
        for q in all(&p, SEC) {
            assert_eq!((q.probes, q.lost), (256, 0), "{q:?}");
        }
        assert_eq!(p.heap_bytes(), 2 * 255);
        // Sealed into the hour, still every answer.
        p.record(20 * 60 * SEC, None);
        let later = all(&p, 20 * 60 * SEC);
        assert_eq!((later[2].probes, later[2].lost), (257, 1), "{later:?}");
    }

    /// What a live path's epochs come to once every window is full, and
    /// that they stay there: at 10,000 peers (40,000 paths) these bytes
    /// times 40,000 are the largest part of the agent's heap.
    #[test]
    fn a_steady_path_holds_a_bounded_histogram() {
        for (interval_ms, spread, most) in [
            (60 * SEC, 3.0, 100),
            (5 * SEC, 1.3, 160),
            (5 * SEC, 3.0, 300),
            (5 * SEC, 30.0, 600),
            (SEC, 3.0, 512),
        ] {
            let (one, three) = (
                held_after(1, interval_ms, spread),
                held_after(3, interval_ms, spread),
            );
            assert!(
                three <= most,
                "{interval_ms} ms, spread {spread}: {three} B"
            );
            assert!(
                three <= one * 5 / 4,
                "grows after the first hour: {one} -> {three}"
            );
        }
    }

    /// A probe is recorded in its 10 s epoch only: its minute and its
    /// 10 minutes hold it once they end, and are read from the shorter
    /// epochs until then. Within the hour's first 10 minutes, what is
    /// held is at most the answers of the last 10 minutes and of the
    /// last minute, a byte each while bytes are smaller.
    #[test]
    fn a_windows_newest_epoch_is_read_not_stored() {
        let mut p = PathQuality::default();
        let mut rng = fastrand::Rng::with_seed(11);
        // 9 minutes at 5 s, RTTs over a factor of 30: about one bucket
        // an answer.
        let mut t = 0;
        while t < 9 * 60 * SEC {
            p.record(t, Some(100_000 + rng.u64(0..2_900_000)));
            t += 5 * SEC;
        }
        let w = all(&p, t);
        assert_eq!(w[2].probes, 108, "{w:?}");
        let bound = usize::try_from(w[1].probes + w[0].probes).unwrap_or(usize::MAX);
        assert!(p.heap_bytes() <= bound, "{} > {bound}", p.heap_bytes());
    }

    /// The windows read the figures a list of every sample would give:
    /// the samples whose epoch (of the window's length) started within
    /// the window, through sealing, gaps longer than the windows, losses
    /// and rates from one probe a minute to ten a second.
    #[test]
    fn the_windows_read_what_the_samples_say() {
        let mut rng = fastrand::Rng::with_seed(5);
        let mut p = PathQuality::default();
        let mut samples: Vec<(u64, Option<u8>)> = Vec::new();
        let mut t = 1_000 * SEC;
        let mut scratch = Vec::new();
        for step in 0..20_000u32 {
            // Mostly steady, now and then a pause of up to 2 hours.
            t += match rng.u32(0..1000) {
                0 => rng.u64(0..7_200 * SEC),
                1..=50 => rng.u64(0..60 * SEC),
                _ => rng.u64(0..2 * SEC),
            };
            let spread = rng.u64(1..5_000_000);
            let rtt = (rng.u32(0..10) != 0).then(|| 20_000 + rng.u64(0..spread));
            p.record(t, rtt);
            samples.push((t, rtt.map(bucket)));
            if step % 97 != 0 {
                continue;
            }
            let now = t + rng.u64(0..3_600 * SEC);
            for (k, w) in WINDOWS.iter().enumerate() {
                let (n, len) = (w.epoch_of(now), w.epochs as u64);
                let mut counts = [0u32; 256];
                let mut lost = 0;
                for &(at, b) in &samples {
                    if w.epoch_of(at) + len > n {
                        match b {
                            Some(b) => counts[usize::from(b)] += 1,
                            None => lost += 1,
                        }
                    }
                }
                let sorted: Vec<(u8, u32)> =
                    (0..=u8::MAX).zip(counts).filter(|&(_, c)| c > 0).collect();
                let answered: u64 = sorted.iter().map(|&(_, c)| u64::from(c)).sum();
                let want = Quality::from_parts(w.name, answered + lost, lost, &sorted);
                assert_eq!(
                    p.stats(k, now, &mut scratch),
                    want,
                    "window {} at {now}",
                    w.name
                );
            }
            // Samples older than the longest window no longer count.
            samples.retain(|&(at, _)| at + 2 * 3_600 * SEC > t);
        }
    }

    #[test]
    fn percentiles_need_enough_samples_and_read_the_right_rank() {
        let mut p = PathQuality::default();
        // 99 probes at 100 µs, one at 10 ms, 1 s apart.
        for i in 0..100u64 {
            let rtt = if i == 50 { 10_000_000 } else { 100_000 };
            p.record(1_000_000 + i * SEC, Some(rtt));
        }
        let q = &all(&p, 1_000_000 + 100 * SEC)[1];
        assert_eq!((q.probes, q.lost), (100, 0));
        let near = |v: Option<u64>, want: u64| {
            let v = v.expect("shown");
            #[expect(clippy::cast_precision_loss, reason = "test values")]
            let err = (v as f64 - want as f64).abs() / want as f64;
            err < 0.04
        };
        assert!(near(q.rtt_p50_ns, 100_000), "{q:?}");
        assert!(near(q.rtt_p90_ns, 100_000), "{q:?}");
        assert!(near(q.rtt_p99_ns, 100_000), "{q:?}");
        assert_eq!(q.rtt_p999_ns, None, "1,000 samples needed");
        // The 1-minute window holds about the last 60 to 70.
        let m = &all(&p, 1_000_000 + 100 * SEC)[0];
        assert!((50..=70).contains(&m.probes), "{m:?}");
        assert_eq!(m.rtt_p99_ns, None, "{m:?}");
    }

    #[test]
    fn loss_is_counted_per_window_and_old_epochs_leave() {
        let mut p = PathQuality::default();
        let t0 = 7_000_000;
        // 10 minutes at 1 s with every 20th probe lost: 5 %.
        for i in 0..600u64 {
            let rtt = (i % 20 != 0).then_some(50_000);
            p.record(t0 + i * SEC, rtt);
        }
        let now = t0 + 600 * SEC;
        let w = all(&p, now);
        let ten = &w[1];
        assert!(ten.probes >= 540, "{ten:?}");
        let r = ten.loss_ratio.expect("probes");
        assert!((0.04..=0.06).contains(&r), "{ten:?}");
        assert!(is_degraded(&w, 0.01));
        assert!(!is_degraded(&w, 0.10));
        // An hour later with no probes, every window is empty.
        let later = all(&p, now + 3_700 * SEC);
        assert!(later.iter().all(|q| q.probes == 0), "{later:?}");
        // And new probes after the gap are counted alone.
        p.record(now + 3_700 * SEC, Some(60_000));
        let fresh = all(&p, now + 3_700 * SEC);
        assert!(
            fresh.iter().all(|q| q.probes == 1 && q.lost == 0),
            "{fresh:?}"
        );
    }

    #[test]
    fn one_unlucky_probe_is_not_degraded() {
        let mut p = PathQuality::default();
        let t0 = 3_600_000;
        // One hour at the 60 s default, one probe lost.
        for i in 0..60u64 {
            p.record(t0 + i * 60 * SEC, (i != 30).then_some(80_000));
        }
        let w = all(&p, t0 + 60 * 60 * SEC);
        assert!(!is_degraded(&w, 0.01), "{w:?}");
        // Three of the hour's probes lost (5 %) is.
        let mut p = PathQuality::default();
        for i in 0..60u64 {
            p.record(t0 + i * 60 * SEC, (i % 20 != 0).then_some(80_000));
        }
        let w = all(&p, t0 + 60 * 60 * SEC);
        assert!(is_degraded(&w, 0.01), "{w:?}");
    }

    #[test]
    fn memory_is_bounded_whatever_the_rate() {
        let mut p = PathQuality::default();
        // Two hours at 10 probes a second with RTTs over a wide spread.
        let mut x = 12_345u64;
        for i in 0..72_000u64 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let rtt = 20_000 + (x >> 40) % 200_000;
            p.record(i * 100, Some(rtt));
        }
        // 22 epochs, each with at most a pair for each bucket 20-220 µs
        // spans (about 32), and one more for each 255 samples of a bucket.
        assert!(
            p.heap_bytes() <= 2 * (22 * 34 + 72_000 / 255),
            "{}",
            p.heap_bytes()
        );
        assert!(p.heap_bytes() < 16 * 1024, "{}", p.heap_bytes());
    }

    #[test]
    fn a_steady_path_at_the_default_interval_is_small() {
        let mut p = PathQuality::default();
        for i in 0..120u64 {
            p.record(i * 60 * SEC, Some(100_000 + (i % 3) * 1_000));
        }
        assert_eq!(size_of::<PathQuality>(), 88, "the counts and epochs");
        let bytes = size_of::<PathQuality>() + p.heap_bytes();
        // 40,000 paths (10,000 peers, four paths each) under 16 MiB.
        assert!(bytes * 40_000 < 16 << 20, "{bytes} bytes a path");
    }
}
