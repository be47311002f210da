//! A probe round: every path of every node at once. ICMP goes through one
//! engine call (no task or timer per probe); HTTP probes are futures of a
//! task per CPU ([`super::http_round`]), bounded by the open-file budget,
//! started in [`super::order`]'s order as the echo replies come. Results
//! are kept per node (four paths per family probed, up to eight) and the
//! published status is serialised once per change.
//!
//! Here the round itself; the node set in [`node_set`], the recording of a
//! round's outcomes in [`record`], the published status in
//! [`published_status`] and the histories' views in [`history_view`].

mod history_view;
mod node_set;
mod published_status;
mod record;

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex, RwLock},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use bytes::Bytes;

use super::{
    config::ProbeConfig,
    error::ProbeError,
    flows::{self, Spread},
    flows_round,
    history::History,
    icmp::IcmpProber,
    icmp_round::MtuTargets,
    kernel_rtt::{prune_kernel_rtt, with_kernel_rtt},
    order::{self, Echoes, Failed, Suspects},
    path::Outcome,
    published::Published,
    status::{ClusterStatus, RoundInfo, StatusSummary},
    targets::{NodePaths, targets},
    trace::Tracing,
};
use crate::{datapath::rtt::KernelRtt, membership::NodeSet, sys::socket_factory::SocketFactory};

/// The sockets of the source namespace as it was when they were made
/// (its inode): made again when the endpoint's namespace is recreated.
struct Sockets {
    ino: u64,
    icmp: Arc<IcmpProber>,
    factory: Option<Arc<SocketFactory>>,
}

pub struct Prober {
    pub(super) cfg: ProbeConfig,
    sockets: Mutex<Option<Sockets>>,
    nodes: RwLock<NodeSet>,
    pub(super) paths: Mutex<HashMap<Box<str>, NodePaths>>,
    /// The rounds of the paths' histories; locked after `paths`, only
    /// while it is held.
    history: Mutex<History>,
    /// One round at a time: kubelet counters must see each round once.
    /// Taken through [`Self::turn`].
    round_lock: tokio::sync::Mutex<()>,
    /// The node set lost addresses: the next turn prunes the kernel's RTT
    /// entries of those no node has any more.
    prune_due: std::sync::atomic::AtomicBool,
    /// Held while a round's results are recorded, which takes the paths
    /// a chunk of nodes at a time: what must see no round half recorded
    /// (a reload taking the paths over, every node's history) holds it
    /// too, and takes the paths a chunk at a time as well. Taken before
    /// `paths`.
    recording: Mutex<()>,
    /// Numbers rounds in the order they start: publishing compares these,
    /// never wall-clock times (which NTP may step back).
    round_seq: std::sync::atomic::AtomicU64,
    published: RwLock<Published>,
    /// Traces of failing paths, due and running; locked after `paths`.
    pub(super) tracing: Mutex<Tracing>,
    /// Epoch milliseconds when the last liveness echoes ended (0: none
    /// yet), see [`super::liveness`].
    pub(super) liveness_ms: std::sync::atomic::AtomicU64,
    /// The number of the newest round published (0: none yet), for what
    /// waits for the next one: the API's clients, the cluster view.
    published_seq: tokio::sync::watch::Sender<u64>,
    /// Counts the node sets that brought nodes (or records) the last one
    /// did not have: the scheduler probes the nodes never probed (see
    /// [`super::scheduler`]).
    joined: tokio::sync::watch::Sender<u64>,
    /// Some node that joined has rounds of its own still to come (see
    /// [`Self::probe_joined`]): a round of another kind says so to the
    /// scheduler again when it ends, as it took the turn of the one due.
    joining: std::sync::atomic::AtomicBool,
    /// Held by a publish from its check of the published round to its
    /// write (see [`Self::publish`]).
    publishing: Mutex<()>,
    /// Which of each target's paths (ICMP, HTTP) failed its last probe,
    /// as the last round recorded them, with the node set they number: the
    /// next round's order reads these rather than tens of thousands of
    /// path states spread over the heap (see [`Self::failed_first`]).
    failed: Mutex<Option<(NodeSet, Box<[Failed]>)>>,
}

impl std::fmt::Debug for Prober {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prober")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What a round is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RoundKind {
    /// A round over the whole node set as it is when the round has its
    /// turn (the scheduler's, those asked through the API): numbered, a
    /// slot in the histories, its info published, encryption judged.
    Whole,
    /// A round over some nodes (those whose liveness echo is news):
    /// numbered as a whole round is, but judging no encryption, which is
    /// judged over the whole set.
    Some,
    /// The round of the nodes that joined (and of those such rounds left
    /// undecided): their first results only, with no number, no slot in
    /// the histories, no MTU probes and no round duration; the last
    /// round's info stays published.
    Joined,
}

