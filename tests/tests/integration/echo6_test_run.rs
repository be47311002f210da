//! The echo programs run by the kernel on crafted IPv6 frames
//! (`BPF_PROG_TEST_RUN`): for every class of `health_tests::echo_classes6`
//! the verdict, the exact output bytes (replies checked with the tests' own
//! `ICMPv6` checksum code) and the counters, in the XDP and the tc program;
//! IPv4 still answered beside IPv6; and a request from the interface's own
//! link-local address handed to the stack.

use std::net::{Ipv4Addr, Ipv6Addr};

use health_agent::{
    datapath::{Datapath, Interface},
    sys::netlink::in_netns,
};
use health_common::maps::EchoConfig;
use health_tests::{
    echo_check::{Prog, run, test_run_classes},
    echo_classes6::classes6,
    packets::{self, Echo},
    packets6::{Echo6, verify_icmpv6_frame},
    pins::PinDir,
    require_root,
    topology::{A_IF, B_IF, B_IP6, TwoNodes},
};

const LOCAL6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 7, 0, 0, 0, 2);
const PEER6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 7, 0, 0, 0, 1);
const PEER6_LL: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
const LOCAL: Ipv4Addr = Ipv4Addr::new(198, 18, 7, 2);
const PEER: Ipv4Addr = Ipv4Addr::new(198, 18, 7, 1);
const LOCAL_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];

fn loaded() -> (Datapath, PinDir) {
    require_root();
    let pins = PinDir::new();
    let mut r = Datapath::load(pins.path()).expect("load the kernel object");
    r.set_echo_config(EchoConfig {
        addr: LOCAL.octets(),
        mac: LOCAL_MAC,
        addr6: LOCAL6.octets(),
        ..EchoConfig::default()
    })
    .expect("configure the addresses");
    (r, pins)
}

fn base(src: Ipv6Addr) -> Echo6 {
    let mut e = Echo6::request(src, LOCAL6, 0x6d2, 300);
    e.dst_mac = LOCAL_MAC;
    e
}

#[test]
fn every_ipv6_frame_class_gets_what_the_kernel_would_do() {
    let (mut r, _pins) = loaded();
    let mut reflected = base(PEER6);
    reflected.traffic_class = 0xb8;
    reflected.flow_label = 0x1_2345;
    let all: Vec<_> = [base(PEER6), base(PEER6_LL), reflected]
        .iter()
        .flat_map(classes6)
        .collect();
    for prog in Prog::BOTH {
        test_run_classes(&mut r, prog, &all, |out| {
            verify_icmpv6_frame(out).map(|_| ())
        });
    }
}

/// Frames cut inside the IPv6 header: dropped as malformed. The skb test
/// runner refuses IPv6 frames shorter than the fixed header, so those only
/// go to the XDP program; both programs see a frame cut inside the
/// `ICMPv6` header.
#[test]
fn truncated_ipv6_headers_are_dropped_and_counted() {
    let (mut r, _pins) = loaded();
    let frame = base(PEER6).frame();
    for (prog, len) in [
        (Prog::Xdp, 14 + 20),
        (Prog::Xdp, 14 + 39),
        (Prog::Xdp, 14 + 40 + 4),
    ]
    .into_iter()
    .chain([(Prog::Tc, 14 + 40 + 4)])
    {
        let before = r.echo_stats().expect("stats");
        let (verdict, _) = run(&mut r, prog, &frame[..len]);
        assert_eq!(verdict, prog.verdicts().drop, "{prog:?}: cut at {len}");
        let delta = r.echo_stats().expect("stats").since(before);
        assert_eq!(delta.malformed, 1, "{prog:?}: cut at {len}: {delta:?}");
    }
}

/// With both families configured, IPv4 is answered as before; with the
/// IPv6 address cleared, IPv6 echo goes to the stack untouched.
#[test]
fn both_families_answer_and_each_can_be_off() {
    let (mut r, _pins) = loaded();
    let mut v4 = Echo::request(PEER, LOCAL, 0x4d2, 3);
    v4.dst_mac = LOCAL_MAC;
    let v6 = base(PEER6);
    for prog in Prog::BOTH {
        let (verdict, out) = run(&mut r, prog, &v4.frame());
        assert_eq!(verdict, prog.verdicts().reply, "{prog:?}: IPv4");
        assert_eq!(out, v4.expected_reply().frame(), "{prog:?}: IPv4 reply");
        packets::verify_ipv4_icmp(&out[14..]).unwrap_or_else(|e| panic!("{prog:?}: {e}"));
        let (verdict, out) = run(&mut r, prog, &v6.frame());
        assert_eq!(verdict, prog.verdicts().reply, "{prog:?}: IPv6");
        assert_eq!(out, v6.expected_reply().frame(), "{prog:?}: IPv6 reply");
    }
    r.set_echo_config(EchoConfig {
        addr: LOCAL.octets(),
        mac: LOCAL_MAC,
        ..EchoConfig::default()
    })
    .expect("IPv4 only");
    for prog in Prog::BOTH {
        let input = v6.frame();
        let (verdict, out) = run(&mut r, prog, &input);
        assert_eq!(
            verdict,
            prog.verdicts().pass,
            "{prog:?}: IPv6 without an address"
        );
        assert_eq!(out, input, "{prog:?}");
        assert_eq!(
            run(&mut r, prog, &v4.frame()).0,
            prog.verdicts().reply,
            "{prog:?}"
        );
    }
}

