//! What the prober keeps of each path between rounds: a [`PathRecord`] of
//! 64 bytes, made into the API's [`PathState`] (112 bytes, every field
//! its own) only when a status is written. At 10,000 peers there are
//! 40,000 of them, so the difference is 1.9 MB of the agent's heap.
//!
//! A failure's text is shared: paths that start failing the same way in
//! a round (the 20,000 paths to 5,000 silent peers all read `no echo
//! reply within 1000 ms` or `no HTTP answer within 1000 ms`) hold one
//! text between them, made once by [`ErrorTexts`], and keep it while they
//! fail that way.

use std::sync::Arc;

use super::{
    error::ProbeError,
    flows::PathFlows,
    path::{Outcome, PathState, PathTrace, ProbeResult, RttSource, Thresholds, renders_as},
};

/// A path's state as the prober keeps it; see [`PathState`] for what each
/// part means.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathRecord {
    /// The last success's RTT; meaningful when `rtt_source` is set.
    rtt_ns: u64,
    /// When the last probe was recorded; meaningful when `probes` is not
    /// zero.
    last_probe_ms: u64,
    probes: u64,
    /// Shared with every path that failed with the same text.
    last_error: Option<Arc<str>>,
    /// What few paths have: a warning, an MTU black hole, a trace, flows.
    rare: Option<Box<Rare>>,
    pub(super) consecutive_successes: u32,
    pub(super) consecutive_failures: u32,
    pub(super) mtu_failures: u32,
    pub(super) result: ProbeResult,
    rtt_source: Option<RttSource>,
    pub(super) degraded: bool,
}

/// The parts of a path's state that most paths never have.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Rare {
    warning: Option<Box<str>>,
    mtu_blackhole: Option<u16>,
    trace: Option<Box<PathTrace>>,
    flows: Option<Box<PathFlows>>,
}

impl Rare {
    fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

impl PathRecord {
    /// A path never probed.
    pub(super) const UNKNOWN: Self = Self {
        rtt_ns: 0,
        last_probe_ms: 0,
        probes: 0,
        last_error: None,
        rare: None,
        consecutive_successes: 0,
        consecutive_failures: 0,
        mtu_failures: 0,
        result: ProbeResult::Unknown,
        rtt_source: None,
        degraded: false,
    };

    /// Applies one probe outcome; a failure's text is taken from `texts`.
    pub fn record(
        &mut self,
        outcome: Outcome,
        thresholds: Thresholds,
        at_ms: u64,
        texts: &mut ErrorTexts,
    ) {
        self.probes += 1;
        self.last_probe_ms = at_ms;
        match outcome {
            Outcome::Ok {
                rtt,
                warning,
                source,
            } => {
                self.consecutive_successes = self.consecutive_successes.saturating_add(1);
                self.consecutive_failures = 0;
                self.rtt_ns = u64::try_from(rtt.as_nanos()).unwrap_or(u64::MAX);
                self.rtt_source = Some(source);
                self.set_warning(warning.map(|w| w.into_boxed_str()));
                if self.consecutive_successes >= thresholds.success.max(1) {
                    self.result = ProbeResult::Success;
                    self.set_trace(None);
                }
            }
            Outcome::Failed(error) => {
                self.consecutive_failures = self.consecutive_failures.saturating_add(1);
                self.consecutive_successes = 0;
                // The same text as last round's (a silent peer's timeout)
                // is kept as it is.
                if !self
                    .last_error
                    .as_deref()
                    .is_some_and(|t| renders_as(&error, t))
                {
                    self.last_error = Some(texts.of(&error));
                }
                self.set_warning(None);
                if self.consecutive_failures >= thresholds.failure.max(1) {
                    self.result = ProbeResult::Failure;
                }
            }
        }
    }

