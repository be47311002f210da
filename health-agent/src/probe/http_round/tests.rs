use std::net::Ipv4Addr;

/// Thousands are in flight at once: 40 bytes each, not 56.
#[test]
fn a_probe_in_flight_is_small() {
    assert!(size_of::<Option<InFlight>>() <= 40);
}

/// The descriptors kept from probes cover every connection the
/// agent's servers may hold, as the docs say (`--max-in-flight`).
#[test]
fn the_servers_connections_are_kept_from_the_probes() {
    let servers = 2 * crate::probe::hello::MAX_CONNECTIONS
        + crate::api::MAX_CONNECTIONS
        + crate::web::conn::MAX_CONNECTIONS;
    assert!(RESERVED_FILES >= servers + 512);
    assert_eq!(RESERVED_FILES, 9_024, "the figure docs/operations.md gives");
}

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpListener,
};

use super::*;
use crate::probe::{order::Failed, path::RttSource};

/// How a loopback server answers.
#[derive(Clone, Copy)]
enum Answer {
    /// These parts, 20 ms apart, then close.
    Parts(&'static [&'static [u8]]),
    /// These parts at once, then the connection held open.
    Held(&'static [&'static [u8]]),
}

/// Serves `answer` on `127.0.0.<host>:port` (port 0: any); the port.
async fn serve(host: u8, port: u16, answer: Answer) -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::new(127, 0, 0, host), port))
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut req = [0u8; 256];
                let _ = conn.read(&mut req).await;
                match answer {
                    Answer::Parts(parts) => {
                        for part in parts {
                            let _ = conn.write_all(part).await;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                    Answer::Held(parts) => {
                        for part in parts {
                            let _ = conn.write_all(part).await;
                        }
                        tokio::time::sleep(Duration::from_secs(5)).await;
                    }
                }
            });
        }
    });
    port
}

#[tokio::test]
async fn each_flow_connects_from_its_own_port_round_after_round() {
    let listener = TcpListener::bind((Ipv4Addr::new(127, 0, 0, 31), 0))
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut conn, from)) = listener.accept().await {
            let _ = seen_tx.send(from.port());
            let _ = conn.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await;
        }
    });
    let plan = FlowPlan::new(3, false);
    let targets: Vec<IpAddr> = vec![Ipv4Addr::new(127, 0, 0, 31).into(); 3];
    let cfg = ProbeConfig {
        timeout: Duration::from_millis(400),
        spread: Duration::from_millis(20),
        http_port: port,
        flows: plan,
        ..ProbeConfig::default()
    };
    let spread = Spread { n: 1, flows: 3 };
    let mut ports = Vec::new();
    for _ in 0..2 {
        let echoes = Arc::new(Echoes::without(3));
        let targets = Arc::new(targets.clone());
        let order = Suspects::of(3, |_| Failed::default());
        let outcomes = run(
            &cfg,
            (&targets, &Arc::default()),
            spread,
            None,
            &order,
            &echoes,
        )
        .await;
        assert!(
            outcomes.iter().all(|o| matches!(o, Outcome::Ok { .. })),
            "{outcomes:?}"
        );
        for _ in 0..3 {
            ports.push(seen_rx.recv().await.expect("a connection"));
        }
    }
    ports.sort_unstable();
    let want: Vec<u16> = (0..3).flat_map(|f| [plan.tcp_port(f); 2]).collect();
    assert_eq!(ports, want, "flow f from port base + f, both rounds");
}

async fn round(targets: Vec<IpAddr>, port: u16, max_in_flight: usize) -> Vec<Outcome> {
    let echoes = Arc::new(Echoes::without(targets.len()));
    round_with(targets, port, max_in_flight, &echoes).await
}

