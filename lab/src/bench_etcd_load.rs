//! `bench-etcd-load`: a real etcd under the load the cluster view puts on
//! it with N agents: every agent publishes its round summary under its
//! lease, at most once per probe interval, and every agent watches every
//! agent's summaries.
//!
//! ```text
//! this process: N simulated agents; agent i, on connection i mod C:
//!                 its lease (the agent's default TTL), kept alive by its
//!                 own keepalive stream,
//!                 its summary put with the lease once per interval (each
//!                 agent at its own phase),
//!               W watchers of the summaries prefix (W = N by default),
//!                 watcher j its own watch stream on connection j mod C
//!       │ loopback, gRPC (etcd-client), C connections (default 8)
//! etcd: a local one (temporary data directory, free ports), removed after
//! ```
//!
//! **Summaries.** The agent's own [`Summary`], encoded by
//! [`Summary::encode`], as `bench-cluster-sim` builds them: the N agents
//! are nodes with EC2-style names in zones of [`ZONE_SIZE`], each probes
//! what the agent's [`SubsetPlan`] assigns it with K = [`DEFAULT_PEERS`]
//! (itself, its zone and 32 others: 52 peers once N ≥ 52), every path in
//! Success with an RTT (ICMP 80-400 µs, HTTP 300-3,000 µs, new each
//! round). Its `seq` is the round (1, 2, ...), its `at_ms` the wall clock
//! of the put. The key is the agent's: `<summaries prefix><node name>`
//! ([`summaries_prefix`] of the default node prefix). The encoded size is
//! reported.
//!
//! **Delivery latency.** The summary's only time field, `at_ms`, has a
//! resolution of 1 ms, too coarse for latencies of a few ms on loopback:
//! each agent keeps, in this process, the monotonic time at which it sent
//! each put, by (agent, seq) ([`PutTimes`]); a watcher reads the seq from
//! the summary's header and the agent from the key, and records its
//! receive time less the send time: the put's way to consensus plus the
//! watch's fan-out. Every delivery of every watcher is recorded, in
//! histograms of bounded memory (100 µs buckets up to 60 s, exact max:
//! [`Histogram`]).
//!
//! **Completeness.** Every watch starts at the revision right after a
//! read made before any put, so it sees every put. Each watcher counts what it receives per agent and checks each
//! agent's seqs increase; watcher 0 also decodes every summary with
//! [`Summary::decode`] and checks it against its key. Missing: per watcher
//! and agent, the agent's acknowledged puts not received.
//!
//! Reported: the encoded summary size; puts per second achieved against
//! asked, put latency; deliveries (all of them must arrive) per second and
//! their latency p50/p99/max; etcd's database size (status API) and CPU,
//! and this process's CPU (it shares the machine with etcd). PASS when the
//! delivery p99 is at most 1 s and no delivery is missing or wrong. Then
//! the election phase (`bench_election`): the N agents campaign for the
//! cluster view's assembler, each with the agent's own client, and the
//! leader's session ends mid-run: the time to another agent's view.
//!
//! **Why not the agent's `KvStore`.** [`KvStore`] does the same calls
//! (grant, keepalive stream every TTL/3, put with the lease, a prefix watch
//! from the revision after a read), with the same crate, and those calls
//! and the agent's connect options are reproduced here. But a store makes
//! its own private connection (nothing lets stores share one): N agents
//! through it would be N connections, N lease sessions and N watch tasks,
//! each forwarding every event through a channel of its own before the
//! receiver sees it. Driven from this one process on the cores etcd uses,
//! that client work (which production spreads over N machines) would be
//! measured as etcd's delivery latency, and the connections could not be
//! set to the few that the fan-out is measured over (see
//! [`DEFAULT_CONNECTIONS`]). So `etcd_client` is used directly.
//!
//! [`KvStore`]: health_agent::membership::kvstore::KvStore