/// An agent of the previous layout left `ECHO_CONFIG` pinned with 12-byte
/// values (no IPv6 address): the new object replaces that pin (the
/// configuration is not carried, it is written anew) and answers IPv6.
#[test]
fn an_echo_config_pin_of_the_ipv4_only_layout_is_replaced() {
    use aya::maps::{Array, MapData, MapInfo};
    use health_common::maps::MapId;

    require_root();
    let pins = PinDir::new();
    health_agent::datapath::ensure_pin_dir(pins.path()).expect("pin dir");
    let path = pins.path().join(MapId::EchoConfig.name());
    let mut old = Array::<MapData, [u8; 12]>::create(1, 0).expect("an old-layout array");
    old.set(0, &[7u8; 12], 0).expect("an old entry");
    old.pin(&path)
        .expect("pin it where the echo configuration goes");

    let mut r = Datapath::load(pins.path()).expect("load over the old pin");
    let info = MapInfo::from_pin(&path).expect("the new pin");
    assert_eq!(info.value_size(), MapId::EchoConfig.value_size());
    assert_eq!(info.value_size(), 108);
    r.set_echo_config(EchoConfig {
        mac: LOCAL_MAC,
        addr6: LOCAL6.octets(),
        ..EchoConfig::default()
    })
    .expect("configure");
    let req = base(PEER6);
    let (verdict, out) = run(&mut r, Prog::Tc, &req.frame());
    assert_eq!(verdict, Prog::Tc.verdicts().reply);
    assert_eq!(out, req.expected_reply().frame());
}

/// The link-local addresses of `iface` in `ns`, waiting up to 2 s for the
/// kernel to add one once the veth is up.
fn link_local(ns: &health_agent::sys::netns::Netns, iface: &'static str) -> Ipv6Addr {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let found = in_netns(Some(ns), |nl| async move {
            let index = nl.require_link(iface).await?;
            Ok(nl
                .addresses::<Ipv6Addr>()
                .await?
                .into_iter()
                .find(|(i, a, _)| *i == index && a.is_unicast_link_local())
                .map(|(_, a, _)| a))
        })
        .expect("netlink");
        if let Some(a) = found {
            return a;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{iface} has no link-local address"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The agent tells the responder the interface's addresses, its
/// link-local one included: an echo request from the interface's own
/// link-local address goes to the stack untouched (as the kernel would
/// take it), one from another link-local address (the peer's) is
/// answered, in both programs, and the counters say so.
#[test]
fn a_request_from_the_interfaces_own_link_local_address_is_passed_not_answered() {
    require_root();
    let nodes = TwoNodes::new();
    nodes.add_ipv6();
    let own = link_local(&nodes.b, B_IF);
    let other = link_local(&nodes.a, A_IF);
    assert_ne!(own, other);
    let pins = PinDir::new();
    let mut r = Datapath::load(pins.path()).expect("load the kernel object");
    let cfg = r
        .set_echo_targets(
            &Interface::new(B_IF, Some(nodes.b.clone())),
            None,
            Some(B_IP6),
        )
        .expect("configure from the interface");
    assert!(
        cfg.own6.contains(&own.octets()),
        "{own} not among the responder's own addresses: {cfg:?}"
    );
    assert_eq!(cfg.addr6, B_IP6.octets());
    let request = |src: Ipv6Addr| {
        let mut e = Echo6::request(src, B_IP6, 0x6d3, 9);
        e.dst_mac = cfg.mac;
        e
    };
    for prog in Prog::BOTH {
        let before = r.echo_stats().expect("stats");
        let input = request(own).frame();
        let (verdict, out) = run(&mut r, prog, &input);
        assert_eq!(verdict, prog.verdicts().pass, "{prog:?}: from {own}");
        assert_eq!(out, input, "{prog:?}: a passed request is untouched");
        let from_other = request(other);
        let (verdict, out) = run(&mut r, prog, &from_other.frame());
        assert_eq!(verdict, prog.verdicts().reply, "{prog:?}: from {other}");
        assert_eq!(out, from_other.expected_reply().frame(), "{prog:?}");
        verify_icmpv6_frame(&out).unwrap_or_else(|e| panic!("{prog:?}: {e}"));
        let delta = r.echo_stats().expect("stats").since(before);
        assert_eq!(
            (delta.answered, delta.passed, delta.malformed),
            (1, 1, 0),
            "{prog:?}: {delta:?}"
        );
    }
}
