//! ICMP echo for a whole round at once, without a task or a timer per
//! probe: one raw socket per source namespace; the round's requests are
//! paced out over the spread from one loop that also reads the replies,
//! matches them by identifier, sequence, source and the request's token
//! (its payload's first 8 bytes), and ends once every request is
//! answered, or a timeout after the last one still unanswered went.
//! Identifiers name flows and stay the same from round to round (see
//! [`Numbering`]); sequence numbers start at a random offset each round
//! and the tokens are drawn anew, so a late reply of an earlier round is
//! not taken for this one's, nor a reply forged without the request.

use std::{
    io,
    net::{IpAddr, Ipv6Addr, SocketAddr},
    time::Duration,
};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use tokio::{
    io::unix::{AsyncFd, AsyncFdReadyGuard},
    time::{Instant, sleep_until},
};

use super::{
    arrival::{Received, recv_stamped, stamp_arrivals},
    error::{ProbeError, Proto},
    family::{Families, Family},
    order::Echoes,
};
use crate::sys::{
    icmp::{
        echo_request, echo_request_v6, padded_echo_request, parse_any_reply, parse_any_reply_v6,
    },
    netns::Netns,
    sockopt::{self, Buffer},
};

/// The IP headers the kernel adds to a raw socket's ICMP message.
const IPV4_HEADER: usize = 20;
const IPV6_HEADER: usize = 40;

/// The MTU probes of a round of N targets: requests N on, IP packets of
/// `bytes` bytes with Don't Fragment. MTU probe `k` (request `N + k`)
/// goes to the address of request `follows[k]`, and
/// only once that request's echo is answered, read within a tenth of the
/// timeout of its sending: a black hole is an address that answers small
/// echoes and loses large ones, so an address that does not answer gets
/// none (at 10,000 peers, half of them silent, 5,000 large echoes a round
/// fewer), and an MTU probe still unanswered keeps the round at most a
/// tenth of a timeout past its small echo's deadline (an answer read
/// later, on a busy node, leaves the address without a verdict that
/// round).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Padded {
    pub bytes: usize,
    pub follows: std::sync::Arc<[usize]>,
}

/// An MTU probe whose small echo was not answered in time: never sent.
const MTU_NOT_SENT: &str = "MTU probe not sent: the small echo went unanswered";

/// Sequence numbers per identifier: a flow of more targets uses the next
/// identifiers too.
const PER_IDENTIFIER: usize = 1 << 16;

/// How a round's requests are named on the wire: flow after flow, each
/// flow's identifiers the same every round (so a router that hashes the
/// identifier sends a flow the same way each time), then the MTU probes
/// as one flow more; each flow's sequence numbers start at `seq_base`,
/// drawn anew each round.
///
/// Each request carries a token of its own as its payload's first 8
/// bytes ([`Numbering::token`]), which its reply must echo: the
/// identifier and sequence are 32 bits, guessable in a flood, and a
/// reply forged with a silent node's address would otherwise pass for
/// its answer. A peer learns the tokens of its own requests only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Numbering {
    /// Requests a flow: the round's targets.
    pub per_flow: usize,
    /// Flows (the MTU probes come after them).
    pub flows: usize,
    /// The identifier of flow 0.
    pub base: u16,
    pub seq_base: u16,
    /// Drawn anew each round: no token is used twice.
    pub nonce: u64,
}

/// The key of the requests' tokens: a keyed hash (`SipHash`) whose keys
/// the standard library draws from the operating system's random source.
/// It draws them once a thread and derives a thread's later keys from
/// them, so the key is made on a thread of its own: related to no hash
/// table's key elsewhere in the agent.
fn token_key() -> &'static std::hash::RandomState {
    static KEY: std::sync::OnceLock<std::hash::RandomState> = std::sync::OnceLock::new();
    KEY.get_or_init(|| {
        std::thread::Builder::new()
            .spawn(std::hash::RandomState::new)
            .ok()
            .and_then(|t| t.join().ok())
            .unwrap_or_default()
    })
}

