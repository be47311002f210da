//! The order a round starts its probes in: longest first.
//!
//! A probe to a silent peer lasts the whole timeout, one to a live peer a
//! round trip, and the round ends when its last probe does. When starting
//! the probes is what takes time (tens of thousands of connects and
//! echoes on a busy CPU), a round that starts its live probes first ends
//! a timeout after its last silent one started, late in the issue; one
//! that starts its silent probes first ends a timeout after the middle of
//! it.
//!
//! Which peers are silent is not known until their probes fail, but two
//! hints come cheap: a path whose last probe failed (the round before),
//! and this round's echo to the same address, which goes out first (the
//! ICMP engine sends a request for a fraction of a connect's cost). So
//! each engine starts first the targets whose path of its own protocol
//! failed last round ([`Suspects`]). Then an HTTP task starts each other
//! probe once its address's echo has
//! been out for a short grace: started then if no reply came (likely
//! silent), put off to the end if one did. A probe whose echo is not out
//! yet waits for it, but never past the round's patience (an ICMP engine
//! that stalled holds nothing up for long). The probes put off (peers
//! known alive) wait too, to the end: a connect to a live peer (its
//! handshake, its request, its answer) started while a probe waits for
//! its echo would take CPU from the echoes and the silent probes that the
//! round's end waits for, and its own result comes in a round trip
//! whenever it starts. In an agent's first round, when no path has
//! failed yet, this is what puts the silent probes ahead of the live
//! ones: at 5,000 peers, half of them silent, the last silent probe
//! started 150-220 ms into the round, where it started 290-580 ms in
//! when the live ones it met first went first; at 10,000 peers on 2
//! CPUs, 270-312 ms in, against 299-364 ms when live probes started
//! while the next one waited out its echo's grace.
//!
//! Every probe still gets its whole timeout from its own connect or
//! request (kubelet's semantics): the order changes when probes start,
//! never how they count.

use std::{
    collections::VecDeque,
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use tokio::time::Instant;

use super::pace;

/// A target's echo request not sent yet.
const NOT_SENT: u32 = 0;
/// A target's echo answered (the largest state: `fetch_max` keeps it).
const ANSWERED: u32 = u32::MAX;

/// The grace an echo gets to come back before its address's HTTP probe
/// starts anyway: a hundredth of the timeout, from 1 to 10 ms (a reply
/// later than that only loses its probe its place in the order).
#[must_use]
pub fn echo_grace(timeout: Duration) -> Duration {
    (timeout / 100).clamp(Duration::from_millis(1), Duration::from_millis(10))
}

/// What became of each of a round's echo requests so far: the ICMP engine
/// marks them as they are sent and answered, the HTTP tasks read them.
/// One word per target: 0 not sent, `u32::MAX` answered, otherwise the
/// microseconds from `t0` to its sending, plus one.
#[derive(Debug)]
pub struct Echoes {
    t0: Instant,
    grace: Duration,
    /// No probe waits for its echo past this.
    give_up: Instant,
    states: Box<[AtomicU32]>,
}

/// When a target's HTTP probe may start, as its echo stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// Now: its echo went unanswered for the grace (or will never go).
    Now,
    /// Not before this: its echo may still come back (or is not out).
    At(Instant),
    /// Its echo came back: the peer is alive, the probe can go last.
    Answered,
}

impl Echoes {
    /// `n` targets whose echo requests are still to be sent; a probe waits
    /// for its echo `grace` after the request, and for none after
    /// `patience` from now.
    #[must_use]
    pub fn new(n: usize, grace: Duration, patience: Duration) -> Self {
        let t0 = Instant::now();
        Self {
            t0,
            grace,
            give_up: t0 + patience,
            states: (0..n).map(|_| AtomicU32::new(NOT_SENT)).collect(),
        }
    }

    /// `n` targets to which no echo goes: every probe may start at once
    /// (the HTTP engine's tests, which run no ICMP engine).
    #[cfg(test)]
    #[must_use]
    pub fn without(n: usize) -> Self {
        Self::new(n, Duration::ZERO, Duration::ZERO)
    }

    fn raise(&self, i: usize, state: u32) {
        if let Some(s) = self.states.get(i) {
            s.fetch_max(state, Ordering::Relaxed);
        }
    }

