//! The cluster view: the agent publishes a compact summary ([`Summary`])
//! of its last round under its lease, at `<summaries prefix><node>`, when
//! what it says of its peers changed and otherwise every
//! [`HEARTBEAT_ROUNDS`] ticks ([`SummaryWrites`]). It ticks at the
//! liveness interval while liveness echoes go
//! ([`crate::probe::liveness`]), else at the probe interval, and a round
//! between ticks (a node that stopped answering, probed at once) is
//! summarised as soon as it ends. The agents elect one of them, on an
//! election lease of [`ELECTION_TTL`] (`<parent>/assembler/`); the
//! leader alone watches every agent's summaries (from when its node set
//! is read; applied one event at a time, never re-listed; only those of
//! nodes of the set, let go when their node leaves), assembles the view
//! ([`view::assemble`]) once
//! a tick and publishes it at `<parent>/view/<its name>`
//! ([`PublishedView`]: the counts, the nodes not healthy), on its election
//! lease, with a write conditional on its election key. Every agent (the
//! leader too) watches that prefix alone (one key, two during a
//! failover) and serves the newest view for `GET /v1/cluster`, `status --cluster`
//! and the connectivity page, with who assembled it and whether it is
//! stale; the leader also serves the matrix. An agent that stops
//! publishing drops out of the view when its lease ends, or after
//! [`STALE_ROUNDS`] ticks without a new summary. When the leader
//! stops it resigns; killed, its election lease ends within
//! [`ELECTION_TTL`]; another agent is elected and publishes at its next
//! tick.

use std::{borrow::Cow, collections::HashMap, sync::Arc, time::Duration};

use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::{
    cluster::{
        assigned::Assignments,
        contradiction::Checker,
        matrix,
        published_view::PublishedView,
        subset::ProbePeers,
        summary::{Names, Summary},
        summary_writes::SummaryWrites,
        view::{self, ViewParams},
        view_cell::ClusterViewCell,
        view_inbox::ViewInbox,
        view_reader::{ViewReader, millis},
    },
    membership::{
        NodeSet,
        kvstore::{KvStore, LeaderPutError, Leadership, Listing, Role, WatchEvent},
        published::Nodes,
    },
    probe::Prober,
    util::errors::chain,
};

pub use crate::cluster::cadence::{HEARTBEAT_ROUNDS, STALE_ROUNDS};

mod leading;
use leading::Leading;

/// The election lease's TTL: a leader killed without a word loses the
/// role this long after its last keepalive.
pub const ELECTION_TTL: Duration = Duration::from_secs(3);

/// Node `name`'s summary's key under the summaries' prefix.
#[must_use]
pub fn summary_key(summaries_prefix: &str, name: &str) -> String {
    format!("{summaries_prefix}{name}")
}

/// The summaries' prefix beside the node records': `/health/nodes/` gives
/// `/health/summaries/`.
#[must_use]
pub fn summaries_prefix(node_prefix: &str) -> String {
    crate::membership::kvstore::beside(node_prefix, "summaries")
}

#[derive(Clone)]
pub(super) struct ClusterViewTask {
    pub(super) store: KvStore,
    pub(super) prefix: String,
    /// Where the elected agent publishes the view (at its own name).
    pub(super) view_prefix: String,
    /// The election's name (the candidates' keys are below it).
    pub(super) election: String,
    pub(super) local: String,
    pub(super) prober: watch::Receiver<Arc<Prober>>,
    pub(super) nodes: Nodes,
    pub(super) cell: ClusterViewCell,
    /// `--probe-peers`: what each observer is assigned, and so may report.
    pub(super) peers: Option<ProbePeers>,
}

/// The most summary keys held: one per node of the largest node set
/// accepted (`--max-nodes`'s default). Summaries past it are refused and
/// reported, so that a writer of the prefix cannot make the agent hold
/// without bound.
pub const MAX_SUMMARIES: usize = 65_536;

/// How much of a refused summary's key the log shows.
const KEY_SHOWN: usize = 512;

/// How far ahead of the local clock a summary's time may be: two probe
/// intervals and this slack (clocks differ a little; a summary from the
/// far future would otherwise outlive every newer one).
const FUTURE_SLACK: Duration = Duration::from_secs(5);

/// Why a summary was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum Refusal {
    #[error("{0}")]
    Decode(String),
    #[error(
        "a summary counts only at exactly <prefix><observer>: {observer:?} belongs at {expected:?}"
    )]
    Key { observer: String, expected: String },
    #[error("its time is {ahead_ms} ms ahead of this node's clock (at most {limit_ms} ms)")]
    Future { ahead_ms: u64, limit_ms: u64 },
    #[error("{cap} summaries are held already")]
    Full { cap: usize },
    #[error("its observer {0:?} is not in the node set")]
    NotANode(String),
    #[error(
        "it reports on {peers} peers, more than the {most} taken: twice what an observer can be assigned in this node set (every node in a full mesh, else the largest zone and --probe-peers), and 64"
    )]
    TooManyPeers { peers: usize, most: usize },
}

/// The summaries held, by key, and what was refused since the last report.
struct Held {
    prefix: Vec<u8>,
    by_key: HashMap<Vec<u8>, Kept>,
    /// The most keys held.
    cap: usize,
    /// How far ahead of now a summary's time may be, in ms.
    future_ms: u64,
    refused: usize,
    first_refusal: Option<String>,
    /// The first listing was read whole: the summaries are all there.
    loaded: bool,
    /// A listing under way: it replaces `by_key` once whole.
    listing: Listing<HashMap<Vec<u8>, Kept>>,
    /// `--probe-peers` as this agent has it.
    peers: Option<ProbePeers>,
    /// The most peers a summary may report, and the node set it is of.
    peer_bound: Option<(NodeSet, usize)>,
    /// The peers' names, one copy each however many summaries name them:
    /// at 50,000 nodes every summary names about 50 of the same nodes.
    names: Names,
    /// Observations of nodes not in the node set, left out of the
    /// summaries held since the last report (a node that joined or left
    /// and the leader or the observer has not seen it yet, or names a
    /// writer made up).
    unknown_peers: usize,
    /// The observer that named the most of them in one summary, and how
    /// many.
    unknown_most: (String, usize),
    /// The names held after they were last pruned: pruned again at each
    /// of the leader's rounds, and sooner once twice as many (summaries
    /// rewritten with new names between rounds hold no more than that).
    names_pruned: usize,
}

