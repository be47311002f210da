//! Names, keys and values of the maps the kernel programs share with the agent.

use crate::{
    ct::{CtConfig, CtEntry, CtKey},
    encrypt::{WatchCounts, WatchKey},
    nat::{
        NatConfig, NatEntry, NatKey,
        fragments::{FragEntry, FragKey},
    },
    rtt::{PendingKey, RttKey, RttStats},
};

/// The version of the pinned maps' layout as a whole. Bumped whenever a
/// map's type, key or value changes; recorded in [`MapId::PinLayout`] so an
/// agent finds out which layout the pins it inherits were made with.
pub const PIN_LAYOUT_VERSION: u32 = 8;

/// The maps whose meaning changed at a layout version while their type,
/// key and value sizes stayed (fields reordered, counters renumbered):
/// the loader cannot see such a change, so pins of an older version are
/// made anew for each map listed at a later version, their entries not
/// carried. A change of size or type needs no entry here: the loader
/// replaces that pin and carries what keeps its layout. No change so far
/// has kept its sizes.
pub const SAME_SIZE_CHANGES: &[(u32, &[MapId])] = &[];

/// The maps pins made with layout `recorded` cannot be reused for, as far
/// as sizes cannot tell: those of [`SAME_SIZE_CHANGES`] after it, or
/// every map when `recorded` is newer than [`PIN_LAYOUT_VERSION`] (a
/// later agent's layout, unknown to this one).
pub fn remade_since(recorded: u32) -> impl Iterator<Item = MapId> {
    let newer = recorded > PIN_LAYOUT_VERSION;
    MapId::ALL.into_iter().filter(move |id| {
        newer
            || SAME_SIZE_CHANGES
                .iter()
                .any(|(v, maps)| *v > recorded && maps.contains(id))
    })
}

/// How many entries the maps that grow with the cluster hold. The kernel
/// object declares [`MapSizes::DEFAULT`]; the loader sizes each map from
/// the agent's flags before creating it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSizes {
    /// Peers the RTT maps hold (each has [`MapSizes::RTT_KEYS_PER_PEER`]
    /// keys).
    pub max_peers: u32,
    /// Connection-tracking entries.
    pub ct: u32,
    /// Masquerade entries (two per flow).
    pub nat: u32,
    /// RTT statistics and losses: keys (peer address and protocol).
    pub rtt: u32,
    /// RTT requests awaiting their reply.
    pub rtt_pending: u32,
}

impl MapSizes {
    /// RTT keys per peer and address family: ICMP and TCP, to its node IP
    /// and its health IP.
    pub const RTT_KEYS_PER_PEER: u32 = 4;
    /// Watched destinations per peer for the encryption check: its node
    /// and health addresses, in both families.
    pub const WATCH_KEYS_PER_PEER: u32 = 4;
    /// CT and NAT entries per peer by default: a round makes about six
    /// (ICMP and HTTP to two addresses, each direction of a TCP flow), so
    /// eight leaves headroom for flows still closing.
    pub const FLOWS_PER_PEER: u32 = 8;
    pub const DEFAULT_MAX_PEERS: u32 = 16_384;
    pub const DEFAULT: Self = Self::for_peers(Self::DEFAULT_MAX_PEERS);

    /// The default sizes for `max_peers` peers, of one address family,
    /// probed over one flow per path.
    #[must_use]
    pub const fn for_peers(max_peers: u32) -> Self {
        Self::for_peers_and_flows(max_peers, 1, 1)
    }

    /// CT and NAT entries per peer for each probe flow past the first
    /// (`--probe-flows`): ICMP and TCP to two addresses.
    pub const EXTRA_PER_FLOW: u32 = 4;