    /// Target `i`'s request went out at `at` (out of range: ignored).
    pub fn sent(&self, i: usize, at: Instant) {
        let us = at.saturating_duration_since(self.t0).as_micros();
        self.raise(i, u32::try_from(us).unwrap_or(ANSWERED - 2) + 1);
    }

    /// Target `i`'s request could not be sent: nothing to wait for.
    pub fn gave_up(&self, i: usize) {
        self.raise(i, 1);
    }

    /// Target `i` answered.
    pub fn answered(&self, i: usize) {
        self.raise(i, ANSWERED);
    }

    /// Whether target `i`'s request went out (or could not).
    #[cfg(test)]
    #[must_use]
    pub fn is_sent(&self, i: usize) -> bool {
        self.state(i) != NOT_SENT
    }

    /// Whether target `i` has answered.
    #[cfg(test)]
    #[must_use]
    pub fn is_answered(&self, i: usize) -> bool {
        self.state(i) == ANSWERED
    }

    fn state(&self, i: usize) -> u32 {
        self.states
            .get(i)
            .map_or(ANSWERED, |s| s.load(Ordering::Relaxed))
    }

    /// When target `i`'s HTTP probe may start, seen at `now`.
    #[must_use]
    pub fn due(&self, i: usize, now: Instant) -> Due {
        match self.state(i) {
            ANSWERED => Due::Answered,
            _ if now >= self.give_up => Due::Now,
            // Not sent yet: looked at again a pacing slice later.
            NOT_SENT => Due::At((now + pace::SLICE).min(self.give_up)),
            sent => {
                let due = self.t0 + Duration::from_micros(u64::from(sent - 1)) + self.grace;
                if due <= now {
                    Due::Now
                } else {
                    Due::At(due.min(self.give_up))
                }
            }
        }
    }
}

/// One task's probes (target indices) in the order they start: the
/// `suspects` first as given, then the rest as given, each once its echo
/// is due, except that any whose echo has come back is put off to the
/// end.
#[derive(Debug)]
pub struct IssueOrder {
    mine: Vec<usize>,
    suspects: usize,
    next: usize,
    later: VecDeque<usize>,
    /// Until when the next probe waits for its echo, when it does.
    waits_until: Option<Instant>,
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
            waits_until: None,
        }
    }

    /// The probe to start at `now`, given the echoes so far: `None` when
    /// every probe is started, or when the next one waits for its echo
    /// (then [`Self::waits_until`] says until when).
    pub fn next(&mut self, echoes: &Echoes, now: Instant) -> Option<usize> {
        self.waits_until = None;
        while let Some(&i) = self.mine.get(self.next) {
            if self.next < self.suspects {
                self.next += 1;
                return Some(i);
            }
            match echoes.due(i, now) {
                Due::Now => {
                    self.next += 1;
                    return Some(i);
                }
                // Peers known alive wait too: the CPU is the echoes' and
                // the likely silent probes'.
                Due::At(t) => {
                    self.waits_until = Some(t);
                    return None;
                }
                Due::Answered => {
                    self.next += 1;
                    self.later.push_back(i);
                }
            }
        }
        self.later.pop_front()
    }

    /// Until when the next probe waits for its echo, when the last
    /// [`Self::next`] found it waiting.
    #[must_use]
    pub const fn waits_until(&self) -> Option<Instant> {
        self.waits_until
    }
}

/// What failed of a target's paths in its last round.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Failed {
    pub icmp: bool,
    pub http: bool,
}

/// A round's targets in one order for both engines, in one buffer: those
/// whose echo failed last round and not their HTTP probe, those whose
/// echo and HTTP probe failed, those whose HTTP probe alone failed, then
/// the rest, each group in index order. The ICMP engine sends in this
/// order: the targets that failed it first, then those that failed the
/// HTTP engine alone. The HTTP engine starts from the second group on and
/// comes round to the first at the end: the targets that failed it
/// first, and those whose echo alone failed (a host that filters echoes,
/// its server answering) last. A host that filters echoes, or one whose
/// server is down, is not taken for a node that is down by the engine
/// it answers.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Suspects {
    order: Vec<usize>,
    icmp_only: usize,
    both: usize,
    http_only: usize,
}

