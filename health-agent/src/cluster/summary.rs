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
//! **Held**, a summary keeps each peer's four paths packed (20 bytes, see
//! `Packed`) and its name as a [`PeerName`], a pointer of 8 bytes to a
//! shared copy: the elected assembler holds every observer's summary, and
//! interns their names ([`Names`]) so that the 50 or so summaries naming
//! a node share one copy of its name, 32 bytes a peer in all.
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

mod name;
mod peers;
mod v2;
mod wire;

use std::{collections::HashSet, fmt};

pub use name::PeerName;

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
/// the states (up to 2), four RTTs (5-byte varints), and its index (2)
/// and mask (1) in each of the three sparse columns (lossy, plain text,
/// failed in one family).
pub const MAX_PEER_BYTES: usize = 3 * 2 + MAX_NAME_LEN + 2 + 4 * 5 + 3 * (2 + 1);

/// The largest RTT a summary carries, in µs (71 minutes): larger values are
/// saturated to it.
pub const MAX_RTT_US: u32 = u32::MAX - 1;

/// One path of a peer as the summary keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "independent marks, each carried in a column of its own on the wire"
)]
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
    /// A dual-stack peer's path failed (or failing) in one family while
    /// the other reached it: the peer answers, over that family.
    pub split: bool,
}

impl PathSample {
    pub const UNKNOWN: Self = Self {
        state: ProbeResult::Unknown,
        rtt_us: None,
        failing: false,
        lossy: false,
        plaintext: false,
        split: false,
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
            split: false,
        }
    }

    /// A path in Success whose last probe failed.
    pub const FAILING: Self = Self {
        state: ProbeResult::Success,
        rtt_us: None,
        failing: true,
        lossy: false,
        plaintext: false,
        split: false,
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

    /// The same path, failed in one family only (`split`, kept for a path
    /// in Failure or failing only).
    #[must_use]
    pub const fn with_split(mut self, split: bool) -> Self {
        self.split = split && (matches!(self.state, ProbeResult::Failure) || self.failing);
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

/// A peer's four paths as a summary holds them: each path's state and
/// marks in a byte, its RTT in a `u32` ([`NO_RTT`]: none), 20 bytes where
/// four [`PathSample`]s take 64. The elected assembler holds every
/// observer's summary: 50,000 of about 52 peers each.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Packed {
    marks: [u8; 4],
    rtt_us: [u32; 4],
}

/// An RTT of none, packed: above [`MAX_RTT_US`].
const NO_RTT: u32 = u32::MAX;
const _: () = assert!(MAX_RTT_US < NO_RTT);

/// A packed path's marks: its state in the low two bits, then one bit
/// each.
const FAILING_BIT: u8 = 1 << 2;
const LOSSY_BIT: u8 = 1 << 3;
const PLAINTEXT_BIT: u8 = 1 << 4;
const SPLIT_BIT: u8 = 1 << 5;

impl Packed {
    fn pack(paths: &[PathSample; 4]) -> Self {
        let mark = |p: &PathSample| {
            let state = match p.state {
                ProbeResult::Unknown => 0,
                ProbeResult::Success => 1,
                ProbeResult::Failure => 2,
            };
            let bit = |on: bool, b: u8| if on { b } else { 0 };
            state
                | bit(p.failing, FAILING_BIT)
                | bit(p.lossy, LOSSY_BIT)
                | bit(p.plaintext, PLAINTEXT_BIT)
                | bit(p.split, SPLIT_BIT)
        };
        Self {
            marks: paths.each_ref().map(mark),
            // Saturated as the wire form saturates it.
            rtt_us: paths.map(|p| p.rtt_us.map_or(NO_RTT, |us| us.min(MAX_RTT_US))),
        }
    }

    fn unpack(self) -> [PathSample; 4] {
        std::array::from_fn(|i| {
            let m = self.marks[i];
            PathSample {
                state: match m & 3 {
                    1 => ProbeResult::Success,
                    2 => ProbeResult::Failure,
                    _ => ProbeResult::Unknown,
                },
                rtt_us: (self.rtt_us[i] != NO_RTT).then_some(self.rtt_us[i]),
                failing: m & FAILING_BIT != 0,
                lossy: m & LOSSY_BIT != 0,
                plaintext: m & PLAINTEXT_BIT != 0,
                split: m & SPLIT_BIT != 0,
            }
        })
    }
}

/// One probed peer: its name (shared by every summary held that names
/// it, see [`Names`]) and its four paths, packed.
#[derive(Clone, PartialEq, Eq)]
pub struct PeerSummary {
    pub name: PeerName,
    paths: Packed,
}

impl fmt::Debug for PeerSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PeerSummary")
            .field("name", &self.name)
            .field("paths", &self.paths())
            .finish()
    }
}