impl Numbering {
    /// One flow, one identifier, sequence numbers from 0: requests numbered
    /// as `targets` are.
    #[must_use]
    pub fn single(base: u16, per_flow: usize) -> Self {
        Self {
            per_flow,
            flows: 1,
            base,
            seq_base: 0,
            nonce: fastrand::u64(..),
        }
    }

    /// The payload's first 8 bytes of request `i`, which its reply must
    /// carry back.
    #[must_use]
    pub fn token(&self, i: usize) -> [u8; 8] {
        use std::hash::BuildHasher as _;
        token_key().hash_one((self.nonce, i)).to_ne_bytes()
    }

    /// Identifiers a flow takes.
    const fn blocks(&self) -> usize {
        let b = self.per_flow.div_ceil(PER_IDENTIFIER);
        if b == 0 { 1 } else { b }
    }

    /// Flow `f`'s (first) identifier: its name on the wire.
    #[must_use]
    #[allow(
        clippy::cast_possible_truncation,
        reason = "identifiers wrap around 16 bits"
    )]
    pub const fn flow_id(&self, f: usize) -> u16 {
        self.base.wrapping_add((f * self.blocks()) as u16)
    }

    /// The identifier and sequence of request `i`.
    #[allow(
        clippy::cast_possible_truncation,
        reason = "the low 16 bits are the sequence, the rest picks the identifier"
    )]
    const fn ident(&self, i: usize) -> (u16, u16) {
        let f = match i.checked_div(self.per_flow) {
            Some(f) if f < self.flows => f,
            _ => self.flows,
        };
        let j = i - f * self.per_flow;
        (
            self.flow_id(f).wrapping_add((j / PER_IDENTIFIER) as u16),
            self.seq_base.wrapping_add((j % PER_IDENTIFIER) as u16),
        )
    }

    /// Request `i` as it goes on the wire.
    fn named(&self, i: usize) -> Named {
        let (id, seq) = self.ident(i);
        Named {
            id,
            seq,
            token: self.token(i),
        }
    }

    /// The request identifier `id` and sequence `seq` name, of `total`.
    fn request(&self, id: u16, seq: u16, total: usize) -> Option<usize> {
        let k = usize::from(id.wrapping_sub(self.base));
        let (f, block) = (k / self.blocks(), k % self.blocks());
        let j = block * PER_IDENTIFIER + usize::from(seq.wrapping_sub(self.seq_base));
        let i = f * self.per_flow + j;
        (f <= self.flows && (j < self.per_flow || f == self.flows) && i < total).then_some(i)
    }
}
/// A request's identifier, sequence and token.
#[derive(Debug, Clone, Copy)]
struct Named {
    id: u16,
    seq: u16,
    token: [u8; 8],
}

/// `ICMP6_FILTER` of `<netinet/icmp6.h>` (level `IPPROTO_ICMPV6`).
const ICMP6_FILTER: libc::c_int = 1;

/// The engine: a raw ICMP socket and a raw `ICMPv6` socket (each when its
/// family is probed), both made in the source namespace and read by the
/// same loop.
pub struct IcmpProber {
    v4: Option<AsyncFd<Socket>>,
    v6: Option<AsyncFd<Socket>>,
    /// Why a family probed has no socket (the other one's opened): its
    /// requests fail with this.
    missing: [Option<String>; 2],
}

/// A round's requests' addresses: its targets, then its MTU probes',
/// each the address of the request it follows (not copied: 30,000
/// addresses at 10,000 peers).
#[derive(Debug, Clone, Copy)]
struct Addresses<'a> {
    targets: &'a [IpAddr],
    follows: &'a [usize],
}

#[cfg(test)]
impl<'a> Addresses<'a> {
    /// The targets alone.
    fn of(targets: &'a [IpAddr]) -> Self {
        Self {
            targets,
            follows: &[],
        }
    }
}

impl Addresses<'_> {
    fn len(&self) -> usize {
        self.targets.len() + self.follows.len()
    }

    /// Request `i`'s address.
    fn get(&self, i: usize) -> Option<IpAddr> {
        match i.checked_sub(self.targets.len()) {
            None => self.targets.get(i).copied(),
            Some(k) => self
                .follows
                .get(k)
                .and_then(|&j| self.targets.get(j))
                .copied(),
        }
    }
}

