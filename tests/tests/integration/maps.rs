//! The maps that grow with the cluster: sized by the loader, their entries
//! carried over when a pin of another size or type is replaced (the RTT
//! statistics of the per-CPU layout folded), and the RTT entries of
//! departed peers pruned.

use std::{
    net::IpAddr,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::Path,
};

use aya::maps::{HashMap, MapData, MapInfo, PerCpuHashMap, PerCpuValues};
use health_agent::datapath::{Datapath, maps, rtt};
use health_common::{
    maps::{MapId, MapSizes, ProgId},
    rtt::{RttKey, RttStats},
};
use health_tests::{pins::PinDir, require_root};

fn key(last: u8, proto: u8) -> RttKey {
    RttKey {
        peer: health_common::ct::v4_mapped([198, 18, 9, last]),
        proto,
        pad: [0; 3],
    }
}

/// A pending echo request (identifier 1) to `peer`, of an agent that
/// sent no payload tag.
fn echo_request(peer: [u8; 16]) -> health_common::rtt::PendingKey {
    health_common::rtt::PendingKey {
        peer,
        a: [0, 1],
        b: [0, 0],
        proto: 1,
        pad: [0; 3],
        tag: [0; 4],
    }
}

/// The map `id` pinned under `pins`.
fn pinned(pins: &PinDir, id: MapId) -> aya::maps::Map {
    let data = MapData::from_pin(pins.path().join(id.name())).expect("pin");
    aya::maps::Map::from_map_data(data).expect("map")
}

fn losses_map(pins: &PinDir) -> aya::maps::Map {
    pinned(pins, MapId::RttLosses)
}

fn stats_map(pins: &PinDir) -> aya::maps::Map {
    pinned(pins, MapId::RttStats)
}

/// Maps loaded and pinned for `peers` peers (at 5,000, CT: 40,000 flows;
/// RTT: 20,000 keys), with the `Datapath` holding them.
fn loaded_for(peers: u32) -> (PinDir, Datapath) {
    require_root();
    let pins = PinDir::new();
    let sizes = MapSizes::for_peers(peers);
    let d = Datapath::load_sized(pins.path(), &[ProgId::LxcIngress], &sizes).expect("load");
    (pins, d)
}

/// Writes a loss count and statistics for peers .1 .. =n.
fn seed(pins: &PinDir, n: u8) {
    let mut m = losses_map(pins);
    let mut losses = HashMap::<_, RttKey, u64>::try_from(&mut m).expect("losses");
    let mut s = stats_map(pins);
    let mut stats = HashMap::<_, RttKey, RttStats>::try_from(&mut s).expect("stats");
    for i in 1..=n {
        losses
            .insert(&key(i, 1), &(u64::from(i) * 10), 0)
            .expect("insert loss");
        let v = RttStats {
            count: u64::from(i),
            ..RttStats::default()
        };
        stats.insert(&key(i, 6), &v, 0).expect("insert stats");
    }
}

#[test]
fn map_sizes_follow_the_loader_and_entries_survive_a_resize() {
    let (pins, d) = loaded_for(64);
    let small = MapSizes::for_peers(64);
    for id in [
        MapId::RttStats,
        MapId::RttLosses,
        MapId::RttPending,
        MapId::CtMap,
    ] {
        let info = MapInfo::from_pin(pins.path().join(id.name())).expect("pinned");
        assert_eq!(
            Some(info.max_entries()),
            small.max_entries(id),
            "{}",
            id.name()
        );
    }
    drop(d);
    seed(&pins, 5);

    // A larger --max-peers: every sized pin is replaced, entries carried.
    let large = MapSizes::for_peers(256);
    let d = Datapath::load_sized(pins.path(), &[ProgId::LxcIngress], &large).expect("reload");
    let info = MapInfo::from_pin(pins.path().join(MapId::RttLosses.name())).expect("pinned");
    assert_eq!(info.max_entries(), 1024, "replaced at the new size");
    let m = losses_map(&pins);
    let losses = HashMap::<_, RttKey, u64>::try_from(&m).expect("losses");
    for i in 1..=5u8 {
        assert_eq!(
            losses.get(&key(i, 1), 0).ok(),
            Some(u64::from(i) * 10),
            "loss count of peer .{i} carried over"
        );
    }
    let s = stats_map(&pins);
    let stats = HashMap::<_, RttKey, RttStats>::try_from(&s).expect("stats");
    let got = stats
        .get(&key(3, 6), 0)
        .expect("stats of peer .3 carried over");
    assert_eq!(got.count, 3, "the statistics carried");
    drop(d);

    // The list shows entries against the new size.
    let rows = maps::list(pins.path()).expect("map list");
    let row = rows
        .iter()
        .find(|r| r.name == MapId::RttLosses.name())
        .expect("RTT_LOSSES listed");
    assert_eq!((row.entries, row.max_entries), (5, 1024));
    assert!((row.pressure - 5.0 / 1024.0).abs() < 1e-9, "{row:?}");
}

