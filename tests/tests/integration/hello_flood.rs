//! The hello server (:4240) under a flood of idle connections: the node's
//! own server (`probe::hello::serve_with`, its real limits) listens in namespace
//! `b`; namespace `a` floods it from many source addresses, re-opening
//! every connection the server closes, while a real peer's `GET /hello`
//! (from a source of its own) must still be answered within 1 s. Each
//! flood connection sends one byte, a request head begun and never
//! finished: the node's listener accepts a connection when its first bytes
//! arrive, so one that sends nothing waits in the kernel for a second and
//! takes no place before then.
//!
//! - 16 IPv4 sources (198.18.0.16-31) holding 256 idle connections each fill
//!   the server (16 × 256 = `MAX_CONNECTIONS`): the real request is
//!   answered because the oldest connection still waiting for its request
//!   head makes room.
//! - 16 addresses of one IPv6 /64 (`2001:2::1:k`) trying 256 each: the /64
//!   counts as one source and holds at most `PER_SOURCE` connections, its
//!   oldest idle one closed for each new one; peers from 198.18.0.1,
//!   another /64 (`2001:2:0:1::1`) and the flood's own /64 (`2001:2::1`,
//!   a host sharing it with the flood) are answered, the last also when
//!   its request comes 300 ms after its connect, while the flood turns
//!   its /64's share over several times.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use health_agent::{
    probe::hello::{HEAD_TIMEOUT, MAX_CONNECTIONS, PER_SOURCE},
    sys::netlink::in_netns,
};
use health_tests::topology::{A_IF, A_IP, A_IP6, B_IF, B_IP, B_IP6, TwoNodes};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpSocket,
};
use tokio_util::sync::CancellationToken;

const PORT: u16 = 4240;
const SOURCES: u8 = 16;
/// Connections each flooding address keeps open.
const EACH: usize = 256;
/// Past this age an open flood connection counts as held by the server
/// (one refused is closed within milliseconds): short enough to see the
/// whole flood held at once between two head timeouts.
const HELD_AFTER: Duration = Duration::from_millis(250);
/// The same for counting one /64's connections: longer, so that one the
/// kernel queued while the server was busy, refused once accepted, is not
/// taken for held.
const HELD_AFTER_STRICT: Duration = Duration::from_secs(1);
/// Connections of a refused source still in the kernel's accept queue
/// past [`HELD_AFTER_STRICT`] when the server is slow to accept (a loaded
/// runner): a /64 counted by full addresses would hold thousands.
const QUEUED: usize = 8;
/// How long real requests are sent through the flood: more than two head
/// timeouts, so the flood's connections are timed out and re-opened meanwhile.
const THROUGH: Duration = Duration::from_secs(5);

/// How long after its connect a late peer writes its request.
const LATE: Duration = Duration::from_millis(300);

/// One flood at a time: each opens thousands of connections on a shared
/// two-core runner.
static SERIAL: Mutex<()> = Mutex::new(());

fn flood_ip(k: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 0, 16 + k)
}

fn flood_ip6(k: u8) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 1, u16::from(k))
}

/// A real peer's IPv6 source, in a /64 of its own.
const PEER_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, 1);

/// The namespaces, the server's runtime (serving in `b`), and a client
/// runtime whose threads live in `a`.
struct Lab {
    /// The namespaces (they go when dropped, and the server with them).
    nodes: TwoNodes,
    _server: tokio::runtime::Runtime,
    client: tokio::runtime::Runtime,
}