use std::{
    collections::HashMap,
    fmt::Write as _,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::{Context as _, bail, ensure};
use etcd_client::{
    Client, ConnectOptions, EventType, GetOptions, LeaseKeepAliveStream, LeaseKeeper, PutOptions,
    WatchOptions, WatchStream,
};
use health_agent::{
    cluster::{
        subset::{DEFAULT_PEERS, ProbePeers, SubsetPlan},
        summary::{PathSample, PeerSummary, Summary},
    },
    daemon::cluster_view::summaries_prefix,
    membership::{NodeSet, kvstore::REQUEST_TIMEOUT},
    probe::path::ProbeResult,
    util::timefmt::now_ms,
};
use health_tests::etcd::LocalEtcd;
use tokio::time::Instant;

use crate::sim_nodes::{MAX_NODES, node, rtt_us};
use tokio_util::sync::CancellationToken;

pub(crate) struct Options {
    pub(crate) agents: usize,
    /// Default: two intervals ([`default_seconds`]).
    pub(crate) seconds: Option<u32>,
    pub(crate) interval: Duration,
    /// Default: one per agent.
    pub(crate) watchers: Option<usize>,
    /// Client connections all the traffic is spread over.
    pub(crate) connections: usize,
}

/// The agent's default `--probe-interval` (`health_agent::config::ProbeTuning`):
/// it publishes its summary at most once per interval.
pub(crate) const DEFAULT_INTERVAL: &str = "60s";

/// Client connections, shared by the agents (agent i's lease, puts and
/// watch on connection i mod C, as the agent keeps all three on its one
/// connection). etcd (grpc-go) serves a connection with one reader and one
/// writer goroutine: every frame of every stream on it goes through that
/// writer and that socket, in order. In production each agent has its own
/// connection, so the watch fan-out is written by all of etcd's cores at
/// once. One connection would make that writer the bottleneck, one per
/// agent would have this process (on the cores etcd uses) drive N HTTP/2
/// connections. 8 is more than etcd's cores here (2) and on a typical etcd
/// host (up to 8), so every core can write at once, and at 1,000 agents
/// each connection carries 125 watch streams. Streams sharing a connection
/// may share socket writes, which N connections cannot: etcd's CPU is if
/// anything understated; `--connections` equal to `--agents` gives the
/// product's one connection per agent.
pub(crate) const DEFAULT_CONNECTIONS: usize = 8;

/// The target: summaries reach every watcher within this, at p99.
const BUDGET: Duration = Duration::from_secs(1);
/// The agent's default node prefix (`--kvstore-prefix`).
const NODE_PREFIX: &str = "/health/nodes/";
/// The agent's default `--kvstore-lease-ttl`; it keeps its lease alive
/// every third of it.
const LEASE_TTL: Duration = Duration::from_mins(15);
/// Nodes per zone, as `bench-cluster-sim` by default.
const ZONE_SIZE: usize = 20;
/// How long deliveries may still arrive after the last put.
const DRAIN: Duration = Duration::from_secs(3);

/// The default run: every agent publishes at least twice (its phase is
/// under one interval, so its second put is before two intervals).
pub(crate) fn default_seconds(interval: Duration) -> u32 {
    let two = interval.saturating_mul(2);
    let secs = two.as_secs() + u64::from(two.subsec_nanos() > 0);
    u32::try_from(secs).unwrap_or(u32::MAX).max(1)
}

// ---------------------------------------------------------------------------
// The cluster and its summaries.

/// The simulated cluster: agent i is node i of the set (sorted by name).
struct Cluster {
    prefix: String,
    names: Vec<String>,
    /// Each agent's peers (indices into `names`), as the agent selects them.
    picks: Vec<Vec<usize>>,
    /// An agent by its summary's key.
    by_key: HashMap<Vec<u8>, usize>,
}

impl Cluster {
    fn new(agents: usize) -> anyhow::Result<Self> {
        let nodes = NodeSet::new((0..agents).map(|id| node(id, id / ZONE_SIZE)).collect())?;
        let plan = SubsetPlan::new(&nodes);
        let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
        let picks = (0..names.len())
            .map(|i| plan.assigned_index(i, ProbePeers::Count(DEFAULT_PEERS)))
            .collect();
        let prefix = summaries_prefix(NODE_PREFIX);
        let by_key = names
            .iter()
            .enumerate()
            .map(|(i, n)| (format!("{prefix}{n}").into_bytes(), i))
            .collect();
        Ok(Self {
            prefix,
            names,
            picks,
            by_key,
        })
    }

    fn len(&self) -> usize {
        self.names.len()
    }

    fn key(&self, agent: usize) -> String {
        format!("{}{}", self.prefix, self.names[agent])
    }

    /// Agent `i`'s summary of round `seq`, ended at `at_ms`, encoded.
    fn summary(&self, i: usize, seq: u64, at_ms: u64) -> anyhow::Result<Vec<u8>> {
        let peers = self.picks[i]
            .iter()
            .map(|&t| PeerSummary {
                name: self.names[t].clone(),
                paths: std::array::from_fn(|p| {
                    PathSample::new(ProbeResult::Success, Some(rtt_us(i, t, p, seq)))
                }),
            })
            .collect();
        Ok(Summary::new(self.names[i].clone(), seq, at_ms, peers)?.encode())
    }
}

// ---------------------------------------------------------------------------
// Measurements.

/// Latencies in µs, with bounded memory: [`Histogram::BUCKET_US`] buckets
/// up to [`Histogram::RANGE_US`] (one more for anything above) and the
/// exact maximum. Shared by every task (relaxed atomics).
struct Histogram {
    buckets: Vec<AtomicU64>,
    max: AtomicU64,
}

impl Histogram {
    const BUCKET_US: u64 = 100;
    const RANGE_US: u64 = 60_000_000;

    fn new() -> Self {
        let n = (Self::RANGE_US / Self::BUCKET_US) as usize + 1;
        Self {
            buckets: (0..n).map(|_| AtomicU64::new(0)).collect(),
            max: AtomicU64::new(0),
        }
    }

    fn record(&self, us: u64) {
        let i = ((us / Self::BUCKET_US) as usize).min(self.buckets.len() - 1);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.max.fetch_max(us, Ordering::Relaxed);
    }

    fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Ordering::Relaxed)).sum()
    }

    fn max(&self) -> u64 {
        self.max.load(Ordering::Relaxed)
    }

    /// The `p` quantile, in µs: the upper edge of its bucket (at most
    /// [`Self::BUCKET_US`] above the sample), at most the maximum; the
    /// maximum when it is above the range.
    fn quantile(&self, p: f64) -> u64 {
        let n = self.count();
        if n == 0 {
            return 0;
        }
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss,
            reason = "a rank among at most billions of samples"
        )]
        let rank = ((n as f64 * p).ceil() as u64).clamp(1, n);
        let mut seen = 0;
        for (i, b) in self.buckets.iter().enumerate() {
            seen += b.load(Ordering::Relaxed);
            if seen >= rank {
                // The last bucket holds everything above the range.
                if i + 1 == self.buckets.len() {
                    break;
                }
                return ((i as u64 + 1) * Self::BUCKET_US).min(self.max());
            }
        }
        self.max()
    }
}