/// How far a reply's arrival stamp, taken on the real-time clock and
/// moved to the monotonic one, may fall before the instant its request was
/// sent (read from the monotonic clock before the send): the move reads
/// both clocks one after the other, and a thread preempted between them
/// shifts the stamp by as long. Within it, the stamp stands (an RTT of
/// zero); past it, the clock stepped and the read time stands.
const STAMP_ERROR: Duration = Duration::from_millis(1);

/// When each request went: nanoseconds after `base`, plus one (0: not
/// sent, or answered already). 8 bytes a request, not 16.
struct SentAt {
    base: Instant,
    at: Vec<u64>,
}

impl SentAt {
    fn new(n: usize, base: Instant) -> Self {
        Self {
            base,
            at: vec![0; n],
        }
    }

    fn set(&mut self, i: usize, at: Instant) {
        let ns = u64::try_from(at.saturating_duration_since(self.base).as_nanos())
            .unwrap_or(u64::MAX - 1);
        if let Some(slot) = self.at.get_mut(i) {
            *slot = ns + 1;
        }
    }

    /// When request `i` went, while it is unanswered.
    fn get(&self, i: usize) -> Option<Instant> {
        let ns = *self.at.get(i)?;
        (ns > 0).then(|| self.base + Duration::from_nanos(ns - 1))
    }

    /// When request `i` went, once: a second call says it went unanswered.
    fn take(&mut self, i: usize) -> Option<Instant> {
        let ns = std::mem::take(self.at.get_mut(i)?);
        (ns > 0).then(|| self.base + Duration::from_nanos(ns - 1))
    }
}

/// A round's requests and what became of them.
struct Waiting<'a> {
    sent_at: SentAt,
    /// The requests sent and answered in time, marked as they are (read
    /// by the round's HTTP probes while they start).
    echoes: &'a Echoes,
    results: Vec<Result<Duration, ProbeError>>,
    /// Requests sent (or paced, still to send) and not yet answered nor
    /// timed out.
    pending: usize,
    timeout: Duration,
    /// For each small request, the MTU probe that follows its answer
    /// (`NO_MTU`: none).
    mtu_after: Vec<u32>,
    /// MTU probes whose small echo was answered, to send.
    mtu_due: Vec<usize>,
    /// The small requests that may still be unanswered: the first this
    /// many of the sending order (see [`Waiting::latest_unanswered`]).
    small_tail: usize,
    /// The MTU probes sent, in the order they went, less those found
    /// answered at the end.
    mtu_sent: Vec<u32>,
}

/// A small request that no MTU probe follows.
const NO_MTU: u32 = u32::MAX;

impl<'a> Waiting<'a> {
    /// Nothing sent yet: the small requests time out unless answered, the
    /// MTU probes are not sent unless their small echo is answered.
    fn new(addresses: Addresses<'_>, echoes: &'a Echoes, timeout: Duration) -> Self {
        let (n, small) = (addresses.len(), addresses.targets.len());
        // Sized once: 30,000 results at 10,000 peers, not grown to 40,000.
        let mut results = Vec::with_capacity(n);
        results.resize(
            small,
            Err(ProbeError::Timeout {
                proto: Proto::Icmp,
                after: timeout,
            }),
        );
        results.resize(n, Err(ProbeError::NotSent(MTU_NOT_SENT)));
        let mut mtu_after = Vec::new();
        if !addresses.follows.is_empty() {
            mtu_after = vec![NO_MTU; small];
            for (k, &i) in addresses.follows.iter().enumerate() {
                if let (Some(slot), Ok(k)) = (mtu_after.get_mut(i), u32::try_from(small + k)) {
                    *slot = k;
                }
            }
        }
        Self {
            sent_at: SentAt::new(n, Instant::now()),
            echoes,
            results,
            pending: small,
            timeout,
            mtu_after,
            mtu_due: Vec::new(),
            small_tail: small,
            mtu_sent: Vec::new(),
        }
    }
}

