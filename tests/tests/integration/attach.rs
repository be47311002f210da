//! How programs are attached on the running kernel: `--attach auto` picks
//! tcx where the kernel has it and classic tc (clsact + `cls_bpf`
//! direct-action) where it does not, and says so; `--attach tc` forces the
//! classic hook on any kernel (here too), whose filters sit at the agent's
//! own priority and handles, coexist with a foreign filter on the same
//! device (in front of them), are checked and repaired by the controller, replaced in place
//! after a `kill -9`, and removed on SIGTERM.

use std::{process::Command, time::Duration};

use health_agent::{
    api::types::Healthz,
    datapath::{
        KernelReport, TcHook, TcPolicy,
        classic::{PRIORITY, handle},
        ct,
    },
    sys::{
        netlink::{TcDirection, TcFilter, in_netns},
        netns::Netns,
    },
};
use health_common::maps::ProgId;
use health_tests::{agent::AgentNode, process};
use nix::sys::signal::Signal;

const READY: Duration = Duration::from_secs(10);

fn healthz(node: &AgentNode) -> Healthz {
    health_tests::api::call(&node.socket(), |c| async move { c.healthz().await }).expect("healthz")
}

fn kernel(node: &AgentNode) -> KernelReport {
    healthz(node).kernel.expect("healthz names the kernel")
}

fn filters(ns: &Netns, iface: &str, dir: TcDirection) -> Vec<TcFilter> {
    let iface = iface.to_owned();
    in_netns(
        Some(ns),
        |nl| async move { nl.tc_filters(&iface, dir).await },
    )
    .expect("tc filters")
}

/// The agent's filters (at its priority) on `iface`'s `dir`.
fn ours(ns: &Netns, iface: &str, dir: TcDirection) -> Vec<TcFilter> {
    filters(ns, iface, dir)
        .into_iter()
        .filter(|f| f.priority == PRIORITY)
        .collect()
}

fn has_clsact(ns: &Netns, iface: &str) -> bool {
    let iface = iface.to_owned();
    in_netns(Some(ns), |nl| async move { nl.has_clsact(&iface).await }).expect("qdiscs")
}

/// Exactly one filter of ours on `iface`'s `dir`: `program`'s, at its
/// handle, a `bpf` filter running the program of that name.
fn assert_one_of_ours(ns: &Netns, iface: &str, dir: TcDirection, program: ProgId) {
    let f = ours(ns, iface, dir);
    assert_eq!(f.len(), 1, "{iface} {dir:?}: {f:#?}");
    assert_eq!(f[0].handle, handle(program), "{f:#?}");
    assert_eq!(f[0].kind, "bpf");
    assert_eq!(f[0].bpf_name.as_deref(), Some(program.name()), "{f:#?}");
}

