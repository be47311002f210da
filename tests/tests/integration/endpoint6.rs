//! The health endpoint over IPv6 and dual stack: a real `health-agent
//! daemon` given `--health-cidr6` alone or with `--health-cidr`, as the
//! agent of a namespace that plays its node.

use std::{
    fs,
    io::{Read as _, Write as _},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream},
    path::Path,
    process::{Child, Command, ExitStatus, Output, Stdio},
    time::Duration,
};

use health_agent::{
    datapath::read_pinned_stats,
    endpoint::EndpointView,
    sys::{netlink::in_netns, netns::Netns},
};
use health_tests::{
    agent::{AgentNode, agent_binary},
    pinger6::{check_reply6, ping6},
    topology::TwoNodes,
};
use nix::sys::signal::Signal;

const READY: Duration = Duration::from_secs(10);
const FORWARDING6: &str = "net/ipv6/conf/all/forwarding";
/// The node's own IPv6 address (on its uplink): the source of its pings.
const NODE_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 0xff, 0, 0, 0, 0x10);

fn ip6(s: &str) -> Ipv6Addr {
    s.parse().expect(s)
}

/// An [`AgentNode`] (node namespace, files, pins, all removed on drop)
/// whose daemon this module starts itself: the fixture's always gets
/// `--health-cidr`, and these agents may have only `--health-cidr6`.
struct Agent6 {
    node: AgentNode,
    daemon: Option<Child>,
}

impl Agent6 {
    fn new() -> Self {
        let node = AgentNode::new();
        in_netns(Some(&node.node), |nl| async move {
            nl.add_address("uplink", NODE_IP6, 64).await
        })
        .expect("the node's IPv6 address");
        Self { node, daemon: None }
    }

    /// `health-agent daemon` as this node's agent with its own files, and
    /// `args` (the CIDR flags among them).
    fn command(&self, args: &[&str]) -> Command {
        let n = &self.node;
        let mut cmd = Command::new(agent_binary());
        cmd.args(["daemon", "--endpoint-netns", &n.endpoint_netns])
            .arg("--state-dir")
            .arg(self.state_dir())
            .arg("--pidfile")
            .arg(n.pidfile())
            .arg("--socket")
            .arg(n.socket())
            .arg("--bpffs-dir")
            .arg(&n.pins)
            .args(health_tests::agent_env_args())
            .args(args)
            .env("RUST_LOG", "info");
        health_tests::process::enter(&mut cmd, &n.node);
        cmd
    }

    fn state_dir(&self) -> std::path::PathBuf {
        self.node.dir.join("state")
    }

