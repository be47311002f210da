//! The echo programs run by the kernel on crafted packets (`BPF_PROG_TEST_RUN`):
//! verdicts, output bytes and counters, for the XDP and the tc program.

use health_common::maps::EchoConfig;
use std::net::Ipv4Addr;

use health_agent::datapath::{Datapath, EchoStats};
use health_tests::{
    echo_check::{Prog, run, test_run_classes},
    packets::{self, Echo},
    pins::PinDir,
    require_root,
};

const LOCAL: Ipv4Addr = Ipv4Addr::new(198, 18, 7, 2);
const PEER: Ipv4Addr = Ipv4Addr::new(198, 18, 7, 1);
/// The responder's interface: the test requests' destination MAC.
const LOCAL_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];

fn loaded() -> (Datapath, PinDir) {
    require_root();
    let pins = PinDir::new();
    let mut r = Datapath::load(pins.path()).expect("load the kernel object");
    r.set_echo_config(config()).expect("configure the address");
    (r, pins)
}

fn config() -> EchoConfig {
    EchoConfig {
        addr: LOCAL.octets(),
        mac: LOCAL_MAC,
        ..EchoConfig::default()
    }
}

fn request() -> Echo {
    Echo::request(PEER, LOCAL, 0x4d2, 3)
}

fn for_both(check: impl Fn(&mut Datapath, Prog)) {
    let (mut r, _pins) = loaded();
    for prog in Prog::BOTH {
        check(&mut r, prog);
    }
}

#[test]
fn valid_echo_request_becomes_the_exact_reply() {
    for_both(|r, prog| {
        let req = request();
        let before = r.echo_stats().expect("stats");
        let (verdict, out) = run(r, prog, &req.frame());
        assert_eq!(verdict, prog.verdicts().reply, "{prog:?} verdict");
        assert_eq!(out, req.expected_reply().frame(), "{prog:?} reply bytes");
        packets::verify_ipv4_icmp(&out[14..]).unwrap_or_else(|e| panic!("{prog:?}: {e}"));
        let delta = r.echo_stats().expect("stats").since(before);
        assert_eq!(
            delta,
            EchoStats {
                answered: 1,
                passed: 0,
                malformed: 0
            },
            "{prog:?}"
        );
    });
}

#[test]
fn odd_sized_and_empty_payloads_are_answered_correctly() {
    for_both(|r, prog| {
        for len in [0usize, 1, 7, 1000] {
            let mut req = request();
            req.payload = (0..len).map(|i| (i * 13) as u8).collect();
            let (verdict, out) = run(r, prog, &req.frame());
            assert_eq!(verdict, prog.verdicts().reply, "{prog:?} payload {len}");
            assert_eq!(out, req.expected_reply().frame(), "{prog:?} payload {len}");
        }
    });
}

/// Packets the responder must hand on byte for byte.
#[test]
fn packets_not_for_the_responder_pass_untouched() {
    let mut other = request();
    other.dst = Ipv4Addr::new(198, 18, 7, 99);
    let mut reply = request();
    reply.kind = 0;
    let cases = [
        ("echo to another address", other.frame()),
        ("echo reply", reply.frame()),
        ("IP options", packets::with_ip_options(&request().frame())),
        ("fragment", packets::as_fragment(&request())),
        ("UDP", packets::udp(&request())),
        ("IPv6 echo", packets::ipv6_echo(&request())),
        (
            "ARP-sized non-IP",
            packets::ethernet([0xff; 6], [2, 0, 0, 0, 0, 1], 0x0806, &[0; 28]),
        ),
    ];
    for_both(|r, prog| {
        for (what, input) in &cases {
            let before = r.echo_stats().expect("stats");
            let (verdict, out) = run(r, prog, input);
            assert_eq!(verdict, prog.verdicts().pass, "{prog:?}: {what}");
            assert_eq!(&out, input, "{prog:?}: {what} was modified");
            let delta = r.echo_stats().expect("stats").since(before);
            assert_eq!(
                delta,
                EchoStats {
                    answered: 0,
                    passed: 1,
                    malformed: 0
                },
                "{prog:?}: {what}"
            );
        }
    });
}