impl Lab {
    fn new() -> Self {
        raise_fd_limit();
        let nodes = TwoNodes::new();
        nodes.add_ipv6();
        in_netns(Some(&nodes.a), |nl| async move {
            for k in 0..SOURCES {
                nl.add_address(A_IF, flood_ip(k), 24).await?;
                nl.add_address(A_IF, flood_ip6(k), 64).await?;
            }
            nl.add_address(A_IF, PEER_IP6, 64).await
        })
        .expect("the flood's addresses");
        in_netns(Some(&nodes.b), |nl| async move {
            nl.replace_route(PEER_IP6, 64, B_IF, Some(A_IP6)).await
        })
        .expect("a route back to the peer's /64");
        let server = runtime("server");
        // `listen` raises the namespace's `somaxconn` for its one call, as
        // the agent does: a flood of 4,096 connections re-opened at once
        // after a head timeout would otherwise fill the kernel's default
        // queue whenever the server is slow to accept (a loaded runner),
        // and a SYN dropped by a full queue is retried only after a second.
        let somaxconn = || {
            nodes
                .b
                .run(|| std::fs::read_to_string("/proc/sys/net/core/somaxconn"))
                .expect("enter netns b")
                .expect("read somaxconn")
        };
        let before = somaxconn();
        let listener = nodes
            .b
            .run(|| health_agent::probe::hello::listen(PORT))
            .expect("enter netns b")
            .expect("listen on :4240");
        assert_eq!(somaxconn(), before, "somaxconn written back after listen");
        server.spawn(async move {
            health_agent::probe::hello::serve_with(
                tokio::net::TcpListener::from_std(listener).expect("listener"),
                CancellationToken::new(),
                health_agent::probe::hello::Limits::NODE,
                None,
            )
            .await;
        });
        // Worker threads inherit the namespace of the thread that starts
        // them: every socket the client runtime opens is in `a`.
        let client = nodes.a.run(|| runtime("client")).expect("enter netns a");
        Self {
            nodes,
            _server: server,
            client,
        }
    }
}

fn runtime(name: &str) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name(name)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Thousands of sockets on each side, in this one process: the soft
/// limit raised to the hard one.
fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    let needed = 3 * MAX_CONNECTIONS as u64;
    assert!(
        hard >= needed,
        "RLIMIT_NOFILE's hard limit {hard} is below the {needed} descriptors this test needs"
    );
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).expect("raise RLIMIT_NOFILE");
    }
}

/// The flood's connections: held now (open past the test's threshold),
/// now, and the most held at once.
#[derive(Default)]
struct Gauge {
    held: AtomicUsize,
    max_held: AtomicUsize,
    opened: AtomicUsize,
    /// Held connections the server closed without an answer (a timed-out
    /// one gets a 408): evicted to make room for a newer connection.
    evicted: AtomicUsize,
}

/// Keeps one idle connection from `src` open until `stop`: connects, sends
/// one byte, and when the server closes it opens another (after a second
/// when it was refused at once, so a refused source does not spin).
async fn hold(
    src: IpAddr,
    dst: SocketAddr,
    held_after: Duration,
    gauge: Arc<Gauge>,
    stop: CancellationToken,
) {
    let mut buf = [0u8; 256];
    while !stop.is_cancelled() {
        let socket = match src {
            IpAddr::V4(_) => TcpSocket::new_v4(),
            IpAddr::V6(_) => TcpSocket::new_v6(),
        }
        .expect("a socket");
        socket.bind(SocketAddr::new(src, 0)).expect("bind");
        let connected = tokio::select! {
            () = stop.cancelled() => return,
            c = tokio::time::timeout(Duration::from_secs(3), socket.connect(dst)) => c,
        };
        let Ok(Ok(mut stream)) = connected else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        if stream.write_all(b"G").await.is_err() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        gauge.opened.fetch_add(1, Ordering::Relaxed);
        let opened = Instant::now();
        let held = tokio::select! {
            () = stop.cancelled() => return,
            _ = stream.read(&mut buf) => false,
            () = tokio::time::sleep(held_after) => true,
        };
        if held {
            let now = gauge.held.fetch_add(1, Ordering::Relaxed) + 1;
            gauge.max_held.fetch_max(now, Ordering::Relaxed);
            // Until the server closes it: a 408 after the head timeout,
            // or nothing when evicted for a newer connection.
            let mut answer = 0;
            let stopped = tokio::select! {
                () = stop.cancelled() => true,
                () = async {
                    while let Ok(n) = stream.read(&mut buf).await && n > 0 {
                        answer += n;
                    }
                } => false,
            };
            gauge.held.fetch_sub(1, Ordering::Relaxed);
            if !stopped && answer == 0 {
                gauge.evicted.fetch_add(1, Ordering::Relaxed);
            }
        }
        let pause = if opened.elapsed() < held_after {
            Duration::from_secs(1)
        } else {
            Duration::from_millis(10)
        };
        tokio::time::sleep(pause).await;
    }
}

