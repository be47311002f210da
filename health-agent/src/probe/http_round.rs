//! A round's HTTP probes, without a future, a timer or a registration per
//! probe: a few tasks (one per CPU) each run an engine whose probes'
//! sockets are watched by one epoll set (edge-triggered, itself watched
//! by the runtime), whose deadlines are one queue (a round's timeouts are
//! equal and its starts in order, so deadlines come in start order), and
//! whose probes in flight are a slab of small records: 80 bytes a probe
//! in flight with its deadline, where a future per probe took 472 (and
//! its task's header), and 1,216 before that.
//!
//! A probe's timeout runs from its `connect` (kubelet's semantics): an
//! agent slowed by its own CPU never fails a live path for it, and the
//! round lasts the time to issue every connect plus one timeout. So the
//! connects are issued as the probes start, in [`order`]'s order (the
//! probes likely to last the whole timeout first), paced evenly over the
//! spread by one timer, at most a burst between two looks at the answers.
//!
//! The open-file budget bounds the probes in flight: each task holds at
//! most its share of it in sockets, made in the probe namespace in one
//! request per batch (beforehand for the round's first ones, then as
//! probes end).
//!
//! [`order`]: super::order

use std::{
    collections::VecDeque,
    io,
    net::{IpAddr, SocketAddr},
    os::fd::{AsRawFd, RawFd},
    pin::Pin,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU64, AtomicUsize, Ordering},
    },
    time::Duration,
};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use tokio::{
    io::unix::{AsyncFd, AsyncFdReadyGuard},
    time::Instant,
};

use super::{
    config::ProbeConfig,
    error::{ProbeError, Proto},
    family::Family,
    flows::{FlowPlan, Spread},
    http::{self, HEAD_MAX},
    metrics::ProbeMetrics,
    order::{Echoes, IssueOrder, Suspects},
    pace,
    path::Outcome,
};
use crate::sys::{fd_table, socket_factory::SocketFactory};

/// Connects a task issues at most between two looks at the answers of its
/// probes in flight (which are timed as they are read).
const BURST: usize = 64;
/// Events taken from the epoll set at once.
const EVENTS: usize = 256;
/// Outcomes a task keeps before it moves them into the round's (one lock
/// a batch, and at 10,000 peers 20,000 outcomes are not held twice).
const FLUSH: usize = 256;
/// How soon a task with no probe in flight asks again for a socket none
/// could be made of (the round's other tasks hold the descriptors, and
/// give them back as their probes end).
const SHORT_RETRY: Duration = Duration::from_millis(10);

/// Why a task's next batch of sockets waits: the last one made none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Held {
    /// Until fewer than this many of its probes are in flight (one ended
    /// and gave its descriptor back).
    InFlight(usize),
    /// Until then: none of its probes was in flight.
    Until(Instant),
}

impl Held {
    /// Whether a batch may be asked for again.
    fn over(self, busy: usize, now: Instant) -> bool {
        match self {
            Self::InFlight(held) => busy < held,
            Self::Until(t) => now >= t,
        }
    }

    fn retry(self) -> Option<Instant> {
        match self {
            Self::InFlight(_) => None,
            Self::Until(t) => Some(t),
        }
    }
}

/// What every task of a round shares.
struct Shared {
    targets: Arc<Vec<IpAddr>>,
    /// The tag of each target's node ([`http::node_tag`]), checked against
    /// the node its answer names; empty: no check.
    tags: Arc<Vec<u32>>,
    /// With more than one flow: how `targets` runs flow after flow, and
    /// the source port each flow binds.
    flows: Option<(Spread, FlowPlan)>,
    factory: Option<Arc<SocketFactory>>,
    /// Sockets a task holds at most (its share of the open-file budget).
    share: usize,
    port: u16,
    timeout: Duration,
    spread: Duration,
    t0: Instant,
    /// The latest start of the round, in microseconds from `t0`.
    latest_start: AtomicU64,
    /// The latest start of a probe that timed out (the round lasts until
    /// it does, a timeout later), likewise.
    latest_timed_out: AtomicU64,
    /// Probes in flight, every task's, and the sockets every task has
    /// closed so far: a task that can make no socket waits while the
    /// round's probes are in flight, or its sockets keep coming back.
    in_flight: AtomicUsize,
    given_back: AtomicUsize,
    /// The latest start of a probe that waited for descriptors (its
    /// task's share of the in-flight limit, or `EMFILE`) for at least
    /// [`HELD`] of the timeout, in microseconds from `t0` (0: none).
    latest_held_start: AtomicU64,
    echoes: Arc<Echoes>,
    metrics: Option<Arc<ProbeMetrics>>,
    /// The round's outcomes, in the order of `targets`: each task moves
    /// its own in, a batch at a time.
    outcomes: Mutex<Vec<Outcome>>,
}

