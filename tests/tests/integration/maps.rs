//! The maps that grow with the cluster: sized by the loader, their entries
//! carried over when a pin of another size or type is replaced, and the
//! RTT entries of departed peers pruned.

use std::net::IpAddr;

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

fn losses_map(pins: &PinDir) -> aya::maps::Map {
    let data = MapData::from_pin(pins.path().join(MapId::RttLosses.name())).expect("pin");
    aya::maps::Map::from_map_data(data).expect("map")
}

fn stats_map(pins: &PinDir) -> aya::maps::Map {
    let data = MapData::from_pin(pins.path().join(MapId::RttStats.name())).expect("pin");
    aya::maps::Map::from_map_data(data).expect("map")
}

/// Writes a loss count and per-CPU statistics for peers .1 .. =n.
fn seed(pins: &PinDir, n: u8) {
    let mut m = losses_map(pins);
    let mut losses = HashMap::<_, RttKey, u64>::try_from(&mut m).expect("losses");
    let mut s = stats_map(pins);
    let mut stats = PerCpuHashMap::<_, RttKey, RttStats>::try_from(&mut s).expect("stats");
    let cpus = usize::try_from(aya::util::nr_cpus().expect("cpus").get()).expect("cpus");
    for i in 1..=n {
        losses
            .insert(&key(i, 1), &(u64::from(i) * 10), 0)
            .expect("insert loss");
        let v = RttStats {
            count: u64::from(i),
            ..RttStats::default()
        };
        let vals = PerCpuValues::try_from(vec![v; cpus]).expect("per-cpu");
        stats.insert(&key(i, 6), vals, 0).expect("insert stats");
    }
}

#[test]
fn map_sizes_follow_the_loader_and_entries_survive_a_resize() {
    require_root();
    let pins = PinDir::new();
    let small = MapSizes::for_peers(64);
    let d = Datapath::load_sized(pins.path(), &[ProgId::LxcIngress], &small).expect("load");
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
    let stats = PerCpuHashMap::<_, RttKey, RttStats>::try_from(&s).expect("stats");
    let got = stats
        .get(&key(3, 6), 0)
        .expect("stats of peer .3 carried over");
    assert!(got.iter().all(|v| v.count == 3), "every CPU's slot carried");
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

#[test]
fn rtt_entries_of_departed_peers_are_pruned() {
    require_root();
    let pins = PinDir::new();
    let d = Datapath::load_sized(pins.path(), &[ProgId::LxcIngress], &MapSizes::for_peers(64))
        .expect("load");
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
    drop(d);
}
