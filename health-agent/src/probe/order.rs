//! The order a round starts its HTTP probes in: longest first.
//!
//! A probe to a silent peer lasts the whole timeout, one to a live peer a
//! round trip, and the round ends when its last probe does. When starting
//! the probes is what takes time (tens of thousands of connects on a busy
//! CPU), a round that starts its live probes first ends a timeout after
//! its last silent one started, late in the issue; one that starts its
//! silent probes first ends a timeout after the middle of it.
//!
//! Which peers are silent is not known until their probes fail, but two
//! hints come cheap: a path whose last probe failed (the round before),
//! and this round's echo, whose replies come back while the connects are
//! still being issued. So a task starts first the probes whose path failed
//! last, then those whose target has not answered this round's echo, and
//! last those whose echo came back (put off as they are reached). Every
//! probe still gets its whole timeout from its own connect (kubelet's
//! semantics): the order changes when probes start, never how they count.

use std::{
    collections::VecDeque,
    sync::atomic::{AtomicU64, Ordering},
};

/// Which of a round's targets have answered its echo so far: the ICMP
/// engine marks them as the replies come, the HTTP tasks read them.
#[derive(Debug)]
pub struct Echoed {
    words: Box<[AtomicU64]>,
}

impl Echoed {
    /// None of `n` targets answered yet.
    #[must_use]
    pub fn new(n: usize) -> Self {
        Self {
            words: (0..n.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Target `i` answered (out of range: ignored).
    pub fn mark(&self, i: usize) {
        if let Some(w) = self.words.get(i / 64) {
            w.fetch_or(1 << (i % 64), Ordering::Relaxed);
        }
    }

    /// Whether target `i` has answered.
    #[must_use]
    pub fn get(&self, i: usize) -> bool {
        self.words
            .get(i / 64)
            .is_some_and(|w| w.load(Ordering::Relaxed) & (1 << (i % 64)) != 0)
    }
}

/// One task's probes (target indices) in the order they start: the
/// `suspects` first as given, then the rest as given except that any
/// whose echo has come back when it is reached is put off to the end.
#[derive(Debug)]
pub struct IssueOrder {
    mine: Vec<usize>,
    suspects: usize,
    next: usize,
    later: VecDeque<usize>,
}

impl IssueOrder {
    /// `mine` with its first `suspects` entries started first.
    #[must_use]
    pub fn new(mine: Vec<usize>, suspects: usize) -> Self {
        Self {
            suspects: suspects.min(mine.len()),
            mine,
            next: 0,
            later: VecDeque::new(),
        }
    }

    /// The probe to start now, given the echoes answered so far.
    pub fn next(&mut self, echoed: &Echoed) -> Option<usize> {
        while let Some(&i) = self.mine.get(self.next) {
            self.next += 1;
            if self.next <= self.suspects || !echoed.get(i) {
                return Some(i);
            }
            self.later.push_back(i);
        }
        self.later.pop_front()
    }
}

/// Target indices `0..n` with those `suspect` says first (each group in
/// index order), and how many those are.
pub fn suspects_first(n: usize, suspect: impl Fn(usize) -> bool) -> (Vec<usize>, usize) {
    let mut order: Vec<usize> = (0..n).filter(|&i| suspect(i)).collect();
    let suspects = order.len();
    order.extend((0..n).filter(|&i| !suspect(i)));
    (order, suspects)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(order: &mut IssueOrder, echoed: &Echoed) -> Vec<usize> {
        std::iter::from_fn(|| order.next(echoed)).collect()
    }

    #[test]
    fn marks_are_kept_per_target_across_words() {
        let e = Echoed::new(128);
        for i in [0, 63, 64, 127] {
            e.mark(i);
        }
        e.mark(128); // past the end: ignored
        let marked: Vec<usize> = (0..130).filter(|&i| e.get(i)).collect();
        assert_eq!(marked, [0, 63, 64, 127]);
    }

    #[test]
    fn suspects_go_first_then_the_rest_each_in_their_order() {
        let (order, suspects) = suspects_first(7, |i| i % 3 == 1);
        assert_eq!(order, [1, 4, 0, 2, 3, 5, 6]);
        assert_eq!(suspects, 2);
        assert_eq!(suspects_first(3, |_| false), (vec![0, 1, 2], 0));
    }

    #[test]
    fn targets_that_answered_echo_are_put_off_to_the_end() {
        let echoed = Echoed::new(6);
        echoed.mark(1);
        echoed.mark(3);
        let mut order = IssueOrder::new(vec![0, 1, 2, 3, 4, 5], 0);
        assert_eq!(drain(&mut order, &echoed), [0, 2, 4, 5, 1, 3]);
    }

    #[test]
    fn suspects_start_first_even_when_their_echo_came_back() {
        // 3 answers echo but its HTTP failed last round: its server may be
        // the one thing down, so it is started first all the same.
        let echoed = Echoed::new(5);
        echoed.mark(3);
        echoed.mark(0);
        let mut order = IssueOrder::new(vec![3, 1, 0, 2, 4], 2);
        assert_eq!(drain(&mut order, &echoed), [3, 1, 2, 4, 0]);
    }

    #[test]
    fn echoes_that_come_while_probes_start_put_off_the_rest() {
        let echoed = Echoed::new(4);
        let mut order = IssueOrder::new(vec![0, 1, 2, 3], 0);
        assert_eq!(order.next(&echoed), Some(0));
        echoed.mark(0);
        echoed.mark(1);
        echoed.mark(3);
        assert_eq!(drain(&mut order, &echoed), [2, 1, 3]);
        assert!(order.next(&echoed).is_none());
    }
}