/// Observations of nodes not in the node set in one summary past which
/// they are warned about: nodes joining or leaving faster than the leader
/// and the observer both see account for a few, a writer making names up
/// for many.
const UNKNOWN_PEERS_SAID: usize = 64;

/// Names are pruned between the leader's rounds only past this many.
const NAMES_PRUNED_PAST: usize = 4096;

/// The most peers a summary over `members` may report. An observer is
/// assigned every node in a full mesh; in a subset, its zone and K others
/// (itself included: K + its zone + 1). Twice that, over the largest zone,
/// and 64 more are taken, so that an observer whose node set holds a few
/// nodes this agent's does not (a join seen first, a record refused here
/// alone), or that probes with another `--probe-peers` while it changes,
/// is not refused: its observations of nodes not assigned to it are left
/// out when the view is assembled. A summary is held whole until then, so
/// this bounds what the summaries of every node may hold.
fn peer_bound(members: &NodeSet, peers: Option<ProbePeers>) -> usize {
    const SLACK: usize = 64;
    let n = members.len();
    let assigned = match peers.unwrap_or_else(|| ProbePeers::default_for(n)) {
        ProbePeers::All => n,
        ProbePeers::Count(k) => {
            let mut zones: HashMap<&str, usize> = HashMap::new();
            for z in members.iter().filter_map(|m| m.zone.as_deref()) {
                *zones.entry(z).or_default() += 1;
            }
            let zone = zones.into_values().max().unwrap_or(0);
            k.saturating_add(zone).saturating_add(1)
        }
    };
    assigned.saturating_mul(2).saturating_add(SLACK)
}

/// A summary held, and the version of its content: a number no other
/// summary read by this agent had.
struct Kept {
    summary: Summary,
    version: u64,
}

impl Kept {
    fn new(summary: Summary) -> Self {
        static VERSIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Self {
            summary,
            version: VERSIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }
}

impl Held {
    fn new(prefix: &str, interval: Duration, cap: usize) -> Self {
        Self {
            prefix: prefix.as_bytes().to_vec(),
            by_key: HashMap::new(),
            cap,
            future_ms: future_limit_ms(interval),
            refused: 0,
            first_refusal: None,
            loaded: false,
            listing: Listing::default(),
            peers: None,
            peer_bound: None,
            names: Names::default(),
            unknown_peers: 0,
            unknown_most: (String::new(), 0),
            names_pruned: 0,
        }
    }

    /// `self`, bounding the peers a summary may report by `peers`
    /// (`--probe-peers`; `None`: its default for the set's size).
    fn with_peers(mut self, peers: Option<ProbePeers>) -> Self {
        self.peers = peers;
        self
    }

    /// [`peer_bound`] over `members`, counted again only when the set
    /// changes.
    fn peer_bound(&mut self, members: &NodeSet) -> usize {
        match &self.peer_bound {
            Some((set, most)) if set.same_snapshot(members) => *most,
            _ => {
                let most = peer_bound(members, self.peers);
                self.peer_bound = Some((members.clone(), most));
                most
            }
        }
    }

    /// Checks a summary against the rules: decodes, sits at exactly its
    /// observer's key, its observer is one of `members` (so that keys of
    /// no node, however many, take no place a node's summary needs), is
    /// not from the future, and fits.
    fn check(
        &self,
        into: &HashMap<Vec<u8>, Kept>,
        key: &[u8],
        value: &[u8],
        at: (u64, &NodeSet),
        most: usize,
    ) -> Result<Summary, Refusal> {
        let (now_ms, members) = at;
        let s = Summary::decode(value).map_err(|e| Refusal::Decode(e.to_string()))?;
        let exact = key.strip_prefix(self.prefix.as_slice()) == Some(s.observer().as_bytes());
        if !exact {
            return Err(Refusal::Key {
                observer: s.observer().to_owned(),
                expected: format!("{}{}", String::from_utf8_lossy(&self.prefix), s.observer()),
            });
        }
        if !members.contains(s.observer()) {
            return Err(Refusal::NotANode(s.observer().to_owned()));
        }
        if s.peers().len() > most {
            return Err(Refusal::TooManyPeers {
                peers: s.peers().len(),
                most,
            });
        }
        let ahead_ms = s.at_ms().saturating_sub(now_ms);
        if ahead_ms > self.future_ms {
            return Err(Refusal::Future {
                ahead_ms,
                limit_ms: self.future_ms,
            });
        }
        if into.len() >= self.cap && !into.contains_key(key) {
            return Err(Refusal::Full { cap: self.cap });
        }
        Ok(s)
    }

    /// Takes a summary into `into`: the held ones, or a listing's.
    fn put(
        &mut self,
        into: &mut HashMap<Vec<u8>, Kept>,
        key: Vec<u8>,
        value: &[u8],
        at: (u64, &NodeSet),
    ) {
        let most = self.peer_bound(at.1);
        match self.check(into, &key, value, at, most) {
            Ok(s) => {
                let (s, unknown) = s.interned(&mut self.names, |name| at.1.contains(name));
                self.unknown_peers += unknown;
                if unknown > 0 && unknown >= self.unknown_most.1 {
                    self.unknown_most = (s.observer().to_owned(), unknown);
                }
                into.insert(key, Kept::new(s));
                if self.names.len() > self.names_pruned.saturating_mul(2).max(NAMES_PRUNED_PAST) {
                    self.prune_names(at.1);
                }
            }
            Err(e) => {
                into.remove(&key);
                self.refused += 1;
                self.first_refusal.get_or_insert_with(|| {
                    format!(
                        "{:?}: {e}",
                        crate::membership::record::clip(&String::from_utf8_lossy(&key), KEY_SHOWN)
                    )
                });
            }
        }
    }

