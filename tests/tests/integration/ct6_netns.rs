//! Connection tracking and kernel RTT over IPv6 on a real veth: two
//! namespaces (`2001:2::1` <-> `2001:2::2`, no DAD), the tracking programs
//! attached through the agent's library to B's end as they are to
//! `lxc_health` (A plays the endpoint: its packets arrive on B's ingress).
//! `ICMPv6` echo and TCP connections from A: the CT entries count exactly
//! what an `AF_PACKET` capture on the link saw, kernel RTT agrees with the
//! pinger's own, and `health-agent bpf ct list` / `bpf rtt list` show the
//! IPv6 flows and peers.

use std::{
    io::{Read as _, Write as _},
    net::{IpAddr, SocketAddr, TcpListener, TcpStream},
    path::Path,
    process::Command,
    time::Duration,
};

use health_agent::datapath::{Datapath, Interface, KernelFeatures, TcPolicy, ct, rtt};
use health_common::ct::CtConfig;
use health_tests::{
    agent::agent_binary,
    capture6::{Capture6, Seen6},
    pinger6::{Exchange6, check_reply6, ping6},
    pins::PinDir,
    topology::{A_IF, A_IP6, B_IF, B_IP6, TwoNodes},
};

const ID: u16 = 0x4646;
const PINGS: u16 = 5;
/// Ethernet + IPv6 + `ICMPv6` header + the pinger's 56-byte payload.
const FRAME_LEN: u64 = 14 + 40 + 8 + 56;
const PORT: u16 = 4246;

/// Fields drop in order: the programs go before the namespaces.
struct Tracked {
    /// Held for its attachments.
    _datapath: Datapath,
    pins: PinDir,
    nodes: TwoNodes,
}

fn tracked() -> Tracked {
    let nodes = TwoNodes::new();
    nodes.add_ipv6();
    let pins = PinDir::new();
    let mut datapath = Datapath::load(pins.path()).expect("load");
    datapath
        .set_ct_config(CtConfig::default())
        .expect("ct config");
    let hook = KernelFeatures::probe()
        .expect("kernel features")
        .choose(TcPolicy::Auto)
        .expect("tc hook");
    datapath
        .attach_tracking(&Interface::new(B_IF, Some(nodes.b.clone())), hook)
        .expect("attach tracking");
    Tracked {
        _datapath: datapath,
        pins,
        nodes,
    }
}

fn counter(pins: &Path, name: &str) -> u64 {
    health_tests::counter(&ct::counters(pins).expect("counters"), name)
}

/// Packets and bytes (as frames) of the captured packets `pick` accepts.
fn tally(seen: &[Seen6], pick: impl Fn(&Seen6) -> bool) -> (u64, u64) {
    seen.iter()
        .filter(|p| pick(p))
        .fold((0, 0), |(n, b), p| (n + 1, b + p.frame_len()))
}

fn cli_json(pins: &Path, args: &[&str]) -> Vec<serde_json::Value> {
    let out = Command::new(agent_binary())
        .args(args)
        .args(["-o", "json", "--bpffs-dir"])
        .arg(pins)
        .output()
        .expect("cli");
    assert!(out.status.success(), "{args:?}: {out:?}");
    serde_json::from_slice(&out.stdout).expect("json")
}