/// `tc ARGS` in the node's namespace (the test plays the operator's tool).
fn tc(node: &AgentNode, args: &[&str]) -> String {
    let mut cmd = Command::new("tc");
    cmd.args(args);
    process::enter(&mut cmd, &node.node);
    let out = cmd.output().expect("run tc");
    assert!(
        out.status.success(),
        "tc {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Adds a foreign filter at priority 100 (before the agent's) on
/// `iface`'s `dir`: classic BPF that matches nothing, so classification
/// goes on to the next filter, as any well-behaved filter in front of ours.
fn add_foreign_filter(node: &AgentNode, iface: &str, dir: &str) {
    tc(
        node,
        &[
            "filter",
            "add",
            "dev",
            iface,
            dir,
            "prio",
            "100",
            "bpf",
            "bytecode",
            "1,6 0 0 0,",
        ],
    );
}

#[test]
fn auto_attach_uses_tcx_where_the_kernel_has_it_and_says_so() {
    let mut node = AgentNode::new();
    node.start(&["--attach", "auto"]);
    let ep = node.wait_endpoint(READY, |_| true);
    let k = kernel(&node);
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("release");
    assert_eq!(k.features.release, release.trim());
    assert_eq!(k.policy, TcPolicy::Auto);
    // tcx exists from 6.6 on: the probe must agree with the release.
    let mut v = k.features.release.split(['.', '-']);
    let major: u32 = v.next().and_then(|x| x.parse().ok()).expect("major");
    let minor: u32 = v.next().and_then(|x| x.parse().ok()).expect("minor");
    assert_eq!(k.features.tcx, (major, minor) >= (6, 6), "{k:#?}");
    let want = if k.features.tcx {
        TcHook::Tcx
    } else {
        TcHook::Tc
    };
    assert_eq!(k.tc_hook, want);
    for p in ["health_echo_tc", "health_lxc_ingress", "health_lxc_egress"] {
        let a = k
            .programs
            .iter()
            .find(|a| a.program == p)
            .unwrap_or_else(|| panic!("{p} not listed: {k:#?}"));
        assert_eq!(a.attach, want.as_str(), "{a:?}");
    }
    // The start-up log and `status --verbose` say the same.
    let log = node.log();
    assert!(
        log.contains(&format!("tc programs on {want}")) && log.contains(&k.features.release),
        "{log}"
    );
    let status = node.cli(&["status", "--verbose"]);
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains(&format!("Kernel:           {}", k.features.release))
            && text.contains(&format!("--attach auto -> {want}"))
            && text.contains("health_lxc_ingress"),
        "{text}"
    );
    node.assert_echo_answered_in_kernel(ep.ipv4.expect("IPv4"), 0x7a01, 3);
    // The filters of the classic hook exist only in tc mode.
    let tc_filters = ours(&node.node, "lxc_health", TcDirection::Ingress).len();
    assert_eq!(tc_filters, usize::from(want == TcHook::Tc));
    assert!(node.stop(Signal::SIGTERM).success(), "{}", node.log());
}

/// Classic tc, masquerade on the uplink, and a controller quick to repair.
const TC_MASQUERADE: [&str; 8] = [
    "--attach",
    "tc",
    "--controller-interval",
    "1s",
    "--routing",
    "masquerade",
    "--node-ip",
    "198.18.0.10",
];

#[test]
fn classic_tc_filters_coexist_are_repaired_replaced_after_kill_9_and_removed_on_sigterm_or_by_tcx()
{
    let mut node = AgentNode::new();
    let args = [&TC_MASQUERADE[..], &["--ct-gc-interval", "1s"]].concat();
    // A foreign filter on the uplink before the agent comes: its clsact
    // qdisc is not the agent's to remove.
    tc(&node, &["qdisc", "add", "dev", "uplink", "clsact"]);
    add_foreign_filter(&node, "uplink", "egress");
    node.start(&args);
    let ep = node.wait_endpoint(READY, |_| true);

    // Reported as forced tc, every program on the classic hook.
    let k = kernel(&node);
    assert_eq!((k.policy, k.tc_hook), (TcPolicy::Tc, TcHook::Tc), "{k:#?}");
    for (id, _, _) in HOOKS {
        let a = k
            .programs
            .iter()
            .find(|a| a.program == id.name())
            .unwrap_or_else(|| panic!("{} not listed: {k:#?}", id.name()));
        assert_eq!(a.attach, "tc", "{a:?}");
        assert!(
            a.detail
                .as_deref()
                .is_some_and(|d| d.contains("pref 18501")),
            "{a:?}"
        );
    }
    assert_every_filter_of_ours(&node);

    // A foreign filter on lxc_health, in front of ours (prio 100 < 18501):
    // ours still sees every packet.
    add_foreign_filter(&node, "lxc_health", "ingress");
    node.assert_echo_answered_in_kernel(ep.ipv4.expect("IPv4"), 0x7a02, 5);
    // The tracking filters (after the foreign one on ingress) saw the
    // exchange both ways: 5 requests to the endpoint, 5 replies from it.
    let flow = ct::list(&node.pins)
        .expect("ct")
        .into_iter()
        .find(|r| r.proto == "ICMP" && (r.sport == 0x7a02 || r.dport == 0x7a02))
        .unwrap_or_else(|| panic!("no CT entry of the echo; log:\n{}", node.log()));
    assert_eq!((flow.rx_packets, flow.tx_packets), (5, 5), "{flow:?}");

    // Someone deletes our filters: the controller puts lxc_health's back,
    // the datapath task the uplink's.
    delete_ours(&node, "lxc_health", "ingress", ProgId::LxcIngress);
    node.wait_endpoint(Duration::from_secs(5), |e| e.repairs >= 1);
    delete_ours(&node, "uplink", "egress", ProgId::NatEgress);
    let deadline = std::time::Instant::now() + health_tests::patience(Duration::from_secs(5));
    while ours(&node.node, "uplink", TcDirection::Egress).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "masquerade not re-attached; log:\n{}",
            node.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_every_filter_of_ours(&node);

    // kill -9 leaves the filters; the next agent replaces them in place.
    node.stop(Signal::SIGKILL);
    assert_every_filter_of_ours(&node);
    node.start(&args);
    let restored = node.wait_endpoint(READY, |_| true);
    assert_eq!(restored.ipv4, ep.ipv4);
    assert!(
        node.log()
            .contains("replaced the tc filter a previous agent left"),
        "{}",
        node.log()
    );
    assert_every_filter_of_ours(&node);
    assert_eq!(
        filters(&node.node, "lxc_health", TcDirection::Ingress).len(),
        2,
        "ours and the foreign one"
    );
    node.assert_echo_answered_in_kernel(ep.ipv4.expect("IPv4"), 0x7a03, 3);
    a_tcx_agent_removes_the_filters_a_killed_one_left(&mut node, &args);

    // SIGTERM: ours go, the foreign filter and its qdisc stay.
    assert!(node.stop(Signal::SIGTERM).success(), "{}", node.log());
    assert_eq!(ours(&node.node, "uplink", TcDirection::Ingress).len(), 0);
    assert_eq!(ours(&node.node, "uplink", TcDirection::Egress).len(), 0);
    let left = filters(&node.node, "uplink", TcDirection::Egress);
    assert_eq!(left.len(), 1, "{left:#?}");
    assert_eq!((left[0].priority, left[0].bpf_id), (100, None), "{left:#?}");
    assert!(has_clsact(&node.node, "uplink"), "the foreign qdisc stays");
    assert!(!node.node_has_link("lxc_health"));
    assert!(!node.endpoint_ns().exists());
    assert!(!node.pins.exists());
}

/// kill -9 leaves the classic filters; the next agent, attaching with
/// tcx, removes those at its slots (they would run beside its tcx
/// programs) and leaves the foreign ones.
fn a_tcx_agent_removes_the_filters_a_killed_one_left(node: &mut AgentNode, args: &[&str]) {
    node.stop(Signal::SIGKILL);
    assert_every_filter_of_ours(node);
    let mut tcx = args.to_vec();
    let at = tcx.iter().position(|a| *a == "tc").expect("--attach tc");
    tcx[at] = "tcx";
    node.start(&tcx);
    let ep = node.wait_endpoint(READY, |_| true);
    let log = node.log();
    assert!(
        log.contains("removed the tc filter a previous agent left at our slot"),
        "{log}"
    );
    for (id, iface, dir) in HOOKS {
        let ns = if iface == "eth0" {
            node.endpoint_ns()
        } else {
            node.node.clone()
        };
        let left = ours(&ns, iface, dir);
        assert!(left.is_empty(), "{} left on {iface}: {left:#?}", id.name());
    }
    let foreign = filters(&node.node, "lxc_health", TcDirection::Ingress);
    assert!(
        foreign.iter().all(|f| f.priority != PRIORITY),
        "{foreign:#?}"
    );
    node.assert_echo_answered_in_kernel(ep.ipv4.expect("IPv4"), 0x7a04, 3);
}

/// Every hook of the agent in tc mode with masquerade: program, interface
/// (`eth0` is in the endpoint's namespace, the others in the node's),
/// direction.
const HOOKS: [(ProgId, &str, TcDirection); 5] = [
    (ProgId::EchoTc, "eth0", TcDirection::Ingress),
    (ProgId::LxcIngress, "lxc_health", TcDirection::Ingress),
    (ProgId::LxcEgress, "lxc_health", TcDirection::Egress),
    (ProgId::NatIngress, "uplink", TcDirection::Ingress),
    (ProgId::NatEgress, "uplink", TcDirection::Egress),
];

/// Exactly one filter of ours on every hook.
fn assert_every_filter_of_ours(node: &AgentNode) {
    for (id, iface, dir) in HOOKS {
        let ns = if iface == "eth0" {
            node.endpoint_ns()
        } else {
            node.node.clone()
        };
        assert_one_of_ours(&ns, iface, dir, id);
    }
}

/// `tc filter del` of `program`'s filter, as an operator would.
fn delete_ours(node: &AgentNode, iface: &str, dir: &str, program: ProgId) {
    let h = format!("{:#x}", handle(program));
    tc(
        node,
        &[
            "filter", "del", "dev", iface, dir, "prio", "18501", "handle", &h, "bpf",
        ],
    );
    let d = if dir == "ingress" {
        TcDirection::Ingress
    } else {
        TcDirection::Egress
    };
    assert_eq!(ours(&node.node, iface, d).len(), 0, "deleted");
}

#[test]
fn a_clsact_qdisc_the_agent_added_goes_with_its_filters() {
    let mut node = AgentNode::new();
    assert!(!has_clsact(&node.node, "uplink"), "a fresh uplink");
    node.start(&[
        "--attach",
        "tc",
        "--routing",
        "masquerade",
        "--node-ip",
        "198.18.0.10",
    ]);
    node.wait_endpoint(READY, |_| true);
    assert!(has_clsact(&node.node, "uplink"));
    assert_one_of_ours(&node.node, "uplink", TcDirection::Egress, ProgId::NatEgress);
    assert!(node.stop(Signal::SIGTERM).success(), "{}", node.log());
    assert!(
        !has_clsact(&node.node, "uplink"),
        "the clsact qdisc the agent added is left on the uplink"
    );
}

/// The endpoint's programs and the uplink's are attached through one
/// kernel object, each user's set on its own: recreating the endpoint
/// (its veth deleted) re-attaches the endpoint's programs to the new
/// interfaces and leaves masquerade's filters as they were, and the
/// status lists every program exactly once before and after.
#[test]
fn a_recreated_endpoint_takes_its_programs_along_and_leaves_the_uplinks() {
    let mut node = AgentNode::new();
    node.start(&TC_MASQUERADE);
    let ep = node.wait_endpoint(READY, |_| true);
    let listed = |node: &AgentNode| {
        let mut names: Vec<String> = kernel(node)
            .programs
            .into_iter()
            .map(|a| a.program)
            .collect();
        names.sort();
        names
    };
    let mut every: Vec<String> = HOOKS
        .iter()
        .map(|(id, _, _)| id.name().to_owned())
        .collect();
    every.sort();
    assert_eq!(listed(&node), every, "each program once");
    assert_every_filter_of_ours(&node);
    let uplink = ours(&node.node, "uplink", TcDirection::Egress);

    in_netns(Some(&node.node), |nl| async move {
        nl.delete_link("lxc_health").await
    })
    .expect("delete lxc_health");
    node.wait_endpoint(Duration::from_secs(5), |e| e.repairs >= 1);
    assert_every_filter_of_ours(&node);
    assert_eq!(
        ours(&node.node, "uplink", TcDirection::Egress),
        uplink,
        "masquerade's filter untouched by the endpoint's repair"
    );
    assert_eq!(listed(&node), every, "each program once after the repair");
    node.assert_echo_answered_in_kernel(ep.ipv4.expect("IPv4"), 0x7a04, 3);
    assert!(node.stop(Signal::SIGTERM).success(), "{}", node.log());
    for (_, iface, dir) in &HOOKS[3..] {
        assert_eq!(ours(&node.node, iface, *dir).len(), 0, "{iface} {dir:?}");
    }
}