    /// Takes `event` in at `now_ms`, `members` being the node set.
    fn apply(&mut self, event: WatchEvent, now_ms: u64, members: &NodeSet) {
        let at = (now_ms, members);
        match event {
            WatchEvent::Snapshot {
                entries,
                first,
                last,
                ..
            } => {
                let Some(mut listing) = self.listing.page(first, HashMap::new) else {
                    return;
                };
                for e in entries {
                    self.put(&mut listing, e.key, &e.value, at);
                }
                if let Some(whole) = self.listing.after_page(listing, last) {
                    self.by_key = whole;
                    self.loaded = true;
                }
            }
            WatchEvent::Put(e) => {
                let mut held = std::mem::take(&mut self.by_key);
                self.put(&mut held, e.key, &e.value, at);
                self.by_key = held;
            }
            WatchEvent::Delete { key, .. } => {
                self.by_key.remove(&key);
            }
            WatchEvent::Lost { error } => {
                self.listing.abandon();
                debug!("cluster view: summaries watch lost: {}", chain(&*error));
            }
        }
    }

    /// Lets go of the summaries of observers no longer in `members`.
    fn prune(&mut self, members: &NodeSet) {
        self.by_key
            .retain(|_, k| members.contains(k.summary.observer()));
        self.prune_names(members);
    }

    /// Lets go of the names no summary held names any more, and of those
    /// of nodes no longer in `members`.
    fn prune_names(&mut self, members: &NodeSet) {
        self.names.prune(|name| members.contains(name));
        self.names_pruned = self.names.len();
    }

    /// One warning for every summary refused since the last one.
    fn report_refused(&mut self) {
        // Taken outside the macro, whose arguments are evaluated only
        // when the warning is logged.
        let first = self.first_refusal.take().unwrap_or_default();
        if self.refused > 0 {
            warn!(
                refused = self.refused,
                "cluster view: summaries refused and left out (first: {first})"
            );
            self.refused = 0;
        }
        let (observer, most) = std::mem::take(&mut self.unknown_most);
        if most > UNKNOWN_PEERS_SAID {
            warn!(
                observations = self.unknown_peers,
                "cluster view: observations of nodes not in the node set left out ({observer:?} named {most} in one summary)"
            );
        } else if self.unknown_peers > 0 {
            debug!(
                observations = self.unknown_peers,
                "cluster view: observations of nodes not in the node set left out (most in one summary: {most}, by {observer:?})"
            );
        }
        self.unknown_peers = 0;
    }
}

/// Tells the campaign that its leadership is gone, found by a refused
/// write: only while the role still is that leadership (a write for an
/// earlier one, refused after the campaign was elected again, is no news
/// of the new one).
struct Deposal<'a> {
    notify: &'a Notify,
    role: &'a watch::Receiver<Role>,
}

impl Deposal<'_> {
    fn tell(&self, lost: &Leadership) {
        if matches!(&*self.role.borrow(), Role::Leader(now) if now == lost) {
            self.notify.notify_one();
        }
    }
}

/// How far ahead of the local clock a summary may be: 2 × the
/// publisher's tick + [`FUTURE_SLACK`], in ms.
fn future_limit_ms(interval: Duration) -> u64 {
    u64::try_from((interval * 2 + FUTURE_SLACK).as_millis()).unwrap_or(u64::MAX)
}

/// The rounds the prober in service publishes, followed across reloads:
/// a round between ticks (liveness echoes found news) is summarised at
/// once, not a tick later.
struct Rounds {
    probers: watch::Receiver<Arc<Prober>>,
    /// Whether a reload can still replace the prober.
    replaceable: bool,
    prober: Arc<Prober>,
    published: watch::Receiver<u64>,
    /// The round last handed out (0: none).
    last: u64,
}

impl Rounds {
    fn new(probers: &watch::Receiver<Arc<Prober>>) -> Self {
        let mut probers = probers.clone();
        let prober = probers.borrow_and_update().clone();
        let published = prober.published_rounds();
        let last = *published.borrow();
        Self {
            probers,
            replaceable: true,
            prober,
            published,
            last,
        }
    }

    /// The prober in service once it has published a round other than the
    /// one handed out last: one published while the view was busy
    /// elsewhere counts. A reload while this waits is followed at once,
    /// and a round its prober published before this saw it counts too.
    async fn next(&mut self) -> Arc<Prober> {
        loop {
            tokio::select! {
                biased;
                // A reload first: a round of the prober it retired is not
                // handed out.
                replaced = self.probers.changed(), if self.replaceable => {
                    if replaced.is_err() {
                        self.replaceable = false;
                    } else {
                        let prober = self.probers.borrow_and_update().clone();
                        self.follow(prober);
                    }
                }
                changed = self.published.changed() => {
                    if changed.is_err() {
                        // The sender is the prober's, held here: never.
                        std::future::pending::<()>().await;
                    }
                    self.last = *self.published.borrow_and_update();
                    return Arc::clone(&self.prober);
                }
            }
        }
    }

    /// Follows `prober` from now on; its newest round counts when it is not
    /// the one handed out last.
    fn follow(&mut self, prober: Arc<Prober>) {
        self.published = prober.published_rounds();
        self.prober = prober;
        if *self.published.borrow() != self.last {
            self.published.mark_changed();
        }
    }
}

/// A tick every `interval`; a tick missed (the view busy) is not made
/// up with a burst.
fn ticker(interval: Duration) -> tokio::time::Interval {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick
}

/// The publisher's tick: the liveness interval while liveness echoes go
/// (a node that stops is then summarised and assembled within seconds),
/// else the probe interval.
fn cadence(prober: &Prober) -> Duration {
    prober
        .liveness_interval(prober.nodes().len())
        .unwrap_or(prober.config().interval)
}

impl ClusterViewTask {
    /// What this agent holds in `role`: as the leader, the summaries
    /// watched from when its node set is read.
    fn take_role(&self, role: Role, interval: Duration, stale_ticks: u64) -> Option<Leading> {
        let Role::Leader(leadership) = role else {
            return None;
        };
        info!(view = %format!("{}{}", self.view_prefix, self.local), "cluster view: this agent assembles and publishes the view");
        let mut lead = Leading::new(
            leadership,
            Held::new(&self.prefix, interval, MAX_SUMMARIES).with_peers(self.peers),
            stale_ticks,
        );
        self.follow_summaries(&mut lead);
        Some(lead)
    }

