//! The CT collector walked in slices, and the RTT loss sweep.
//!
//! A pass of the CT collector over the map of a 5,000-peer node (over
//! 100,000 entries at a 2.5 s probe interval) takes about 50 ms of CPU;
//! taken in one go it lands on one probe round. Here a pass starts at most
//! once per interval and walks a slice at each tick of `interval / SLICES`:
//! each slice reads about a `1 / SLICES` share of the map's size (not its
//! fill), so a full map takes about the interval (a little more with the
//! entries added during the pass) and a near-empty one a single tick. A
//! slice holds nothing when it ends. The loss sweep (about 30 ms there)
//! runs whole at the pass's start: in slices it would hold the losses it
//! found across the pass, half a megabyte at 5,000 peers.
//!
//! A walk costs the map's size, not its fill (the kernel visits every
//! bucket: 1,048,576 of them for 8 flows at the default `--max-peers`), so
//! a pass leaves the CT and NAT maps alone when nothing in them can have
//! expired: no entry was created since the last walk began (the CT
//! `created` counter says so) and the earliest expiry that walk kept is
//! still ahead. A refresh only lengthens an entry's life, but for an open
//! TCP connection, which a FIN or a reset cuts to the closed lifetime: the
//! walk counts such an entry as expiring that long after it saw it
//! ([`ct::gc_slice`]).

use std::{
    path::Path,
    time::{Duration, Instant},
};

use health_common::{
    ct::CtConfig,
    maps::{MapId, MapSizes},
};
use tokio::sync::watch;

use super::{
    DatapathError, ct,
    maps::{Cursor, Slice},
    rtt,
};

/// Slices a pass over a full CT map is cut into.
pub const SLICES: u32 = 8;

/// What a completed pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassDone {
    /// CT entries removed as expired, and left in the map.
    pub ct_removed: u64,
    pub ct_left: u64,
    /// CT entries the kernel evicted, by the counters read at the pass's
    /// start and the entries the pass saw ([`ct::evicted`]).
    pub ct_evicted: u64,
    /// Requests moved to the loss counters, and left pending.
    pub lost: u64,
    pub pending_left: u64,
    /// Slices the pass took, and their time in all.
    pub slices: u32,
    pub took: Duration,
    /// Whether the pass walked the CT map (and collected the NAT map).
    pub ct_walked: bool,
}

/// What the last completed CT walk knew.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Walked {
    /// The CT `created` counter when it began.
    created: u64,
    /// The earliest expiry of the entries it kept (`CLOCK_MONOTONIC` ns;
    /// `u64::MAX`: it kept none).
    earliest_ns: u64,
    /// The entries it kept.
    left: u64,
    /// Whether it removed entries whose NAT pairs are still to be
    /// collected: an entry that expired after the NAT collection at the
    /// pass's start leaves its pair for the next collection.
    nat_behind: bool,
    /// The CT evictions counted by it: still the count while no entry
    /// was created since (an eviction makes room for one).
    evicted: u64,
}

/// Whether a pass starting at `now_ns` with the CT `created` counter at
/// `created` walks the CT map: unless the last walk `last` saw every entry
/// there is (none created since it began) and none of those can have
/// expired yet.
const fn walk_needed(last: Option<&Walked>, created: u64, now_ns: u64) -> bool {
    match last {
        Some(w) => w.created != created || now_ns >= w.earliest_ns,
        None => true,
    }
}

/// A pass in progress.
#[derive(Debug)]
struct Pass {
    /// Where the CT walk goes on; `None` once it reached the map's end.
    ct: Option<Cursor>,
    /// Whether the loss sweep ran.
    swept: bool,
    /// The CT counters `created` and `removed` before the walk's first
    /// slice, and the entries the slices saw.
    counters: (u64, u64),
    ct_seen: u64,
    /// The earliest expiry of the entries the walk kept so far.
    earliest_ns: u64,
    done: PassDone,
}

/// The timeout the RTT loss sweep counts losses with, as reloads change
/// the probe timeout: a request unanswered that long after it left is
/// lost. A reload that shortens it leaves the longer one counting for twice
/// its length: the replaced prober's round stops at the reload (its
/// probes' tasks are aborted), and what it sent may be answered up to one
/// timeout later; the second leaves room for a round asked for through the
/// API, which runs to its end, to send in its first timeout after the
/// reload (a request such a round sends later, when its spread is longer
/// than its timeout, may be counted lost early). The reload computes it,
/// so a timeout changed and changed back between two sweeps is not
/// missed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LossTimeout {
    in_force: Duration,
    /// The longest timeout a reload shortened, while it may still count,
    /// and until when (`None`: past the clock's range).
    replaced: Option<(Duration, Option<Instant>)>,
}