    /// The default sizes for `max_peers` peers probed over `flows` flows
    /// per path, in `families` address families (1 or 2): each family
    /// has its own RTT keys, and each flow its own request awaiting a
    /// reply.
    #[must_use]
    pub const fn for_peers_and_flows(max_peers: u32, flows: u16, families: u8) -> Self {
        let extra = if flows > 1 { flows as u32 - 1 } else { 0 };
        let per_peer = Self::FLOWS_PER_PEER + extra * Self::EXTRA_PER_FLOW;
        let entries = max_peers.saturating_mul(per_peer);
        let families = if families > 1 { 2 } else { 1 };
        let rtt = max_peers.saturating_mul(Self::RTT_KEYS_PER_PEER * families);
        let flows = if flows > 1 { flows as u32 } else { 1 };
        Self {
            max_peers,
            // Both families' flows share the CT map; only IPv4 is
            // masqueraded.
            ct: entries.saturating_mul(families),
            nat: entries,
            rtt,
            rtt_pending: rtt.saturating_mul(flows),
        }
    }

    /// The size of `map`, for the maps that grow with the cluster.
    #[must_use]
    pub const fn max_entries(&self, map: MapId) -> Option<u32> {
        match map {
            MapId::RttStats | MapId::RttLosses => Some(self.rtt),
            MapId::RttPending => Some(self.rtt_pending),
            MapId::CtMap => Some(self.ct),
            MapId::NatMap => Some(self.nat),
            MapId::EncryptWatch => Some(self.max_peers.saturating_mul(Self::WATCH_KEYS_PER_PEER)),
            _ => None,
        }
    }
}

impl Default for MapSizes {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// The kind of a map, as the kernel names its `bpf_map_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapKind {
    Hash,
    Array,
    PerCpuHash,
    PerCpuArray,
    LruHash,
    LruPerCpuHash,
    RingBuf,
}

impl MapKind {
    /// The kernel's `bpf_map_type` number.
    #[must_use]
    pub const fn bpf_map_type(self) -> u32 {
        match self {
            Self::Hash => 1,
            Self::Array => 2,
            Self::PerCpuHash => 5,
            Self::PerCpuArray => 6,
            Self::LruHash => 9,
            Self::LruPerCpuHash => 10,
            Self::RingBuf => 27,
        }
    }

    /// The name `bpf map list` shows.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Hash => "hash",
            Self::Array => "array",
            Self::PerCpuHash => "percpu_hash",
            Self::PerCpuArray => "percpu_array",
            Self::LruHash => "lru_hash",
            Self::LruPerCpuHash => "lru_percpu_hash",
            Self::RingBuf => "ringbuf",
        }
    }

    /// Whether the map holds keys (hash kinds) rather than fixed slots.
    #[must_use]
    pub const fn is_hash(self) -> bool {
        matches!(
            self,
            Self::Hash | Self::PerCpuHash | Self::LruHash | Self::LruPerCpuHash
        )
    }

    /// Whether each entry holds one value per CPU.
    #[must_use]
    pub const fn is_per_cpu(self) -> bool {
        matches!(
            self,
            Self::PerCpuHash | Self::PerCpuArray | Self::LruPerCpuHash
        )
    }
}

/// Every map of the kernel object: the one registry that the loader, the
/// pin checks and `bpf map list|dump` share. The kernel side declares each
/// with the same name, key and value (`health-ebpf/src/kernel/maps.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapId {
    /// Per-CPU `u64` counters, indexed by [`EchoCounter`].
    EchoStats,
    /// One [`EchoConfig`] at index 0.
    EchoConfig,
    /// Connection tracking: [`CtKey`] -> [`CtEntry`].
    CtMap,
    /// One [`CtConfig`] at index 0.
    CtConfig,
    /// Per-CPU `u64` counters, indexed by `CtCounter`.
    CtStats,
    /// Requests waiting for their reply: [`PendingKey`] -> timestamp (ns).
    RttPending,
    /// [`RttStats`] per peer and protocol, one value shared by the CPUs.
    RttStats,
    /// Unanswered requests per peer and protocol.
    RttLosses,
    /// Masquerade pairs: [`NatKey`] -> [`NatEntry`].
    NatMap,
    /// One [`NatConfig`] at index 0.
    NatConfig,
    /// Per-CPU `u64` counters, indexed by `NatCounter`.
    NatStats,
    /// Masqueraded datagrams whose later fragments may still come:
    /// [`FragKey`] -> [`FragEntry`].
    NatFrags,
    /// One `u32`: the [`PIN_LAYOUT_VERSION`] the pins were made with.
    PinLayout,
    /// Probe packets per watched destination, through the tunnel and in
    /// plain text, one value shared by the CPUs: [`WatchKey`] ->
    /// [`WatchCounts`].
    EncryptWatch,
    /// aya-log's ring buffer.
    AyaLogs,
}