impl Prober {
    /// Sockets are opened when the first round needs them.
    #[must_use]
    pub fn new(cfg: ProbeConfig) -> Arc<Self> {
        Arc::new(Self {
            sockets: Mutex::new(None),
            nodes: RwLock::default(),
            paths: Mutex::default(),
            history: Mutex::new(History::new(cfg.history_length)),
            round_lock: tokio::sync::Mutex::new(()),
            prune_due: std::sync::atomic::AtomicBool::new(false),
            recording: Mutex::new(()),
            round_seq: std::sync::atomic::AtomicU64::new(0),
            tracing: Mutex::default(),
            liveness_ms: std::sync::atomic::AtomicU64::new(0),
            published_seq: tokio::sync::watch::Sender::new(0),
            joined: tokio::sync::watch::Sender::new(0),
            joining: std::sync::atomic::AtomicBool::new(false),
            publishing: Mutex::new(()),
            failed: Mutex::new(None),
            published: RwLock::new(Published {
                summary: Arc::new(StatusSummary {
                    local_node: cfg.local_node.clone(),
                    round: None,
                    encryption: None,
                    nodes: 0,
                    reachable: 0,
                    unreachable: 0,
                    unknown: 0,
                }),
                gzip: Bytes::new(),
                counts: Arc::default(),
            }),
            cfg,
        })
        .with_status_published()
    }

    #[must_use]
    pub const fn config(&self) -> &ProbeConfig {
        &self.cfg
    }

    /// The number of the newest round published, as it changes: what a
    /// client waiting for the next round, or the cluster view, waits on
    /// (any number of them).
    #[must_use]
    pub fn published_rounds(&self) -> tokio::sync::watch::Receiver<u64> {
        self.published_seq.subscribe()
    }

    /// Changes each time the node set gains a node or a node's record
    /// changes, so that the scheduler probes the nodes never probed
    /// before the next round is due.
    #[must_use]
    pub fn joins(&self) -> tokio::sync::watch::Receiver<u64> {
        self.joined.subscribe()
    }

