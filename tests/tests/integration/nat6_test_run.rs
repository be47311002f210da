//! The masquerade programs (tcx on the node's uplink) with masquerade on,
//! run by the kernel on IPv6 (`BPF_PROG_TEST_RUN`): IPv6 is never
//! masqueraded, so every IPv6 packet leaves both programs untouched, makes
//! no NAT entry and counts nothing, while IPv4 is still translated.

use std::net::Ipv6Addr;

use health_agent::datapath::{Datapath, nat};
use health_common::{ct::CtConfig, maps::ProgId, nat::NatCounter};
use health_tests::{
    nat_setup::{EP, NODE, PEER, config},
    packets::{Echo, verify_frame},
    packets6::{Echo6, tcp6, udp6},
    pins::PinDir,
    require_root,
};

use health_tests::tc_run::TCX_NEXT;
const EP6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 0x40, 0, 0, 0, 2);
const NODE6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 0x11);
const PEER6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 0x12);

/// Runs the egress (SNAT) or ingress program: its verdict and the frame.
fn run(r: &mut Datapath, egress: bool, input: &[u8]) -> (u32, Vec<u8>) {
    let prog = if egress {
        ProgId::NatEgress
    } else {
        ProgId::NatIngress
    };
    health_tests::tc_run::run(r, prog, input)
}

#[test]
fn ipv6_passes_the_nat_programs_untouched() {
    require_root();
    let pins = PinDir::new();
    let mut r = Datapath::load(pins.path()).expect("load");
    r.set_ct_config(CtConfig::default()).expect("ct config");
    r.set_nat_config(config(61_000, 65_535))
        .expect("nat config");
    let req = Echo6::request(EP6, PEER6, 0x0201, 1);
    let mut reply_to_node = req.expected_reply();
    reply_to_node.dst = NODE6;
    let leaving = [
        ("ICMPv6 echo request", req.frame()),
        ("TCP SYN", tcp6(EP6, PEER6, (40_000, 4240), 0x02, b"")),
        ("UDP", udp6(EP6, PEER6, (5353, 53))),
    ];
    let arriving = [
        ("ICMPv6 echo reply to the node", reply_to_node.frame()),
        ("ICMPv6 echo reply", req.expected_reply().frame()),
        ("TCP SYN-ACK", tcp6(PEER6, NODE6, (4240, 61_000), 0x12, b"")),
        ("UDP", udp6(PEER6, NODE6, (53, 61_001))),
    ];
    for (egress, cases) in [(true, &leaving[..]), (false, &arriving[..])] {
        for (what, input) in cases {
            assert_eq!(
                run(&mut r, egress, input),
                (TCX_NEXT, input.clone()),
                "{what} (egress {egress}) changed or not handed on"
            );
        }
    }
    let entries = nat::list(pins.path()).expect("nat");
    assert!(entries.is_empty(), "IPv6 made NAT entries: {entries:#?}");
    let counters = nat::counters(pins.path()).expect("counters");
    for c in NatCounter::ALL {
        assert_eq!(
            health_tests::counter(&counters, c.name()),
            0,
            "{}",
            c.name()
        );
    }

    // The same programs still masquerade IPv4: they were on all along.
    let (verdict, out) = run(&mut r, true, &Echo::request(EP, PEER, 0x0201, 1).frame());
    assert_eq!(verdict, TCX_NEXT);
    let (src, dst, _, _) = verify_frame(&out).expect("valid");
    assert_eq!((src, dst), (NODE, PEER), "IPv4 is masqueraded");
    assert_eq!(
        nat::list(pins.path()).expect("nat").len(),
        2,
        "one IPv4 pair"
    );
}