/// Pins left by an agent of a newer layout version, every size matching:
/// none is reused and no entry carried (a value of the same size may hold
/// its fields in another order).
#[test]
fn pins_of_a_newer_layout_version_are_made_anew_whatever_their_sizes() {
    let (pins, d) = loaded_for(64);
    drop(d);
    seed(&pins, 5);
    let id_of = |id: MapId| {
        MapInfo::from_pin(pins.path().join(id.name()))
            .expect("pinned")
            .id()
    };
    let before = id_of(MapId::RttLosses);
    {
        let m = pinned(&pins, MapId::PinLayout);
        let mut layout = aya::maps::Array::<_, u32>::try_from(m).expect("layout");
        layout
            .set(0, &(health_common::maps::PIN_LAYOUT_VERSION + 1), 0)
            .expect("a newer version");
    }
    let d = Datapath::load_sized(pins.path(), &[ProgId::LxcIngress], &MapSizes::for_peers(64))
        .expect("reload");
    assert_ne!(id_of(MapId::RttLosses), before, "a new map");
    let m = losses_map(&pins);
    let losses = HashMap::<_, RttKey, u64>::try_from(&m).expect("losses");
    assert_eq!(losses.keys().count(), 0, "nothing carried");
    assert_eq!(
        health_agent::datapath::recorded_layout(pins.path()),
        Some(health_common::maps::PIN_LAYOUT_VERSION)
    );
    let aside: Vec<_> = std::fs::read_dir(pins.path())
        .expect("dir")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("REPLACED_"))
        .collect();
    assert!(aside.is_empty(), "the old pins are gone: {aside:?}");
    // The same version again: reused, entries and all.
    drop(d);
    seed(&pins, 2);
    let again = id_of(MapId::RttLosses);
    let _d = Datapath::load_sized(pins.path(), &[ProgId::LxcIngress], &MapSizes::for_peers(64))
        .expect("reload");
    assert_eq!(id_of(MapId::RttLosses), again, "reused");
}

/// `bpf(cmd, attr)`: what it returns (a descriptor for some commands, 0
/// for others), or the test fails naming the command.
fn bpf(cmd: libc::c_long, attr: &mut [u8; 128]) -> i32 {
    // SAFETY: attr is a zero-padded bpf_attr of the size passed.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) };
    assert!(rc >= 0, "bpf({cmd}): {}", std::io::Error::last_os_error());
    i32::try_from(rc).expect("a descriptor or 0")
}

/// A map's layout for [`pin_map`]: its type (`BPF_MAP_TYPE_*`), name,
/// key and value sizes and entries.
struct Layout {
    map_type: u32,
    name: &'static str,
    key: u32,
    value: u32,
    max_entries: u32,
}

const BPF_MAP_TYPE_LRU_HASH: u32 = 9;
const BPF_MAP_TYPE_LRU_PERCPU_HASH: u32 = 10;

/// Pins at `path` a map of `layout`, as an agent of an older layout left
/// it.
fn pin_map(path: &Path, layout: &Layout) {
    const BPF_MAP_CREATE: libc::c_long = 0;
    const BPF_OBJ_PIN: libc::c_long = 6;
    let mut attr = [0u8; 128];
    for (at, v) in [
        (0, layout.map_type),
        (4, layout.key),
        (8, layout.value),
        (12, layout.max_entries),
    ] {
        attr[at..at + 4].copy_from_slice(&v.to_ne_bytes());
    }
    attr[28..28 + layout.name.len()].copy_from_slice(layout.name.as_bytes());
    // SAFETY: BPF_MAP_CREATE returned a new descriptor that nothing else
    // owns.
    let map = unsafe { OwnedFd::from_raw_fd(bpf(BPF_MAP_CREATE, &mut attr)) };
    let name = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    let mut attr = [0u8; 128];
    attr[0..8].copy_from_slice(&(name.as_ptr() as u64).to_ne_bytes());
    let fd = u32::try_from(map.as_raw_fd()).expect("fd");
    attr[8..12].copy_from_slice(&fd.to_ne_bytes());
    // BPF_OBJ_PIN returns 0, not a descriptor: nothing to close but `map`.
    assert_eq!(bpf(BPF_OBJ_PIN, &mut attr), 0);
}

