//! Per-path probe state with kubelet semantics: a path starts `Unknown`,
//! becomes `Success` after `success_threshold` consecutive successes and
//! `Failure` after `failure_threshold` consecutive failures.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::ProbeError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProbeResult {
    Success,
    Failure,
    Unknown,
}

/// Where an RTT figure was measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RttSource {
    /// Timestamped by the kernel programs (BPF maps).
    Kernel,
    /// Measured by the agent around the socket calls.
    Userspace,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Thresholds {
    pub success: u32,
    pub failure: u32,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            success: 1,
            failure: 3,
        }
    }
}

/// What one probe of a path gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Ok {
        rtt: Duration,
        /// Rare (an HTTP redirect): behind one thin pointer, so that an
        /// outcome is as small as an echo's result and a round's echo
        /// results become its outcomes in place.
        warning: Option<Box<String>>,
        source: RttSource,
    },
    Failed(ProbeError),
}

/// The state of one path, as the API shows it. Zero counts and absent
/// values are left out of the JSON (a reader takes them as 0 and null):
/// at 5,000 nodes the status is half the size, which is what every
/// `GET /v1/status` copies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathState {
    pub result: ProbeResult,
    #[serde(default, skip_serializing_if = "is_zero32")]
    pub consecutive_successes: u32,
    #[serde(default, skip_serializing_if = "is_zero32")]
    pub consecutive_failures: u32,
    /// RTT of the last successful probe, in nanoseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_source: Option<RttSource>,
    /// The last failure's error text (kept after recovery, for reference).
    /// Boxed `str`s, not `String`s: 40,000 path states at 10,000 peers,
    /// and the texts never grow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<Box<str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warning: Option<Box<str>>,
    #[serde(default, skip_serializing_if = "is_zero64")]
    pub probes: u64,
    /// Epoch milliseconds of the last probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_ms: Option<u64>,
    /// A path in Success that loses at least `--degraded-loss` of its
    /// probes with 95 % confidence over a window (see
    /// [`super::quality`]).
    #[serde(default, skip_serializing_if = "is_false")]
    pub degraded: bool,
    /// ICMP paths: rounds in a row whose Don't-Fragment echo of the MTU
    /// probe size was lost while the small echo was answered.
    #[serde(default, skip_serializing_if = "is_zero32")]
    pub mtu_failures: u32,
    /// The MTU probe size this path answers small echoes at but loses
    /// (`failure_threshold` rounds in a row): an MTU black hole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu_blackhole: Option<u16>,
    /// ICMP paths in Failure: where the way to the address ends, traced
    /// when the path failed (see [`super::trace`]); cleared when it
    /// succeeds again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<Box<PathTrace>>,
    /// With `--probe-flows` above 1: each flow's loss over its window, and
    /// which flows fail while others answer (partial loss, see
    /// [`super::flows`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flows: Option<Box<super::flows::PathFlows>>,
}

/// Whether `value` displays as `text`, compared as it is written: no
/// allocation.
pub(super) fn renders_as(value: &impl std::fmt::Display, text: &str) -> bool {
    struct Compare<'a> {
        rest: &'a str,
    }
    impl std::fmt::Write for Compare<'_> {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.rest = self.rest.strip_prefix(s).ok_or(std::fmt::Error)?;
            Ok(())
        }
    }
    let mut c = Compare { rest: text };
    std::fmt::write(&mut c, format_args!("{value}")).is_ok() && c.rest.is_empty()
}

/// A traceroute of a failing path, from the prober's namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathTrace {
    /// Epoch milliseconds when it was taken.
    pub at_ms: u64,
    /// The hops in TTL order, up to the address (`reached`) or up to
    /// the last hop that answered: the way ends after it.
    pub hops: Vec<TraceHop>,
    /// The address itself answered the trace's echo.
    pub reached: bool,
}

/// One hop of a [`PathTrace`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceHop {
    pub ttl: u8,
    /// Who answered at this TTL (`None`: nobody, within the timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<std::net::IpAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rtt_ns: Option<u64>,
    /// The hop said it has no way on: the ICMP "unreachable" code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreachable: Option<u8>,
}

