//! The encryption check's counter on the egress of an Ethernet interface,
//! run by the kernel on crafted frames (`BPF_PROG_TEST_RUN`): probes to a
//! watched address are counted as plain text, anything else is not, and
//! every frame is handed on unchanged. (The tunnel's program reads frames
//! without a link-layer header, which a test run cannot give it: the
//! WireGuard test of the kernel matrix runs it on a real device.)

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, Ipv4Addr},
};

use health_agent::datapath::encrypt_watch;
use health_common::maps::ProgId;
use health_tests::{
    packets::Echo,
    tc_run::{self, TCX_NEXT},
};

const PEER: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 12);
const OTHER: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 13);
const SRC: Ipv4Addr = Ipv4Addr::new(198, 18, 64, 2);

#[test]
fn probes_to_a_watched_address_are_counted_and_every_frame_passes_unchanged() {
    let (mut r, pins) = tc_run::loaded();
    let wanted: BTreeSet<IpAddr> = [IpAddr::V4(PEER)].into_iter().collect();
    encrypt_watch::set_watched(pins.path(), &BTreeMap::new(), &wanted).expect("watch");
    let request = Echo::request(SRC, PEER, 7, 1).frame();
    let unwatched = Echo::request(SRC, OTHER, 7, 1).frame();
    let mut reply = request.clone();
    reply[34] = 0; // ICMP type: echo reply
    for frame in [&request, &request, &unwatched, &reply] {
        let (verdict, out) = tc_run::run(&mut r, ProgId::PlainEgress, frame);
        assert_eq!(verdict, TCX_NEXT, "handed on");
        assert_eq!(&out, frame, "unchanged");
    }
    let rows = encrypt_watch::list(pins.path()).expect("list");
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].destination, IpAddr::V4(PEER));
    assert_eq!(
        (rows[0].plain, rows[0].tunnel),
        (2, 0),
        "two requests: {rows:?}"
    );
    // Asked to watch it again on a reading that came back short (a failed
    // read, or one made before the entry): its counts stand.
    let (added, _) =
        encrypt_watch::set_watched(pins.path(), &BTreeMap::new(), &wanted).expect("watch again");
    assert_eq!(added, 0, "already there");
    let rows = encrypt_watch::list(pins.path()).expect("list");
    assert_eq!((rows[0].plain, rows[0].tunnel), (2, 0), "kept: {rows:?}");
    // A peer that left is no longer watched.
    let present = encrypt_watch::counts(pins.path()).expect("counts");
    let (added, removed) =
        encrypt_watch::set_watched(pins.path(), &present, &BTreeSet::new()).expect("unwatch");
    assert_eq!((added, removed), (0, 1));
    assert_eq!(encrypt_watch::list(pins.path()).expect("list"), []);
}

/// A full map takes new destinations once those no longer wanted go: the
/// removals come first, so a map filled once (a node set past
/// `--max-peers`) does not refuse every later change.
#[test]
fn a_full_watch_map_makes_room_for_new_destinations() {
    let (_r, pins) = tc_run::loaded();
    let capacity = health_common::maps::MapSizes::DEFAULT.max_peers
        * health_common::maps::MapSizes::WATCH_KEYS_PER_PEER;
    // 198.18.0.0/15 holds 131,072 addresses: the map's 65,536, then ten more.
    let at = |i: u32| IpAddr::V4(Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 0)) + i));
    let full: BTreeSet<IpAddr> = (0..capacity).map(at).collect();
    encrypt_watch::set_watched(pins.path(), &BTreeMap::new(), &full).expect("fill");
    let extra: BTreeSet<IpAddr> = (capacity..capacity + 10).map(at).collect();
    let present = encrypt_watch::counts(pins.path()).expect("counts");
    assert_eq!(present.len(), capacity as usize);
    // Past the capacity: refused, naming the map's error.
    let over: BTreeSet<IpAddr> = full.iter().chain(&extra).copied().collect();
    assert!(encrypt_watch::set_watched(pins.path(), &present, &over).is_err());
    // Ten of the old ones go, ten new ones come.
    let present = encrypt_watch::counts(pins.path()).expect("counts");
    let swapped: BTreeSet<IpAddr> = full.iter().skip(10).chain(&extra).copied().collect();
    let (added, removed) =
        encrypt_watch::set_watched(pins.path(), &present, &swapped).expect("swap in a full map");
    assert_eq!((added, removed), (10, 10));
    let now: BTreeSet<IpAddr> = encrypt_watch::counts(pins.path())
        .expect("counts")
        .into_keys()
        .collect();
    assert_eq!(now, swapped);
}