/// Pins at `path` an RTT statistics map of the layout agents had before:
/// an LRU hash with a value per CPU.
fn pin_per_cpu_rtt_stats(path: &Path, max_entries: u32) {
    pin_map(
        path,
        &Layout {
            map_type: BPF_MAP_TYPE_LRU_PERCPU_HASH,
            name: "RTT_STATS",
            key: MapId::RttStats.key_size(),
            value: MapId::RttStats.value_size(),
            max_entries,
        },
    );
}

#[test]
fn rtt_statistics_of_the_per_cpu_layout_are_carried_folded() {
    let (pins, d) = loaded_for(64);
    drop(d);
    let sizes = MapSizes::for_peers(64);
    // The pins an agent of the per-CPU layout left: each CPU took samples
    // of peer .7's TCP, the last CPU the latest.
    let path = pins.path().join(MapId::RttStats.name());
    std::fs::remove_file(&path).expect("unpinning the statistics");
    pin_per_cpu_rtt_stats(&path, sizes.max_entries(MapId::RttStats).expect("sized"));
    let cpus = usize::try_from(aya::util::nr_cpus().expect("cpus").get()).expect("cpus");
    let per_cpu: Vec<RttStats> = (1..=cpus as u64)
        .map(|c| {
            let mut s = RttStats::default();
            s.record(c * 1_000_000, c * 10);
            s.record(c * 3_000_000, c * 20);
            s
        })
        .collect();
    let mut expected = RttStats::default();
    for s in &per_cpu {
        expected.merge(s);
    }
    {
        let mut m = stats_map(&pins);
        let mut old = PerCpuHashMap::<_, RttKey, RttStats>::try_from(&mut m).expect("per-CPU");
        let values = PerCpuValues::try_from(per_cpu).expect("per-CPU values");
        old.insert(&key(7, 6), values, 0).expect("seeding");
    }

    let d = Datapath::load_sized(pins.path(), &[ProgId::LxcIngress], &sizes).expect("reload");
    let info = MapInfo::from_pin(&path).expect("pinned");
    assert_eq!(
        info.map_type().ok(),
        Some(aya::maps::MapType::LruHash),
        "one value a key now"
    );
    let m = stats_map(&pins);
    let stats = HashMap::<_, RttKey, RttStats>::try_from(&m).expect("stats");
    let got = stats.get(&key(7, 6), 0).expect("carried");
    assert_eq!(got, expected, "every CPU's samples folded into one value");
    assert_eq!(got.count, 2 * cpus as u64);
    assert_eq!(
        (got.last_ns, got.last_at_ns),
        (cpus as u64 * 3_000_000, cpus as u64 * 20),
        "the latest sample is the last"
    );
    assert_eq!(
        (got.min_ns, got.max_ns),
        (1_000_000, cpus as u64 * 3_000_000)
    );
    drop(d);
}

/// The pending requests of the layout whose key held no tag: the echoes
/// are carried, tagged with the payload agents of that layout sent (the
/// key their replies name); the SYNs are not, as their answers name an
/// ISN the old key did not keep.
#[test]
fn pending_echoes_of_the_key_without_a_tag_are_carried_and_syns_are_not() {
    let (pins, d) = loaded_for(64);
    drop(d);
    let sizes = MapSizes::for_peers(64);
    let path = pins.path().join(MapId::RttPending.name());
    std::fs::remove_file(&path).expect("unpinning the pending requests");
    pin_map(
        &path,
        &Layout {
            map_type: BPF_MAP_TYPE_LRU_HASH,
            name: "RTT_PENDING",
            key: 24,
            value: 8,
            max_entries: sizes.max_entries(MapId::RttPending).expect("sized"),
        },
    );
    let now = health_agent::datapath::monotonic_ns().expect("clock");
    let old_key = |last: u8, a: u16, b: u16, proto: u8| {
        let mut k = [0u8; 24];
        k[..16].copy_from_slice(&health_common::ct::v4_mapped([198, 18, 9, last]));
        k[16..18].copy_from_slice(&a.to_be_bytes());
        k[18..20].copy_from_slice(&b.to_be_bytes());
        k[20] = proto;
        k
    };
    {
        let mut m = pinned(&pins, MapId::RttPending);
        let mut old = HashMap::<_, [u8; 24], u64>::try_from(&mut m).expect("old layout");
        old.insert(&old_key(1, 0x0abc, 7, 1), &now, 0)
            .expect("echo");
        old.insert(&old_key(2, 40_000, 4240, 6), &now, 0)
            .expect("SYN");
    }

    let d = Datapath::load_sized(pins.path(), &[ProgId::LxcIngress], &sizes).expect("reload");
    let info = MapInfo::from_pin(&path).expect("pinned");
    assert_eq!(info.key_size(), MapId::RttPending.key_size(), "today's key");
    let rows = rtt::pending(pins.path()).expect("pending");
    assert_eq!(rows.len(), 1, "the echo alone: {rows:?}");
    assert_eq!(
        (rows[0].peer, rows[0].proto, rows[0].a, rows[0].b),
        (IpAddr::from([198, 18, 9, 1]), "ICMP", 0x0abc, 7)
    );
    assert_eq!((rows[0].sent_ns, rows[0].isn), (now, None));
    assert_eq!(rows[0].echo_data.as_deref(), Some("6865616c"), "b\"heal\"");
    let m = pinned(&pins, MapId::RttPending);
    let pending = HashMap::<_, health_common::rtt::PendingKey, u64>::try_from(&m).expect("pending");
    // Tagged with what agents of that layout sent as every echo's payload,
    // which the reply carries back.
    let echo = health_common::rtt::PendingKey {
        peer: health_common::ct::v4_mapped([198, 18, 9, 1]),
        a: 0x0abcu16.to_be_bytes(),
        b: 7u16.to_be_bytes(),
        proto: 1,
        pad: [0; 3],
        tag: *b"heal",
    };
    assert_eq!(
        pending.get(&echo, 0).ok(),
        Some(now),
        "the key its reply names"
    );
    drop(d);
}

