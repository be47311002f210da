//! A node's last round in a few bytes: what each agent publishes (through
//! etcd) so that every agent can assemble the cluster view.
//!
//! Per probed peer: its name and, per path (host ICMP, host HTTP, endpoint
//! ICMP, endpoint HTTP, [`PATHS`]), the state (2 bits: a path in Success
//! whose last probe failed, below the prober's failure threshold, has a
//! code of its own) and, for a path in Success answering, the RTT in µs.
//! Bounded: at most [`MAX_PEERS`] peers of at most [`MAX_NAME_LEN`] bytes,
//! so at most [`MAX_PEER_BYTES`] a peer.
//!
//! **The wire format** (version 3, [`VERSION`]) is the protobuf message of
//! `health-agent/proto/summary.proto`, compiled by the build script with
//! prost-build: the schema is the one description of the bytes, a reader
//! in any language decodes them with generated code, and the Rust types
//! cannot drift from it (hand-written `#[derive(prost::Message)]` structs
//! would save the build step, but then the `.proto` others read would be a
//! copy; protoc is a build requirement already, etcd-client's build runs
//! it). The value in etcd is
//!
//! ```text
//! u8 version = 3, varint message length, the message
//! ```
//!
//! The first byte tells the formats apart without ambiguity: versions 1
//! and 2 began with their own version byte, and a reader refuses any other
//! (a protobuf message alone could begin with any byte). The length makes
//! a truncated value an error (a protobuf message cut at a field boundary
//! would otherwise read as a shorter one) and bounds what the decoder
//! allocates before it runs. Names stay compact inside the schema: peers
//! are sorted and each name is written against the previous one (how many
//! bytes it shares at the start and at the end, and its middle), in packed
//! per-peer columns, so a peer costs about one byte more than in version 2.
//!
//! **Rolling upgrade**: [`Summary::decode`] still reads versions 2 and 1,
//! which agents one version older write ([`Summary::encode_version_2`]
//! writes it, for the tests and the format's benchmark; an agent of the
//! previous release refuses version 3, and says so, until it is upgraded):
//!
//! ```text
//! u8 version = 2 (version 1, without state code 3, is read too)
//! u8 observer name length, name bytes
//! varint seq, varint at_ms, varint peer count
//! per peer, sorted by name, unique:
//!   u8 prefix, u8 suffix, u8 middle length, middle bytes (as version 3)
//!   u8 states: path i in bits 2i..2i+1 (0 unknown, 1 success, 2 failure,
//!       3 success but failing: its last probe failed)
//!   per path of code 1, in path order: varint RTT in µs + 1 (0: none)
//! ```
//!
//! **Measured**, version 2 against 3 (`cargo xtask bench cluster-sim
//! --nodes 50000 --peers 32`, release build, one CPU decoding, 2 vCPUs
//! shared with builds): a summary of 52 peers (K = 32 and a zone of 20,
//! EC2-style names) is 869 B against 887 B on average (1.02x), 896 B
//! against 914 B at most; decoding one round's 50,000 summaries takes
//! 383 ms against 434 ms (7.7 against 8.7 µs a summary, 1.13x); with
//! [`MAX_PEERS`] peers, 52,070 B against 52,093 B, decoded in 0.62 ms
//! against 0.49 ms. The schema costs 2 % in size and 13 % in decode time,
//! well within what a generated reader of a published schema is worth.
//!
//! [`Summary::decode`] checks everything and never panics: the bytes come
//! from etcd, which anyone holding its credentials writes. Every version
//! goes through the same checks of every peer (name coding and length,
//! UTF-8, order, state codes, the bounds).

mod peers;
mod v2;
mod wire;

use std::fmt;

use super::cadence::STALE_ROUNDS;
use crate::encryption::EncState;
use crate::membership::record::MAX_NAME_LEN;
use crate::probe::{
    path::{PathState, ProbeResult},
    status::{ClusterStatus, Connectivity, NodeStatus},
};

/// The format [`Summary::encode`] writes: the protobuf message.
pub const VERSION: u8 = 3;

/// The format agents one version older write, still read.
pub const VERSION_2: u8 = 2;

/// The format before it, still read: version 2 without state code 3.
const VERSION_1: u8 = 1;

/// The most peers a summary holds. With names of [`MAX_NAME_LEN`] bytes a
/// summary is then at most ~1.1 MiB, under etcd's default 1.5 MiB request
/// limit; a full mesh of more nodes keeps the failing peers first
/// ([`Summary::from_status`]).
pub const MAX_PEERS: usize = 4096;

/// The four paths of a peer, in the order of [`PeerSummary::paths`].
pub const PATHS: [&str; 4] = ["host-icmp", "host-http", "endpoint-icmp", "endpoint-http"];

/// The most bytes one peer takes in either format: its name's prefix,
/// suffix and middle length (varints of up to 2 bytes), the longest name,
/// the states (up to 2) and four RTTs (5-byte varints).
pub const MAX_PEER_BYTES: usize = 3 * 2 + MAX_NAME_LEN + 2 + 4 * 5;

/// The largest RTT a summary carries, in µs (71 minutes): larger values are
/// saturated to it.
pub const MAX_RTT_US: u32 = u32::MAX - 1;

/// One path of a peer as the summary keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathSample {
    pub state: ProbeResult,
    /// The last RTT, kept for a path in Success only.
    pub rtt_us: Option<u32>,
    /// A path in Success whose last probe failed: the prober's failure
    /// threshold is not reached yet. The cluster view takes every
    /// observer's failing paths together as evidence of a node down a few
    /// rounds before any prober's threshold (no RTT then).
    pub failing: bool,
    /// A path in Success that loses probes with confidence (the prober's
    /// degraded verdict, `PathState::degraded`).
    pub lossy: bool,
    /// A path in Success whose probes left outside the WireGuard tunnel
    /// (`--encryption wireguard`: its address is `plaintext`).
    pub plaintext: bool,
}

impl PathSample {
    pub const UNKNOWN: Self = Self {
        state: ProbeResult::Unknown,
        rtt_us: None,
        failing: false,
        lossy: false,
        plaintext: false,
    };

    /// A path in `state`; the RTT is kept for Success only, in µs,
    /// saturated to [`MAX_RTT_US`].
    #[must_use]
    pub fn new(state: ProbeResult, rtt_us: Option<u64>) -> Self {
        Self {
            state,
            rtt_us: match state {
                ProbeResult::Success => {
                    rtt_us.map(|us| u32::try_from(us).unwrap_or(MAX_RTT_US).min(MAX_RTT_US))
                }
                ProbeResult::Failure | ProbeResult::Unknown => None,
            },
            failing: false,
            lossy: false,
            plaintext: false,
        }
    }

