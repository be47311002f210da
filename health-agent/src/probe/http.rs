//! `GET /hello` on port 4240 with a minimal HTTP/1.1 exchange, in pieces
//! the round's engine (`super::http_round`) drives: the connect, the
//! request, the answer's head gathered from what comes (its status line,
//! and the node its [`NODE_HEADER`] names, which must be the one the
//! address is of), and kubelet's reading of the status (2xx success, 3xx
//! success with a warning, anything else a failure).

use std::{net::SocketAddr, time::Duration};

use super::{
    error::ProbeError,
    family::Family,
    path::{Outcome, RttSource},
};

pub const HEALTH_PORT: u16 = 4240;

/// Binds `sock` to source port `port` (a flow's, see
/// [`super::flows`]), shared with the sockets of the same flow to other
/// addresses: each connection's four-tuple stays its own, and one closed
/// with a reset leaves no TIME-WAIT to hold the port into the next round.
/// `SO_REUSEPORT` beside `SO_REUSEADDR` keeps each bind O(1): with the
/// latter alone the kernel checks the new socket against every socket
/// already bound to the port (thousands in a round), which made binds the
/// largest share of a round's CPU with flows on.
pub(super) fn bind_source_port(
    sock: &socket2::Socket,
    to: SocketAddr,
    port: u16,
) -> Result<(), ProbeError> {
    let any: std::net::IpAddr = match to {
        SocketAddr::V4(_) => std::net::Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
    };
    sock.set_reuse_address(true)
        .and_then(|()| sock.set_reuse_port(true))
        .and_then(|()| sock.bind(&SocketAddr::new(any, port).into()))
        .map_err(|e| ProbeError::Io {
            step: "bind",
            error: format!("flow source port {port}: {e}").into(),
        })
}

/// Issues the connect to `to` from `sock` (non-blocking, of `to`'s
/// family), now: when this returns, the SYN is out and the probe's timeout
/// runs (kubelet's semantics). The socket is closed with a reset once the
/// answer's head says enough (see [`gather`]; kubelet closes its TCP
/// probes the same way): no
/// FIN exchange, no socket left in a closing state, for tens of thousands
/// of probes a round.
///
/// Quick acks are off before the connect, so the kernel holds the
/// handshake's last ACK for the request, which is written as soon as the
/// connect completes, and the ACK goes out in it: a segment fewer from
/// the prober for every answered probe. (Were the request over 200 ms
/// late, the kernel's delayed-ACK timer would still send the ACK.) The
/// setting only saves a segment, so a failure to make it is ignored.
pub(super) fn issue_connect(sock: &socket2::Socket, to: SocketAddr) -> Result<(), ProbeError> {
    sock.set_linger(Some(Duration::ZERO))
        .map_err(|e| ProbeError::io("SO_LINGER", &e))?;
    let _ = sock.set_tcp_quickack(false);
    match sock.connect(&to.into()) {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Ok(()),
        Err(e) => Err(ProbeError::io("connect", &e)),
    }
}

/// Once the request is written: the answer's ACK is held as the
/// handshake's was (the kernel turned quick acks back on when the
/// connect completed). The reset that closes the connection once the
/// head is read makes it moot, so an answered probe normally sends its
/// SYN, its request and its reset, and nothing else (the ACK still goes
/// out when the head is read over 40 ms after the answer came). A head
/// that comes in parts turns quick acks back on, so that a server
/// writing it in several small writes, with Nagle's algorithm on, does
/// not wait for a delayed ACK between them: the agent's own hello server
/// writes its answer at once. Only a segment is at stake, so a failure
/// is ignored.
pub(super) fn request_sent(sock: &socket2::Socket) {
    let _ = sock.set_tcp_quickack(false);
}

/// The longest head read: a status line past it is not HTTP, and a head
/// past it without the node header is judged on its status alone.
pub(super) const HEAD_MAX: usize = 512;