impl MapId {
    pub const ALL: [Self; 15] = [
        Self::EchoStats,
        Self::EchoConfig,
        Self::CtMap,
        Self::CtConfig,
        Self::CtStats,
        Self::RttPending,
        Self::RttStats,
        Self::RttLosses,
        Self::NatMap,
        Self::NatConfig,
        Self::NatStats,
        Self::NatFrags,
        Self::PinLayout,
        Self::EncryptWatch,
        Self::AyaLogs,
    ];

    /// The map's name in the object file, and of its pin.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::EchoStats => ECHO_STATS,
            Self::EchoConfig => ECHO_CONFIG,
            Self::CtMap => CT_MAP,
            Self::CtConfig => CT_CONFIG,
            Self::CtStats => CT_STATS,
            Self::RttPending => RTT_PENDING,
            Self::RttStats => RTT_STATS,
            Self::RttLosses => RTT_LOSSES,
            Self::NatMap => NAT_MAP,
            Self::NatConfig => NAT_CONFIG,
            Self::NatStats => NAT_STATS,
            Self::NatFrags => NAT_FRAGS,
            Self::PinLayout => PIN_LAYOUT,
            Self::EncryptWatch => ENCRYPT_WATCH,
            Self::AyaLogs => AYA_LOGS,
        }
    }

    /// The map called `name`, if the object has one.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }

    #[must_use]
    pub const fn kind(self) -> MapKind {
        match self {
            Self::EchoConfig | Self::CtConfig | Self::NatConfig | Self::PinLayout => MapKind::Array,
            Self::EchoStats | Self::CtStats | Self::NatStats => MapKind::PerCpuArray,
            Self::CtMap
            | Self::RttPending
            | Self::NatMap
            | Self::NatFrags
            | Self::RttLosses
            | Self::RttStats => MapKind::LruHash,
            Self::EncryptWatch => MapKind::Hash,
            Self::AyaLogs => MapKind::RingBuf,
        }
    }

    /// Key size in bytes (`u32` indices for arrays; 0 for the ring buffer).
    #[must_use]
    pub const fn key_size(self) -> u32 {
        (match self {
            Self::CtMap => size_of::<CtKey>(),
            Self::NatMap => size_of::<NatKey>(),
            Self::NatFrags => size_of::<FragKey>(),
            Self::RttPending => size_of::<PendingKey>(),
            Self::RttStats | Self::RttLosses => size_of::<RttKey>(),
            Self::EncryptWatch => size_of::<WatchKey>(),
            Self::AyaLogs => 0,
            _ => size_of::<u32>(),
        }) as u32
    }

    /// Value size in bytes (per CPU for the per-CPU kinds; 0 for the ring
    /// buffer).
    #[must_use]
    pub const fn value_size(self) -> u32 {
        (match self {
            Self::EchoStats
            | Self::CtStats
            | Self::NatStats
            | Self::RttPending
            | Self::RttLosses => size_of::<u64>(),
            Self::EchoConfig => size_of::<EchoConfig>(),
            Self::CtConfig => size_of::<CtConfig>(),
            Self::NatConfig => size_of::<NatConfig>(),
            Self::CtMap => size_of::<CtEntry>(),
            Self::NatMap => size_of::<NatEntry>(),
            Self::NatFrags => size_of::<FragEntry>(),
            Self::RttStats => size_of::<RttStats>(),
            Self::PinLayout => size_of::<u32>(),
            Self::EncryptWatch => size_of::<WatchCounts>(),
            Self::AyaLogs => 0,
        }) as u32
    }
}

