//! The responder on a real veth between two namespaces: with the kernel's own
//! echo disabled on the responder side, every request gets its reply, the
//! replies are correct byte for byte, and the per-CPU counters agree.

use std::time::Duration;

use health_agent::datapath::{AttachMode, Datapath, Interface};
use health_tests::{
    pinger::{check_reply, ping},
    pins::PinDir,
    topology::{A_IF, B_IF, B_IP, TwoNodes},
};

const REQUESTS: u16 = 50;

fn echo_over_veth(mode: AttachMode, identifier: u16) {
    let nodes = TwoNodes::new();
    TwoNodes::sysctl(&nodes.b, "net/ipv4/icmp_echo_ignore_all", "1");

    // Control: with the kernel's echo off and no responder, nothing answers.
    let control = ping(&nodes.a, B_IP, identifier, 1, Duration::from_millis(300)).expect("ping");
    assert!(
        control[0].reply.is_none(),
        "{mode}: the kernel answered although icmp_echo_ignore_all=1"
    );

    let pins = PinDir::new();
    let mut responder = Datapath::load(pins.path()).expect("load");
    responder.set_echo_address(B_IP).expect("address");
    let iface = Interface::new(B_IF, Some(nodes.b.clone()));
    let peer = Interface::new(A_IF, Some(nodes.a.clone()));
    responder
        .attach_echo(&iface, mode, Some(&peer))
        .expect("attach");
    let before = responder.echo_stats().expect("stats");

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

#[test]
fn xdp_generic_answers_every_request() {
    echo_over_veth(AttachMode::XdpGeneric, 0x7102);
}

#[test]
fn xdp_native_answers_every_request() {
    echo_over_veth(AttachMode::XdpNative, 0x7103);
}