/// A hello server naming node-3 answers for addresses of node-2 (a
/// route to the wrong node): those probes fail naming node-3, the
/// probes meant for node-3 and those of no named node succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_answered_by_another_nodes_hello_server_fails_naming_it() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move { crate::probe::hello::serve(listener, stop, "node-3").await }
    });
    let cfg = ProbeConfig {
        timeout: Duration::from_millis(800),
        spread: Duration::from_millis(20),
        http_port: port,
        ..ProbeConfig::default()
    };
    let (two, three) = (http::node_tag(b"node-2"), http::node_tag(b"node-3"));
    let targets = Arc::new(vec![IpAddr::from(Ipv4Addr::LOCALHOST); 4]);
    let tags = Arc::new(vec![two, three, 0, two]);
    let order = Suspects::of(4, |_| Failed::default());
    let echoes = Arc::new(Echoes::without(4));
    let spread = Spread { n: 4, flows: 1 };
    let outcomes = run(&cfg, (&targets, &tags), spread, None, &order, &echoes).await;
    let other = Outcome::Failed(ProbeError::OtherNode("node-3".into()));
    assert_eq!(outcomes[0], other);
    assert!(matches!(outcomes[1], Outcome::Ok { .. }), "{outcomes:?}");
    assert!(matches!(outcomes[2], Outcome::Ok { .. }), "{outcomes:?}");
    assert_eq!(outcomes[3], other);
    stop.cancel();
}

/// A round whose probes wait for `echoes` (see [`super::super::order`]).
async fn round_with(
    targets: Vec<IpAddr>,
    port: u16,
    max_in_flight: usize,
    echoes: &Arc<Echoes>,
) -> Vec<Outcome> {
    let cfg = ProbeConfig {
        timeout: Duration::from_millis(400),
        spread: Duration::from_millis(20),
        max_in_flight,
        http_port: port,
        ..ProbeConfig::default()
    };
    round_of(&cfg, targets, echoes).await
}

/// A round of `cfg`'s over `targets`, whose probes wait for `echoes`.
async fn round_of(cfg: &ProbeConfig, targets: Vec<IpAddr>, echoes: &Arc<Echoes>) -> Vec<Outcome> {
    let n = targets.len();
    let order = Suspects::of(n, |_| Failed::default());
    let spread = Spread { n, flows: 1 };
    run(
        cfg,
        (&Arc::new(targets), &Arc::default()),
        spread,
        None,
        &order,
        echoes,
    )
    .await
}

fn host(h: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, h))
}

/// Every kind of answer reads as kubelet reads it, each probe's
/// outcome at its target's index: a head whole or in parts, a
/// redirect, a server error, a line too long, a connection closed
/// early, a refused connect, a silent server and one that stalls after
/// its status line (both timed out, as kubelet reads the whole head).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_answer_reads_as_kubelet_reads_it() {
    let port = serve(1, 0, Answer::Parts(&[b"HTTP/1.1 200 OK\r\n\r\n"])).await;
    let answers = [
        Answer::Parts(&[b"HTTP/1.1 2", b"04 No", b" Content\r", b"\n\r", b"\n"]),
        Answer::Parts(&[b"HTTP/1.1 302 Found\r\n\r\n"]),
        Answer::Parts(&[b"HTTP/1.1 500 Oops\r\n\r\n"]),
        Answer::Parts(&[&[b'x'; 600]]),
        Answer::Parts(&[b"HTTP/1.1 200"]),
        Answer::Held(&[]),
        Answer::Held(&[b"HTTP/1.1 200 OK\r\n"]),
    ];
    for (h, answer) in (2..).zip(answers) {
        serve(h, port, answer).await;
    }
    // 127.0.0.9 and 127.0.0.10 have no listener: refused.
    let outcomes = round((1..=10).map(host).collect(), port, 1024).await;
    let ok = |o: &Outcome| matches!(o, Outcome::Ok { warning: None, source: RttSource::Userspace, rtt } if *rtt < Duration::from_millis(400));
    assert!(ok(&outcomes[0]), "{:?}", outcomes[0]);
    assert!(ok(&outcomes[1]), "{:?}", outcomes[1]);
    assert!(
        matches!(&outcomes[2], Outcome::Ok { warning: Some(w), .. } if w.contains("302")),
        "{:?}",
        outcomes[2]
    );
    assert_eq!(outcomes[3], Outcome::Failed(ProbeError::HttpStatus(500)));
    assert_eq!(
        outcomes[4],
        Outcome::Failed(ProbeError::Protocol("a status line past 512 bytes".into()))
    );
    assert_eq!(
        outcomes[5],
        Outcome::Failed(http::closed_early("a status line"))
    );
    let timed_out = Outcome::Failed(ProbeError::Timeout {
        proto: Proto::Http,
        after: Duration::from_millis(400),
    });
    assert_eq!(outcomes[6], timed_out);
    assert_eq!(outcomes[7], timed_out);
    assert!(
        matches!(
            &outcomes[8],
            Outcome::Failed(ProbeError::Refused {
                step: "connect",
                ..
            })
        ),
        "{:?}",
        outcomes[8]
    );
    assert!(matches!(
        &outcomes[9],
        Outcome::Failed(ProbeError::Refused { .. })
    ));
}

