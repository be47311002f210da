//! The responder on a real veth between two namespaces: with the kernel's own
//! echo disabled on the responder side, every request gets its reply, the
//! replies are correct byte for byte, and the per-CPU counters agree.

use std::{net::Ipv4Addr, time::Duration};

use health_agent::{
    datapath::{AttachMode, Datapath, Interface},
    sys::netlink::in_netns,
};
use health_common::maps::EchoConfig;
use health_tests::{
    capture::{exchange, the_reply},
    echo_check::{Background, against_kernel, responder_on_b},
    echo_classes::classes,
    packets::{Echo, verify_ipv4_icmp},
    pinger::{check_reply, ping},
    pins::PinDir,
    topology::{A_IF, A_IP, B_IF, B_IP, TwoNodes},
};

const REQUESTS: u16 = 50;

fn echo_over_veth(mode: AttachMode, identifier: u16) {
    let nodes = TwoNodes::new();
    // Warm-up with the kernel's echo on: the neighbour entry is resolved
    // now, so the control request below leaves at once (one left waiting
    // for ARP on a busy machine would reach the responder, attached
    // meanwhile, and be counted).
    let warm = ping(
        &nodes.a,
        B_IP,
        identifier ^ 0x8000,
        1,
        Duration::from_secs(2),
    )
    .expect("ping");
    assert!(
        warm[0].reply.is_some(),
        "{mode}: no reply from the kernel's own echo"
    );
    TwoNodes::sysctl(&nodes.b, "net/ipv4/icmp_echo_ignore_all", "1");

    // Control: with the kernel's echo off and no responder, nothing answers.
    let control = ping(&nodes.a, B_IP, identifier, 1, Duration::from_millis(300)).expect("ping");
    assert!(
        control[0].reply.is_none(),
        "{mode}: the kernel answered although icmp_echo_ignore_all=1"
    );

    let (responder, _pins) = responder_on_b(&nodes, mode, Some(B_IP), None);
    let before = responder.echo_stats().expect("stats");
    let b_sent = || {
        in_netns(
            Some(&nodes.b),
            |nl| async move { nl.link_stats(B_IF).await },
        )
        .expect("B's counters")
        .tx_packets
    };
    let b_sent_before = b_sent();

    let exchanges =
        ping(&nodes.a, B_IP, identifier, REQUESTS, Duration::from_secs(1)).expect("ping");
    let failures: Vec<String> = exchanges
        .iter()
        .filter_map(|e| check_reply(e, identifier).err())
        .collect();
    assert!(
        failures.is_empty(),
        "{mode}: {} of {REQUESTS} exchanges failed: {failures:#?}",
        failures.len()
    );

    let delta = responder.echo_stats().expect("stats").since(before);
    assert_eq!(
        delta.answered,
        u64::from(REQUESTS),
        "{mode}: answered counter"
    );
    assert_eq!(delta.malformed, 0, "{mode}: malformed counter");
    // At tc, B's veth has its peer in A's namespace: the replies go
    // straight to A's ingress, never out through B's transmit path (a
    // few frames of B's own may leave meanwhile).
    if matches!(mode, AttachMode::Tcx | AttachMode::Tc) {
        let sent = b_sent() - b_sent_before;
        assert!(
            sent < u64::from(REQUESTS),
            "{mode}: {sent} frames left through B's veth: the replies were not handed to its peer"
        );
    }

    // Detach: the endpoint goes quiet again.
    drop(responder);
    let after = ping(&nodes.a, B_IP, identifier, 1, Duration::from_millis(300)).expect("ping");
    assert!(
        after[0].reply.is_none(),
        "{mode}: replies continued after the responder was dropped"
    );
}

#[test]
fn tcx_answers_every_request() {
    echo_over_veth(AttachMode::Tcx, 0x7101);
}

/// The classic hook (clsact + `cls_bpf`), on any kernel: what the agent
/// uses where tcx is missing.
#[test]
fn tc_answers_every_request() {
    echo_over_veth(AttachMode::Tc, 0x7104);
}

#[test]
fn xdp_generic_answers_every_request() {
    echo_over_veth(AttachMode::XdpGeneric, 0x7102);
}

#[test]
fn xdp_native_answers_every_request() {
    echo_over_veth(AttachMode::XdpNative, 0x7103);
}

/// The echo reply to `frame` (sent from A) that arrives at A within the
/// window: matched by identifier and by the sequence the frame carries.
fn reply_to(nodes: &TwoNodes, frame: &[u8], identifier: u16) -> Option<Vec<u8>> {
    let ip = match u16::from_be_bytes([frame[12], frame[13]]) {
        0x8100 | 0x88a8 => 18,
        _ => 14,
    };
    let seq = [frame[ip + 26], frame[ip + 27]];
    let got = exchange(&nodes.a, A_IF, frame, Duration::from_millis(250)).expect("exchange");
    the_reply(got, |f| {
        f.len() >= 42
            && f[12..14] == [0x08, 0x00]
            && f[23] == 1
            && f[34] == 0
            && f[38..40] == identifier.to_be_bytes()
            && f[40..42] == seq
    })
}

/// What two correct replies to one request share: the kernel's own reply
/// differs from the responder's only in the IPv4 identification and flags.
fn essentials(reply: &[u8]) -> Vec<u8> {
    verify_ipv4_icmp(&reply[14..]).unwrap_or_else(|e| panic!("reply does not verify: {e}"));
    let mut v = reply[..14].to_vec(); // MACs, EtherType
    v.extend_from_slice(&reply[14..18]); // version, IHL, TOS, total length
    v.extend_from_slice(&reply[22..24]); // TTL, protocol
    v.extend_from_slice(&reply[26..]); // addresses, ICMP message
    v
}