    /// The node set changed to `set`: a view waiting for it may count
    /// (shown at once), and a leader may start reading the summaries.
    fn members_changed(
        &self,
        set: NodeSet,
        reader: &mut ViewReader,
        shown: (&Checker, Option<&matrix::ClusterMatrix>),
        leading: Option<&mut Leading>,
    ) {
        if reader.set_members(set) {
            self.show(reader, shown.0, shown.1);
        }
        if let Some(lead) = leading {
            self.follow_summaries(lead);
        }
    }

    /// Starts the leader's watch of the summaries once the node set is
    /// read: at a cold start an agent may be elected before it is, and
    /// would refuse every summary of its first listing.
    fn follow_summaries(&self, lead: &mut Leading) {
        if lead.events.is_none() && !self.nodes.current().is_empty() {
            lead.events = Some(self.store.watch_prefix(self.prefix.clone().into_bytes()));
        }
    }

    /// Campaigns for the assembler's role until `stop`, on a task of its
    /// own: the election lease's keep-alive must go on while [`Self::run`]
    /// assembles a view or waits for a write (seconds at 50,000 nodes,
    /// past the lease's TTL).
    fn campaign(
        &self,
        role: watch::Sender<Role>,
        deposed: &Arc<Notify>,
        stop: &CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let (store, election, local) = (
            self.store.clone(),
            self.election.clone(),
            self.local.clone(),
        );
        let (deposed, stop) = (deposed.clone(), stop.clone());
        tokio::spawn(async move {
            store
                .campaign(
                    election.as_bytes(),
                    local.as_bytes(),
                    ELECTION_TTL,
                    &role,
                    &deposed,
                    &stop,
                )
                .await;
        })
    }