/// A server that writes its head in two writes with Nagle's algorithm
/// on holds the second until the first is acknowledged. The probe
/// acknowledges a part at once, so the answer is not held for a
/// delayed ACK (40 ms at least): of three probes, the fastest is in
/// well under that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_in_two_writes_under_nagle_is_not_held_for_a_delayed_ack() {
    let listener = TcpListener::bind((Ipv4Addr::new(127, 0, 0, 41), 0))
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                conn.set_nodelay(false).expect("Nagle on");
                let mut req = [0u8; 256];
                let _ = conn.read(&mut req).await;
                let _ = conn.write_all(b"HTTP/1.1 200 OK\r\n").await;
                let _ = conn.write_all(b"Content-Length: 0\r\n\r\n").await;
                tokio::time::sleep(Duration::from_secs(2)).await;
            });
        }
    });
    let mut fastest = Duration::MAX;
    for _ in 0..3 {
        let outcomes = round(vec![host(41)], port, 16).await;
        let Outcome::Ok { rtt, .. } = outcomes[0] else {
            panic!("{outcomes:?}");
        };
        fastest = fastest.min(rtt);
    }
    assert!(fastest < Duration::from_millis(30), "{fastest:?}");
}

/// A probe in flight costs its record in the slab and its deadline:
/// under 96 bytes (a future per probe was 472 bytes, and 1,216 before
/// that, plus its task's header).
#[test]
fn a_probe_in_flight_is_a_small_record() {
    let per_probe = size_of::<Option<InFlight>>() + size_of::<(Instant, u32, u32)>();
    assert!(per_probe <= 96, "{per_probe} bytes");
}

/// With a budget of one socket per task, probes wait for the one in
/// flight to end (a silent one's for its timeout) and have theirs made
/// then, a batch each time: every probe runs and none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_budget_probes_wait_for_a_socket_and_none_is_lost() {
    let port = serve(1, 0, Answer::Parts(&[b"HTTP/1.1 200 OK\r\n\r\n"])).await;
    serve(2, port, Answer::Held(&[])).await;
    let targets: Vec<IpAddr> = [2, 1, 1, 1, 1, 1, 1, 1].map(host).to_vec();
    let workers = tokio::runtime::Handle::current().metrics().num_workers();
    let outcomes = round(targets, port, workers).await;
    assert!(matches!(
        outcomes[0],
        Outcome::Failed(ProbeError::Timeout { .. })
    ));
    for o in &outcomes[1..] {
        assert!(matches!(o, Outcome::Ok { .. }), "{o:?}");
    }
}

