//! The responder answering `ICMPv6` echo on a real veth between two
//! namespaces, in every attach mode, with the kernel's own IPv6 echo
//! disabled on the responder side (`net.ipv6.icmp.echo_ignore_all=1`):
//! every request gets its correct reply, neighbour discovery keeps working
//! through the responder, and the IPv6 frame classes get what the kernel
//! itself (the oracle) does with them.

use std::time::Duration;

use health_agent::{datapath::AttachMode, sys::netlink::in_netns};
use health_tests::{
    capture::{exchange, the_reply},
    echo_check::{Background, against_kernel, responder_on_b},
    echo_classes6::classes6,
    packets6::{Echo6, verify_icmpv6_frame},
    pinger6::{check_reply6, ping6},
    topology::{A_IF, A_IP6, B_IF, B_IP6, TwoNodes},
};

const REQUESTS: u16 = 50;
const ECHO_IGNORE_ALL: &str = "net/ipv6/icmp/echo_ignore_all";

fn echo6_over_veth(mode: AttachMode, identifier: u16) {
    let nodes = TwoNodes::new();
    nodes.add_ipv6();
    TwoNodes::sysctl(&nodes.b, ECHO_IGNORE_ALL, "1");
    // The responder goes on before any IPv6 traffic: A's first request
    // waits for neighbour discovery, whose solicitation must pass through
    // the responder to B's stack and be answered by it.
    let (responder, pins) = responder_on_b(&nodes, mode, None, Some(B_IP6));
    let before = responder.echo_stats().expect("stats");

    let exchanges = ping6(
        &nodes.a,
        A_IP6,
        B_IP6,
        identifier,
        REQUESTS,
        Duration::from_secs(2),
    )
    .expect("ping");
    let failures: Vec<String> = exchanges
        .iter()
        .filter_map(|e| check_reply6(e, B_IP6, A_IP6, identifier).err())
        .collect();
    assert!(
        failures.is_empty(),
        "{mode}: {} of {REQUESTS} exchanges failed: {failures:#?}",
        failures.len()
    );
    let delta = responder.echo_stats().expect("stats").since(before);
    // Passed counts the neighbour discovery and MLD traffic besides.
    assert_eq!(
        delta.answered,
        u64::from(REQUESTS),
        "{mode}: answered counter"
    );
    assert_eq!(delta.malformed, 0, "{mode}: malformed counter");
    assert!(
        delta.passed >= 1,
        "{mode}: no neighbour solicitation passed"
    );

    // Without the responder nothing answers: the kernel's echo is off.
    drop(responder);
    drop(pins);
    let after = ping6(
        &nodes.a,
        A_IP6,
        B_IP6,
        identifier ^ 0x8000,
        1,
        Duration::from_millis(300),
    )
    .expect("ping");
    assert!(
        after[0].reply.is_none(),
        "{mode}: replies continued without the responder (echo_ignore_all=1)"
    );
}

#[test]
fn tcx_answers_every_ipv6_request() {
    echo6_over_veth(AttachMode::Tcx, 0x7601);
}

#[test]
fn tc_answers_every_ipv6_request() {
    echo6_over_veth(AttachMode::Tc, 0x7604);
}

#[test]
fn xdp_generic_answers_every_ipv6_request() {
    echo6_over_veth(AttachMode::XdpGeneric, 0x7602);
}

#[test]
fn xdp_native_answers_every_ipv6_request() {
    echo6_over_veth(AttachMode::XdpNative, 0x7603);
}

/// The echo reply to `frame` (sent from A) that arrives at A within the
/// window, matched by identifier and the frame's sequence.
fn reply_to(nodes: &TwoNodes, frame: &[u8], identifier: u16) -> Option<Vec<u8>> {
    // The classes' extension headers are 8 bytes each, one at most.
    let icmp = if frame[20] == 58 { 54 } else { 62 };
    let seq = [frame[icmp + 6], frame[icmp + 7]];
    let got = exchange(&nodes.a, A_IF, frame, Duration::from_millis(250)).expect("exchange");
    the_reply(got, |f| {
        f.len() >= 62
            && f[12..14] == [0x86, 0xdd]
            && f[20] == 58
            && f[54] == 129
            && f[58..60] == identifier.to_be_bytes()
            && f[60..62] == seq
    })
}

/// What two correct replies to one request share: all but the flow label
/// (the kernel makes one of its own).
fn essentials(reply: &[u8]) -> Vec<u8> {
    verify_icmpv6_frame(reply).unwrap_or_else(|e| panic!("reply does not verify: {e}"));
    let mut v = reply.to_vec();
    v[15] &= 0xf0;
    v[16] = 0;
    v[17] = 0;
    v
}

/// Every IPv6 frame class, sent over the veth from A: first to the kernel
/// alone (its echo on, no responder), the oracle; then to the responder
/// with the kernel's echo off.
fn frame_classes6_over_veth(mode: AttachMode, identifier: u16) {
    let nodes = TwoNodes::new();
    nodes.add_ipv6();
    let (_, a_mac) =
        in_netns(Some(&nodes.a), |nl| async move { nl.link_l2(A_IF).await }).expect("A's MAC");
    let (_, b_mac) =
        in_netns(Some(&nodes.b), |nl| async move { nl.link_l2(B_IF).await }).expect("B's MAC");
    let mut base = Echo6::request(A_IP6, B_IP6, identifier, 100);
    base.src_mac = a_mac;
    base.dst_mac = b_mac;
    // The kernel's reply carries the request's traffic class; the
    // responder's must too.
    base.traffic_class = 0xb8;
    let all = classes6(&base);

    let kernel: Vec<Option<Vec<u8>>> = all
        .iter()
        .map(|c| reply_to(&nodes, &c.frame, identifier))
        .collect();

    TwoNodes::sysctl(&nodes.b, ECHO_IGNORE_ALL, "1");
    let (responder, _pins) = responder_on_b(&nodes, mode, None, Some(B_IP6));

    against_kernel(
        mode,
        &all,
        &kernel,
        &responder,
        |frame| reply_to(&nodes, frame, identifier),
        essentials,
        Background::Ipv6Control,
    );
}

#[test]
fn tcx_treats_every_ipv6_frame_class_as_the_kernel_does() {
    frame_classes6_over_veth(AttachMode::Tcx, 0x7701);
}

#[test]
fn tc_treats_every_ipv6_frame_class_as_the_kernel_does() {
    frame_classes6_over_veth(AttachMode::Tc, 0x7704);
}

#[test]
fn xdp_generic_treats_every_ipv6_frame_class_as_the_kernel_does() {
    frame_classes6_over_veth(AttachMode::XdpGeneric, 0x7702);
}

#[test]
fn xdp_native_treats_every_ipv6_frame_class_as_the_kernel_does() {
    frame_classes6_over_veth(AttachMode::XdpNative, 0x7703);
}