#[test]
fn rtt_entries_of_departed_peers_are_pruned() {
    let (pins, d) = loaded_for(64);
    seed(&pins, 6);
    let stay = |ip: IpAddr| matches!(ip, IpAddr::V4(v4) if v4.octets()[3] <= 2);
    let removed = rtt::prune(pins.path(), stay).expect("prune");
    assert_eq!(removed, 8, "4 peers left, a loss and a stats key each");
    let left: Vec<IpAddr> = rtt::list(pins.path())
        .expect("rtt list")
        .into_iter()
        .map(|r| r.peer)
        .collect();
    assert!(
        left.iter().all(|ip| stay(*ip)) && !left.is_empty(),
        "left: {left:?}"
    );
    // A departed peer's requests still pending go too: swept once lost,
    // they would bring its loss counter back.
    let old = health_agent::datapath::monotonic_ns().expect("clock") - 60_000_000_000;
    {
        let mut map = pinned(&pins, MapId::RttPending);
        let mut pending =
            HashMap::<_, health_common::rtt::PendingKey, u64>::try_from(&mut map).expect("pending");
        for last in [1u8, 5] {
            let k = echo_request(key(last, 1).peer);
            pending.insert(&k, &old, 0).expect("insert pending");
        }
    }
    rtt::prune(pins.path(), stay).expect("prune");
    assert_eq!(
        rtt::sweep(pins.path(), std::time::Duration::from_secs(1)).expect("sweep"),
        1,
        "the staying peer's request alone"
    );
    let m = losses_map(&pins);
    let losses = HashMap::<_, RttKey, u64>::try_from(&m).expect("losses");
    assert_eq!(losses.get(&key(5, 1), 0).ok(), None, "peer .5 left");
    assert_eq!(
        losses.get(&key(1, 1), 0).ok(),
        Some(11),
        "peer .1: 10 and 1"
    );
    drop(d);
}

/// A CT key of flow `i` (distinct ports), outgoing ICMP.
fn flow(i: u32) -> health_common::ct::CtKey {
    let [_, _, hi, lo] = i.to_be_bytes();
    health_common::ct::CtKey {
        saddr: health_common::ct::v4_mapped([198, 18, 0, 1]),
        daddr: health_common::ct::v4_mapped([198, 19, hi, lo]),
        sport: [hi, lo],
        dport: [0, 0],
        proto: 1,
        dir: 0,
        pad: [0; 2],
    }
}

