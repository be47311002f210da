//! Masquerade mode in a two-node cluster: the agent's probes to the peer's
//! node IP succeed through SNAT, the peer sees only the node IP (checked
//! with a capture on the peer's uplink), `bpf nat list` holds each flow's
//! OUT/IN pair, pairs go with their CT entries, two endpoints using the
//! same echo identifier get different node-side identifiers, and an echo
//! over the MTU goes and comes back in fragments, every one translated.

use std::{
    net::Ipv4Addr,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use health_agent::{
    datapath::{ct, nat},
    endpoint::{
        plan::{Plan, V4},
        plumbing,
    },
    probe::path::ProbeResult,
    sys::netns::Netns,
};
use health_tests::{
    agent::agent_binary,
    capture::{Capture, Seen},
    cluster::{Cluster, Settings},
    names,
    pinger::{check_reply, fragmented_payload, ping, ping_fragmented},
};

const EP1: Ipv4Addr = Ipv4Addr::new(198, 18, 64, 2);
/// A second endpoint on node 1, made by the test.
const EP1_B: Ipv4Addr = Ipv4Addr::new(198, 18, 64, 200);
const NODE1: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 11);
const NODE2: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 12);
const SHARED_ID: u16 = 0x5151;
/// The identifier of the echo sent in fragments.
const FRAGMENTED_ID: u16 = 0x5252;
/// Its payload: three fragments each way at the uplink's 1,500 bytes.
const FRAGMENTED_SIZE: usize = 3_000;

fn masquerade_cluster() -> Cluster {
    Cluster::start(&Settings {
        nodes: 2,
        probe_interval: "1s",
        extra_args: [
            "--routing",
            "masquerade",
            "--ct-lifetime-closed",
            "2s",
            "--ct-lifetime-icmp",
            "3s",
            "--ct-gc-interval",
            "1s",
        ]
        .map(String::from)
        .to_vec(),
        ..Settings::default()
    })
}

/// `bpf nat list -o json` through the CLI.
fn nat_list_cli(pins: &Path) -> Vec<serde_json::Value> {
    let out = Command::new(agent_binary())
        .args(["bpf", "nat", "list", "-o", "json", "--bpffs-dir"])
        .arg(pins)
        .output()
        .expect("cli");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json")
}

#[test]
fn masquerade_end_to_end() {
    let cluster = masquerade_cluster();
    let capture = Capture::start(&cluster.nodes[1].ns, "uplink").expect("capture");
    // The agent's own probes to node 2's IP, ICMP and HTTP, succeed.
    cluster.wait_status(0, Duration::from_secs(30), |s| {
        s.nodes.iter().any(|n| {
            n.host.ip == NODE2
                && n.host.icmp.result == ProbeResult::Success
                && n.host.http.result == ProbeResult::Success
        })
    });
    let pins = cluster.nodes[0].pins.clone();
    assert_pairs_listed(&pins);
    assert_pairs_go_with_their_ct_entries(&pins);

    let second = SecondEndpoint::new(&cluster.nodes[0].ns);
    let ep1 = Netns::named(&cluster.nodes[0].endpoint_netns).expect("ns");
    for ns in [&ep1, &second.ns] {
        let ex = ping(ns, NODE2, SHARED_ID, 3, Duration::from_secs(1)).expect("ping");
        for e in &ex {
            check_reply(e, SHARED_ID).expect("reply through the reverse translation");
        }
    }
    assert_fragments_follow_their_first(&ep1, &pins);
    let ids = assert_no_identifier_collision(&pins);
    assert_bpftool_counts_the_pairs(&pins);
    let seen = capture.stop();
    assert_peer_saw_only_the_node_ip(&seen, ids);
}