    /// Epoch milliseconds of the newest evidence about the peers: the end
    /// of the last round or of the last liveness echoes, whichever is
    /// later (0 before either).
    #[must_use]
    pub fn evidence_ms(&self) -> u64 {
        let round = self
            .status_summary()
            .round
            .as_ref()
            .map_or(0, |r| r.started_ms.saturating_add(r.duration_ms));
        round.max(self.liveness_ms.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Takes over `old`'s state: its node set, every path's kubelet
    /// counters, last results and history (the newest rounds that fit this
    /// prober's length), its round numbering and its published status, so
    /// a prober made with new settings (a reload) goes on where the old one
    /// stopped instead of starting every path Unknown.
    pub fn take_over(&self, old: &Self) {
        // Not in the middle of the old prober's recording of a round.
        let _recorded = old.recording.lock();
        let mut nodes = None;
        if let (Ok(mut mine), Ok(theirs)) = (self.paths.lock(), old.paths.lock())
            && let (Ok(mut history), Ok(old_history)) = (self.history.lock(), old.history.lock())
        {
            // The set the paths were kept for: `set_nodes` changes both
            // under the paths' lock.
            nodes = Some(old.nodes());
            let length = history.length();
            *history = old_history.resized(length);
            mine.clear();
            // Rounds of the nodes that joined still to come go on.
            self.joining.store(
                theirs.values().any(|p| p.join_rounds > 0),
                std::sync::atomic::Ordering::Relaxed,
            );
            let thresholds = self.cfg.thresholds;
            mine.extend(theirs.iter().map(|(name, p)| {
                let mut paths = p.paths.clone();
                // Judged by this prober's thresholds from the first.
                for path in &mut paths {
                    path.state.rejudge(thresholds);
                }
                let p = NodePaths {
                    paths,
                    history: p.history.resized(length),
                    echo: p.echo,
                    // Looked for a gap after the reload (`First::Resumed`).
                    join_rounds: p.join_rounds,
                };
                (name.clone(), p)
            }));
        }
        self.round_seq.store(
            old.round_seq.load(std::sync::atomic::Ordering::Relaxed),
            std::sync::atomic::Ordering::Relaxed,
        );
        // A prune the old prober had due is this one's.
        if old
            .prune_due
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            self.prune_due
                .store(true, std::sync::atomic::Ordering::Release);
        }
        let nodes = nodes.unwrap_or_else(|| old.nodes());
        if let Ok(mut n) = self.nodes.write() {
            *n = nodes;
        }
        let round = old.status_summary().round.clone();
        self.publish(round, true);
    }

    /// The ICMP engine and the socket factory for the source namespace as
    /// it is now.
    pub(super) fn sockets(
        &self,
    ) -> Result<(Arc<IcmpProber>, Option<Arc<SocketFactory>>), ProbeError> {
        use std::os::unix::fs::MetadataExt as _;
        let ino = match &self.cfg.source_netns {
            Some(ns) => std::fs::metadata(ns.path())
                .map_err(|e| {
                    ProbeError::Namespace(
                        format!("probe namespace {}: {e}", ns.path().display()).into(),
                    )
                })?
                .ino(),
            None => 0,
        };
        let mut slot = self
            .sockets
            .lock()
            .map_err(|_| ProbeError::ReceiverStopped)?;
        if let Some(s) = slot.as_ref()
            && s.ino == ino
        {
            return Ok((s.icmp.clone(), s.factory.clone()));
        }
        let icmp = Arc::new(
            IcmpProber::new(self.cfg.source_netns.as_ref(), self.cfg.families)
                .map_err(|e| ProbeError::io("ICMP socket", &e))?,
        );
        let factory = match &self.cfg.source_netns {
            Some(ns) => Some(Arc::new(SocketFactory::new(ns).map_err(|e| {
                ProbeError::Namespace(format!("entering the probe namespace: {e}").into())
            })?)),
            None => None,
        };
        *slot = Some(Sockets {
            ino,
            icmp: icmp.clone(),
            factory: factory.clone(),
        });
        Ok((icmp, factory))
    }

    /// Runs one round over the current node set and publishes it.
    pub async fn round(self: &Arc<Self>) -> Arc<ClusterStatus> {
        self.run_round().await;
        self.status()
    }

    /// Runs one round over the node set and publishes it; returns the
    /// published counts (the scheduler's: no status is made for them).
    pub async fn run_round(self: &Arc<Self>) -> Arc<StatusSummary> {
        self.round_when_started(|| {}).await
    }

    /// [`Self::run_round`] over the node set as it is when the round has
    /// its turn (rounds run one at a time), calling `started` then: whoever
    /// waits for it knows from then on that a later request needs a later
    /// round.
    pub async fn round_when_started(
        self: &Arc<Self>,
        started: impl FnOnce(),
    ) -> Arc<StatusSummary> {
        self.round_over_with(|| self.nodes(), started, RoundKind::Whole)
            .await
    }

    /// Runs one round over `nodes` (the node set, or some of its nodes:
    /// the others keep their states and miss this round in their
    /// histories) and publishes it.
    pub(super) async fn round_over(self: &Arc<Self>, nodes: NodeSet) -> bool {
        let turn = self.turn().await;
        // A node that left, or dropped or changed an address, since
        // `nodes` was read is not probed: the turn may have pruned its old
        // addresses' kernel entries, which its probes would make again.
        let now = nodes.still_in(&self.nodes());
        let all = now.len() == nodes.len();
        if !now.is_empty() {
            self.round_in_turn(turn, now, RoundKind::Some).await;
        }
        all
    }

    /// A round of `kind` over the nodes `nodes` gives once the round has
    /// its turn, calling `started` then.
    async fn round_over_with(
        self: &Arc<Self>,
        nodes: impl FnOnce() -> NodeSet,
        started: impl FnOnce(),
        kind: RoundKind,
    ) -> Arc<StatusSummary> {
        let turn = self.turn().await;
        let nodes = nodes();
        started();
        self.round_in_turn(turn, nodes, kind).await
    }

    /// The rounds' turn: one round, or one pass of liveness echoes, at a
    /// time. When the node set lost addresses, the kernel's RTT entries of
    /// those no node has any more are removed first, between rounds: no
    /// probe to them is in flight then whose reply would make an entry
    /// again (a round started before the set changed still probes the
    /// old one), and the requests still pending go with them.
    pub(super) async fn turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        let turn = self.round_lock.lock().await;
        if self
            .prune_due
            .swap(false, std::sync::atomic::Ordering::AcqRel)
            && let Some(dir) = self.cfg.kernel_rtt.clone()
            && !prune_kernel_rtt(dir, &self.nodes()).await
        {
            // Tried again at the next turn.
            self.prune_due
                .store(true, std::sync::atomic::Ordering::Release);
        }
        turn
    }

