//! The metrics listener over loopback: real sockets, the agent's router.

use std::time::{Duration, Instant};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
    sync::watch,
};

use axum::routing::get as get_route;

use super::*;
use crate::{
    membership::published::Nodes,
    probe::{ProbeConfig, Prober},
    supervisor::Health,
};

/// How much earlier than its timeout a connection may be seen closed
/// (timers and clocks of the two ends).
const EARLY: Duration = Duration::from_millis(50);

/// The agent's router over an empty prober, answering `allowed` too.
fn agent_router(allowed: &str) -> Router {
    let (_, probers) = watch::channel(Prober::new(ProbeConfig::default()));
    let metrics = Arc::new(Metrics::of_probers(probers.clone(), false));
    let api = ApiState::new(
        crate::endpoint::shared_view(),
        probers,
        Nodes::new("none".into()),
        Health::default(),
        Duration::from_secs(1),
    );
    router(metrics, api, allowed.parse().expect("valid names"))
}

/// Serves the agent's router on 127.0.0.1 with `limits`.
async fn listening(limits: Limits) -> (SocketAddr, CancellationToken) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let stop = CancellationToken::new();
    tokio::spawn(serve_with(
        listener,
        agent_router("health.example,proxy.example:8080"),
        limits,
        stop.clone(),
    ));
    (addr, stop)
}

/// Sends `request` on a new connection; the whole answer.
async fn exchange(addr: SocketAddr, request: &str) -> String {
    String::from_utf8_lossy(&exchange_bytes(addr, request).await).into_owned()
}

/// Sends `request` on a new connection; the whole answer's bytes.
async fn exchange_bytes(addr: SocketAddr, request: &str) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(request.as_bytes()).await.expect("send");
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
        .await
        .expect("answered and closed")
        .expect("read");
    out
}

fn get(path: &str, host: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
}

/// How long until the server closes `s` (reading and dropping whatever it
/// sends), at most `within`; what it sent.
async fn closed_after(s: &mut TcpStream, within: Duration) -> (Duration, String) {
    let start = Instant::now();
    let mut out = Vec::new();
    let read = tokio::time::timeout(within, s.read_to_end(&mut out)).await;
    assert!(
        read.is_ok(),
        "still open after {within:?}: {}",
        String::from_utf8_lossy(&out)
    );
    (start.elapsed(), String::from_utf8_lossy(&out).into_owned())
}