impl Waiting<'_> {
    /// A message read (`r`, its bytes `pkt`): the reply to one of this
    /// round's requests, or not.
    fn reply(&mut self, pkt: &[u8], r: &Received, numbering: Numbering, targets: Addresses<'_>) {
        let i = match r.from {
            Some(src) => match_reply_v6(pkt, src, numbering, targets),
            None => match_reply(pkt, numbering, targets),
        };
        if let Some(i) = i {
            self.answered(i, Instant::from_std(r.at), Instant::now());
        }
    }

    /// The reply to request `i` came at `at`, read at `now`. It carries
    /// this round's token of the request, so it is the request's answer
    /// whatever its stamp says: a stamp before the request went (by more
    /// than the clocks' error) is the real-time clock stepped forward
    /// between the reply's arrival and its read, and the read time, the
    /// latest it can have come, stands for it.
    fn answered(&mut self, i: usize, at: Instant, now: Instant) {
        let at = match self.sent_at.get(i) {
            Some(sent) if at + STAMP_ERROR < sent => now,
            _ => at,
        };
        if let Some(sent) = self.sent_at.take(i) {
            let rtt = at.saturating_duration_since(sent);
            if rtt <= self.timeout {
                self.results[i] = Ok(rtt);
                self.echoes.answered(i);
                // Its MTU probe, if it has one, goes now (see `Padded`).
                match self.mtu_after.get(i) {
                    Some(&k)
                        if k != NO_MTU
                            && now.saturating_duration_since(sent) <= self.timeout / 10 =>
                    {
                        self.mtu_due.push(k as usize);
                    }
                    _ => {}
                }
            }
            self.pending -= 1;
        }
    }

    /// When the request sent last of those still unanswered went, once
    /// every small request is out (`sent_in_order(p)`: the small request
    /// sent `p`-th): the round waits a timeout after it, for no later
    /// request is waited for, and an earlier one's own timeout is over
    /// sooner. A round that sends its likely silent targets first ends a
    /// timeout after the last of them, not after its last request.
    /// Found from the end back, each request passed over once a round.
    fn latest_unanswered(&mut self, sent_in_order: impl Fn(usize) -> usize) -> Option<Instant> {
        let mut small = None;
        while self.small_tail > 0 {
            if let Some(at) = self.sent_at.get(sent_in_order(self.small_tail - 1)) {
                small = Some(at);
                break;
            }
            self.small_tail -= 1;
        }
        let mut mtu = None;
        while let Some(&k) = self.mtu_sent.last() {
            if let Some(at) = self.sent_at.get(k as usize) {
                mtu = Some(at);
                break;
            }
            self.mtu_sent.pop();
        }
        small.max(mtu)
    }

    /// MTU probe `k` (a request past the small ones) went at `at`, or
    /// could not go: lost unless answered.
    fn mtu_went(&mut self, k: usize, at: io::Result<Instant>) {
        self.pending += 1;
        if let Some(r) = self.results.get_mut(k) {
            *r = Err(ProbeError::Timeout {
                proto: Proto::Icmp,
                after: self.timeout,
            });
        }
        if at.is_ok()
            && let Ok(k) = u32::try_from(k)
        {
            self.mtu_sent.push(k);
        }
        self.sent(k, at);
    }

    /// When the round may end, once every small request is out: a
    /// timeout after the latest unanswered request went (none found,
    /// which pending requests rule out: `fallback`, rather than never).
    fn end(&mut self, sent_in_order: impl Fn(usize) -> usize, fallback: Instant) -> Instant {
        self.latest_unanswered(sent_in_order)
            .map_or(fallback, |at| at + self.timeout)
    }

    /// Request `i` went at `at` (or could not go: `Err`).
    fn sent(&mut self, i: usize, at: io::Result<Instant>) {
        match at {
            Ok(at) => {
                self.sent_at.set(i, at);
                self.echoes.sent(i, at);
            }
            Err(e) => {
                self.echoes.gave_up(i);
                self.results[i] = Err(ProbeError::io("sending echo request", &e));
                self.pending -= 1;
            }
        }
    }
}

