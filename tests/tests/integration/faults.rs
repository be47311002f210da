//! The programs the tests and the echo benchmark attach to drop packets,
//! run by the kernel (`BPF_PROG_TEST_RUN`): what each drops, and what it
//! hands on.

use std::net::{Ipv4Addr, Ipv6Addr};

use health_tests::{
    faults::DropIcmp,
    packets::{Echo, ethernet},
    packets6::{Echo6, NEXT_ICMPV6, icmpv6_message, ipv6_packet},
    require_root,
};

const A: Ipv4Addr = Ipv4Addr::new(198, 18, 9, 1);
const B: Ipv4Addr = Ipv4Addr::new(198, 18, 9, 2);
const A6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 9, 0, 0, 0, 1);
const B6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 9, 0, 0, 0, 2);
const DROPPED: u32 = 2;
const HANDED_ON: u32 = u32::MAX;

fn verdict(ipv6: bool, frame: &[u8]) -> u32 {
    DropIcmp::echo_replies_verdict(ipv6, frame).expect("BPF_PROG_TEST_RUN")
}

#[test]
fn over_ipv6_only_echo_replies_are_dropped_and_neighbour_discovery_passes() {
    require_root();
    let mut reply = Echo6::request(B6, A6, 7, 1);
    reply.kind = 129;
    assert_eq!(verdict(true, &reply.frame()), DROPPED);
    assert_eq!(
        verdict(true, &Echo6::request(B6, A6, 7, 1).frame()),
        HANDED_ON,
        "an echo request"
    );
    for (kind, what) in [(135, "a neighbour solicitation"), (136, "an advertisement")] {
        let msg = icmpv6_message(B6, A6, kind, 0, &[0; 20]);
        let ip = ipv6_packet(6 << 28, B6, A6, NEXT_ICMPV6, 255, &msg);
        let frame = ethernet([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2], 0x86dd, &ip);
        assert_eq!(verdict(true, &frame), HANDED_ON, "{what}");
    }
    // An echo reply behind an extension header is not read as one, and a
    // frame too short for the type is handed on, never read past its end.
    assert_eq!(
        verdict(
            true,
            &reply.frame_with_extension(60, &[NEXT_ICMPV6, 0, 1, 4, 0, 0, 0, 0])
        ),
        HANDED_ON
    );
    assert_eq!(verdict(true, &reply.frame()[..54]), HANDED_ON);
    let mut v4 = Echo::request(B, A, 7, 1);
    v4.kind = 0;
    assert_eq!(verdict(true, &v4.frame()), HANDED_ON, "IPv4");
}

#[test]
fn over_ipv4_icmp_is_dropped_and_the_rest_passes() {
    require_root();
    let mut reply = Echo::request(B, A, 7, 1);
    reply.kind = 0;
    assert_eq!(verdict(false, &reply.frame()), DROPPED);
    let arp = ethernet([0xff; 6], [2, 0, 0, 0, 0, 2], 0x0806, &[0; 28]);
    assert_eq!(verdict(false, &arp), HANDED_ON, "ARP");
    let mut v6 = Echo6::request(B6, A6, 7, 1);
    v6.kind = 129;
    assert_eq!(verdict(false, &v6.frame()), HANDED_ON, "IPv6");
}