impl PeerSummary {
    /// Peer `name` with `paths`: host ICMP, host HTTP, endpoint ICMP,
    /// endpoint HTTP ([`PATHS`]).
    #[must_use]
    pub fn new(name: impl Into<PeerName>, paths: [PathSample; 4]) -> Self {
        Self {
            name: name.into(),
            paths: Packed::pack(&paths),
        }
    }

    /// Host ICMP, host HTTP, endpoint ICMP, endpoint HTTP ([`PATHS`]).
    #[must_use]
    pub fn paths(&self) -> [PathSample; 4] {
        self.paths.unpack()
    }

    /// Changes the paths to `paths`.
    pub fn set_paths(&mut self, paths: [PathSample; 4]) {
        self.paths = Packed::pack(&paths);
    }

    /// The prober's status of a peer. A dual-stack peer's path is as bad
    /// as the worse of its two families (its RTT is the primary family's,
    /// or the secondary's when only that one has an answer), and marked
    /// split when one family fails it while the other reaches it cleanly.
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
            let fails =
                |p: &PathState| p.result == ProbeResult::Failure || p.consecutive_failures > 0;
            let clean =
                |p: &PathState| p.result == ProbeResult::Success && p.consecutive_failures == 0;
            PathSample::with_failing(
                worse(primary.result, second.result),
                rtt.map(|ns| ns / 1000),
                primary.consecutive_failures > 0 || second.consecutive_failures > 0,
            )
            .with_lossy(primary.degraded || second.degraded)
            .with_split((fails(primary) && clean(second)) || (fails(second) && clean(primary)))
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
        Self::new(
            n.name.as_str(),
            [
                path(&n.host.icmp, host6.map(|c| &c.icmp)).with_plaintext(host_plain),
                path(&n.host.http, host6.map(|c| &c.http)).with_plaintext(host_plain),
                path(&n.endpoint.icmp, ep6.map(|c| &c.icmp)).with_plaintext(ep_plain),
                path(&n.endpoint.http, ep6.map(|c| &c.http)).with_plaintext(ep_plain),
            ],
        )
    }

    /// The paths reached in plain text: path i in bit i.
    #[must_use]
    pub fn plaintext_bits(&self) -> u8 {
        self.paths()
            .iter()
            .enumerate()
            .fold(0, |bits, (i, p)| bits | (u8::from(p.plaintext) << i))
    }

    /// Some path reached in plain text.
    #[must_use]
    pub fn plaintext(&self) -> bool {
        self.paths.marks.iter().any(|m| m & PLAINTEXT_BIT != 0)
    }

    /// The paths failed in one family only: path i in bit i.
    #[must_use]
    pub fn split_bits(&self) -> u8 {
        self.paths()
            .iter()
            .enumerate()
            .fold(0, |bits, (i, p)| bits | (u8::from(p.split) << i))
    }

    /// The lossy paths: path i in bit i.
    #[must_use]
    pub fn lossy_bits(&self) -> u8 {
        self.paths()
            .iter()
            .enumerate()
            .fold(0, |bits, (i, p)| bits | (u8::from(p.lossy) << i))
    }

    /// The four states in one byte: path i in bits 2i..2i+1.
    #[must_use]
    pub fn state_bits(&self) -> u8 {
        self.paths()
            .iter()
            .enumerate()
            .fold(0, |bits, (i, p)| bits | (p.code() << (2 * i)))
    }

    /// Failure if any path failed, else Unknown if any is unknown, else
    /// Success (as [`NodeStatus::state`]).
    #[must_use]
    pub fn state(&self) -> ProbeResult {
        let states = self.paths().map(|p| p.state);
        if states.contains(&ProbeResult::Failure) {
            ProbeResult::Failure
        } else if states.contains(&ProbeResult::Unknown) {
            ProbeResult::Unknown
        } else {
            ProbeResult::Success
        }
    }
}