fn cli_table(pins: &Path, args: &[&str]) -> String {
    let out = Command::new(agent_binary())
        .args(args)
        .arg("--bpffs-dir")
        .arg(pins)
        .output()
        .expect("cli");
    assert!(out.status.success(), "{args:?}: {out:?}");
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn icmpv6_echo_over_a_veth_is_counted_exactly_and_timed() {
    let t = tracked();
    let pins = t.pins.path();
    let capture = Capture6::start(&t.nodes.a, A_IF).expect("capture");
    let ex = ping6(&t.nodes.a, A_IP6, B_IP6, ID, PINGS, Duration::from_secs(3)).expect("ping");
    for e in &ex {
        check_reply6(e, B_IP6, A_IP6, ID).expect("reply");
    }
    std::thread::sleep(Duration::from_millis(200));
    let seen = capture.stop();

    let sent = tally(&seen, |p| {
        p.icmp_type == 128 && p.sport == ID && p.src == A_IP6
    });
    let received = tally(&seen, |p| {
        p.icmp_type == 129 && p.sport == ID && p.dst == A_IP6
    });
    let want = (u64::from(PINGS), u64::from(PINGS) * FRAME_LEN);
    assert_eq!((sent, received), (want, want), "the capture: {seen:#?}");
    let rows = ct::list(pins).expect("ct");
    let flow = rows
        .iter()
        .find(|r| r.proto == "ICMPv6" && r.dir == "OUT" && r.dport == ID)
        .unwrap_or_else(|| panic!("no entry for the echo flow in {rows:#?}"));
    assert_eq!((flow.src, flow.dst), (IpAddr::V6(A_IP6), IpAddr::V6(B_IP6)));
    assert_eq!((flow.tx_packets, flow.tx_bytes), sent, "{flow:?}");
    assert_eq!((flow.rx_packets, flow.rx_bytes), received, "{flow:?}");
    // Neighbour discovery crossed the link too: counted, not tracked.
    assert!(
        counter(pins, "unparsed") >= 1,
        "no neighbour solicitation seen"
    );
    assert!(rows.iter().all(|r| r.proto != "OTHER"), "{rows:#?}");

    assert_kernel_rtt_agrees(pins, &ex);
    assert_cli_shows_the_echo(pins);
}

/// One kernel sample per reply; the kernel's average is never above the
/// pinger's (plus scheduling slack) and, on real CPUs, within 500 µs.
fn assert_kernel_rtt_agrees(pins: &Path, ex: &[Exchange6]) {
    let samples = rtt::list(pins).expect("rtt");
    let s = samples
        .iter()
        .find(|r| r.peer == IpAddr::V6(B_IP6) && r.proto == "ICMPv6")
        .unwrap_or_else(|| panic!("no ICMPv6 samples for {B_IP6}: {samples:#?}"));
    assert_eq!((s.samples, s.losses), (u64::from(PINGS), 0), "{s:?}");
    let rtts: Vec<Duration> = ex.iter().filter_map(|e| e.rtt).collect();
    assert_eq!(rtts.len(), usize::from(PINGS));
    let user_avg = rtts.iter().sum::<Duration>() / u32::from(PINGS);
    let kernel_avg = Duration::from_nanos(s.avg_ns);
    assert!(
        s.min_ns > 0 && s.min_ns <= s.avg_ns && s.avg_ns <= s.max_ns,
        "{s:?}"
    );
    assert!(
        kernel_avg <= user_avg + Duration::from_micros(200),
        "kernel {kernel_avg:?} vs pinger {user_avg:?}"
    );
    // As in the IPv4 datapath test: closeness only where the clock is not
    // emulated (HEALTH_TEST_TIME_SCALE 1).
    if health_tests::patience(Duration::from_secs(1)) == Duration::from_secs(1) {
        assert!(
            user_avg.saturating_sub(kernel_avg) < Duration::from_micros(500),
            "kernel {kernel_avg:?} vs pinger {user_avg:?}"
        );
    }
    let pending = rtt::pending(pins).expect("pending");
    assert!(pending.is_empty(), "every request answered: {pending:?}");
}

fn assert_cli_shows_the_echo(pins: &Path) {
    let (a, b) = (A_IP6.to_string(), B_IP6.to_string());
    let ct_rows = cli_json(pins, &["bpf", "ct", "list", "global"]);
    assert!(
        ct_rows.iter().any(|e| e["proto"] == "ICMPv6"
            && e["dir"] == "OUT"
            && e["src"] == a.as_str()
            && e["dst"] == b.as_str()
            && e["dport"] == ID
            && e["tx_packets"] == PINGS
            && e["rx_packets"] == PINGS),
        "{ct_rows:#?}"
    );
    let table = cli_table(pins, &["bpf", "ct", "list", "global"]);
    let line = format!("ICMPv6 OUT [{a}]:0 -> [{b}]:{ID} ");
    assert!(table.contains(&line), "no {line:?} in\n{table}");
    let rtt_rows = cli_json(pins, &["bpf", "rtt", "list"]);
    assert!(
        rtt_rows
            .iter()
            .any(|r| r["peer"] == b.as_str() && r["proto"] == "ICMPv6" && r["samples"] == PINGS),
        "{rtt_rows:#?}"
    );
    let table = cli_table(pins, &["bpf", "rtt", "list"]);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(&format!("{b} ")) && l.contains(" ICMPv6 ")),
        "{table}"
    );
}