/// When each agent sent its latest puts, in µs of the run's clock: per
/// agent [`PutTimes::SLOTS`] slots by seq, each the seq's low 24 bits above
/// 40 bits of time (12 days). A delivery more than `SLOTS` puts of its
/// agent late finds its slot taken: counted as unstamped.
struct PutTimes {
    slots: Vec<AtomicU64>,
}

impl PutTimes {
    const SLOTS: usize = 64;
    const TIME_BITS: u32 = 40;
    const TIME_MASK: u64 = (1 << Self::TIME_BITS) - 1;
    const SEQ_MASK: u64 = (1 << 24) - 1;

    fn new(agents: usize) -> Self {
        Self {
            slots: (0..agents * Self::SLOTS)
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }

    fn slot(&self, agent: usize, seq: u64) -> &AtomicU64 {
        &self.slots[agent * Self::SLOTS + (seq % Self::SLOTS as u64) as usize]
    }

    fn record(&self, agent: usize, seq: u64, us: u64) {
        let v = ((seq & Self::SEQ_MASK) << Self::TIME_BITS) | (us & Self::TIME_MASK);
        self.slot(agent, seq).store(v, Ordering::Release);
    }

    fn get(&self, agent: usize, seq: u64) -> Option<u64> {
        let v = self.slot(agent, seq).load(Ordering::Acquire);
        (v != 0 && v >> Self::TIME_BITS == seq & Self::SEQ_MASK).then_some(v & Self::TIME_MASK)
    }
}

/// What every task adds to.
struct Shared {
    cluster: Cluster,
    /// The run's clock (monotonic): put and receive times are µs of it.
    epoch: std::time::Instant,
    sent: PutTimes,
    put_latency: Histogram,
    delivery: Histogram,
    puts: AtomicU64,
    put_errors: AtomicU64,
    keepalive_errors: AtomicU64,
    /// Encoded summary sizes.
    bytes_total: AtomicU64,
    bytes_min: AtomicU64,
    bytes_max: AtomicU64,
    /// Deliveries so far, every watcher's.
    delivered: AtomicU64,
}

impl Shared {
    fn new(cluster: Cluster) -> Self {
        Self {
            sent: PutTimes::new(cluster.len()),
            cluster,
            epoch: std::time::Instant::now(),
            put_latency: Histogram::new(),
            delivery: Histogram::new(),
            puts: AtomicU64::new(0),
            put_errors: AtomicU64::new(0),
            keepalive_errors: AtomicU64::new(0),
            bytes_total: AtomicU64::new(0),
            bytes_min: AtomicU64::new(u64::MAX),
            bytes_max: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
        }
    }