const ECHO_STATS: &str = "ECHO_STATS";
const ECHO_CONFIG: &str = "ECHO_CONFIG";
const CT_MAP: &str = "CT_MAP";
const CT_CONFIG: &str = "CT_CONFIG";
const CT_STATS: &str = "CT_STATS";
const RTT_PENDING: &str = "RTT_PENDING";
const RTT_STATS: &str = "RTT_STATS";
const RTT_LOSSES: &str = "RTT_LOSSES";
const NAT_MAP: &str = "NAT_MAP";
const NAT_CONFIG: &str = "NAT_CONFIG";
const NAT_STATS: &str = "NAT_STATS";
const NAT_FRAGS: &str = "NAT_FRAGS";
const PIN_LAYOUT: &str = "PIN_LAYOUT";
const ENCRYPT_WATCH: &str = "ENCRYPT_WATCH";
const AYA_LOGS: &str = "AYA_LOGS";

/// The hook a program is written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgKind {
    Xdp,
    /// tc / tcx (`BPF_PROG_TYPE_SCHED_CLS`).
    SchedClassifier,
}

/// Every program of the kernel object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgId {
    /// The echo responder at XDP.
    EchoXdp,
    /// The echo responder at tc ingress.
    EchoTc,
    /// An `XDP_PASS` program for the far end of a veth: native-mode
    /// `XDP_TX` on a veth only delivers when the peer has an XDP program.
    XdpPass,
    /// Tracking and RTT on the host side of the endpoint's veth: packets
    /// from the endpoint (tc ingress there).
    LxcIngress,
    /// The same, packets to the endpoint (tc egress there).
    LxcEgress,
    /// Masquerade SNAT on the node's uplink, leaving.
    NatEgress,
    /// The reverse translation on the uplink, arriving.
    NatIngress,
    /// Probe packets leaving through the WireGuard device (tc egress
    /// there; no link-layer header).
    TunnelEgress,
    /// Probe packets leaving through any other interface (tc egress on
    /// each Ethernet interface of the node).
    PlainEgress,
}

impl ProgId {
    pub const ALL: [Self; 9] = [
        Self::EchoXdp,
        Self::EchoTc,
        Self::XdpPass,
        Self::LxcIngress,
        Self::LxcEgress,
        Self::NatEgress,
        Self::NatIngress,
        Self::TunnelEgress,
        Self::PlainEgress,
    ];

    /// The program's name in the object file.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::EchoXdp => "health_echo_xdp",
            Self::EchoTc => "health_echo_tc",
            Self::XdpPass => "health_xdp_pass",
            Self::LxcIngress => "health_lxc_ingress",
            Self::LxcEgress => "health_lxc_egress",
            Self::NatEgress => "health_nat_egress",
            Self::NatIngress => "health_nat_ingress",
            Self::TunnelEgress => "health_tunnel_egress",
            Self::PlainEgress => "health_plain_egress",
        }
    }

    #[must_use]
    pub const fn kind(self) -> ProgKind {
        match self {
            Self::EchoXdp | Self::XdpPass => ProgKind::Xdp,
            _ => ProgKind::SchedClassifier,
        }
    }
}

/// Indices into [`MapId::EchoStats`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EchoCounter {
    /// Echo requests turned into replies in the kernel program.
    Answered = 0,
    /// Packets handed on untouched (not for the responder, or skipped).
    Passed = 1,
    /// Packets dropped because their headers were invalid or truncated.
    Malformed = 2,
}

impl EchoCounter {
    pub const COUNT: u32 = 3;
    pub const ALL: [Self; 3] = [Self::Answered, Self::Passed, Self::Malformed];

    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::Answered => "answered",
            Self::Passed => "passed",
            Self::Malformed => "malformed",
        }
    }
}