impl LossTimeout {
    /// `in_force` from the start.
    #[must_use]
    pub const fn new(in_force: Duration) -> Self {
        Self {
            in_force,
            replaced: None,
        }
    }

    /// The probe timeout in force.
    #[must_use]
    pub const fn in_force(&self) -> Duration {
        self.in_force
    }

    /// A reload at `now` puts `timeout` in force; returns whether that
    /// changed it.
    pub fn reload(&mut self, timeout: Duration, now: Instant) -> bool {
        if timeout == self.in_force {
            return false;
        }
        let still = self.replaced.filter(|&(_, until)| counts_at(until, now));
        let shortened = (timeout < self.in_force).then(|| {
            let until = now.checked_add(self.in_force.saturating_mul(2));
            (self.in_force, until)
        });
        self.replaced = match (still, shortened) {
            (Some((a, until_a)), Some((b, until_b))) => {
                // Either may count later: the longer timeout, as long as
                // the later of the two.
                let until = until_a.zip(until_b).map(|(x, y)| x.max(y));
                Some((a.max(b), until))
            }
            (one, other) => one.or(other),
        };
        self.in_force = timeout;
        true
    }

    /// The timeout a sweep at `now` counts losses with.
    #[must_use]
    pub fn at(&self, now: Instant) -> Duration {
        match self.replaced {
            Some((longer, until)) if counts_at(until, now) => longer.max(self.in_force),
            _ => self.in_force,
        }
    }
}

/// Whether a replaced timeout counting until `until` counts at `now`.
fn counts_at(until: Option<Instant>, now: Instant) -> bool {
    until.is_none_or(|until| now < until)
}

/// The collectors' passes: when the next starts, and the one in progress.
#[derive(Debug)]
pub struct Collector {
    interval: Duration,
    /// The timeout each sweep counts losses with, as reloads change it.
    timeout: watch::Receiver<LossTimeout>,
    ct_budget: usize,
    /// The closed TCP lifetime in force (see [`ct::gc_slice`]).
    tcp_closed_s: u32,
    last_start: Instant,
    pass: Option<Pass>,
    walked: Option<Walked>,
}

impl Collector {
    /// Passes every `interval` (the first one `interval` after `now`);
    /// requests unanswered for the time `timeout` holds when a pass sweeps
    /// ([`LossTimeout::at`]) are lost; slices sized from the maps' sizes.
    #[must_use]
    pub fn new(
        interval: Duration,
        timeout: watch::Receiver<LossTimeout>,
        sizes: &MapSizes,
        now: Instant,
    ) -> Self {
        let entries = sizes.max_entries(MapId::CtMap).unwrap_or(0) / SLICES;
        Self {
            interval,
            timeout,
            ct_budget: usize::try_from(entries)
                .unwrap_or(usize::MAX)
                .max(crate::sys::bpf_batch::CHUNK),
            tcp_closed_s: CtConfig::default().tcp_closed_s,
            last_start: now,
            pass: None,
            walked: None,
        }
    }

    /// The CT lifetimes in force (the defaults until told).
    #[must_use]
    pub const fn with_lifetimes(mut self, ct: &CtConfig) -> Self {
        self.tcp_closed_s = ct.tcp_closed_s;
        self
    }

    /// How often [`Collector::step`] is to be called.
    #[must_use]
    pub fn tick(&self) -> Duration {
        (self.interval / SLICES).max(Duration::from_millis(10))
    }

    /// Starts a pass when none is in progress and one is due; says whether
    /// it did (the caller does its once-a-pass work then).
    pub fn start_if_due(&mut self, now: Instant) -> bool {
        if self.pass.is_some() || now.saturating_duration_since(self.last_start) < self.interval {
            return false;
        }
        self.last_start = now;
        self.pass = Some(Pass {
            ct: Some(Cursor::START),
            swept: false,
            counters: (0, 0),
            ct_seen: 0,
            earliest_ns: u64::MAX,
            done: PassDone {
                ct_walked: true,
                ..PassDone::default()
            },
        });
        true
    }