impl Shared {
    /// A round of `cfg`'s to `targets` (each tagged by `tags`, or none), in
    /// flows as `spread` says, its sockets made by `factory`, shared by
    /// `workers` tasks, its probes waiting for `echoes`.
    fn new(
        cfg: &ProbeConfig,
        (targets, tags): (&Arc<Vec<IpAddr>>, &Arc<Vec<u32>>),
        spread: Spread,
        factory: Option<Arc<SocketFactory>>,
        workers: usize,
        echoes: &Arc<Echoes>,
    ) -> Self {
        Self {
            targets: targets.clone(),
            tags: tags.clone(),
            flows: cfg.flows.many().then_some((spread, cfg.flows)),
            factory,
            share: (cfg.max_in_flight / workers.max(1)).max(1),
            port: cfg.http_port,
            timeout: cfg.timeout,
            spread: cfg.spread,
            t0: Instant::now(),
            latest_start: AtomicU64::new(0),
            latest_timed_out: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            given_back: AtomicUsize::new(0),
            latest_held_start: AtomicU64::new(0),
            echoes: echoes.clone(),
            metrics: cfg.metrics.clone(),
            // A probe no task settled (its task panicked, or its epoll set
            // failed while it was in flight) fails naming that.
            outcomes: Mutex::new(vec![
                Outcome::Failed(ProbeError::ReceiverStopped);
                targets.len()
            ]),
        }
    }

    /// Moves `done` into the round's outcomes.
    fn settle(&self, done: &mut Vec<(usize, Outcome)>) {
        let mut outcomes = self.outcomes.lock().unwrap_or_else(PoisonError::into_inner);
        for (i, outcome) in done.drain(..) {
            if let Some(slot) = outcomes.get_mut(i) {
                *slot = outcome;
            }
        }
    }
}

/// Descriptors kept for everything but HTTP probe sockets: the
/// connections the agent's servers may hold at once (the node's and the
/// endpoint's hello servers, the API socket, the metrics listener), which
/// peers and the socket's users can fill, and 512 for the rest (etcd,
/// netlink, the engines' epoll sets, ...). With the default budget, under
/// an open-file limit above 9,088 (the budget is at least 64), a probe
/// never finds the descriptors taken by them.
pub const RESERVED_FILES: usize = 512
    + 2 * super::hello::MAX_CONNECTIONS
    + crate::api::MAX_CONNECTIONS
    + crate::web::conn::MAX_CONNECTIONS;

/// The HTTP probes in flight at most under an open-file limit of
/// `open_files`: what is left once [`RESERVED_FILES`] are kept, and 64 at
/// least (`--max-in-flight` lowers it, never raises it).
#[must_use]
pub fn fd_budget(open_files: u64) -> usize {
    usize::try_from(open_files)
        .unwrap_or(usize::MAX)
        .saturating_sub(RESERVED_FILES)
        .max(64)
}

/// Grows the descriptor table, in one step, to hold the sockets of a round
/// of `targets` HTTP probes (at most the in-flight bound) beside the
/// [`RESERVED_FILES`]: grown by doubling during the first round instead,
/// each step stalls every thread that opens a descriptor (the API's
/// accepts too) for an RCU grace period ([`fd_table`]).
pub(super) fn reserve_descriptors(cfg: &ProbeConfig, targets: usize) {
    let want = targets.min(cfg.max_in_flight) + RESERVED_FILES;
    if let Err(e) = fd_table::reserve(want) {
        tracing::debug!("growing the descriptor table to {want}: {e}");
    }
}