/// A round whose probes wait for the in-flight limit until after a probe
/// timeout (a silent one's socket held that long) is counted as held back
/// by it; one whose probes waited only for answered ones is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rounds_the_in_flight_limit_holds_past_a_timeout_are_counted() {
    let port = serve(1, 0, Answer::Parts(&[b"HTTP/1.1 200 OK\r\n\r\n"])).await;
    serve(2, port, Answer::Held(&[])).await;
    let workers = tokio::runtime::Handle::current().metrics().num_workers();
    let metrics = Arc::new(ProbeMetrics::default());
    // One probe in flight a task, the others due at once.
    let cfg = ProbeConfig {
        timeout: Duration::from_millis(400),
        spread: Duration::ZERO,
        max_in_flight: workers,
        http_port: port,
        metrics: Some(metrics.clone()),
        ..ProbeConfig::default()
    };
    let round = |targets: Vec<IpAddr>| {
        let echoes = Arc::new(Echoes::without(targets.len()));
        let cfg = &cfg;
        async move { round_of(cfg, targets, &echoes).await }
    };
    for o in round(vec![host(1); 4 * workers]).await {
        assert!(matches!(o, Outcome::Ok { .. }), "{o:?}");
    }
    assert_eq!(metrics.rounds_held(), 0, "waited for answers only");
    for o in round(vec![host(2); 2 * workers]).await {
        assert!(
            matches!(o, Outcome::Failed(ProbeError::Timeout { .. })),
            "{o:?}"
        );
    }
    assert_eq!(
        metrics.rounds_held(),
        1,
        "each task's second probe waited a timeout"
    );
    // Waits for answered probes alone, after a held round: not held.
    for o in round(vec![host(1); 4 * workers]).await {
        assert!(matches!(o, Outcome::Ok { .. }), "{o:?}");
    }
    assert_eq!(metrics.rounds_held(), 1);
}

/// Probes wait for their echo: those whose echo is never sent (an
/// ICMP engine that stalled) start when the round's patience runs
/// out, and every probe still runs and counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_waiting_for_an_echo_that_never_comes_start_after_the_patience() {
    let port = serve(1, 0, Answer::Parts(&[b"HTTP/1.1 200 OK\r\n\r\n"])).await;
    let patience = Duration::from_millis(150);
    let echoes = Arc::new(Echoes::new(4, Duration::from_millis(5), patience));
    let t0 = Instant::now();
    let outcomes = round_with(vec![host(1); 4], port, 1024, &echoes).await;
    assert!(t0.elapsed() >= patience, "{:?}", t0.elapsed());
    for o in &outcomes {
        assert!(matches!(o, Outcome::Ok { .. }), "{o:?}");
    }
}

/// Echoes that are sent and answered as the round goes (the ICMP
/// engine's part, played here) let the probes start well before the
/// patience: answered ones are put off, not dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echoes_sent_and_answered_release_their_probes() {
    let port = serve(1, 0, Answer::Parts(&[b"HTTP/1.1 200 OK\r\n\r\n"])).await;
    let echoes = Arc::new(Echoes::new(
        6,
        Duration::from_millis(5),
        Duration::from_secs(5),
    ));
    let icmp = echoes.clone();
    tokio::spawn(async move {
        for i in 0..6 {
            tokio::time::sleep(Duration::from_millis(2)).await;
            icmp.sent(i, Instant::now());
            if i % 2 == 0 {
                icmp.answered(i);
            }
        }
    });
    let t0 = Instant::now();
    let outcomes = round_with(vec![host(1); 6], port, 1024, &echoes).await;
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    for o in &outcomes {
        assert!(matches!(o, Outcome::Ok { .. }), "{o:?}");
    }
}

