//! `GET /hello` on port 4240 with a minimal HTTP/1.1 exchange: 2xx is
//! success, 3xx success with a warning, anything else a failure.

use std::{
    future::poll_fn,
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use futures::FutureExt as _;
use tokio::net::TcpStream;

use super::{
    error::{ProbeError, Proto},
    path::{Outcome, RttSource},
};
use crate::sys::socket_factory::SocketFactory;

pub const HEALTH_PORT: u16 = 4240;

/// Where an HTTP probe's socket comes from when it is made on demand (a
/// round's sockets made beforehand go to [`connect`] directly).
pub enum SocketSource<'a> {
    /// Made now in the caller's namespace.
    Here,
    /// Made now by a factory living in the probe namespace.
    Factory(&'a SocketFactory),
}

/// `GET /hello` (to `http://[ip]:port/hello` for IPv6) from a socket of
/// `from` (of `ip`'s family), given up `timeout` after its connect (named
/// in the error).
pub async fn probe(ip: IpAddr, port: u16, timeout: Duration, from: SocketSource<'_>) -> Outcome {
    let sock = match from {
        SocketSource::Factory(factory) => {
            let (domain, ty, proto) = tcp_for(ip);
            factory.socket(domain, ty, proto).await
        }
        SocketSource::Here => {
            let (domain, ty, proto) = tcp_for(ip);
            socket2::Socket::new(domain, ty.nonblocking(), proto)
        }
    };
    match sock.map_err(|e| ProbeError::io("socket", &e)) {
        Ok(sock) => connect(ip, port, sock).finish(timeout).await,
        Err(e) => Outcome::Failed(e),
    }
}

/// Issues the connect to `ip`'s port from `sock` (non-blocking, of `ip`'s
/// family), now: when this returns, the SYN is out and the probe's timeout
/// runs. The rest of the exchange is [`Connecting::finish`].
#[must_use]
pub fn connect(ip: IpAddr, port: u16, sock: socket2::Socket) -> Connecting {
    let to = SocketAddr::new(ip, port);
    let start = Instant::now();
    // Closed with a reset once the status line is read (kubelet closes
    // its TCP probes the same way): no FIN exchange, no socket left in a
    // closing state, for tens of thousands of probes a round.
    let issued = sock
        .set_linger(Some(Duration::ZERO))
        .map_err(|e| ProbeError::io("SO_LINGER", &e))
        .and_then(|()| match sock.connect(&to.into()) {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(()),
            Err(e) => Err(ProbeError::io("connect", &e)),
        })
        .map(|()| std::net::TcpStream::from(sock));
    Connecting { issued, to, start }
}

/// An HTTP probe whose connect is issued (or failed to be).
#[derive(Debug)]
pub struct Connecting {
    issued: Result<std::net::TcpStream, ProbeError>,
    to: SocketAddr,
    start: Instant,
}

impl Connecting {
    /// Waits for the connection, sends the request and reads the status
    /// line, given up `timeout` after the connect was issued. Built here,
    /// not in an `async fn`, so the connect's state is held once.
    pub fn finish(self, timeout: Duration) -> impl Future<Output = Outcome> + use<> {
        let deadline = tokio::time::Instant::from_std(self.start + timeout);
        tokio::time::timeout_at(deadline, self.exchange()).map(move |r| match r {
            Ok(Ok((status, rtt))) => classify(status, rtt),
            Ok(Err(e)) => Outcome::Failed(e),
            Err(_) => Outcome::Failed(ProbeError::Timeout {
                proto: Proto::Http,
                after: timeout,
            }),
        })
    }

    /// The exchange keeps no buffer across an await (a round holds tens
    /// of thousands of these futures at once), and waits for readiness on
    /// the stream's own waker slot (no waiter of its own): the request is
    /// written from a stack buffer once the socket is writable, and the
    /// status line is read into one as it is readable; only a status line
    /// split over segments is carried, on the heap.
    async fn exchange(self) -> Result<(u16, Duration), ProbeError> {
        let Self { issued, to, start } = self;
        let stream = TcpStream::from_std(issued?).map_err(|e| ProbeError::io("registering", &e))?;
        poll_fn(|cx| stream.poll_write_ready(cx))
            .await
            .map_err(|e| ProbeError::io("connect", &e))?;
        if let Some(e) = stream
            .take_error()
            .map_err(|e| ProbeError::io("connect", &e))?
        {
            return Err(ProbeError::io("connect", &e));
        }
        send_request(&stream, to).await?;
        let status = status_line(&stream).await?;
        Ok((status, start.elapsed()))
    }
}

/// Writes the request to `to`; a short write (not seen on a fresh
/// connection: the request is at most 123 bytes) resumes where it ended.
async fn send_request(stream: &TcpStream, to: SocketAddr) -> Result<(), ProbeError> {
    let mut sent = 0;
    loop {
        let written = {
            let mut buf = [0u8; 160];
            let req = request(&mut buf, to);
            match stream.try_write(&req[sent..]) {
                Ok(n) => Some((n, req.len())),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
                Err(e) => return Err(ProbeError::io("send", &e)),
            }
        };
        match written {
            Some((n, len)) if sent + n >= len => return Ok(()),
            Some((n, _)) => sent += n,
            None => {}
        }
        poll_fn(|cx| stream.poll_write_ready(cx))
            .await
            .map_err(|e| ProbeError::io("send", &e))?;
    }
}

fn classify(status: u16, rtt: Duration) -> Outcome {
    match status {
        200..=299 => Outcome::Ok {
            rtt,
            warning: None,
            source: RttSource::Userspace,
        },
        300..=399 => Outcome::Ok {
            rtt,
            warning: Some(format!("HTTP {status} (redirect)")),
            source: RttSource::Userspace,
        },
        _ => Outcome::Failed(ProbeError::HttpStatus(status)),
    }
}

/// A kind of socket: domain, type and protocol.
pub type SocketKind = (socket2::Domain, socket2::Type, Option<socket2::Protocol>);

/// The kind of socket an HTTP probe over IPv4 uses.
pub const TCP_V4: SocketKind = (
    socket2::Domain::IPV4,
    socket2::Type::STREAM,
    Some(socket2::Protocol::TCP),
);

/// The kind of socket an HTTP probe over IPv6 uses.
pub const TCP_V6: SocketKind = (
    socket2::Domain::IPV6,
    socket2::Type::STREAM,
    Some(socket2::Protocol::TCP),
);

/// The kind of socket an HTTP probe to `ip` uses.
#[must_use]
pub const fn tcp_for(ip: IpAddr) -> SocketKind {
    match ip {
        IpAddr::V4(_) => TCP_V4,
        IpAddr::V6(_) => TCP_V6,
    }
}

/// The longest status line read: past it, the answer is not HTTP.
const STATUS_LINE_MAX: usize = 512;

/// Reads up to the end of the status line and parses it. What each
/// readiness brings is read into a stack buffer; a line that arrived in
/// parts is gathered in `carried` (empty, unallocated, in the usual case).
async fn status_line(stream: &TcpStream) -> Result<u16, ProbeError> {
    let mut carried = Vec::new();
    loop {
        poll_fn(|cx| stream.poll_read_ready(cx))
            .await
            .map_err(|e| ProbeError::io("receive", &e))?;
        let mut buf = [0u8; STATUS_LINE_MAX];
        let n = match stream.try_read(&mut buf[..STATUS_LINE_MAX - carried.len()]) {
            Ok(0) => {
                return Err(ProbeError::Protocol(
                    "connection closed before a status line".into(),
                ));
            }
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(ProbeError::io("receive", &e)),
        };
        let head = if carried.is_empty() {
            &buf[..n]
        } else {
            carried.extend_from_slice(&buf[..n]);
            &carried[..]
        };
        if head.windows(2).any(|w| w == b"\r\n") {
            return parse_status(head);
        }
        if head.len() >= STATUS_LINE_MAX {
            return Err(ProbeError::Protocol("status line too long".into()));
        }
        if carried.is_empty() {
            carried.extend_from_slice(&buf[..n]);
        }
    }
}

/// The request to `to`, written into `buf` (no allocation per probe; the
/// longest, to an IPv6 address, takes 123 bytes). `SocketAddr` writes
/// `[2001:2::1]:4240` for IPv6: the Host header's form (RFC 3986).
fn request(buf: &mut [u8; 160], to: SocketAddr) -> &[u8] {
    use std::io::Write as _;
    let mut w = &mut buf[..];
    // A socket address of at most 47 characters fits.
    let _ = write!(
        w,
        "GET /hello HTTP/1.1\r\nHost: {to}\r\nUser-Agent: health-agent\r\nConnection: close\r\n\r\n"
    );
    let left = w.len();
    &buf[..160 - left]
}

fn parse_status(head: &[u8]) -> Result<u16, ProbeError> {
    let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    let text = std::str::from_utf8(line)
        .map_err(|_| ProbeError::Protocol("status line is not text".into()))?;
    let mut parts = text.split(' ');
    match (
        parts.next(),
        parts.next().and_then(|c| c.parse::<u16>().ok()),
    ) {
        (Some(v), Some(code)) if v.starts_with("HTTP/1.") => Ok(code),
        _ => Err(ProbeError::Protocol(format!(
            "not an HTTP status line: {text:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_names_the_host_of_either_family_in_full() {
        let mut buf = [0u8; 160];
        let v4 = request(&mut buf, "198.18.0.1:4240".parse().expect("addr")).to_vec();
        assert_eq!(
            v4,
            b"GET /hello HTTP/1.1\r\nHost: 198.18.0.1:4240\r\nUser-Agent: health-agent\r\nConnection: close\r\n\r\n"
        );
        // The longest address there is.
        let long: SocketAddr = "[2001:2:ffff:ffff:ffff:ffff:255.255.255.255]:65535"
            .parse()
            .expect("addr");
        let v6 = request(&mut buf, long).to_vec();
        assert!(
            v6.ends_with(b"Connection: close\r\n\r\n"),
            "{}",
            String::from_utf8_lossy(&v6)
        );
        assert!(
            v6.windows(12).any(|w| w == b"]:65535\r\nUse"),
            "{}",
            String::from_utf8_lossy(&v6)
        );
    }

    #[test]
    fn statuses_classify_like_kubelet() {
        let rtt = Duration::from_millis(1);
        assert_eq!(
            classify(200, rtt),
            Outcome::Ok {
                rtt,
                warning: None,
                source: RttSource::Userspace
            }
        );
        assert!(matches!(
            classify(302, rtt),
            Outcome::Ok {
                warning: Some(_),
                ..
            }
        ));
        assert_eq!(
            classify(404, rtt),
            Outcome::Failed(ProbeError::HttpStatus(404))
        );
        assert_eq!(
            classify(500, rtt),
            Outcome::Failed(ProbeError::HttpStatus(500))
        );
    }

    /// A round holds one such future per probe in flight (10,000 at 5,000
    /// peers): it stays under 512 bytes (it was 1,216 with its buffers).
    #[tokio::test]
    async fn a_probe_in_flight_is_a_small_future() {
        let ip: IpAddr = "127.0.0.1".parse().expect("ip");
        let (domain, ty, proto) = tcp_for(ip);
        let sock = socket2::Socket::new(domain, ty.nonblocking(), proto).expect("socket");
        let finishing = connect(ip, 9, sock).finish(Duration::from_secs(1));
        let size = size_of_val(&finishing);
        assert!(size <= 512, "{size} bytes");
    }

    /// A status line that comes in parts is gathered; one without an end
    /// in 512 bytes, or a closed connection, is an error naming it.
    #[tokio::test]
    async fn status_lines_in_parts_too_long_or_cut_short() {
        use tokio::io::AsyncWriteExt as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let parts: [&[&[u8]]; 3] = [
            &[b"HTTP/1.1 2", b"04 No", b" Content\r", b"\n"],
            &[&[b'x'; 600]],
            &[b"HTTP/1.1 200"],
        ];
        let server = tokio::spawn(async move {
            for chunks in parts {
                let (mut conn, _) = listener.accept().await.expect("accept");
                for c in chunks {
                    conn.write_all(c).await.expect("write");
                    conn.flush().await.expect("flush");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        });
        let mut got = Vec::new();
        for _ in 0..3 {
            let stream = TcpStream::connect(addr).await.expect("connect");
            got.push(status_line(&stream).await);
        }
        server.await.expect("server");
        assert_eq!(got[0], Ok(204));
        assert_eq!(
            got[1],
            Err(ProbeError::Protocol("status line too long".into()))
        );
        assert_eq!(
            got[2],
            Err(ProbeError::Protocol(
                "connection closed before a status line".into()
            ))
        );
    }

    #[test]
    fn status_lines_parse_or_are_rejected() {
        assert_eq!(parse_status(b"HTTP/1.1 200 OK\r\n"), Ok(200));
        assert_eq!(parse_status(b"HTTP/1.0 404 Not Found\r\n"), Ok(404));
        assert!(parse_status(b"SSH-2.0-OpenSSH\r\n").is_err());
        assert!(parse_status(b"HTTP/1.1 abc\r\n").is_err());
    }
}