/// Peer names shared by the summaries held ([`Summary::interned`]): one
/// copy of each name, however many summaries name it.
#[derive(Debug, Default)]
pub struct Names {
    held: HashSet<PeerName>,
}

impl Names {
    /// The shared copy of `name`: one held already, else `name` itself,
    /// kept from now on, if `known` accepts it; `None` if it does not.
    /// `known` is asked only of names not held.
    pub fn intern_known(
        &mut self,
        name: &PeerName,
        known: impl FnOnce(&str) -> bool,
    ) -> Option<PeerName> {
        if let Some(held) = self.held.get(name.as_str()) {
            return Some(held.clone());
        }
        if !known(name) {
            return None;
        }
        self.held.insert(name.clone());
        Some(name.clone())
    }

    /// Lets go of the names no summary holds any more, and of those
    /// `known` no longer accepts (a node that left: a summary naming it
    /// again is asked about it anew); how many were let go.
    pub fn prune(&mut self, known: impl Fn(&str) -> bool) -> usize {
        let before = self.held.len();
        self.held.retain(|n| PeerName::shared_by(n) > 1 && known(n));
        before - self.held.len()
    }

    /// The names held.
    #[must_use]
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether no name is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
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
    #[error(
        "summary {at}: paths failed in one family {mask:#06b}: expected 1 to 0b1111, each a path in Failure or failing, peers in order"
    )]
    Split { at: At, mask: u32 },
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
    peers: Box<[PeerSummary]>,
}

/// The longest cadence a summary is believed to claim: past it, a summary
/// is stale after [`STALE_ROUNDS`] of this.
pub const MAX_CADENCE_MS: u64 = 10 * 60 * 1000;

fn check_name(what: &'static str, name: &str) -> Result<(), SummaryError> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err(SummaryError::NameLength {
            what,
            name: crate::util::text::clip(name, 64),
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
            let paths = p.paths().map(|path| {
                PathSample::with_failing(path.state, path.rtt_us.map(u64::from), path.failing)
                    .with_lossy(path.lossy)
                    .with_plaintext(path.plaintext)
                    .with_split(path.split)
            });
            p.set_paths(paths);
        }
        peers.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        if let Some(w) = peers.windows(2).find(|w| w[0].name == w[1].name) {
            return Err(SummaryError::DuplicatePeer {
                name: w[0].name.to_string(),
            });
        }
        Ok(Self {
            observer,
            seq,
            at_ms,
            cadence_ms: 0,
            peers: peers.into_boxed_slice(),
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

    /// The same summary with only the peers `keep` accepts; everything
    /// else, its cadence included, as it was.
    #[must_use]
    pub fn keeping(&self, keep: impl Fn(&PeerSummary) -> bool) -> Self {
        Self {
            observer: self.observer.clone(),
            seq: self.seq,
            at_ms: self.at_ms,
            cadence_ms: self.cadence_ms,
            peers: self.peers.iter().filter(|p| keep(p)).cloned().collect(),
        }
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

    /// The same summary with only the peers whose names `names` holds
    /// already or `known` accepts (the nodes of the reader's node set),
    /// their names shared with every other summary `names` interned them
    /// for, and the names of the peers left out. The elected assembler holds
    /// every observer's summary, each naming about 50 of the same nodes;
    /// and as only known names are held, a writer of summaries who makes
    /// up names makes the assembler hold none of them, whatever their
    /// number. A name held is one a summary taken earlier named while it
    /// was known: one hash lookup, where `known` may search the node set.
    pub fn interned(
        mut self,
        names: &mut Names,
        known: impl Fn(&str) -> bool,
    ) -> (Self, Vec<PeerName>) {
        let mut left_out = Vec::new();
        let mut peers = std::mem::take(&mut self.peers).into_vec();
        peers.retain_mut(|p| {
            if let Some(shared) = names.intern_known(&p.name, &known) {
                p.name = shared;
                true
            } else {
                left_out.push(p.name.clone());
                false
            }
        });
        self.peers = peers.into_boxed_slice();
        (self, left_out)
    }

    /// The peer called `name`.
    #[must_use]
    pub fn peer(&self, name: &str) -> Option<&PeerSummary> {
        self.peers
            .binary_search_by(|p| (*p.name).cmp(name))
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
mod tests;