impl super::Prober {
    /// [`run`] from the round's `sockets` (every probe failing with their
    /// error when they could not be had): to every address of `to`, each
    /// answer checked against its node's tag.
    pub(super) async fn http_round(
        &self,
        to: (&Arc<Vec<IpAddr>>, &Arc<Vec<u32>>),
        spread: Spread,
        sockets: super::icmp_round::IcmpSockets<'_>,
        order: &Suspects,
        echoes: &Arc<Echoes>,
    ) -> Vec<Outcome> {
        match sockets {
            Ok((_, factory)) => run(&self.cfg, to, spread, factory.clone(), order, echoes).await,
            Err(e) => vec![Outcome::Failed(e.clone()); to.0.len()],
        }
    }
}

/// HTTP to every address of `targets` from the probe namespace's `factory`
/// (the caller's namespace when `None`), in `order`'s HTTP order with its
/// suspects first and each of the rest once its echo is due in `echoes`,
/// put off to the end when it came back (see [`super::order`]). Outcomes
/// are in the order of `targets`.
pub(super) async fn run(
    cfg: &ProbeConfig,
    (targets, tags): (&Arc<Vec<IpAddr>>, &Arc<Vec<u32>>),
    spread: Spread,
    factory: Option<Arc<SocketFactory>>,
    order: &Suspects,
    echoes: &Arc<Echoes>,
) -> Vec<Outcome> {
    let n = targets.len();
    debug_assert!(
        tags.is_empty() || tags.len() == n,
        "a tag for each target, or none"
    );
    // A task for each of the runtime's workers: read from the runtime,
    // not the machine (no cgroup files read each round).
    let workers = tokio::runtime::Handle::current()
        .metrics()
        .num_workers()
        .max(1);
    let shared = Arc::new(Shared::new(
        cfg,
        (targets, tags),
        spread,
        factory,
        workers,
        echoes,
    ));
    // In a set, so that a round dropped (its prober replaced by a reload,
    // or the agent stopping) stops making connections: dropping the set
    // aborts its tasks.
    let mut tasks = tokio::task::JoinSet::new();
    // Every task's epoll set before any task makes a socket: a round short
    // of descriptors waits for its own probes to give theirs back, which
    // a task whose set could not be made would not.
    let sets: Vec<_> = (0..workers).map(|_| EpollSet::open()).collect();
    for (w, epoll) in sets.into_iter().enumerate() {
        // Every task gets its share of the suspects and of the rest.
        let mine: Vec<usize> = order.http().skip(w).step_by(workers).collect();
        let my_suspects = order.http_suspects().saturating_sub(w).div_ceil(workers);
        let shared = shared.clone();
        tasks.spawn(async move { shared.task(mine, my_suspects, epoll).await });
    }
    while tasks.join_next().await.is_some() {}
    tracing::debug!(
        latest_start_ms = shared.latest_start.load(Ordering::Relaxed) / 1000,
        latest_timed_out_start_ms = shared.latest_timed_out.load(Ordering::Relaxed) / 1000,
        done_ms = shared.t0.elapsed().as_millis(),
        "HTTP probes"
    );
    report_held(&shared, workers, cfg.max_in_flight);
    let mut outcomes = shared
        .outcomes
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    std::mem::take(&mut *outcomes)
}

/// A wait for descriptors shorter than this share of the timeout (one
/// for an answered probe to end) holds no round back.
const HELD: u32 = 10;