/// `sock`'s readiness; never, without a socket.
async fn readable(sock: Option<&AsyncFd<Socket>>) -> io::Result<AsyncFdReadyGuard<'_, Socket>> {
    match sock {
        Some(s) => s.readable().await,
        None => std::future::pending().await,
    }
}

/// The TTL (hop limit) of the probes' echoes.
const PROBE_TTL: u32 = 64;
const _: () = assert!(PROBE_TTL > health_common::rtt::UNTIMED_MAX_TTL as u32);

/// A raw socket for `family`'s echo, its buffers sized for a round.
fn raw_socket(family: Family) -> io::Result<Socket> {
    let sock = match family {
        Family::Ipv4 => Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::ICMPV4))?,
        Family::Ipv6 => Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))?,
    };
    sock.set_nonblocking(true)?;
    stamp_arrivals(&sock)?;
    // Replies of a whole round may arrive in one burst, and all ICMP of
    // the namespace lands here: SO_RCVBUF is capped by
    // net.core.rmem_max (about 200 KiB, a few hundred replies), so the
    // privileged agent forces its size past the cap.
    sockopt::size_buffer(&sock, Buffer::Receive, 16 << 20)?;
    sockopt::size_buffer(&sock, Buffer::Send, 4 << 20)?;
    // Don't Fragment on every request, whatever the route's learnt path
    // MTU: an MTU probe too large for a hop is lost (or refused), never
    // cut into pieces that would pass.
    match family {
        Family::Ipv4 => sockopt::set(
            &sock,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            &libc::IP_PMTUDISC_PROBE,
        )?,
        Family::Ipv6 => sockopt::set(
            &sock,
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            &libc::IPV6_PMTUDISC_PROBE,
        )?,
    }
    // A TTL of its own, whatever the namespace's default (or a router
    // advertisement's hop limit): the kernel times no echo sent with a
    // path trace's.
    match family {
        Family::Ipv4 => sock.set_ttl_v4(PROBE_TTL)?,
        Family::Ipv6 => sock.set_unicast_hops_v6(PROBE_TTL)?,
    }
    if family == Family::Ipv6 {
        // Only echo replies: not the neighbour discovery and router
        // advertisements of the namespace.
        let mut filter = [u32::MAX; 8];
        let t = usize::from(health_common::headers::ICMPV6_ECHO_REPLY);
        filter[t / 32] &= !(1u32 << (t % 32));
        sockopt::set(&sock, libc::IPPROTO_ICMPV6, ICMP6_FILTER, &filter)?;
    }
    Ok(sock)
}

impl IcmpProber {
    /// Opens a socket per family of `families` in `netns` (the caller's
    /// when `None`); needs a tokio runtime. A family whose socket cannot be
    /// opened (IPv6 disabled in the kernel) fails its own requests only,
    /// unless no family has a socket.
    pub fn new(netns: Option<&Netns>, families: Families) -> io::Result<Self> {
        let opened = crate::sys::netns::run_in(netns, || {
            Family::ALL.map(|f| families.contains(f).then(|| raw_socket(f)))
        })
        .map_err(io::Error::other)?;
        let mut sockets: [Option<AsyncFd<Socket>>; 2] = [None, None];
        let mut missing: [Option<String>; 2] = [None, None];
        let mut first_error = None;
        for (f, opened) in Family::ALL.into_iter().zip(opened) {
            // SAFETY: the AsyncFd owns the socket and keeps its fd open.
            let registered = opened.map(|s| s.and_then(|s| Ok(unsafe { AsyncFd::register(s)? })));
            match registered {
                Some(Ok(sock)) => sockets[f.index()] = Some(sock),
                Some(Err(e)) => {
                    missing[f.index()] = Some(format!("no {f} echo socket: {e}"));
                    first_error.get_or_insert(e);
                }
                None => {}
            }
        }
        if let Some(e) = first_error
            && sockets.iter().all(Option::is_none)
        {
            return Err(e);
        }
        let [v4, v6] = sockets;
        Ok(Self { v4, v6, missing })
    }