    /// Decides whether the pass just started walks the CT map, and
    /// whether the caller collects the NAT map (with every walk, and once
    /// after a walk that removed entries): reads the CT counters (`dir`)
    /// and the clock. Walks when either cannot be read.
    pub fn plan_walk(&mut self, dir: &Path) -> bool {
        let Some(pass) = self.pass.as_mut() else {
            return false;
        };
        let (Ok(counters), Ok(now_ns)) = (ct::created_and_removed(dir), super::monotonic_ns())
        else {
            return true;
        };
        pass.counters = counters;
        if walk_needed(self.walked.as_ref(), counters.0, now_ns) {
            return true;
        }
        pass.ct = None;
        pass.done.ct_walked = false;
        pass.done.ct_left = self.walked.map_or(0, |w| w.left);
        // Not counted again, not reset: a counter read as zero in between
        // would read as a reset.
        pass.done.ct_evicted = self.walked.map_or(0, |w| w.evicted);
        self.walked
            .as_mut()
            .is_some_and(|w| std::mem::take(&mut w.nat_behind))
    }

    /// The timeout a sweep at `now` counts losses with: the probe timeout
    /// in force, or a longer one a reload shortened, for twice its length
    /// after the reload ([`LossTimeout`]).
    #[must_use]
    pub fn sweep_timeout(&self, now: Instant) -> Duration {
        self.timeout.borrow().at(now)
    }

    /// Whether a pass is in progress.
    #[must_use]
    pub fn running(&self) -> bool {
        self.pass.is_some()
    }

    /// Walks the next slice of the pass in progress (nothing when there is
    /// none); returns the pass's figures when this slice completed it. A
    /// failure abandons the pass (the next starts on time).
    pub fn step(&mut self, dir: &Path) -> Result<Option<PassDone>, DatapathError> {
        let Some(mut pass) = self.pass.take() else {
            return Ok(None);
        };
        let started = Instant::now();
        if !pass.swept {
            (pass.done.lost, pass.done.pending_left) =
                rtt::sweep_counted(dir, self.sweep_timeout(started))?;
            pass.swept = true;
        }
        if let Some(from) = pass.ct {
            let (
                Slice {
                    deleted,
                    seen,
                    next,
                },
                earliest_ns,
            ) = ct::gc_slice(dir, from, self.ct_budget, self.tcp_closed_s)?;
            pass.done.ct_removed += deleted;
            pass.done.ct_left += seen.saturating_sub(deleted);
            pass.ct_seen += seen;
            pass.earliest_ns = pass.earliest_ns.min(earliest_ns);
            pass.ct = next;
        }
        pass.done.slices += 1;
        pass.done.took += started.elapsed();
        if pass.ct.is_none() {
            if pass.done.ct_walked {
                let (created, removed) = pass.counters;
                let previous = self.walked.map_or(0, |w| w.evicted);
                pass.done.ct_evicted = ct::evicted_since(previous, created, removed, pass.ct_seen);
                self.walked = Some(Walked {
                    created,
                    earliest_ns: pass.earliest_ns,
                    left: pass.done.ct_left,
                    nat_behind: pass.done.ct_removed > 0,
                    evicted: pass.done.ct_evicted,
                });
            }
            return Ok(Some(pass.done));
        }
        self.pass = Some(pass);
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_start_once_an_interval_and_not_while_one_runs() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut c = Collector::new(
            10 * s,
            watch::channel(LossTimeout::new(s)).1,
            &MapSizes::DEFAULT,
            t0,
        );
        assert_eq!(c.tick(), Duration::from_millis(1250));
        assert!(!c.running());
        assert!(!c.start_if_due(t0 + 9 * s), "not before the interval");
        assert!(c.start_if_due(t0 + 10 * s));
        assert!(c.running());
        assert!(!c.start_if_due(t0 + 25 * s), "one pass at a time");
        c.pass = None;
        assert!(c.start_if_due(t0 + 25 * s), "the next once it is done");
    }

    #[test]
    fn the_ct_map_is_walked_only_when_an_entry_may_have_expired() {
        let walked = Walked {
            created: 100,
            earliest_ns: 5_000,
            left: 7,
            nat_behind: false,
            evicted: 0,
        };
        assert!(walk_needed(None, 100, 0), "no walk yet: nothing is known");
        assert!(
            !walk_needed(Some(&walked), 100, 4_999),
            "nothing created since, nothing expired yet"
        );
        assert!(
            walk_needed(Some(&walked), 100, 5_000),
            "the earliest entry it kept expires"
        );
        assert!(
            walk_needed(Some(&walked), 101, 0),
            "an entry created since the walk began"
        );
        let emptied = Walked {
            earliest_ns: u64::MAX,
            left: 0,
            ..walked
        };
        assert!(!walk_needed(Some(&emptied), 100, u64::MAX - 1));
    }