    /// Runs one round of `kind` over `nodes`, holding the rounds' turn
    /// (`_turn`: one round at a time), and publishes it.
    pub(super) async fn round_in_turn(
        self: &Arc<Self>,
        _turn: tokio::sync::MutexGuard<'_, ()>,
        nodes: NodeSet,
        kind: RoundKind,
    ) -> Arc<StatusSummary> {
        let numbered = kind != RoundKind::Joined;
        let seq = self.seq_of(kind);
        let started = SystemTime::now();
        let started_mono = crate::datapath::monotonic_ns().unwrap_or(0);
        let t0 = Instant::now();
        let targets = targets(&nodes, self.cfg.families);
        // Encryption is judged over the whole set only: a round of some
        // nodes (news from their liveness echoes, or nodes that joined)
        // leaves the others' counters and verdicts alone.
        let whole = kind == RoundKind::Whole;
        if whole {
            self.encryption_check(&nodes, true).await;
        }
        let sockets = self.sockets();
        // Each flow probes every address: the addresses once per flow.
        let spread = Spread {
            n: targets.ips.len(),
            flows: usize::from(self.cfg.flows.count),
        };
        let ips = flows::per_flow(spread, &targets.ips);
        let tags = flows::per_flow(spread, &targets.tags);
        // An HTTP probe waits for its address's echo (see `order`) at most
        // half a timeout.
        let echoes = Arc::new(Echoes::new(
            ips.len(),
            order::echo_grace(self.cfg.timeout),
            self.cfg.timeout / 2,
        ));
        // Each engine starts with the targets that failed it last round:
        // its end can come a timeout after the last of those went.
        let order = Arc::new(self.failed_first(&nodes, &targets.keys, spread));
        // No MTU probes in the agent's first round: it is the start's
        // verdict on every path, and its echoes and connects go first (an
        // MTU black hole is called from the second round on).
        let mtu = MtuTargets::of(&targets, self.cfg.mtu_probe.filter(|_| seq > 1 && numbered));
        let ((icmp, icmp_done), (http, http_done)) = tokio::join!(
            timed(
                t0,
                self.icmp_round(&ips, Some(&order), spread, &mtu, sockets.as_ref(), &echoes)
            ),
            timed(
                t0,
                self.http_round((&ips, &tags), spread, sockets.as_ref(), &order, &echoes)
            )
        );
        let (icmp, icmp_mtu) = icmp;
        let (icmp, icmp_flows) = flows_round::fold(spread, icmp);
        let (http, http_flows) = flows_round::fold(spread, http);
        // Kernel RTTs replace user-space ones before the paths are locked:
        // the map is read (in one batched walk) before, not under the
        // lock.
        let kernel = self
            .cfg
            .kernel_rtt
            .as_deref()
            .and_then(|dir| KernelRtt::since(dir, started_mono));
        let kernel_rtt = |ip, proto, outcome: &mut Outcome| {
            with_kernel_rtt(kernel.as_ref(), ip, proto, outcome);
        };
        // In place: a round's outcomes are tens of thousands, not copied.
        let (mut icmp, mut http) = (icmp, http);
        for ((icmp, http), ip) in icmp.iter_mut().zip(&mut http).zip(targets.ips.iter()) {
            let echo = match ip {
                IpAddr::V4(_) => health_common::headers::IPPROTO_ICMP,
                IpAddr::V6(_) => health_common::headers::IPPROTO_ICMPV6,
            };
            kernel_rtt(*ip, echo, icmp);
            kernel_rtt(*ip, health_common::ct::IPPROTO_TCP, http);
        }
        let rtt_done = t0.elapsed();
        if let Some(m) = &self.cfg.metrics {
            let took = numbered.then(|| t0.elapsed());
            m.record_round(icmp.iter().zip(&http), |i| targets.kind(i), took);
        }
        let metrics_done = t0.elapsed();
        let (keys, at) = (&targets.keys, epoch_ms(SystemTime::now()));
        let probes = self.while_recording(|| {
            let outcomes = icmp.into_iter().zip(http);
            let round = numbered.then(|| (seq, epoch_ms(started)));
            let probes = self.record_in(&nodes, keys, outcomes, round, at);
            self.record_mtu(&nodes, keys, &mtu, &icmp_mtu);
            self.record_flows(&nodes, keys, &[icmp_flows, http_flows]);
            probes
        });
        self.start_traces(&targets.ips);
        if whole {
            self.encryption_check(&nodes, false).await;
        }
        let merged = t0.elapsed();
        self.publish_round(numbered.then(|| RoundInfo {
            seq,
            started_ms: epoch_ms(started),
            duration_ms: ms(t0.elapsed()),
            probes,
        }));
        // The round's records and outcomes are freed: their pages go back,
        // so RSS between rounds is what is held, not the round's peak.
        crate::util::memory::release_free();
        tracing::debug!(
            seq,
            ?kind,
            icmp_ms = ms(icmp_done),
            http_ms = ms(http_done),
            rtt_ms = ms(rtt_done),
            metrics_ms = ms(metrics_done),
            merged_ms = ms(merged),
            published_ms = ms(t0.elapsed()),
            "round done"
        );
        self.pass_on_joined(kind);
        self.status_summary()
    }