/// An ICMP and a TCP pair for node 2's IP, each OUT entry mirrored by its IN.
fn assert_pairs_listed(pins: &Path) {
    let rows = nat_list_cli(pins);
    for proto in ["ICMP", "TCP"] {
        let out = rows
            .iter()
            .find(|r| r["proto"] == proto && r["dir"] == "OUT" && r["dst"] == NODE2.to_string())
            .unwrap_or_else(|| panic!("no {proto} OUT entry in {rows:#?}"));
        assert_eq!(out["src"], EP1.to_string());
        assert_eq!(out["xlate"], "XLATE_SRC");
        assert_eq!(out["xlate_addr"], NODE1.to_string());
        let port = out["xlate_port"].as_u64().expect("port");
        assert!((61_000..=65_535).contains(&port), "{out}");
        let back = rows
            .iter()
            .find(|r| {
                r["dir"] == "IN"
                    && r["proto"] == proto
                    && r["src"] == NODE2.to_string()
                    && r["dst"] == NODE1.to_string()
                    && r["dport"] == port
            })
            .unwrap_or_else(|| panic!("no IN entry for {out} in {rows:#?}"));
        assert_eq!(back["xlate"], "XLATE_DST");
        assert_eq!(back["xlate_addr"], EP1.to_string());
        assert_eq!(back["xlate_port"], out["sport"]);
        if proto == "TCP" {
            assert_eq!(out["dport"], 4240);
        }
    }
    let text = Command::new(agent_binary())
        .args(["bpf", "nat", "list", "--bpffs-dir"])
        .arg(pins)
        .output()
        .expect("cli");
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with(&format!("ICMP OUT {EP1}:"))
                && l.contains(&format!("-> {NODE2}:0 XLATE_SRC {NODE1}:"))),
        "{text}"
    );
}