    #[test]
    fn slices_take_a_share_of_the_map_never_less_than_a_batch() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let c = Collector::new(
            10 * s,
            watch::channel(LossTimeout::new(s)).1,
            &MapSizes::DEFAULT,
            t0,
        );
        // 131,072 CT entries by default.
        assert_eq!(c.ct_budget, 16_384);
        let small = Collector::new(
            10 * s,
            watch::channel(LossTimeout::new(s)).1,
            &MapSizes::for_peers(16),
            t0,
        );
        assert_eq!(small.ct_budget, crate::sys::bpf_batch::CHUNK);
    }

    #[test]
    fn a_shortened_timeout_counts_for_twice_its_length() {
        let s = Duration::from_secs(1);
        let t0 = Instant::now();
        let mut t = LossTimeout::new(3 * s);
        assert_eq!(t.at(t0), 3 * s);
        // Longer: at once; the same again changes nothing.
        assert!(t.reload(5 * s, t0 + s));
        assert_eq!(t.at(t0 + s), 5 * s, "a longer timeout");
        assert!(!t.reload(5 * s, t0 + s));
        // Shorter at `r`: 5 s still counts until r + 10 s.
        let r = t0 + 2 * s;
        assert!(t.reload(s / 2, r));
        assert_eq!(t.in_force(), s / 2);
        assert_eq!(t.at(r), 5 * s, "shortened: the longer one");
        assert_eq!(t.at(r + 9 * s + s * 9 / 10), 5 * s);
        assert_eq!(t.at(r + 10 * s), s / 2, "then the one in force");
        assert_eq!(t.at(r + 600 * s), s / 2, "and for good");
        // Shortened again meanwhile: 5 s counts no longer than before.
        let mut again = t;
        assert!(again.reload(s / 4, r + 4 * s));
        assert_eq!(again.at(r + 9 * s + s * 9 / 10), 5 * s);
        assert_eq!(again.at(r + 10 * s), s / 4);
        // Lengthened meanwhile, to less than the replaced one: the
        // replaced one still counts; shortened then, the longer as long as
        // the later of the two.
        let mut up = t;
        assert!(up.reload(2 * s, r + 6 * s));
        assert_eq!(up.at(r + 7 * s), 5 * s);
        assert_eq!(up.at(r + 10 * s), 2 * s);
        assert!(up.reload(s, r + 8 * s));
        assert_eq!(up.at(r + 11 * s), 5 * s);
        assert_eq!(up.at(r + 12 * s), s);
        // Once expired, a replaced timeout is forgotten by the next reload.
        let mut late = t;
        assert!(late.reload(8 * s, r + 30 * s));
        assert_eq!(late.at(r + 30 * s), 8 * s);
        assert!(late.reload(s, r + 31 * s));
        assert_eq!(late.at(r + 46 * s), 8 * s);
        assert_eq!(late.at(r + 47 * s), s);
        assert_eq!(late.at(r + 600 * s), s);
        // An expired longer one is not merged into a later shortening.
        let mut expired = LossTimeout::new(10 * s);
        assert!(expired.reload(3 * s, t0));
        assert!(expired.reload(s, t0 + 100 * s));
        assert_eq!(expired.at(t0 + 101 * s), 3 * s);
        assert_eq!(expired.at(t0 + 106 * s), s);
        // Past the clock's range, the longer one counts for good.
        let mut huge = LossTimeout::new(Duration::MAX);
        assert!(huge.reload(s, t0));
        assert_eq!(huge.at(t0 + Duration::from_hours(24_000)), Duration::MAX);
    }

    #[test]
    fn the_sweep_reads_the_timeout_each_reload_leaves() {
        let s = Duration::from_secs(1);
        let t0 = Instant::now();
        let (timeout, rx) = watch::channel(LossTimeout::new(s));
        let c = Collector::new(10 * s, rx, &MapSizes::DEFAULT, t0);
        assert_eq!(c.sweep_timeout(t0), s);
        // Lengthened and shortened back between two sweeps: the sweep at
        // t0 + 10 s still counts with the 10 s the prober sent under.
        timeout.send_modify(|t| {
            t.reload(10 * s, t0 + s);
        });
        timeout.send_modify(|t| {
            t.reload(s, t0 + 8 * s);
        });
        assert_eq!(c.sweep_timeout(t0 + 10 * s), 10 * s);
        assert_eq!(c.sweep_timeout(t0 + 28 * s), s);
    }
}