/// The header a hello answer names its node in (the agent's hello
/// servers send it; other servers, and agents before it, do not).
pub const NODE_HEADER: &str = "X-Health-Node";

/// The tag a node's name is checked by in a probe's answer: FNV-1a of
/// its bytes, never 0 (a target's tag 0: no check). Four bytes a target,
/// not its name: a wrong node's answer is told apart but for a chance of
/// one in four billion.
#[must_use]
pub fn node_tag(name: &[u8]) -> u32 {
    let hash = name.iter().fold(0x811c_9dc5_u32, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    hash.max(1)
}

/// The most interim answers passed over before a final one, as in Go's
/// client: past them the peer is failing the probe.
pub(super) const MAX_INTERIM: usize = 5;

/// Gathers the answer's head from what each read brought (`read`; empty
/// and `closed` once the peer closed): once the status line and the
/// [`NODE_HEADER`] or the head's end are in (or the head passed
/// [`HEAD_MAX`]), the status, or why it is not one: not HTTP, a head the
/// peer cut short by closing, or the answer of another node than the one
/// tagged `expected` (0: any). Interim answers (1xx but 101) before the
/// final one are passed over, as Go's client (and so kubelet) does: at
/// most [`MAX_INTERIM`], each dropped once passed, so that only the final
/// answer's head counts toward [`HEAD_MAX`]. `None` while more is to
/// come. A head that comes in parts is kept in `carried` (empty and
/// unallocated in the usual case, where it comes whole); reads take at
/// most `HEAD_MAX - carried.len()` bytes.
pub(super) fn gather(
    carried: &mut Carried,
    read: &[u8],
    expected: u32,
    closed: bool,
) -> Option<Result<u16, ProbeError>> {
    let mut interim = carried.interim;
    let whole = if carried.head.is_empty() {
        read
    } else {
        carried.head.extend_from_slice(read);
        &carried.head[..]
    };
    // What to say when the answer's head is not all in: wait for more, or
    // why not.
    let short = |what: &'static str, len: usize| {
        if closed {
            Some(Err(closed_early(what)))
        } else if len >= HEAD_MAX {
            Some(Err(ProbeError::Protocol(
                format!("{what} past {HEAD_MAX} bytes").into(),
            )))
        } else {
            None
        }
    };
    let mut head = whole;
    let (status, line) = loop {
        let Some(line) = head.windows(2).position(|w| w == b"\r\n") else {
            let wait = short("a status line", head.len());
            let passed = whole.len() - head.len();
            if wait.is_none() {
                carried.keep(read, passed, interim);
            }
            return wait;
        };
        let status = match parse_status(head) {
            Ok(status) => status,
            Err(e) => return Some(Err(e)),
        };
        if !(100..200).contains(&status) || status == 101 {
            break (status, line);
        }
        if interim == MAX_INTERIM {
            return Some(Err(ProbeError::Protocol(
                format!("more than {MAX_INTERIM} interim answers").into(),
            )));
        }
        let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") else {
            let wait = short("an interim answer's end", head.len());
            let passed = whole.len() - head.len();
            if wait.is_none() {
                carried.keep(read, passed, interim);
            }
            return wait;
        };
        interim += 1;
        head = &head[end + 4..];
    };
    match node_named(&head[line + 2..]) {
        Named::Node(name) if expected != 0 && node_tag(name) != expected => {
            Some(Err(other_node(name)))
        }
        Named::Node(_) | Named::Nobody => Some(Ok(status)),
        // A head past what is read, without the node's name: judged on
        // its status alone.
        Named::NotYet if head.len() >= HEAD_MAX => Some(Ok(status)),
        Named::NotYet if closed => Some(Err(closed_early("the head's end"))),
        Named::NotYet => {
            let passed = whole.len() - head.len();
            carried.keep(read, passed, interim);
            None
        }
    }
}

/// What an answer that comes in parts left to judge: its head so far,
/// less the interim answers passed over, and how many those were.
#[derive(Debug, Default)]
pub(super) struct Carried {
    head: Vec<u8>,
    interim: usize,
}