    fn now_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }
}

/// What one watcher received.
struct Seen {
    /// Per agent: its last seq received (0: none) and how many.
    per_agent: Vec<(u64, u64)>,
    deliveries: u64,
    /// A seq not above the agent's last one.
    out_of_order: u64,
    /// Not a summary of an agent, or (watcher 0) one that does not decode
    /// to its key's observer and its header's seq.
    invalid: u64,
    /// No send time found for its (agent, seq).
    unstamped: u64,
}

// ---------------------------------------------------------------------------
// The load.

async fn connect(endpoint: &str) -> anyhow::Result<Client> {
    // The agent's options (`KvStore`).
    let opts = ConnectOptions::new()
        .with_connect_timeout(REQUEST_TIMEOUT)
        .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
        .with_keep_alive_while_idle(false);
    Client::connect([format!("http://{endpoint}")], Some(opts))
        .await
        .with_context(|| format!("connecting to etcd at {endpoint}"))
}

/// An agent's lease, granted, and its keepalive stream.
async fn lease(client: Client) -> anyhow::Result<(i64, LeaseKeeper, LeaseKeepAliveStream)> {
    let mut leases = client.lease_client();
    let ttl = i64::try_from(LEASE_TTL.as_secs()).unwrap_or(i64::MAX);
    let id = tokio::time::timeout(REQUEST_TIMEOUT, leases.grant(ttl, None))
        .await
        .context("granting a lease: no answer")??
        .id();
    let (keeper, answers) = tokio::time::timeout(REQUEST_TIMEOUT, leases.keep_alive(id))
        .await
        .context("keeping a lease alive: no answer")??;
    Ok((id, keeper, answers))
}

/// Keeps a lease alive every third of its TTL (as `KvStore`), until `stop`.
async fn keep_alive(
    mut keeper: LeaseKeeper,
    mut answers: LeaseKeepAliveStream,
    stop: CancellationToken,
    shared: Arc<Shared>,
) {
    let mut tick = tokio::time::interval(LEASE_TTL / 3);
    tick.tick().await;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => if keeper.keep_alive().await.is_err() {
                shared.keepalive_errors.fetch_add(1, Ordering::Relaxed);
            },
            msg = answers.message() => if !matches!(msg, Ok(Some(ref r)) if r.ttl() > 0) {
                shared.keepalive_errors.fetch_add(1, Ordering::Relaxed);
                return;
            },
        }
    }
}

/// A watch of the summaries prefix from `revision`, once etcd has created it.
async fn open_watch(client: Client, prefix: String, revision: i64) -> anyhow::Result<WatchStream> {
    let opts = WatchOptions::new()
        .with_prefix()
        .with_start_revision(revision);
    let mut stream = tokio::time::timeout(
        REQUEST_TIMEOUT,
        client.watch_client().watch(prefix, Some(opts)),
    )
    .await
    .context("opening a watch: no answer")??;
    let first = tokio::time::timeout(REQUEST_TIMEOUT, stream.message())
        .await
        .context("creating a watch: no answer")??
        .context("the watch ended before it was created")?;
    ensure!(
        first.created() && !first.canceled() && first.events().is_empty(),
        "the watch was not created: {}",
        first.cancel_reason()
    );
    Ok(stream)
}