/// After a round: when one of its probes waited for descriptors (see
/// [`Shared::latest_held_start`]) and started only after a probe timeout,
/// the in-flight limit held the round back: each limit's worth of
/// unanswered probes holds their sockets a whole timeout. Counted, and
/// logged at the first of a run of such rounds, then at the 2nd, 4th,
/// 8th, ... (with no metrics, as in some tests, at each).
fn report_held(shared: &Shared, workers: usize, max_in_flight: usize) {
    let held_start = Duration::from_micros(shared.latest_held_start.load(Ordering::Relaxed));
    let metrics = shared.metrics.as_deref();
    if held_start <= shared.timeout {
        metrics.inspect(|m| m.not_held());
        return;
    }
    let run = metrics.map_or(1, ProbeMetrics::held_by_limit);
    if !run.is_power_of_two() {
        return;
    }
    let unanswered = shared
        .outcomes
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter(|o| matches!(o, Outcome::Failed(ProbeError::Timeout { .. })))
        .count();
    tracing::warn!(
        rounds_in_a_row = run,
        probes = shared.targets.len(),
        unanswered,
        in_flight_at_most = shared.share * workers,
        max_in_flight,
        held_start_ms = held_start.as_millis(),
        "HTTP probes waited for descriptors until after a probe timeout: each {max_in_flight} \
         unanswered probes (peers down) add a timeout to a round. The bound is the agent's \
         open-file limit less {RESERVED_FILES} kept for the rest, or --max-in-flight where that \
         is lower: for this round's unanswered probes, raise the limit to {} at least \
         (LimitNOFILE, or CAP_SYS_RESOURCE, with which the agent lifts it to 1,048,576), and \
         --max-in-flight where it was set lower",
        unanswered + RESERVED_FILES
    );
}

/// The earlier of two wakes, either of which may be none.
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// A probe in flight.
struct InFlight {
    sock: socket2::Socket,
    /// Its index in the round's targets.
    target: u32,
    /// When its connect was issued.
    start: Instant,
    /// Bytes of the request written.
    sent: u8,
    /// Whether the whole request is written (the answer's head is awaited).
    requested: bool,
    /// An answer's head that came in parts (see [`http::gather`]): rare,
    /// so behind one thin pointer (thousands of probes are in flight).
    carried: Option<Box<http::Carried>>,
}

/// The epoll set, watched by the runtime.
struct EpollSet(Epoll);

impl EpollSet {
    /// A new set, watched by the runtime.
    fn open() -> io::Result<AsyncFd<Self>> {
        let set = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        // SAFETY: the AsyncFd owns the epoll set, whose fd stays open for
        // as long as it is registered.
        Ok(unsafe { AsyncFd::register(Self(set))? })
    }
}

impl AsRawFd for EpollSet {
    fn as_raw_fd(&self) -> RawFd {
        self.0.0.as_raw_fd()
    }
}

/// A batch of sockets being made in the probe namespace.
type Making<'a> =
    Pin<Box<dyn Future<Output = (Family, io::Result<Vec<socket2::Socket>>)> + Send + 'a>>;

/// The sockets of the batch being made; never, when none is.
async fn made(making: &mut Option<Making<'_>>) -> (Family, io::Result<Vec<socket2::Socket>>) {
    match making {
        Some(batch) => batch.await,
        None => std::future::pending().await,
    }
}

/// One task's probes in flight and what became of the others.
struct Flights<'a> {
    shared: &'a Shared,
    epoll: &'a Epoll,
    slots: Vec<Option<InFlight>>,
    free: Vec<u32>,
    /// (deadline, slot, target), in start order.
    deadlines: VecDeque<(Instant, u32, u32)>,
    /// Sockets made and not yet used, per family (at `Family::index`).
    spare: [Vec<socket2::Socket>; 2],
    /// Since when no socket could be made with none of the task's probes
    /// in flight and none given back by the round, and how many the round
    /// had given back then.
    short: Option<(Instant, usize)>,
    /// Since when the next probe has waited for descriptors: its task's
    /// share of the in-flight limit full, or none to be had (`EMFILE`).
    held_since: Option<Instant>,
    busy: usize,
    /// Outcomes not yet settled into the round's ([`FLUSH`] at most).
    done: Vec<(usize, Outcome)>,
}

impl Drop for Flights<'_> {
    /// A task that ends with probes still in flight (aborted with its
    /// round, or its epoll set no longer readable) settles them in the
    /// gauge, as their ends would have; its sockets, in flight and spare,
    /// count as given back.
    fn drop(&mut self) {
        let spare = self.spare[0].len() + self.spare[1].len();
        self.shared
            .given_back
            .fetch_add(self.busy + spare, Ordering::Relaxed);
        self.shared
            .in_flight
            .fetch_sub(self.busy, Ordering::Relaxed);
        if self.busy > 0 {
            let busy = self.busy;
            self.shared.metrics.as_deref().inspect(|m| m.settled(busy));
        }
    }
}