/// Responder configuration, the only entry of [`MapId::EchoConfig`].
///
/// `addr` is the endpoint's IPv4 address and `addr6` its IPv6 address, in
/// network byte order, and `mac` the MAC of the interface the responder is
/// attached to. An all-zero address means "no address of that family":
/// its packets are passed; an all-zero MAC passes everything.
///
/// `own4` and `own6` hold the interface's other addresses (`own6` its
/// link-local one first; all-zero slots are unused): a request from any
/// of the interface's addresses is the host's own and goes to the stack.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EchoConfig {
    pub addr: [u8; 4],
    /// Frames to this MAC are for this host; a reply to a request sent to
    /// a broadcast or multicast MAC leaves from it, as the kernel's does.
    pub mac: [u8; 6],
    /// `DROP_UNICAST_IN_L2_MULTICAST`, `DROP_UNICAST_IN_L2_MULTICAST6`,
    /// `MORE_OWN4`, `MORE_OWN6`, `REPLY_TO_PEER`, or nothing.
    pub flags: u8,
    pub reserved: u8,
    pub addr6: [u8; 16],
    pub own4: [[u8; 4]; OWN_SLOTS],
    pub own6: [[u8; 16]; OWN_SLOTS],
}

/// Slots for the interface's other addresses of each family in
/// [`EchoConfig`].
pub const OWN_SLOTS: usize = 4;

impl EchoConfig {
    /// The interface drops unicast IPv4 in link-layer broadcast or
    /// multicast frames (`net.ipv4.conf.*.drop_unicast_in_l2_multicast`).
    pub const DROP_UNICAST_IN_L2_MULTICAST: u8 = 1;
    /// The same for IPv6 (`net.ipv6.conf.*.drop_unicast_in_l2_multicast`).
    pub const DROP_UNICAST_IN_L2_MULTICAST6: u8 = 2;
    /// The interface has more IPv4 addresses than `own4` holds: no IPv4
    /// request can be told from the host's own, all go to the stack.
    pub const MORE_OWN4: u8 = 4;
    /// The same for IPv6 and `own6`.
    pub const MORE_OWN6: u8 = 8;
    /// The interface is a veth (or netkit) whose peer is in another
    /// namespace: at tc ingress, a reply goes straight to the peer's
    /// ingress (`bpf_redirect_peer`) instead of out through this device's
    /// transmit path and the peer's backlog queue.
    pub const REPLY_TO_PEER: u8 = 16;
}

// Byte arrays and bytes only: no padding hole anywhere.
const _: () = assert!(size_of::<EchoConfig>() == 108 && align_of::<EchoConfig>() == 1);

// SAFETY: repr(C), no padding (asserted above), every bit pattern valid.
#[cfg(feature = "user")]
unsafe impl aya::Pod for EchoConfig {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_of_a_newer_layout_are_all_remade_and_of_an_older_as_listed() {
        assert_eq!(remade_since(PIN_LAYOUT_VERSION).count(), 0);
        assert_eq!(
            remade_since(PIN_LAYOUT_VERSION + 1).count(),
            MapId::ALL.len()
        );
        assert_eq!(
            remade_since(0).count(),
            MapId::ALL
                .iter()
                .filter(|id| SAME_SIZE_CHANGES.iter().any(|(_, m)| m.contains(id)))
                .count()
        );
        // Listed in order, at versions this agent knows.
        for pair in SAME_SIZE_CHANGES.windows(2) {
            assert!(pair[0].0 < pair[1].0);
        }
        assert!(
            SAME_SIZE_CHANGES
                .iter()
                .all(|(v, _)| *v <= PIN_LAYOUT_VERSION)
        );
    }

    #[test]
    fn no_map_that_grows_with_the_cluster_is_per_cpu() {
        // A per-CPU map is allocated for every possible CPU: sized by the
        // cluster as well, its kernel memory would grow with both.
        let sizes = MapSizes::DEFAULT;
        for map in MapId::ALL {
            if sizes.max_entries(map).is_some() {
                assert!(!map.kind().is_per_cpu(), "{} is per CPU", map.name());
            }
        }
        // The per-CPU maps left are the counters: a few u64 a CPU.
        for map in MapId::ALL.into_iter().filter(|m| m.kind().is_per_cpu()) {
            assert_eq!(map.kind(), MapKind::PerCpuArray, "{}", map.name());
        }
    }

