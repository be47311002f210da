//! Maps of the echo responder. Pinned by name, so that their contents outlive
//! an agent restart (the agent chooses the bpffs directory).

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray},
};
use health_common::{
    ct::{CtConfig, CtCounter, CtEntry, CtKey},
    encrypt::{WatchCounts, WatchKey},
    maps::{EchoConfig, EchoCounter, MapSizes},
    nat::{
        NatConfig, NatCounter, NatEntry, NatKey,
        fragments::{FRAG_ENTRIES, FragEntry, FragKey},
    },
    rtt::{PendingKey, RttKey, RttStats},
};

/// Per-CPU counters, indexed by `EchoCounter`: no atomics needed (the bpf
/// target has no `fetch_add`), the agent sums the CPUs.
#[map]
pub static ECHO_STATS: PerCpuArray<u64> = PerCpuArray::pinned(EchoCounter::COUNT, 0);

/// The endpoint address the responder answers for.
#[map]
pub static ECHO_CONFIG: Array<EchoConfig> = Array::pinned(1, 0);

/// Sizes declared here are the defaults; the loader sizes every map that
/// grows with the cluster from the agent's flags (`MapSizes`).
const SIZES: MapSizes = MapSizes::DEFAULT;
const RTT_KEYS: u32 = SIZES.max_peers * MapSizes::RTT_KEYS_PER_PEER;
const WATCH_KEYS: u32 = SIZES.max_peers * MapSizes::WATCH_KEYS_PER_PEER;

/// Connection tracking entries (LRU: the oldest go first when full).
#[map]
pub static CT_MAP: LruHashMap<CtKey, CtEntry> = LruHashMap::pinned(SIZES.ct, 0);

/// Lifetimes, set by the agent.
#[map]
pub static CT_CONFIG: Array<CtConfig> = Array::pinned(1, 0);

/// Per-CPU counters, indexed by `CtCounter`.
#[map]
pub static CT_STATS: PerCpuArray<u64> = PerCpuArray::pinned(CtCounter::COUNT, 0);

/// Requests waiting for their reply: timestamp (ns) of the request.
#[map]
pub static RTT_PENDING: LruHashMap<PendingKey, u64> = LruHashMap::pinned(RTT_KEYS, 0);

/// Per peer and protocol RTT statistics (LRU: a peer never seen again goes
/// first; the agent also removes peers that left the cluster). One value
/// a key, shared by the CPUs, not one per CPU: a per-CPU map is allocated
/// whole for every possible CPU, 240 bytes a key each (960 MiB at the
/// default 65,536 keys on a 64-CPU node), and each round reads it whole.
#[map]
pub static RTT_STATS: LruHashMap<RttKey, RttStats> = LruHashMap::pinned(RTT_KEYS, 0);

/// Unanswered requests per peer and protocol, counted by the agent's sweep.
#[map]
pub static RTT_LOSSES: LruHashMap<RttKey, u64> = LruHashMap::pinned(RTT_KEYS, 0);

/// Masquerade pairs (`OUT` and `IN` halves of each flow; LRU like Cilium's
/// SNAT table: a full table evicts the least recently used pair, and the
/// egress program restores an evicted reverse half on the next packet).
#[map]
pub static NAT_MAP: LruHashMap<NatKey, NatEntry> = LruHashMap::pinned(SIZES.nat, 0);

/// Masquerade settings, set by the agent (all zero: off).
#[map]
pub static NAT_CONFIG: Array<NatConfig> = Array::pinned(1, 0);

/// Masqueraded datagrams whose later fragments may still come (LRU: the
/// oldest go first; the fragments of a datagram may arrive in any order
/// after its first, so no record is removed early).
#[map]
pub static NAT_FRAGS: LruHashMap<FragKey, FragEntry> = LruHashMap::pinned(FRAG_ENTRIES, 0);

/// Per-CPU counters, indexed by `NatCounter`.
#[map]
pub static NAT_STATS: PerCpuArray<u64> = PerCpuArray::pinned(NatCounter::COUNT, 0);

/// Probe packets per watched destination (the peers' node and health
/// addresses while encryption is checked): the agent adds and removes the
/// keys, the egress programs count. One value a key, shared by the CPUs,
/// as `RTT_STATS`: a per-CPU map is allocated for every possible CPU.
#[map]
pub static ENCRYPT_WATCH: HashMap<WatchKey, WatchCounts> = HashMap::pinned(WATCH_KEYS, 0);

/// The layout version of these maps (`PIN_LAYOUT_VERSION`), written by the
/// agent after loading: pinned with the rest, it tells the next agent which
/// layout the pins it inherits were made with. No program reads it.
#[map]
pub static PIN_LAYOUT: Array<u32> = Array::pinned(1, 0);