impl Shared {
    /// One task's probes (`mine`, its first `suspects` first): started at
    /// most a burst at a time, paced by one timer, the k-th at
    /// `t0 + k * step` (woken once a [`pace::SLICE`]).
    async fn task(&self, mine: Vec<usize>, suspects: usize, epoll: io::Result<AsyncFd<EpollSet>>) {
        let count = mine.len();
        if count == 0 {
            return;
        }
        let epoll = match epoll {
            Ok(e) => e,
            Err(e) => {
                let failed = Outcome::Failed(ProbeError::io("epoll", &e));
                let mut done = mine.into_iter().map(|i| (i, failed.clone())).collect();
                self.settle(&mut done);
                return;
            }
        };
        let spare = self.first_sockets(&mine[..count.min(self.share)]).await;
        let mut f = Flights::new(self, &epoll.get_ref().0, spare, count);
        let step = self.spread / u32::try_from(count).unwrap_or(u32::MAX).max(1);
        let at = |k: usize| self.t0 + step * u32::try_from(k).unwrap_or(u32::MAX);
        let mut queue = IssueOrder::new(mine, suspects);
        let mut started = 0;
        // The next probe, taken from the queue, waiting for a socket.
        let mut next: Option<usize> = None;
        let mut making: Option<Making<'_>> = None;
        // A batch made no socket: the next waits (see `Held`).
        let mut held_back: Option<Held> = None;
        // One timer for the task, moved only when its next wake changes.
        let timer = tokio::time::sleep_until(self.t0);
        tokio::pin!(timer);
        let mut armed = None;
        let mut events = [EpollEvent::empty(); EVENTS];
        loop {
            let now = Instant::now();
            f.expire(now);
            let mut burst = 0;
            while burst < BURST && started < count && at(started) <= now {
                let Some(i) = next.take().or_else(|| queue.next(&self.echoes, now)) else {
                    break;
                };
                let Some(sock) = f.spare[Family::of(self.targets[i]).index()].pop() else {
                    next = Some(i);
                    break;
                };
                f.start(i, sock);
                started += 1;
                burst += 1;
            }
            // Out of sockets: make a batch when the budget has room.
            if let Some(i) = next
                && making.is_none()
                && held_back.is_none_or(|h| h.over(f.busy, now))
            {
                let family = Family::of(self.targets[i]);
                let room = f.room_for(family).min(count - started);
                if room > 0 {
                    held_back = None;
                    making = Some(Box::pin(self.make(family, room)));
                } else {
                    f.held_since.get_or_insert(now);
                }
            }
            if started == count && f.busy == 0 {
                break;
            }
            // Woken once a slice at most, for the next start or the echo
            // it waits for.
            let pacing = (started < count && next.is_none()).then(|| {
                pace::wake_for(
                    self.t0,
                    queue
                        .waits_until()
                        .map_or(at(started), |t| t.max(at(started))),
                )
            });
            let wake = earliest(
                earliest(pacing, f.deadlines.front().map(|&(d, ..)| d)),
                held_back.and_then(Held::retry).filter(|_| making.is_none()),
            );
            if let Some(w) = wake
                && armed != Some(w)
            {
                timer.as_mut().reset(w);
                armed = Some(w);
            }
            tokio::select! {
                ready = epoll.readable() => {
                    let Ok(guard) = ready else { break };
                    f.take_events(guard, &mut events);
                }
                () = &mut timer, if wake.is_some() => {}
                (family, made) = made(&mut making), if making.is_some() => {
                    making = None;
                    held_back = f.took(family, made, &mut next, &mut started);
                }
            }
        }
        self.settle(&mut f.done);
    }

    /// The sockets of a task's first probes `first`, IPv4 ones and IPv6
    /// ones, one request per family (a family whose sockets cannot be made
    /// gets none: its probes ask again, one batch at a time, and fail
    /// naming the error).
    async fn first_sockets(&self, first: &[usize]) -> [Vec<socket2::Socket>; 2] {
        let v6 = first.iter().filter(|&&i| self.targets[i].is_ipv6()).count();
        let mut spare = [Vec::new(), Vec::new()];
        for (family, n) in [(Family::Ipv4, first.len() - v6), (Family::Ipv6, v6)] {
            if n > 0
                && let Ok(made) = self.make(family, n).await.1
            {
                spare[family.index()] = made;
            }
        }
        spare
    }