impl PathTrace {
    /// The hops as one line: `1 198.18.1.1 0.2ms, 2 *, 3 198.18.3.1
    /// (unreachable)`, then where it ends.
    #[must_use]
    pub fn line(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        for (k, h) in self.hops.iter().enumerate() {
            if k > 0 {
                out.push_str(", ");
            }
            let _ = write!(out, "{}", h.ttl);
            match h.ip {
                Some(ip) => {
                    let _ = write!(out, " {ip}");
                }
                None => out.push_str(" *"),
            }
            if let Some(ns) = h.rtt_ns {
                let _ = write!(
                    out,
                    " {:.1}ms",
                    Duration::from_nanos(ns).as_secs_f64() * 1e3
                );
            }
            if h.unreachable.is_some() {
                out.push_str(" (unreachable)");
            }
        }
        match (self.reached, self.hops.last()) {
            (true, _) => out.push_str("; the address answers the trace"),
            (false, Some(last)) => {
                let _ = write!(out, "; no answer past hop {}", last.ttl);
            }
            (false, None) => out.push_str("no hop answered"),
        }
        out
    }
}

#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's skip_serializing_if passes a reference"
)]
const fn is_false(b: &bool) -> bool {
    !*b
}

#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's skip_serializing_if passes a reference"
)]
const fn is_zero32(n: &u32) -> bool {
    *n == 0
}

#[expect(
    clippy::trivially_copy_pass_by_ref,
    reason = "serde's skip_serializing_if passes a reference"
)]
const fn is_zero64(n: &u64) -> bool {
    *n == 0
}

impl PathState {
    /// A path never probed.
    pub const UNKNOWN: Self = Self {
        result: ProbeResult::Unknown,
        consecutive_successes: 0,
        consecutive_failures: 0,
        rtt_ns: None,
        rtt_source: None,
        last_error: None,
        warning: None,
        probes: 0,
        last_probe_ms: None,
        degraded: false,
        mtu_failures: 0,
        mtu_blackhole: None,
        trace: None,
        flows: None,
    };
}

impl Default for PathState {
    fn default() -> Self {
        Self::UNKNOWN
    }
}

impl PathState {
    /// The line naming the failing flows of a path with partial loss.
    #[must_use]
    pub fn partial_loss(&self) -> Option<String> {
        self.flows
            .as_deref()
            .and_then(super::flows::PathFlows::partial_line)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_is_compared_with_what_a_value_would_display() {
        let timeout = ProbeError::Timeout {
            proto: super::super::error::Proto::Icmp,
            after: Duration::from_secs(1),
        };
        assert!(renders_as(&timeout, "no echo reply within 1000 ms"));
        assert!(!renders_as(&timeout, "no echo reply within 1000 m"));
        assert!(!renders_as(&timeout, "no echo reply within 1000 ms!"));
        assert!(!renders_as(&timeout, ""));
        assert!(renders_as(&ProbeError::HttpStatus(503), "HTTP 503"));
    }

    /// A round holds one outcome a probe (40,000 at 10,000 peers): the
    /// rare texts are boxed, so an outcome is 40 bytes, not 56, the size
    /// of an echo's result (which then becomes an outcome in place).
    #[test]
    fn outcomes_are_small() {
        assert_eq!(size_of::<Outcome>(), 40);
        assert_eq!(size_of::<Result<Duration, ProbeError>>(), 40);
    }

    #[test]
    fn the_json_leaves_out_zeros_and_absent_values_and_reads_them_back() {
        let unknown = PathState::default();
        let json = serde_json::to_string(&unknown).expect("json");
        assert_eq!(json, r#"{"result":"unknown"}"#);
        assert_eq!(
            serde_json::from_str::<PathState>(&json).expect("back"),
            unknown
        );
        let p = PathState {
            result: ProbeResult::Success,
            consecutive_successes: 1,
            rtt_ns: Some(250_000),
            rtt_source: Some(RttSource::Userspace),
            probes: 1,
            last_probe_ms: Some(7),
            ..PathState::UNKNOWN
        };
        let json = serde_json::to_string(&p).expect("json");
        assert_eq!(
            json,
            r#"{"result":"success","consecutive_successes":1,"rtt_ns":250000,"rtt_source":"userspace","probes":1,"last_probe_ms":7}"#
        );
        assert_eq!(serde_json::from_str::<PathState>(&json).expect("back"), p);
        // The long form (every field, nulls and zeros) still reads.
        let long = r#"{"result":"failure","consecutive_successes":0,"consecutive_failures":3,"rtt_ns":null,"rtt_source":null,"last_error":"timeout","warning":null,"probes":3,"last_probe_ms":9}"#;
        let read: PathState = serde_json::from_str(long).expect("long form");
        assert_eq!(
            (read.consecutive_failures, read.last_error.as_deref()),
            (3, Some("timeout"))
        );
    }
}