    /// After a round of `kind`: one of another kind took the turn of the
    /// round of the nodes that joined due, which it passes on while some
    /// are to come.
    fn pass_on_joined(&self, kind: RoundKind) {
        if kind != RoundKind::Joined && self.joining.load(std::sync::atomic::Ordering::Relaxed) {
            self.joins_more();
        }
    }

    /// A round's number: the next for a numbered one; the last for the
    /// round of the nodes that joined, which takes none.
    fn seq_of(&self, kind: RoundKind) -> u64 {
        use std::sync::atomic::Ordering::Relaxed;
        match kind {
            RoundKind::Whole | RoundKind::Some => self.round_seq.fetch_add(1, Relaxed) + 1,
            RoundKind::Joined => self.round_seq.load(Relaxed),
        }
    }

    /// Publishes a numbered round, or (`None`) the round of the nodes that
    /// joined under the last round's info and number: no one waiting for
    /// the next round takes it for one.
    fn publish_round(&self, round: Option<RoundInfo>) {
        match round {
            Some(round) => self.publish(Some(round), false),
            None => self.publish(self.status_summary().round.clone(), true),
        }
    }

    /// The encryption check, when on: before a round (`before`), the
    /// counters made to watch its addresses; after it, every address
    /// judged. On a blocking thread (netlink and map syscalls).
    async fn encryption_check(&self, nodes: &NodeSet, before: bool) {
        let Some(enc) = self.cfg.encryption.clone() else {
            return;
        };
        let nodes = nodes.clone();
        let _ = tokio::task::spawn_blocking(move || {
            if before {
                enc.prepare(&nodes);
            } else {
                enc.evaluate(&nodes);
            }
        })
        .await;
    }

    /// The round's targets (indices, see [`super::targets::Targets`]) in
    /// the order the engines start their probes, those whose paths failed
    /// their last probe first (see [`order`]).
    fn failed_first(&self, nodes: &NodeSet, keys: &[(u32, u8)], spread: Spread) -> Suspects {
        let n = spread.n * spread.flows;
        let of = |failed: &[Failed]| {
            Suspects::of(n, |i| {
                failed.get(spread.of(i).1).copied().unwrap_or_default()
            })
        };
        // As the last round left them, when it probed this very node set
        // (only a round's recording changes a path's failures).
        if let Ok(last) = self.failed.lock()
            && let Some((set, failed)) = last.as_ref()
            && set.same_snapshot(nodes)
            && failed.len() == keys.len()
        {
            return of(failed);
        }
        of(&self.failed_looked_up(nodes, keys))
    }

    /// Which of each target's paths failed its last probe, from the
    /// paths' states.
    fn failed_looked_up(&self, nodes: &NodeSet, keys: &[(u32, u8)]) -> Vec<Failed> {
        let Ok(paths) = self.paths.lock() else {
            return Vec::new();
        };
        // Each target's verdict once, a node's paths looked up once for
        // its addresses (consecutive in `keys`), whatever the flows.
        let mut last: Option<(u32, Option<&NodePaths>)> = None;
        keys.iter()
            .map(|&(node, address)| {
                let p = match last {
                    Some((n, p)) if n == node => p,
                    _ => {
                        let p = paths.get(nodes[node as usize].name.as_str());
                        last = Some((node, p));
                        p
                    }
                };
                let icmp = 2 * usize::from(address);
                let failing = |slot| p.is_some_and(|p| p.state(slot).consecutive_failures > 0);
                Failed {
                    icmp: failing(icmp),
                    http: failing(icmp + 1),
                }
            })
            .collect()
    }
}

/// `f`'s output and when it was ready, counted from `t0`.
async fn timed<T>(t0: Instant, f: impl Future<Output = T>) -> (T, Duration) {
    let out = f.await;
    (out, t0.elapsed())
}

#[cfg(test)]
mod tests;