    #[test]
    fn flows_past_the_first_add_their_connections_per_peer() {
        assert_eq!(
            MapSizes::for_peers_and_flows(1000, 1, 1),
            MapSizes::for_peers(1000)
        );
        assert_eq!(
            MapSizes::for_peers_and_flows(1000, 0, 0),
            MapSizes::for_peers(1000)
        );
        let eight = MapSizes::for_peers_and_flows(1000, 8, 1);
        assert_eq!((eight.ct, eight.nat), (36_000, 36_000));
        // Dual stack: the CT map tracks both families' flows, the NAT map
        // IPv4's alone.
        let dual = MapSizes::for_peers_and_flows(1000, 1, 2);
        assert_eq!((dual.ct, dual.nat), (16_000, 8_000));
        assert_eq!(MapSizes::for_peers_and_flows(u32::MAX, 64, 2).ct, u32::MAX);
    }

    /// Dual stack doubles the RTT keys (each address of a peer has its
    /// own); each flow has its own request awaiting a reply.
    #[test]
    fn rtt_maps_hold_every_family_and_flow() {
        let one = MapSizes::for_peers(1000);
        assert_eq!(
            (
                one.max_entries(MapId::RttStats),
                one.max_entries(MapId::RttLosses),
                one.max_entries(MapId::RttPending)
            ),
            (Some(4_000), Some(4_000), Some(4_000))
        );
        let dual = MapSizes::for_peers_and_flows(1000, 3, 2);
        assert_eq!(dual.max_entries(MapId::RttStats), Some(8_000));
        assert_eq!(dual.max_entries(MapId::RttLosses), Some(8_000));
        assert_eq!(dual.max_entries(MapId::RttPending), Some(24_000));
        assert_eq!(
            MapSizes::for_peers_and_flows(u32::MAX, 64, 2).rtt_pending,
            u32::MAX,
            "saturates"
        );
    }

    #[test]
    fn names_are_unique_and_round_trip() {
        for (i, a) in MapId::ALL.iter().enumerate() {
            assert_eq!(MapId::from_name(a.name()), Some(*a));
            for b in &MapId::ALL[i + 1..] {
                assert_ne!(a.name(), b.name());
            }
        }
        for (i, a) in ProgId::ALL.iter().enumerate() {
            for b in &ProgId::ALL[i + 1..] {
                assert_ne!(a.name(), b.name());
            }
        }
        assert_eq!(MapId::from_name("NO_SUCH_MAP"), None);
    }

    #[test]
    fn default_sizes_hold_every_path_of_the_default_peers() {
        let s = MapSizes::default();
        assert_eq!(s.max_entries(MapId::RttStats), Some(16_384 * 4));
        assert_eq!(s.max_entries(MapId::CtMap), Some(131_072));
        assert_eq!(s.max_entries(MapId::EchoStats), None);
        assert_eq!(MapSizes::for_peers(u32::MAX).ct, u32::MAX, "saturates");
        // Datagrams in fragments are rare in health traffic and last a
        // moment: their map holds a burst, whatever the cluster's size.
        assert_eq!(s.max_entries(MapId::NatFrags), None);
        for id in MapId::ALL.into_iter().filter(|m| *m != MapId::NatFrags) {
            assert_eq!(
                s.max_entries(id).is_some(),
                id.kind().is_hash(),
                "{}: every other hash map grows with the cluster",
                id.name()
            );
        }
    }

    #[test]
    fn sizes_follow_the_shared_types() {
        assert_eq!(MapId::CtMap.key_size() as usize, size_of::<CtKey>());
        assert_eq!(MapId::RttStats.value_size() as usize, size_of::<RttStats>());
        assert_eq!(MapId::EchoStats.key_size(), 4);
        assert_eq!(MapId::AyaLogs.kind(), MapKind::RingBuf);
        assert!(MapId::NatMap.kind().is_hash());
        assert!(!MapId::NatConfig.kind().is_hash());
    }
}