    /// The verdict under `thresholds` (a reload's) of the run of
    /// outcomes the path has had: a run that reaches the new threshold
    /// turns the path at once, not a round later; one short of it leaves
    /// the verdict as it is, as a verdict changes only at a threshold.
    pub fn rejudge(&mut self, thresholds: Thresholds) {
        if self.consecutive_failures >= thresholds.failure.max(1) {
            self.result = ProbeResult::Failure;
        } else if self.consecutive_successes >= thresholds.success.max(1) {
            self.result = ProbeResult::Success;
            self.set_trace(None);
        }
    }

    /// The path's state as the API shows it.
    #[must_use]
    pub fn to_state(&self) -> PathState {
        let rare = self.rare.as_deref();
        PathState {
            result: self.result,
            consecutive_successes: self.consecutive_successes,
            consecutive_failures: self.consecutive_failures,
            rtt_ns: self.rtt_source.map(|_| self.rtt_ns),
            rtt_source: self.rtt_source,
            last_error: self.last_error.as_deref().map(Box::from),
            warning: rare.and_then(|r| r.warning.clone()),
            probes: self.probes,
            last_probe_ms: (self.probes > 0).then_some(self.last_probe_ms),
            degraded: self.degraded,
            mtu_failures: self.mtu_failures,
            mtu_blackhole: self.mtu_blackhole(),
            trace: rare.and_then(|r| r.trace.clone()),
            flows: rare.and_then(|r| r.flows.clone()),
        }
    }

    pub(super) fn mtu_blackhole(&self) -> Option<u16> {
        self.rare.as_deref().and_then(|r| r.mtu_blackhole)
    }

    pub(super) fn trace(&self) -> Option<&PathTrace> {
        self.rare.as_deref().and_then(|r| r.trace.as_deref())
    }

    pub(super) fn flows(&self) -> Option<&PathFlows> {
        self.rare.as_deref().and_then(|r| r.flows.as_deref())
    }

    /// The path's flows, made empty when it has none yet.
    pub(super) fn flows_mut(&mut self) -> &mut PathFlows {
        self.rare
            .get_or_insert_default()
            .flows
            .get_or_insert_default()
    }

    pub(super) fn set_mtu_blackhole(&mut self, bytes: Option<u16>) {
        self.set_rare(|r| r.mtu_blackhole = bytes, bytes.is_some());
    }

    pub(super) fn set_trace(&mut self, trace: Option<PathTrace>) {
        let some = trace.is_some();
        self.set_rare(|r| r.trace = trace.map(Box::new), some);
    }

    fn set_warning(&mut self, warning: Option<Box<str>>) {
        let some = warning.is_some();
        self.set_rare(|r| r.warning = warning, some);
    }

    /// Changes the rare parts (`adds`: it sets one): made on the first
    /// one set, dropped with the last one cleared.
    fn set_rare(&mut self, change: impl FnOnce(&mut Rare), adds: bool) {
        match &mut self.rare {
            Some(rare) => {
                change(rare);
                if rare.is_empty() {
                    self.rare = None;
                }
            }
            None if adds => change(self.rare.get_or_insert_default()),
            None => {}
        }
    }
}

impl PathRecord {
    /// The path's verdict: its state, but Unknown for a path whose last
    /// probes went the other way than its state, not yet enough of them
    /// to turn it (failing below the failure threshold). Its summary
    /// already says it is failing: it is to be probed again soon, not left
    /// to the next round.
    pub(super) const fn verdict(&self) -> ProbeResult {
        match self.result {
            ProbeResult::Success if self.consecutive_failures > 0 => ProbeResult::Unknown,
            ProbeResult::Failure if self.consecutive_successes > 0 => ProbeResult::Unknown,
            r => r,
        }
    }
}

impl Default for PathRecord {
    fn default() -> Self {
        Self::UNKNOWN
    }
}

/// The texts of the failures recorded in one pass over the paths, each
/// made once: the few ways paths fail, shared by all that fail that way.
#[derive(Debug, Default)]
pub struct ErrorTexts {
    /// The newest last.
    texts: Vec<Arc<str>>,
}

impl ErrorTexts {
    /// Texts kept: a pass meets a handful (timeouts, refusals, HTTP
    /// codes); past this, the oldest is let go (its paths keep it).
    const KEPT: usize = 8;