/// One agent's puts: its summary with its lease every `interval` from
/// `start + phase` until `end` (it returns then, not at its next put).
/// Returns the puts acknowledged.
async fn agent(
    i: usize,
    client: Client,
    lease: i64,
    (start, phase, end, interval): (Instant, Duration, Instant, Duration),
    shared: Arc<Shared>,
) -> anyhow::Result<u64> {
    let mut kv = client.kv_client();
    let key = shared.cluster.key(i);
    let mut acked = 0;
    let mut at = start + phase;
    let mut seq = 0;
    while at < end {
        tokio::time::sleep_until(at).await;
        seq += 1;
        let value = shared.cluster.summary(i, seq, now_ms())?;
        let len = value.len() as u64;
        shared.bytes_total.fetch_add(len, Ordering::Relaxed);
        shared.bytes_min.fetch_min(len, Ordering::Relaxed);
        shared.bytes_max.fetch_max(len, Ordering::Relaxed);
        let sent = shared.now_us();
        shared.sent.record(i, seq, sent);
        let put = kv.put(
            key.clone(),
            value,
            Some(PutOptions::new().with_lease(lease)),
        );
        if let Ok(Ok(_)) = tokio::time::timeout(REQUEST_TIMEOUT, put).await {
            shared.puts.fetch_add(1, Ordering::Relaxed);
            shared
                .put_latency
                .record(shared.now_us().saturating_sub(sent));
            acked += 1;
        } else {
            shared.put_errors.fetch_add(1, Ordering::Relaxed);
        }
        // The next interval; a put that took longer delays the next one
        // (as the agent's ticker: `MissedTickBehavior::Delay`).
        at = (at + interval).max(Instant::now());
    }
    Ok(acked)
}

/// One watcher: every delivery's latency and bookkeeping, until `stop`.
async fn watcher(
    w: usize,
    mut stream: WatchStream,
    stop: CancellationToken,
    shared: Arc<Shared>,
) -> anyhow::Result<Seen> {
    let cluster = &shared.cluster;
    let mut seen = Seen {
        per_agent: vec![(0, 0); cluster.len()],
        deliveries: 0,
        out_of_order: 0,
        invalid: 0,
        unstamped: 0,
    };
    loop {
        let msg = tokio::select! {
            biased;
            m = stream.message() => m?,
            () = stop.cancelled() => break,
        };
        let Some(resp) = msg else {
            bail!("the watch ended");
        };
        if resp.canceled() {
            bail!("the watch was canceled: {}", resp.cancel_reason());
        }
        let now = shared.now_us();
        for ev in resp.events() {
            let Some(kv) = ev.kv().filter(|_| ev.event_type() == EventType::Put) else {
                continue;
            };
            seen.deliveries += 1;
            shared.delivered.fetch_add(1, Ordering::Relaxed);
            let (Some(&agent), Some(seq)) = (
                cluster.by_key.get(kv.key()),
                Summary::decode(kv.value()).ok().map(|s| s.seq()),
            ) else {
                seen.invalid += 1;
                continue;
            };
            if w == 0
                && !Summary::decode(kv.value())
                    .is_ok_and(|s| s.observer() == cluster.names[agent] && s.seq() == seq)
            {
                seen.invalid += 1;
            }
            let (last, count) = &mut seen.per_agent[agent];
            if seq <= *last {
                seen.out_of_order += 1;
            }
            *last = seq.max(*last);
            *count += 1;
            match shared.sent.get(agent, seq) {
                Some(sent) => shared.delivery.record(now.saturating_sub(sent)),
                None => seen.unstamped += 1,
            }
        }
    }
    Ok(seen)
}

/// etcd's CPU time so far (user + system), from /proc.
fn cpu_time(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok()?;
    Some(Duration::from_millis(ticks * 1000 / hz.max(1)))
}

/// The CPU time of etcd and of this process.
fn cpu_times(etcd: u32) -> Option<(Duration, Duration)> {
    cpu_time(etcd).zip(cpu_time(std::process::id()))
}

pub(crate) fn run(opts: &Options) -> anyhow::Result<String> {
    ensure!(!opts.interval.is_zero(), "--interval must be more than 0");
    ensure!(
        opts.agents <= MAX_NODES,
        "--agents {}: at most {MAX_NODES} (the simulated nodes' addresses are in 198.18.0.0/15)",
        opts.agents
    );
    let began = std::time::Instant::now();
    let etcd = LocalEtcd::start();
    progress(&format!(
        "etcd up in {:.1} s",
        began.elapsed().as_secs_f64()
    ));
    let pid = etcd.pid().context("etcd's pid")?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let report = rt.block_on(load(opts, &etcd.endpoint, pid))?;
    progress("the election: the agents campaign, the leader's session ends mid-run");
    let election = rt.block_on(crate::bench_election::election(
        &etcd.endpoint,
        opts.agents.max(1),
    ))?;
    drop(etcd);
    Ok(format!("{report}{election}"))
}

/// A step of the run, on stderr (the report is on stdout).
fn progress(what: &str) {
    eprintln!("bench-etcd-load: {what}");
}