    /// `n` non-blocking TCP sockets of `family` made in
    /// the probe namespace in one request (here when there is no factory).
    async fn make(&self, family: Family, n: usize) -> (Family, io::Result<Vec<socket2::Socket>>) {
        let (domain, ty, proto) = http::tcp_for(family);
        let made = match self.factory.as_deref() {
            Some(maker) => maker.sockets(domain, ty, proto, n).await,
            None => crate::sys::socket_factory::batch(n, || {
                socket2::Socket::new(domain, ty.nonblocking(), proto)
            }),
        };
        (family, made)
    }
}

impl<'a> Flights<'a> {
    /// A task of `count` probes with `spare` sockets and none in flight.
    fn new(
        shared: &'a Shared,
        epoll: &'a Epoll,
        spare: [Vec<socket2::Socket>; 2],
        count: usize,
    ) -> Self {
        Self {
            shared,
            epoll,
            slots: Vec::new(),
            free: Vec::new(),
            deadlines: VecDeque::new(),
            spare,
            short: None,
            held_since: None,
            busy: 0,
            done: Vec::with_capacity(FLUSH.min(count)),
        }
    }

    /// How many sockets of `family` may be made within the task's share.
    /// When the other family's spare sockets hold the share, half of them
    /// (one at least) are closed first: a probe of `family` would
    /// otherwise wait for sockets no probe in flight gives back (with none
    /// in flight, for ever).
    fn room_for(&mut self, family: Family) -> usize {
        let share = self.shared.share;
        let held = self.busy + self.spare[0].len() + self.spare[1].len();
        let other = &mut self.spare[1 - family.index()];
        if held >= share && !other.is_empty() {
            let closed = other.len() - other.len() / 2;
            other.truncate(other.len() / 2);
            self.shared.given_back.fetch_add(closed, Ordering::Relaxed);
        }
        share.saturating_sub(self.busy + self.spare[0].len() + self.spare[1].len())
    }