/// Answers `n` HTTP-like requests on `listener`, one connection each.
fn serve(listener: TcpListener, n: usize) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for _ in 0..n {
            let Ok((mut s, _)) = listener.accept() else {
                return;
            };
            let mut req = Vec::new();
            let mut buf = [0u8; 512];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(k) => req.extend_from_slice(&buf[..k]),
                }
            }
            let _ =
                s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
        }
    })
}

#[test]
fn tcp_over_ipv6_is_counted_exactly_and_timed() {
    let t = tracked();
    let pins = t.pins.path();
    let listener = t
        .nodes
        .b
        .run(|| TcpListener::bind(SocketAddr::from((B_IP6, PORT))))
        .expect("enter b")
        .expect("listen");
    let server = serve(listener, 3);
    let capture = Capture6::start(&t.nodes.a, A_IF).expect("capture");
    let mut ports = Vec::new();
    for _ in 0..3 {
        let mut stream = t
            .nodes
            .a
            .run(|| TcpStream::connect_timeout(&(B_IP6, PORT).into(), Duration::from_secs(2)))
            .expect("enter a")
            .expect("connect");
        ports.push(stream.local_addr().expect("addr").port());
        stream
            .write_all(b"GET /hello HTTP/1.1\r\nHost: health\r\n\r\n")
            .expect("request");
        let mut body = String::new();
        stream.read_to_string(&mut body).expect("response");
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    }
    server.join().expect("server");
    std::thread::sleep(Duration::from_millis(500));
    let seen = capture.stop();
    let rows = ct::list(pins).expect("ct");
    for port in &ports {
        let e = rows
            .iter()
            .find(|r| r.proto == "TCP" && r.dir == "OUT" && r.sport == *port)
            .unwrap_or_else(|| panic!("no CT entry for port {port}: {rows:#?}"));
        assert_eq!(
            (e.src, e.dst, e.dport),
            (IpAddr::V6(A_IP6), IpAddr::V6(B_IP6), PORT)
        );
        let tcp = |p: &Seen6| p.next == 6;
        let sent = tally(&seen, |p| tcp(p) && p.src == A_IP6 && p.sport == *port);
        let received = tally(&seen, |p| tcp(p) && p.dst == A_IP6 && p.dport == *port);
        assert_eq!((e.tx_packets, e.tx_bytes), sent, "sent on {port}: {e:?}");
        assert_eq!(
            (e.rx_packets, e.rx_bytes),
            received,
            "received on {port}: {e:?}"
        );
        assert!(e.tx_packets >= 4 && e.rx_packets >= 4, "{e:?}");
        assert_eq!(
            (e.tx_flags_seen & 0x13, e.rx_flags_seen & 0x13),
            (0x13, 0x13)
        );
        assert!(e.expires_in_seconds <= 10, "closed: short lifetime: {e:?}");
    }
    let samples = rtt::list(pins).expect("rtt");
    let s = samples
        .iter()
        .find(|r| r.peer == IpAddr::V6(B_IP6) && r.proto == "TCP")
        .unwrap_or_else(|| panic!("no TCP samples for {B_IP6}: {samples:#?}"));
    assert_eq!(s.samples, 3, "{s:?}");
    let json = cli_json(pins, &["bpf", "rtt", "list"]);
    assert!(
        json.iter().any(|r| r["peer"] == B_IP6.to_string().as_str()
            && r["proto"] == "TCP"
            && r["samples"] == 3),
        "{json:#?}"
    );
}