/// Awaits every task.
async fn join_all<T>(
    tasks: Vec<tokio::task::JoinHandle<anyhow::Result<T>>>,
) -> anyhow::Result<Vec<T>> {
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.context("a task panicked")??);
    }
    Ok(out)
}

/// The run's shape, its defaults resolved.
struct Shape {
    agents: usize,
    watchers: usize,
    connections: usize,
    seconds: u32,
    interval: Duration,
}

/// Every agent's lease and every watcher's watch, all at once (the agents
/// start once all are up).
async fn setup(
    clients: &[Client],
    shape: &Shape,
    prefix: &str,
) -> anyhow::Result<(
    Vec<(i64, LeaseKeeper, LeaseKeepAliveStream)>,
    Vec<WatchStream>,
)> {
    let began = Instant::now();
    let conn = |i: usize| clients[i % clients.len()].clone();
    // Every watch starts right after this revision (as `KvStore` watches
    // after its read): none misses a put, whenever etcd creates it.
    let revision = clients[0]
        .kv_client()
        .get(
            prefix,
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await?
        .header()
        .map_or(0, etcd_client::ResponseHeader::revision);
    let leases = (0..shape.agents)
        .map(|i| tokio::spawn(lease(conn(i))))
        .collect();
    let watches = (0..shape.watchers)
        .map(|j| tokio::spawn(open_watch(conn(j), prefix.to_owned(), revision + 1)))
        .collect();
    let leases = join_all(leases).await.context("the agents' leases")?;
    let watches = join_all(watches).await.context("the watches")?;
    progress(&format!(
        "{} leases and {} watches over {} connections in {:.1} s; the agents put for {} s",
        shape.agents,
        shape.watchers,
        shape.connections,
        began.elapsed().as_secs_f64(),
        shape.seconds
    ));
    Ok((leases, watches))
}

async fn load(opts: &Options, endpoint: &str, pid: u32) -> anyhow::Result<String> {
    let cluster = Cluster::new(opts.agents.max(1))?;
    let shape = Shape {
        agents: cluster.len(),
        watchers: opts.watchers.unwrap_or(cluster.len()),
        connections: opts.connections.max(1),
        seconds: opts
            .seconds
            .unwrap_or_else(|| default_seconds(opts.interval)),
        interval: opts.interval,
    };
    let shared = Arc::new(Shared::new(cluster));
    let mut clients = Vec::new();
    for _ in 0..shape.connections {
        clients.push(connect(endpoint).await?);
    }
    let conn = |i: usize| clients[i % clients.len()].clone();
    let (leases, watches) = setup(&clients, &shape, &shared.cluster.prefix).await?;

    let stop = CancellationToken::new();
    let mut keepalives = Vec::new();
    let mut lease_ids = Vec::new();
    for (id, keeper, answers) in leases {
        lease_ids.push(id);
        keepalives.push(tokio::spawn(keep_alive(
            keeper,
            answers,
            stop.clone(),
            shared.clone(),
        )));
    }
    let watch_tasks: Vec<_> = watches
        .into_iter()
        .enumerate()
        .map(|(w, s)| tokio::spawn(watcher(w, s, stop.clone(), shared.clone())))
        .collect();
    let start = Instant::now() + Duration::from_millis(200);
    let end = start + Duration::from_secs(u64::from(shape.seconds));
    let agents = lease_ids
        .iter()
        .enumerate()
        .map(|(i, &lease)| {
            // Phases spread evenly over the interval.
            #[expect(
                clippy::cast_precision_loss,
                reason = "an agent's share of the interval"
            )]
            let phase = shape.interval.mul_f64(i as f64 / shape.agents as f64);
            let times = (start, phase, end, shape.interval);
            tokio::spawn(agent(i, conn(i), lease, times, shared.clone()))
        })
        .collect();
    tokio::time::sleep_until(start).await;
    let cpu_before = cpu_times(pid);
    let acked = join_all(agents).await.context("the agents")?;
    progress("the agents are done; waiting for the last deliveries");

    // Every acknowledged put to every watcher, or the drain's end.
    let expected = shared.puts.load(Ordering::Relaxed) * shape.watchers as u64;
    let drained = Instant::now() + DRAIN;
    while shared.delivered.load(Ordering::Relaxed) < expected && Instant::now() < drained {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let cpu_after = cpu_times(pid);
    let wall = start.elapsed();
    stop.cancel();
    let seen = join_all(watch_tasks).await.context("the watchers")?;
    for k in keepalives {
        k.await.context("a keepalive task panicked")?;
    }
    let etcd = clients[0].status().await.context("etcd status")?;
    let cpu = cpu_before.zip(cpu_after).map(|((e0, s0), (e1, s1))| {
        let percent = |d: Duration| d.as_secs_f64() * 100.0 / wall.as_secs_f64();
        (
            percent(e1.saturating_sub(e0)),
            percent(s1.saturating_sub(s0)),
        )
    });
    Ok(render(&Outcome {
        shape: &shape,
        shared: &shared,
        acked: &acked,
        seen: &seen,
        etcd: &etcd,
        cpu,
    }))
}