    /// The receive buffer's size as the kernel keeps it (twice what was
    /// asked, for bookkeeping), of the first socket.
    pub fn recv_buffer_size(&self) -> io::Result<usize> {
        self.v4
            .as_ref()
            .or(self.v6.as_ref())
            .ok_or_else(|| io::Error::other("no ICMP socket"))?
            .get_ref()
            .recv_buffer_size()
    }

    /// One echo to each of `targets` (either family), the requests spread
    /// evenly over `spread` in the order of `order` (a permutation of the
    /// targets' indices; index order when `None` or when it is not one),
    /// then the MTU probes of `padded` each once its small echo is
    /// answered; each answer counts when it comes within `timeout` of its
    /// request. Results are in the order of `targets`, the MTU probes'
    /// after them; each request and answer is also marked in `echoes` as
    /// it happens.
    #[expect(
        clippy::too_many_arguments,
        reason = "the round's parts, each its own; grouping them would only rename them"
    )]
    pub async fn round(
        &self,
        targets: &[IpAddr],
        order: Option<&[usize]>,
        numbering: Numbering,
        padded: Option<Padded>,
        timeout: Duration,
        spread: Duration,
        echoes: &Echoes,
    ) -> Vec<Result<Duration, ProbeError>> {
        let addresses = Addresses {
            targets,
            follows: padded.as_ref().map_or(&[], |p| &p.follows),
        };
        // The small requests, paced; the MTU probes follow their answers.
        let small = targets.len();
        let mut w = Waiting::new(addresses, echoes, timeout);
        if small == 0 {
            return w.results;
        }
        let order = order.filter(|o| {
            let taken = is_permutation(o, small);
            if !taken {
                tracing::warn!(
                    "an echo order of {} for {small} targets, not each once: sent in target order",
                    o.len()
                );
            }
            taken
        });
        let sent_in_order = |p: usize| order.map_or(p, |o| o[p]);
        let start = Instant::now();
        let step = spread / u32::try_from(small).unwrap_or(u32::MAX).max(1);
        let mut next = 0usize;
        let mut buf = [0u8; 1500];
        let mut request = Vec::new();
        while w.pending > 0 || !w.mtu_due.is_empty() {
            // Send every request whose time has come.
            let now = Instant::now();
            while next < small && start + step * u32::try_from(next).unwrap_or(u32::MAX) <= now {
                let i = sent_in_order(next);
                let at = self
                    .send(targets[i], numbering.named(i), None, &mut request)
                    .await;
                w.sent(i, at);
                next += 1;
                if next == small {
                    tracing::debug!(
                        ms = start.elapsed().as_millis(),
                        "the round's echo requests are out"
                    );
                }
            }
            // Then the MTU probes whose small echo came back.
            while let Some(k) = w.mtu_due.pop() {
                let bytes = padded.as_ref().map(|p| p.bytes);
                let Some(dst) = addresses.get(k) else {
                    continue;
                };
                let at = self
                    .send(dst, numbering.named(k), bytes, &mut request)
                    .await;
                w.mtu_went(k, at);
            }
            if w.pending == 0 {
                break;
            }
            let wake = if next < small {
                super::pace::wake_for(
                    start,
                    start + step * u32::try_from(next).unwrap_or(u32::MAX),
                )
            } else {
                w.end(sent_in_order, start)
            };
            tokio::select! {
                ready = readable(self.v4.as_ref()) => {
                    let Ok(mut guard) = ready else { break };
                    // Drain every reply queued, then wait again.
                    while let Ok(Ok(r)) = guard.try_io(|s| recv_stamped(s.get_ref(), &mut buf)) {
                        w.reply(&buf[..r.len], &r, numbering, addresses);
                    }
                }
                ready = readable(self.v6.as_ref()) => {
                    let Ok(mut guard) = ready else { break };
                    while let Ok(Ok(r)) = guard.try_io(|s| recv_stamped(s.get_ref(), &mut buf)) {
                        w.reply(&buf[..r.len], &r, numbering, addresses);
                    }
                }
                () = sleep_until(wake) => {
                    // Replies read meanwhile only answered requests: every
                    // one still waited for went no later than the one
                    // this wake was for.
                    if next == small && Instant::now() >= wake {
                        // Replies that came in time and wait unread (a
                        // busy node) still count.
                        for sock in [&self.v4, &self.v6].into_iter().flatten() {
                            while let Ok(r) = recv_stamped(sock.get_ref(), &mut buf) {
                                w.reply(&buf[..r.len], &r, numbering, addresses);
                            }
                        }
                        break;
                    }
                }
            }
        }
        // Left the loop with requests not sent (a socket's readiness
        // failed): the HTTP probes waiting for their echoes wait no more.
        for p in next..small {
            echoes.gave_up(sent_in_order(p));
        }
        w.results
    }

    /// An echo request to `dst`: the usual 16 bytes, or an IP packet of
    /// `size` bytes (built in `padded`, reused across requests). Returns
    /// when it went.
    async fn send(
        &self,
        dst: IpAddr,
        Named { id, seq, token }: Named,
        size: Option<usize>,
        padded: &mut Vec<u8>,
    ) -> io::Result<Instant> {
        let small;
        let (sock, request): (_, &[u8]) = match (dst, size) {
            (IpAddr::V4(_), None) => {
                small = echo_request(id, seq, token);
                (self.v4.as_ref(), &small)
            }
            (IpAddr::V6(_), None) => {
                small = echo_request_v6(id, seq, token);
                (self.v6.as_ref(), &small)
            }
            (IpAddr::V4(_), Some(n)) => {
                let len = n.saturating_sub(IPV4_HEADER);
                padded_echo_request(padded, false, (id, seq), token, len);
                (self.v4.as_ref(), padded.as_slice())
            }
            (IpAddr::V6(_), Some(n)) => {
                let len = n.saturating_sub(IPV6_HEADER);
                padded_echo_request(padded, true, (id, seq), token, len);
                (self.v6.as_ref(), padded.as_slice())
            }
        };
        let sock =
            sock.ok_or_else(|| {
                let f = Family::of(dst);
                io::Error::other(self.missing[f.index()].clone().unwrap_or_else(|| {
                    format!("no {f} echo socket: this agent does not probe {f}")
                }))
            })?;
        let to = SockAddr::from(SocketAddr::new(dst, 0));
        loop {
            let mut guard = sock.writable().await?;
            // Taken before the call: the reply can come (and be stamped)
            // within it, on a veth.
            let at = Instant::now();
            match guard.try_io(|s| s.get_ref().send_to(request, &to)) {
                Ok(r) => return r.map(|_| at),
                Err(_would_block) => {}
            }
        }
    }
}