impl Carried {
    /// The bytes kept.
    pub(super) const fn len(&self) -> usize {
        self.head.len()
    }

    /// Whether nothing is carried: the next read starts an answer.
    pub(super) const fn is_empty(&self) -> bool {
        self.head.is_empty() && self.interim == 0
    }

    /// Keeps what a read left to judge, `passed` bytes of interim answers
    /// (`interim` so far) dropped from its front.
    fn keep(&mut self, read: &[u8], passed: usize, interim: usize) {
        if self.head.is_empty() {
            self.head.extend_from_slice(&read[passed..]);
        } else {
            self.head.drain(..passed);
        }
        self.interim = interim;
    }
}

/// What a head's header lines say of the node that answered.
enum Named<'a> {
    /// [`NODE_HEADER`]'s value.
    Node(&'a [u8]),
    /// The head ended without it.
    Nobody,
    /// Neither yet: a line is not whole.
    NotYet,
}

/// The node [`NODE_HEADER`] names in `lines` (the head after its status
/// line).
fn node_named(mut lines: &[u8]) -> Named<'_> {
    while let Some(end) = lines.windows(2).position(|w| w == b"\r\n") {
        let line = &lines[..end];
        if line.is_empty() {
            return Named::Nobody;
        }
        if let Some((name, value)) = line.split_at_checked(NODE_HEADER.len() + 1)
            && name[..NODE_HEADER.len()].eq_ignore_ascii_case(NODE_HEADER.as_bytes())
            && name[NODE_HEADER.len()] == b':'
        {
            return Named::Node(value.trim_ascii());
        }
        lines = &lines[end + 2..];
    }
    Named::NotYet
}

/// Another node's answer, its name cut short (it ends up in every view).
fn other_node(name: &[u8]) -> ProbeError {
    let (shown, cut) = cut_short(&String::from_utf8_lossy(name));
    ProbeError::OtherNode(format!("{shown}{cut}").into())
}

/// A peer's text cut to [`SHOWN`] characters, and `...` when it was (or
/// nothing).
fn cut_short(text: &str) -> (String, &'static str) {
    let shown: String = text.chars().take(SHOWN).collect();
    let cut = if shown.len() < text.len() { "..." } else { "" };
    (shown, cut)
}

/// What a connection closed before `what` of its head (a status line,
/// the head's end) is: an answer cut short, a failure as it is to Go's
/// client (and so to kubelet).
pub(super) fn closed_early(what: &str) -> ProbeError {
    ProbeError::Protocol(format!("connection closed before {what}").into())
}