/// `GET /hello` from `src` to `dst`, written `late` after the connect
/// completes: the time to a complete 200 answer, `late` left out.
/// Blocking, on a thread of its own in namespace `a` (see
/// [`flood_and_probe`]), as a prober writes its request the moment its
/// connect completes: from the flood's runtime, thousands of the flood's
/// tasks would run between the two, leaving the connection idle long
/// enough for the flood to turn it over, which no prober does.
fn get_hello(src: IpAddr, dst: SocketAddr, late: Duration) -> Duration {
    use std::io::{Read as _, Write as _};
    let start = Instant::now();
    let exchange = || -> std::io::Result<Vec<u8>> {
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(dst),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )?;
        socket.bind(&SocketAddr::new(src, 0).into())?;
        socket.connect_timeout(&dst.into(), Duration::from_secs(1))?;
        let mut s = std::net::TcpStream::from(socket);
        std::thread::sleep(late);
        s.write_all(b"GET /hello HTTP/1.1\r\nHost: health\r\n\r\n")?;
        s.set_read_timeout(Some(
            (Duration::from_secs(1) + late)
                .saturating_sub(start.elapsed())
                .max(Duration::from_millis(1)),
        ))?;
        let mut out = Vec::new();
        s.read_to_end(&mut out)?;
        Ok(out)
    };
    let out = exchange().unwrap_or_else(|e| panic!("GET http://{dst}/hello from {src}: {e}"));
    let took = start.elapsed().saturating_sub(late);
    assert!(
        out.starts_with(b"HTTP/1.1 200 OK"),
        "GET /hello from {src}: {}",
        String::from_utf8_lossy(&out)
    );
    took
}

/// When the flood is on: so many of its connections held at once, or so
/// many opened (a flood turning over a share it oversubscribes holds its
/// connections too briefly to count as held).
#[derive(Clone, Copy)]
enum Filled {
    Held(usize),
    Opened(usize),
}

impl Filled {
    fn reached(self, gauge: &Gauge) -> bool {
        match self {
            Self::Held(n) => gauge.held.load(Ordering::Relaxed) >= n,
            Self::Opened(n) => gauge.opened.load(Ordering::Relaxed) >= n,
        }
    }
}