impl Suspects {
    /// Targets `0..n`, each as `failed` says it fared last round.
    pub fn of(n: usize, failed: impl Fn(usize) -> Failed) -> Self {
        let group = |i: usize| match failed(i) {
            Failed {
                icmp: true,
                http: false,
            } => 0,
            Failed {
                icmp: true,
                http: true,
            } => 1,
            Failed {
                icmp: false,
                http: true,
            } => 2,
            Failed {
                icmp: false,
                http: false,
            } => 3,
        };
        // A counting sort: one pass to count, one to place, stable.
        let mut counts = [0usize; 4];
        for i in 0..n {
            counts[group(i)] += 1;
        }
        let mut at = [0, counts[0], counts[0] + counts[1], n - counts[3]];
        let mut order = vec![0; n];
        for i in 0..n {
            let g = group(i);
            order[at[g]] = i;
            at[g] += 1;
        }
        Self {
            order,
            icmp_only: counts[0],
            both: counts[1],
            http_only: counts[2],
        }
    }

    /// The ICMP engine's order.
    #[must_use]
    pub fn icmp(&self) -> &[usize] {
        &self.order
    }

    /// The targets that failed the ICMP engine: the first this many of
    /// its order.
    #[cfg(test)]
    #[must_use]
    pub const fn icmp_suspects(&self) -> usize {
        self.icmp_only + self.both
    }

