//! The datapath on `lxc_health` in a two-node cluster: connection tracking
//! counts what crossed, entries expire and are collected, in-kernel RTT
//! agrees with the echo the test itself timed, losses are counted, and the
//! map listing agrees with bpftool.

use std::{
    net::Ipv4Addr,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use health_agent::{
    datapath::{ct, maps, rtt},
    netns::Netns,
};
use health_tests::{
    agent::agent_binary,
    cluster::{Cluster, Settings},
    pinger::{Exchange, check_reply, ping},
};

const ID: u16 = 0x4242;
/// Ethernet + IPv4 + ICMP header + the pinger's 56-byte payload.
const FRAME_LEN: u64 = 14 + 20 + 8 + 56;

/// Agents that do not probe by themselves (the test makes the traffic),
/// with a short ICMP lifetime and a fast collector.
fn quiet_cluster() -> Cluster {
    let cluster = Cluster::start(&Settings {
        nodes: 2,
        probe_interval: "1h",
        extra_args: [
            "--probe-initial-delay",
            "1h",
            "--ct-lifetime-icmp",
            "3s",
            "--ct-gc-interval",
            "1s",
        ]
        .map(String::from)
        .to_vec(),
        ..Settings::default()
    });
    cluster.wait_status(0, Duration::from_secs(20), |s| s.nodes.len() == 2);
    cluster.wait_endpoints_ready(Duration::from_secs(20));
    cluster
}

fn endpoint_ip(i: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 64 + i, 2)
}

#[test]
fn ct_counts_rtt_expiry_losses_and_bpftool_agree() {
    let cluster = quiet_cluster();
    let ep1 = Netns::named(&cluster.nodes[0].endpoint_netns).expect("ns");
    let (src, dst) = (endpoint_ip(0), endpoint_ip(1));
    let pins = cluster.nodes[0].pins.clone();

    let ex = ping(&ep1, dst, ID, 5, Duration::from_secs(1)).expect("ping");
    for e in &ex {
        check_reply(e, ID).expect("reply");
    }
    assert_flow_counted(&pins, src, dst);
    assert_kernel_rtt_agrees(&pins, dst, &ex);
    assert_bpftool_agrees(&pins);
    assert_collected_after_lifetime(&pins);

    // Losses: the peer's link goes down; unanswered requests are counted.
    cluster.nodes[1].set_uplink(false);
    let lost = ping(&ep1, dst, ID + 1, 3, Duration::from_millis(300)).expect("ping");
    assert!(lost.iter().all(|e| e.reply.is_none()));
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let rows = rtt::list(&pins).expect("rtt");
        let l = rows
            .iter()
            .find(|r| r.peer == dst && r.proto == "ICMP")
            .map_or(0, |r| r.losses);
        if l >= 3 {
            break;
        }
        assert!(Instant::now() < deadline, "losses {l} < 3");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The 5 exchanges are one OUT entry with exact packet and byte counts, in
/// the library's view and in the CLI's JSON.
fn assert_flow_counted(pins: &Path, src: Ipv4Addr, dst: Ipv4Addr) {
    let rows = ct::list(pins).expect("ct list");
    let flow = rows
        .iter()
        .find(|r| {
            r.proto == "ICMP" && r.dir == "OUT" && r.src == src && r.dst == dst && r.dport == ID
        })
        .unwrap_or_else(|| panic!("no entry for the flow in {rows:#?}"));
    assert_eq!(
        (flow.tx_packets, flow.tx_bytes),
        (5, 5 * FRAME_LEN),
        "{flow:?}"
    );
    assert_eq!(
        (flow.rx_packets, flow.rx_bytes),
        (5, 5 * FRAME_LEN),
        "{flow:?}"
    );
    let out = Command::new(agent_binary())
        .args(["bpf", "ct", "list", "global", "-o", "json", "--bpffs-dir"])
        .arg(pins)
        .output()
        .expect("cli");
    let json: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("json");
    assert!(
        json.iter()
            .any(|e| e["dport"] == ID && e["tx_packets"] == 5 && e["rx_packets"] == 5)
    );
}

/// One kernel sample per answered request; the kernel's average is never
/// above the user-space one (plus scheduling slack) and within 500 µs of it.
fn assert_kernel_rtt_agrees(pins: &Path, dst: Ipv4Addr, ex: &[Exchange]) {
    let samples = rtt::list(pins).expect("rtt list");
    let s = samples
        .iter()
        .find(|r| r.peer == dst && r.proto == "ICMP")
        .expect("ICMP samples for the peer");
    assert_eq!(s.samples, 5);
    let user_avg = ex.iter().filter_map(|e| e.rtt).sum::<Duration>() / 5;
    let kernel_avg = Duration::from_nanos(s.avg_ns);
    assert!(
        kernel_avg > Duration::ZERO && kernel_avg <= user_avg + Duration::from_micros(200),
        "kernel {kernel_avg:?} vs user {user_avg:?}"
    );
    assert!(
        user_avg.saturating_sub(kernel_avg) < Duration::from_micros(500),
        "kernel {kernel_avg:?} vs user {user_avg:?}"
    );
}

/// bpftool counts the same entries as `bpf map list` in every map.
fn assert_bpftool_agrees(pins: &Path) {
    for m in maps::list(pins).expect("map list") {
        if m.kind == "ringbuf" {
            continue;
        }
        let out = Command::new("bpftool")
            .args(["-j", "map", "dump", "pinned"])
            .arg(pins.join(&m.name))
            .output()
            .expect("bpftool");
        let dumped: Vec<serde_json::Value> =
            serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
                panic!(
                    "bpftool dump of {}: {e}: {}",
                    m.name,
                    String::from_utf8_lossy(&out.stderr)
                )
            });
        assert_eq!(
            dumped.len() as u64,
            m.entries,
            "{}: bpftool and `bpf map list` disagree",
            m.name
        );
    }
}

/// The flow's entry expires (3 s lifetime) and is collected within a second.
fn assert_collected_after_lifetime(pins: &Path) {
    let gone = Instant::now() + Duration::from_secs(8);
    while ct::list(pins).expect("ct").iter().any(|r| r.dport == ID) {
        assert!(
            Instant::now() < gone,
            "the entry was not collected after its lifetime"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let counters = ct::counters(pins).expect("counters");
    let removed = counters
        .iter()
        .find(|(n, _)| *n == "removed")
        .map(|(_, v)| *v);
    assert!(removed >= Some(1), "removed counter {removed:?}");
}
