//! `GET /hello` on port 4240 with a minimal HTTP/1.1 exchange: 2xx is
//! success, 3xx success with a warning, anything else a failure.

use std::{
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
};

use super::{
    error::{ProbeError, Proto},
    path::{Outcome, RttSource},
};
use crate::sys::socket_factory::SocketFactory;

pub const HEALTH_PORT: u16 = 4240;

/// Where an HTTP probe's socket comes from.
pub enum SocketSource<'a> {
    /// Made now in the caller's namespace.
    Here,
    /// Made now by a factory living in the probe namespace.
    Factory(&'a SocketFactory),
    /// Made beforehand (a round asks for its sockets in one go).
    Made(socket2::Socket),
}

/// `GET /hello` (to `http://[ip]:port/hello` for IPv6) from a socket of
/// `from` (of `ip`'s family), given up at `deadline` (the probe's start
/// plus `timeout`, named in the error).
pub async fn probe(
    ip: IpAddr,
    port: u16,
    deadline: tokio::time::Instant,
    timeout: Duration,
    from: SocketSource<'_>,
) -> Outcome {
    match tokio::time::timeout_at(deadline, exchange(ip, port, from)).await {
        Ok(Ok((status, rtt))) => classify(status, rtt),
        Ok(Err(e)) => Outcome::Failed(e),
        Err(_) => Outcome::Failed(ProbeError::Timeout {
            proto: Proto::Http,
            after: timeout,
        }),
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

/// A non-blocking TCP socket for `ip` from `from` (sockets keep the
/// namespace they were made in for life).
async fn socket_in(
    ip: IpAddr,
    from: SocketSource<'_>,
) -> Result<tokio::net::TcpSocket, ProbeError> {
    let (domain, ty, proto) = tcp_for(ip);
    let sock = match from {
        SocketSource::Made(s) => Ok(s),
        SocketSource::Factory(factory) => factory.socket(domain, ty, proto).await,
        SocketSource::Here => socket2::Socket::new(domain, ty.nonblocking(), proto),
    }
    .map_err(|e| ProbeError::io("socket", &e))?;
    // Closed with a reset once the status line is read (kubelet closes
    // its TCP probes the same way): no FIN exchange, no socket left in a
    // closing state, for tens of thousands of probes a round.
    sock.set_linger(Some(Duration::ZERO))
        .map_err(|e| ProbeError::io("SO_LINGER", &e))?;
    Ok(tokio::net::TcpSocket::from_std_stream(sock.into()))
}

async fn exchange(
    ip: IpAddr,
    port: u16,
    from: SocketSource<'_>,
) -> Result<(u16, Duration), ProbeError> {
    let socket = socket_in(ip, from).await?;
    let start = Instant::now();
    let to = SocketAddr::new(ip, port);
    let mut stream: TcpStream = socket
        .connect(to)
        .await
        .map_err(|e| ProbeError::io("connect", &e))?;
    let mut req = [0u8; 160];
    let req = request(&mut req, to);
    stream
        .write_all(req)
        .await
        .map_err(|e| ProbeError::io("send", &e))?;
    let mut buf = [0u8; 512];
    let mut len = 0;
    while !buf[..len].windows(2).any(|w| w == b"\r\n") {
        let n = stream
            .read(&mut buf[len..])
            .await
            .map_err(|e| ProbeError::io("receive", &e))?;
        if n == 0 {
            return Err(ProbeError::Protocol(
                "connection closed before a status line".into(),
            ));
        }
        len += n;
        if len == buf.len() {
            return Err(ProbeError::Protocol("status line too long".into()));
        }
    }
    let rtt = start.elapsed();
    parse_status(&buf[..len]).map(|s| (s, rtt))
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

    #[test]
    fn status_lines_parse_or_are_rejected() {
        assert_eq!(parse_status(b"HTTP/1.1 200 OK\r\n"), Ok(200));
        assert_eq!(parse_status(b"HTTP/1.0 404 Not Found\r\n"), Ok(404));
        assert!(parse_status(b"SSH-2.0-OpenSSH\r\n").is_err());
        assert!(parse_status(b"HTTP/1.1 abc\r\n").is_err());
    }
}