    /// A path in Success whose last probe failed.
    pub const FAILING: Self = Self {
        state: ProbeResult::Success,
        rtt_us: None,
        failing: true,
        lossy: false,
        plaintext: false,
    };

    /// A path in `state`, failing (its last probe failed) or not: only a
    /// path in Success is kept as failing.
    #[must_use]
    pub fn with_failing(state: ProbeResult, rtt_us: Option<u64>, failing: bool) -> Self {
        if failing && state == ProbeResult::Success {
            Self::FAILING
        } else {
            Self::new(state, rtt_us)
        }
    }

    /// The prober's state of a path.
    #[must_use]
    pub fn from_state(p: &PathState) -> Self {
        Self::with_failing(
            p.result,
            p.rtt_ns.map(|ns| ns / 1000),
            p.consecutive_failures > 0,
        )
        .with_lossy(p.degraded)
    }

    /// The same path, lossy (`lossy`, kept for a path in Success only).
    #[must_use]
    pub const fn with_lossy(mut self, lossy: bool) -> Self {
        self.lossy = lossy && matches!(self.state, ProbeResult::Success);
        self
    }

    /// The same path, reached in plain text (`plaintext`, kept for a path
    /// in Success only).
    #[must_use]
    pub const fn with_plaintext(mut self, plaintext: bool) -> Self {
        self.plaintext = plaintext && matches!(self.state, ProbeResult::Success);
        self
    }

    /// The state code of the binary form.
    pub(crate) const fn code(&self) -> u8 {
        match (self.state, self.failing) {
            (ProbeResult::Unknown, _) => 0,
            (ProbeResult::Success, false) => 1,
            (ProbeResult::Failure, _) => 2,
            (ProbeResult::Success, true) => 3,
        }
    }
}

/// One probed peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSummary {
    pub name: String,
    /// Host ICMP, host HTTP, endpoint ICMP, endpoint HTTP ([`PATHS`]).
    pub paths: [PathSample; 4],
}

impl PeerSummary {
    /// The prober's status of a peer. A dual-stack peer's path is as bad
    /// as the worse of its two families (its RTT is the primary family's,
    /// or the secondary's when only that one has an answer).
    #[must_use]
    pub fn from_status(n: &NodeStatus) -> Self {
        let path = |primary: &PathState, secondary: Option<&PathState>| {
            let Some(second) = secondary else {
                return PathSample::from_state(primary);
            };
            let worse = |a: ProbeResult, b: ProbeResult| {
                if a == ProbeResult::Failure || b == ProbeResult::Failure {
                    ProbeResult::Failure
                } else if a == ProbeResult::Unknown || b == ProbeResult::Unknown {
                    ProbeResult::Unknown
                } else {
                    ProbeResult::Success
                }
            };
            let rtt = primary.rtt_ns.or(second.rtt_ns);
            PathSample::with_failing(
                worse(primary.result, second.result),
                rtt.map(|ns| ns / 1000),
                primary.consecutive_failures > 0 || second.consecutive_failures > 0,
            )
            .with_lossy(primary.degraded || second.degraded)
        };
        let (host6, ep6) = (n.host_secondary.as_deref(), n.endpoint_secondary.as_deref());
        // An address of either family whose probes left in plain text.
        let plain = |c: &Connectivity, c6: Option<&Connectivity>| {
            let p = |c: &Connectivity| {
                c.encryption
                    .as_ref()
                    .is_some_and(|e| e.state == EncState::Plaintext)
            };
            p(c) || c6.is_some_and(p)
        };
        let (host_plain, ep_plain) = (plain(&n.host, host6), plain(&n.endpoint, ep6));
        Self {
            name: n.name.clone(),
            paths: [
                path(&n.host.icmp, host6.map(|c| &c.icmp)).with_plaintext(host_plain),
                path(&n.host.http, host6.map(|c| &c.http)).with_plaintext(host_plain),
                path(&n.endpoint.icmp, ep6.map(|c| &c.icmp)).with_plaintext(ep_plain),
                path(&n.endpoint.http, ep6.map(|c| &c.http)).with_plaintext(ep_plain),
            ],
        }
    }

    /// The paths reached in plain text: path i in bit i.
    #[must_use]
    pub fn plaintext_bits(&self) -> u8 {
        self.paths
            .iter()
            .enumerate()
            .fold(0, |bits, (i, p)| bits | (u8::from(p.plaintext) << i))
    }

    /// Some path reached in plain text.
    #[must_use]
    pub fn plaintext(&self) -> bool {
        self.paths.iter().any(|p| p.plaintext)
    }

    /// The lossy paths: path i in bit i.
    #[must_use]
    pub fn lossy_bits(&self) -> u8 {
        self.paths
            .iter()
            .enumerate()
            .fold(0, |bits, (i, p)| bits | (u8::from(p.lossy) << i))
    }

    /// The four states in one byte: path i in bits 2i..2i+1.
    #[must_use]
    pub fn state_bits(&self) -> u8 {
        self.paths
            .iter()
            .enumerate()
            .fold(0, |bits, (i, p)| bits | (p.code() << (2 * i)))
    }

    /// Failure if any path failed, else Unknown if any is unknown, else
    /// Success (as [`NodeStatus::state`]).
    #[must_use]
    pub fn state(&self) -> ProbeResult {
        let states = self.paths.map(|p| p.state);
        if states.contains(&ProbeResult::Failure) {
            ProbeResult::Failure
        } else if states.contains(&ProbeResult::Unknown) {
            ProbeResult::Unknown
        } else {
            ProbeResult::Success
        }
    }
}

/// Where in a summary a problem is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum At {
    /// A byte of the value (versions 1 and 2).
    Byte(usize),
    /// A peer of the message, counting from 0 in name order (version 3).
    Peer(usize),
    /// The message's observer field (version 3).
    Observer,
}

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Byte(at) => write!(f, "byte {at}"),
            Self::Peer(i) => write!(f, "peer {i}"),
            Self::Observer => f.write_str("observer"),
        }
    }
}