#[test]
fn the_collector_reads_and_deletes_in_batches_across_many_chunks() {
    let (pins, d) = loaded_for(5000);
    let mut map = pinned(&pins, MapId::CtMap);
    let mut ct =
        HashMap::<_, health_common::ct::CtKey, health_common::ct::CtEntry>::try_from(&mut map)
            .expect("ct");
    let now = health_agent::datapath::monotonic_ns().expect("clock");
    // 20,000 flows (several batches of the collector's chunk), every third
    // one expired.
    let total = 20_000u32;
    for i in 0..total {
        let entry = health_common::ct::CtEntry {
            created_ns: now,
            expires_ns: if i % 3 == 0 {
                now - 1
            } else {
                now + 3_600_000_000_000
            },
            ..health_common::ct::CtEntry::default()
        };
        ct.insert(&flow(i), &entry, 0).expect("insert");
    }
    let removed = health_agent::datapath::ct::gc(pins.path()).expect("gc");
    assert_eq!(removed, u64::from(total.div_ceil(3)), "the expired flows");
    let left: Vec<u32> = ct
        .keys()
        .map(|k| {
            let k = k.expect("key");
            u32::from(u16::from_be_bytes(k.sport))
        })
        .collect();
    assert_eq!(left.len(), (total - total.div_ceil(3)) as usize);
    assert!(left.iter().all(|i| i % 3 != 0), "only live flows are left");
    // A second pass finds nothing more, and counts what is left (the
    // pressure report takes the CT map's entries from it).
    assert_eq!(
        health_agent::datapath::ct::gc_counted(pins.path()).expect("gc"),
        (0, left.len() as u64)
    );
    // `bpf map list` counts in batches too, per-CPU maps included (a value
    // per CPU in each batch).
    seed(&pins, 5);
    let rows = maps::list(pins.path()).expect("list");
    let entries = |id: MapId| {
        rows.iter()
            .find(|r| r.name == id.name())
            .map(|r| r.entries)
            .expect("listed")
    };
    assert_eq!(entries(MapId::CtMap), left.len() as u64);
    assert_eq!(entries(MapId::RttStats), 5);
    assert_eq!(entries(MapId::RttLosses), 5);
    // The RTT totals of the metrics, read in batches: the samples
    // (1 + 2 + ... + 5) and the losses (10 + 20 + ... + 50).
    assert_eq!(rtt::totals(pins.path()).expect("totals"), (15, 150));
    // The pressure report walks each map once: given the collector's
    // count, it agrees with the listing that counts every map itself.
    let report = |counted| {
        health_agent::datapath::report::snapshot_counted(pins.path(), counted, None)
            .expect("report")
    };
    let counted = report(vec![(MapId::CtMap, left.len() as u64)]);
    assert_eq!(counted, report(Vec::new()));
    assert_eq!(counted.rows, rows);
    assert_eq!((counted.rtt_samples, counted.rtt_losses), (15, 150));
    drop(d);
}

#[test]
fn the_loss_sweep_counts_each_lost_request_once_across_many_chunks() {
    let (pins, d) = loaded_for(5000);
    let mut map = pinned(&pins, MapId::RttPending);
    let mut pending =
        HashMap::<_, health_common::rtt::PendingKey, u64>::try_from(&mut map).expect("pending");
    let now = health_agent::datapath::monotonic_ns().expect("clock");
    let peer = |p: u16| health_common::ct::v4_mapped([198, 18, (p >> 8) as u8, p as u8]);
    // 2,000 peers x ICMP and TCP x 3 requests: 12,000 (several chunks);
    // the first two of each key are a minute old (lost), the third is new;
    // TCP's last two are SYNs sent again, aged from the first SYN all the same.
    for p in 0..2000u16 {
        for proto in [1u8, 6] {
            for seq in 0..3u16 {
                let k = health_common::rtt::PendingKey {
                    peer: peer(p),
                    a: [0, 1],
                    b: seq.to_be_bytes(),
                    proto,
                    pad: [0; 3],
                    tag: [0; 4],
                };
                let mut sent = if seq < 2 { now - 60_000_000_000 } else { now };
                if proto == 6 && seq > 0 {
                    sent |= health_common::rtt::RETRANSMITTED;
                }
                pending.insert(&k, &sent, 0).expect("insert pending");
            }
        }
    }
    // Peers 0..100 had 5 ICMP losses before.
    {
        let mut m = losses_map(&pins);
        let mut losses = HashMap::<_, RttKey, u64>::try_from(&mut m).expect("losses");
        for p in 0..100u16 {
            let k = RttKey {
                peer: peer(p),
                proto: 1,
                pad: [0; 3],
            };
            losses.insert(&k, &5, 0).expect("insert loss");
        }
    }
    let lost = rtt::sweep(pins.path(), std::time::Duration::from_secs(1)).expect("sweep");
    assert_eq!(lost, 8000, "two lost requests per key");
    assert_eq!(pending.keys().count(), 4000, "the new requests stay");
    let m = losses_map(&pins);
    let losses = HashMap::<_, RttKey, u64>::try_from(&m).expect("losses");
    let counts: std::collections::HashMap<RttKey, u64> =
        losses.iter().map(|r| r.expect("entry")).collect();
    assert_eq!(counts.len(), 4000);
    for (k, n) in &counts {
        let p = u16::from_be_bytes([k.peer[14], k.peer[15]]);
        let want = if k.proto == 1 && p < 100 { 7 } else { 2 };
        assert_eq!(*n, want, "{k:?}");
    }
    // Nothing is counted twice.
    assert_eq!(
        rtt::sweep(pins.path(), std::time::Duration::from_secs(1)).expect("sweep"),
        0
    );
    drop(d);
}

