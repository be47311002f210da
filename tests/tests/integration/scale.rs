//! One agent, 200 peers of which 100 never answer: a probe round costs
//! about one timeout (not one per silent peer), and the API keeps answering
//! while the round runs.

use std::{
    fmt::Write as _,
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use health_agent::{
    datapath::remove_pins,
    probe::{path::ProbeResult, status::ClusterStatus},
    sys::{netlink::in_netns, netns::Netns},
};
use health_tests::{
    agent::{daemon_command, pidfile_in, socket_in},
    names,
    netns_guard::NetnsGuard,
    require_root,
};

const TIMEOUT_MS: u64 = 1000;
const SPREAD_MS: u64 = 100;

/// Everything the test made, removed on drop.
struct Lab {
    node: Netns,
    peers: Netns,
    dir: PathBuf,
    pins: PathBuf,
    ep_netns: String,
    daemon: Option<Child>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            let _ = d.kill();
            let _ = d.wait();
        }
        let _ = Netns::named(&self.ep_netns).map(|n| n.delete());
        let _ = self.node.delete();
        let _ = self.peers.delete();
        let _ = remove_pins(&self.pins);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Lab {
    /// `on_link`: the peers' addresses share the node's network (each gets
    /// a per-peer route and a neighbour entry); otherwise they are routed
    /// through the peers namespace (one neighbour, no per-peer routes).
    fn new(on_link: bool) -> Self {
        require_root();
        names::sweep_stale_netns();
        let node = NetnsGuard::create(&names::unique("scale-node"), "node");
        let peers = NetnsGuard::create(&names::unique("scale-peers"), "peers");
        let lab = Self {
            node: node.keep(),
            peers: peers.keep(),
            dir: std::env::temp_dir().join(names::unique("scale")),
            pins: Path::new("/sys/fs/bpf").join(names::unique("scale-pins")),
            ep_netns: names::unique("scale-ep"),
            daemon: None,
        };
        std::fs::create_dir_all(&lab.dir).expect("dir");
        // Routed, as the benchmark: the node reaches every peer address
        // through the peers namespace (one neighbour), so 400 addresses cost
        // no ARP and no room in the neighbour table shared with parallel
        // tests. On-link: one network, a neighbour per address.
        let (len, peer_iface, peer_len) = if on_link {
            (16, "peers", 16)
        } else {
            (24, "lo", 32)
        };
        let peers = lab.peers.clone();
        in_netns(Some(&lab.node), |nl| async move {
            nl.set_up("lo").await?;
            nl.add_veth("uplink", "peers", Some(&peers)).await?;
            nl.add_address("uplink", Ipv4Addr::new(198, 18, 0, 1), len)
                .await?;
            nl.set_up("uplink").await?;
            if on_link {
                return Ok(());
            }
            nl.replace_route_via(Ipv4Addr::UNSPECIFIED, 0, Ipv4Addr::new(198, 18, 0, 2))
                .await
        })
        .expect("node side");
        // The 100 answering peers: node IPs 198.18.1.k, health IPs
        // 198.19.2.k, all on one namespace answering ICMP and HTTP :4240.
        // The silent ones (198.18.3.k / 198.19.4.k) are held by nobody:
        // routed, the peers namespace does not forward and drops them
        // without a word; on-link, nobody answers ARP.
        in_netns(Some(&lab.peers), |nl| async move {
            nl.set_up("lo").await?;
            nl.add_address("peers", Ipv4Addr::new(198, 18, 0, 2), len)
                .await?;
            for k in 1..=100u8 {
                nl.add_address(peer_iface, Ipv4Addr::new(198, 18, 1, k), peer_len)
                    .await?;
                nl.add_address(peer_iface, Ipv4Addr::new(198, 19, 2, k), peer_len)
                    .await?;
            }
            nl.set_up("peers").await?;
            // Probes come from the agent's health endpoint: route replies
            // to its CIDR back through the agent's node.
            nl.replace_route_via(
                Ipv4Addr::new(198, 19, 64, 0),
                24,
                Ipv4Addr::new(198, 18, 0, 1),
            )
            .await
        })
        .expect("peer side");
        lab
    }

    fn serve_peers(&self, rt: &tokio::runtime::Runtime) {
        // The agent's own listener: a backlog deep enough for 200
        // connections arriving within the spread. std's 128 drops SYNs
        // when this test process is slow to accept, and a dropped SYN is
        // retried only after a second, past the timeout.
        let listener = self
            .peers
            .run(|| health_agent::probe::hello::listen(4240))
            .expect("netns")
            .expect("bind :4240");
        rt.spawn(async move {
            health_agent::probe::hello::serve_with(
                tokio::net::TcpListener::from_std(listener).expect("listener"),
                tokio_util::sync::CancellationToken::new(),
                health_agent::probe::hello::Limits::NODE,
                None,
            )
            .await;
        });
    }

    /// 100 answering peers and 100 silent ones (198.18.3.k / 198.19.4.k:
    /// nobody there).
    fn nodes_file(&self) -> PathBuf {
        let mut yaml = String::from("nodes:\n");
        for k in 1..=100 {
            let _ = write!(
                yaml,
                "  - name: peer-{k}\n    node-ip: 198.18.1.{k}\n    health-ip: 198.19.2.{k}\n"
            );
            let _ = write!(
                yaml,
                "  - name: silent-{k}\n    node-ip: 198.18.3.{k}\n    health-ip: 198.19.4.{k}\n"
            );
        }
        let path = self.dir.join("nodes.yaml");
        std::fs::write(&path, yaml).expect("nodes file");
        path
    }

    fn start_agent(&mut self, nodes_file: &Path, extra: &[&str]) {
        let mut cmd = daemon_command(
            &self.node,
            &self.dir,
            &self.pins,
            &self.ep_netns,
            "198.19.64.0/24",
        );
        cmd.args(["--node-name", "scale", "--health-range", "198.19.0.0/16"])
            .arg("--nodes-file")
            .arg(nodes_file)
            // Every peer: the round over all 200 is what is tested.
            .args(["--probe-peers", "all"])
            .args([
                "--probe-interval",
                "60s",
                "--probe-timeout",
                &format!("{TIMEOUT_MS}ms"),
            ])
            .args([
                "--probe-spread",
                &format!("{SPREAD_MS}ms"),
                "--failure-threshold",
                "1",
            ])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.join("daemon.log")).expect("log"));
        self.daemon = Some(cmd.spawn().expect("daemon"));
    }

    fn socket(&self) -> PathBuf {
        socket_in(&self.dir)
    }
}