    /// The HTTP engine's order.
    pub fn http(&self) -> impl Iterator<Item = usize> + Clone + '_ {
        let (echo_only, rest) = self.order.split_at(self.icmp_only);
        rest.iter().chain(echo_only).copied()
    }

    /// The HTTP engine's suspects, started without waiting for their
    /// echoes: the first this many of its order.
    #[must_use]
    pub const fn http_suspects(&self) -> usize {
        self.both + self.http_only
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Every probe started from `order`, at `now`, until it must wait
    /// (and until when) or is done.
    fn drain(
        order: &mut IssueOrder,
        echoes: &Echoes,
        now: Instant,
    ) -> (Vec<usize>, Option<Instant>) {
        let started = std::iter::from_fn(|| order.next(echoes, now)).collect();
        (started, order.waits_until())
    }

    #[test]
    fn states_are_kept_per_target_and_an_answer_sticks() {
        let e = Echoes::new(130, ms(10), ms(500));
        let t0 = e.t0;
        e.sent(0, t0 + ms(2));
        e.answered(0);
        e.sent(0, t0 + ms(9)); // late: the answer stays
        e.sent(129, t0 + ms(4));
        e.answered(130); // past the end: ignored
        assert!(e.is_answered(0));
        assert!(!e.is_answered(129) && !e.is_answered(1));
        assert_eq!(e.due(0, t0), Due::Answered);
        assert_eq!(e.due(129, t0 + ms(5)), Due::At(t0 + ms(14)));
        assert_eq!(e.due(129, t0 + ms(14)), Due::Now);
    }

    #[test]
    fn a_probe_waits_for_its_echo_within_the_grace_and_the_patience() {
        let e = Echoes::new(3, ms(10), ms(100));
        let t0 = e.t0;
        // Not sent: looked at again a slice later.
        assert_eq!(e.due(0, t0 + ms(1)), Due::At(t0 + ms(1) + pace::SLICE));
        e.sent(0, t0 + ms(3));
        assert_eq!(e.due(0, t0 + ms(4)), Due::At(t0 + ms(13)));
        assert_eq!(e.due(0, t0 + ms(13)), Due::Now);
        // A request that could not be sent holds nothing up past its grace.
        e.gave_up(1);
        assert_eq!(e.due(1, t0 + ms(10)), Due::Now);
        // Near the patience's end, no wait goes past it; after it, none.
        e.sent(2, t0 + ms(95));
        assert_eq!(e.due(2, t0 + ms(96)), Due::At(t0 + ms(100)));
        assert_eq!(e.due(2, t0 + ms(100)), Due::Now);
        assert_eq!(
            Echoes::new(1, ms(10), ms(100)).due(0, t0 + ms(200)),
            Due::Now
        );
        // No echo at all: every probe starts at once.
        let none = Echoes::without(2);
        assert_eq!(none.due(1, none.t0), Due::Now);
    }

    #[test]
    fn grace_is_a_hundredth_of_the_timeout_within_bounds() {
        assert_eq!(echo_grace(Duration::from_secs(1)), ms(10));
        assert_eq!(echo_grace(ms(500)), ms(5));
        assert_eq!(echo_grace(ms(50)), ms(1));
        assert_eq!(echo_grace(Duration::from_secs(30)), ms(10));
    }

    #[test]
    fn each_engine_starts_with_the_targets_that_failed_it() {
        // 1 and 5 failed their echo, 3 both, 2 and 6 their HTTP probe.
        let failed = |i| Failed {
            icmp: matches!(i, 1 | 3 | 5),
            http: matches!(i, 2 | 3 | 6),
        };
        let s = Suspects::of(8, failed);
        assert_eq!(s.icmp(), [1, 5, 3, 2, 6, 0, 4, 7]);
        assert_eq!(s.icmp_suspects(), 3);
        assert_eq!(s.http().collect::<Vec<_>>(), [3, 2, 6, 0, 4, 7, 1, 5]);
        assert_eq!(s.http_suspects(), 3);
        let none = Suspects::of(3, |_| Failed::default());
        assert_eq!(none.icmp(), [0, 1, 2]);
        assert_eq!(none.http().collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!((none.icmp_suspects(), none.http_suspects()), (0, 0));
        let all = Suspects::of(2, |_| Failed {
            icmp: true,
            http: true,
        });
        assert_eq!((all.icmp_suspects(), all.http_suspects()), (2, 2));
    }

    #[test]
    fn probes_wait_for_their_echo_and_answered_ones_go_last() {
        let e = Echoes::new(6, ms(10), ms(500));
        let t0 = e.t0;
        let mut order = IssueOrder::new(vec![0, 1, 2, 3, 4, 5], 0);
        // Nothing sent yet: the first probe waits for its echo.
        assert_eq!(drain(&mut order, &e, t0), (vec![], Some(t0 + pace::SLICE)));
        for i in 0..4 {
            e.sent(i, t0 + ms(1));
        }
        e.answered(1);
        e.answered(3);
        // 0 and 2 are sent, not answered, not yet due.
        assert_eq!(
            drain(&mut order, &e, t0 + ms(5)),
            (vec![], Some(t0 + ms(11)))
        );
        // Due: 0 and 2 start, 1 and 3 are put off; 4's echo is not out
        // yet, and no peer known alive takes the CPU meanwhile.
        assert_eq!(
            drain(&mut order, &e, t0 + ms(11)),
            (vec![0, 2], Some(t0 + ms(11) + pace::SLICE))
        );
        // 4's echo is out: nor while it waits out its grace.
        e.sent(4, t0 + ms(12));
        assert_eq!(
            drain(&mut order, &e, t0 + ms(15)),
            (vec![], Some(t0 + ms(22)))
        );
        e.gave_up(5);
        e.sent(6, t0 + ms(12)); // past the end: ignored
        assert_eq!(
            drain(&mut order, &e, t0 + ms(22)),
            (vec![4, 5, 1, 3], None),
            "the peers known alive last"
        );
    }

    #[test]
    fn suspects_start_first_even_when_their_echo_came_back() {
        // 3 answers echo but its HTTP failed last round: its server may be
        // the one thing down, so it is started first all the same, and so
        // is 1, whose echo is not even out.
        let e = Echoes::new(5, ms(10), ms(500));
        let t0 = e.t0;
        e.answered(3);
        for i in [0, 2, 4] {
            e.sent(i, t0);
        }
        e.answered(0);
        let mut order = IssueOrder::new(vec![3, 1, 0, 2, 4], 2);
        assert_eq!(
            drain(&mut order, &e, t0 + ms(10)),
            (vec![3, 1, 2, 4, 0], None)
        );
    }

    #[test]
    fn past_the_patience_nothing_waits_for_an_echo() {
        // An ICMP engine that stopped sending holds the probes up only
        // until the patience runs out; then they start in their order.
        let e = Echoes::new(3, ms(10), ms(100));
        let t0 = e.t0;
        let mut order = IssueOrder::new(vec![0, 1, 2], 0);
        assert_eq!(order.next(&e, t0 + ms(99)), None);
        assert!(order.waits_until().is_some());
        assert_eq!(drain(&mut order, &e, t0 + ms(100)), (vec![0, 1, 2], None));
    }
}