/// The collectors' pass in slices (as the datapath task runs it): the
/// same result as one walk, in several slices, none reading more than its
/// share of the map.
#[test]
fn a_pass_in_slices_collects_and_sweeps_what_one_walk_does() {
    use health_agent::datapath::collect::{Collector, SLICES};
    let (pins, d) = loaded_for(5000);
    let now = health_agent::datapath::monotonic_ns().expect("clock");
    let hour = 3_600_000_000_000;
    // 20,000 flows, every third expired: four slices' worth of a CT map
    // of 40,000 (5,000 a slice).
    {
        let mut map = pinned(&pins, MapId::CtMap);
        let mut ct =
            HashMap::<_, health_common::ct::CtKey, health_common::ct::CtEntry>::try_from(&mut map)
                .expect("ct");
        for i in 0..20_000u32 {
            let entry = health_common::ct::CtEntry {
                created_ns: now,
                expires_ns: if i % 3 == 0 { now - 1 } else { now + hour },
                ..health_common::ct::CtEntry::default()
            };
            ct.insert(&flow(i), &entry, 0).expect("insert");
        }
    }
    // 12,000 pending requests, 8,000 of them a minute old (lost).
    {
        let mut map = pinned(&pins, MapId::RttPending);
        let mut pending =
            HashMap::<_, health_common::rtt::PendingKey, u64>::try_from(&mut map).expect("pending");
        for i in 0..12_000u16 {
            let k = echo_request(health_common::ct::v4_mapped([
                198,
                18,
                (i >> 8) as u8,
                i as u8,
            ]));
            let sent = if i % 3 == 0 {
                now
            } else {
                now - 60_000_000_000
            };
            pending.insert(&k, &sent, 0).expect("insert pending");
        }
    }
    let start = std::time::Instant::now();
    let mut c = Collector::new(
        std::time::Duration::ZERO,
        tokio::sync::watch::channel(health_agent::datapath::collect::LossTimeout::new(
            std::time::Duration::from_secs(1),
        ))
        .1,
        &MapSizes::for_peers(5000),
        start,
    );
    assert!(c.start_if_due(start));
    let mut steps = 0;
    let done = loop {
        steps += 1;
        assert!(steps <= SLICES + 1, "a pass takes at most its slices");
        if let Some(done) = c.step(pins.path()).expect("slice") {
            break done;
        }
        assert!(!c.start_if_due(start), "no second pass during one");
    };
    assert!(done.slices >= 4, "walked in slices: {done:?}");
    assert_eq!(
        (done.ct_removed, done.ct_left),
        (6667, 13_333),
        "the expired flows removed, the others counted"
    );
    assert_eq!((done.lost, done.pending_left), (8000, 4000));
    // Written from user space, none of them was counted as created: no
    // evictions either.
    assert_eq!(done.ct_evicted, 0);
    // What is left is what one walk would leave: nothing more to do.
    assert_eq!(
        health_agent::datapath::ct::gc_counted(pins.path()).expect("gc"),
        (0, 13_333)
    );
    assert_eq!(
        rtt::sweep_counted(pins.path(), std::time::Duration::from_secs(1)).expect("sweep"),
        (0, 4000)
    );
    let m = losses_map(&pins);
    let losses = HashMap::<_, RttKey, u64>::try_from(&m).expect("losses");
    assert_eq!(losses.iter().count(), 8000, "one lost request per peer");
    assert!(losses.iter().all(|r| r.expect("entry").1 == 1));
    // The slice left nothing in progress: stepping again does nothing.
    assert_eq!(c.step(pins.path()).expect("idle"), None);
    drop(d);
}