    /// `error`'s text, shared when it was made before.
    pub fn of(&mut self, error: &ProbeError) -> Arc<str> {
        if let Some(t) = self.texts.iter().rev().find(|t| renders_as(error, t)) {
            return t.clone();
        }
        let text: Arc<str> = Arc::from(error.to_string());
        if self.texts.len() == Self::KEPT {
            self.texts.remove(0);
        }
        self.texts.push(text.clone());
        text
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::probe::error::Proto;

    fn timeout() -> ProbeError {
        ProbeError::Timeout {
            proto: Proto::Icmp,
            after: Duration::from_secs(1),
        }
    }

    fn ok(warning: Option<&str>) -> Outcome {
        Outcome::Ok {
            rtt: Duration::from_micros(250),
            warning: warning.map(|w| Box::new(w.to_owned())),
            source: RttSource::Kernel,
        }
    }

    /// 40,000 of these at 10,000 peers.
    #[test]
    fn a_record_is_64_bytes() {
        assert_eq!(size_of::<PathRecord>(), 64);
    }

    #[test]
    fn paths_that_fail_the_same_way_share_one_text() {
        let mut texts = ErrorTexts::default();
        let t = Thresholds::default();
        let mut paths = vec![PathRecord::default(); 1000];
        for p in &mut paths {
            p.record(Outcome::Failed(timeout()), t, 1, &mut texts);
        }
        let first = paths[0].last_error.clone().expect("a text");
        assert_eq!(&*first, "no echo reply within 1000 ms");
        assert!(
            paths.iter().all(|p| p
                .last_error
                .as_ref()
                .is_some_and(|e| Arc::ptr_eq(e, &first))),
            "one text for all"
        );
        // Another pass, with its own texts: the paths keep theirs.
        let mut next = ErrorTexts::default();
        paths[1].record(Outcome::Failed(timeout()), t, 2, &mut next);
        assert!(Arc::ptr_eq(
            paths[1].last_error.as_ref().expect("kept"),
            &first
        ));
        // A different failure gets its own text.
        paths[2].record(
            Outcome::Failed(ProbeError::HttpStatus(503)),
            t,
            2,
            &mut next,
        );
        assert_eq!(paths[2].last_error.as_deref(), Some("HTTP 503"));
    }

    #[test]
    fn the_texts_kept_are_bounded() {
        let mut texts = ErrorTexts::default();
        for code in 500..600 {
            let _ = texts.of(&ProbeError::HttpStatus(code));
        }
        assert_eq!(texts.texts.len(), ErrorTexts::KEPT);
        assert_eq!(texts.texts.last().map(|t| &**t), Some("HTTP 599"));
    }

    #[test]
    fn the_state_shown_is_the_one_recorded() {
        let t = Thresholds {
            success: 1,
            failure: 2,
        };
        let mut texts = ErrorTexts::default();
        let mut p = PathRecord::default();
        assert_eq!(p.to_state(), PathState::UNKNOWN);
        p.record(ok(Some("HTTP 301")), t, 7, &mut texts);
        let s = p.to_state();
        assert_eq!(
            (s.result, s.rtt_ns, s.rtt_source, s.probes, s.last_probe_ms),
            (
                ProbeResult::Success,
                Some(250_000),
                Some(RttSource::Kernel),
                1,
                Some(7)
            )
        );
        assert_eq!(s.warning.as_deref(), Some("HTTP 301"));
        p.set_mtu_blackhole(Some(1500));
        p.mtu_failures = 3;
        p.record(Outcome::Failed(timeout()), t, 8, &mut texts);
        p.record(Outcome::Failed(timeout()), t, 9, &mut texts);
        let s = p.to_state();
        assert_eq!(
            (s.result, s.consecutive_failures, s.warning, s.mtu_blackhole),
            (ProbeResult::Failure, 2, None, Some(1500))
        );
        assert_eq!(s.mtu_failures, 3);
        assert_eq!(
            s.last_error.as_deref(),
            Some("no echo reply within 1000 ms")
        );
        assert_eq!(s.rtt_ns, Some(250_000), "the last success's RTT stays");
        p.set_trace(Some(PathTrace {
            at_ms: 9,
            hops: Vec::new(),
            reached: false,
        }));
        assert_eq!(p.to_state().trace.map(|t| t.at_ms), Some(9));
        p.record(ok(None), t, 10, &mut texts);
        assert_eq!(p.to_state().trace, None, "a success clears the trace");
    }

    #[test]
    fn the_rare_parts_go_with_the_last_one_cleared() {
        let mut p = PathRecord::default();
        p.set_mtu_blackhole(Some(1500));
        let _ = p.flows_mut();
        assert!(p.rare.is_some());
        p.set_mtu_blackhole(None);
        assert!(p.rare.is_some(), "the flows are still there");
        p.rare.as_mut().expect("rare").flows = None;
        p.set_mtu_blackhole(None);
        assert_eq!(p, PathRecord::UNKNOWN);
    }

    #[test]
    fn a_failure_with_the_same_text_keeps_the_text_it_has() {
        let mut p = PathRecord::default();
        let t = Thresholds::default();
        p.record(
            Outcome::Failed(ProbeError::HttpStatus(503)),
            t,
            1,
            &mut ErrorTexts::default(),
        );
        let first = p.last_error.clone().expect("a text");
        p.record(
            Outcome::Failed(ProbeError::HttpStatus(503)),
            t,
            2,
            &mut ErrorTexts::default(),
        );
        assert!(Arc::ptr_eq(p.last_error.as_ref().expect("kept"), &first));
        p.record(
            Outcome::Failed(ProbeError::HttpStatus(500)),
            t,
            3,
            &mut ErrorTexts::default(),
        );
        assert_eq!(p.last_error.as_deref(), Some("HTTP 500"));
    }

    #[test]
    fn starts_unknown_and_follows_the_thresholds() {
        let t = Thresholds {
            success: 2,
            failure: 3,
        };
        let texts = &mut ErrorTexts::default();
        let fail = || Outcome::Failed(ProbeError::Protocol("timeout".into()));
        let mut p = PathRecord::default();
        assert_eq!(p.result, ProbeResult::Unknown);
        p.record(fail(), t, 1, texts);
        p.record(fail(), t, 2, texts);
        assert_eq!(
            p.result,
            ProbeResult::Unknown,
            "two failures are below the threshold"
        );
        p.record(fail(), t, 3, texts);
        assert_eq!(p.result, ProbeResult::Failure);
        assert_eq!(p.last_error.as_deref(), Some("timeout"));
        p.record(ok(None), t, 4, texts);
        assert_eq!(
            p.result,
            ProbeResult::Failure,
            "one success is below the threshold"
        );
        p.record(ok(None), t, 5, texts);
        assert_eq!(p.result, ProbeResult::Success);
        p.record(fail(), t, 6, texts);
        assert_eq!(
            p.result,
            ProbeResult::Success,
            "a single failure does not flip it"
        );
        let s = p.to_state();
        assert_eq!(
            (s.rtt_ns, s.probes, s.last_probe_ms),
            (Some(250_000), 6, Some(6))
        );
    }

    #[test]
    fn interleaved_outcomes_reset_the_streaks() {
        let t = Thresholds::default();
        let texts = &mut ErrorTexts::default();
        let mut p = PathRecord::default();
        for _ in 0..10 {
            p.record(Outcome::Failed(timeout()), t, 0, texts);
            p.record(Outcome::Failed(timeout()), t, 0, texts);
            p.record(ok(None), t, 0, texts);
        }
        assert_eq!(p.result, ProbeResult::Success);
        assert_eq!(p.consecutive_failures, 0);
        assert_eq!(p.to_state().last_probe_ms, Some(0), "probed at 0 ms");
    }
}
