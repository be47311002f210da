//! A round's HTTP probes: futures of a few tasks (one per CPU, not one per
//! probe), each task starting its probes in [`order`]'s order, paced
//! evenly over the spread by one timer, with sockets made beforehand in
//! the probe namespace in one request; the open-file budget bounds the
//! probes in flight (each holds a socket).
//!
//! A probe's timeout runs from its `connect` (kubelet's semantics): an
//! agent slowed by its own CPU never fails a live path for it, and the
//! round lasts the time to issue every connect plus one timeout. So the
//! connect of a socket made beforehand is issued as the probe starts, in
//! the task's order (not when its future is first polled), and the probes
//! likely to last the whole timeout start first.

use std::{
    net::IpAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::{FutureExt as _, StreamExt as _, future::Either, stream::FuturesUnordered};
use tokio::{sync::Semaphore, time::Instant};

use super::{
    error::ProbeError,
    http::{self, SocketSource},
    metrics::ProbeMetrics,
    order::{Echoed, IssueOrder},
    pace,
    path::Outcome,
    round::ProbeConfig,
};
use crate::sys::socket_factory::SocketFactory;

/// Connects a task issues at most between two looks at the answers of its
/// probes in flight (which are timed as they are read).
const BURST: usize = 64;

/// What every task of a round shares.
struct Shared {
    targets: Arc<Vec<IpAddr>>,
    factory: Option<Arc<SocketFactory>>,
    /// The open-file budget: one slot per socket of a probe.
    slots: Semaphore,
    /// Sockets a task makes beforehand at most.
    share: usize,
    port: u16,
    timeout: Duration,
    spread: Duration,
    t0: Instant,
    /// The latest start of the round, in microseconds from `t0`.
    latest_start: AtomicU64,
    echoed: Arc<Echoed>,
    metrics: Option<Arc<ProbeMetrics>>,
}

/// HTTP to every address of `targets` from the probe namespace's `factory`
/// (the caller's namespace when `None`), in `order` with its first
/// `suspects` first and the rest put off as their echo comes back (see
/// [`super::order`]). Outcomes are in the order of `targets`.
pub(super) async fn run(
    cfg: &ProbeConfig,
    targets: &Arc<Vec<IpAddr>>,
    factory: Option<Arc<SocketFactory>>,
    (order, suspects): (&[usize], usize),
    echoed: &Arc<Echoed>,
) -> Vec<Outcome> {
    let n = targets.len();
    let in_flight = cfg.max_in_flight.max(1);
    let workers = std::thread::available_parallelism().map_or(1, usize::from);
    let shared = Arc::new(Shared {
        targets: targets.clone(),
        factory,
        slots: Semaphore::new(in_flight),
        // When every probe may be in flight at once, each task makes all
        // its sockets beforehand; else as many as its share of the slots.
        share: if n <= in_flight {
            usize::MAX
        } else {
            in_flight / workers
        },
        port: cfg.http_port,
        timeout: cfg.timeout,
        spread: cfg.spread,
        t0: Instant::now(),
        latest_start: AtomicU64::new(0),
        echoed: echoed.clone(),
        metrics: cfg.metrics.clone(),
    });
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            // Every task gets its share of the suspects and of the rest.
            let mine: Vec<usize> = order.iter().skip(w).step_by(workers).copied().collect();
            let my_suspects = suspects.saturating_sub(w).div_ceil(workers);
            tokio::spawn(shared.clone().task(mine, my_suspects))
        })
        .collect();
    let mut outcomes: Vec<Option<Outcome>> = vec![None; n];
    for task in tasks {
        for (i, outcome) in task.await.unwrap_or_default() {
            outcomes[i] = Some(outcome);
        }
    }
    tracing::debug!(
        latest_start_ms = shared.latest_start.load(Ordering::Relaxed) / 1000,
        done_ms = shared.t0.elapsed().as_millis(),
        "HTTP probes"
    );
    outcomes
        .into_iter()
        .map(|o| o.unwrap_or(Outcome::Failed(ProbeError::ReceiverStopped)))
        .collect()
}

impl Shared {
    /// One task's probes (`mine`, its first `suspects` first): started
    /// at most a burst at a time, paced by one timer (not one per probe),
    /// the k-th at `t0 + k * step` (woken once a [`pace::SLICE`]).
    async fn task(self: Arc<Self>, mine: Vec<usize>, suspects: usize) -> Vec<(usize, Outcome)> {
        let count = mine.len();
        // This task's share of the slots, as sockets made beforehand in
        // one go (each holds its slot until its probe ends); past them, a
        // probe waits for a slot and has its socket made then.
        let mut made = self.made_beforehand(&mine[..count.min(self.share)]).await;
        let step = self.spread / u32::try_from(count).unwrap_or(u32::MAX).max(1);
        let at = |k: usize| self.t0 + step * u32::try_from(k).unwrap_or(u32::MAX);
        let mut queue = IssueOrder::new(mine, suspects);
        let mut started = 0;
        let mut probes = FuturesUnordered::new();
        let mut done = Vec::with_capacity(count);
        // One timer for the task, moved only when the next start changes
        // (not a new one per completed probe).
        let pace = tokio::time::sleep_until(self.t0);
        tokio::pin!(pace);
        let mut armed = None;
        loop {
            let now = Instant::now();
            let mut burst = 0;
            while burst < BURST
                && started < count
                && at(started) <= now
                && let Some(i) = queue.next(&self.echoed)
            {
                started += 1;
                burst += 1;
                let ip = self.targets[i];
                let socket = made[usize::from(ip.is_ipv6())].pop();
                probes.push(self.start(i, socket));
            }
            let wake = (started < count).then(|| pace::wake_for(self.t0, at(started)));
            if let Some(w) = wake
                && armed != Some(w)
            {
                pace.as_mut().reset(w);
                armed = Some(w);
            }
            tokio::select! {
                Some(r) = probes.next(), if !probes.is_empty() => done.push(r),
                () = &mut pace, if wake.is_some() => {}
                else => break,
            }
        }
        done
    }

