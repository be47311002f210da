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
mod rereads;
use leading::Leading;
use rereads::{Due, Rereads};

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
    /// The summaries taken with a few observations of nodes not in the
    /// node set (nodes that joined, that the observer read before this
    /// agent did), and those refused because their observer was not in
    /// it: read again once the node set has one of them.
    rereads: Rereads,
    /// The node set changed while a listing was under way: the summaries
    /// are read again once it is whole.
    reread_due: bool,
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
            rereads: Rereads::default(),
            reread_due: false,
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
                let (s, missing) = s.interned(&mut self.names, |name| at.1.contains(name));
                let unknown = missing.len();
                self.unknown_peers += unknown;
                if unknown > 0 && unknown >= self.unknown_most.1 {
                    self.unknown_most = (s.observer().to_owned(), unknown);
                }
                self.rereads.keep(&key, value, missing);
                into.insert(key, Kept::new(s));
                if self.names.len() > self.names_pruned.saturating_mul(2).max(NAMES_PRUNED_PAST) {
                    self.prune_names(at.1);
                }
            }
            Err(e) => {
                into.remove(&key);
                if let Refusal::NotANode(observer) = &e {
                    self.rereads.keep_refused(&key, value, observer, at.0);
                } else {
                    self.rereads.forget(&key);
                }
                self.refused += 1;
                self.first_refusal.get_or_insert_with(|| {
                    format!(
                        "{:?}: {e}",
                        crate::util::text::clip(&String::from_utf8_lossy(&key), KEY_SHOWN)
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
                if first {
                    // The listing refuses them again if they still are.
                    self.rereads.retain(|_| true, false);
                }
                for e in entries {
                    self.put(&mut listing, e.key, &e.value, at);
                }
                if let Some(whole) = self.listing.after_page(listing, last) {
                    self.by_key = whole;
                    self.loaded = true;
                    self.keep_rereads_held(true);
                    if self.reread_due {
                        self.reread(at.0, at.1);
                    }
                }
            }
            WatchEvent::Put(e) => {
                let mut held = std::mem::take(&mut self.by_key);
                self.put(&mut held, e.key, &e.value, at);
                self.by_key = held;
            }
            WatchEvent::Delete { key, .. } => {
                self.rereads.forget(&key);
                self.by_key.remove(&key);
            }
            WatchEvent::Lost { error } => {
                self.listing.abandon();
                // The refused ones may be of the listing dropped: the next
                // one refuses them again if they still are.
                self.keep_rereads_held(false);
                if self.reread_due {
                    self.reread(at.0, at.1);
                }
                debug!("cluster view: summaries watch lost: {}", chain(&*error));
            }
        }
    }

    /// Keeps to be read again only the summaries held or in the listing
    /// under way (not those a listing left out or an abandoned listing
    /// took, nor those of observers that left), and the refused ones if
    /// `refused`.
    fn keep_rereads_held(&mut self, refused: bool) {
        let (by_key, listing) = (&self.by_key, self.listing.under_way());
        self.rereads.retain(
            |k| by_key.contains_key(k) || listing.is_some_and(|l| l.contains_key(k)),
            refused,
        );
    }

    /// Reads again, against `members`, the summaries held that named nodes
    /// the node set did not hold and now does, and those refused because
    /// their observer was not in it and now is: their observations count
    /// from now. Each is checked anew, as when it came; one that no longer
    /// passes (its observer left) stays as it was (held for the leader's
    /// round to let go, or left out), and is neither refused nor warned
    /// about twice. While a listing is under way, waits for it to be
    /// whole.
    fn reread(&mut self, now_ms: u64, members: &NodeSet) {
        if self.listing.under_way().is_some() {
            self.reread_due = true;
            return;
        }
        self.reread_due = false;
        let due = self.rereads.due(members);
        if due.is_empty() {
            return;
        }
        let most = self.peer_bound(members);
        if self.by_key.len() >= self.cap {
            // Departed observers' summaries, left for the leader's round,
            // would take the place of joining ones.
            self.by_key
                .retain(|_, k| members.contains(k.summary.observer()));
        }
        for Due { key, value, held } in due {
            if self.by_key.contains_key(&key) != held {
                continue;
            }
            let Ok(s) = self.check(&self.by_key, &key, &value, (now_ms, members), most) else {
                continue;
            };
            let (s, missing) = s.interned(&mut self.names, |name| members.contains(name));
            self.rereads.keep(&key, &value, missing);
            self.by_key.insert(key, Kept::new(s));
        }
    }

    /// Lets go of the summaries of observers no longer in `members`, and
    /// of those refused and kept too long by `now_ms`.
    fn prune(&mut self, members: &NodeSet, now_ms: u64) {
        self.by_key
            .retain(|_, k| members.contains(k.summary.observer()));
        self.keep_rereads_held(true);
        self.rereads.expire_refused(now_ms);
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
            lead.held
                .reread(crate::util::timefmt::now_ms(), &self.nodes.current());
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
        lead.held
            .prune(&self.nodes.current(), crate::util::timefmt::now_ms());
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
mod tests;