// ---------------------------------------------------------------------------
// The report.

/// What a run measured.
struct Outcome<'a> {
    shape: &'a Shape,
    shared: &'a Shared,
    /// Per agent.
    acked: &'a [u64],
    /// Per watcher.
    seen: &'a [Seen],
    etcd: &'a etcd_client::StatusResponse,
    /// etcd's and this process's CPU, in % of a core over the run.
    cpu: Option<(f64, f64)>,
}

/// Totals over the watchers.
#[derive(Default)]
struct Totals {
    got: u64,
    missing: u64,
    out_of_order: u64,
    invalid: u64,
    unstamped: u64,
    per_watcher_min: u64,
    per_watcher_max: u64,
}

impl Totals {
    fn of(acked: &[u64], seen: &[Seen]) -> Self {
        let mut t = Self {
            per_watcher_min: seen.iter().map(|s| s.deliveries).min().unwrap_or(0),
            per_watcher_max: seen.iter().map(|s| s.deliveries).max().unwrap_or(0),
            ..Self::default()
        };
        for s in seen {
            t.got += s.deliveries;
            t.out_of_order += s.out_of_order;
            t.invalid += s.invalid;
            t.unstamped += s.unstamped;
            t.missing += acked
                .iter()
                .zip(&s.per_agent)
                .map(|(&a, &(_, n))| a.saturating_sub(n))
                .sum::<u64>();
        }
        t
    }

    /// What is wrong, if anything: ", 3 missing, ...".
    fn problems(&self) -> String {
        let mut out = String::new();
        for (n, what) in [
            (self.missing, "deliveries missing"),
            (self.out_of_order, "out of order"),
            (self.invalid, "not a valid summary of its key"),
            (self.unstamped, "without a put time"),
        ] {
            if n > 0 {
                let _ = write!(out, ", {n} {what}");
            }
        }
        out
    }
}

#[expect(clippy::cast_precision_loss, reason = "microseconds to milliseconds")]
fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

#[expect(clippy::cast_precision_loss, reason = "counts for display")]
fn per_s(n: u64, secs: f64) -> f64 {
    n as f64 / secs
}