/// A reload that changes the probe timeout reaches the loss sweep: a
/// longer timeout at once; a shorter one once the longer one has stopped
/// counting (twice its length after the reload: requests sent under it may
/// be answered until then).
#[test]
fn the_loss_sweep_follows_a_reloaded_probe_timeout() {
    use std::time::{Duration, Instant};

    use health_agent::datapath::collect::{Collector, LossTimeout};
    let (pins, d) = loaded_for(5000);
    // 50 requests from `first` on, sent `age` ago.
    let send = |first: u8, age: Duration| {
        let now = health_agent::datapath::monotonic_ns().expect("clock");
        let sent = now - u64::try_from(age.as_nanos()).expect("an age");
        let mut map = pinned(&pins, MapId::RttPending);
        let mut pending =
            HashMap::<_, health_common::rtt::PendingKey, u64>::try_from(&mut map).expect("pending");
        for i in first..first + 50 {
            let k = echo_request(health_common::ct::v4_mapped([198, 18, 7, i]));
            pending.insert(&k, &sent, 0).expect("insert pending");
        }
    };
    let ms = Duration::from_millis;
    let (timeout, in_force) = tokio::sync::watch::channel(LossTimeout::new(ms(100)));
    let mut c = Collector::new(
        Duration::ZERO,
        in_force,
        &MapSizes::for_peers(5000),
        Instant::now(),
    );
    let pass = |c: &mut Collector| {
        assert!(c.start_if_due(Instant::now()));
        loop {
            if let Some(done) = c.step(pins.path()).expect("slice") {
                break (done.lost, done.pending_left);
            }
        }
    };
    // What SIGHUP's reload sends when the probe timeout changes.
    let reload = |to: Duration, at: Instant| {
        timeout.send_modify(|t| {
            t.reload(to, at);
        });
    };
    send(0, ms(200));
    reload(ms(1500), Instant::now());
    assert_eq!(
        pass(&mut c),
        (0, 50),
        "0.2 s old, under a 1.5 s timeout: pending"
    );
    let shortened = Instant::now();
    reload(ms(100), shortened);
    assert_eq!(
        pass(&mut c),
        (0, 50),
        "shortened to 0.1 s: the 1.5 s still counts"
    );
    // Once 1.5 s no longer counts (3 s after the reload), requests 0.2 s
    // old are lost under the 0.1 s in force.
    std::thread::sleep((shortened + ms(3050)).saturating_duration_since(Instant::now()));
    send(50, ms(200));
    assert_eq!(
        pass(&mut c),
        (100, 0),
        "older than the 0.1 s in force: lost"
    );
    let m = losses_map(&pins);
    let losses = HashMap::<_, RttKey, u64>::try_from(&m).expect("losses");
    assert_eq!(losses.iter().count(), 100);
    drop(d);
}

/// The CT evictions a walk counted stay the count through the passes
/// that skip the walk (nothing created since, nothing due to expire): a
/// zero in between would read as a counter reset.
#[test]
fn a_pass_that_skips_the_ct_walk_keeps_the_evictions_counted() {
    use std::time::{Duration, Instant};

    use aya::maps::{PerCpuArray, PerCpuValues};
    use health_agent::datapath::collect::{Collector, LossTimeout};
    use health_common::ct::CtCounter;
    let (pins, d) = loaded_for(5000);
    // Four entries created by the kernel's count, none in the map: evicted.
    {
        let mut m = pinned(&pins, MapId::CtStats);
        let mut stats = PerCpuArray::<_, u64>::try_from(&mut m).expect("CT stats");
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| e).expect("cpus");
        let mut created = vec![0u64; usize::try_from(cpus.get()).expect("cpus")];
        created[0] = 4;
        stats
            .set(
                CtCounter::Created as u32,
                PerCpuValues::try_from(created).expect("values"),
                0,
            )
            .expect("set created");
    }
    let start = Instant::now();
    let mut c = Collector::new(
        Duration::ZERO,
        tokio::sync::watch::channel(LossTimeout::new(Duration::from_secs(1))).1,
        &MapSizes::for_peers(5000),
        start,
    );
    let mut pass = |walks: bool| {
        assert!(c.start_if_due(Instant::now()));
        let _nat = c.plan_walk(pins.path());
        loop {
            if let Some(done) = c.step(pins.path()).expect("slice") {
                assert_eq!(done.ct_walked, walks);
                break done.ct_evicted;
            }
        }
    };
    assert_eq!(pass(true), 4, "the first pass walks and counts");
    assert_eq!(pass(false), 4, "skipped: the same count");
    drop(d);
}

