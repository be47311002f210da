//! The HTTP hello server on port 4240: `GET /hello` answers 200, anything
//! else a 4xx, every answer naming the node (`X-Health-Node`). Small and bounded: at most `MAX_CONNECTIONS` at once and
//! `PER_SOURCE` from one source (an IPv4 address, or an IPv6 /64), 4 KiB
//! of request head, [`HEAD_TIMEOUT`] to send it. When the server, or a
//! source's share, is full, the oldest connection (of that source) still
//! waiting for its request head is closed to make room for the new one: a
//! peer holding many idle or slow connections turns over its own share
//! and cannot starve the others, even those sharing its source. The
//! kernel hands over a connection when its first bytes arrive, and one
//! whose whole head is there then is never closed for a newer connection
//! of its source (the rules are [`crate::util::admission`]'s). A probe
//! costs the server two segments, the SYN-ACK and the answer with its FIN
//! (`answer_in_few_segments`): every peer probes each of the node's
//! addresses every round.

use std::{net::Ipv4Addr, sync::Arc, time::Duration};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
};
use tokio_util::sync::CancellationToken;

use super::http::NODE_HEADER;
use crate::util::{
    admission::{self, Admission, Admitted},
    source::Source,
};

/// Connections served at once: enough for thousands of peers probing within
/// one spread (each exchange takes well under a millisecond).
pub const MAX_CONNECTIONS: usize = 4096;
/// Connections served at once from one source (an IPv4 address or an IPv6
/// /64). A peer probes each of our addresses once a round, but many agents
/// may share one address behind SNAT, and a benchmark's peers share one
/// server: 256 (what the server once allowed in all) keeps room for those
/// while a peer holding idle connections still takes at most this share of
/// `MAX_CONNECTIONS`.
pub const PER_SOURCE: usize = 256;
const MAX_HEAD: usize = 4096;
/// How long a connection may take to send its whole request head. A prober
/// writes its request in one segment right after connecting and gives up
/// after its probe timeout (1 s by default), so 2 s is ample for a real
/// peer on a slow path, and short enough that idle or trickling
/// connections (slowloris) give their slots back quickly.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(2);

/// Pending connections the listener queues: a node of a large cluster gets
/// a connection from every peer within each prober's spread, and a SYN
/// that finds the queue full is dropped and retried only after a second,
/// past the prober's timeout. std's and tokio's defaults are 128 and 1024.
/// The kernel caps a listener's queue at `net.core.somaxconn` (4,096 by
/// default) when `listen()` is called, so [`listen`] raises that sysctl
/// for the one call and writes the previous value back right after.
pub const BACKLOG: i32 = 65_535;

/// A non-blocking listener on `[::]:port` of the calling thread's
/// namespace, dual-stack (IPv4 peers arrive as IPv4-mapped addresses), with
/// [`BACKLOG`], accepting a connection when its first bytes arrive, or
/// after [`admission::ACCEPT_ON_DATA`], its connections starting with
/// delayed ACKs; on `0.0.0.0:port` where the namespace has no IPv6.
pub fn listen(port: u16) -> std::io::Result<std::net::TcpListener> {
    match listen_on(socket2::Domain::IPV6, port) {
        Err(e) if e.raw_os_error() == Some(libc::EAFNOSUPPORT) => {
            listen_on(socket2::Domain::IPV4, port)
        }
        other => other,
    }
}

fn listen_on(domain: socket2::Domain, port: u16) -> std::io::Result<std::net::TcpListener> {
    let sock = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    sock.set_reuse_address(true)?;
    let addr = if domain == socket2::Domain::IPV6 {
        sock.set_only_v6(false)?;
        std::net::SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port))
    } else {
        std::net::SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))
    };
    sock.bind(&addr.into())?;
    crate::sys::sysctl::with_at_least("net/core/somaxconn", BACKLOG.unsigned_abs().into(), || {
        sock.listen(BACKLOG)
    })?;
    answer_in_few_segments(&sock)?;
    sock.set_nonblocking(true)?;
    Ok(sock.into())
}