/// Queries the status as fast as it can from the moment the socket exists
/// until the first round is published. Returns each query's latency (and
/// whether the round was done) and the first complete status.
async fn poll_until_first_round(socket: &Path) -> (Vec<(Duration, bool)>, ClusterStatus) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut latencies = Vec::new();
    loop {
        assert!(Instant::now() < deadline, "no complete round within 30 s");
        let t = Instant::now();
        if let Ok(s) = health_agent::api::client::Client::new(socket)
            .status()
            .await
        {
            let done = s.round.is_some();
            latencies.push((t.elapsed(), done));
            if done {
                return (latencies, s);
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A lab whose peers are served and whose agent runs with `extra` flags,
/// the status queries until its first round ended (each query's latency,
/// and whether the round was done), and that round's status.
fn first_round(
    extra: &[&str],
) -> (
    Lab,
    tokio::runtime::Runtime,
    Vec<(Duration, bool)>,
    ClusterStatus,
) {
    let mut lab = Lab::new(false);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    lab.serve_peers(&rt);
    let nodes_file = lab.nodes_file();
    lab.start_agent(&nodes_file, extra);
    let (latencies, status) = rt.block_on(poll_until_first_round(&lab.socket()));
    (lab, rt, latencies, status)
}

/// With fewer slots than probes (the open-file budget, here a flag), the
/// probes past the budget wait for a slot: the round takes longer, but
/// every answering path is OK and no silent one is.
#[test]
fn a_round_past_the_open_file_budget_waits_for_slots_and_loses_no_path() {
    // 400 HTTP probes, 200 of them holding their slot for a whole timeout.
    let (_lab, _rt, _, status) = first_round(&["--max-in-flight", "96"]);
    let round = status.round.as_ref().expect("round");
    assert_eq!(round.probes, 800, "4 paths x 200 peers");
    // 200 silent probes through 96 slots: at least two timeouts in a row.
    assert!(
        round.duration_ms >= 2 * TIMEOUT_MS,
        "round took {} ms: the slots did not bound the probes in flight",
        round.duration_ms
    );
    for n in &status.nodes {
        let http = [&n.host.http, &n.endpoint.http];
        if n.name.starts_with("peer-") {
            assert!(
                http.iter().all(|p| p.result == ProbeResult::Success),
                "{}: {http:?}",
                n.name
            );
        } else {
            assert!(
                http.iter().all(|p| p.result == ProbeResult::Failure),
                "{}: {http:?}",
                n.name
            );
        }
    }
}

#[test]
fn a_round_over_200_peers_with_100_silent_costs_about_one_timeout() {
    let (lab, rt, latencies, status) = first_round(&[]);

    let round = status.round.as_ref().expect("round");
    assert_eq!(round.probes, 800, "4 paths x 200 peers");
    assert!(
        round.duration_ms <= 2 * TIMEOUT_MS + SPREAD_MS,
        "round took {} ms, more than 2 x timeout + spread",
        round.duration_ms
    );
    let unreachable: Vec<_> = status
        .nodes
        .iter()
        .filter(|n| n.name.starts_with("peer-") && !n.reachable())
        .take(3)
        .collect();
    if status.reachable() != 100 {
        let log = std::fs::read_to_string(lab.dir.join("daemon.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(40)..].join("\n");
        panic!(
            "{} of the 100 answering peers reachable; some that are not: {unreachable:#?}\n\
             daemon log (tail):\n{tail}",
            status.reachable()
        );
    }
    let during = latencies.iter().filter(|(_, done)| !done).count();
    assert!(
        during >= 10,
        "too few status queries while the round ran: {during}"
    );
    let worst = latencies.iter().map(|(d, _)| *d).max().expect("samples");
    assert!(
        worst < Duration::from_millis(100),
        "GET /v1/status took {worst:?} during the round"
    );
    println!(
        "round: {} probes in {} ms; {during} status queries during it, slowest {worst:?}",
        round.probes, round.duration_ms
    );

    // The forms for large clusters: counts only, and filters.
    let client = health_agent::api::client::Client::new(lab.socket());
    let summary = rt.block_on(client.status_summary()).expect("summary");
    assert_eq!(
        (
            summary.nodes,
            summary.reachable,
            summary.unreachable,
            summary.unknown
        ),
        (200, 100, 100, 0),
        "{summary:?}"
    );
    assert_eq!(summary.round.map(|r| r.seq), Some(round.seq));
    let failing = rt
        .block_on(client.status_filtered("state=failure"))
        .expect("filtered");
    assert_eq!(failing.nodes.len(), 100);
    assert!(failing.nodes.iter().all(|n| n.name.starts_with("silent-")));
    let one = rt
        .block_on(client.status_filtered("node=peer-7"))
        .expect("one node");
    assert_eq!(one.nodes.len(), 1);
    assert!(one.nodes[0].reachable(), "{:?}", one.nodes[0]);
    let missing = rt
        .block_on(client.status_filtered("node=nobody"))
        .expect_err("no such node");
    assert_eq!(missing.status().map(|s| s.as_u16()), Some(404), "{missing}");
    let bad = rt
        .block_on(client.status_filtered("state=sideways"))
        .expect_err("bad state");
    assert_eq!(bad.status().map(|s| s.as_u16()), Some(400), "{bad}");
    assert!(bad.to_string().contains("sideways"), "{bad}");
}

#[test]
fn sigterm_during_a_round_over_200_peers_half_silent_exits_within_2s_leaving_nothing() {
    let mut lab = Lab::new(true);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    lab.serve_peers(&rt);
    let nodes_file = lab.nodes_file();
    lab.start_agent(&nodes_file, &[]);
    let socket = lab.socket();
    // Wait for the endpoint, then for the first round to be under way:
    // the probe task starts right after the endpoint is ready, and with
    // 100 silent peers the round takes about a second.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ready = health_tests::api::call(&socket, |c| async move { c.healthz().await })
            .is_ok_and(|h| h.state == "ok");
        if ready {
            break;
        }
        assert!(Instant::now() < deadline, "agent not ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    let status =
        health_tests::api::call(&socket, |c| async move { c.status().await }).expect("status");
    assert!(
        status.round.is_none(),
        "the first round must still be in flight"
    );
    // Routes to the answering peers' health IPs are in place by now.
    let routes = || {
        in_netns(Some(&lab.node), |nl| async move {
            nl.routes::<Ipv4Addr>().await
        })
        .expect("routes")
        .into_iter()
        .filter(|r| {
            r.prefix == 32 && (r.destination.octets()[2] == 2 || r.destination.octets()[2] == 4)
        })
        .count()
    };
    assert!(routes() > 0, "peer routes installed");

    let mut daemon = lab.daemon.take().expect("running");
    let pid = nix::unistd::Pid::from_raw(i32::try_from(daemon.id()).expect("pid"));
    let t = Instant::now();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
    let exit = daemon.wait().expect("wait");
    let took = t.elapsed();
    let log = std::fs::read_to_string(lab.dir.join("daemon.log")).unwrap_or_default();
    assert!(exit.success(), "exit {exit:?}; log:\n{log}");
    assert!(
        took < Duration::from_secs(2),
        "took {took:?} to stop; log:\n{log}"
    );

    assert!(
        !Netns::named(&lab.ep_netns).expect("name").exists(),
        "endpoint namespace left"
    );
    let links = in_netns(Some(&lab.node), |nl| async move {
        nl.link_index("lxc_health").await
    })
    .expect("netlink");
    assert!(links.is_none(), "lxc_health left");
    assert_eq!(routes(), 0, "peer routes left");
    let pins_left: Vec<_> = std::fs::read_dir(&lab.pins)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(pins_left.is_empty(), "pins left: {pins_left:?}");
    assert!(!socket.exists(), "socket left");
    assert!(!pidfile_in(&lab.dir).exists(), "pidfile left");
    println!("stopped in {took:?} during a round over 200 peers, nothing left");
}