#[tokio::test]
async fn foreign_hosts_are_refused_and_its_own_served() {
    let (addr, stop) = listening(Limits::LISTENER).await;
    let port = addr.port();
    for host in [
        format!("127.0.0.1:{port}"),
        "127.0.0.1".to_owned(),
        "localhost".to_owned(),
        format!("localhost:{port}"),
        "health.example".to_owned(),
        format!("Health.Example:{port}"),
        "proxy.example:8080".to_owned(),
    ] {
        let out = exchange(addr, &get("/metrics", &host)).await;
        assert!(out.starts_with("HTTP/1.1 200"), "{host}: {out}");
        // Decompressed as it is read, for a client that does not take
        // gzip: chunked, the text's end in the last chunk.
        assert!(out.ends_with("# EOF\n\r\n0\r\n\r\n"), "{host}: {out}");
    }
    // A rebound name, on every route (the page, the API, and a path
    // that does not exist): refused, naming the host.
    for path in ["/metrics", "/", "/api/v1/status", "/nothing-here"] {
        let host = format!("rebound.example:{port}");
        let out = exchange(addr, &get(path, &host)).await;
        assert!(out.starts_with("HTTP/1.1 421"), "{path}: {out}");
        assert!(
            out.contains(&format!("host \"{host}\" is not served here")),
            "{out}"
        );
    }
    for host in [
        "proxy.example".to_owned(),
        format!("health.example:{}", port.wrapping_add(1)),
        format!("127.0.0.2:{port}"),
    ] {
        let out = exchange(addr, &get("/metrics", &host)).await;
        assert!(out.starts_with("HTTP/1.1 421"), "{host}: {out}");
    }
    // The request line's authority wins over the header.
    let out = exchange(
        addr,
        &format!(
            "GET http://rebound.example/metrics HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\
             Connection: close\r\n\r\n"
        ),
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 421"), "{out}");
    let out = exchange(addr, "GET /metrics HTTP/1.0\r\n\r\n").await;
    assert!(out.starts_with("HTTP/1.0 400"), "{out}");
    assert!(out.contains("a Host header is required"), "{out}");
    let out = exchange(
        addr,
        "GET /metrics HTTP/1.1\r\nHost: localhost\r\nHost: rebound.example\r\n\
         Connection: close\r\n\r\n",
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    assert!(out.contains("the Host header is given 2 times"), "{out}");
    // A malformed host is named, with where it came from.
    let out = exchange(
        addr,
        "GET http://user@localhost/metrics HTTP/1.1\r\nHost: localhost\r\n\
         Connection: close\r\n\r\n",
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    assert!(
        out.contains("the request line's host \"user@localhost\" is not one host[:port]"),
        "{out}"
    );
    let out = exchange(addr, &get("/metrics", "localhost:x")).await;
    assert!(
        out.contains("the Host header \"localhost:x\" is not one host[:port]"),
        "{out}"
    );
    stop.cancel();
}

#[tokio::test]
async fn slow_heads_and_idle_keep_alive_connections_are_closed_after_the_header_timeout() {
    let header = Duration::from_millis(400);
    let (addr, stop) = listening(Limits {
        header_timeout: header,
        idle_timeout: Duration::from_secs(30),
        max_connections: 64,
        ..Limits::LISTENER
    })
    .await;
    // Nothing sent.
    let mut silent = TcpStream::connect(addr).await.expect("connect");
    let (after, _) = closed_after(&mut silent, Duration::from_secs(3)).await;
    assert!(after >= header.saturating_sub(EARLY), "{after:?}");
    // A head trickled a byte every 50 ms: still closed at the timeout.
    let mut slow = TcpStream::connect(addr).await.expect("connect");
    let start = Instant::now();
    let head = format!(
        "GET /metrics HTTP/1.1\r\nHost: localhost\r\nX-Slow: {}",
        "a".repeat(100)
    );
    for b in head.as_bytes() {
        if slow.write_all(&[*b]).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, sent) = closed_after(&mut slow, Duration::from_secs(3)).await;
    let after = start.elapsed();
    assert!(
        after >= header.saturating_sub(EARLY) && after < Duration::from_secs(3),
        "{after:?}"
    );
    assert!(
        sent.is_empty() || sent.starts_with("HTTP/1.1 408"),
        "{sent}"
    );
    // Kept alive after an answer, then idle: closed at the timeout too.
    let mut kept = TcpStream::connect(addr).await.expect("connect");
    kept.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .expect("send");
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !answer.ends_with(b"# EOF\n\r\n0\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(2), kept.read(&mut buf))
            .await
            .expect("answered")
            .expect("read");
        assert!(n > 0, "closed before the answer");
        answer.extend_from_slice(&buf[..n]);
    }
    let (after, rest) = closed_after(&mut kept, Duration::from_secs(3)).await;
    assert!(rest.is_empty(), "{rest}");
    assert!(after >= header.saturating_sub(EARLY), "{after:?}");
    stop.cancel();
}

#[tokio::test]
async fn a_connection_moving_no_byte_is_closed_after_the_idle_timeout() {
    let idle = Duration::from_millis(300);
    let (addr, stop) = listening(Limits {
        header_timeout: Duration::from_secs(30),
        idle_timeout: idle,
        max_connections: 64,
        ..Limits::LISTENER
    })
    .await;
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let (after, sent) = closed_after(&mut s, Duration::from_secs(3)).await;
    assert!(sent.is_empty(), "{sent}");
    assert!(
        after >= idle.saturating_sub(EARLY) && after < Duration::from_secs(2),
        "{after:?}"
    );
    stop.cancel();
}

/// Serves the agent's router, and `/slow`, answered after 30 s, on
/// 127.0.0.1 with `limits`.
async fn listening_with_slow(limits: Limits) -> (SocketAddr, CancellationToken) {
    let router = agent_router("localhost").route(
        "/slow",
        get_route(|| async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            "late\n"
        }),
    );
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let stop = CancellationToken::new();
    tokio::spawn(serve_with(listener, router, limits, stop.clone()));
    (addr, stop)
}

/// A connection to `addr` from loopback address `ip`.
async fn from(ip: [u8; 4], addr: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::from((ip, 0)))
        .expect("bind a loopback address");
    socket.connect(addr).await.expect("connect")
}

/// A connection from `ip` whose request (`/slow`) is being answered.
async fn busy_from(ip: [u8; 4], addr: SocketAddr) -> TcpStream {
    let mut s = from(ip, addr).await;
    s.write_all(get("/slow", "localhost").as_bytes())
        .await
        .expect("send");
    s
}

/// Whether the server has closed `s` (within 500 ms).
async fn is_closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 64];
    matches!(
        tokio::time::timeout(Duration::from_millis(500), s.read(&mut b)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test]
async fn past_the_cap_a_connection_takes_an_idle_ones_place_not_a_busy_ones() {
    let cap = 4;
    let (addr, stop) = listening_with_slow(Limits {
        header_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(30),
        max_connections: cap,
        ..Limits::LISTENER
    })
    .await;
    let mut idle = Vec::new();
    for _ in 0..cap {
        idle.push(TcpStream::connect(addr).await.expect("connect"));
        // Accepted in this order.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let out = exchange(addr, &get("/metrics", "localhost")).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(
        is_closed(&mut idle[0]).await,
        "the oldest idle one made room"
    );
    drop(idle);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Four sources with a request each being answered: a fifth source,
    // holding no more than they, is turned away; they are not closed.
    let mut busy = Vec::new();
    for ip in 2..=5 {
        busy.push(busy_from([127, 0, 0, ip], addr).await);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut past = from([127, 0, 0, 6], addr).await;
    let _ = past
        .write_all(get("/metrics", "localhost").as_bytes())
        .await;
    let (_, out) = closed_after(&mut past, Duration::from_secs(2)).await;
    assert!(out.is_empty(), "served past the cap: {out}");
    for s in &mut busy {
        assert!(!is_closed(s).await, "a busy connection was closed");
    }
    stop.cancel();
}

/// Four clients each hold their share with answers they have not finished
/// reading, which fills the listener: Prometheus, holding none, is still
/// served, in the place of the oldest of them.
#[tokio::test]
async fn clients_holding_the_listener_with_slow_answers_give_way_to_prometheus() {
    let (addr, stop) = listening_with_slow(Limits {
        max_connections: 8,
        per_source: 2,
        ..Limits::LISTENER
    })
    .await;
    let mut slow = Vec::new();
    for ip in [2, 2, 3, 3, 4, 4, 5, 5] {
        slow.push(busy_from([127, 0, 0, ip], addr).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut prometheus = from([127, 0, 0, 1], addr).await;
    prometheus
        .write_all(get("/metrics", "localhost").as_bytes())
        .await
        .expect("send");
    let (_, out) = closed_after(&mut prometheus, Duration::from_secs(2)).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(
        is_closed(&mut slow[0]).await,
        "the oldest slow one made room"
    );
    for s in &mut slow[1..] {
        assert!(!is_closed(s).await, "only one was closed");
    }
    stop.cancel();
}

#[tokio::test]
async fn waiting_for_a_round_is_left_to_the_socket() {
    let (addr, stop) = listening(Limits::LISTENER).await;
    let host = format!("127.0.0.1:{}", addr.port());
    let out = exchange(addr, &get("/api/v1/status?summary=true", &host)).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    // A held request would keep one of the listener's few slots.
    let t0 = Instant::now();
    let out = exchange(
        addr,
        &get("/api/v1/status?summary=true&after=0&wait=30s", &host),
    )
    .await;
    assert!(out.starts_with("HTTP/1.1 400"), "{out}");
    assert!(out.contains("answered on the agent's socket only"), "{out}");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    stop.cancel();
}

/// `method` of `path` for `localhost`, with `headers` (each ending in
/// CRLF), on a connection of its own.
fn request(method: &str, path: &str, headers: &str) -> String {
    format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\n{headers}Connection: close\r\n\r\n")
}

/// The head of an answer, lower-cased, and its body.
fn split(out: &str) -> (String, &str) {
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((out, ""));
    (head.to_ascii_lowercase(), body)
}

#[tokio::test]
async fn unknown_paths_and_methods_are_answered_naming_them() {
    let (addr, stop) = listening(Limits::LISTENER).await;
    let cases = [
        ("GET", "/nothing-here", "404", "no such page: /nothing-here"),
        (
            "GET",
            "/api/v1/nope",
            "404",
            "\"no such API path: /api/v1/nope\"",
        ),
        // The socket's one write is not served here at all.
        (
            "PUT",
            "/api/v1/status/probe",
            "404",
            "\"no such API path: /api/v1/status/probe\"",
        ),
        (
            "POST",
            "/api/v1/status",
            "405",
            "\"POST is not served at /api/v1/status\"",
        ),
        (
            "POST",
            "/metrics",
            "405",
            "POST is not served at /metrics: the listener is read-only",
        ),
    ];
    for (method, path, code, says) in cases {
        let out = exchange(addr, &request(method, path, "")).await;
        let (head, body) = split(&out);
        assert!(
            head.starts_with(&format!("http/1.1 {code}")),
            "{method} {path}: {out}"
        );
        assert!(body.contains(says), "{method} {path}: {out}");
        let json = path.starts_with("/api");
        assert_eq!(
            head.contains("content-type: application/json"),
            json,
            "{method} {path}: {out}"
        );
        assert!(
            head.contains("x-content-type-options: nosniff"),
            "{method} {path}: {out}"
        );
    }
    stop.cancel();
}

/// Every answer says it is not to be sniffed, a refused host's too (whose
/// echo of the host is cut short); the API's are stored by no cache, the
/// page's may be (revalidated).
#[tokio::test]
async fn answers_are_never_sniffed_and_the_apis_never_stored() {
    let (addr, stop) = listening(Limits::LISTENER).await;
    for (path, host, code, no_store) in [
        ("/api/v1/status", "localhost", "200", true),
        ("/metrics", "localhost", "200", false),
        ("/", "localhost", "200", false),
        ("/", &"x".repeat(500), "421", false),
    ] {
        let out = exchange(addr, &get(path, host)).await;
        let (head, body) = split(&out);
        assert!(
            head.starts_with(&format!("http/1.1 {code}")),
            "{path}: {out}"
        );
        assert!(
            head.contains("x-content-type-options: nosniff"),
            "{path}: {head}"
        );
        assert_eq!(
            head.contains("cache-control: no-store"),
            no_store,
            "{path}: {head}"
        );
        if code == "421" {
            assert!(body.len() < 400, "{path}: {} bytes", body.len());
        }
    }
    stop.cancel();
}

#[tokio::test]
async fn the_status_and_the_metrics_are_gzipped_only_for_a_client_that_takes_gzip() {
    let (addr, stop) = listening(Limits::LISTENER).await;
    // How weights are read is `util::gzip`'s table; here, that every
    // answer follows it.
    for (accept, gzipped) in [("br, gzip;q=0.5", true), ("gzip;q=0", false), ("", false)] {
        let header = if accept.is_empty() {
            String::new()
        } else {
            format!("Accept-Encoding: {accept}\r\n")
        };
        // With nothing to filter, a query is answered as published too;
        // the metrics as the status.
        for path in ["/api/v1/status", "/api/v1/status?summary=false", "/metrics"] {
            let out = exchange(addr, &request("GET", path, &header)).await;
            let (head, _) = split(&out);
            assert!(head.starts_with("http/1.1 200"), "{accept:?} {path}: {out}");
            assert_eq!(
                head.contains("content-encoding: gzip"),
                gzipped,
                "{accept:?} {path}: {head}"
            );
            assert!(head.contains("vary: accept-encoding"), "{accept:?}: {head}");
        }
        // A HEAD of the metrics: the same head, no body.
        let out = exchange(addr, &request("HEAD", "/metrics", &header)).await;
        let (head, body) = split(&out);
        assert!(head.starts_with("http/1.1 200"), "{accept:?}: {out}");
        assert_eq!(head.contains("content-encoding: gzip"), gzipped, "{head}");
        assert!(
            head.contains("content-type: application/openmetrics-text"),
            "{head}"
        );
        assert!(!head.contains("content-length"), "{head}");
        assert!(body.is_empty(), "{accept:?}: {out}");
    }
    stop.cancel();
}

/// `GET /metrics` over HTTP/1.0 (the body ends with the connection),
/// with `headers`: the head and the body's bytes.
async fn metrics_over_http_1_0(addr: SocketAddr, headers: &str) -> (String, Vec<u8>) {
    let request = format!("GET /metrics HTTP/1.0\r\nHost: localhost\r\n{headers}\r\n");
    let out = exchange_bytes(addr, &request).await;
    let end = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head");
    let head = String::from_utf8_lossy(&out[..end]).to_ascii_lowercase();
    (head, out[end + 4..].to_vec())
}

#[tokio::test]
async fn the_metrics_gzipped_and_plain_are_the_same_text() {
    use std::io::Read as _;
    let (addr, stop) = listening(Limits::LISTENER).await;
    let (head, gz) = metrics_over_http_1_0(addr, "Accept-Encoding: gzip\r\n").await;
    assert!(head.contains("content-encoding: gzip"), "{head}");
    assert!(
        head.contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    let mut unzipped = String::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_string(&mut unzipped)
        .expect("gzip");
    let (head, plain) = metrics_over_http_1_0(addr, "").await;
    assert!(!head.contains("content-encoding"), "{head}");
    assert!(
        head.contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    assert_eq!(unzipped, String::from_utf8(plain).expect("UTF-8"));
    assert!(unzipped.contains("# TYPE health_"), "{unzipped}");
    assert!(unzipped.ends_with("# EOF\n"), "{unzipped}");
    stop.cancel();
}

#[tokio::test]
async fn one_client_holds_its_share_of_connections_and_no_more() {
    let (addr, stop) = listening_with_slow(Limits {
        per_source: 2,
        ..Limits::LISTENER
    })
    .await;
    let mut held = [
        from([127, 0, 0, 1], addr).await,
        from([127, 0, 0, 1], addr).await,
    ];
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Idle, the client's share turns over: its oldest makes room.
    let out = exchange(addr, &get("/metrics", "localhost")).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(
        is_closed(&mut held[0]).await,
        "its oldest idle one made room"
    );
    // Busy, it holds its share and no more.
    let _busy = [
        busy_from([127, 0, 0, 1], addr).await,
        busy_from([127, 0, 0, 1], addr).await,
    ];
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut third = from([127, 0, 0, 1], addr).await;
    let _ = third
        .write_all(get("/metrics", "localhost").as_bytes())
        .await;
    let (_, out) = closed_after(&mut third, Duration::from_secs(2)).await;
    assert!(out.is_empty(), "served past the client's share: {out}");
    // Another client (Prometheus, say) is served meanwhile.
    let mut other = from([127, 0, 0, 2], addr).await;
    other
        .write_all(get("/metrics", "localhost").as_bytes())
        .await
        .expect("send");
    let (_, out) = closed_after(&mut other, Duration::from_secs(2)).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    stop.cancel();
}

#[tokio::test]
async fn an_old_connection_is_asked_to_end_and_a_stuck_answer_closed_after_the_grace() {
    let (age, grace) = (Duration::from_secs(1), Duration::from_secs(1));
    let (addr, stop) = listening(Limits {
        header_timeout: Duration::from_secs(30),
        max_age: age,
        grace,
        ..Limits::LISTENER
    })
    .await;
    // Kept alive and idle: ended at its age, not the header timeout's 30 s.
    let mut kept = TcpStream::connect(addr).await.expect("connect");
    let start = Instant::now();
    kept.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .expect("send");
    let (after, out) = closed_after(&mut kept, Duration::from_secs(3)).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    assert!(
        after + EARLY >= age && start.elapsed() < age + grace,
        "{after:?}"
    );
    stop.cancel();
    let stop = CancellationToken::new();
    // A client reading an answer larger than the sockets' buffers a byte
    // at a time, through a small window, which the idle timeout alone
    // never ends: reset at its age and grace, the answer unfinished.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let big = Router::new().route(
        "/big",
        axum::routing::get(|| async { vec![b'x'; 32 << 20] }),
    );
    tokio::spawn(serve_with(
        listener,
        big,
        Limits {
            max_age: age,
            grace,
            ..Limits::LISTENER
        },
        stop.clone(),
    ));
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(2048).expect("a small window");
    let mut slow = socket.connect(addr).await.expect("connect");
    let start = Instant::now();
    slow.write_all(get("/big", "localhost").as_bytes())
        .await
        .expect("send");
    // A byte every 20 ms until past the age and grace.
    let mut got = 0;
    let mut byte = [0u8; 1];
    let mut open = true;
    // (A second past them: the reset has come on a loaded machine too.)
    while open && start.elapsed() < age + grace + Duration::from_secs(1) {
        let read = tokio::time::timeout(Duration::from_secs(1), slow.read(&mut byte))
            .await
            .expect("a byte within 1 s");
        match read {
            Ok(0) | Err(_) => open = false,
            Ok(n) => got += n,
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Then as fast as it comes: only what the client's own buffer held
    // is left, not the rest of the answer.
    let mut chunk = vec![0u8; 64 << 10];
    let drained = tokio::time::timeout(Duration::from_secs(2), async {
        while open {
            match slow.read(&mut chunk).await {
                Ok(0) | Err(_) => open = false,
                Ok(n) => got += n,
            }
        }
    })
    .await;
    assert!(
        drained.is_ok(),
        "still answering after {:?}",
        start.elapsed()
    );
    assert!(got < 1 << 20, "the answer was not cut short: {got} bytes");
    stop.cancel();
}

/// A request already sent when the listener accepts its connection is
/// answered though connections of its source accepted right after it, in
/// one burst, take the places of the oldest idle ones: it is busy from its
/// accept, not from when hyper first reads it.
#[tokio::test]
async fn a_request_here_at_accept_is_never_closed_for_a_newer_connection() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    // Queued in the kernel before the listener runs: accepted together.
    let mut asking = TcpStream::connect(addr).await.expect("connect");
    asking
        .write_all(get("/metrics", "localhost").as_bytes())
        .await
        .expect("send");
    let mut idle = Vec::new();
    for _ in 0..2 {
        idle.push(TcpStream::connect(addr).await.expect("idle connection"));
    }
    served_in_place_of(listener, &mut asking, &mut idle[0]).await;
}

/// A request sent a while after its connect (the handshake's last ACK
/// went alone) is answered though its client opened more than its share
/// of connections in between: the agent's listener ([`listen`]) accepts a
/// connection when its first bytes arrive, so the request is there at its
/// accept, and the idle ones are not accepted yet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_sent_after_its_connect_is_answered_through_a_burst_of_idle_connections() {
    let listener = listen(SocketAddr::from(([127, 0, 0, 1], 0))).expect("listen");
    let listener = TcpListener::from_std(listener).expect("tokio listener");
    let addr = listener.local_addr().expect("addr");
    let stop = serving_shares_of_two(listener);
    let start = Instant::now();
    let request = get("/metrics", "localhost");
    let (mut asking, mut idle) =
        admission::sent_late_behind_idle(addr, request.as_bytes(), 4).await;
    let (_, out) = closed_after(&mut asking, Duration::from_millis(500)).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out:?}");
    assert!(
        start.elapsed() < admission::ACCEPT_ON_DATA,
        "{:?}",
        start.elapsed()
    );
    // Held by the kernel until then, then accepted as any connection is:
    // two of them closed for the other two.
    let deadline = tokio::time::Instant::from_std(start + admission::ACCEPT_ON_DATA * 3);
    let mut closed = Vec::new();
    for c in &mut idle {
        let mut b = [0u8; 64];
        if let Ok(Ok(0) | Err(_)) = tokio::time::timeout_at(deadline, c.read(&mut b)).await {
            closed.push(start.elapsed());
        }
    }
    assert_eq!(closed.len(), 2, "{closed:?}");
    assert!(
        closed
            .iter()
            .all(|t| *t >= admission::ACCEPT_ON_DATA.saturating_sub(EARLY)),
        "{closed:?}"
    );
    stop.cancel();
}

/// Empty lines are no request (hyper skips them): connections that sent
/// only those when accepted stay idle, and a client's share full of them
/// turns over for its real request.
#[tokio::test]
async fn empty_lines_at_accept_do_not_make_a_connection_busy() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let mut blank = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"\r\n\r\n").await.expect("send");
        blank.push(s);
    }
    let mut asking = TcpStream::connect(addr).await.expect("connect");
    asking
        .write_all(get("/metrics", "localhost").as_bytes())
        .await
        .expect("send");
    served_in_place_of(listener, &mut asking, &mut blank[0]).await;
}

/// Serves the agent's router for `localhost` on `listener`, a client's
/// share being two connections, until the token returned is cancelled.
fn serving_shares_of_two(listener: TcpListener) -> CancellationToken {
    let stop = CancellationToken::new();
    let limits = Limits {
        per_source: 2,
        ..Limits::LISTENER
    };
    tokio::spawn(serve_with(
        listener,
        agent_router("localhost"),
        limits,
        stop.clone(),
    ));
    stop
}

/// Serves the connections `listener` has queued (accepted in one burst),
/// a client's share being two: `asking` is answered, and `oldest` was
/// closed to make room for it.
async fn served_in_place_of(listener: TcpListener, asking: &mut TcpStream, oldest: &mut TcpStream) {
    let stop = serving_shares_of_two(listener);
    let (_, out) = closed_after(asking, Duration::from_secs(2)).await;
    assert!(out.starts_with("HTTP/1.1 200"), "{out:?}");
    assert!(is_closed(oldest).await, "the oldest idle one made room");
    stop.cancel();
}