    pub(super) async fn run(self, shutdown: CancellationToken) {
        let (role_tx, mut role) = watch::channel(Role::Candidate);
        let deposed = Arc::new(Notify::new());
        let stop = shutdown.child_token();
        let mut campaign = self.campaign(role_tx, &deposed, &stop);
        let mut campaigning = true;
        // However this task ends, a panic included: the campaign resigns
        // rather than lead on alone (a restarted task campaigns anew).
        let _resign = stop.clone().drop_guard();
        let mut view_events = self
            .store
            .watch_prefix(self.view_prefix.clone().into_bytes());
        let mut members = self.nodes.subscribe();
        let mut interval = cadence(&self.prober.borrow());
        let mut reader = ViewReader::new(self.view_prefix.clone(), self.local.clone(), interval);
        let mut inbox = ViewInbox::default();
        let mut checker = Checker::default();
        let mut writes = SummaryWrites::default();
        let mut leading: Option<Leading> = None;
        let mut matrix: Option<matrix::ClusterMatrix> = None;
        let mut published_seq = 0;
        let mut rounds = Rounds::new(&self.prober);
        // The tick at which this agent last held a current view.
        let (mut ticks, mut last_current): (u64, u64) = (0, 0);
        let mut assignments = Assignments::default();
        let mut tick = ticker(interval);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => break,
                _ = &mut campaign => {
                    campaigning = false;
                    break;
                }
                changed = role.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    leading = self.take_role(role.borrow_and_update().clone(), interval, ticks - last_current);
                    if leading.is_none() {
                        matrix = None;
                    }
                }
                changed = members.changed() => {
                    if changed.is_err() {
                        break;
                    }
                    let set = members.borrow_and_update().clone();
                    self.members_changed(set, &mut reader, (&checker, matrix.as_ref()), leading.as_mut());
                }
                event = view_events.recv() => match event {
                    Some(e) => self.view_events(inbox.take(e, clock()), &mut reader, &checker, matrix.as_ref()),
                    None => break,
                },
                () = tokio::time::sleep_until(wake_at(&inbox)), if inbox.due().is_some() => self.view_events(inbox.release(clock()), &mut reader, &checker, matrix.as_ref()),
                event = async { leading.as_mut()?.events.as_mut()?.recv().await }, if leading.as_ref().is_some_and(|l| l.events.is_some()) => {
                    let Some(lead) = leading.as_mut() else { continue };
                    match event {
                        Some(e) => lead.held.apply(e, crate::util::timefmt::now_ms(), &self.nodes.current()),
                        None => break,
                    }
                    // Newly elected: publish as soon as the summaries and
                    // the node set are read.
                    if lead.held.loaded && !lead.published && !self.nodes.current().is_empty() {
                        matrix = self.lead(lead, &mut assignments, interval, &mut reader, &Deposal { notify: &deposed, role: &role }, published_seq).await;
                        self.show(&mut reader, &checker, matrix.as_ref());
                    }
                }
                prober = rounds.next() => {
                    published_seq = self.publish(&prober, ticks, &mut checker, &mut writes).await;
                }
                _ = tick.tick() => {
                    ticks += 1;
                    let prober = self.prober.borrow().clone();
                    if cadence(&prober) != interval {
                        interval = cadence(&prober);
                        tick = ticker(interval);
                        reader.set_cadence(interval);
                        if let Some(lead) = leading.as_mut() {
                            lead.held.future_ms = future_limit_ms(interval);
                        }
                    }
                    published_seq = self.publish(&prober, ticks, &mut checker, &mut writes).await;
                    if let Some(lead) = leading.as_mut() {
                        lead.held.report_refused();
                        let deposal = Deposal { notify: &deposed, role: &role };
                        let mut out = false;
                        if lead.held.loaded && !self.nodes.current().is_empty() {
                            matrix = self.lead(lead, &mut assignments, interval, &mut reader, &deposal, published_seq).await;
                            out = matrix.is_some();
                        }
                        lead.tick(out, !self.nodes.current().is_empty(), &deposal);
                    }
                    if reader.holds_current(crate::util::timefmt::now_ms()) {
                        last_current = ticks;
                    }
                    reader.report_refused(inbox.to_say(clock()), inbox.skipped());
                    self.show(&mut reader, &checker, matrix.as_ref());
                }
            }
        }
        // However the loop ended: the campaign resigns (it watches the same
        // token) and ends before this task does, never leading on alone.
        stop.cancel();
        if campaigning {
            let _ = campaign.await;
        }
    }

    /// Applies changes of the views' keys (none: they are held, see
    /// [`ViewInbox`]) and shows the result.
    fn view_events(
        &self,
        events: Vec<WatchEvent>,
        reader: &mut ViewReader,
        checker: &Checker,
        matrix: Option<&matrix::ClusterMatrix>,
    ) {
        if events.is_empty() {
            return;
        }
        reader.set_members(self.nodes.current());
        for event in events {
            reader.apply(event, crate::util::timefmt::now_ms());
        }
        self.show(reader, checker, matrix);
    }

    /// The view read (or published) last, to the API: its staleness as of
    /// now.
    fn show(
        &self,
        reader: &mut ViewReader,
        checker: &Checker,
        matrix: Option<&matrix::ClusterMatrix>,
    ) {
        reader.check_contradictions(checker);
        let Some(reply) = reader.reply(crate::util::timefmt::now_ms()) else {
            return;
        };
        let matrix = matrix.filter(|_| reply.assembly.as_ref().is_some_and(|a| a.here));
        self.cell.publish(reply, matrix);
    }

    /// One round of the leader: assembles the view, publishes it if still
    /// the leader; returns the matrix of what it assembled.
    async fn lead(
        &self,
        lead: &mut Leading,
        assignments: &mut Assignments,
        interval: Duration,
        reader: &mut ViewReader,
        deposed: &Deposal<'_>,
        round: u64,
    ) -> Option<matrix::ClusterMatrix> {
        lead.held.prune(&self.nodes.current());
        // Seconds of CPU once a leader is elected at 50,000 nodes: the
        // runtime's other tasks move to its other workers meanwhile.
        let (view, matrix) = blocking(|| self.assemble(&lead.held, assignments, interval));
        let now_ms = crate::util::timefmt::now_ms();
        let published = PublishedView::of(&self.local, round, now_ms, millis(interval), &view);
        lead.published = true;
        let key = format!("{}{}", self.view_prefix, self.local);
        match self
            .store
            .put_if_leader(&lead.leadership, key.clone(), published.encode())
            .await
        {
            Ok(()) => {
                reader.published(key, published);
                lead.published_now();
                Some(matrix)
            }
            Err(LeaderPutError::Deposed { key }) => {
                warn!(
                    "cluster view: not published: the election key {key:?} is gone; campaigning again"
                );
                deposed.tell(&lead.leadership);
                None
            }
            Err(LeaderPutError::Kv(e)) => {
                warn!("cluster view: publishing at {key:?}: {}", chain(&e));
                None
            }
        }
    }

    /// Writes the summary of the prober's last round, as of its newest
    /// evidence, if `writes` says it is due at tick `tick`; returns the
    /// last round summarised (0 before the first). The summary is also
    /// this agent's own observations, for the contradiction check.
    async fn publish(
        &self,
        prober: &Prober,
        tick: u64,
        checker: &mut Checker,
        writes: &mut SummaryWrites,
    ) -> u64 {
        let status = prober.status();
        let Some(seq) = status.round.as_ref().map(|r| r.seq) else {
            return 0;
        };
        let summary = match Summary::from_status(&status) {
            Ok(s) => s
                .confirmed_at(prober.evidence_ms())
                .with_cadence(cadence(prober)),
            Err(e) => {
                warn!("cluster view: summarising round {seq}: {e}");
                return seq;
            }
        };
        checker.observe(&summary);
        let why = writes.decide(&summary, tick);
        if !why.writes() {
            return seq;
        }
        let key = summary_key(&self.prefix, &self.local);
        if let Err(e) = self.store.put_leased(key, summary.encode()).await {
            writes.failed();
            warn!("cluster view: publishing round {seq}: {}", chain(&e));
        } else {
            debug!(round = seq, ?why, "cluster view: summary written");
        }
        seq
    }

    fn assemble(
        &self,
        held: &Held,
        assignments: &mut Assignments,
        interval: Duration,
    ) -> (view::ClusterView, matrix::ClusterMatrix) {
        let now_ms = crate::util::timefmt::now_ms();
        let stale = u64::try_from((interval * STALE_ROUNDS).as_millis()).unwrap_or(u64::MAX);
        let params = ViewParams {
            oldest_ms: now_ms.saturating_sub(stale),
            now_ms,
            ..ViewParams::default()
        };
        let nodes = self.nodes.current();
        assignments.update(&nodes, self.peers);
        assignments.select_all(held.by_key.values().map(|k| k.summary.observer()));
        let (mut left_out, mut first) = (0, None);
        let summaries: Vec<Cow<'_, Summary>> = held
            .by_key
            .values()
            .map(|k| match assignments.restrict(&k.summary, k.version) {
                Some((restricted, n)) => {
                    left_out += n;
                    first.get_or_insert_with(|| k.summary.observer().to_owned());
                    Cow::Owned(restricted)
                }
                None => Cow::Borrowed(&k.summary),
            })
            .collect();
        if let Some(first) = first {
            warn!(
                observations = left_out,
                "cluster view: observations of nodes their observer is not assigned were left out (first observer: {first:?})"
            );
        }
        let view = view::assemble(&nodes, summaries.iter().map(AsRef::as_ref), &params);
        let matrix = matrix::matrix(
            &nodes,
            summaries.iter().map(AsRef::as_ref),
            (params.oldest_ms, params.now_ms),
        );
        (view, matrix)
    }
}

/// Now, on the runtime's clock (which tests may pause).
fn clock() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// When the view changes `inbox` holds are due (an hour on when none is
/// held: the branch waiting for it is off then).
fn wake_at(inbox: &ViewInbox) -> tokio::time::Instant {
    inbox.due().map_or_else(
        || tokio::time::Instant::now() + Duration::from_secs(3600),
        tokio::time::Instant::from_std,
    )
}