/// Whether `order` holds each of `0..n` once.
fn is_permutation(order: &[usize], n: usize) -> bool {
    let mut seen = vec![false; n];
    order.len() == n
        && order
            .iter()
            .all(|&i| seen.get_mut(i).is_some_and(|s| !std::mem::replace(s, true)))
}

/// The request of this round that identifier `id`, sequence `seq` and
/// `token` answer, when it went to `src`.
fn matching(
    src: IpAddr,
    (id, seq, token): (u16, u16, [u8; 8]),
    numbering: Numbering,
    targets: Addresses<'_>,
) -> Option<usize> {
    let i = numbering.request(id, seq, targets.len())?;
    (targets.get(i) == Some(src) && token == numbering.token(i)).then_some(i)
}

/// The index of the request `pkt` (an IPv4 packet) answers: identifier,
/// sequence and token of this round, from the address it was sent to.
fn match_reply(pkt: &[u8], numbering: Numbering, targets: Addresses<'_>) -> Option<usize> {
    let (src, id, seq, token) = parse_any_reply(pkt)?;
    matching(IpAddr::V4(src), (id, seq, token), numbering, targets)
}

/// The same for an `ICMPv6` message from `src`.
fn match_reply_v6(
    msg: &[u8],
    src: Ipv6Addr,
    numbering: Numbering,
    targets: Addresses<'_>,
) -> Option<usize> {
    matching(
        IpAddr::V6(src),
        parse_any_reply_v6(msg)?,
        numbering,
        targets,
    )
}

#[cfg(test)]
mod tests;