fn render(o: &Outcome<'_>) -> String {
    let (shape, shared) = (o.shape, o.shared);
    let puts = shared.puts.load(Ordering::Relaxed);
    let secs = f64::from(shape.seconds);
    #[expect(clippy::cast_precision_loss, reason = "counts for display")]
    let asked = shape.agents as f64 / shape.interval.as_secs_f64();
    let expected = puts * shape.watchers as u64;
    let t = Totals::of(o.acked, o.seen);
    let p99 = shared.delivery.quantile(0.99);
    let pass = u128::from(p99) <= BUDGET.as_micros()
        && t.got == expected
        && t.got > 0
        && t.problems().is_empty();
    let attempts = puts + shared.put_errors.load(Ordering::Relaxed);
    let peers = o.shared.cluster.picks.iter().map(Vec::len);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "etcd {} on loopback; {} agents, each with its lease (TTL {} s, kept alive by its own stream) and its summary (the agent's encoding, K = {DEFAULT_PEERS} and a zone of {ZONE_SIZE}: {}-{} peers, {}-{} B, mean {} B) put with it every {:?}; {} watchers of {} (a watch stream each); all over {} connections; {} s{}",
        o.etcd.version(),
        shape.agents,
        LEASE_TTL.as_secs(),
        peers.clone().min().unwrap_or(0),
        peers.max().unwrap_or(0),
        shared
            .bytes_min
            .load(Ordering::Relaxed)
            .min(shared.bytes_max.load(Ordering::Relaxed)),
        shared.bytes_max.load(Ordering::Relaxed),
        shared.bytes_total.load(Ordering::Relaxed) / attempts.max(1),
        shape.interval,
        shape.watchers,
        shared.cluster.prefix,
        shape.connections,
        shape.seconds,
        if shape.seconds < default_seconds(shape.interval) {
            " (under two intervals: not every agent publishes twice)"
        } else {
            ""
        },
    );
    let _ = writeln!(
        out,
        "writes:      {:.1} puts/s achieved of {asked:.1} asked ({puts} puts, {} errors, {} keepalive errors); put latency p50 {:.1} ms, p99 {:.1} ms",
        per_s(puts, secs),
        shared.put_errors.load(Ordering::Relaxed),
        shared.keepalive_errors.load(Ordering::Relaxed),
        ms(shared.put_latency.quantile(0.5)),
        ms(shared.put_latency.quantile(0.99)),
    );
    #[expect(clippy::cast_precision_loss, reason = "counts for display")]
    let asked_deliveries = asked * shape.watchers as f64;
    let _ = writeln!(
        out,
        "deliveries:  {} of {expected} expected ({:.0}/s of {asked_deliveries:.0}/s asked; {}-{} per watcher); latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} recorded)",
        t.got,
        per_s(t.got, secs),
        t.per_watcher_min,
        t.per_watcher_max,
        ms(shared.delivery.quantile(0.5)),
        ms(p99),
        ms(shared.delivery.max()),
        shared.delivery.count(),
    );
    #[expect(clippy::cast_precision_loss, reason = "bytes to MiB for display")]
    let mib = |b: i64| b as f64 / (1024.0 * 1024.0);
    let _ = writeln!(
        out,
        "etcd:        db size {:.1} MiB ({:.1} MiB in use; no compaction during the run), raft index {}; CPU {}",
        mib(o.etcd.db_size()),
        mib(o.etcd.raft_used_db_size()),
        o.etcd.raft_index(),
        o.cpu.map_or_else(
            || "unknown".into(),
            |(etcd, this)| format!(
                "{etcd:.0} % of a core (this process, agents and watchers: {this:.0} %)"
            )
        )
    );
    let _ = writeln!(
        out,
        "{}: watch delivery p99 {:.1} ms against {} ms{}",
        if pass { "PASS" } else { "FAIL" },
        ms(p99),
        BUDGET.as_millis(),
        t.problems(),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_are_the_agents_and_carry_their_seq() {
        let c = Cluster::new(1000).expect("cluster");
        assert!(c.picks.iter().all(|p| p.len() == 52), "self, 19, 32");
        for (i, seq) in [(0, 1), (517, 300), (999, 1 << 40)] {
            let bytes = c.summary(i, seq, 1_790_000_000_000).expect("summary");
            assert!(bytes.len() <= 1536, "{} bytes", bytes.len());
            let s = Summary::decode(&bytes).expect("decodes");
            assert_eq!((s.observer(), s.seq()), (c.names[i].as_str(), seq));
            assert_eq!(s.peers().len(), 52);
            assert_eq!(c.by_key.get(c.key(i).as_bytes()), Some(&i));
        }
        assert_eq!(c.key(0), format!("/health/summaries/{}", c.names[0]));
    }

    #[test]
    fn quantiles_are_within_a_bucket() {
        let h = Histogram::new();
        assert_eq!(h.quantile(0.99), 0);
        for ms in 1..=100 {
            h.record(ms * 1000 + 17);
        }
        h.record(90_000_000);
        assert_eq!(h.count(), 101);
        assert_eq!(h.quantile(0.5), 51_100);
        assert_eq!(h.quantile(0.99), 100_100);
        assert_eq!(h.quantile(1.0), 90_000_000, "above the range: the max");
        assert_eq!(h.max(), 90_000_000);
    }

    #[test]
    fn put_times_keep_the_latest_puts() {
        let t = PutTimes::new(2);
        assert_eq!(t.get(1, 1), None);
        t.record(1, 1, 12_345);
        assert_eq!(t.get(1, 1), Some(12_345));
        assert_eq!(t.get(0, 1), None);
        t.record(1, 1 + PutTimes::SLOTS as u64, 99);
        assert_eq!(t.get(1, 1), None, "overwritten");
        assert_eq!(t.get(1, 1 + PutTimes::SLOTS as u64), Some(99));
    }

    #[test]
    fn the_default_run_has_two_intervals() {
        assert_eq!(default_seconds(Duration::from_secs(60)), 120);
        assert_eq!(default_seconds(Duration::from_millis(2500)), 5);
        assert_eq!(default_seconds(Duration::from_millis(1)), 1);
    }
}