/// Runs `work`, long and synchronous, telling a multi-threaded runtime
/// to move its other tasks off this worker first.
fn blocking<T>(work: impl FnOnce() -> T) -> T {
    let multi = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if multi {
        tokio::task::block_in_place(work)
    } else {
        work()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::membership::kvstore::Entry;

    /// The node set of the tests' observers.
    fn members() -> NodeSet {
        NodeSet::named(&["a", "b", "c", "d", "e", "w", "x", "y", "z"])
    }

    fn summary(observer: &str, at_ms: u64) -> Vec<u8> {
        Summary::new(observer.into(), 1, at_ms, Vec::new())
            .expect("summary")
            .encode()
    }

    /// `observer`'s summary at `at_ms` reporting on `peers`, every path
    /// reached.
    fn reporting(observer: &str, at_ms: u64, peers: impl Iterator<Item = String>) -> Vec<u8> {
        use crate::{
            cluster::summary::{PathSample, PeerSummary},
            probe::path::ProbeResult,
        };
        let ok = PathSample::new(ProbeResult::Success, Some(50));
        let peers = peers.map(|name| PeerSummary::new(name, [ok; 4])).collect();
        Summary::new(observer.into(), 1, at_ms, peers)
            .expect("summary")
            .encode()
    }

    fn put(key: &str, value: Vec<u8>) -> WatchEvent {
        WatchEvent::Put(Entry {
            key: key.as_bytes().to_vec(),
            value,
            mod_revision: 1,
            lease: 0,
        })
    }

    #[test]
    fn summaries_count_only_at_their_observers_key_and_not_from_the_future() {
        let now = 1_000_000;
        let mut held = Held::new("/h/s/", Duration::from_secs(10), 3);
        assert_eq!(held.future_ms, 25_000);
        held.apply(put("/h/s/a", summary("a", now)), now, &members());
        held.apply(put("/h/s/x/b", summary("b", now)), now, &members());
        held.apply(put("/h/s/c", summary("a", now)), now, &members());
        assert_eq!(held.by_key.len(), 1);
        assert_eq!(held.refused, 2);
        assert_eq!(
            held.first_refusal.as_deref(),
            Some(
                "\"/h/s/x/b\": a summary counts only at exactly <prefix><observer>: \"b\" belongs at \"/h/s/b\""
            )
        );
        // Within the limit ahead of the clock, and past it.
        held.apply(put("/h/s/d", summary("d", now + 25_000)), now, &members());
        held.apply(put("/h/s/e", summary("e", now + 25_001)), now, &members());
        assert!(held.by_key.contains_key(&b"/h/s/d"[..]));
        assert!(!held.by_key.contains_key(&b"/h/s/e"[..]));
        held.report_refused();
        held.apply(put("/h/s/e", summary("e", now + 25_001)), now, &members());
        assert_eq!(
            held.first_refusal.as_deref(),
            Some("\"/h/s/e\": its time is 25001 ms ahead of this node's clock (at most 25000 ms)")
        );
        // An agent's summary that went to the future is dropped, not kept
        // at its old value.
        held.apply(put("/h/s/a", summary("a", now + 60_000)), now, &members());
        assert!(!held.by_key.contains_key(&b"/h/s/a"[..]));
    }

    fn page(keys: &[&str], first: bool, last: bool, now: u64) -> WatchEvent {
        WatchEvent::Snapshot {
            revision: 3,
            entries: keys
                .iter()
                .map(|k| Entry {
                    key: format!("/h/s/{k}").into_bytes(),
                    value: summary(k, now),
                    mod_revision: 3,
                    lease: 0,
                })
                .collect(),
            first,
            last,
        }
    }

    /// A listing's pages replace the summaries together at the last one:
    /// until then the leader works from the ones held, and only a whole
    /// listing makes it lead.
    #[test]
    fn a_listing_in_pages_replaces_the_summaries_at_its_last_page() {
        let now = 1_000_000;
        let mut held = Held::new("/h/s/", Duration::from_secs(10), 3);
        held.apply(page(&["a", "b"], true, false, now), now, &members());
        assert!(!held.loaded && held.by_key.is_empty(), "not whole yet");
        held.apply(page(&["c"], false, true, now), now, &members());
        assert!(held.loaded);
        assert_eq!(held.by_key.len(), 3);
        held.apply(page(&["x", "y"], true, false, now), now, &members());
        assert!(
            held.by_key.contains_key(&b"/h/s/a"[..]),
            "the old ones meanwhile"
        );
        held.apply(page(&["z", "w"], false, true, now), now, &members());
        let mut keys: Vec<_> = held.by_key.keys().cloned().collect();
        keys.sort();
        assert_eq!(
            keys,
            [&b"/h/s/x"[..], b"/h/s/y", b"/h/s/z"],
            "bounded across pages"
        );
        assert_eq!(held.refused, 1);
    }

    #[test]
    fn the_summaries_held_are_bounded_and_the_excess_reported() {
        let now = 1_000_000;
        let mut held = Held::new("/h/s/", Duration::from_secs(10), 2);
        for name in ["a", "b", "c", "d"] {
            held.apply(
                put(&format!("/h/s/{name}"), summary(name, now)),
                now,
                &members(),
            );
        }
        assert_eq!(held.by_key.len(), 2);
        assert_eq!(held.refused, 2);
        assert!(
            held.first_refusal
                .as_deref()
                .is_some_and(|r| r.ends_with(": 2 summaries are held already")),
            "{:?}",
            held.first_refusal
        );
        // A key already held is still updated when full.
        held.apply(put("/h/s/a", summary("a", now + 1)), now, &members());
        assert_eq!(
            held.by_key.get(&b"/h/s/a"[..]).map(|k| k.summary.at_ms()),
            Some(now + 1)
        );
    }

    /// Keys of no node, however many and however early, take no place a
    /// node's summary needs; a node that leaves the set has its summary
    /// let go.
    #[test]
    fn summaries_of_observers_outside_the_node_set_are_refused_and_let_go() {
        let now = 1_000_000;
        let mut held = Held::new("/h/s/", Duration::from_secs(10), 2);
        for junk in ["!0001", "!0002", "!0003"] {
            held.apply(
                put(&format!("/h/s/{junk}"), summary(junk, now)),
                now,
                &members(),
            );
        }
        assert!(held.by_key.is_empty());
        assert_eq!(held.refused, 3);
        assert_eq!(
            held.first_refusal.as_deref(),
            Some("\"/h/s/!0001\": its observer \"!0001\" is not in the node set")
        );
        for name in ["a", "b"] {
            held.apply(
                put(&format!("/h/s/{name}"), summary(name, now)),
                now,
                &members(),
            );
        }
        assert_eq!(held.by_key.len(), 2, "the nodes' summaries, every one");
        held.prune(&NodeSet::named(&["b"]));
        let keys: Vec<&[u8]> = held.by_key.keys().map(Vec::as_slice).collect();
        assert_eq!(keys, [&b"/h/s/b"[..]]);
        // A refused key is shown cut short.
        let long = "y".repeat(2_000);
        held.report_refused();
        held.apply(
            put(&format!("/h/s/{long}"), summary("y", now)),
            now,
            &members(),
        );
        assert!(
            held.first_refusal.as_ref().is_some_and(|r| r.len() < 1_200),
            "{:?}",
            held.first_refusal.as_ref().map(String::len)
        );
    }

    /// The summaries held share their peers' names, one copy each however
    /// many observers name a node (at 50,000 nodes each of the leader's
    /// 50,000 summaries names about 50 of the same nodes), and a name goes
    /// with the last summary that names it.
    #[test]
    fn summaries_held_share_their_peers_names() {
        let now = 1_000_000;
        let members = NodeSet::numbered(20);
        let of =
            |observer: &str| reporting(observer, now, (2..=10).map(|i| format!("node-{i:04}")));
        let mut held = Held::new("/h/s/", Duration::from_secs(10), 8);
        held.apply(put("/h/s/node-0000", of("node-0000")), now, &members);
        held.apply(put("/h/s/node-0001", of("node-0001")), now, &members);
        let peers = |key: &[u8]| held.by_key[key].summary.peers().to_vec();
        let (a, b) = (peers(b"/h/s/node-0000"), peers(b"/h/s/node-0001"));
        assert_eq!(a.len(), 9);
        for (x, y) in a.iter().zip(&b) {
            assert!(
                crate::cluster::summary::PeerName::same_copy(&x.name, &y.name),
                "{} held twice",
                x.name
            );
        }
        drop((a, b));
        assert_eq!(held.names.len(), 9);
        // node-0001 leaves the set: its summary goes, the names stay with
        // node-0000's. node-0005 leaves too: its name is let go though
        // node-0000's summary names it, and a summary naming it is asked
        // about it anew.
        let without = |gone: &[&str]| {
            let left = members.iter().filter(|n| !gone.contains(&n.name.as_str()));
            NodeSet::new(left.cloned().collect()).expect("a set")
        };
        held.prune(&without(&["node-0001"]));
        assert_eq!((held.by_key.len(), held.names.len()), (1, 9));
        let smaller = without(&["node-0001", "node-0005"]);
        held.prune(&smaller);
        assert_eq!((held.by_key.len(), held.names.len()), (1, 8));
        held.apply(put("/h/s/node-0002", of("node-0002")), now, &smaller);
        let kept = held.by_key[&b"/h/s/node-0002"[..]].summary.peers().len();
        assert_eq!((kept, held.names.len(), held.unknown_peers), (8, 8, 1));
        held.apply(
            WatchEvent::Delete {
                key: b"/h/s/node-0002".to_vec(),
                revision: 2,
            },
            now,
            &members,
        );
        held.unknown_peers = 0;
        held.apply(
            WatchEvent::Delete {
                key: b"/h/s/node-0000".to_vec(),
                revision: 2,
            },
            now,
            &members,
        );
        held.prune(&members);
        assert!(held.by_key.is_empty() && held.names.is_empty());
        // A summary rewritten over and over with other peers between the
        // leader's rounds: the names it no longer holds are let go once
        // they pass the bound, not kept until the next round.
        let members = NodeSet::numbered(20_001);
        let renaming = |round: usize| {
            reporting(
                "node-0000",
                now,
                (1..=100).map(|i| format!("node-{:04}", round * 100 + i)),
            )
        };
        for round in 0..200 {
            held.apply(put("/h/s/node-0000", renaming(round)), now, &members);
            assert!(
                held.names.len() <= NAMES_PRUNED_PAST + 100,
                "{}",
                held.names.len()
            );
        }
        assert!(held.names.len() >= 100, "the held summary's");
        assert_eq!(held.unknown_peers, 0);
    }

    /// A summary's observations of names not in the node set are left
    /// out when it is taken in: a writer of every summary key who makes
    /// up long names makes the leader hold none of them, and a node the
    /// leader comes to know later is reported again by its observer's
    /// next write.
    #[test]
    fn names_not_in_the_node_set_are_not_held() {
        let now = 1_000_000;
        let members = NodeSet::numbered(50);
        let mut held = Held::new("/h/s/", Duration::from_secs(10), 64);
        let made_up = |observer: usize| {
            let known = (1..=3).map(|i| format!("node-{i:04}"));
            let long = (0..40).map(move |i| format!("{}-{observer}-{i:02}", "x".repeat(200)));
            reporting(&format!("node-{observer:04}"), now, known.chain(long))
        };
        for observer in 0..50 {
            held.apply(
                put(&format!("/h/s/node-{observer:04}"), made_up(observer)),
                now,
                &members,
            );
        }
        assert_eq!(held.by_key.len(), 50, "the summaries are taken");
        assert_eq!(held.refused, 0);
        assert_eq!(held.names.len(), 3, "only the nodes' names are held");
        assert_eq!(held.unknown_peers, 50 * 40);
        assert_eq!(held.unknown_most, ("node-0049".to_owned(), 40));
        for k in held.by_key.values() {
            let names: Vec<&str> = k.summary.peers().iter().map(|p| &*p.name).collect();
            assert_eq!(names, ["node-0001", "node-0002", "node-0003"]);
        }
        held.report_refused();
        assert_eq!(held.unknown_peers, 0, "counted until reported");
        assert_eq!(held.unknown_most.1, 0);
        // node-0050 joins: the observer's next write reports it.
        let joined = NodeSet::numbered(51);
        let with_new = reporting("node-0000", now + 1, ["node-0050".to_owned()].into_iter());
        held.apply(put("/h/s/node-0000", with_new.clone()), now, &members);
        let peers = |held: &Held| held.by_key[&b"/h/s/node-0000"[..]].summary.peers().len();
        assert_eq!(peers(&held), 0, "not in this node set yet");
        held.apply(put("/h/s/node-0000", with_new), now, &joined);
        assert_eq!(peers(&held), 1);
    }

    /// A summary reporting on more peers than an observer can be assigned
    /// is refused: summaries are held whole until the view is assembled,
    /// so a writer of every node's summary key could otherwise make the
    /// leader hold thousands of peers for each node.
    #[test]
    fn a_summary_past_what_an_observer_is_assigned_is_refused() {
        use crate::membership::Node;
        let now = 1_000_000;
        // 200 nodes, 30 of them in zone "z1": K = 32 by default above 64
        // nodes, so 2 × (32 + 30 + 1) + 64 = 190 peers at most.
        let nodes: Vec<Node> = NodeSet::numbered(200)
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let mut n = n.clone();
                n.zone = (i < 30).then(|| "z1".to_owned());
                n
            })
            .collect();
        let members = NodeSet::new(nodes).expect("a set");
        assert_eq!(peer_bound(&members, None), 190);
        assert_eq!(peer_bound(&members, Some(ProbePeers::Count(100))), 326);
        assert_eq!(peer_bound(&members, Some(ProbePeers::All)), 464);
        assert_eq!(peer_bound(&NodeSet::numbered(40), None), 144, "a full mesh");
        let of_peers = |peers: usize| {
            reporting(
                "node-0000",
                now,
                (1..=peers).map(|i| format!("node-{i:04}")),
            )
        };
        let mut held = Held::new("/h/s/", Duration::from_secs(10), 8);
        held.apply(put("/h/s/node-0000", of_peers(190)), now, &members);
        assert!(held.by_key.contains_key(&b"/h/s/node-0000"[..]));
        held.apply(put("/h/s/node-0000", of_peers(191)), now, &members);
        assert!(!held.by_key.contains_key(&b"/h/s/node-0000"[..]));
        assert_eq!(
            held.first_refusal.as_deref(),
            Some(
                "\"/h/s/node-0000\": it reports on 191 peers, more than the 190 taken: twice what an observer can be assigned in this node set (every node in a full mesh, else the largest zone and --probe-peers), and 64"
            )
        );
        // Bounded by this agent's --probe-peers: a full mesh, reported by
        // an observer whose set holds nodes this agent's does not.
        let mut held =
            Held::new("/h/s/", Duration::from_secs(10), 8).with_peers(Some(ProbePeers::All));
        held.apply(put("/h/s/node-0000", of_peers(464)), now, &members);
        assert!(held.by_key.contains_key(&b"/h/s/node-0000"[..]));
        held.apply(put("/h/s/node-0000", of_peers(465)), now, &members);
        assert!(!held.by_key.contains_key(&b"/h/s/node-0000"[..]));
    }

    #[test]
    fn summaries_sit_beside_the_node_records() {
        assert_eq!(summaries_prefix("/health/nodes/"), "/health/summaries/");
        assert_eq!(summaries_prefix("/health/nodes"), "/health/summaries/");
        assert_eq!(summaries_prefix("/a/b/c/"), "/a/b/summaries/");
        assert_eq!(summaries_prefix("nodes"), "nodes-summaries/");
    }

    fn round(seq: u64) -> crate::probe::status::RoundInfo {
        crate::probe::status::RoundInfo {
            seq,
            started_ms: seq * 1000,
            duration_ms: 10,
            probes: 4,
        }
    }

    /// Whether `next` yields a prober within 100 ms, and which.
    async fn within<F: Future<Output = Arc<Prober>>>(
        next: std::pin::Pin<&mut F>,
    ) -> Option<Arc<Prober>> {
        tokio::time::timeout(Duration::from_millis(100), next)
            .await
            .ok()
    }

    #[tokio::test]
    async fn rounds_are_followed_once_each_and_across_reloads() {
        use crate::{membership::NodeSet, probe::ProbeConfig};

        let first = Prober::new(ProbeConfig::default());
        first.set_nodes(NodeSet::named(&["a", "b"]));
        let (probers_tx, probers) = watch::channel(Arc::clone(&first));
        let mut rounds = Rounds::new(&probers);
        assert!(within(std::pin::pin!(rounds.next())).await.is_none());

        // A round published while nothing waited counts, once; a node-set
        // change is not a round.
        first.publish(Some(round(1)), false);
        let got = within(std::pin::pin!(rounds.next()))
            .await
            .expect("round 1");
        assert!(Arc::ptr_eq(&got, &first));
        first.set_nodes(NodeSet::named(&["a", "b", "c"]));
        assert!(within(std::pin::pin!(rounds.next())).await.is_none());

        // A reload while waiting: the old prober's rounds no longer count,
        // the new one's do. Taking over, it publishes the round already
        // handed out, which is not a new one.
        let second = Prober::new(ProbeConfig::default());
        {
            let mut waiting = std::pin::pin!(rounds.next());
            assert!(within(waiting.as_mut()).await.is_none());
            second.take_over(&first);
            probers_tx.send_replace(Arc::clone(&second));
            first.publish(Some(round(2)), false);
            assert!(within(waiting.as_mut()).await.is_none());
            second.publish(Some(round(2)), false);
            let got = within(waiting.as_mut())
                .await
                .expect("the new prober's round");
            assert!(Arc::ptr_eq(&got, &second));
        }

        // A reload whose prober published a round before the view looked:
        // that round counts.
        let third = Prober::new(ProbeConfig::default());
        third.take_over(&second);
        probers_tx.send_replace(Arc::clone(&third));
        third.publish(Some(round(3)), false);
        let got = within(std::pin::pin!(rounds.next()))
            .await
            .expect("round 3");
        assert!(Arc::ptr_eq(&got, &third));
        assert!(within(std::pin::pin!(rounds.next())).await.is_none());

        // Nothing left to reload it: its rounds go on counting.
        drop(probers_tx);
        assert!(within(std::pin::pin!(rounds.next())).await.is_none());
        third.publish(Some(round(4)), false);
        let got = within(std::pin::pin!(rounds.next()))
            .await
            .expect("round 4");
        assert!(Arc::ptr_eq(&got, &third));
    }
}
