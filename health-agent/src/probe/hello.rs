//! The HTTP hello server on port 4240: `GET /hello` answers 200, anything else
//! a 4xx. Small and bounded: at most `MAX_CONNECTIONS` at once and
//! `PER_SOURCE` from one address (more are closed at once, so a peer holding
//! many idle or slow connections cannot starve the others), 4 KiB of
//! request head, 2 s to send it.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
    sync::Semaphore,
};

/// Connections served at once: enough for thousands of peers probing within
/// one spread (each exchange takes well under a millisecond).
pub const MAX_CONNECTIONS: usize = 4096;
/// Connections served at once from one address. A peer probes each of our
/// addresses once a round, but many agents may share one address behind
/// SNAT, and a benchmark's peers share one server: 256 (what the server
/// once allowed in all) keeps room for those while a peer holding idle
/// connections still takes at most this share of `MAX_CONNECTIONS`.
pub const PER_SOURCE: usize = 256;
const MAX_HEAD: usize = 4096;
const HEAD_TIMEOUT: Duration = Duration::from_secs(2);

/// Pending connections the listener queues (the kernel caps it at
/// `net.core.somaxconn`, 4096 by default): a node of a large cluster gets a
/// connection from every peer within each prober's spread, and a SYN that
/// finds the queue full is dropped and retried only after a second, past
/// the prober's timeout. std's and tokio's defaults are 128 and 1024.
pub const BACKLOG: i32 = 65_535;

/// A non-blocking listener on `[::]:port` of the calling thread's
/// namespace, dual-stack (IPv4 peers arrive as IPv4-mapped addresses), with
/// [`BACKLOG`]; on `0.0.0.0:port` where the namespace has no IPv6.
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
        std::net::SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, port))
    };
    sock.bind(&addr.into())?;
    sock.listen(BACKLOG)?;
    sock.set_nonblocking(true)?;
    Ok(sock.into())
}

/// Serves until `shutdown` (connections being answered finish on their own,
/// bounded by the head timeout).
pub async fn serve(listener: TcpListener, shutdown: tokio_util::sync::CancellationToken) {
    serve_with(listener, shutdown, Limits::NODE).await;
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
    shutdown: tokio_util::sync::CancellationToken,
    limits: Limits,
) {
    shutdown
        .run_until_cancelled(accept_loop(listener, limits))
        .await;
}

/// Connections open per source address.
type PerSource = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// One source's share, given back when the connection ends.
struct SourceSlot {
    ip: IpAddr,
    counts: PerSource,
}

impl SourceSlot {
    fn take(counts: &PerSource, ip: IpAddr, limit: usize) -> Option<Self> {
        let mut c = counts.lock().ok()?;
        let n = c.entry(ip).or_insert(0);
        if *n >= limit {
            return None;
        }
        *n += 1;
        Some(Self {
            ip,
            counts: counts.clone(),
        })
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        if let Ok(mut c) = self.counts.lock()
            && let Some(n) = c.get_mut(&self.ip)
        {
            *n -= 1;
            if *n == 0 {
                c.remove(&self.ip);
            }
        }
    }
}

async fn accept_loop(listener: TcpListener, limits: Limits) {
    let slots = Arc::new(Semaphore::new(limits.total));
    let per_source = PerSource::default();
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        // An IPv4 peer of the dual-stack listener counts as its IPv4 address.
        let ip = peer.ip().to_canonical();
        let Some(source) = SourceSlot::take(&per_source, ip, limits.per_source) else {
            drop(stream);
            continue;
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        tokio::spawn(async move {
            let _ = tokio::time::timeout(HEAD_TIMEOUT * 2, handle(stream)).await;
            drop((permit, source));
        });
    }
}

async fn handle(mut stream: TcpStream) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(256);
    let mut buf = [0u8; 1024];
    let complete = tokio::time::timeout(HEAD_TIMEOUT, async {
        loop {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                return Ok::<bool, std::io::Error>(false);
            }
            head.extend_from_slice(&buf[..n]);
            if head.windows(4).any(|w| w == b"\r\n\r\n") {
                return Ok(true);
            }
            if head.len() > MAX_HEAD {
                return Ok(false);
            }
        }
    })
    .await;
    let response = match complete {
        Ok(Ok(true)) => respond(&head),
        Ok(Ok(false)) => reply(400, "bad request\n"),
        Ok(Err(e)) => return Err(e),
        Err(_) => reply(408, "request timeout\n"),
    };
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

/// The response to a complete request head.
fn respond(head: &[u8]) -> String {
    let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|b| *b == b' ');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(b"GET"), Some(b"/hello"), Some(v)) if v.starts_with(b"HTTP/1.") => reply(200, "ok\n"),
        (Some(b"GET"), Some(_), Some(v)) if v.starts_with(b"HTTP/1.") => {
            reply(404, "only /hello is served\n")
        }
        (Some(_), Some(_), Some(v)) if v.starts_with(b"HTTP/1.") => {
            reply(405, "only GET is served\n")
        }
        _ => reply(400, "bad request\n"),
    }
}

fn reply(code: u16, body: &str) -> String {
    let reason = match code {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        _ => "Bad Request",
    };
    let allow = if code == 405 { "Allow: GET\r\n" } else { "" };
    format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_get_hello_is_served() {
        assert!(respond(b"GET /hello HTTP/1.1\r\nHost: x\r\n\r\n").starts_with("HTTP/1.1 200 OK"));
        assert!(respond(b"GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(respond(b"POST /hello HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        assert!(respond(b"\x16\x03\x01 garbage\r\n\r\n").starts_with("HTTP/1.1 400"));
        assert!(respond(b"GET /hello\r\n\r\n").starts_with("HTTP/1.1 400"));
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
        let server = tokio::spawn(serve(listener, tokio_util::sync::CancellationToken::new()));
        let mut idle = Vec::new();
        for _ in 0..1000 {
            idle.push(TcpStream::connect(addr).await.expect("idle connection"));
        }
        // Another peer: a source address of its own on loopback.
        let t = std::time::Instant::now();
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

    /// The listener answers IPv4 and IPv6 peers on one port.
    #[tokio::test]
    async fn listens_dual_stack() {
        let std_listener = listen(0).expect("listen");
        let port = std_listener.local_addr().expect("addr").port();
        let listener = TcpListener::from_std(std_listener).expect("tokio listener");
        let server = tokio::spawn(serve(listener, tokio_util::sync::CancellationToken::new()));
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
        let server = tokio::spawn(serve(listener, tokio_util::sync::CancellationToken::new()));
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
}