/// A task whose first probes are of one family, all put off (their
/// echoes came back), starts with a probe of the other family: the
/// share held by the first family's spare sockets is given back for
/// it (before, the round waited for ever), and every probe runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_of_the_family_whose_sockets_were_not_made_first_still_runs() {
    let port = serve(1, 0, Answer::Parts(&[b"HTTP/1.1 200 OK\r\n\r\n"])).await;
    // Two tasks, a share of two sockets each: each task's first two
    // targets are IPv4 and answered, its third is IPv6 (loopback,
    // nothing listening: refused).
    let v6 = IpAddr::V6(std::net::Ipv6Addr::LOCALHOST);
    let targets = vec![host(1), host(1), host(1), host(1), v6, v6];
    let echoes = Arc::new(Echoes::without(targets.len()));
    for i in 0..4 {
        echoes.answered(i);
    }
    let workers = tokio::runtime::Handle::current().metrics().num_workers();
    let outcomes = tokio::time::timeout(
        Duration::from_secs(5),
        round_with(targets, port, 2 * workers, &echoes),
    )
    .await
    .expect("the round ends");
    for o in &outcomes[..4] {
        assert!(matches!(o, Outcome::Ok { .. }), "{o:?}");
    }
    for o in &outcomes[4..] {
        assert!(
            matches!(o, Outcome::Failed(ProbeError::Refused { .. })),
            "{o:?}"
        );
    }
}

/// A round dropped partway (its prober replaced by a reload) stops
/// connecting: its tasks are aborted, not left to finish its spread,
/// and the probes they had in flight leave the gauge.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_round_stops_connecting() {
    let listener = TcpListener::bind((Ipv4Addr::new(127, 0, 0, 41), 0))
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let accepted = Arc::new(AtomicU64::new(0));
    let counted = accepted.clone();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::Relaxed);
            held.push(conn);
        }
    });
    // 200 starts paced over 2 s: one every 10 ms.
    let n = 200;
    let metrics = Arc::new(ProbeMetrics::default());
    let cfg = ProbeConfig {
        timeout: Duration::from_secs(5),
        spread: Duration::from_secs(2),
        http_port: port,
        metrics: Some(metrics.clone()),
        ..ProbeConfig::default()
    };
    let targets = Arc::new(vec![host(41); n]);
    let echoes = Arc::new(Echoes::without(n));
    let order = Suspects::of(n, |_| Failed::default());
    let spread = Spread { n, flows: 1 };
    let any = Arc::default();
    let round = run(&cfg, (&targets, &any), spread, None, &order, &echoes);
    let dropped = tokio::time::timeout(Duration::from_millis(300), round).await;
    assert!(dropped.is_err(), "the round outlasts 300 ms");
    // The connections made before the drop, all accepted: the count
    // holds still for 200 ms.
    let mut at_drop = accepted.load(Ordering::Relaxed);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = accepted.load(Ordering::Relaxed);
        if now == at_drop {
            break;
        }
        at_drop = now;
    }
    assert!((5..n as u64 / 2).contains(&at_drop), "{at_drop} connected");
    assert_eq!(metrics.in_flight(), 0, "the dropped probes are settled");
    // A spread's worth later, no more have come.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(accepted.load(Ordering::Relaxed), at_drop);
}

/// Set in the child process of a test run by [`in_child`]: the port its
/// round probes.
const SHORT_OF_FILES: &str = "HEALTH_TEST_SHORT_OF_FILES_PORT";

/// In the child process [`in_child`] runs, before the round: the soft
/// open-file limit lowered so that `spare` descriptors are free below it
/// (the round's two epoll sets among them; a limit bounds descriptor
/// numbers, and closed ones below the highest are free too).
fn lower_open_files(spare: usize) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    // Looked up by path, which opens no descriptor.
    let open = |fd: usize| std::fs::symlink_metadata(format!("/proc/self/fd/{fd}")).is_ok();
    let free = (0..).filter(|&fd| !open(fd));
    let limit = free.take(spare).last().map_or(0, |fd| fd + 1);
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    let limit = u64::try_from(limit).expect("fits");
    setrlimit(Resource::RLIMIT_NOFILE, limit, hard).expect("lower the soft limit");
}