/// The listener's options that keep an exchange to the fewest segments:
/// the kernel hands a connection over once its first bytes arrive (or
/// after [`admission::ACCEPT_ON_DATA`]), and its connections start with
/// delayed ACKs (`TCP_QUICKACK` off is inherited from the listener), so
/// the request is acknowledged by the answer instead of by an ACK of its
/// own. With the answer and its FIN in one segment ([`handle`]), a
/// prober's request costs the server two segments, the SYN-ACK and the
/// answer, where it took four. Were the answer 40 ms late, the kernel's
/// delayed-ACK timer would still send the ACK, well before a client
/// would send its request again. Delayed ACKs only save segments, so a
/// failure to turn quick ACKs off is ignored. Called on a listening
/// socket: `listen()` resets the ACK settings made before it.
fn answer_in_few_segments(sock: &socket2::Socket) -> std::io::Result<()> {
    crate::sys::sockopt::defer_accept(sock, admission::ACCEPT_ON_DATA)?;
    let _ = sock.set_tcp_quickack(false);
    Ok(())
}

/// Serves until `shutdown` (connections being answered finish on their own,
/// bounded by the head timeout), each answer naming `node` in
/// [`NODE_HEADER`]: a prober tells by it that the address it probed led
/// to the node it meant (a name that is not a valid node name is not
/// sent).
pub async fn serve(listener: TcpListener, shutdown: CancellationToken, node: &str) {
    let node = crate::membership::validate::check_name(node)
        .is_ok()
        .then(|| Arc::from(node));
    serve_with(listener, shutdown, Limits::NODE, node).await;
}

/// How many connections a hello server answers at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub total: usize,
    pub per_source: usize,
}

impl Limits {
    /// A node's server: [`MAX_CONNECTIONS`], [`PER_SOURCE`].
    pub const NODE: Self = Self {
        total: MAX_CONNECTIONS,
        per_source: PER_SOURCE,
    };
}

/// [`serve`] with other limits: a benchmark's one server standing in for
/// thousands of peers sees every probe of a prober from one address, which
/// a real peer's server never does.
pub async fn serve_with(
    listener: TcpListener,
    shutdown: CancellationToken,
    limits: Limits,
    node: Option<Arc<str>>,
) {
    shutdown
        .run_until_cancelled(accept_loop(listener, limits, node))
        .await;
}

type Slot = Admitted<Source>;

async fn accept_loop(listener: TcpListener, limits: Limits, node: Option<Arc<str>>) {
    let admission = Admission::new(admission::Limits {
        total: limits.total,
        per_key: limits.per_source,
    });
    let named: Arc<str> = named_line(node.as_deref()).into();
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let Ok(slot) = admission.take(Source::of(peer.ip())) else {
            drop(stream);
            continue;
        };
        // A prober writes its request as it connects: one whose whole head
        // is here already is busy, never closed for a newer connection of
        // its source while its task waits to run behind a burst of accepts.
        let mut head = Vec::with_capacity(256);
        if arrived(&stream, &mut head) {
            slot.busy();
        }
        let named = named.clone();
        tokio::spawn(async move {
            let evicted = slot.evicted().clone();
            let answered = handle(stream, head, &slot, &named);
            tokio::select! {
                () = evicted.cancelled() => {}
                _ = tokio::time::timeout(HEAD_TIMEOUT * 2, answered) => {}
            }
            drop(slot);
        });
    }
}

/// Reads what has arrived on `stream` without waiting: whether it holds a
/// whole request head (or an empty line, answered 400 as soon as its task
/// runs). Nothing read, or an error, leaves `head` empty: the task reads
/// on (a reset taken here reads as the end of the stream there).
fn arrived(stream: &TcpStream, head: &mut Vec<u8>) -> bool {
    matches!(stream.try_read_buf(head), Ok(n) if n > 0) && complete(head)
}

fn complete(head: &[u8]) -> bool {
    head.windows(4).any(|w| w == b"\r\n\r\n")
}