/// Floods `dst` from `sources` (`EACH` connections each, held past
/// `held_after`) and, once `filled`, sends real requests from `peers`
/// every 100 ms for [`THROUGH`], each written so long after its connect.
/// Returns the slowest answer and the gauge.
fn flood_and_probe(
    lab: &Lab,
    sources: &[IpAddr],
    dst: SocketAddr,
    peers: &[(IpAddr, SocketAddr, Duration)],
    held_after: Duration,
    filled: Filled,
) -> (Duration, Arc<Gauge>) {
    let gauge = Arc::new(Gauge::default());
    let stop = CancellationToken::new();
    let _stop_on_exit = stop.clone().drop_guard();
    for &src in sources {
        for _ in 0..EACH {
            lab.client
                .spawn(hold(src, dst, held_after, gauge.clone(), stop.clone()));
        }
    }
    let began = Instant::now();
    while !filled.reached(&gauge) {
        assert!(
            began.elapsed() < Duration::from_secs(20),
            "the flood holds only {} connections (opened {}, evicted {})",
            gauge.held.load(Ordering::Relaxed),
            gauge.opened.load(Ordering::Relaxed),
            gauge.evicted.load(Ordering::Relaxed)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "flood: {} held, {} evicted after {:?}",
        gauge.held.load(Ordering::Relaxed),
        gauge.evicted.load(Ordering::Relaxed),
        began.elapsed()
    );
    let started = Instant::now();
    let mut took = Vec::new();
    while started.elapsed() < THROUGH {
        for &(src, to, late) in peers {
            let t = lab
                .nodes
                .a
                .run(|| get_hello(src, to, late))
                .expect("enter netns a");
            took.push(t);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    took.sort();
    let slowest = took.last().copied().unwrap_or_default();
    println!(
        "{} real requests answered through the flood: median {:?}, slowest {slowest:?}; \
         the flood opened {} connections, held at most {} at once, {} evicted",
        took.len(),
        took.get(took.len() / 2).copied().unwrap_or_default(),
        gauge.opened.load(Ordering::Relaxed),
        gauge.max_held.load(Ordering::Relaxed),
        gauge.evicted.load(Ordering::Relaxed)
    );
    (slowest, gauge)
}

#[test]
fn sixteen_sources_holding_256_idle_connections_each_do_not_stop_a_real_hello() {
    let _one_flood = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let lab = Lab::new();
    let dst = SocketAddr::from((B_IP, PORT));
    let sources: Vec<IpAddr> = (0..SOURCES).map(|k| IpAddr::V4(flood_ip(k))).collect();
    assert_eq!(
        sources.len() * EACH,
        MAX_CONNECTIONS,
        "the flood fills the server"
    );
    // Wait until the server is (nearly) full: a few of its slots may be
    // between a 408 and the flood's next connection, or not yet counted.
    let (slowest, gauge) = flood_and_probe(
        &lab,
        &sources,
        dst,
        &[
            (IpAddr::V4(A_IP), dst, Duration::ZERO),
            (
                IpAddr::V6(PEER_IP6),
                SocketAddr::from((B_IP6, PORT)),
                Duration::ZERO,
            ),
        ],
        HELD_AFTER,
        Filled::Held(MAX_CONNECTIONS - 64),
    );
    assert!(slowest < Duration::from_secs(1), "{slowest:?}");
    // The flood did fill the server, kept going past the head timeout
    // (every connection re-opened at least once), and the real requests
    // were let in by evicting its oldest idle connections.
    assert!(gauge.max_held.load(Ordering::Relaxed) >= MAX_CONNECTIONS - 64);
    assert!(gauge.evicted.load(Ordering::Relaxed) >= 1);
    assert!(
        gauge.opened.load(Ordering::Relaxed) >= 2 * MAX_CONNECTIONS,
        "{} opened",
        gauge.opened.load(Ordering::Relaxed)
    );
    assert!(THROUGH > HEAD_TIMEOUT * 2);
}

#[test]
fn one_ipv6_64_holds_one_sources_share_and_does_not_stop_a_real_hello() {
    let _one_flood = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let lab = Lab::new();
    let dst6 = SocketAddr::from((B_IP6, PORT));
    let sources: Vec<IpAddr> = (0..SOURCES).map(|k| IpAddr::V6(flood_ip6(k))).collect();
    let (slowest, gauge) = flood_and_probe(
        &lab,
        &sources,
        dst6,
        &[
            (IpAddr::V6(PEER_IP6), dst6, Duration::ZERO),
            (IpAddr::V6(A_IP6), dst6, Duration::ZERO),
            // Accepted on connect, its connection would be the oldest
            // idle one of its /64 within about 70 ms, and closed for the
            // flood's next.
            (IpAddr::V6(A_IP6), dst6, LATE),
            (
                IpAddr::V4(A_IP),
                SocketAddr::from((B_IP, PORT)),
                Duration::ZERO,
            ),
        ],
        HELD_AFTER_STRICT,
        Filled::Opened(4 * PER_SOURCE),
    );
    assert!(slowest < Duration::from_secs(1), "{slowest:?}");
    // 16 addresses trying 256 each: the /64 is one source, held to its
    // share (by full addresses it would hold all 4,096), and turned over:
    // a host of the same /64 is answered in the place of the flood's
    // oldest idle connection.
    let max_held = gauge.max_held.load(Ordering::Relaxed);
    assert!(
        max_held <= PER_SOURCE + QUEUED,
        "one /64 held {max_held} connections at once (its share: {PER_SOURCE})"
    );
}