    fn start(&mut self, args: &[&str]) {
        let log = fs::File::create(self.node.dir.join("daemon.log")).expect("log file");
        let child = self
            .command(args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn health-agent daemon");
        self.daemon = Some(child);
    }

    fn run_to_exit(&self, args: &[&str]) -> Output {
        health_tests::process::output_within(
            &mut self.command(args),
            health_tests::process::EXIT_WITHIN,
        )
    }

    fn stop(&mut self, signal: Signal) -> ExitStatus {
        let mut child = self.daemon.take().expect("daemon running");
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid"));
        nix::sys::signal::kill(pid, signal).expect("signal the daemon");
        child.wait().expect("wait for the daemon")
    }

    fn ep_ns(&self) -> Netns {
        self.node.endpoint_ns()
    }

    fn log(&self) -> String {
        self.node.log()
    }

    /// `GET /v1/endpoints`' endpoint once ready and `accept` holds.
    fn wait_endpoint(&self, accept: impl Fn(&EndpointView) -> bool) -> EndpointView {
        self.node.wait_endpoint(READY, accept)
    }

    /// `health-agent endpoint get -o json`, decoded as the API's type.
    fn get(&self) -> EndpointView {
        let out = self.node.cli(&["endpoint", "get", "-o", "json"]);
        assert!(
            out.status.success(),
            "endpoint get: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("JSON")
    }

    fn forwarding6(&self) -> String {
        let path = Path::new("/proc/sys").join(FORWARDING6);
        self.node
            .node
            .run(|| fs::read_to_string(&path))
            .expect("enter the node")
            .expect("read forwarding")
            .trim()
            .to_owned()
    }

    /// Whether the node has a route to `addr`/128 out of `lxc_health`.
    fn node_route6_to(&self, addr: Ipv6Addr) -> bool {
        in_netns(Some(&self.node.node), |nl| async move {
            let index = nl.link_index("lxc_health").await?;
            let routes = nl.routes::<Ipv6Addr>().await?;
            Ok(routes
                .iter()
                .any(|r| r.destination == addr && r.prefix == 128 && r.oif == index))
        })
        .expect("netlink")
    }

    /// Whether the node has any route to `addr`/128.
    fn node_has_any_route6_to(&self, addr: Ipv6Addr) -> bool {
        in_netns(Some(&self.node.node), |nl| async move {
            nl.routes::<Ipv6Addr>().await
        })
        .expect("netlink")
        .iter()
        .any(|r| r.destination == addr && r.prefix == 128)
    }

    /// The endpoint's IPv6 addresses on eth0 (with their prefix length),
    /// link-local ones left out.
    fn ep_addresses6(&self) -> Vec<(Ipv6Addr, u8)> {
        in_netns(Some(&self.ep_ns()), |nl| async move {
            let index = nl.require_link("eth0").await?;
            Ok(nl
                .addresses::<Ipv6Addr>()
                .await?
                .into_iter()
                .filter(|(i, a, _)| *i == index && !a.is_unicast_link_local())
                .map(|(_, a, p)| (a, p))
                .collect())
        })
        .expect("netlink")
    }

    /// The endpoint's IPv6 default route's gateway (out of eth0).
    fn ep_default6(&self) -> Option<Ipv6Addr> {
        in_netns(Some(&self.ep_ns()), |nl| async move {
            let index = nl.require_link("eth0").await?;
            Ok(nl
                .routes::<Ipv6Addr>()
                .await?
                .iter()
                .find(|r| r.prefix == 0 && r.oif == Some(index) && r.gateway.is_some())
                .and_then(|r| r.gateway))
        })
        .expect("netlink")
    }

    /// With the endpoint's kernel echo off, `n` pings from the node to
    /// `addr` each get a correct reply, and the eBPF responder counted
    /// them: the replies came from it.
    fn assert_ping6_answered_by_the_responder(&self, addr: Ipv6Addr, id: u16, n: u16) {
        TwoNodes::sysctl(&self.ep_ns(), "net/ipv6/icmp/echo_ignore_all", "1");
        let answered = || read_pinned_stats(&self.node.pins).expect("stats").answered;
        let before = answered();
        let ex = ping6(
            &self.node.node,
            NODE_IP6,
            addr,
            id,
            n,
            Duration::from_secs(1),
        )
        .expect("ping6");
        for e in &ex {
            check_reply6(e, addr, NODE_IP6, id)
                .unwrap_or_else(|err| panic!("{err}; daemon log:\n{}", self.log()));
        }
        let after = answered();
        assert!(
            after >= before + u64::from(n),
            "the responder's answered counter {before} -> {after} after {n} ICMPv6 replies"
        );
    }

    /// `GET /hello` from the node to `addr`:4240 is answered 200.
    fn assert_hello(&self, addr: IpAddr) {
        let to = SocketAddr::new(addr, 4240);
        let reply = self
            .node
            .node
            .run(|| -> std::io::Result<String> {
                let mut s = TcpStream::connect_timeout(&to, Duration::from_secs(2))?;
                s.set_read_timeout(Some(Duration::from_secs(2)))?;
                s.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")?;
                let mut out = String::new();
                s.read_to_string(&mut out)?;
                Ok(out)
            })
            .expect("enter the node")
            .unwrap_or_else(|e| panic!("GET http://{to}/hello: {e}"));
        assert!(reply.starts_with("HTTP/1.1 200"), "{to}: {reply}");
    }

    fn assert_nothing_left(&self, addr6: Option<Ipv6Addr>) {
        assert!(!self.ep_ns().exists(), "endpoint namespace left behind");
        assert!(
            !self.node.node_has_link("lxc_health"),
            "lxc_health left behind"
        );
        if let Some(a) = addr6 {
            assert!(!self.node_has_any_route6_to(a), "route to {a} left behind");
        }
        assert!(!self.node.socket().exists(), "socket left behind");
        assert!(!self.node.pidfile().exists(), "pidfile left behind");
    }
}

impl Drop for Agent6 {
    fn drop(&mut self) {
        if let Some(mut child) = self.daemon.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// `--health-cidr6` alone: an IPv6-only endpoint with its address, routes
/// and the node's IPv6 forwarding; the responder answers `ICMPv6` echo, the
/// endpoint's hello server answers over IPv6, and SIGTERM removes it all
/// and restores the forwarding sysctl.
#[test]
fn ipv6_only_endpoint_is_plumbed_answered_and_removed_with_forwarding_restored() {
    let mut a = Agent6::new();
    assert_eq!(a.forwarding6(), "0", "a new namespace does not forward");
    a.start(&["--health-cidr6", "2001:2:0:1::/64"]);
    let ep = a.wait_endpoint(|_| true);
    let addr = ip6("2001:2:0:1::2");
    assert_eq!(
        (ep.ipv4, ep.ipv6),
        (None, Some(addr)),
        "the first usable address, no IPv4"
    );
    assert_eq!(a.get().ipv6, Some(addr), "endpoint get -o json");
    assert_eq!(a.ep_addresses6(), [(addr, 128)]);
    assert_eq!(a.ep_default6(), Some(ip6("2001:2:0:1::1")), "default route");
    assert!(
        a.node_route6_to(addr),
        "node route to {addr} via lxc_health"
    );
    assert_eq!(a.forwarding6(), "1", "IPv6 forwarding while the agent runs");
    let v4 = in_netns(Some(&a.ep_ns()), |nl| async move {
        nl.addresses::<Ipv4Addr>().await
    })
    .expect("netlink");
    assert!(
        v4.iter().all(|(_, ip, _)| ip.is_loopback()),
        "no IPv4 address in an IPv6-only endpoint: {v4:?}"
    );
    let record = fs::read_to_string(a.state_dir().join("endpoint.json")).expect("record");
    assert!(
        record.contains("\"ipv6\": \"2001:2:0:1::2\"") && !record.contains("ipv4"),
        "{record}"
    );

    a.assert_ping6_answered_by_the_responder(addr, 0x6e01, 5);
    a.assert_hello(IpAddr::V6(addr));
    let table = a.node.cli(&["endpoint", "list"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.contains("IPv6") && text.contains("2001:2:0:1::2") && text.contains("ready"),
        "{text}"
    );

    let status = a.stop(Signal::SIGTERM);
    assert!(status.success(), "{status}; log:\n{}", a.log());
    assert_eq!(a.forwarding6(), "0", "IPv6 forwarding restored on exit");
    a.assert_nothing_left(Some(addr));
}

/// An agent with an IPv6 endpoint killed (its forwarding left on, with
/// its record), then one without `--health-cidr6`: the old endpoint goes,
/// and the forwarding it needed is written back, while the agent runs.
/// An endpoint kept past a SIGTERM keeps its forwarding.
#[test]
fn forwarding_a_killed_ipv6_endpoint_needed_is_restored_by_an_agent_without_one() {
    let mut a = Agent6::new();
    a.start(&["--health-cidr6", "2001:2:0:3::/64"]);
    a.wait_endpoint(|_| true);
    assert_eq!(a.forwarding6(), "1");
    a.stop(Signal::SIGKILL);
    assert_eq!(a.forwarding6(), "1", "left on by the killed agent");
    a.start(&["--health-cidr", "198.18.64.0/24"]);
    let ep = a.wait_endpoint(|e| e.ipv6.is_none() && e.ipv4.is_some());
    assert_eq!(ep.ipv4, Some(Ipv4Addr::new(198, 18, 64, 2)));
    assert_eq!(a.forwarding6(), "0", "written back: {}", a.log());
    assert!(
        !a.state_dir()
            .join("sysctl-net.ipv6.conf.all.forwarding")
            .exists(),
        "its record forgotten"
    );
    assert!(a.stop(Signal::SIGTERM).success(), "{}", a.log());
    assert_eq!(a.forwarding6(), "0");

    // A kept IPv6 endpoint keeps the forwarding it needs past a SIGTERM;
    // the next run that keeps nothing writes the node's value back.
    a.start(&["--health-cidr6", "2001:2:0:3::/64", "--keep-endpoint"]);
    a.wait_endpoint(|e| e.ipv6.is_some());
    assert!(a.stop(Signal::SIGTERM).success(), "{}", a.log());
    assert_eq!(a.forwarding6(), "1", "kept with the endpoint");
    a.start(&["--health-cidr6", "2001:2:0:3::/64"]);
    a.wait_endpoint(|e| e.ipv6.is_some());
    assert!(a.stop(Signal::SIGTERM).success(), "{}", a.log());
    assert_eq!(a.forwarding6(), "0", "written back: {}", a.log());
}

/// Both flags (`--health-cidr6` from the config file): a dual-stack
/// endpoint, both families plumbed and answered (echo and hello).
#[test]
fn dual_stack_endpoint_has_both_addresses_and_answers_on_both() {
    let mut a = Agent6::new();
    let config = a.node.dir.join("config.yaml");
    fs::write(&config, "health-cidr6: 2001:2:0:2::/64\n").expect("config file");
    let config = config.to_str().expect("utf-8").to_owned();
    a.start(&["--config", &config, "--health-cidr", "198.18.64.0/24"]);
    let ep = a.wait_endpoint(|_| true);
    let (v4, v6) = (Ipv4Addr::new(198, 18, 64, 2), ip6("2001:2:0:2::2"));
    assert_eq!((ep.ipv4, ep.ipv6), (Some(v4), Some(v6)));
    let json = a.node.cli(&["endpoint", "list", "-o", "json"]);
    let text = String::from_utf8_lossy(&json.stdout);
    assert!(
        text.contains("\"ipv4\": \"198.18.64.2\"") && text.contains("\"ipv6\": \"2001:2:0:2::2\""),
        "{text}"
    );
    assert_eq!(a.ep_addresses6(), [(v6, 128)]);
    assert_eq!(a.ep_default6(), Some(ip6("2001:2:0:2::1")));
    assert!(a.node_route6_to(v6));
    assert!(a.node.node_has_route_to(v4), "IPv4 host route too");
    assert_eq!(a.forwarding6(), "1");

    a.assert_ping6_answered_by_the_responder(v6, 0x6e02, 4);
    a.node.assert_echo_answered_in_kernel(v4, 0x6e03, 4);
    a.assert_hello(IpAddr::V6(v6));
    a.assert_hello(IpAddr::V4(v4));
    assert!(a.stop(Signal::SIGTERM).success(), "{}", a.log());
    a.assert_nothing_left(Some(v6));
}

/// The controller puts back a deleted IPv6 address, IPv6 default route
/// and node route to the endpoint, each within its interval (none of
/// them raises a link event).
#[test]
fn the_controller_repairs_deleted_ipv6_address_and_routes() {
    let mut a = Agent6::new();
    a.start(&[
        "--health-cidr6",
        "2001:2:0:3::/64",
        "--controller-interval",
        "1s",
    ]);
    let ep = a.wait_endpoint(|_| true);
    let addr = ep.ipv6.expect("IPv6");
    // Two controller runs find everything in place: the endpoint answers
    // the controller's ICMPv6 echo.
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(a.get().repairs, 0, "log:\n{}", a.log());
    let repaired = |n: u64| {
        a.node
            .wait_endpoint(Duration::from_secs(4), |e| e.repairs >= n)
    };

    in_netns(Some(&a.ep_ns()), |nl| async move {
        nl.delete_address("eth0", IpAddr::V6(addr)).await
    })
    .expect("delete the address");
    assert!(a.ep_addresses6().is_empty(), "deleted");
    let ep = repaired(1);
    assert_eq!(ep.ipv6, Some(addr), "same address");
    assert_eq!(a.ep_addresses6(), [(addr, 128)], "address back");

    in_netns(Some(&a.ep_ns()), |nl| async move {
        nl.delete_route(Ipv6Addr::UNSPECIFIED, 0, "eth0").await
    })
    .expect("delete the default route");
    assert_eq!(a.ep_default6(), None, "deleted");
    repaired(2);
    assert_eq!(a.ep_default6(), Some(ip6("2001:2:0:3::1")), "default back");

    in_netns(Some(&a.node.node), |nl| async move {
        nl.delete_route(addr, 128, "lxc_health").await
    })
    .expect("delete the node's route");
    assert!(!a.node_route6_to(addr), "deleted");
    repaired(3);
    assert!(a.node_route6_to(addr), "node route back");

    let log = a.log();
    for what in ["IPv6 address", "IPv6 default route", "IPv6 host route"] {
        assert!(log.contains(what), "{what:?} not reported missing:\n{log}");
    }
    a.assert_ping6_answered_by_the_responder(addr, 0x6e04, 3);
    assert_eq!(a.get().repairs, 3, "one repair each; log:\n{log}");

    // A recreated veth (new MACs, new link-local addresses): the node
    // finds the endpoint again by neighbour discovery at once.
    in_netns(Some(&a.node.node), |nl| async move {
        nl.delete_link("lxc_health").await
    })
    .expect("delete lxc_health");
    repaired(4);
    assert_eq!(a.ep_addresses6(), [(addr, 128)]);
    assert!(a.node_route6_to(addr));
    a.assert_ping6_answered_by_the_responder(addr, 0x6e06, 3);
}

/// A new agent after kill -9 restores the endpoint with the same IPv6
/// address, persisted in the record: not merely the first free one again
/// (the node held that one at the first start, and no longer does).
#[test]
fn a_restarted_agent_keeps_the_same_ipv6_address() {
    let mut a = Agent6::new();
    let taken = ip6("2001:2:0:4::2");
    in_netns(Some(&a.node.node), |nl| async move {
        nl.add_address("uplink", taken, 64).await
    })
    .expect("node address");
    a.start(&["--health-cidr6", "2001:2:0:4::/64"]);
    let ep = a.wait_endpoint(|_| true);
    let addr = ip6("2001:2:0:4::3");
    assert_eq!(ep.ipv6, Some(addr), "the node's own address is skipped");
    a.stop(Signal::SIGKILL);
    in_netns(Some(&a.node.node), |nl| async move {
        nl.delete_address("uplink", IpAddr::V6(taken)).await
    })
    .expect("free the node's address");

    a.start(&["--health-cidr6", "2001:2:0:4::/64"]);
    let restored = a.wait_endpoint(|_| true);
    assert_eq!((restored.ipv6, restored.id), (Some(addr), ep.id));
    let states: Vec<_> = a.get().history.iter().map(|t| t.to.as_str()).collect();
    assert_eq!(states, ["restoring", "regenerating", "ready"]);
    a.assert_ping6_answered_by_the_responder(addr, 0x6e05, 2);

    // An endpoint whose namespace is gone (a reboot) is made anew, with
    // the record's address and ID, though the first address is free now.
    assert!(a.stop(Signal::SIGKILL).code().is_none());
    a.ep_ns().delete().expect("delete the endpoint namespace");
    a.start(&["--health-cidr6", "2001:2:0:4::/64"]);
    let again = a.wait_endpoint(|_| true);
    assert_eq!((again.ipv6, again.id), (Some(addr), ep.id));
    let states: Vec<_> = a.get().history.iter().map(|t| t.to.as_str()).collect();
    assert_eq!(states[0], "waiting-for-identity", "made anew: {states:?}");
}

/// Bad `--health-cidr6` values (command line and config file), neither
/// CIDR flag, and an exhausted IPv6 range: refused with an error naming
/// the flag and the value, nothing created.
#[test]
fn bad_health_cidr6_values_are_refused_clearly() {
    let a = Agent6::new();
    for (value, needle) in [
        ("2001:2:0:5::7/64", "network is 2001:2:0:5::/64"),
        ("2001:2:0:5::/129", "prefix \"129\""),
        ("2001:2:0:5::", "ADDRESS/PREFIX"),
        ("2001:2:0:zz::/64", "not an IPv6 address"),
        ("198.18.64.0/24", "is an IPv4 address"),
        ("2001:2:0:5::/127", "too small"),
        ("fe80::/64", "link-local"),
        ("ff02::/16", "multicast"),
    ] {
        let out = a.run_to_exit(&["--health-cidr6", value]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{value}: {err}");
        assert!(
            err.contains("--health-cidr6") && err.contains(value) && err.contains(needle),
            "{value}: {needle:?} not in {err}"
        );
        a.assert_nothing_left(None);
    }

    let config = a.node.dir.join("bad.yaml");
    fs::write(&config, "probe-interval: 5s\nhealth-cidr6: 2001:2::/129\n").expect("write");
    let out = a.run_to_exit(&["--config", config.to_str().expect("utf-8")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("bad.yaml:2") && err.contains("health-cidr6") && err.contains("129"),
        "{err}"
    );

    let out = a.run_to_exit(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--health-cidr <CIDR>") && err.contains("--health-cidr6 <CIDR>"),
        "neither flag: {err}"
    );
    a.assert_nothing_left(None);

    // Exhausted: a /126 holds ::2 and ::3, both the node's.
    in_netns(Some(&a.node.node), |nl| async move {
        nl.add_address("uplink", ip6("2001:2:0:6::2"), 64).await?;
        nl.add_address("uplink", ip6("2001:2:0:6::3"), 64).await
    })
    .expect("node addresses");
    let out = a.run_to_exit(&["--health-cidr6", "2001:2:0:6::/126"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("no free address in 2001:2:0:6::/126: 2 usable"),
        "{err}"
    );
    a.assert_nothing_left(None);
    assert_eq!(
        a.forwarding6(),
        "0",
        "forwarding restored after the failure"
    );
}

/// Masquerade translates IPv4 only: with an IPv6 endpoint address it is
/// refused at start, saying why, before anything is made.
#[test]
fn masquerade_with_an_ipv6_endpoint_is_refused_at_start() {
    let a = Agent6::new();
    let m = ["--routing", "masquerade", "--node-ip", "198.18.0.10"];
    for cidrs in [
        &["--health-cidr6", "2001:2:0:7::/64"][..],
        &[
            "--health-cidr",
            "198.18.64.0/24",
            "--health-cidr6",
            "2001:2:0:7::/64",
        ][..],
    ] {
        let args: Vec<&str> = m.iter().chain(cidrs).copied().collect();
        let out = a.run_to_exit(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            err.contains("IPv6 masquerade is not supported")
                && err.contains("2001:2:0:7::/64")
                && err.contains("IPv4 only"),
            "{args:?}: {err}"
        );
        a.assert_nothing_left(None);
    }
}