/// Every HTTP probe is a new connection, closed at once: its CT entry
/// expires (2 s closed lifetime), and its NAT pair is collected with it.
fn assert_pairs_go_with_their_ct_entries(pins: &Path) {
    let tcp_out = |rows: &[nat::NatRow]| -> Vec<u16> {
        rows.iter()
            .filter(|r| r.proto == "TCP" && r.dir == "OUT")
            .map(|r| r.sport)
            .collect()
    };
    let first = tcp_out(&nat::list(pins).expect("nat"));
    let port = *first.first().expect("a TCP pair");
    let deadline = Instant::now() + Duration::from_secs(15);
    while tcp_out(&nat::list(pins).expect("nat")).contains(&port) {
        assert!(
            Instant::now() < deadline,
            "the pair of port {port} was never collected"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let ct_still = ct::list(pins)
        .expect("ct")
        .into_iter()
        .any(|r| r.proto == "TCP" && r.sport == port && r.expires_in_seconds > 0);
    assert!(!ct_still, "NAT pair removed while its CT entry lives");
    let rows = nat::list(pins).expect("nat");
    let outs = rows.iter().filter(|r| r.dir == "OUT").count();
    assert_eq!(rows.len(), 2 * outs, "every OUT has its IN: {rows:#?}");
    let removed = health_tests::counter(&nat::counters(pins).expect("counters"), "removed");
    assert!(removed >= 2, "removed {removed}");
}

/// An echo of 3,000 bytes leaves the endpoint in three fragments: the
/// peer can only reassemble it if the later two took the node IP too, and
/// its reply's fragments reach the endpoint only if the later two were
/// translated back (the capture on the peer checks no fragment carried
/// the endpoint's address).
fn assert_fragments_follow_their_first(ep: &Netns, pins: &Path) {
    let icmp = ping_fragmented(
        ep,
        NODE2,
        FRAGMENTED_ID,
        FRAGMENTED_SIZE,
        Duration::from_secs(2),
    )
    .expect("ping")
    .expect("a reply to the echo sent in fragments");
    assert_eq!(
        icmp[8..],
        fragmented_payload(FRAGMENTED_SIZE)[..],
        "the reply's payload, whole"
    );
    let counters = nat::counters(pins).expect("counters");
    for name in ["frag_snat", "frag_rev_snat"] {
        let n = health_tests::counter(&counters, name);
        assert!(n >= 2, "{name} {n}: {counters:?}");
    }
    assert_eq!(health_tests::counter(&counters, "frag_dropped"), 0);
    let records = nat::fragments(pins).expect("fragment map");
    for dir in ["OUT", "IN"] {
        assert!(
            records.iter().any(|r| r.dir == dir && r.proto == "ICMP"),
            "no {dir} record in {records:#?}"
        );
    }
}

/// The two sources' flows with the same identifier got different node
/// identifiers. Returns them.
fn assert_no_identifier_collision(pins: &Path) -> [u16; 2] {
    let rows = nat::list(pins).expect("nat");
    let xlated = |src: Ipv4Addr| {
        rows.iter()
            .find(|r| r.dir == "OUT" && r.proto == "ICMP" && r.src == src && r.sport == SHARED_ID)
            .unwrap_or_else(|| panic!("no pair for {src} in {rows:#?}"))
            .xlate_port
    };
    let ids = [xlated(EP1), xlated(EP1_B)];
    assert_ne!(ids[0], ids[1], "identifiers collide");
    ids
}

/// Node 2 received the masqueraded flows from node 1's IP only, with both
/// node-side identifiers, and never an endpoint address.
fn assert_peer_saw_only_the_node_ip(seen: &[Seen], ids: [u16; 2]) {
    let to_node2: Vec<&Seen> = seen.iter().filter(|p| p.dst == NODE2).collect();
    assert!(
        !to_node2.iter().any(|p| p.src == EP1 || p.src == EP1_B),
        "an endpoint address reached the peer: {to_node2:?}"
    );
    let from_node1 = |p: &&&Seen| p.src == NODE1;
    assert!(
        to_node2
            .iter()
            .filter(from_node1)
            .any(|p| p.proto == 6 && p.dport == 4240),
        "no HTTP probe from the node IP"
    );
    for id in ids {
        let n = to_node2
            .iter()
            .filter(from_node1)
            .filter(|p| p.proto == 1 && p.icmp_type == 8 && p.sport == id)
            .count();
        assert_eq!(n, 3, "echo requests with node identifier {id}");
    }
}

/// A second endpoint namespace on node 1, plumbed like the agent's own,
/// with an address in node 1's health CIDR; removed on drop.
struct SecondEndpoint {
    ns: Netns,
}

impl SecondEndpoint {
    fn new(node: &Netns) -> Self {
        let name = names::unique("ep-b");
        let ns = Netns::create(&name).expect("netns");
        let me = Self { ns: ns.clone() };
        let plan = Plan {
            netns: ns,
            netns_name: name,
            host_iface: "lxc_b".into(),
            ep_iface: "eth0".into(),
            v4: Some(V4 {
                addr: EP1_B,
                cidr: "198.18.64.0/24".parse().expect("cidr"),
            }),
            v6: None,
        };
        node.run(|| plumbing::ensure(&plan))
            .expect("enter node")
            .expect("plumbing");
        me
    }
}

impl Drop for SecondEndpoint {
    fn drop(&mut self) {
        // The host side of the veth goes with the namespace.
        let _ = self.ns.delete();
    }
}

/// `bpf map list` and bpftool count the same NAT entries.
fn assert_bpftool_counts_the_pairs(pins: &Path) {
    let listed = health_agent::datapath::maps::list(pins)
        .expect("map list")
        .into_iter()
        .find(|m| m.name == "NAT_MAP")
        .expect("NAT_MAP listed");
    let out = Command::new("bpftool")
        .args(["-j", "map", "dump", "pinned"])
        .arg(pins.join("NAT_MAP"))
        .output()
        .expect("bpftool");
    let dumped: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("bpftool json");
    // Pairs come and go with the probes: compare with a fresh listing.
    let now = nat::list(pins).expect("nat").len();
    assert!(listed.entries > 0);
    assert!(
        dumped.len().abs_diff(now) <= 2,
        "bpftool {} vs nat list {now}",
        dumped.len()
    );
}