    /// A batch of sockets of `family` came: they are spare. Where none
    /// could be made for want of descriptors (`EMFILE`, `ENFILE`), the
    /// waiting probe (`next`) waits for some to be given back: with its
    /// task's own probes in flight, for one of them to end; else, half its
    /// spare sockets of the other family closed first, it asks again
    /// after [`SHORT_RETRY`] while any probe of the round is in flight
    /// (each gives its socket back within a timeout), and while the
    /// round's sockets keep coming back, until a probe timeout passes with
    /// none given back. Then, or at once for any other error, it fails
    /// naming why (`started` counts it); so do its next probes, until a
    /// socket is given back or made. Returns why the next batch waits.
    fn took(
        &mut self,
        family: Family,
        made: io::Result<Vec<socket2::Socket>>,
        next: &mut Option<usize>,
        started: &mut usize,
    ) -> Option<Held> {
        let e = match made {
            Ok(made) => {
                self.short = None;
                self.spare[family.index()].extend(made);
                return None;
            }
            Err(e) => e,
        };
        if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) {
            let now = Instant::now();
            self.held_since.get_or_insert(now);
            if self.busy > 0 {
                return Some(Held::InFlight(self.busy));
            }
            let other = &mut self.spare[1 - family.index()];
            if !other.is_empty() {
                let closed = other.len() - other.len() / 2;
                other.truncate(other.len() / 2);
                self.shared.given_back.fetch_add(closed, Ordering::Relaxed);
                return Some(Held::Until(now));
            }
            let back = self.shared.given_back.load(Ordering::Relaxed);
            let (since, seen) = self.short.get_or_insert((now, back));
            if *seen != back || self.shared.in_flight.load(Ordering::Relaxed) > 0 {
                (*since, *seen) = (now, back);
            }
            if now.saturating_duration_since(*since) < self.shared.timeout {
                return Some(Held::Until(now + SHORT_RETRY));
            }
        }
        if let Some(i) = next.take() {
            self.finish(i, Outcome::Failed(ProbeError::io("socket", &e)));
            *started += 1;
        }
        None
    }

    /// Probe `i` ended with `outcome`.
    fn finish(&mut self, i: usize, outcome: Outcome) {
        self.done.push((i, outcome));
        if self.done.len() >= FLUSH {
            self.shared.settle(&mut self.done);
        }
    }

    /// Starts probe `i` from `sock`: its connect is issued now and its
    /// socket joins the epoll set.
    fn start(&mut self, i: usize, sock: socket2::Socket) {
        let shared = self.shared;
        let late = u64::try_from(shared.t0.elapsed().as_micros()).unwrap_or(u64::MAX);
        shared.latest_start.fetch_max(late, Ordering::Relaxed);
        if let Some(since) = self.held_since.take()
            && since.elapsed() >= shared.timeout / HELD
        {
            shared.latest_held_start.fetch_max(late, Ordering::Relaxed);
        }
        let to = SocketAddr::new(shared.targets[i], shared.port);
        if let Some((spread, plan)) = shared.flows {
            let f = u16::try_from(spread.of(i).0).unwrap_or(u16::MAX);
            if let Err(e) = http::bind_source_port(&sock, to, plan.tcp_port(f)) {
                shared.given_back.fetch_add(1, Ordering::Relaxed);
                self.finish(i, Outcome::Failed(e));
                return;
            }
        }
        let start = Instant::now();
        if let Err(e) = http::issue_connect(&sock, to) {
            shared.given_back.fetch_add(1, Ordering::Relaxed);
            self.finish(i, Outcome::Failed(e));
            return;
        }
        let key = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            u32::try_from(self.slots.len() - 1).unwrap_or(u32::MAX)
        });
        let interest = EpollFlags::EPOLLIN | EpollFlags::EPOLLOUT | EpollFlags::EPOLLET;
        if let Err(e) = self
            .epoll
            .add(&sock, EpollEvent::new(interest, u64::from(key)))
        {
            self.free.push(key);
            shared.given_back.fetch_add(1, Ordering::Relaxed);
            self.finish(i, Outcome::Failed(ProbeError::io("epoll", &e.into())));
            return;
        }
        let target = u32::try_from(i).unwrap_or(u32::MAX);
        self.slots[key as usize] = Some(InFlight {
            sock,
            target,
            start,
            sent: 0,
            requested: false,
            carried: None,
        });
        self.busy += 1;
        shared.in_flight.fetch_add(1, Ordering::Relaxed);
        self.deadlines
            .push_back((start + shared.timeout, key, target));
        shared.metrics.as_deref().inspect(|m| m.sent(1));
    }

    /// Takes every event of the epoll set and handles it, until it has
    /// none (then its readiness is cleared and the runtime watches it
    /// again).
    fn take_events(
        &mut self,
        mut guard: AsyncFdReadyGuard<'_, EpollSet>,
        events: &mut [EpollEvent],
    ) {
        while let Ok(Ok(n)) = guard.try_io(|e| match e.get_ref().0.wait(events, 0u8) {
            Ok(0) => Err(io::ErrorKind::WouldBlock.into()),
            r => r.map_err(io::Error::from),
        }) {
            let now = Instant::now();
            for ev in &events[..n] {
                self.on_event(ev.data(), ev.events(), now);
            }
        }
    }

    /// Probes whose deadline passed by `now` time out.
    fn expire(&mut self, now: Instant) {
        while let Some(&(deadline, key, target)) = self.deadlines.front() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_front();
            if let Some(p) = self.slots[key as usize]
                .as_ref()
                .filter(|p| p.target == target)
            {
                let since = p.start.saturating_duration_since(self.shared.t0);
                self.shared.latest_timed_out.fetch_max(
                    u64::try_from(since.as_micros()).unwrap_or(u64::MAX),
                    Ordering::Relaxed,
                );
                let late = self.timed_out();
                self.end(key, Err(late));
            }
        }
    }

    fn timed_out(&self) -> ProbeError {
        ProbeError::Timeout {
            proto: Proto::Http,
            after: self.shared.timeout,
        }
    }

    /// The socket of slot `key` has `events` (edge-triggered: each is read
    /// or written until it would block).
    fn on_event(&mut self, key: u64, events: EpollFlags, now: Instant) {
        let Ok(key) = u32::try_from(key) else { return };
        let to = {
            let Some(p) = self.slots.get(key as usize).and_then(Option::as_ref) else {
                return;
            };
            SocketAddr::new(self.shared.targets[p.target as usize], self.shared.port)
        };
        let Some(p) = self.slots[key as usize].as_mut() else {
            return;
        };
        if !p.requested {
            if !events
                .intersects(EpollFlags::EPOLLOUT | EpollFlags::EPOLLERR | EpollFlags::EPOLLHUP)
            {
                return;
            }
            match write_request(p, to) {
                Ok(true) => {}
                Ok(false) => return,
                Err(e) => return self.end(key, Err(e)),
            }
        }
        // Edge-triggered: nothing to read until an event says so (not on
        // the connect's, when the request has only just gone out).
        if !events.intersects(EpollFlags::EPOLLIN | EpollFlags::EPOLLERR | EpollFlags::EPOLLHUP) {
            return;
        }
        let expected = self.shared.tags.get(p.target as usize).copied();
        match read_status(p, expected.unwrap_or(0)) {
            Ok(None) => {}
            Ok(Some(status)) => {
                let rtt = now.saturating_duration_since(p.start);
                self.end(key, Ok((status, rtt)));
            }
            Err(e) => self.end(key, Err(e)),
        }
    }

    /// Slot `key`'s probe ended with a status and its round trip, or an
    /// error; its socket is closed (with a reset) and the slot freed.
    fn end(&mut self, key: u32, result: Result<(u16, Duration), ProbeError>) {
        let Some(p) = self.slots[key as usize].take() else {
            return;
        };
        self.free.push(key);
        self.busy -= 1;
        self.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.shared.given_back.fetch_add(1, Ordering::Relaxed);
        let outcome = match result {
            // Read after the deadline but before the timer fired: late.
            Ok((_, rtt)) if rtt > self.shared.timeout => Outcome::Failed(self.timed_out()),
            Ok((status, rtt)) => http::classify(status, rtt),
            Err(e) => Outcome::Failed(e),
        };
        self.shared.metrics.as_deref().inspect(|m| m.settled(1));
        self.finish(p.target as usize, outcome);
    }
}