/// Kubelet's reading of a status: 2xx success, 3xx success with a
/// warning, anything else a failure.
pub(super) fn classify(status: u16, rtt: Duration) -> Outcome {
    match status {
        200..=299 => Outcome::Ok {
            rtt,
            warning: None,
            source: RttSource::Userspace,
        },
        300..=399 => Outcome::Ok {
            rtt,
            warning: Some(format!("HTTP {status} (redirect)").into()),
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

/// The kind of socket an HTTP probe over `family` uses.
#[must_use]
pub const fn tcp_for(family: Family) -> SocketKind {
    match family {
        Family::Ipv4 => TCP_V4,
        Family::Ipv6 => TCP_V6,
    }
}

/// The request to `to`, written into `buf` (no allocation per probe; the
/// longest, to an IPv6 address, takes 123 bytes). `SocketAddr` writes
/// `[2001:2::1]:4240` for IPv6: the Host header's form (RFC 3986).
pub(super) fn request(buf: &mut [u8; 160], to: SocketAddr) -> &[u8] {
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
    match (parts.next(), parts.next().and_then(status_code)) {
        (Some(v), Some(code)) if v.starts_with("HTTP/1.") => Ok(code),
        _ => {
            // The peer's bytes, cut short: they end up in every view.
            let (shown, cut) = cut_short(text);
            Err(ProbeError::Protocol(
                format!("not an HTTP status line: {shown:?}{cut}").into(),
            ))
        }
    }
}

/// Characters of a line that is not HTTP shown in the probe's error.
const SHOWN: usize = 48;

/// A status code as RFC 9110 has it, three digits from 100 to 599 (a
/// peer's `HTTP/1.1 4711` is not HTTP, and cannot make a class of error of
/// its own).
fn status_code(code: &str) -> Option<u16> {
    (code.len() == 3 && code.bytes().all(|b| b.is_ascii_digit()))
        .then(|| code.parse().ok())
        .flatten()
        .filter(|c| (100..=599).contains(c))
}

#[cfg(test)]
mod tests {
    use std::{net::Ipv4Addr, time::Instant};

    use super::*;

    /// The median of `d`.
    fn median(d: &mut [Duration]) -> Duration {
        d.sort_unstable();
        d[d.len() / 2]
    }

    #[test]
    fn binding_a_flow_port_stays_cheap_with_thousands_of_sockets_on_it() {
        use nix::sys::resource::{Resource, getrlimit, setrlimit};
        const N: usize = 3_000;
        if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
            && soft < hard
        {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
        let port = fastrand::u16(61_001..65_000);
        let mut socks = Vec::with_capacity(N);
        let mut took = Vec::with_capacity(N);
        for i in 0..N {
            let [hi, lo] = u16::try_from(i).expect("fits").to_be_bytes();
            // Nobody listens on the discard port: each connect is refused
            // and its socket stays bound, as a round's do until closed.
            let to = SocketAddr::from((Ipv4Addr::new(127, 1, hi, lo.max(1)), 9));
            let (domain, ty, proto) = tcp_for(Family::Ipv4);
            let sock = socket2::Socket::new(domain, ty.nonblocking(), proto).expect("socket");
            let t = Instant::now();
            bind_source_port(&sock, to, port).expect("bind");
            took.push(t.elapsed());
            let _ = issue_connect(&sock, to);
            socks.push(sock);
        }
        let first = median(&mut took[..500]);
        let last = median(&mut took[N - 500..]);
        assert!(
            last < first * 3 + Duration::from_micros(5),
            "binding the flow port with {N} sockets on it took {last:?} (median), \
             with none {first:?}: the bind checks every socket on the port"
        );
    }

    /// Segments `sock` has sent (`tcpi_segs_out`).
    fn segments_out(sock: &socket2::Socket) -> u32 {
        crate::sys::sockopt::tcp_info(sock)
            .expect("TCP_INFO")
            .tcpi_segs_out
    }

    fn wait_for(sock: &socket2::Socket, events: libc::c_short) {
        use std::os::fd::AsRawFd as _;
        let mut fds = libc::pollfd {
            fd: sock.as_raw_fd(),
            events,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&raw mut fds, 1, 2_000) };
        assert_eq!(n, 1, "the socket did not become ready in 2 s");
    }

    /// What a probe's client sent: segments before its request and after
    /// the answer, and whether the test ran promptly enough for them to
    /// mean something.
    struct Sent {
        before: u32,
        after: u32,
        /// The kernel's delayed-ACK timers (40 ms for the answer, 200 ms
        /// for the handshake) fire only when this thread is held up that
        /// long; a run where it was says nothing of what the agent holds.
        prompt: bool,
    }

    /// A probe against a local server that answers and closes, the
    /// request written `pause` after the connect completed.
    fn probe_segments(pause: Duration) -> Sent {
        use std::io::{Read as _, Write as _};
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("listen");
        let to = listener.local_addr().expect("address");
        let (domain, ty, proto) = tcp_for(Family::Ipv4);
        let sock = socket2::Socket::new(domain, ty.nonblocking(), proto).expect("socket");
        issue_connect(&sock, to).expect("connect");
        wait_for(&sock, libc::POLLOUT);
        let connected = Instant::now();
        assert!(
            sock.take_error().expect("SO_ERROR").is_none(),
            "connect failed"
        );
        std::thread::sleep(pause);
        let before = segments_out(&sock);
        let before_at = connected.elapsed();
        let mut buf = [0u8; 160];
        let req = request(&mut buf, to);
        assert_eq!(sock.send(req).expect("send"), req.len());
        request_sent(&sock);
        let (mut server, _) = listener.accept().expect("accept");
        let mut got = vec![0u8; req.len()];
        server.read_exact(&mut got).expect("the request");
        server
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .expect("the answer");
        let answered = Instant::now();
        drop(server);
        sock.set_nonblocking(false).expect("blocking");
        sock.set_read_timeout(Some(Duration::from_secs(2)))
            .expect("read timeout");
        let mut status = String::new();
        (&sock).read_to_string(&mut status).expect("the answer");
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        let after = segments_out(&sock);
        Sent {
            before,
            after,
            prompt: answered.elapsed() < Duration::from_millis(35)
                && before_at < pause + Duration::from_millis(150),
        }
    }

    /// [`probe_segments`] until a run is prompt (at most five).
    fn prompt_probe(pause: Duration) -> Sent {
        (0..5)
            .map(|_| probe_segments(pause))
            .find(|s| s.prompt)
            .expect("five probes in a row held up past the kernel's delayed-ACK time")
    }

    #[test]
    fn an_answered_probe_sends_its_syn_its_request_and_nothing_else_before_closing() {
        // The handshake's ACK goes in the request, and the answer and its
        // FIN are not acknowledged before the reset.
        let sent = prompt_probe(Duration::ZERO);
        assert_eq!((sent.before, sent.after), (1, 2));
    }

    #[test]
    fn the_answers_ack_is_held_even_when_the_request_went_late() {
        // 80 ms is past the kernel's shortest delayed-ACK time (40 ms), so
        // its own guess that the connection is interactive no longer
        // holds the answer's ACK.
        let sent = prompt_probe(Duration::from_millis(80));
        assert_eq!(
            sent.after,
            sent.before + 1,
            "only the request after the pause"
        );
    }

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

    /// A head that comes in parts is gathered; a close before its end is
    /// an answer cut short (a failure to Go's client, and so to kubelet);
    /// a status line without an end in 512 bytes is an error naming it, a
    /// head past them without the node's name is judged on its status.
    #[test]
    fn heads_are_gathered_from_their_parts() {
        let mut carried = Carried::default();
        for part in [
            &b"HTTP/1.1 2"[..],
            b"04 No",
            b" Content\r",
            b"\n",
            b"Server: x\r\n",
        ] {
            assert_eq!(gather(&mut carried, part, 0, false), None);
        }
        assert_eq!(gather(&mut carried, b"\r\n", 0, false), Some(Ok(204)));
        // Whole in one read: nothing carried, nothing allocated.
        let mut carried = Carried::default();
        let busy = b"HTTP/1.0 503 Busy\r\n\r\nx";
        assert_eq!(gather(&mut carried, busy, 0, false), Some(Ok(503)));
        assert_eq!(carried.head.capacity(), 0);
        // A status line, then the peer closes: cut short.
        let mut carried = Carried::default();
        let ok = b"HTTP/1.1 200 OK\r\nX-Health-Node: node-3";
        assert_eq!(gather(&mut carried, &ok[..17], 0, false), None);
        let cut = Some(Err(closed_early("the head's end")));
        assert_eq!(gather(&mut carried, b"", 0, true), cut);
        // ... or mid-way through the node's header, naming another node.
        let tag = node_tag(b"node-2");
        assert_eq!(gather(&mut Carried::default(), ok, tag, true), cut);
        // Closed before a whole status line: not HTTP.
        let mut carried = Carried::default();
        assert_eq!(gather(&mut carried, b"HTTP/1.1 2", 0, false), None);
        let no_status = Some(Err(closed_early("a status line")));
        assert_eq!(gather(&mut carried, b"", 0, true), no_status);
        assert_eq!(gather(&mut Carried::default(), b"", 0, true), no_status);
        let mut carried = Carried::default();
        assert_eq!(gather(&mut carried, &[b'x'; 300], 0, false), None);
        assert_eq!(
            gather(&mut carried, &[b'x'; 212], 0, false),
            Some(Err(ProbeError::Protocol(
                "a status line past 512 bytes".into()
            )))
        );
        // A head past the limit before the node header: judged on its
        // status alone.
        let long = format!("HTTP/1.1 200 OK\r\nX-Pad: {}\r\n", "p".repeat(600));
        let first = &long.as_bytes()[..HEAD_MAX];
        assert_eq!(
            gather(&mut Carried::default(), first, tag, false),
            Some(Ok(200))
        );
    }

    /// Interim answers (1xx but 101) are passed over, whole or in parts,
    /// and the final answer judged; 101 is a final answer (a failure).
    #[test]
    fn interim_answers_are_passed_over() {
        let tag = node_tag(b"node-2");
        let two = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\n\
                    HTTP/1.1 200 OK\r\nX-Health-Node: node-2\r\n\r\n";
        assert_eq!(
            gather(&mut Carried::default(), two, tag, false),
            Some(Ok(200))
        );
        let mut carried = Carried::default();
        let parts = two.chunks(7).count();
        for (i, part) in two.chunks(7).enumerate() {
            if let Some(done) = gather(&mut carried, part, tag, false) {
                assert_eq!(done, Ok(200));
                assert_eq!(i, parts - 1, "judged once whole");
            }
        }
        let other =
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nX-Health-Node: node-3\r\n\r\n";
        assert_eq!(
            gather(&mut Carried::default(), other, tag, false),
            Some(Err(ProbeError::OtherNode("node-3".into())))
        );
        // Closed after the interim answer: no final one.
        let mut carried = Carried::default();
        assert_eq!(gather(&mut carried, &two[..25], 0, false), None);
        assert_eq!(
            gather(&mut carried, b"", 0, true),
            Some(Err(closed_early("a status line")))
        );
        let switching = b"HTTP/1.1 101 Switching Protocols\r\n\r\n";
        assert_eq!(
            gather(&mut Carried::default(), switching, 0, false),
            Some(Ok(101))
        );
        assert_eq!(
            classify(101, Duration::from_millis(1)),
            Outcome::Failed(ProbeError::HttpStatus(101))
        );
    }

    /// Only the final answer's head counts toward the bytes read: interim
    /// answers passed over are dropped, in one read or across reads; past
    /// [`MAX_INTERIM`] of them, even in parts, the probe fails naming why.
    #[test]
    fn interim_answers_are_dropped_once_passed_and_bounded() {
        let tag = node_tag(b"node-2");
        let early = format!(
            "HTTP/1.1 103 Early Hints\r\nLink: <{}>\r\n\r\n",
            "a".repeat(200)
        );
        let fin = "HTTP/1.1 200 OK\r\nX-Health-Node: node-2\r\n\r\n";
        // Two interim answers of 230 bytes and the final one: 500 bytes
        // past the head's limit in all.
        let answer = format!("{early}{early}{fin}");
        assert!(answer.len() > HEAD_MAX);
        let mut carried = Carried::default();
        let mut done = None;
        for part in answer.as_bytes().chunks(HEAD_MAX - 100) {
            assert!(done.is_none(), "judged before the final answer");
            assert!(carried.len() < HEAD_MAX);
            done = gather(&mut carried, part, tag, false);
        }
        assert_eq!(done, Some(Ok(200)));
        let too_many = format!(
            "{}{fin}",
            "HTTP/1.1 100 Continue\r\n\r\n".repeat(MAX_INTERIM + 1)
        );
        let refused = Some(Err(ProbeError::Protocol(
            format!("more than {MAX_INTERIM} interim answers").into(),
        )));
        assert_eq!(
            gather(&mut Carried::default(), too_many.as_bytes(), tag, false),
            refused
        );
        // The same, one interim answer a read: counted across reads.
        let mut carried = Carried::default();
        let mut done = None;
        for part in too_many.as_bytes().chunks(25) {
            if done.is_none() {
                done = gather(&mut carried, part, tag, false);
            }
        }
        assert_eq!(done, refused);
        // As many as allowed pass.
        let most = format!(
            "{}{fin}",
            "HTTP/1.1 100 Continue\r\n\r\n".repeat(MAX_INTERIM)
        );
        assert_eq!(
            gather(&mut Carried::default(), most.as_bytes(), tag, false),
            Some(Ok(200))
        );
    }

    /// An answer naming another node than the address's fails the probe,
    /// naming that node; one naming none (another server, an older agent)
    /// is judged on its status.
    #[test]
    fn the_node_an_answer_names_is_the_one_probed() {
        let tag = node_tag(b"node-2");
        let answer = |status: &str, name: &str| {
            format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nx-health-node:  {name} \r\n\r\nok\n"
            )
        };
        let read = |text: &str, expected| {
            gather(&mut Carried::default(), text.as_bytes(), expected, false)
        };
        assert_eq!(read(&answer("200 OK", "node-2"), tag), Some(Ok(200)));
        let other = Some(Err(ProbeError::OtherNode("node-3".into())));
        assert_eq!(read(&answer("200 OK", "node-3"), tag), other);
        assert_eq!(read(&answer("404 Not Found", "node-3"), tag), other);
        assert_eq!(read(&answer("200 OK", "node-3"), 0), Some(Ok(200)));
        assert_eq!(
            read("HTTP/1.1 200 OK\r\nServer: x\r\n\r\n", tag),
            Some(Ok(200))
        );
        assert_eq!(
            read("HTTP/1.1 200 OK\r\nX-Health-Nodes: node-3\r\n\r\n", tag),
            Some(Ok(200))
        );
        // In parts, the header cut in two.
        let mut carried = Carried::default();
        for part in [&b"HTTP/1.1 200 OK\r\nX-Health-No"[..], b"de: node-"] {
            assert_eq!(gather(&mut carried, part, tag, false), None);
        }
        assert_eq!(gather(&mut carried, b"3\r\n", tag, false), other);
        // A name past what is shown is cut.
        let long = "n".repeat(200);
        let Some(Err(ProbeError::OtherNode(shown))) = read(&answer("200 OK", &long), tag) else {
            panic!("another node");
        };
        assert_eq!(&*shown, format!("{}...", &long[..SHOWN]));
        assert_ne!(node_tag(b"node-2"), node_tag(b"node-3"));
    }

    #[test]
    fn status_lines_parse_or_are_rejected() {
        assert_eq!(parse_status(b"HTTP/1.1 200 OK\r\n"), Ok(200));
        assert_eq!(parse_status(b"HTTP/1.0 404 Not Found\r\n"), Ok(404));
        assert!(parse_status(b"SSH-2.0-OpenSSH\r\n").is_err());
        assert!(parse_status(b"HTTP/1.1 abc\r\n").is_err());
        for code in ["4711", "099", "600", "+20", "20", "2000"] {
            let line = format!("HTTP/1.1 {code} X\r\n");
            assert!(parse_status(line.as_bytes()).is_err(), "{code}");
        }
        assert_eq!(parse_status(b"HTTP/1.1 599\r\n"), Ok(599));
        assert_eq!(parse_status(b"HTTP/1.1 100 Continue\r\n"), Ok(100));
        let long = format!("{}\r\n", "x".repeat(400));
        let Err(ProbeError::Protocol(shown)) = parse_status(long.as_bytes()) else {
            panic!("a long line is not HTTP");
        };
        assert!(shown.len() < 100 && shown.ends_with("..."), "{shown}");
    }
}
