//! The health endpoint owned by a real `health-agent daemon` running as the
//! agent of a namespace that plays its node.

use std::{net::Ipv4Addr, time::Duration};

use health_agent::endpoint::EndpointView;
use health_agent::{
    datapath::read_pinned_stats,
    sys::netlink::{RouteWrite, in_netns},
    util::cidr::Cidr as _,
};
use health_tests::agent::{AgentNode, HEALTH_CIDR};
use nix::sys::signal::Signal;

const READY: Duration = Duration::from_secs(10);

fn ipv4(ep: &EndpointView) -> Ipv4Addr {
    ep.ipv4.expect("an IPv4 endpoint")
}

fn states(ep: &EndpointView) -> Vec<&'static str> {
    ep.history.iter().map(|t| t.to.as_str()).collect()
}

/// `get` of the only endpoint, through the CLI's JSON (which must decode
/// as the API's own type).
fn get(node: &AgentNode) -> EndpointView {
    let out = node.cli(&["endpoint", "get", "-o", "json"]);
    assert!(
        out.status.success(),
        "endpoint get: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// Echo from the node to the endpoint, with the endpoint's kernel echo off:
/// every reply must come from the eBPF responder.
#[test]
fn daemon_brings_the_endpoint_to_ready_and_the_responder_answers() {
    let mut node = AgentNode::new();
    node.start(&[]);
    let ep = node.wait_endpoint(READY, |_| true);
    assert_eq!(ep.identity, 4);
    assert_eq!(ep.labels, ["reserved:health"]);
    assert_eq!(ep.interface, "lxc_health");
    let ip = ipv4(&ep);
    assert!(
        health_agent::util::cidr::parse::<ipnet::Ipv4Net>(HEALTH_CIDR)
            .expect("cidr")
            .is_usable(ip),
        "{ip}"
    );
    let id = ep.id;
    assert!((1..=4095).contains(&id), "{id}");
    assert_api_threads_yield_to_probing(&node);
    assert_eq!(
        states(&get(&node)),
        [
            "waiting-for-identity",
            "waiting-to-regenerate",
            "regenerating",
            "ready"
        ]
    );
    assert!(node.node_has_route_to(ip), "host route to the endpoint");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(node.socket())
            .expect("socket")
            .permissions(),
    );
    assert_eq!(mode & 0o777, 0o660, "API socket mode");
    node.assert_echo_answered_in_kernel(ip, 0x5e01, 5);

    // The table form names the same endpoint.
    let table = node.cli(&["endpoint", "list"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("reserved:health")
            && text.contains(&ip.to_string())
            && text.contains("ready"),
        "{text}"
    );
    // Bad requests: a clear error, non-zero exit.
    let unknown = node.cli(&["endpoint", "get", "4096"]);
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("endpoint 4096 not found"));
    let bad = node.cli(&["endpoint", "get", "abc"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("abc"));
}

#[test]
fn deleted_lxc_health_is_recreated_within_one_controller_interval() {
    let mut node = AgentNode::new();
    node.start(&["--controller-interval", "1s"]);
    let ep = node.wait_endpoint(READY, |_| true);
    let (ip, id) = (ipv4(&ep), ep.id);
    in_netns(Some(&node.node), |nl| async move {
        nl.delete_link("lxc_health").await
    })
    .expect("delete lxc_health");
    // One interval (1 s) plus the repair itself.
    let repaired = node.wait_endpoint(Duration::from_millis(2500), |e| e.repairs >= 1);
    assert_eq!(ipv4(&repaired), ip, "same IP after the repair");
    assert_eq!(repaired.id, id, "same endpoint ID");
    assert!(node.node_has_link("lxc_health"));
    let history = states(&get(&node));
    assert!(
        history.ends_with(&["waiting-to-regenerate", "regenerating", "ready"]),
        "{history:?}"
    );
    node.assert_echo_answered_in_kernel(ip, 0x5e01, 3);
}

/// The endpoint's namespace deleted under a running agent while someone
/// else routes its address: the repair makes the namespace anew, then
/// fails at the route (never made over theirs); the hello server listens
/// in the new namespace all the same, and once their route is gone the
/// endpoint is whole and answered again (before, a repair that failed
/// after making the namespace left the server in the old one for good).
#[test]
fn a_deleted_endpoint_namespace_is_made_anew_and_its_hello_server_follows() {
    const STATIC: u8 = 4;
    let mut node = AgentNode::new();
    node.start(&["--controller-interval", "1s", "--node-name", "repaired-7"]);
    let ip = ipv4(&node.wait_endpoint(READY, |_| true));
    let hello = std::net::SocketAddr::from((ip, 4240));
    let answered = |node: &AgentNode| {
        health_tests::prometheus::http_get(&node.node, hello, "/hello").map(|(code, _)| code)
    };
    assert_eq!(answered(&node), Some(200));
    in_netns(Some(&node.node), move |nl| async move {
        nl.write_route_owned(
            ip,
            32,
            Ipv4Addr::new(198, 18, 0, 30),
            (STATIC, RouteWrite::Replace),
        )
        .await
    })
    .expect("someone else's route to the endpoint");
    node.endpoint_ns()
        .delete()
        .expect("someone deletes the namespace");
    let refused = "never over a route to it that exists";
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !(node.log().contains(refused) && node.endpoint_ns().exists() && node.hello_listening()) {
        assert!(std::time::Instant::now() < deadline, "{}", node.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    in_netns(Some(&node.node), move |nl| async move {
        nl.delete_route_owned(ip, 32, STATIC).await
    })
    .expect("their route gone");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while answered(&node) != Some(200) {
        assert!(std::time::Instant::now() < deadline, "{}", node.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    // Bound again, it still names the node.
    let head = hello_head(&node.node, hello);
    assert!(
        head.lines().any(|l| l == "X-Health-Node: repaired-7"),
        "{head}"
    );
    assert!(node.stop(Signal::SIGTERM).success());
}

#[test]
fn kill_9_then_a_new_daemon_restores_ip_id_and_counters() {
    let mut node = AgentNode::new();
    node.start(&[]);
    let ep = node.wait_endpoint(READY, |_| true);
    let (ip, id) = (ipv4(&ep), ep.id);
    node.assert_echo_answered_in_kernel(ip, 0x5e01, 4);
    let answered = read_pinned_stats(&node.pins).expect("stats").answered;
    node.stop(Signal::SIGKILL);
    assert!(
        node.pidfile().exists() && node.socket().exists(),
        "kill -9 leaves pidfile and socket"
    );

    node.start(&[]);
    let restored = node.wait_endpoint(READY, |_| true);
    assert_eq!(ipv4(&restored), ip);
    assert_eq!(restored.id, id);
    assert_eq!(states(&get(&node)), ["restoring", "regenerating", "ready"]);
    let now = read_pinned_stats(&node.pins).expect("stats").answered;
    assert!(
        now >= answered,
        "pinned counters were reset: {answered} -> {now}"
    );
    node.assert_echo_answered_in_kernel(ip, 0x5e01, 2);
    // The node's own forwarding (off), recorded by the agent killed, is
    // what the next one writes back; not the 1 it found.
    assert_eq!(ip_forward(&node), "1");
    assert!(node.stop(Signal::SIGTERM).success());
    assert_eq!(ip_forward(&node), "0");
}

/// The node namespace's `net.ipv4.ip_forward`.
fn ip_forward(node: &AgentNode) -> String {
    node.node
        .run(|| std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward"))
        .expect("node namespace")
        .expect("ip_forward")
        .trim()
        .to_owned()
}

/// The API's threads (named `api` and `api-bulk`) run at nice 5, every
/// other thread of the agent at 0: under load, probing gets the CPU first.
fn assert_api_threads_yield_to_probing(node: &AgentNode) {
    let pid = std::fs::read_to_string(node.pidfile()).expect("pidfile");
    let tasks = std::path::Path::new("/proc").join(pid.trim()).join("task");
    let mut niceness: Vec<(String, i64)> = std::fs::read_dir(&tasks)
        .expect("threads")
        .filter_map(Result::ok)
        .filter_map(|t| {
            let comm = std::fs::read_to_string(t.path().join("comm")).ok()?;
            let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
            // Fields after the parenthesised name: state is field 3, nice 19.
            let rest = &stat[stat.rfind(')')? + 2..];
            let nice = rest.split(' ').nth(16)?.parse().ok()?;
            Some((comm.trim().to_owned(), nice))
        })
        .collect();
    niceness.sort();
    let api: Vec<i64> = niceness
        .iter()
        .filter(|(c, _)| c.starts_with("api"))
        .map(|(_, n)| *n)
        .collect();
    assert!(
        ["api", "api-bulk"]
            .iter()
            .all(|name| niceness.iter().any(|(c, _)| c == name)),
        "both lanes' threads: {niceness:?}"
    );
    assert!(api.iter().all(|n| *n == 5), "{niceness:?}");
    assert!(
        niceness
            .iter()
            .any(|(c, n)| !c.starts_with("api") && *n == 0),
        "{niceness:?}"
    );
}

fn assert_nothing_left(node: &AgentNode, ip: Option<Ipv4Addr>) {
    assert!(
        !node.endpoint_ns().exists(),
        "endpoint namespace left behind"
    );
    assert!(!node.node_has_link("lxc_health"), "lxc_health left behind");
    if let Some(ip) = ip {
        assert!(!node.node_has_route_to(ip), "route to {ip} left behind");
    }
    assert!(
        !node.pins.exists(),
        "pins left behind at {}",
        node.pins.display()
    );
    assert!(!node.socket().exists(), "socket left behind");
    assert!(!node.pidfile().exists(), "pidfile left behind");
}

#[test]
fn exhausted_and_malformed_cidrs_fail_clearly_and_create_nothing() {
    let node = AgentNode::new();
    // 198.18.0.8/30: .8 network, .9 router, .11 broadcast, and .10 is the
    // node's own address: nothing left.
    let out = node.run_to_exit("198.18.0.8/30", &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("no free address in 198.18.0.8/30"), "{err}");
    assert_nothing_left(&node, None);

    let out = node.run_to_exit("198.18.64.0/33", &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--health-cidr") && err.contains("198.18.64.0/33"),
        "{err}"
    );
    assert_nothing_left(&node, None);
}

#[test]
fn bad_masquerade_settings_fail_clearly_and_create_nothing() {
    let node = AgentNode::new();
    let m = ["--routing", "masquerade"];
    let cases: [(&[&str], &[&str]); 5] = [
        // No node IP: not given, and no nodes file to find it in.
        (&[], &["--node-ip"]),
        // Nothing on this node holds the address.
        (&["--node-ip", "198.18.0.99"], &["198.18.0.99", "--uplink"]),
        (
            &["--node-ip", "198.18.0.10", "--uplink", "nope0"],
            &["nope0"],
        ),
        // The node's own ports (32768-60999 by default) would collide.
        (
            &[
                "--node-ip",
                "198.18.0.10",
                "--nat-port-range",
                "40000-50000",
            ],
            &["40000-50000", "ip_local_port_range", "--nat-port-range"],
        ),
        (
            &[
                "--node-ip",
                "198.18.0.10",
                "--health-range",
                "198.18.100.0/24",
            ],
            &["198.18.100.0/24", "--health-range"],
        ),
    ];
    for (extra, needles) in cases {
        let args: Vec<&str> = m.iter().chain(extra).copied().collect();
        let out = node.run_to_exit("198.18.64.0/24", &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        for n in needles {
            assert!(err.contains(n), "{args:?}: {n:?} not in {err}");
        }
        assert_nothing_left(&node, None);
    }
    let out = node.run_to_exit("198.18.64.0/24", &["--nat-port-range", "9-1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--nat-port-range") && err.contains("MIN is above MAX"),
        "{err}"
    );
}

#[test]
fn sigterm_leaves_nothing_behind() {
    let mut node = AgentNode::new();
    node.start(&[]);
    let ip = ipv4(&node.wait_endpoint(READY, |_| true));
    let status = node.stop(Signal::SIGTERM);
    assert!(status.success(), "{status}; log:\n{}", node.log());
    assert_nothing_left(&node, Some(ip));
    assert!(node.log().contains("disconnected"), "{}", node.log());
}

#[test]
fn keep_endpoint_survives_sigterm_and_is_restored() {
    let mut node = AgentNode::new();
    node.start(&["--keep-endpoint"]);
    let ep = node.wait_endpoint(READY, |_| true);
    assert_eq!(ip_forward(&node), "1");
    assert!(node.stop(Signal::SIGTERM).success());
    assert!(
        node.endpoint_ns().exists() && node.node_has_link("lxc_health"),
        "endpoint kept"
    );
    // The kept endpoint is still routed through the node.
    assert_eq!(ip_forward(&node), "1", "forwarding kept with it");
    assert!(!node.socket().exists() && !node.pidfile().exists());
    node.start(&[]);
    let restored = node.wait_endpoint(READY, |_| true);
    assert_eq!((ipv4(&restored), restored.id), (ipv4(&ep), ep.id));
    assert_eq!(states(&get(&node))[0], "restoring");
    // Not kept this time: the node's own value (off), recorded by the
    // first run, comes back.
    assert!(node.stop(Signal::SIGTERM).success());
    assert_eq!(ip_forward(&node), "0");
}

/// A supervised task that fails for real: masquerade's uplink is deleted
/// under a running agent. The datapath task cannot attach again, so it
/// fails, `/v1/healthz` names it as degraded while it is restarted with
/// backoff, and past the restart budget the agent exits non-zero, naming
/// the task, after removing everything it made.
#[test]
fn a_failing_task_is_shown_degraded_restarted_then_the_agent_exits_non_zero() {
    let mut node = AgentNode::new();
    node.start(&[
        "--routing",
        "masquerade",
        "--node-ip",
        "198.18.0.10",
        "--ct-gc-interval",
        "1s",
    ]);
    let ip = ipv4(&node.wait_endpoint(READY, |_| true));
    let healthz = || health_tests::api::call(&node.socket(), |c| async move { c.healthz().await });
    assert_eq!(healthz().expect("healthz").state, "ok");
    in_netns(Some(&node.node), |nl| async move {
        nl.delete_link("uplink").await
    })
    .expect("delete");

    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let degraded = loop {
        if let Ok(h) = healthz()
            && h.state.starts_with("degraded")
        {
            break h;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never degraded; log:\n{}",
            node.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(degraded.state, "degraded: datapath", "{degraded:?}");
    let task = degraded
        .tasks
        .iter()
        .find(|t| t.name == "datapath")
        .expect("datapath task listed");
    assert!(task.degraded, "{task:?}");
    let why = task.last_error.as_deref().unwrap_or_default();
    assert!(why.contains("uplink"), "the error names the uplink: {why}");
    let others_fine = degraded
        .tasks
        .iter()
        .filter(|t| t.name != "datapath")
        .all(|t| !t.degraded);
    assert!(others_fine, "{degraded:?}");

    // Forwarding stays on through the restarts: the agent, not the task,
    // holds it. Once written back at the end, it stays off.
    let mut seen = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while node.pidfile().exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "still running: {seen:?}"
        );
        let now = ip_forward(&node);
        if seen.last() != Some(&now) {
            seen.push(now);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(seen.first().map(String::as_str), Some("1"), "{seen:?}");
    assert!(
        seen.len() <= 2,
        "forwarding turned off while the agent ran: {seen:?}"
    );

    // Restarts keep failing: past the budget the agent stops, non-zero.
    let status = node.wait_exit(Duration::from_secs(30));
    let log = node.log();
    assert!(!status.success(), "{status}; log:\n{log}");
    assert!(
        log.contains("datapath failed and is not restarted (restarted 5 times)"),
        "{log}"
    );
    assert_eq!(
        log.matches("task ended").count(),
        5,
        "five restarts; log:\n{log}"
    );
    assert_nothing_left(&node, Some(ip));
    assert_eq!(ip_forward(&node), "0", "written back");
}

/// An upgrade that changes maps: a pin of another layout sits at every
/// map's path (a hash map of 16-byte values, as an older agent might have
/// left). The agent replaces each, says so, reaches ready and counts again.
#[test]
fn incompatible_pins_at_every_map_path_are_replaced_and_the_agent_counts_again() {
    use aya::maps::{HashMap, MapData};
    use health_common::maps::{MapId, PIN_LAYOUT_VERSION};

    let mut node = AgentNode::new();
    health_agent::datapath::ensure_pin_dir(&node.pins).expect("pin dir");
    for id in MapId::ALL {
        HashMap::<MapData, [u8; 4], [u8; 16]>::create(16, 0)
            .expect("a standalone hash map")
            .pin(node.pins.join(id.name()))
            .expect("pin it where the agent's map goes");
    }
    node.start(&[]);
    let ip = ipv4(&node.wait_endpoint(READY, |_| true));
    let log = node.log();
    // aya-log's ring buffer is the object's only map that is not pinned.
    for id in MapId::ALL.into_iter().filter(|m| *m != MapId::AyaLogs) {
        assert!(
            log.contains(&format!("map={}", id.name())) && log.contains("replacing it"),
            "{} not reported as replaced; log:\n{log}",
            id.name()
        );
    }
    assert_eq!(
        health_agent::datapath::recorded_layout(&node.pins),
        Some(PIN_LAYOUT_VERSION),
        "the layout version is recorded with the new pins"
    );
    node.assert_echo_answered_in_kernel(ip, 0x5e01, 3);
}

/// Routes carry the agent's protocol number: a route it did not install is
/// never replaced or deleted, a stale route of its own (an earlier run
/// killed with -9) is removed, and a peer whose node IP is not on-link gets
/// no route, with one summarised warning.
#[test]
fn the_agent_touches_only_its_own_routes_and_only_on_link_ones() {
    use health_agent::{membership::routes::ROUTE_PROTOCOL, sys::netlink::RouteV4};

    const STATIC: u8 = 4;
    let ip = |c: u8, d: u8| Ipv4Addr::new(198, 18, c, d);
    let mut node = AgentNode::new();
    in_netns(Some(&node.node), |nl| async move {
        // Someone else's route to a peer's health IP, and a stale one of ours.
        nl.write_route_owned(ip(100, 2), 32, ip(0, 30), (STATIC, RouteWrite::Replace))
            .await?;
        nl.write_route_owned(
            ip(103, 2),
            32,
            ip(0, 22),
            (ROUTE_PROTOCOL, RouteWrite::Replace),
        )
        .await
    })
    .expect("routes before the agent");
    let nodes = node.dir.join("nodes.yaml");
    std::fs::write(
        &nodes,
        "nodes:\n\
         - {name: me, node-ip: 198.18.0.10, health-ip: 198.18.64.2}\n\
         - {name: foreign, node-ip: 198.18.0.20, health-ip: 198.18.100.2}\n\
         - {name: ours, node-ip: 198.18.0.21, health-ip: 198.18.101.2}\n\
         - {name: far, node-ip: 198.18.200.9, health-ip: 198.18.102.2}\n",
    )
    .expect("nodes file");
    let nodes = nodes.to_str().expect("utf-8").to_owned();
    node.start(&[
        "--node-name",
        "me",
        "--nodes-file",
        &nodes,
        "--health-range",
        "198.18.64.0/18",
    ]);
    node.wait_endpoint(READY, |_| true);
    let node_ns = node.node.clone();
    let routes = || -> Vec<RouteV4> {
        in_netns(
            Some(&node_ns),
            |nl| async move { nl.routes::<Ipv4Addr>().await },
        )
        .expect("routes")
        .into_iter()
        .filter(|r| r.prefix == 32)
        .collect()
    };
    let to = |rs: &[RouteV4], dst: Ipv4Addr| rs.iter().find(|r| r.destination == dst).copied();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let rs = loop {
        let rs = routes();
        if to(&rs, ip(101, 2)).is_some() && to(&rs, ip(103, 2)).is_none() {
            break rs;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{rs:?}; log:\n{}",
            node.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let ours = to(&rs, ip(101, 2)).expect("our route");
    assert_eq!(
        (ours.gateway, ours.protocol),
        (Some(ip(0, 21)), ROUTE_PROTOCOL)
    );
    let foreign = to(&rs, ip(100, 2)).expect("the foreign route survives");
    assert_eq!(
        (foreign.gateway, foreign.protocol),
        (Some(ip(0, 30)), STATIC)
    );
    assert!(
        to(&rs, ip(102, 2)).is_none(),
        "no route via an off-link node IP"
    );
    // The warning is logged once the routes are in place: wait for it.
    let log = loop {
        let log = node.log();
        if log.contains("not on-link") || std::time::Instant::now() >= deadline {
            break log;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(
        log.matches("not on-link").count(),
        1,
        "one summarised warning:\n{log}"
    );
    assert_eq!(log.matches("did not install").count(), 1, "{log}");

    assert!(node.stop(Signal::SIGTERM).success());
    let rs = routes();
    assert!(to(&rs, ip(101, 2)).is_none(), "ours removed on shutdown");
    assert_eq!(
        to(&rs, ip(100, 2)).map(|r| r.gateway),
        Some(Some(ip(0, 30))),
        "the foreign route is still there"
    );
}

/// A host route someone else made to an address of the pool is never
/// replaced: an address so routed is not given to the endpoint (the last
/// run's included), and when the endpoint's own route is replaced by
/// someone else's, the repair fails naming it and leaves it there; both
/// outlive the agent.
#[test]
fn routes_someone_else_made_to_the_pools_addresses_are_left_as_they_are() {
    use health_agent::sys::netlink::RouteV4;

    const STATIC: u8 = 4;
    let gateway = Ipv4Addr::new(198, 18, 0, 30);
    let mut node = AgentNode::new();
    node.start(&["--controller-interval", "1s"]);
    let first = ipv4(&node.wait_endpoint(READY, |_| true));
    assert!(node.stop(Signal::SIGTERM).success());
    let route_to = |nl_ns: &health_agent::sys::netns::Netns, dst: Ipv4Addr| -> Option<RouteV4> {
        in_netns(
            Some(nl_ns),
            |nl| async move { nl.routes::<Ipv4Addr>().await },
        )
        .expect("routes")
        .into_iter()
        .find(|r| r.destination == dst && r.prefix == 32)
    };
    let theirs =
        |r: Option<RouteV4>| r.is_some_and(|r| r.gateway == Some(gateway) && r.protocol == STATIC);
    in_netns(Some(&node.node), move |nl| async move {
        nl.write_route_owned(first, 32, gateway, (STATIC, RouteWrite::Replace))
            .await
    })
    .expect("someone else's route to the last run's address");
    node.start(&["--controller-interval", "1s"]);
    let second = ipv4(&node.wait_endpoint(READY, |_| true));
    assert_ne!(
        second, first,
        "an address routed elsewhere is not given out"
    );
    assert!(theirs(route_to(&node.node, first)));

    // The endpoint's own route replaced by someone else's: not taken back.
    in_netns(Some(&node.node), move |nl| async move {
        nl.write_route_owned(second, 32, gateway, (STATIC, RouteWrite::Replace))
            .await
    })
    .expect("someone else's route to the endpoint's address");
    let refused = "never over a route to it that exists";
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !node.log().contains(refused) {
        assert!(std::time::Instant::now() < deadline, "{}", node.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(theirs(route_to(&node.node, second)), "{}", node.log());
    assert!(node.stop(Signal::SIGTERM).success());
    assert!(theirs(route_to(&node.node, first)));
    assert!(theirs(route_to(&node.node, second)));
}

/// SIGTERM at several moments of the start-up: whatever was made by then is
/// removed, and once the agent is under way (signals are caught before it
/// creates anything) it exits cleanly rather than dying of the signal.
#[test]
fn sigterm_at_any_moment_of_start_up_leaves_nothing() {
    for after_ms in [50u64, 100, 200, 400, 800] {
        let mut node = AgentNode::new();
        node.start(&["--controller-interval", "1s"]);
        std::thread::sleep(Duration::from_millis(after_ms));
        let status = node.stop(Signal::SIGTERM);
        assert!(
            status.success(),
            "SIGTERM {after_ms} ms after start: {status}; log:\n{}",
            node.log()
        );
        assert_nothing_left(&node, None);
        assert!(
            !node.node_has_link("lxc_health"),
            "lxc_health left after SIGTERM at {after_ms} ms"
        );
    }
}

/// The answer head of `GET /hello` to `addr` from `ns`, tried for up to
/// 5 s (a server may be binding yet).
fn hello_head(ns: &health_agent::sys::netns::Netns, addr: std::net::SocketAddr) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        if let Some((head, _)) = health_tests::prometheus::http_exchange(ns, addr, "/hello") {
            return head;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "GET http://{addr}/hello: no answer"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Both hello servers, the node's and the endpoint's, name the node in
/// their answers, so that a prober tells an address that leads to
/// another node.
#[test]
fn the_node_and_endpoint_hello_servers_name_the_node() {
    let mut node = AgentNode::new();
    node.start(&["--node-name", "hello-node-7"]);
    let ip = ipv4(&node.wait_endpoint(READY, |_| true));
    for addr in [
        std::net::SocketAddr::from((ip, 4240)),
        std::net::SocketAddr::from((Ipv4Addr::LOCALHOST, 4240)),
    ] {
        let head = hello_head(&node.node, addr);
        assert!(head.starts_with("HTTP/1.1 200 OK"), "{addr}: {head}");
        assert!(
            head.lines().any(|l| l == "X-Health-Node: hello-node-7"),
            "{addr}: {head}"
        );
    }
}

/// `health-agent responder run` on the pins a running daemon holds is
/// refused before it loads anything: it would replace the daemon's maps
/// with its own (of other sizes), unpinning the ones the daemon's
/// programs use.
#[test]
fn a_responder_on_a_running_daemons_pins_is_refused_and_leaves_them() {
    use aya::maps::MapData;
    use health_common::maps::MapId;
    let mut node = AgentNode::new();
    node.start(&[]);
    node.wait_endpoint(READY, |_| true);
    let ids = || {
        [MapId::CtMap, MapId::EchoConfig, MapId::RttStats].map(|id| {
            MapData::from_pin(node.pins.join(id.name()))
                .and_then(|m| m.info())
                .map(|i| i.id())
                .expect("pinned")
        })
    };
    let before = ids();
    let mut cmd = std::process::Command::new(health_tests::agent::agent_binary());
    cmd.args([
        "responder",
        "run",
        "--iface",
        "lo",
        "--address",
        "198.18.0.2",
        "--bpffs-dir",
    ])
    .arg(&node.pins);
    health_tests::process::enter(&mut cmd, &node.node);
    let out = health_tests::process::output_within(&mut cmd, health_tests::process::EXIT_WITHIN);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("another health-agent holds") && stderr.contains("(--bpffs-dir)"),
        "{stderr}"
    );
    assert_eq!(ids(), before, "the daemon's maps still pinned");
    assert!(node.stop(Signal::SIGTERM).success(), "{}", node.log());
}