/// Once connected, writes the request (resuming a short write): `true`
/// when it is all written, `false` when the socket would block (or the
/// connect is still under way).
fn write_request(p: &mut InFlight, to: SocketAddr) -> Result<bool, ProbeError> {
    if let Some(e) = p
        .sock
        .take_error()
        .map_err(|e| ProbeError::io("connect", &e))?
    {
        return Err(ProbeError::io("connect", &e));
    }
    let mut buf = [0u8; 160];
    let req = http::request(&mut buf, to);
    while usize::from(p.sent) < req.len() {
        match p.sock.send(&req[usize::from(p.sent)..]) {
            Ok(n) => p.sent += u8::try_from(n).unwrap_or(u8::MAX),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            // Not connected yet: the connect's own event comes later.
            Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => return Ok(false),
            Err(e) => return Err(ProbeError::io("send", &e)),
        }
    }
    p.requested = true;
    http::request_sent(&p.sock);
    Ok(true)
}

/// Reads what came until the socket would block: the status once the
/// head says enough (see [`http::gather`]), from the node tagged
/// `expected` (0: any).
fn read_status(p: &mut InFlight, expected: u32) -> Result<Option<u16>, ProbeError> {
    use std::io::Read as _;
    let mut buf = [0u8; HEAD_MAX];
    let mut carried = p.carried.take().map(|c| *c).unwrap_or_default();
    loop {
        let room = HEAD_MAX - carried.len();
        match (&p.sock).read(&mut buf[..room]) {
            Ok(n) => {
                let closed = n == 0;
                if let Some(status) = http::gather(&mut carried, &buf[..n], expected, closed) {
                    return status.map(Some);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if !carried.is_empty() {
                    // A head in parts (rare): each part acknowledged at
                    // once, so that a server holding its next write for
                    // that ACK (Nagle) is not held for the delayed one.
                    let _ = p.sock.set_tcp_quickack(true);
                    p.carried = Some(Box::new(carried));
                }
                return Ok(None);
            }
            Err(e) => return Err(ProbeError::io("receive", &e)),
        }
    }
}

#[cfg(test)]
mod tests;