/// Runs test `name` of this module again in a child process, whose lowered
/// open-file limit binds only it, probing `port` (served here, out of the
/// limit's reach); fails with the child's output when it fails.
async fn in_child(name: &'static str, port: u16) {
    let child = tokio::task::spawn_blocking(move || {
        std::process::Command::new(std::env::current_exe().expect("the test binary"))
            .args([
                "--exact",
                &format!("probe::http_round::tests::{name}"),
                "--test-threads=1",
                "--nocapture",
            ])
            .env(SHORT_OF_FILES, port.to_string())
            .output()
    });
    let out = child.await.expect("joined").expect("run the child");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("1 passed"),
        "the child's round: {}\n{said}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A round that runs out of descriptors (a soft open-file limit a few
/// above what the process holds: socket batches come short, then fail
/// with EMFILE while probes are in flight) waits for its probes in
/// flight to give theirs back: every probe runs, the answered ones OK
/// and the silent ones timed out, and none fails for want of a socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_short_of_descriptors_waits_for_them_and_loses_no_probe() {
    const ANSWERED: usize = 60;
    const SILENT: usize = 20;
    let Ok(port) = std::env::var(SHORT_OF_FILES) else {
        let port = serve(1, 0, Answer::Parts(&[b"HTTP/1.1 200 OK\r\n\r\n"])).await;
        serve(2, port, Answer::Held(&[])).await;
        in_child(
            "a_round_short_of_descriptors_waits_for_them_and_loses_no_probe",
            port,
        )
        .await;
        return;
    };
    lower_open_files(8);
    // A quarter silent, through the order: their sockets are held a
    // whole timeout while the answered ones ask for theirs.
    let targets: Vec<IpAddr> = (0..ANSWERED + SILENT)
        .map(|k| host(if k % 4 == 0 { 2 } else { 1 }))
        .collect();
    let port: u16 = port.parse().expect("a port");
    let outcomes = round(targets.clone(), port, ANSWERED + SILENT).await;
    for (o, t) in outcomes.iter().zip(&targets) {
        if *t == host(2) {
            assert!(
                matches!(o, Outcome::Failed(ProbeError::Timeout { .. })),
                "{t}: {o:?}"
            );
        } else {
            assert!(matches!(o, Outcome::Ok { .. }), "{t}: {o:?}");
        }
    }
}

/// A round that can make no socket (every descriptor the limit allows is
/// taken before it starts, but its epoll sets) fails its probes naming
/// the error after one probe timeout without a socket given back, not a
/// timeout for each probe. (A task that ends so closes its epoll set,
/// and the other may make its sockets from that descriptor.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_that_can_make_no_socket_fails_its_probes_within_a_timeout() {
    let Ok(port) = std::env::var(SHORT_OF_FILES) else {
        let port = serve(1, 0, Answer::Parts(&[b"HTTP/1.1 200 OK\r\n\r\n"])).await;
        in_child(
            "a_round_that_can_make_no_socket_fails_its_probes_within_a_timeout",
            port,
        )
        .await;
        return;
    };
    // Room for the round's two epoll sets, and no socket.
    lower_open_files(2);
    let port: u16 = port.parse().expect("a port");
    let t0 = std::time::Instant::now();
    let outcomes = round(vec![host(1); 20], port, 20).await;
    let took = t0.elapsed();
    let mut short = 0;
    for o in &outcomes {
        match o {
            Outcome::Failed(ProbeError::Io {
                step: "socket",
                error,
            }) if error.contains("Too many open files") => {
                short += 1;
            }
            Outcome::Ok { .. } => {}
            other @ Outcome::Failed(_) => panic!("{other:?}"),
        }
    }
    assert!(short >= 10, "{outcomes:?}");
    // A timeout (400 ms) or two (the other task's wait, once the first's
    // set is closed) and the spread; a timeout for each of a task's ten
    // probes would be 4 s.
    assert!(took < Duration::from_millis(1_200), "{took:?}");
}