/// Every frame class, sent over the veth from A: first to the kernel alone
/// (its own echo on, no responder), the oracle; then to the responder with
/// the kernel's echo off. The responder answers exactly the classes the
/// kernel answers (byte for byte the expected reply, equal to the kernel's
/// but for IP ID and flags), drops what the kernel drops, and passes the
/// rest untouched; the counters say which it did.
fn frame_classes_over_veth(mode: AttachMode, identifier: u16) {
    let nodes = TwoNodes::new();
    // IPv4 only: the kernel's IPv6 control traffic (router solicitations,
    // MLD reports) would be passed and counted among the classes' frames.
    for ns in [&nodes.a, &nodes.b] {
        TwoNodes::sysctl(ns, "net/ipv6/conf/all/disable_ipv6", "1");
    }
    let (_, a_mac) =
        in_netns(Some(&nodes.a), |nl| async move { nl.link_l2(A_IF).await }).expect("A's MAC");
    let (_, b_mac) =
        in_netns(Some(&nodes.b), |nl| async move { nl.link_l2(B_IF).await }).expect("B's MAC");
    let mut base = Echo::request(A_IP, B_IP, identifier, 100);
    base.src_mac = a_mac;
    base.dst_mac = b_mac;
    let all = classes(&base);

    let kernel: Vec<Option<Vec<u8>>> = all
        .iter()
        .map(|c| reply_to(&nodes, &c.frame, identifier))
        .collect();

    TwoNodes::sysctl(&nodes.b, "net/ipv4/icmp_echo_ignore_all", "1");
    let (responder, _pins) = responder_on_b(&nodes, mode, Some(B_IP), None);

    against_kernel(
        mode,
        &all,
        &kernel,
        &responder,
        |frame| reply_to(&nodes, frame, identifier),
        essentials,
        Background::None,
    );
}

#[test]
fn tcx_treats_every_frame_class_as_the_kernel_does() {
    frame_classes_over_veth(AttachMode::Tcx, 0x7201);
}

#[test]
fn tc_treats_every_frame_class_as_the_kernel_does() {
    frame_classes_over_veth(AttachMode::Tc, 0x7204);
}

#[test]
fn xdp_generic_treats_every_frame_class_as_the_kernel_does() {
    frame_classes_over_veth(AttachMode::XdpGeneric, 0x7202);
}

#[test]
fn xdp_native_treats_every_frame_class_as_the_kernel_does() {
    frame_classes_over_veth(AttachMode::XdpNative, 0x7203);
}

/// A veth whose peer shares its namespace: the responder must not hand the
/// reply to the peer's ingress (the kernel drops that within one
/// namespace), and sends it out of the veth instead, in both tc modes.
fn reply_over_a_veth_in_one_namespace(mode: AttachMode, identifier: u16) {
    const NEAR: &str = "veth-c";
    const FAR: &str = "veth-d";
    const FAR_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 2);
    let nodes = TwoNodes::new();
    TwoNodes::sysctl(&nodes.a, "net/ipv4/icmp_echo_ignore_all", "1");
    let (near_mac, far_mac) = in_netns(Some(&nodes.a), |nl| async move {
        nl.add_veth(NEAR, FAR, None).await?;
        nl.add_address(FAR, FAR_IP, 24).await?;
        nl.set_up(NEAR).await?;
        nl.set_up(FAR).await?;
        Ok((nl.link_l2(NEAR).await?.1, nl.link_l2(FAR).await?.1))
    })
    .expect("a veth pair inside namespace a");

    let pins = PinDir::new();
    let mut responder = Datapath::load(pins.path()).expect("load");
    let iface = Interface::new(FAR, Some(nodes.a.clone()));
    let cfg = responder
        .set_echo_targets(&iface, Some(FAR_IP), None)
        .expect("address");
    assert_eq!(
        cfg.flags & EchoConfig::REPLY_TO_PEER,
        0,
        "{mode}: the peer is in the same namespace, yet the reply would go to its ingress"
    );
    responder.attach_echo(&iface, mode, None).expect("attach");
    let before = responder.echo_stats().expect("stats");

    let mut req = Echo::request(Ipv4Addr::new(198, 18, 1, 1), FAR_IP, identifier, 7);
    req.src_mac = near_mac;
    req.dst_mac = far_mac;
    let got = exchange(&nodes.a, NEAR, &req.frame(), Duration::from_millis(500)).expect("exchange");
    let reply = the_reply(got, |f| {
        f.len() >= 42 && f[23] == 1 && f[34] == 0 && f[38..40] == identifier.to_be_bytes()
    })
    .unwrap_or_else(|| panic!("{mode}: no reply came back over the veth"));
    verify_ipv4_icmp(&reply[14..])
        .unwrap_or_else(|e| panic!("{mode}: the reply does not verify: {e}"));
    assert_eq!(reply[..6], near_mac, "{mode}: the reply's destination MAC");
    let delta = responder.echo_stats().expect("stats").since(before);
    assert_eq!(delta.answered, 1, "{mode}: answered counter");
}

#[test]
fn tcx_replies_out_of_a_veth_whose_peer_shares_its_namespace() {
    reply_over_a_veth_in_one_namespace(AttachMode::Tcx, 0x7301);
}

#[test]
fn tc_replies_out_of_a_veth_whose_peer_shares_its_namespace() {
    reply_over_a_veth_in_one_namespace(AttachMode::Tc, 0x7302);
}