/// What a summary cannot be made of, or what is wrong with its bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SummaryError {
    #[error("the status names no local node: a summary needs its observer's name")]
    NoLocalNode,
    #[error("no probe round has finished yet: nothing to summarise")]
    NoRound,
    #[error("{what} name {name:?} is {len} bytes long: expected 1 to {MAX_NAME_LEN}")]
    NameLength {
        what: &'static str,
        name: String,
        len: usize,
    },
    #[error("{count} peers: a summary holds at most {MAX_PEERS}")]
    TooManyPeers { count: u64 },
    #[error("peer {name:?} is listed twice")]
    DuplicatePeer { name: String },
    #[error("an empty summary")]
    Empty,
    #[error("summary format version {found}: this agent reads versions 1 to {VERSION}")]
    Version { found: u8 },
    #[error("summary truncated at byte {at}: {what} missing")]
    Truncated { at: usize, what: &'static str },
    #[error("summary byte {at}: the {what} varint overflows 64 bits")]
    Varint { at: usize, what: &'static str },
    #[error(
        "summary message of {len} bytes: a summary takes at most {}",
        wire::MAX_MESSAGE_BYTES
    )]
    TooLong { len: u64 },
    #[error("summary format version {VERSION}: not its protobuf message: {0}")]
    Protobuf(prost::DecodeError),
    #[error("summary lists {len} {what} where its peers take {expected}")]
    Columns {
        what: &'static str,
        len: usize,
        expected: usize,
    },
    #[error("summary {at}: {what} name of {len} bytes: expected 1 to {MAX_NAME_LEN}")]
    BadNameLength {
        at: At,
        what: &'static str,
        len: usize,
    },
    #[error(
        "summary {at}: a name taking {prefix} bytes from the start and {suffix} from the end of a previous name of {previous} bytes"
    )]
    NameCoding {
        at: At,
        prefix: usize,
        suffix: usize,
        previous: usize,
    },
    #[error(
        "summary {at}: lossy paths {mask:#06b}: expected 1 to 0b1111, each a path in Success, peers in order"
    )]
    Lossy { at: At, mask: u32 },
    #[error(
        "summary {at}: plain-text paths {mask:#06b}: expected 1 to 0b1111, each a path in Success, peers in order"
    )]
    Plaintext { at: At, mask: u32 },
    #[error("summary {at}: {what} name is not UTF-8")]
    NameUtf8 { at: At, what: &'static str },
    #[error(
        "summary {at}: peer {name:?} is not after {previous:?} (peers are sorted by name, unique)"
    )]
    Order {
        at: At,
        name: String,
        previous: String,
    },
    #[error("summary {at}: path state code 3 is not a state of format version 1")]
    State { at: At },
    #[error("summary {at}: path states {value:#x} are not four 2-bit codes")]
    States { at: At, value: u32 },
    #[error("summary byte {at}: RTT {value} is more than {MAX_RTT_US} µs")]
    Rtt { at: usize, value: u64 },
    #[error("summary has {extra} bytes after its last peer")]
    Trailing { extra: usize },
}

/// One agent's last round, as published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    observer: String,
    seq: u64,
    at_ms: u64,
    /// How often the observer summarises, ms (0: not said).
    cadence_ms: u64,
    /// Sorted by name, unique, at most [`MAX_PEERS`].
    peers: Vec<PeerSummary>,
}

/// The longest cadence a summary is believed to claim: past it, a summary
/// is stale after [`STALE_ROUNDS`] of this.
pub const MAX_CADENCE_MS: u64 = 10 * 60 * 1000;

/// The first 64 characters of an over-long name, for an error.
fn shown(name: &str) -> String {
    name.chars().take(64).collect()
}

fn check_name(what: &'static str, name: &str) -> Result<(), SummaryError> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(SummaryError::NameLength {
            what,
            name: shown(name),
            len: name.len(),
        });
    }
    Ok(())
}

impl Summary {
    /// A summary of `peers` as seen by `observer` in its round `seq`, which
    /// ended at `at_ms` (epoch ms). Sorts the peers; refuses duplicates,
    /// names of 0 or more than [`MAX_NAME_LEN`] bytes, and more than
    /// [`MAX_PEERS`] peers. RTTs are kept for paths in Success only.
    pub fn new(
        observer: String,
        seq: u64,
        at_ms: u64,
        mut peers: Vec<PeerSummary>,
    ) -> Result<Self, SummaryError> {
        check_name("observer", &observer)?;
        if peers.len() > MAX_PEERS {
            return Err(SummaryError::TooManyPeers {
                count: peers.len() as u64,
            });
        }
        for p in &mut peers {
            check_name("peer", &p.name)?;
            for path in &mut p.paths {
                *path =
                    PathSample::with_failing(path.state, path.rtt_us.map(u64::from), path.failing)
                        .with_lossy(path.lossy)
                        .with_plaintext(path.plaintext);
            }
        }
        peers.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        if let Some(w) = peers.windows(2).find(|w| w[0].name == w[1].name) {
            return Err(SummaryError::DuplicatePeer {
                name: w[0].name.clone(),
            });
        }
        Ok(Self {
            observer,
            seq,
            at_ms,
            cadence_ms: 0,
            peers,
        })
    }

    /// The summary of the prober's last round: its local node is the
    /// observer; `seq` is the round's; `at_ms` is when it ended. A status
    /// of more than [`MAX_PEERS`] nodes (`--probe-peers all` on a large
    /// cluster) keeps the peers not in Success first, then the first by
    /// name: a missing observation only takes one observer from a node, a
    /// missing failure would hide it.
    pub fn from_status(status: &ClusterStatus) -> Result<Self, SummaryError> {
        let observer = status.local_node.clone().ok_or(SummaryError::NoLocalNode)?;
        let round = status.round.as_ref().ok_or(SummaryError::NoRound)?;
        let mut peers: Vec<PeerSummary> = status
            .nodes
            .iter()
            .filter(|n| !n.name.is_empty() && n.name.len() <= MAX_NAME_LEN)
            .map(PeerSummary::from_status)
            .collect();
        if peers.len() > MAX_PEERS {
            // Stable: by name within each group.
            peers.sort_by_key(|p| p.state() == ProbeResult::Success);
            peers.truncate(MAX_PEERS);
        }
        Self::new(
            observer,
            round.seq,
            round.started_ms.saturating_add(round.duration_ms),
            peers,
        )
    }

    /// The same summary, as of `at_ms` when that is later: the observer
    /// confirmed its observations since the round (its liveness echoes
    /// were answered, or the nodes that were not were probed again).
    #[must_use]
    pub fn confirmed_at(mut self, at_ms: u64) -> Self {
        self.at_ms = self.at_ms.max(at_ms);
        self
    }

    /// The same summary, saying that its observer summarises every
    /// `cadence`.
    #[must_use]
    pub fn with_cadence(mut self, cadence: std::time::Duration) -> Self {
        self.cadence_ms = u64::try_from(cadence.as_millis()).unwrap_or(u64::MAX);
        self
    }

    /// How often its observer summarises, ms (0: not said).
    #[must_use]
    pub const fn cadence_ms(&self) -> u64 {
        self.cadence_ms
    }

    /// Whether the summary still counts at `now_ms` for a reader that
    /// counts one that ended before `oldest_ms` stale at its own cadence:
    /// it does, or it is within [`STALE_ROUNDS`] of the cadence its
    /// observer says it summarises at (at most [`MAX_CADENCE_MS`]), so an
    /// observer that summarises less often than the reader (its liveness
    /// echoes off, another probe interval, a reload rolling through the
    /// cluster) is not left out between its heartbeats.
    #[must_use]
    pub fn current(&self, oldest_ms: u64, now_ms: u64) -> bool {
        if self.at_ms >= oldest_ms {
            return true;
        }
        let own = self
            .cadence_ms
            .min(MAX_CADENCE_MS)
            .saturating_mul(u64::from(STALE_ROUNDS));
        now_ms > 0 && self.at_ms.saturating_add(own) >= now_ms
    }

