//! The endpoint's namespace and veth are the agent's only when its own
//! record proves it: a namesake made by someone else is refused, named and
//! left alone; the agent's own objects survive SIGKILL and are removed on a
//! clean stop. Each agent runs in a namespace that plays its node.

use std::{path::PathBuf, time::Duration};

use health_agent::{
    endpoint::{
        ownership::{LinkProof, Owned},
        plan::{Plan, PlumbingError, V4},
        plumbing,
        record::EndpointRecord,
    },
    sys::{netlink::in_netns, netns::Netns},
};
use health_tests::{
    agent::{AgentNode, HEALTH_CIDR},
    topology::TwoNodes,
};
use nix::sys::signal::Signal;

const READY: Duration = Duration::from_secs(10);

fn state_dir(node: &AgentNode) -> PathBuf {
    node.dir.join("state")
}

fn record(node: &AgentNode) -> Option<EndpointRecord> {
    EndpointRecord::load(&state_dir(node)).expect("a readable record")
}

/// Device and inode of the endpoint namespace, if there is one.
fn netns_identity(node: &AgentNode) -> Option<(u64, u64)> {
    node.endpoint_ns().identity().expect("stat")
}

/// The index of `name` in the node's namespace.
fn node_link(node: &AgentNode, name: &str) -> Option<u32> {
    let name = name.to_owned();
    in_netns(
        Some(&node.node),
        |nl| async move { nl.link_index(&name).await },
    )
    .expect("netlink")
}

/// The index of `eth0` inside the endpoint namespace.
fn endpoint_link(node: &AgentNode) -> Option<u32> {
    in_netns(Some(&node.endpoint_ns()), |nl| async move {
        nl.link_index("eth0").await
    })
    .expect("netlink")
}

/// What the objects are now, as the record would name them.
fn proven_now(node: &AgentNode) -> (Option<(u64, u64)>, Option<u32>, Option<u32>) {
    (
        netns_identity(node),
        node_link(node, "lxc_health"),
        endpoint_link(node),
    )
}

fn recorded(owned: &Owned) -> (Option<(u64, u64)>, Option<u32>, Option<u32>) {
    (
        owned.netns.as_ref().map(|n| (n.dev, n.ino)),
        owned.host.as_ref().map(|h| h.ifindex),
        owned.peer.as_ref().map(|p| p.ifindex),
    )
}

/// Someone else's `lxc_health` (paired with `theirs-peer`) in the node's
/// namespace; its index.
fn foreign_lxc_health(node: &AgentNode) -> u32 {
    in_netns(Some(&node.node), |nl| async move {
        nl.add_veth("lxc_health", "theirs-peer", None).await
    })
    .expect("a foreign lxc_health");
    node_link(node, "lxc_health").expect("there")
}

/// The foreign `lxc_health` of [`foreign_lxc_health`] is as it was, and
/// its peer too.
fn assert_foreign_lxc_health_left(node: &AgentNode, index: u32) {
    assert_eq!(node_link(node, "lxc_health"), Some(index), "left as it was");
    assert!(node_link(node, "theirs-peer").is_some(), "its peer too");
}