/// The round state of a task whose socket batches are judged by hand
/// (`Flights::took`): `targets`, a share of 8 sockets, a timeout of 400
/// ms, nothing in flight.
fn by_hand(targets: Vec<IpAddr>) -> Shared {
    let cfg = ProbeConfig {
        timeout: Duration::from_millis(400),
        max_in_flight: 8,
        ..ProbeConfig::default()
    };
    let echoes = Arc::new(Echoes::without(targets.len()));
    let spread = Spread {
        n: targets.len(),
        flows: 1,
    };
    let to = (&Arc::new(targets), &Arc::default());
    Shared::new(&cfg, to, spread, None, 1, &echoes)
}

/// Whether `done` is exactly probe `i` failed making its socket, with an
/// error saying `why`.
fn failed_making_its_socket(done: &[(usize, Outcome)], i: usize, why: &str) -> bool {
    matches!(
        done,
        [(at, Outcome::Failed(ProbeError::Io { step: "socket", error }))]
            if *at == i && error.contains(why)
    )
}

/// `n` real sockets of `family`, spare.
fn sockets(family: Family, n: usize) -> Vec<socket2::Socket> {
    let (domain, ty, proto) = http::tcp_for(family);
    (0..n)
        .map(|_| socket2::Socket::new(domain, ty, proto).expect("socket"))
        .collect()
}

fn emfile() -> io::Result<Vec<socket2::Socket>> {
    Err(io::Error::from_raw_os_error(libc::EMFILE))
}

/// An IPv6 probe that finds no descriptor while none of its task's probes
/// is in flight, and the task holds spare IPv4 sockets it will not use
/// soon: half of them (rounded up) are closed and counted as given back,
/// and the probe asks again at once, again and again until none is left;
/// then it waits, and fails naming the error only after a probe timeout
/// with nothing given back and nothing of the round in flight.
#[test]
fn a_task_out_of_descriptors_closes_the_other_familys_spares_before_it_waits() {
    let shared = by_hand(vec![host(1), "::1".parse().expect("IPv6")]);
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).expect("epoll");
    let mut f = Flights::new(&shared, &epoll, [sockets(Family::Ipv4, 5), Vec::new()], 2);
    let (mut next, mut started) = (Some(1), 0);
    let mut closed = Vec::new();
    for _ in 0..3 {
        let before = Instant::now();
        let held = f.took(Family::Ipv6, emfile(), &mut next, &mut started);
        assert!(
            matches!(held, Some(Held::Until(t)) if t >= before && t <= Instant::now()),
            "asked again at once: {held:?}"
        );
        closed.push(shared.given_back.load(Ordering::Relaxed));
        assert_eq!(f.spare[Family::Ipv6.index()].len(), 0);
    }
    // 5 spare: 3 closed, then 1, then the last.
    assert_eq!(closed, [3, 4, 5]);
    assert!(
        f.held_since.is_some(),
        "a wait for descriptors, as the round reports it"
    );
    assert!(f.spare[Family::Ipv4.index()].is_empty());
    assert_eq!((next, started), (Some(1), 0), "the probe waits, not failed");
    assert!(f.done.is_empty(), "{:?}", f.done);
    // Nothing left to close: it waits, asking again every SHORT_RETRY.
    let before = Instant::now();
    let held = f.took(Family::Ipv6, emfile(), &mut next, &mut started);
    assert!(
        matches!(held, Some(Held::Until(t)) if t >= before + SHORT_RETRY),
        "{held:?}"
    );
    assert_eq!((next, started), (Some(1), 0));
    // A timeout later with nothing given back: it fails, naming why.
    f.short = Some((Instant::now() - shared.timeout, 5));
    assert_eq!(
        f.took(Family::Ipv6, emfile(), &mut next, &mut started),
        None
    );
    assert_eq!((next, started), (None, 1));
    assert!(
        failed_making_its_socket(&f.done, 1, "Too many open files"),
        "{:?}",
        f.done
    );
}