#[test]
fn malformed_packets_are_dropped_and_counted() {
    let frame = request().frame();
    let mut bad_sum = frame.clone();
    bad_sum[24] ^= 0xff;
    let mut bad_version = frame.clone();
    bad_version[14] = 0x55;
    packets::fix_ip_checksum(&mut bad_version);
    let mut long_total = frame.clone();
    long_total[16..18].copy_from_slice(&2000u16.to_be_bytes());
    packets::fix_ip_checksum(&mut long_total);
    // IP total length 24: only 4 bytes of ICMP header.
    let mut short_icmp = frame[..38].to_vec();
    short_icmp[16..18].copy_from_slice(&24u16.to_be_bytes());
    packets::fix_ip_checksum(&mut short_icmp);
    let cases = [
        ("IPv4 header checksum wrong", bad_sum),
        ("IP version 5", bad_version),
        ("total length beyond the frame", long_total),
        ("ICMP header cut at 4 bytes", short_icmp),
    ];
    // The kernel's skb test runner refuses IPv4 frames shorter than an IP
    // header, so that truncation can only be fed to the XDP program.
    let xdp_only = [("IPv4 header cut at 10 bytes", frame[..24].to_vec())];
    for_both(|r, prog| {
        let extra = match prog {
            Prog::Xdp => &xdp_only[..],
            Prog::Tc => &[],
        };
        for (what, input) in cases.iter().chain(extra) {
            let before = r.echo_stats().expect("stats");
            let (verdict, _) = run(r, prog, input);
            assert_eq!(verdict, prog.verdicts().drop, "{prog:?}: {what}");
            let delta = r.echo_stats().expect("stats").since(before);
            assert_eq!(
                delta,
                EchoStats {
                    answered: 0,
                    passed: 0,
                    malformed: 1
                },
                "{prog:?}: {what}"
            );
        }
    });
}

#[test]
fn without_an_address_nothing_is_answered() {
    for_both(|r, prog| {
        r.set_echo_config(EchoConfig::default())
            .expect("clear address");
        let input = request().frame();
        let (verdict, out) = run(r, prog, &input);
        assert_eq!(verdict, prog.verdicts().pass, "{prog:?}");
        assert_eq!(out, input, "{prog:?}");
    });
}

#[test]
fn counters_are_read_back_from_the_pins() {
    let (mut r, pins) = loaded();
    let frame = request().frame();
    for _ in 0..5 {
        assert_eq!(run(&mut r, Prog::Xdp, &frame).0, Prog::Xdp.verdicts().reply);
    }
    let live = r.echo_stats().expect("stats");
    let pinned = health_agent::datapath::read_pinned_stats(pins.path()).expect("pinned stats");
    assert_eq!(live.answered, 5);
    assert_eq!(pinned, live);
    // A second load reuses the pinned maps: counters carry over.
    drop(r);
    let again = Datapath::load(pins.path()).expect("reload");
    assert_eq!(again.echo_stats().expect("stats").answered, 5);
}

/// The registry in `health-common` (what the loader, the pin checks and
/// `bpf map list|dump` go by) says of every map what the kernel object
/// really made: kind, key size and value size, read back from the pins.
#[test]
fn the_map_registry_matches_the_maps_the_object_pins() {
    use aya::maps::{MapInfo, MapType};
    use health_common::maps::{MapId, MapKind};

    let (r, pins) = loaded();
    // Right after a load every pin is there: the agent's periodic pin
    // check finds none gone (aya-log's ring buffer, never pinned, is not
    // taken for a lost pin, which would warn at every start).
    assert_eq!(r.repin().expect("pin check"), Vec::<String>::new());
    // aya-log's ring buffer is the only map of the object that is not pinned.
    for id in MapId::ALL.into_iter().filter(|m| *m != MapId::AyaLogs) {
        let info = MapInfo::from_pin(pins.path().join(id.name()))
            .unwrap_or_else(|e| panic!("{} is not pinned: {e}", id.name()));
        let kind = match info.map_type().expect("map type") {
            MapType::Hash => MapKind::Hash,
            MapType::Array => MapKind::Array,
            MapType::PerCpuHash => MapKind::PerCpuHash,
            MapType::PerCpuArray => MapKind::PerCpuArray,
            MapType::LruHash => MapKind::LruHash,
            MapType::LruPerCpuHash => MapKind::LruPerCpuHash,
            MapType::RingBuf => MapKind::RingBuf,
            other => panic!("{}: unexpected map type {other:?}", id.name()),
        };
        assert_eq!(
            (kind, info.key_size(), info.value_size()),
            (id.kind(), id.key_size(), id.value_size()),
            "{}",
            id.name()
        );
    }
}

/// Every frame class of `health_tests::echo_classes` (what an independent
/// checker sends): the verdict, the exact output bytes (replies checked with
/// the tests' own checksum code) and the counters, in both programs.
#[test]
fn every_frame_class_gets_what_the_kernel_would_do() {
    use health_tests::echo_classes::classes;

    let mut base = request();
    base.dst_mac = LOCAL_MAC;
    let all = classes(&base);
    for_both(|r, prog| {
        test_run_classes(r, prog, &all, |out| {
            packets::verify_ipv4_icmp(&out[14..]).map(|_| ())
        });
    });
}