/// The daemon, run to its exit, fails naming `needles`.
/// Waits for the running agent's controller to name something under the
/// endpoint's names as not its own.
fn wait_named_foreign(node: &AgentNode) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !node.log().contains("was not made by this agent") {
        assert!(
            std::time::Instant::now() < deadline,
            "the controller never named it; log:\n{}",
            node.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn assert_refused(node: &AgentNode, needles: &[&str]) {
    let out = node.run_to_exit(HEALTH_CIDR, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the agent started:\n{err}");
    for n in needles {
        assert!(err.contains(n), "{n:?} not in:\n{err}");
    }
    assert!(!node.socket().exists() && !node.pidfile().exists());
}

#[test]
fn a_foreign_endpoint_namespace_is_refused_named_and_left() {
    let mut node = AgentNode::new();
    // Someone else's namespace under the endpoint's name, with a link of
    // its own inside.
    let foreign = Netns::create(&node.endpoint_netns).expect("a foreign namespace");
    in_netns(
        Some(&foreign),
        |nl| async move { nl.add_bridge("theirs").await },
    )
    .expect("their link");
    let before = netns_identity(&node).expect("there");
    let name = format!("{:?}", node.endpoint_netns);
    assert_refused(
        &node,
        &[
            &format!("network namespace {name} was not made by this agent"),
            "no endpoint record",
            &format!("inode {}", before.1),
            "--endpoint-netns",
        ],
    );
    assert_eq!(netns_identity(&node), Some(before), "the namespace is left");
    let theirs = in_netns(
        Some(&foreign),
        |nl| async move { nl.link_index("theirs").await },
    )
    .expect("netlink");
    assert!(theirs.is_some(), "what is inside it is left too");
    assert_eq!(node_link(&node, "lxc_health"), None, "nothing was made");

    // With a record of its own that names another namespace: the agent's
    // kept endpoint, replaced by someone else's under the same name.
    foreign.delete().expect("remove it");
    node.start(&["--keep-endpoint"]);
    node.wait_endpoint(READY, |_| true);
    assert!(node.stop(Signal::SIGTERM).success());
    let ours = netns_identity(&node).expect("kept");
    node.endpoint_ns().delete().expect("someone removes it");
    let _replacement = Netns::create(&node.endpoint_netns).expect("and makes their own");
    let theirs = netns_identity(&node).expect("there");
    assert_refused(
        &node,
        &[
            &format!("network namespace {name} was not made by this agent"),
            &format!("expected device {} inode {}", ours.0, ours.1),
            &format!("found device {} inode {}", theirs.0, theirs.1),
        ],
    );
    assert_eq!(netns_identity(&node), Some(theirs), "left as it was");
}

#[test]
fn a_foreign_lxc_health_is_refused_named_and_left() {
    let node = AgentNode::new();
    let index = foreign_lxc_health(&node);
    assert_refused(
        &node,
        &[
            "interface \"lxc_health\" in the node's namespace was not made by this agent",
            "no endpoint record",
            &format!("found index {index}"),
            "--host-iface",
        ],
    );
    assert_foreign_lxc_health_left(&node, index);
    assert!(!node.endpoint_ns().exists(), "no endpoint namespace made");
}

#[test]
fn after_sigkill_the_agent_adopts_what_its_record_proves_and_removes_it_on_stop() {
    let mut node = AgentNode::new();
    node.start(&[]);
    let ep = node.wait_endpoint(READY, |_| true);
    let owned = record(&node)
        .and_then(|r| r.owned)
        .expect("the record names what the agent made");
    let made = proven_now(&node);
    assert!(
        made.0.is_some() && made.1.is_some() && made.2.is_some(),
        "{made:?}"
    );
    assert_eq!(recorded(&owned), made, "the record proves each object");

    node.stop(Signal::SIGKILL);
    assert_eq!(proven_now(&node), made, "SIGKILL leaves the objects");
    node.start(&[]);
    let restored = node.wait_endpoint(READY, |_| true);
    assert_eq!((restored.id, restored.ipv4), (ep.id, ep.ipv4));
    assert_eq!(
        restored.history.first().map(|t| t.to.as_str()),
        Some("restoring"),
        "its own objects adopted"
    );
    assert_eq!(proven_now(&node), made, "reused, not recreated");
    assert_eq!(
        record(&node).and_then(|r| r.owned).map(|o| recorded(&o)),
        Some(made)
    );

    let status = node.stop(Signal::SIGTERM);
    assert!(status.success(), "{status}; log:\n{}", node.log());
    assert!(!node.endpoint_ns().exists(), "its namespace removed");
    assert_eq!(node_link(&node, "lxc_health"), None, "its veth removed");
    assert!(record(&node).is_none(), "its record removed");
}

/// An endpoint kept by `--keep-endpoint` that the next run's flags no
/// longer describe (another namespace name, another CIDR) is removed, not
/// left beside the new one.
#[test]
fn a_kept_endpoint_the_flags_no_longer_describe_is_removed() {
    let mut node = AgentNode::new();
    node.start(&["--keep-endpoint"]);
    node.wait_endpoint(READY, |_| true);
    assert!(node.stop(Signal::SIGTERM).success());
    let first = node.endpoint_ns();
    let first_made = proven_now(&node);
    assert!(first.exists() && first_made.1.is_some(), "kept");

    // A change the agent refuses (no free address in the new CIDR) leaves
    // the kept endpoint as it was.
    let out = node.run_to_exit("198.18.0.8/30", &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no free address in 198.18.0.8/30"), "{err}");
    assert_eq!(proven_now(&node), first_made, "refused: nothing removed");

    // Another namespace name: the kept one goes, with its veth.
    let first_name = std::mem::replace(&mut node.endpoint_netns, health_tests::names::unique("ep"));
    // The node no longer removes the first namespace: this does, if the
    // agent does not.
    let _first = health_tests::netns_guard::NetnsGuard::named(&first_name);
    node.start(&["--keep-endpoint"]);
    let ep = node.wait_endpoint(READY, |_| true);
    assert!(
        !first.exists(),
        "{first_name} removed; log:\n{}",
        node.log()
    );
    let second = proven_now(&node);
    assert!(second.0.is_some() && second.1 != first_made.1, "{second:?}");
    assert_eq!(
        ep.ipv4.map(|a| a.to_string().starts_with("198.18.64.")),
        Some(true),
        "{ep:?}"
    );
    assert!(node.stop(Signal::SIGTERM).success());

    // Another CIDR: the namespace is made anew, holding only the new address.
    node.start_from("198.18.66.0/24", &[], |_| {});
    let ep = node.wait_endpoint(READY, |_| true);
    let ip = ep.ipv4.expect("an address");
    assert!(ip.to_string().starts_with("198.18.66."), "{ip}");
    assert_ne!(netns_identity(&node), second.0, "made anew");
    let addresses = in_netns(Some(&node.endpoint_ns()), |nl| async move {
        nl.addresses::<std::net::Ipv4Addr>().await
    })
    .expect("netlink");
    let held: Vec<String> = addresses
        .iter()
        .map(|(_, a, _)| a.to_string())
        .filter(|a| a.starts_with("198.18."))
        .collect();
    assert_eq!(held, [ip.to_string()], "the old address is gone");
    assert!(node.stop(Signal::SIGTERM).success());
    assert!(!node.endpoint_ns().exists(), "nothing left");
}

/// Two agents given one pin directory under pidfiles of their own: the
/// second is refused, naming the flag, and the first's pins and endpoint
/// are left as they were.
#[test]
fn a_second_agent_on_the_same_pins_is_refused_and_takes_nothing() {
    let mut first = AgentNode::new();
    first.start(&[]);
    let ep = first.wait_endpoint(READY, |_| true);
    let pins = || {
        let mut names: Vec<String> = std::fs::read_dir(&first.pins)
            .expect("pins")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    let before = pins();
    assert!(before.len() > 1, "{before:?}");
    let mut second = AgentNode::new();
    second.pins.clone_from(&first.pins);
    let out = second.run_to_exit(HEALTH_CIDR, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the second agent started:\n{err}");
    assert!(
        err.contains(&format!(
            "another health-agent holds {} (--bpffs-dir)",
            first.pins.display()
        )),
        "{err}"
    );
    assert_eq!(pins(), before, "the first's pins are left");
    assert!(!second.endpoint_ns().exists(), "the second made nothing");
    let still = first.wait_endpoint(READY, |_| true);
    assert_eq!((still.id, still.ipv4), (ep.id, ep.ipv4));
}

/// An agent upgraded over an endpoint kept by an earlier version, whose
/// record proves nothing: the endpoint whose interface holds the recorded
/// address and is paired with `lxc_health` is adopted, and its proof is
/// recorded at once. Without that address, the namespace is refused.
#[test]
fn a_record_of_an_earlier_version_adopts_only_the_endpoint_its_address_proves() {
    let mut node = AgentNode::new();
    node.start(&["--keep-endpoint"]);
    node.wait_endpoint(READY, |_| true);
    assert!(node.stop(Signal::SIGTERM).success());
    let made = proven_now(&node);
    let earlier = EndpointRecord {
        owned: None,
        boot: None,
        ..record(&node).expect("kept")
    };
    earlier.save(&state_dir(&node)).expect("an earlier record");
    let text = std::fs::read_to_string(state_dir(&node).join("endpoint.json")).expect("read");
    assert!(!text.contains("owned") && !text.contains("boot"), "{text}");

    node.start(&["--keep-endpoint"]);
    node.wait_endpoint(READY, |_| true);
    assert_eq!(proven_now(&node), made, "adopted, not recreated");
    assert_eq!(
        record(&node).and_then(|r| r.owned).map(|o| recorded(&o)),
        Some(made),
        "the proof is recorded"
    );
    assert!(node.stop(Signal::SIGTERM).success());

    // The same earlier record naming an address the interface does not hold.
    let mut elsewhere = earlier;
    elsewhere.ipv4 = Some(std::net::Ipv4Addr::new(198, 18, 64, 200));
    elsewhere
        .save(&state_dir(&node))
        .expect("an earlier record");
    assert_refused(
        &node,
        &[
            "was not made by this agent",
            "198.18.64.200",
            "earlier version",
        ],
    );
    assert_eq!(proven_now(&node), made, "left as it was");
}

/// A reboot takes the endpoint with it, and the kernel hands its numbers
/// out again: a record proving objects in another boot proves nothing,
/// even where the same indexes and inode are found under its names, and
/// what is there is refused and left. A record naming no boot is dated
/// by its file.
#[test]
fn a_record_of_an_earlier_boot_proves_nothing() {
    let mut node = AgentNode::new();
    node.start(&["--keep-endpoint"]);
    node.wait_endpoint(READY, |_| true);
    assert!(node.stop(Signal::SIGTERM).success());
    let made = proven_now(&node);
    let kept = record(&node).expect("kept");
    let this_boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").expect("boot id");
    assert_eq!(
        kept.boot.as_deref(),
        Some(this_boot.trim()),
        "the record names its boot"
    );

    // The same proofs, as if made in an earlier boot that numbered the
    // objects alike.
    EndpointRecord {
        boot: Some("00000000-0000-4000-8000-000000000000".into()),
        ..kept.clone()
    }
    .save(&state_dir(&node))
    .expect("a record of another boot");
    assert_refused(
        &node,
        &["was not made by this agent", "from an earlier boot"],
    );
    assert_eq!(proven_now(&node), made, "left as it was");

    // Naming no boot, written before this boot began.
    let unnamed = EndpointRecord {
        boot: None,
        ..kept.clone()
    };
    unnamed
        .save(&state_dir(&node))
        .expect("a record naming no boot");
    let uptime = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).expect("uptime");
    let before_boot =
        std::time::SystemTime::now() - Duration::from(uptime) - Duration::from_secs(60);
    std::fs::File::options()
        .write(true)
        .open(state_dir(&node).join("endpoint.json"))
        .and_then(|f| f.set_modified(before_boot))
        .expect("dated before this boot");
    assert_refused(&node, &["was not made by this agent"]);
    assert_eq!(proven_now(&node), made, "left as it was");

    // Written in this boot, it proves them: adopted, and removed on stop.
    unnamed
        .save(&state_dir(&node))
        .expect("a record naming no boot");
    node.start(&[]);
    let restored = node.wait_endpoint(READY, |_| true);
    assert_eq!(
        restored.history.first().map(|t| t.to.as_str()),
        Some("restoring"),
        "its own objects adopted"
    );
    assert_eq!(proven_now(&node), made, "reused, not recreated");
    assert!(node.stop(Signal::SIGTERM).success());
    assert!(!node.endpoint_ns().exists(), "its namespace removed");
    assert_eq!(node_link(&node, "lxc_health"), None, "its veth removed");

    // After a reboot only someone else's lxc_health is there, numbered as
    // the record's: refused, and left.
    let index = foreign_lxc_health(&node);
    EndpointRecord {
        owned: Some(Owned {
            host: Some(LinkProof {
                name: "lxc_health".into(),
                ifindex: index,
            }),
            ..Owned::default()
        }),
        boot: Some("00000000-0000-4000-8000-000000000000".into()),
        ..kept
    }
    .save(&state_dir(&node))
    .expect("a record of another boot");
    assert_refused(
        &node,
        &[
            "interface \"lxc_health\" in the node's namespace was not made by this agent",
            &format!("found index {index}"),
            "from an earlier boot",
        ],
    );
    assert_foreign_lxc_health_left(&node, index);
}

/// While the agent runs, its `lxc_health` is replaced by someone else's:
/// the controller does not repair over it (it names it instead), and a
/// clean stop removes the agent's namespace but leaves the stranger's
/// interface.
#[test]
fn a_foreign_lxc_health_made_while_the_agent_runs_is_neither_used_nor_removed() {
    let mut node = AgentNode::new();
    // The controller runs on link events (once they settle) and on its
    // interval, here too long to come between the two steps below.
    node.start(&[]);
    node.wait_endpoint(READY, |_| true);
    // The controller repairs a missing `lxc_health` 100 ms after the
    // event; on a loaded machine it can win the race between the delete
    // and the add, so the swap is tried again until the stranger's is in.
    let mut attempts = 0;
    while let Err(e) = in_netns(Some(&node.node), |nl| async move {
        let _ = nl.delete_link("lxc_health").await;
        nl.add_veth("lxc_health", "theirs-peer", None).await
    }) {
        attempts += 1;
        assert!(attempts < 20, "replace lxc_health: {e}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let theirs = node_link(&node, "lxc_health").expect("there");
    wait_named_foreign(&node);
    let log = node.log();
    assert!(
        log.contains("interface \"lxc_health\" in the node's namespace")
            && log.contains(&format!("found index {theirs}")),
        "{log}"
    );
    assert_eq!(node_link(&node, "lxc_health"), Some(theirs), "not replaced");

    let status = node.stop(Signal::SIGTERM);
    assert!(status.success(), "{status}; log:\n{}", node.log());
    assert!(!node.endpoint_ns().exists(), "its own namespace removed");
    assert_eq!(
        node_link(&node, "lxc_health"),
        Some(theirs),
        "the stranger's interface is left"
    );
    assert!(node.log().contains("not removed"), "{}", node.log());
}

/// While the agent runs, its namespace is replaced by someone else's under
/// the same name: the controller names it, and the hello server, which
/// follows the endpoint into a namespace the agent made anew, never
/// listens in it.
#[test]
fn a_namespace_put_at_the_endpoints_name_while_it_runs_is_not_served_in() {
    let mut node = AgentNode::new();
    node.start(&[]);
    node.wait_endpoint(READY, |_| true);
    assert!(node.hello_listening(), "in its own namespace");
    // The controller makes a deleted namespace anew 100 ms after the
    // link event: the swap is tried again until the stranger's is in.
    let mut attempts = 0;
    let _theirs = loop {
        let _ = node.endpoint_ns().delete();
        match Netns::create(&node.endpoint_netns) {
            Ok(ns) => break ns,
            Err(e) => {
                attempts += 1;
                assert!(attempts < 20, "replace the namespace: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    wait_named_foreign(&node);
    // Past the controller's runs after the swap.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!node.hello_listening(), "{}", node.log());
    assert!(node.stop(Signal::SIGTERM).success(), "{}", node.log());
}

/// Inside the agent's own kept namespace, its `eth0` was replaced by
/// someone else's: the agent refuses to start, naming it, and leaves it.
#[test]
fn a_foreign_eth0_in_the_agents_own_namespace_is_refused_and_left() {
    let mut node = AgentNode::new();
    node.start(&["--keep-endpoint"]);
    node.wait_endpoint(READY, |_| true);
    assert!(node.stop(Signal::SIGTERM).success());
    let ours = endpoint_link(&node).expect("kept");
    in_netns(Some(&node.endpoint_ns()), |nl| async move {
        nl.delete_link("eth0").await?;
        nl.add_bridge("eth0").await
    })
    .expect("replace eth0");
    let theirs = endpoint_link(&node).expect("there");
    assert_ne!(ours, theirs);
    assert_refused(
        &node,
        &[
            &format!(
                "interface \"eth0\" in network namespace {:?} was not made by this agent",
                node.endpoint_netns
            ),
            &format!("expected \"eth0\" with index {ours}"),
            &format!("found index {theirs}"),
            "--endpoint-iface",
        ],
    );
    assert_eq!(endpoint_link(&node), Some(theirs), "left as it was");
}

/// A repair that finds the veth's host end but not the endpoint's removes
/// the host end only when it is the one the agent's ownership names: one
/// put in its place since (the race between judging and repairing) is
/// left, and named.
#[test]
fn a_repair_never_removes_a_host_interface_it_cannot_prove() {
    // `a` plays the node, `b` the endpoint's namespace (their own veth
    // between them is no part of it).
    let nodes = TwoNodes::new();
    let (node, ep) = (&nodes.a, &nodes.b);
    let plan = Plan {
        netns: ep.clone(),
        netns_name: ep
            .path()
            .file_name()
            .and_then(|n| n.to_str())
            .expect("a named namespace")
            .to_owned(),
        host_iface: "lxc_t".into(),
        ep_iface: "eth0".into(),
        v4: Some(V4 {
            addr: std::net::Ipv4Addr::new(198, 18, 64, 2),
            cidr: "198.18.64.0/24".parse().expect("cidr"),
        }),
        v6: None,
    };
    node.run(|| plumbing::ensure(&plan))
        .expect("enter node")
        .expect("plumbing");
    let link = |ns: &Netns, name: &'static str| {
        in_netns(Some(ns), |nl| async move { nl.link_index(name).await }).expect("netlink")
    };
    let mine = link(node, "lxc_t").expect("made");
    // Someone replaces the host end (the endpoint's end goes with it).
    in_netns(Some(node), |nl| async move {
        nl.delete_link("lxc_t").await?;
        nl.add_veth("lxc_t", "theirs-peer", None).await
    })
    .expect("replace lxc_t");
    let theirs = link(node, "lxc_t").expect("theirs");
    let err = node
        .run(|| plumbing::ensure_with(&plan, Some(mine), |_| Ok::<_, PlumbingError>(())))
        .expect("enter node")
        .expect_err("not the agent's to remove");
    assert!(
        matches!(err, PlumbingError::NotMine { index, .. } if index == theirs),
        "{err:?}"
    );
    assert!(err.to_string().contains("\"lxc_t\""), "{err}");
    assert_eq!(link(node, "lxc_t"), Some(theirs), "left as it was");
    assert_eq!(link(ep, "eth0"), None, "nothing made in its place");
}