/// Out of descriptors with nothing of its own in flight, a task keeps
/// asking while another task's probes are in flight, or while the round
/// keeps giving sockets back, however long that takes: each gives its
/// socket back within a timeout.
#[test]
fn a_task_out_of_descriptors_waits_while_the_round_may_give_some_back() {
    let shared = by_hand(vec![host(1)]);
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).expect("epoll");
    let mut f = Flights::new(&shared, &epoll, [Vec::new(), Vec::new()], 1);
    let (mut next, mut started) = (Some(0), 0);
    let long_ago = Instant::now() - 3 * shared.timeout;
    // Another task's probes in flight.
    shared.in_flight.store(2, Ordering::Relaxed);
    f.short = Some((long_ago, 0));
    let held = f.took(Family::Ipv4, emfile(), &mut next, &mut started);
    assert!(matches!(held, Some(Held::Until(_))), "{held:?}");
    assert!(
        f.short.is_some_and(|(since, _)| since > long_ago),
        "the wait starts again"
    );
    // None in flight, but sockets given back since it last looked.
    shared.in_flight.store(0, Ordering::Relaxed);
    shared.given_back.store(7, Ordering::Relaxed);
    f.short = Some((long_ago, 6));
    let held = f.took(Family::Ipv4, emfile(), &mut next, &mut started);
    assert!(matches!(held, Some(Held::Until(_))), "{held:?}");
    assert_eq!(f.short.map(|(_, seen)| seen), Some(7));
    assert_eq!((next, started), (Some(0), 0), "still waiting");
    assert!(f.done.is_empty(), "{:?}", f.done);
}

/// A socket error other than a want of descriptors fails the waiting probe
/// at once, naming it, even with the task's probes in flight (they give
/// back no permission); a want of descriptors then waits for one of them
/// to end.
#[test]
fn a_socket_error_other_than_descriptors_fails_at_once_with_probes_in_flight() {
    let shared = by_hand(vec![host(1), host(1)]);
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).expect("epoll");
    let mut f = Flights::new(&shared, &epoll, [Vec::new(), Vec::new()], 2);
    // Three probes in flight, as `start` counts them.
    f.busy = 3;
    shared.in_flight.store(3, Ordering::Relaxed);
    let (mut next, mut started) = (Some(0), 0);
    let denied = Err(io::Error::from_raw_os_error(libc::EACCES));
    assert_eq!(f.took(Family::Ipv4, denied, &mut next, &mut started), None);
    assert_eq!((next, started), (None, 1));
    assert_eq!(f.held_since, None, "no wait");
    assert!(
        failed_making_its_socket(&f.done, 0, "Permission denied"),
        "{:?}",
        f.done
    );
    next = Some(1);
    let held = f.took(Family::Ipv4, emfile(), &mut next, &mut started);
    assert_eq!(held, Some(Held::InFlight(3)));
    assert_eq!((next, started), (Some(1), 1), "waits for a probe to end");
    f.busy = 0;
    shared.in_flight.store(0, Ordering::Relaxed);
}

/// A task whose share is all held, partly by spare sockets of the other
/// family, closes half of those to make room for a probe of this one;
/// with room in its share it closes none.
#[test]
fn a_full_share_makes_room_from_the_other_familys_spares() {
    let shared = by_hand(vec![host(1)]);
    let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).expect("epoll");
    let mut f = Flights::new(&shared, &epoll, [sockets(Family::Ipv4, 3), Vec::new()], 1);
    assert_eq!(f.room_for(Family::Ipv6), 5, "room left: nothing closed");
    assert_eq!(f.spare[Family::Ipv4.index()].len(), 3);
    f.spare[Family::Ipv4.index()].extend(sockets(Family::Ipv4, 5));
    assert_eq!(f.room_for(Family::Ipv6), 4, "half the 8 spare closed");
    assert_eq!(shared.given_back.load(Ordering::Relaxed), 4);
    // Its own family's spares are never closed for it.
    f.spare[Family::Ipv4.index()].extend(sockets(Family::Ipv4, 4));
    assert_eq!(f.room_for(Family::Ipv4), 0);
    assert_eq!(f.spare[Family::Ipv4.index()].len(), 8);
    assert_eq!(shared.given_back.load(Ordering::Relaxed), 4);
}