/// `bpf ct list` while entries go (the collector, LRU evictions): each
/// entry listed once. A key-by-key walk starts over when the key it
/// stands on is deleted, listing the entries before it again.
#[test]
fn the_ct_listing_lists_each_entry_once_while_entries_go() {
    let (pins, d) = loaded_for(5000);
    let total = 20_000u32;
    {
        let mut map = pinned(&pins, MapId::CtMap);
        let mut ct =
            HashMap::<_, health_common::ct::CtKey, health_common::ct::CtEntry>::try_from(&mut map)
                .expect("ct");
        for i in 0..total {
            ct.insert(&flow(i), &health_common::ct::CtEntry::default(), 0)
                .expect("insert");
        }
    }
    let done = std::sync::atomic::AtomicBool::new(false);
    let during = std::thread::scope(|s| {
        s.spawn(|| {
            let mut map = pinned(&pins, MapId::CtMap);
            let mut ct =
                HashMap::<_, health_common::ct::CtKey, health_common::ct::CtEntry>::try_from(
                    &mut map,
                )
                .expect("ct");
            // About 400 ms in all: listings run through the removals.
            for i in (0..total).rev() {
                let _ = ct.remove(&flow(i));
                if i % 100 == 0 {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
            }
            done.store(true, std::sync::atomic::Ordering::Release);
        });
        let mut during = 0;
        while !done.load(std::sync::atomic::Ordering::Acquire) {
            let rows = health_agent::datapath::ct::list(pins.path()).expect("ct list");
            let mut keys: Vec<_> = rows.iter().map(|r| (r.dst, r.sport)).collect();
            let listed = keys.len();
            keys.sort_unstable();
            keys.dedup();
            assert_eq!(keys.len(), listed, "an entry listed twice");
            if listed > 0 && listed < usize::try_from(total).expect("total") {
                during += 1;
            }
        }
        during
    });
    assert!(during >= 1, "no listing ran while entries went");
    drop(d);
}

/// A load that replaces pins of another size and then fails (a new map
/// the kernel cannot make) puts every old pin back, its entries with it,
/// over a new map already pinned in its place: a retry, or the old
/// setting again, finds them.
#[test]
fn a_failed_load_puts_a_replaced_pin_back_with_its_entries() {
    let (pins, d) = loaded_for(64);
    drop(d);
    seed(&pins, 5);
    let sized = [MapId::CtMap, MapId::RttStats, MapId::RttLosses];
    let ids = || {
        sized.map(|id| {
            MapInfo::from_pin(pins.path().join(id.name()))
                .map_or_else(|e| panic!("{} pinned: {e}", id.name()), |i| i.id())
        })
    };
    let before = ids();
    // A larger CT map the kernel makes, RTT maps too large for it (E2BIG):
    // every one of them is of another size, set aside, and the load fails.
    let huge = MapSizes {
        ct: 4096,
        rtt: 1 << 31,
        ..MapSizes::for_peers(64)
    };
    let err = Datapath::load_sized(pins.path(), &[ProgId::LxcIngress], &huge)
        .err()
        .expect("no map of 2^31 entries");
    assert_eq!(ids(), before, "the same maps pinned again after {err}");
    let m = losses_map(&pins);
    let losses = HashMap::<_, RttKey, u64>::try_from(&m).expect("losses");
    assert_eq!(losses.get(&key(3, 1), 0).ok(), Some(30), "its entries kept");
    let names: Vec<_> = std::fs::read_dir(pins.path())
        .expect("pins")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| !n.starts_with("REPLACED_")),
        "{names:?}"
    );
    // The old setting loads over them as before.
    let d = Datapath::load_sized(pins.path(), &[ProgId::LxcIngress], &MapSizes::for_peers(64))
        .expect("load");
    drop(d);
}

/// The loaded programs that use one of `maps` pinned under `pins`, by
/// the names the kernel keeps (15 bytes at most).
fn programs_using(pins: &PinDir, maps: &[MapId]) -> Vec<String> {
    let ids: Vec<u32> = maps
        .iter()
        .map(|m| {
            MapData::from_pin(pins.path().join(m.name()))
                .expect("pin")
                .info()
                .expect("map info")
                .id()
        })
        .collect();
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| {
            p.map_ids()
                .ok()
                .flatten()
                .is_some_and(|used| used.iter().any(|id| ids.contains(id)))
        })
        .filter_map(|p| p.name_as_str().map(str::to_owned))
        .collect()
}

/// An owner given the programs its settings attach loads them with the
/// object, at its first request and before any attachment: a program the
/// verifier refuses fails that load, which puts back the pins it
/// replaced. The others wait for their first use.
#[test]
fn an_owner_loads_the_programs_it_is_given_with_the_object() {
    require_root();
    let pins = PinDir::new();
    let owner =
        health_agent::datapath::DatapathOwner::new(pins.path().to_owned(), MapSizes::for_peers(64))
            .with_programs(&[ProgId::NatEgress, ProgId::LxcIngress]);
    owner
        .handle()
        .set_ct_config(health_common::ct::CtConfig::default())
        .expect("loaded");
    let names = programs_using(&pins, &[MapId::CtMap, MapId::NatMap]);
    let has = |p: ProgId| {
        names
            .iter()
            .any(|n| !n.is_empty() && p.name().starts_with(n.as_str()))
    };
    assert!(
        has(ProgId::NatEgress) && has(ProgId::LxcIngress),
        "{names:?}"
    );
    assert!(
        !has(ProgId::LxcEgress),
        "not given: on first use only; {names:?}"
    );
    drop(owner);
}