/// Answers the request whose first bytes are `head` (marked busy already
/// when they hold all of it).
async fn handle(
    mut stream: TcpStream,
    mut head: Vec<u8>,
    slot: &Slot,
    named: &str,
) -> std::io::Result<()> {
    let whole = complete(&head);
    if !whole {
        // A head in parts: each part is acknowledged at once, so that a
        // client writing it in small writes with Nagle's algorithm on
        // does not wait for a delayed ACK between them.
        let _ = socket2::SockRef::from(&stream).set_tcp_quickack(true);
    }
    let mut buf = [0u8; 1024];
    let read = tokio::time::timeout(HEAD_TIMEOUT, async {
        while !complete(&head) {
            if head.len() > MAX_HEAD {
                return Ok(false);
            }
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Ok::<bool, std::io::Error>(false);
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok(true)
    })
    .await;
    if !whole {
        slot.busy();
    }
    let response = match read {
        Ok(Ok(true)) => respond(&head, named),
        Ok(Ok(false)) => reply(400, "bad request\n", named),
        Ok(Err(e)) => return Err(e),
        Err(_) => reply(408, "request timeout\n", named),
    };
    // Corked, the answer waits in the socket for the FIN, and both leave
    // in one segment: a failure to cork only costs that segment.
    let _ = socket2::SockRef::from(&stream).set_tcp_cork(true);
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// The response to a complete request head, with `named` ([`named_line`]).
fn respond(head: &[u8], named: &str) -> String {
    let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|b| *b == b' ');
    let (method, target, version) = (parts.next(), parts.next(), parts.next());
    let http1 = version.is_some_and(|v| v.starts_with(b"HTTP/1."));
    let (code, body) = match (method, target) {
        (Some(b"GET" | b"HEAD"), Some(b"/hello")) if http1 => (200, "ok\n"),
        (Some(b"GET" | b"HEAD"), Some(_)) if http1 => (404, "only /hello is served\n"),
        (Some(_), Some(_)) if http1 => (405, "only GET and HEAD are served\n"),
        _ => (400, "bad request\n"),
    };
    let answer = reply(code, body, named);
    if method == Some(b"HEAD") && http1 {
        // The head a GET would get, without its body (RFC 9110 9.3.2).
        answer[..answer.len() - body.len()].to_owned()
    } else {
        answer
    }
}

/// The header line naming `node` in every answer (none without a node),
/// made once a server.
fn named_line(node: Option<&str>) -> String {
    node.map(|n| format!("{NODE_HEADER}: {n}\r\n"))
        .unwrap_or_default()
}

/// An answer of `code` with `body`, with `named` ([`named_line`]).
fn reply(code: u16, body: &str, named: &str) -> String {
    let reason = match code {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        _ => "Bad Request",
    };
    let allow = if code == 405 {
        "Allow: GET, HEAD\r\n"
    } else {
        ""
    };
    format!(
        "HTTP/1.1 {code} {reason}\r\n{named}Content-Type: text/plain\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    #[test]
    fn only_get_hello_is_served() {
        let respond = |head: &[u8]| respond(head, "");
        assert!(respond(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n").starts_with("HTTP/1.1 200 OK"));
        assert!(respond(b"GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(respond(b"POST /hello HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        // HEAD: a GET's head, without its body.
        let get = respond(b"GET /hello HTTP/1.1\r\n\r\n");
        let head = respond(b"HEAD /hello HTTP/1.1\r\n\r\n");
        assert_eq!(format!("{head}ok\n"), get);
        assert!(
            head.ends_with("Content-Length: 3\r\nConnection: close\r\n\r\n"),
            "{head}"
        );
        let missing = respond(b"HEAD /x HTTP/1.1\r\n\r\n");
        assert!(missing.starts_with("HTTP/1.1 404") && missing.ends_with("\r\n\r\n"));
        assert!(respond(b"\x16\x03\x01 garbage\r\n\r\n").starts_with("HTTP/1.1 400"));
        assert!(respond(b"GET /hello\r\n\r\n").starts_with("HTTP/1.1 400"));
    }

    /// Every answer names the node when the server has one, as the
    /// prober reads it; a name that is not a node's is not sent.
    #[tokio::test]
    async fn answers_name_the_node_a_valid_name_at_most() {
        let named = named_line(Some("node-7"));
        let ok = respond(b"GET /hello HTTP/1.1\r\n\r\n", &named);
        assert!(
            ok.starts_with("HTTP/1.1 200 OK\r\nX-Health-Node: node-7\r\n"),
            "{ok}"
        );
        let tag = super::super::http::node_tag(b"node-7");
        let mut carried = super::super::http::Carried::default();
        let read = super::super::http::gather(&mut carried, ok.as_bytes(), tag, false);
        assert_eq!(read, Some(Ok(200)));
        assert!(respond(b"GET / HTTP/1.1\r\n\r\n", &named).contains("X-Health-Node: node-7\r\n"));
        for (name, sent) in [("node-7", true), ("bad\r\nX-Evil: 1", false), ("", false)] {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let addr = listener.local_addr().expect("addr");
            let stop = CancellationToken::new();
            let server = tokio::spawn({
                let (stop, name) = (stop.clone(), name.to_owned());
                async move { serve(listener, stop, &name).await }
            });
            let mut client = TcpStream::connect(addr).await.expect("connect");
            client
                .write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .expect("written");
            let mut out = String::new();
            client.read_to_string(&mut out).await.expect("read");
            assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
            assert_eq!(out.contains("X-Health-Node:"), sent, "{name:?}: {out}");
            assert!(!out.contains("X-Evil"), "{out}");
            stop.cancel();
            server.await.expect("stopped");
        }
    }

    /// One peer holds 1,000 idle connections open: another peer is still
    /// answered at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_peer_holding_a_thousand_idle_connections_does_not_starve_the_others() {
        use nix::sys::resource::{Resource, getrlimit, setrlimit};
        // 1,000 client sockets plus the server's: lift the soft limit.
        if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
            && soft < 4096
        {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard.min(8192), hard);
        }
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(serve(listener, CancellationToken::new(), "node-1"));
        let mut idle = Vec::new();
        for _ in 0..1000 {
            idle.push(TcpStream::connect(addr).await.expect("idle connection"));
        }
        // Another peer: a source address of its own on loopback.
        let t = std::time::Instant::now();
        let out = hello_from_another_peer(addr).await;
        assert!(
            String::from_utf8_lossy(&out).starts_with("HTTP/1.1 200 OK"),
            "{}",
            String::from_utf8_lossy(&out)
        );
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        // The idle peer was held to its share: its connections past
        // PER_SOURCE were closed by the server.
        let mut closed = 0;
        for c in &mut idle {
            let mut b = [0u8; 1];
            if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(5), c.read(&mut b)).await
            {
                closed += 1;
            }
        }
        assert!(
            closed >= 1000 - PER_SOURCE,
            "{closed} of the idle connections closed"
        );
        server.abort();
    }

    /// A server full of idle connections answers a new peer at once, by
    /// closing the oldest idle one; an idle connection left alone is
    /// answered 408 and closed after [`HEAD_TIMEOUT`].
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_full_server_closes_its_oldest_idle_connection_for_a_new_peer() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let limits = Limits {
            total: 8,
            per_source: 8,
        };
        let server = tokio::spawn(serve_with(listener, CancellationToken::new(), limits, None));
        let start = std::time::Instant::now();
        let mut idle = Vec::new();
        for _ in 0..8 {
            idle.push(TcpStream::connect(addr).await.expect("idle connection"));
            // Accepted in this order.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let out = hello_from_another_peer(addr).await;
        assert!(out.starts_with(b"HTTP/1.1 200 OK"), "{out:?}");
        let mut b = [0u8; 64];
        let oldest = tokio::time::timeout(Duration::from_millis(500), idle[0].read(&mut b))
            .await
            .expect("the oldest idle connection is closed at once");
        assert!(matches!(oldest, Ok(0) | Err(_)), "{oldest:?}");
        assert!(start.elapsed() < HEAD_TIMEOUT, "{:?}", start.elapsed());
        // The others wait for their head until the timeout, then get 408.
        let mut rest = String::new();
        tokio::time::timeout(HEAD_TIMEOUT * 2, idle[1].read_to_string(&mut rest))
            .await
            .expect("closed after the head timeout")
            .expect("read");
        assert!(rest.starts_with("HTTP/1.1 408"), "{rest}");
        assert!(start.elapsed() >= HEAD_TIMEOUT, "{:?}", start.elapsed());
        server.abort();
    }

    /// A request already sent when the server accepts its connection is
    /// answered though the connections of its source accepted right after
    /// it, in one burst, would close the oldest idle one: it is busy from
    /// its accept, not from when its task first runs.
    #[tokio::test]
    async fn a_request_here_at_accept_is_never_closed_for_a_newer_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        // Queued in the kernel before the server runs: accepted together.
        let mut asking = TcpStream::connect(addr).await.expect("connect");
        asking
            .write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("send");
        let mut idle = Vec::new();
        for _ in 0..2 {
            idle.push(TcpStream::connect(addr).await.expect("idle connection"));
        }
        let limits = Limits {
            total: 16,
            per_source: 2,
        };
        let server = tokio::spawn(serve_with(listener, CancellationToken::new(), limits, None));
        let mut out = String::new();
        tokio::time::timeout(Duration::from_secs(1), asking.read_to_string(&mut out))
            .await
            .expect("answered within 1 s")
            .expect("read");
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out:?}");
        // The idle one accepted first was closed for the third.
        let mut b = [0u8; 64];
        let first_idle = tokio::time::timeout(Duration::from_millis(500), idle[0].read(&mut b))
            .await
            .expect("the oldest idle connection is closed at once");
        assert!(matches!(first_idle, Ok(0) | Err(_)), "{first_idle:?}");
        server.abort();
    }

    /// A request sent a while after its connect (the handshake's last ACK
    /// went alone) is answered though its source opened more than its
    /// share of connections in between: the node's listener accepts a
    /// connection when its first bytes arrive, so the request is there at
    /// its accept and the idle ones are not accepted before
    /// [`admission::ACCEPT_ON_DATA`]. Then they are, and answered 408 at
    /// the head timeout or closed for one another.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_request_sent_after_its_connect_is_answered_through_a_burst_of_idle_connections() {
        let listener = TcpListener::from_std(listen(0).expect("listen")).expect("tokio listener");
        let addr = std::net::SocketAddr::from((
            [127, 0, 0, 1],
            listener.local_addr().expect("addr").port(),
        ));
        let limits = Limits {
            total: 16,
            per_source: 2,
        };
        let server = tokio::spawn(serve_with(listener, CancellationToken::new(), limits, None));
        let start = std::time::Instant::now();
        let (mut asking, mut idle) =
            admission::sent_late_behind_idle(addr, b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n", 4)
                .await;
        let mut out = String::new();
        tokio::time::timeout(Duration::from_millis(500), asking.read_to_string(&mut out))
            .await
            .expect("answered at once")
            .expect("read");
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out:?}");
        assert!(
            start.elapsed() < admission::ACCEPT_ON_DATA,
            "{:?}",
            start.elapsed()
        );
        // Held by the kernel, then accepted and closed like any other.
        let mut answers = Vec::new();
        for c in &mut idle {
            let mut rest = Vec::new();
            let within = admission::ACCEPT_ON_DATA + HEAD_TIMEOUT + Duration::from_secs(3);
            let _ = tokio::time::timeout(within, c.read_to_end(&mut rest))
                .await
                .expect("accepted and closed");
            answers.push(String::from_utf8_lossy(&rest).into_owned());
        }
        assert!(
            start.elapsed() > admission::ACCEPT_ON_DATA + HEAD_TIMEOUT,
            "{:?}",
            start.elapsed()
        );
        assert!(
            answers.iter().any(|a| a.starts_with("HTTP/1.1 408")),
            "{answers:?}"
        );
        server.abort();
    }

    /// The listener answers IPv4 and IPv6 peers on one port.
    /// `GET /hello` from 127.0.0.2 (a peer of its own on loopback): the
    /// answer, which must come within 1 s.
    async fn hello_from_another_peer(addr: std::net::SocketAddr) -> Vec<u8> {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind("127.0.0.2:0".parse().expect("addr"))
            .expect("bind 127.0.0.2");
        let mut s = socket.connect(addr).await.expect("connect");
        s.write_all(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("send");
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(1), s.read_to_end(&mut out))
            .await
            .expect("answered within 1 s")
            .expect("read");
        out
    }

    #[tokio::test]
    async fn listens_dual_stack() {
        let std_listener = listen(0).expect("listen");
        let port = std_listener.local_addr().expect("addr").port();
        let listener = TcpListener::from_std(std_listener).expect("tokio listener");
        let server = tokio::spawn(serve(listener, CancellationToken::new(), "node-1"));
        for ip in [
            IpAddr::from([127, 0, 0, 1]),
            IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
        ] {
            let mut s = TcpStream::connect((ip, port)).await.expect("connect");
            s.write_all(b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n")
                .await
                .expect("send");
            let mut out = String::new();
            s.read_to_string(&mut out).await.expect("read");
            assert!(out.starts_with("HTTP/1.1 200 OK"), "{ip}: {out}");
        }
        server.abort();
    }

    #[tokio::test]
    async fn serves_over_tcp_and_rejects_oversized_heads() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(serve(listener, CancellationToken::new(), "node-1"));
        let exchange = |req: Vec<u8>| async move {
            let mut s = TcpStream::connect(addr).await.expect("connect");
            s.write_all(&req).await.expect("send");
            let mut out = String::new();
            s.read_to_string(&mut out).await.expect("read");
            out
        };
        let ok = exchange(b"GET /hello HTTP/1.1\r\nHost: a\r\n\r\n".to_vec()).await;
        assert!(
            ok.starts_with("HTTP/1.1 200 OK") && ok.ends_with("ok\n"),
            "{ok}"
        );
        let mut huge = b"GET /hello HTTP/1.1\r\n".to_vec();
        huge.extend(std::iter::repeat_n(b'a', 8000));
        let big = exchange(huge).await;
        assert!(big.starts_with("HTTP/1.1 400"), "{big}");
        server.abort();
    }

    /// A loopback listener with the server's segment-saving options, and
    /// its server (stopped by the token).
    fn few_segments_server() -> (std::net::SocketAddr, CancellationToken) {
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        sock.bind(&std::net::SocketAddr::from((Ipv4Addr::LOCALHOST, 0)).into())
            .expect("bind");
        sock.listen(128).expect("listen");
        answer_in_few_segments(&sock).expect("listener options");
        sock.set_nonblocking(true).expect("non-blocking");
        let std_listener: std::net::TcpListener = sock.into();
        let addr = std_listener.local_addr().expect("address");
        let listener = TcpListener::from_std(std_listener).expect("listener");
        let stop = CancellationToken::new();
        tokio::spawn(serve(listener, stop.clone(), "node-1"));
        (addr, stop)
    }

    /// One exchange as the agent's prober makes it (quick acks off, the
    /// request in one write, closed with a reset), its request written in
    /// `parts` with `pause` between them: the answer, the segments the
    /// server sent, and how long the answer took from the first write.
    fn exchange(
        addr: std::net::SocketAddr,
        parts: &[&[u8]],
        pause: Duration,
    ) -> (String, u32, Duration) {
        use std::io::{Read as _, Write as _};
        let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
            .expect("socket");
        sock.set_linger(Some(Duration::ZERO)).expect("SO_LINGER");
        sock.set_tcp_quickack(false).expect("TCP_QUICKACK");
        sock.connect(&addr.into()).expect("connect");
        let mut stream: std::net::TcpStream = sock.try_clone().expect("clone").into();
        let t = std::time::Instant::now();
        for (i, part) in parts.iter().enumerate() {
            if i > 0 {
                std::thread::sleep(pause);
            }
            stream.write_all(part).expect("request");
        }
        let mut answer = String::new();
        stream.read_to_string(&mut answer).expect("answer");
        let took = t.elapsed();
        let segments = crate::sys::sockopt::tcp_info(&sock)
            .expect("TCP_INFO")
            .tcpi_segs_in;
        (answer, segments, took)
    }

    /// A request costs the server two segments, the SYN-ACK and the answer
    /// with its FIN, where an ACK of the request and a FIN of their own
    /// made four. A server held up past the delayed-ACK timer (40 ms)
    /// rightly acknowledges the request on its own: such a try says
    /// nothing. Three prompt tries are asked for, of at most twenty.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_answer_costs_the_server_two_segments() {
        let (addr, stop) = few_segments_server();
        let mut prompt = 0;
        for _ in 0..20 {
            if prompt == 3 {
                break;
            }
            let (answer, segments, took) = tokio::task::spawn_blocking(move || {
                exchange(
                    addr,
                    &[b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"],
                    Duration::ZERO,
                )
            })
            .await
            .expect("client");
            assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
            if took < Duration::from_millis(20) {
                prompt += 1;
                assert_eq!(
                    segments, 2,
                    "the server sent {segments} segments for one answer (SYN-ACK, answer and FIN: 2)"
                );
            }
        }
        assert!(prompt > 0, "no try was answered within 20 ms");
        stop.cancel();
    }

    /// A head that comes in parts is acknowledged part by part: a client
    /// with Nagle's algorithm on sends its second part only once the first
    /// is acknowledged, which a delayed ACK would put off by 40 ms or more
    /// every time.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_head_in_parts_is_acknowledged_at_once() {
        let (addr, stop) = few_segments_server();
        // A delayed ACK makes every try 40 ms or more; a busy machine may
        // make some slow, but not twenty in a row.
        let mut fastest = Duration::MAX;
        for _ in 0..20 {
            if fastest < Duration::from_millis(30) {
                break;
            }
            let (answer, _, took) = tokio::task::spawn_blocking(move || {
                exchange(
                    addr,
                    &[b"GET /hello HTTP/1.1\r\n", b"Host: x\r\n\r\n"],
                    Duration::from_millis(2),
                )
            })
            .await
            .expect("client");
            assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
            fastest = fastest.min(took);
        }
        assert!(
            fastest < Duration::from_millis(30),
            "a head in two parts took {fastest:?} at best: its first part waited for a delayed ACK"
        );
        stop.cancel();
    }
}