    /// Starts probe `i`: a socket made beforehand connects now; without
    /// one, the probe waits for a slot and has its socket made. A round
    /// holds one such future per probe in flight, so the usual path's is
    /// kept small (its exchange, built now, and its slot) and the rare
    /// one's is boxed.
    fn start(
        &self,
        i: usize,
        socket: Option<socket2::Socket>,
    ) -> impl Future<Output = (usize, Outcome)> + '_ {
        let ip = self.targets[i];
        let late = u64::try_from(self.t0.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.latest_start.fetch_max(late, Ordering::Relaxed);
        let metrics = self.metrics.as_deref();
        // Combinators, not an `async` block: a block would hold its
        // captured exchange and the one it awaits in two places.
        let outcome = match socket {
            Some(s) => {
                metrics.inspect(|m| m.sent(1));
                let slot = SlotBack(&self.slots);
                Either::Left(
                    http::connect(ip, self.port, s)
                        .finish(self.timeout)
                        .inspect(move |_| drop(slot)),
                )
            }
            None => Either::Right(Box::pin(self.on_demand(ip))),
        };
        outcome.map(move |outcome| {
            metrics.inspect(|m| m.settled(1));
            (i, outcome)
        })
    }

    /// A probe past the sockets made beforehand: it waits for a slot, then
    /// has its socket made in the probe namespace.
    async fn on_demand(&self, ip: IpAddr) -> Outcome {
        let _slot = self.slots.acquire().await.ok();
        self.metrics.as_deref().inspect(|m| m.sent(1));
        let from = self
            .factory
            .as_deref()
            .map_or(SocketSource::Here, SocketSource::Factory);
        http::probe(ip, self.port, self.timeout, from).await
    }

    /// The sockets of probes `mine`, IPv4 ones and IPv6 ones, made in the
    /// probe namespace by the factory in one request per family (or here
    /// when there is none), each holding one of the slots (given back by
    /// [`SlotBack`]). None when the slots are not free; a family whose
    /// sockets cannot be made gets none (its probes make theirs one at a
    /// time, and fail naming the error).
    async fn made_beforehand(&self, mine: &[usize]) -> [Vec<socket2::Socket>; 2] {
        let mut made: [Vec<socket2::Socket>; 2] = [Vec::new(), Vec::new()];
        let Ok(held) = self
            .slots
            .try_acquire_many(u32::try_from(mine.len()).unwrap_or(u32::MAX))
        else {
            return made;
        };
        held.forget();
        let v6 = mine.iter().filter(|&&i| self.targets[i].is_ipv6()).count();
        for (f, count) in [(0, mine.len() - v6), (1, v6)] {
            if count > 0 {
                let (domain, ty, proto) = [http::TCP_V4, http::TCP_V6][f];
                made[f] = match self.factory.as_deref() {
                    Some(maker) => maker.sockets(domain, ty, proto, count).await,
                    None => (0..count)
                        .map(|_| socket2::Socket::new(domain, ty.nonblocking(), proto))
                        .collect(),
                }
                .unwrap_or_default();
            }
        }
        self.slots
            .add_permits(mine.len() - made[0].len() - made[1].len());
        made
    }
}

/// Gives a slot back when dropped (a socket made beforehand held one from
/// when it was made, see [`Shared::made_beforehand`]).
struct SlotBack<'a>(&'a Semaphore);

impl Drop for SlotBack<'_> {
    fn drop(&mut self) {
        self.0.add_permits(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A round holds one started probe per probe in flight (10,000 at
    /// 5,000 peers, each in a task of its own in the futures set): the
    /// usual one stays under 512 bytes. An `async` block holding its
    /// exchange was 1,000 bytes, twice the exchange.
    #[tokio::test]
    async fn a_started_probe_is_a_small_future() {
        let ip: IpAddr = "127.0.0.1".parse().expect("ip");
        let shared = Shared {
            targets: Arc::new(vec![ip]),
            factory: None,
            slots: Semaphore::new(1),
            share: 1,
            port: 9,
            timeout: Duration::from_secs(1),
            spread: Duration::ZERO,
            t0: Instant::now(),
            latest_start: AtomicU64::new(0),
            echoed: Arc::new(Echoed::new(1)),
            metrics: None,
        };
        let (domain, ty, proto) = http::tcp_for(ip);
        let sock = socket2::Socket::new(domain, ty.nonblocking(), proto).expect("socket");
        // The socket holds the one slot, as one made beforehand does.
        shared.slots.try_acquire().expect("slot").forget();
        let started = shared.start(0, Some(sock));
        let size = size_of_val(&started);
        assert!(size <= 512, "{size} bytes");
        assert_eq!(shared.slots.available_permits(), 0);
        drop(started);
        // Dropped before it ended, it gave its slot back.
        assert_eq!(shared.slots.available_permits(), 1);
    }
}