    #[must_use]
    pub fn observer(&self) -> &str {
        &self.observer
    }

    /// The observer's round number (it restarts with the agent).
    #[must_use]
    pub const fn seq(&self) -> u64 {
        self.seq
    }

    /// When the round ended, epoch ms.
    #[must_use]
    pub const fn at_ms(&self) -> u64 {
        self.at_ms
    }

    /// Sorted by name, unique.
    #[must_use]
    pub fn peers(&self) -> &[PeerSummary] {
        &self.peers
    }

    /// The peer called `name`.
    #[must_use]
    pub fn peer(&self, name: &str) -> Option<&PeerSummary> {
        self.peers
            .binary_search_by(|p| p.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.peers[i])
    }

    /// The wire form, version 3 (the module's documentation describes it).
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        wire::encode(self)
    }

    /// The form of agents one version older (version 2): what a rolling
    /// upgrade still reads.
    #[must_use]
    pub fn encode_version_2(&self) -> Vec<u8> {
        v2::encode(self)
    }

    /// Reads any version this agent reads (3, 2 and 1), told apart by the
    /// first byte; anything else is an error naming where it is.
    pub fn decode(bytes: &[u8]) -> Result<Self, SummaryError> {
        match bytes.first() {
            None => Err(SummaryError::Empty),
            Some(&VERSION) => wire::decode(bytes),
            Some(&v @ (VERSION_2 | VERSION_1)) => v2::decode(v, bytes),
            Some(&found) => Err(SummaryError::Version { found }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::{
        cluster::subset::{ProbePeers, SubsetPlan},
        membership::{Node, NodeSet},
        probe::status::{Connectivity, RoundInfo},
    };

    /// A small PRNG for the tests (splitmix64).
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    fn ok(rtt_us: u32) -> PathSample {
        PathSample {
            state: ProbeResult::Success,
            rtt_us: Some(rtt_us),
            failing: false,
            lossy: false,
            plaintext: false,
        }
    }

    fn peer(name: &str, paths: [PathSample; 4]) -> PeerSummary {
        PeerSummary {
            name: name.into(),
            paths,
        }
    }

    fn failed() -> PathSample {
        PathSample::new(ProbeResult::Failure, None)
    }

    fn sample() -> Summary {
        Summary::new(
            "node-b".into(),
            42,
            1_790_000_000_123,
            vec![
                peer("node-c", [ok(120), ok(480), failed(), PathSample::UNKNOWN]),
                peer(
                    "node-d",
                    [PathSample::FAILING, ok(9), failed(), PathSample::FAILING],
                ),
                peer(
                    "node-a",
                    [
                        ok(0),
                        ok(u32::MAX),
                        ok(70),
                        PathSample::new(ProbeResult::Success, None),
                    ],
                ),
                peer("node-b", [failed(); 4]),
                peer("nod", [PathSample::UNKNOWN; 4]),
            ],
        )
        .expect("valid")
    }

    #[test]
    fn round_trips() {
        let s = sample();
        let names: Vec<&str> = s.peers().iter().map(|p| p.name.as_str()).collect();
        assert_eq!(
            names,
            ["nod", "node-a", "node-b", "node-c", "node-d"],
            "sorted"
        );
        assert_eq!(
            s.peer("node-d").map(|p| p.paths.map(|p| p.failing)),
            Some([true, false, false, true]),
            "failing paths are kept"
        );
        assert_eq!(
            s.peer("node-a").map(|p| p.paths[1].rtt_us),
            Some(Some(MAX_RTT_US)),
            "saturated"
        );
        let bytes = s.encode();
        assert_eq!(bytes[0], VERSION);
        assert_eq!(Summary::decode(&bytes), Ok(s.clone()));
        assert_eq!(
            s.peer("node-c").map(PeerSummary::state),
            Some(ProbeResult::Failure)
        );
    }

    #[test]
    fn construction_refuses_what_cannot_be_encoded() {
        let long = "x".repeat(MAX_NAME_LEN + 1);
        assert!(matches!(
            Summary::new(long.clone(), 1, 1, vec![]),
            Err(SummaryError::NameLength {
                what: "observer",
                ..
            })
        ));
        let err =
            Summary::new("a".into(), 1, 1, vec![peer(&long, [failed(); 4])]).expect_err("long");
        assert!(err.to_string().contains("254 bytes long"), "{err}");
        let err = Summary::new(
            "a".into(),
            1,
            1,
            vec![peer("b", [failed(); 4]), peer("b", [failed(); 4])],
        )
        .expect_err("dup");
        assert_eq!(err, SummaryError::DuplicatePeer { name: "b".into() });
        let many = (0..=MAX_PEERS)
            .map(|i| peer(&format!("n{i}"), [failed(); 4]))
            .collect();
        assert!(matches!(
            Summary::new("a".into(), 1, 1, many),
            Err(SummaryError::TooManyPeers { .. })
        ));
        // The longest names round-trip.
        let a = "a".repeat(MAX_NAME_LEN);
        let b = "b".repeat(MAX_NAME_LEN);
        let s = Summary::new(
            a.clone(),
            1,
            1,
            vec![peer(&a, [ok(1); 4]), peer(&b, [ok(1); 4])],
        )
        .expect("valid");
        assert_eq!(Summary::decode(&s.encode()), Ok(s));
    }

    fn path(result: ProbeResult, rtt_ns: Option<u64>) -> PathState {
        PathState {
            result,
            rtt_ns,
            ..PathState::default()
        }
    }

    #[test]
    fn a_dual_stack_peers_path_is_the_worse_of_its_families() {
        let conn = |ip: std::net::IpAddr, icmp, http| Connectivity {
            ip,
            family: crate::probe::family::Family::of(ip),
            icmp,
            http,
            encryption: None,
        };
        let v4: std::net::IpAddr = Ipv4Addr::new(198, 18, 0, 2).into();
        let v6: std::net::IpAddr = "2001:2::2".parse().expect("ip");
        let ok_path = |us: u64| path(ProbeResult::Success, Some(us * 1000));
        let n = NodeStatus {
            name: "peer".into(),
            host: conn(v4, ok_path(10), ok_path(20)),
            endpoint: conn(v4, path(ProbeResult::Unknown, None), ok_path(40)),
            host_secondary: Some(Box::new(conn(
                v6,
                path(ProbeResult::Failure, None),
                ok_path(21),
            ))),
            endpoint_secondary: Some(Box::new(conn(v6, ok_path(31), ok_path(41)))),
        };
        let p = PeerSummary::from_status(&n);
        assert_eq!(
            p.paths.map(|p| p.state),
            [
                ProbeResult::Failure,
                ProbeResult::Success,
                ProbeResult::Unknown,
                ProbeResult::Success
            ]
        );
        assert_eq!(p.paths[1].rtt_us, Some(20), "the primary family's RTT");
        assert_eq!(p.state(), ProbeResult::Failure);
    }

    #[test]
    fn a_path_in_success_whose_last_probe_failed_is_failing() {
        let state = |result, consecutive_failures| PathState {
            result,
            consecutive_failures,
            rtt_ns: Some(80_000),
            ..PathState::default()
        };
        assert_eq!(
            PathSample::from_state(&state(ProbeResult::Success, 1)),
            PathSample::FAILING
        );
        assert_eq!(
            PathSample::from_state(&state(ProbeResult::Success, 0)),
            PathSample::new(ProbeResult::Success, Some(80))
        );
        // Past the threshold it is a failure, not failing; unknown stays so.
        for result in [ProbeResult::Failure, ProbeResult::Unknown] {
            let p = PathSample::from_state(&state(result, 2));
            assert_eq!((p.state, p.failing), (result, false));
        }
    }

    #[test]
    fn from_status_takes_the_states_and_the_round() {
        let conn = |icmp, http| Connectivity {
            ip: Ipv4Addr::new(198, 18, 0, 1).into(),
            family: crate::probe::family::Family::Ipv4,
            icmp,
            http,
            encryption: None,
        };
        let status = ClusterStatus {
            local_node: Some("me".into()),
            probe_interval_ms: 3000,
            probe_timeout_ms: 1000,
            round: Some(RoundInfo {
                seq: 7,
                started_ms: 1000,
                duration_ms: 250,
                probes: 8,
            }),
            encryption: None,
            nodes: vec![
                NodeStatus {
                    name: "me".into(),
                    host: conn(
                        path(ProbeResult::Success, Some(81_999)),
                        path(ProbeResult::Success, Some(400_000)),
                    ),
                    endpoint: conn(
                        path(ProbeResult::Failure, Some(5_000)),
                        path(ProbeResult::Unknown, None),
                    ),
                    host_secondary: None,
                    endpoint_secondary: None,
                },
                NodeStatus {
                    name: "peer".into(),
                    host: conn(
                        path(ProbeResult::Success, None),
                        path(ProbeResult::Success, Some(u64::MAX)),
                    ),
                    endpoint: conn(
                        path(ProbeResult::Success, Some(999)),
                        path(ProbeResult::Success, Some(1000)),
                    ),
                    host_secondary: None,
                    endpoint_secondary: None,
                },
            ],
        };
        let s = Summary::from_status(&status).expect("summary");
        assert_eq!((s.observer(), s.seq(), s.at_ms()), ("me", 7, 1250));
        let me = s.peer("me").expect("self is a peer");
        assert_eq!(me.paths[0], ok(81));
        assert_eq!(me.paths[1], ok(400));
        assert_eq!(me.paths[2], failed(), "no RTT kept for a failed path");
        assert_eq!(me.paths[3], PathSample::UNKNOWN);
        let p = s.peer("peer").expect("peer");
        assert_eq!(
            p.paths.map(|p| p.rtt_us),
            [None, Some(MAX_RTT_US), Some(0), Some(1)]
        );
        assert_eq!(Summary::decode(&s.encode()), Ok(s));

        let mut no_round = status.clone();
        no_round.round = None;
        assert_eq!(Summary::from_status(&no_round), Err(SummaryError::NoRound));
        let mut nameless = status;
        nameless.local_node = None;
        assert_eq!(
            Summary::from_status(&nameless),
            Err(SummaryError::NoLocalNode)
        );
    }

    #[test]
    fn a_large_full_mesh_keeps_its_failures() {
        let conn = |r| Connectivity {
            ip: Ipv4Addr::new(198, 18, 0, 1).into(),
            family: crate::probe::family::Family::Ipv4,
            icmp: path(r, Some(100_000)),
            http: path(r, Some(100_000)),
            encryption: None,
        };
        let nodes = (0..MAX_PEERS + 10)
            .map(|i| NodeStatus {
                name: format!("n{i:05}"),
                host: conn(if i % 1000 == 999 || i == 4100 {
                    ProbeResult::Failure
                } else {
                    ProbeResult::Success
                }),
                endpoint: conn(ProbeResult::Success),
                host_secondary: None,
                endpoint_secondary: None,
            })
            .collect();
        let status = ClusterStatus {
            local_node: Some("n00000".into()),
            probe_interval_ms: 3000,
            probe_timeout_ms: 1000,
            round: Some(RoundInfo {
                seq: 1,
                started_ms: 0,
                duration_ms: 0,
                probes: 0,
            }),
            encryption: None,
            nodes,
        };
        let s = Summary::from_status(&status).expect("summary");
        assert_eq!(s.peers().len(), MAX_PEERS);
        assert!(
            s.peer("n04100").is_some(),
            "the failing peer past the bound is kept"
        );
        assert!(
            s.peer("n04105").is_none(),
            "a reachable one past the bound is not"
        );
    }

    /// Names of a 50,000-node cluster in zones of 20 and the peers one node
    /// probes with K = 32: self, its zone, 32 others.
    fn realistic(name: impl Fn(usize) -> String) -> (NodeSet, Vec<usize>) {
        let nodes: Vec<Node> = (0..50_000)
            .map(|i| Node {
                name: name(i),
                node_ip: Some(Ipv4Addr::from(
                    0xc612_0000 + u32::try_from(i).expect("small"),
                )),
                health_ip: Some(Ipv4Addr::from(
                    0xc613_0000 + u32::try_from(i).expect("small"),
                )),
                node_ip6: None,
                health_ip6: None,
                zone: Some(format!("zone-{}", i / 20)),
            })
            .collect();
        let nodes = NodeSet::new(nodes).expect("unique");
        let plan = SubsetPlan::new(&nodes);
        let picks = plan.assigned_index(12_345, ProbePeers::Count(32));
        assert_eq!(picks.len(), 52, "self, 19 zone peers, 32 others");
        (nodes, picks)
    }

    #[test]
    fn a_round_of_k_32_and_a_zone_of_20_fits_in_1_5_kib() {
        let aws = |i: usize| {
            format!(
                "ip-10-{}-{}-{}.eu-west-1.compute.internal",
                16 + i / 65_536,
                (i / 256) % 256,
                i % 256
            )
        };
        let gke = |i: usize| {
            let h = super::super::subset::name_hash(&i.to_string());
            format!("gke-prod-default-pool-{:08x}-{:04x}", h >> 32, h & 0xffff)
        };
        let mut rng = Rng(7);
        for (style, name) in [("aws", &aws as &dyn Fn(usize) -> String), ("gke", &gke)] {
            let (nodes, picks) = realistic(name);
            // ICMP 50-500 µs, HTTP 200-5,000 µs.
            let peers = picks
                .iter()
                .map(|&i| {
                    let paths = std::array::from_fn(|p| {
                        if p % 2 == 0 {
                            ok(50 + rng.below(450) as u32)
                        } else {
                            ok(200 + rng.below(4800) as u32)
                        }
                    });
                    peer(&nodes[i].name, paths)
                })
                .collect();
            let me = nodes[picks[0]].name.clone();
            let s = Summary::new(me, 1_000_000, 1_790_000_000_000, peers).expect("valid");
            let bytes = s.encode();
            assert!(
                bytes.len() <= 1536,
                "{style}: {} bytes for 52 peers",
                bytes.len()
            );
            let v2 = s.encode_version_2();
            // The protobuf form costs the columns' tags and lengths, and
            // the envelope's length: a few bytes (aws 893 against 875,
            // gke 1,322 against 1,304).
            assert!(
                bytes.len() <= v2.len() + 32,
                "{style}: {} bytes, {} in version 2",
                bytes.len(),
                v2.len()
            );
            assert_eq!(Summary::decode(&v2).as_ref(), Ok(&s));
            assert_eq!(Summary::decode(&bytes), Ok(s));
        }
        // The bound per peer is what the worst case takes.
        let names: Vec<String> = (0..3)
            .map(|i| format!("{i}{}", "x".repeat(MAX_NAME_LEN - 1)))
            .collect();
        let worst: Vec<PeerSummary> = names.iter().map(|n| peer(n, [ok(MAX_RTT_US); 4])).collect();
        let bytes = Summary::new("a".into(), 0, 0, worst)
            .expect("valid")
            .encode();
        assert!(bytes.len() <= 16 + 3 * MAX_PEER_BYTES, "{}", bytes.len());
    }

    #[test]
    fn garbage_is_refused_never_panics() {
        assert_eq!(Summary::decode(&[]), Err(SummaryError::Empty));
        assert_eq!(
            Summary::decode(&[9]),
            Err(SummaryError::Version { found: 9 })
        );
        for good in [sample().encode(), sample().encode_version_2()] {
            // Every truncation is an error.
            for n in 0..good.len() {
                assert!(
                    Summary::decode(&good[..n]).is_err(),
                    "version {}: truncated to {n}",
                    good[0]
                );
            }
            let mut longer = good.clone();
            longer.push(0);
            assert_eq!(
                Summary::decode(&longer),
                Err(SummaryError::Trailing { extra: 1 })
            );
        }
        // Version 2: a peer count beyond the bound, with no bytes behind it.
        let mut huge = vec![VERSION_2, 1, b'a', 0, 0];
        v2::put_varint(&mut huge, u64::MAX);
        assert!(matches!(
            Summary::decode(&huge),
            Err(SummaryError::TooManyPeers { .. })
        ));
        // An overlong varint.
        let mut overlong = vec![VERSION_2, 1, b'a'];
        overlong.extend([0xff; 11]);
        assert!(matches!(
            Summary::decode(&overlong),
            Err(SummaryError::Varint { .. })
        ));
        // Peers out of order, a state code of 3, a name built past the previous one.
        let unsorted = [
            VERSION_2, 1, b'a', 0, 0, 2, 0, 0, 1, b'b', 0, 0, 0, 1, b'a', 0,
        ];
        assert!(
            matches!(Summary::decode(&unsorted), Err(SummaryError::Order { .. })),
            "{:?}",
            Summary::decode(&unsorted)
        );
        // State code 3 (failing) is not in version 1; in version 2 it is a
        // path in Success whose last probe failed, with no RTT behind it.
        let state3 = [VERSION_1, 1, b'a', 0, 0, 1, 0, 0, 1, b'b', 3];
        assert_eq!(
            Summary::decode(&state3),
            Err(SummaryError::State { at: At::Byte(10) })
        );
        let mut failing = state3;
        failing[0] = VERSION_2;
        let read = Summary::decode(&failing).expect("version 2 reads code 3");
        assert_eq!(
            read.peer("b").map(|p| p.paths),
            Some([
                PathSample::FAILING,
                PathSample::UNKNOWN,
                PathSample::UNKNOWN,
                PathSample::UNKNOWN
            ])
        );
        // A version-1 summary (no code 3) still reads.
        let v1 = [VERSION_1, 1, b'a', 0, 0, 1, 0, 0, 1, b'b', 2];
        assert_eq!(
            Summary::decode(&v1).map(|s| s.peer("b").map(|p| p.paths[0].state)),
            Ok(Some(ProbeResult::Failure))
        );
        let coding = [VERSION_2, 1, b'a', 0, 0, 1, 1, 0, 1, b'b', 0];
        assert!(matches!(
            Summary::decode(&coding),
            Err(SummaryError::NameCoding { .. })
        ));
        let utf8 = [VERSION_2, 1, 0xff, 0, 0, 0];
        assert!(matches!(
            Summary::decode(&utf8),
            Err(SummaryError::NameUtf8 { .. })
        ));

        // Random bytes, and random flips of a good summary, in both
        // versions: an answer, never a panic; what decodes re-encodes to a
        // summary that decodes the same.
        let mut rng = Rng(1);
        for good in [sample().encode(), sample().encode_version_2()] {
            for i in 0..20_000 {
                let bytes: Vec<u8> = if i % 2 == 0 {
                    let len = rng.below(64) as usize;
                    let mut b: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                    if let Some(v) = b.first_mut() {
                        *v = good[0];
                    }
                    b
                } else {
                    let mut b = good.clone();
                    for _ in 0..=rng.below(3) {
                        let at = rng.below(b.len() as u64) as usize;
                        b[at] ^= 1 << rng.below(8);
                    }
                    b
                };
                if let Ok(s) = Summary::decode(&bytes) {
                    assert!(s.peers().windows(2).all(|w| w[0].name < w[1].name));
                    assert_eq!(Summary::decode(&s.encode()), Ok(s));
                }
            }
        }
    }

    /// A version-3 value around a message written by hand.
    fn forged(m: &wire::proto::Summary) -> Vec<u8> {
        let mut out = vec![VERSION];
        prost::Message::encode_length_delimited(m, &mut out).expect("a Vec");
        out
    }

    /// A message of peers given as (prefix, suffix, middle, states).
    fn message(peers: &[(u32, u32, &str, u32)], rtt: Vec<u32>) -> wire::proto::Summary {
        wire::proto::Summary {
            plaintext_paths: Vec::new(),
            plaintext_peer: Vec::new(),
            observer: "a".into(),
            seq: 1,
            at_ms: 2,
            prefix: peers.iter().map(|p| p.0).collect(),
            suffix: peers.iter().map(|p| p.1).collect(),
            middle_len: peers.iter().map(|p| p.2.len() as u32).collect(),
            middles: peers.iter().flat_map(|p| p.2.bytes()).collect(),
            states: peers.iter().map(|p| p.3).collect(),
            rtt,
            lossy_peer: Vec::new(),
            lossy_paths: Vec::new(),
            cadence_ms: 0,
        }
    }

    /// The cadence travels with the summary; one written without it (an
    /// older agent, version 2) reads as not said.
    #[test]
    fn the_cadence_travels_and_is_not_said_by_older_forms() {
        let s = sample().with_cadence(std::time::Duration::from_secs(60));
        let back = Summary::decode(&s.encode()).expect("decodes");
        assert_eq!(back.cadence_ms(), 60_000);
        assert_eq!(back, s);
        let v2 = Summary::decode(&s.encode_version_2()).expect("decodes");
        assert_eq!(v2.cadence_ms(), 0);
    }

    /// A reader at a 3 s cadence counts a summary older than its window
    /// stale, unless the summary says its observer summarises less often
    /// and it is within that cadence's window; a claimed cadence is
    /// believed up to [`MAX_CADENCE_MS`].
    #[test]
    fn a_summary_is_current_by_its_own_cadence_when_slower_than_the_readers() {
        let at = sample().at_ms();
        let mine = u64::from(STALE_ROUNDS) * 3_000;
        let now = at + mine + 1;
        let oldest = now - mine;
        let unsaid = sample();
        assert!(
            !unsaid.current(oldest, now),
            "stale at the reader's cadence"
        );
        assert!(unsaid.current(at, now), "within the reader's window");
        let slow = sample().with_cadence(std::time::Duration::from_secs(60));
        assert!(slow.current(oldest, now));
        assert!(slow.current(oldest, at + u64::from(STALE_ROUNDS) * 60_000));
        assert!(!slow.current(oldest, at + u64::from(STALE_ROUNDS) * 60_000 + 1));
        let claims = sample().with_cadence(std::time::Duration::from_hours(24));
        let past_max = at + u64::from(STALE_ROUNDS) * MAX_CADENCE_MS + 1;
        assert!(
            !claims.current(oldest, past_max),
            "believed up to the maximum"
        );
        assert!(!slow.current(oldest, 0), "no clock, no extension");
    }

    #[test]
    fn lossy_paths_travel_in_a_sparse_column_and_cost_nothing_without_them() {
        let plain = sample();
        let mut lossy = plain.clone();
        let d = lossy
            .peers
            .iter_mut()
            .find(|p| p.name == "node-d")
            .expect("node-d");
        // A path in Success, lossy; one failing its last probe, lossy too.
        d.paths[1] = d.paths[1].with_lossy(true);
        d.paths[3] = d.paths[3].with_lossy(true);
        assert_eq!(d.lossy_bits(), 0b1010, "{d:?}");
        let bytes = lossy.encode();
        assert_eq!(Summary::decode(&bytes), Ok(lossy.clone()));
        assert!(bytes.len() > plain.encode().len(), "the column is written");
        assert!(
            !PathSample::new(ProbeResult::Failure, None)
                .with_lossy(true)
                .lossy,
            "only a path in Success is lossy"
        );
        assert!(
            PathSample::from_state(&PathState {
                result: ProbeResult::Success,
                degraded: true,
                ..PathState::UNKNOWN
            })
            .lossy
        );
    }

    #[test]
    fn version_3_refuses_lossy_paths_out_of_order_empty_or_not_in_success() {
        // node-a: 4 paths in Success; node-b: success, unknown, failure,
        // failing.
        let base = message(
            &[(0, 0, "node-a", 0b01_01_01_01), (5, 0, "b", 0b11_10_00_01)],
            vec![1, 2, 3, 4, 5],
        );
        let with = |peer: Vec<u32>, paths: Vec<u32>| wire::proto::Summary {
            lossy_peer: peer,
            lossy_paths: paths,
            ..base.clone()
        };
        let ok = Summary::decode(&forged(&with(vec![0, 1], vec![0b1111, 0b1001]))).expect("valid");
        assert_eq!(
            ok.peers()
                .iter()
                .map(PeerSummary::lossy_bits)
                .collect::<Vec<_>>(),
            [0b1111, 0b1001]
        );
        for (peer, paths) in [
            (vec![1, 0], vec![1, 1]),  // out of order
            (vec![0, 0], vec![1, 2]),  // twice
            (vec![2], vec![1]),        // no such peer
            (vec![0], vec![0]),        // an empty mask
            (vec![0], vec![0b1_0000]), // a fifth path
            (vec![1], vec![0b0100]),   // a path in Failure
            (vec![1], vec![0b0010]),   // a path unknown
        ] {
            assert!(
                matches!(
                    refused(&with(peer.clone(), paths.clone())),
                    SummaryError::Lossy { .. }
                ),
                "{peer:?} {paths:?}"
            );
        }
        assert!(matches!(
            refused(&with(vec![0, 1], vec![1])),
            SummaryError::Columns { .. }
        ));
    }

    #[test]
    fn plain_text_paths_travel_in_their_own_column_and_bad_masks_are_refused() {
        use crate::encryption::{EncState, PathEncryption};
        // From the status: the endpoint address in plain text marks its
        // two paths; an encrypted host address marks none.
        let mut n = NodeStatus {
            name: "node-b".into(),
            host: Connectivity::new(
                Ipv4Addr::new(198, 18, 1, 12),
                path(ProbeResult::Success, Some(1000)),
                path(ProbeResult::Success, Some(1000)),
            ),
            endpoint: Connectivity::new(
                Ipv4Addr::new(198, 18, 65, 2),
                path(ProbeResult::Success, Some(1000)),
                path(ProbeResult::Success, Some(1000)),
            ),
            host_secondary: None,
            endpoint_secondary: None,
        };
        let enc = |state| {
            Some(Box::new(PathEncryption {
                state,
                peer: None,
                reason: None,
            }))
        };
        n.host.encryption = enc(EncState::Encrypted);
        n.endpoint.encryption = enc(EncState::Plaintext);
        let p = PeerSummary::from_status(&n);
        assert_eq!(p.plaintext_bits(), 0b1100, "{p:?}");
        let s = Summary::new("a".into(), 1, 2, vec![p.clone()]).expect("summary");
        let back = Summary::decode(&s.encode()).expect("decoded");
        assert_eq!(back.peers()[0].plaintext_bits(), 0b1100);
        assert_eq!(back, s);
        // A path not in Success is never plain text.
        assert!(
            !PathSample::new(ProbeResult::Failure, None)
                .with_plaintext(true)
                .plaintext
        );
        // Forged columns: refused, named.
        let base = message(&[(0, 0, "node-a", 0b01_01_01_01)], vec![1, 2, 3, 4]);
        let with = |peer: Vec<u32>, paths: Vec<u32>| wire::proto::Summary {
            plaintext_peer: peer,
            plaintext_paths: paths,
            ..base.clone()
        };
        assert!(Summary::decode(&forged(&with(vec![0], vec![0b0011]))).is_ok());
        for (peer, paths) in [
            (vec![1], vec![1]),
            (vec![0], vec![0]),
            (vec![0], vec![0b1_0000]),
        ] {
            assert!(
                matches!(
                    refused(&with(peer.clone(), paths.clone())),
                    SummaryError::Plaintext { .. }
                ),
                "{peer:?} {paths:?}"
            );
        }
        assert!(matches!(
            refused(&with(vec![0], Vec::new())),
            SummaryError::Columns { .. }
        ));
    }

    #[test]
    fn version_3_reads_its_schema() {
        // Names against the previous one; RTTs in peer then path order.
        let m = message(
            &[(0, 0, "node-a", 0b01_00_01_01), (5, 0, "b", 0b11_10_00_01)],
            vec![0, 8, 121, 10],
        );
        let s = Summary::decode(&forged(&m)).expect("valid");
        assert_eq!((s.observer(), s.seq(), s.at_ms()), ("a", 1, 2));
        assert_eq!(
            s.peer("node-a").map(|p| p.paths),
            Some([
                PathSample::new(ProbeResult::Success, None),
                ok(7),
                PathSample::UNKNOWN,
                ok(120)
            ])
        );
        let b = s.peer("node-b").expect("node-b");
        assert_eq!(
            b.paths,
            [
                ok(9),
                PathSample::UNKNOWN,
                PathSample::new(ProbeResult::Failure, None),
                PathSample::FAILING
            ]
        );
        assert_eq!(Summary::decode(&s.encode()), Ok(s));
    }

    #[test]
    fn version_3_refuses_what_breaks_its_bounds_or_columns() {
        let many = wire::proto::Summary {
            states: vec![0; MAX_PEERS + 1],
            ..message(&[], vec![])
        };
        assert_eq!(
            refused(&many),
            SummaryError::TooManyPeers {
                count: MAX_PEERS as u64 + 1
            }
        );
        let mut short = message(&[(0, 0, "a", 0), (0, 0, "b", 0)], vec![]);
        short.prefix.pop();
        assert_eq!(
            refused(&short),
            SummaryError::Columns {
                what: "name prefixes",
                len: 1,
                expected: 2
            }
        );
        let mut bytes_short = message(&[(0, 0, "ab", 0)], vec![]);
        bytes_short.middles.pop();
        assert!(matches!(
            refused(&bytes_short),
            SummaryError::Columns {
                what: "middle bytes",
                ..
            }
        ));
        for rtt in [vec![], vec![1, 2]] {
            assert_eq!(
                refused(&message(&[(0, 0, "a", 1)], rtt.clone())),
                SummaryError::Columns {
                    what: "RTTs",
                    len: rtt.len(),
                    expected: 1
                }
            );
        }
        // A length past the bound, with no bytes behind it; not protobuf.
        let mut huge = vec![VERSION];
        v2::put_varint(&mut huge, wire::MAX_MESSAGE_BYTES as u64 + 1);
        assert!(matches!(
            Summary::decode(&huge),
            Err(SummaryError::TooLong { .. })
        ));
        assert!(matches!(
            Summary::decode(&[VERSION, 2, 0xff, 0xff]),
            Err(SummaryError::Protobuf(_))
        ));
    }

    fn refused(m: &wire::proto::Summary) -> SummaryError {
        Summary::decode(&forged(m)).expect_err("refused")
    }

    #[test]
    fn version_3_refuses_bad_names_and_states() {
        assert!(matches!(
            refused(&message(&[(0, 0, "b", 0), (0, 0, "a", 0)], vec![])),
            SummaryError::Order {
                at: At::Peer(1),
                ..
            }
        ));
        assert!(
            matches!(
                refused(&message(&[(0, 0, "a", 0), (1, 0, "", 0)], vec![])),
                SummaryError::Order {
                    at: At::Peer(1),
                    ..
                }
            ),
            "a duplicate"
        );
        assert_eq!(
            refused(&message(&[(1, 0, "b", 0)], vec![])),
            SummaryError::NameCoding {
                at: At::Peer(0),
                prefix: 1,
                suffix: 0,
                previous: 0
            }
        );
        let long = "x".repeat(MAX_NAME_LEN + 1);
        assert_eq!(
            refused(&message(&[(0, 0, &long, 0)], vec![])),
            SummaryError::BadNameLength {
                at: At::Peer(0),
                what: "peer",
                len: MAX_NAME_LEN + 1
            }
        );
        for observer in [String::new(), long.clone()] {
            let m = wire::proto::Summary {
                observer,
                ..message(&[], vec![])
            };
            assert!(matches!(
                refused(&m),
                SummaryError::BadNameLength {
                    at: At::Observer,
                    ..
                }
            ));
        }
        let mut utf8 = message(&[(0, 0, "a", 0)], vec![]);
        utf8.middles = vec![0xff];
        assert!(matches!(
            refused(&utf8),
            SummaryError::NameUtf8 {
                at: At::Peer(0),
                ..
            }
        ));
        assert_eq!(
            refused(&message(&[(0, 0, "a", 0x100)], vec![])),
            SummaryError::States {
                at: At::Peer(0),
                value: 0x100
            }
        );
    }

    #[test]
    fn the_most_peers_fit_the_bounds_in_both_versions() {
        // Names of the longest, sharing nothing; every RTT of 5 bytes.
        let mut rng = Rng(3);
        let peers = (0..MAX_PEERS)
            .map(|_| {
                let name: String = (0..MAX_NAME_LEN)
                    .map(|_| char::from(b'a' + rng.below(26) as u8))
                    .collect();
                peer(&name, [ok(MAX_RTT_US); 4])
            })
            .collect();
        let s = Summary::new("x".repeat(MAX_NAME_LEN), u64::MAX, u64::MAX, peers).expect("valid");
        let (v3, v2) = (s.encode(), s.encode_version_2());
        assert!(v3.len() <= 1 + 5 + wire::MAX_MESSAGE_BYTES, "{}", v3.len());
        assert!(v2.len() <= 512 + MAX_PEERS * MAX_PEER_BYTES, "{}", v2.len());
        assert_eq!(Summary::decode(&v3).as_ref(), Ok(&s));
        assert_eq!(Summary::decode(&v2), Ok(s));
    }
}
