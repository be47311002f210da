//! Node discovery through etcd (over [`super::kvstore`]): each agent puts
//! its record at `<prefix><name>` with its lease (kept alive by the
//! lease-keepalive stream), reads the prefix once and then follows it from
//! the watch stream's events, one record at a time. When etcd is
//! unreachable the last known set stays in use (probing goes on); when it
//! returns the prefix is read again and the watch resumes after it.

mod rewrites;

use crate::util::text::clip;
use std::{
    sync::{Arc, OnceLock},
    time::Duration,
};

use serde::{Deserialize, Serialize};
use tokio::{sync::mpsc, time::Instant};
use tracing::{debug, info, warn};

pub use super::kvstore::EtcdConfig;
use super::{
    Node,
    allocations::Allocations,
    claims::Holders,
    held::{Held, Limits},
    kvstore::{Entry, KvStore, Link, Listing, ReadAgain, WatchEvent},
    published::Nodes,
    record::{Candidate, LocalNode, Origin, Record, Validated},
    validate,
};
use rewrites::{Rewrites, Writer};

/// The agent's etcd client and lease, shared by everything that writes
/// with the lease (node discovery, the cluster view) and revoked at
/// shutdown.
#[derive(Debug, Clone, Default)]
pub struct Registration(Arc<OnceLock<KvStore>>);

impl Registration {
    /// The agent's [`KvStore`], made from `cfg` by the first caller; every
    /// later caller gets the same one (one connection, one lease).
    #[must_use]
    pub fn store(&self, cfg: &EtcdConfig) -> KvStore {
        self.0.get_or_init(|| KvStore::new(cfg)).clone()
    }

    /// The lease registered now, if any.
    #[must_use]
    pub fn current(&self) -> Option<i64> {
        self.0.get().and_then(KvStore::lease)
    }
}

/// Node `name`'s record's key under `prefix` (a directory, ending in `/`).
#[must_use]
pub fn record_key(prefix: &str, name: &str) -> String {
    format!("{prefix}{name}")
}

/// Keeps this agent registered and the node set in sync, forever.
pub async fn run(
    cfg: EtcdConfig,
    me: Node,
    local: LocalNode,
    nodes: Nodes,
    registration: Registration,
) {
    let store = registration.store(&cfg);
    let own = OwnRecord {
        key: record_key(&cfg.prefix, &me.name),
        node: me.clone(),
        value: match serde_json::to_vec(&NodeRecord::from(&me)) {
            Ok(v) => v,
            Err(e) => {
                warn!("encoding this node's record: {e}");
                return;
            }
        },
    };
    info!(key = own.key, "registering in etcd");
    own.write(&store).await;
    let followed = store.follow_prefix(cfg.prefix.as_bytes());
    let allocations = cfg.allocations.as_ref().map(|prefix| {
        info!(
            prefix,
            "peers' health addresses must lie in their nodes' allocations"
        );
        (
            store.follow_prefix(prefix.as_bytes()),
            Allocations::new(prefix.clone(), local.clone(), nodes.max_nodes()),
        )
    });
    // Boxed: the client's futures are large, and so would be the caller's.
    tokio::join!(
        Box::pin(store.run()),
        Box::pin(follow(
            &store,
            (followed, allocations),
            &cfg,
            &local,
            &nodes,
            &own
        ))
    );
}

/// This node's record: the only key under the prefix it writes, watched
/// and written back when someone changes or deletes it.
#[derive(Debug)]
struct OwnRecord {
    key: String,
    node: Node,
    value: Vec<u8>,
}

impl OwnRecord {
    async fn write(&self, store: &KvStore) {
        if let Err(e) = Box::pin(store.put_leased(self.key.clone(), self.value.clone())).await {
            warn!("etcd: {}", crate::util::errors::chain(&e));
        }
    }

    /// Whether the records under the prefix hold this one as written.
    fn is_in(&self, view: &View<'_>) -> bool {
        view.held
            .records()
            .get(&self.key)
            .is_some_and(|c| c.node.as_ref() == Ok(&self.node))
    }

    /// Whether this record was changed or deleted other than by this
    /// agent (another writer, or its lease ending): the view has come as
    /// far as this agent's last write of it (at revision `written`) and
    /// holds something else there. Before the view has seen that write (a
    /// listing read just before it), nothing is known; after etcd's
    /// history went back past it (a restore from an older backup), the
    /// view holding something else is enough.
    fn taken_from(&self, view: &View<'_>, written: Option<i64>) -> bool {
        written.is_some_and(|w| view.revision.past(w)) && !self.is_in(view)
    }
}

/// How long, at least, a node whose record went keeps its addresses: long
/// enough for an agent's restart or a node's reboot, so that a record
/// written meanwhile cannot take them (a new node given the address of one
/// that left waits this long, and is told why).
const MIN_HOLD: Duration = Duration::from_mins(15);

/// A node record as it is written in etcd: exactly these fields (an
/// unknown one is refused, so that a misspelt field is not silently
/// dropped).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeRecord {
    name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node_ip: Option<std::net::Ipv4Addr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    health_ip: Option<std::net::Ipv4Addr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node_ip6: Option<std::net::Ipv6Addr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    health_ip6: Option<std::net::Ipv6Addr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    zone: Option<String>,
}

impl From<&Node> for NodeRecord {
    fn from(n: &Node) -> Self {
        Self {
            name: n.name.clone(),
            node_ip: n.node_ip,
            health_ip: n.health_ip,
            node_ip6: n.node_ip6,
            health_ip6: n.health_ip6,
            zone: n.zone.clone(),
        }
    }
}

impl From<NodeRecord> for Node {
    fn from(r: NodeRecord) -> Self {
        Self {
            name: r.name,
            node_ip: r.node_ip,
            health_ip: r.health_ip,
            node_ip6: r.node_ip6,
            health_ip6: r.health_ip6,
            zone: r.zone,
        }
    }
}

/// The allocations' events and what they hold, when followed.
type FollowedAllocations = ((mpsc::Receiver<WatchEvent>, ReadAgain), Allocations);

/// Publishes the node set from the prefix's events (a burst of events is
/// published once), and the etcd errors in its status (once per outage).
async fn follow(
    store: &KvStore,
    ((mut events, read_again), allocations): (
        (mpsc::Receiver<WatchEvent>, ReadAgain),
        Option<FollowedAllocations>,
    ),
    cfg: &EtcdConfig,
    local: &LocalNode,
    nodes: &Nodes,
    own: &OwnRecord,
) {
    let mut link = store.link();
    let (mut allocation_events, allocations) = allocations.unzip();
    let mut view = View::new(
        &cfg.prefix,
        cfg.lease_ttl.max(MIN_HOLD),
        nodes.max_nodes(),
        &own.key,
    )
    .with_own(own.node.clone());
    view.allocations = allocations;
    let mut rewrites = Rewrites::default();
    loop {
        let grace_end = view.link_grace_end();
        let hold_end = view.hold_end();
        let rewrite_due = rewrites.due;
        let reread_due = view.reread_due();
        tokio::select! {
            ev = events.recv() => {
                let Some(ev) = ev else { return };
                view.apply(ev);
                while let Ok(ev) = events.try_recv() {
                    view.apply(ev);
                }

            }
            ev = next_event(allocation_events.as_mut()) => {
                let Some(ev) = ev else { return };
                view.apply_allocation(ev);
                while let Some(ev) = allocation_events.as_mut().and_then(|(rx, _)| rx.try_recv().ok()) {
                    view.apply_allocation(ev);
                }
                view.allocations_settled();
                if let Some((_, again)) = &allocation_events
                    && view.allocations.as_mut().is_some_and(Allocations::take_reread)
                {
                    again.now();
                }
            }
            changed = link.changed() => {
                if changed.is_err() {
                    return;
                }
                view.link_error = match &*link.borrow_and_update() {
                    Link::Down { error } => Some((error.clone(), Instant::now())),
                    Link::Connecting | Link::Up { .. } => None,
                };
            }
            () = until(grace_end) => {}
            () = until(view.publish_due()) => {}
            () = until(hold_end.map(Instant::from_std)) => view.dirty = true,
            () = until(rewrite_due) => rewrites.due = None,
            () = until(reread_due) => {
                info!(prefix = %cfg.prefix, "records that could be nodes fit under --max-nodes again: reading the prefix again");
                read_again.now();
                view.rereading(Instant::now());
            }
        }
        let up = matches!(*link.borrow(), Link::Up { .. });
        if up
            && view.synced
            && !own.is_in(&view)
            && own.taken_from(&view, store.written_revision(own.key.as_bytes()))
            && rewrites.may_write(Instant::now())
        {
            let by = Writer::of(view.own_lease, store.lease());
            nodes.count_rewrite(by.kind());
            match rewrites.said(by, Instant::now()) {
                Some(0) => warn!(key = %own.key, "this node's record was {by}: writing it back"),
                Some(n) => {
                    warn!(key = %own.key, "this node's record was {by}: writing it back (written back {n} more times since the last warning)");
                }
                None => debug!(key = %own.key, "this node's record was {by}: writing it back"),
            }
            own.write(store).await;
        }
        view.publish(&cfg.endpoints_text(), local, nodes);
    }
}

/// How long the lease session may stay down, with the watch in sync,
/// before its error is shown in the node set's status.
const LINK_GRACE: Duration = Duration::from_secs(10);

/// The next event of a followed prefix, or never when none is followed.
async fn next_event(
    followed: Option<&mut (mpsc::Receiver<WatchEvent>, ReadAgain)>,
) -> Option<WatchEvent> {
    match followed {
        Some((events, _)) => events.recv().await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `deadline`, or forever.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// The node records under the prefix, by key, as the watch left them.
#[derive(Debug)]
struct View<'a> {
    prefix: &'a str,
    /// What is held of the prefix.
    held: Held,
    /// A listing under way: it replaces `held` once whole.
    listing: Listing<Held>,
    limits: Limits,
    /// A listing was applied since the watch last broke.
    synced: bool,
    /// The revision `held` is at.
    revision: Revision,
    /// The records changed since they were last published.
    dirty: bool,
    watch_error: Option<String>,
    /// The lease session's error, and since when.
    link_error: Option<(String, Instant)>,
    /// An error is in the status now.
    shown_error: bool,
    /// Who holds each address: two records claiming one are decided by
    /// it, never by their keys' order.
    holders: Holders,
    /// How long a node whose record went keeps its addresses: the
    /// registration lease's TTL (the time a node that died stays listed),
    /// and at least [`MIN_HOLD`].
    hold: Duration,
    /// No set is validated before this: see [`View::publish`].
    quiet_until: Option<Instant>,
    /// The prefix read again for records not held.
    reread: Reread,
    /// This node's record as this agent writes it: validated in place of
    /// whatever is at its key (see [`View::with_own`]).
    own: Option<Candidate>,
    /// The health allocations peers' records are judged by, when
    /// `--kvstore-allocations` asks for them.
    allocations: Option<Allocations>,
    /// What was last said of this node's own record against its
    /// allocation.
    own_allocation: Option<String>,
    /// The lease this node's key was last written under, as the watch
    /// saw it (`Some(0)`: none; `None`: the key is absent): whose write a
    /// write-back undoes.
    own_lease: Option<i64>,
    /// The same, in the listing under way.
    listed_own_lease: Option<i64>,
}

/// The revision the records held are at: the last listing's, or the last
/// event's after it.
#[derive(Debug, Clone, Copy, Default)]
struct Revision {
    at: i64,
    /// The last listing was at a revision below the one before it:
    /// etcd's history went back (a restore from an older backup), and the
    /// revisions of writes made before are no measure of what was seen.
    went_back: bool,
}

impl Revision {
    /// A listing at `revision`: a linearizable read, at or past every
    /// write made before it, unless history went back.
    fn listed(&mut self, revision: i64) {
        self.went_back = revision < self.at;
        self.at = revision;
    }

    /// A change at `revision`.
    fn changed(&mut self, revision: i64) {
        self.at = self.at.max(revision);
    }

    /// Whether a write at `written` has been seen (or history went back
    /// since: it can be no longer).
    const fn past(self, written: i64) -> bool {
        self.at >= written || self.went_back
    }
}

/// When the prefix was last read again for records not held.
#[derive(Debug, Clone, Copy)]
enum Reread {
    Never,
    /// That listing is under way.
    Running(Instant),
    Done(Instant),
}

impl Reread {
    /// The listing under way ended.
    const fn ended(self) -> Self {
        match self {
            Self::Running(t) => Self::Done(t),
            other => other,
        }
    }
}

impl<'a> View<'a> {
    /// A view of `prefix`, holding at most `max_nodes` records that could
    /// be nodes beside `own_key`'s.
    fn new(prefix: &'a str, hold: Duration, max_nodes: usize, own_key: &str) -> Self {
        let limits = Limits {
            key_max: prefix.len() + super::record::MAX_NAME_LEN,
            max_nodes,
            own_key: own_key.to_owned(),
        };
        Self {
            prefix,
            hold,
            held: Held::new(limits.clone()),
            listing: Listing::default(),
            limits,
            holders: Holders::default().departing(max_nodes.saturating_mul(4)),
            synced: false,
            revision: Revision::default(),
            dirty: false,
            watch_error: None,
            link_error: None,
            shown_error: false,
            quiet_until: None,
            reread: Reread::Never,
            own: None,
            allocations: None,
            own_allocation: None,
            own_lease: None,
            listed_own_lease: None,
        }
    }

    /// `self`, with `node` (this node's, at the view's own key) as the
    /// record validated there whatever the key holds: a record someone
    /// else changed or deleted is written back within [`rewrites::REWRITE_EVERY`],
    /// and meanwhile takes no address and drops nothing from this agent's
    /// set. Other agents see what the key holds until it is written back.
    fn with_own(mut self, node: Node) -> Self {
        self.own = Some(Candidate {
            record: Record {
                name: Some(node.name.clone()),
                origin: Origin::Etcd {
                    key: self.limits.own_key.clone(),
                    prefix_len: self.prefix.len(),
                },
            },
            node: Ok(node),
        });
        self
    }

    fn apply(&mut self, ev: WatchEvent) {
        let prefix = self.prefix;
        match ev {
            WatchEvent::Snapshot {
                entries,
                first,
                last,
                revision,
            } => {
                let limits = &self.limits;
                let Some(mut listing) = self.listing.page(first, || Held::new(limits.clone()))
                else {
                    return;
                };
                if first {
                    self.listed_own_lease = None;
                }
                for e in &entries {
                    if e.key == limits.own_key.as_bytes() {
                        self.listed_own_lease = Some(e.lease);
                    }
                    listing.hold(&e.key_str(), || candidate(e, prefix));
                }
                if let Some(whole) = self.listing.after_page(listing, last) {
                    self.own_lease = self.listed_own_lease.take();
                    self.held = whole;
                    self.revision.listed(revision);
                    self.synced = true;
                    self.dirty = true;
                    self.watch_error = None;
                    self.reread = self.reread.ended();
                }
            }
            WatchEvent::Put(e) => {
                if e.key == self.limits.own_key.as_bytes() {
                    self.own_lease = Some(e.lease);
                }
                self.held.hold(&e.key_str(), || candidate(&e, prefix));
                self.revision.changed(e.mod_revision);
                self.dirty = true;
            }
            WatchEvent::Delete { key, revision } => {
                if key == self.limits.own_key.as_bytes() {
                    self.own_lease = None;
                }
                self.held.forget(&String::from_utf8_lossy(&key));
                self.revision.changed(revision);
                self.dirty = true;
            }
            WatchEvent::Lost { error } => {
                self.synced = false;
                self.listing.abandon();
                self.reread = self.reread.ended();
                self.watch_error = Some(crate::util::errors::chain(&*error));
            }
        }
    }

    /// Applies an event of the allocations' prefix.
    fn apply_allocation(&mut self, ev: WatchEvent) {
        if let Some(allocations) = self.allocations.as_mut()
            && allocations.apply(ev)
        {
            self.dirty = true;
        }
    }

    /// After a burst of the allocations' events: their overlaps found
    /// again and, once they are read, a mismatch with this node's own
    /// record warned about once.
    fn allocations_settled(&mut self) {
        let Some(allocations) = self.allocations.as_mut() else {
            return;
        };
        allocations.settle();
        if !allocations.synced() {
            return;
        }
        // While allocations go unheld, this node's own may be among them.
        if allocations.error().is_some() {
            return;
        }
        let mismatch = self
            .own
            .as_ref()
            .and_then(|c| c.node.as_ref().ok())
            .and_then(|own| allocations.own_mismatch(own));
        if mismatch != self.own_allocation {
            match &mismatch {
                Some(m) => warn!("{m}"),
                None if self.own_allocation.is_some() => {
                    info!("this node's record lies in its allocation again");
                }
                None => {}
            }
            self.own_allocation = mismatch;
        }
    }

    /// When the prefix is to be read again, if records that could be
    /// nodes went unheld and now all fit: at once the first time, then
    /// at most every [`REREAD_GAP`] (a writer keeping the prefix at the
    /// bound costs a listing that often, not one a change).
    fn reread_due(&self) -> Option<Instant> {
        if !self.synced || !self.held.must_reread() {
            return None;
        }
        match self.reread {
            Reread::Never => Some(Instant::now()),
            Reread::Running(_) => None,
            Reread::Done(t) => Some(t + REREAD_GAP),
        }
    }

    /// A new listing of the prefix was asked for. A listing under way
    /// goes on: its pages are the stream's, and the watch goes on from
    /// its revision.
    fn rereading(&mut self, now: Instant) {
        self.reread = Reread::Running(now);
    }

    /// The error to show. The lease session's counts once it has
    /// outlasted [`LINK_GRACE`] with the watch in sync: when etcd returns,
    /// the watch and the lease session come back within a backoff of each
    /// other, and the outage is reported once.
    fn error(&self) -> Option<String> {
        self.watch_error
            .clone()
            .or_else(|| {
                self.allocations
                    .as_ref()
                    .filter(|a| !a.synced())
                    .and_then(Allocations::error)
            })
            .or_else(|| {
                self.link_error
                    .as_ref()
                    .filter(|(_, since)| !self.synced || since.elapsed() >= LINK_GRACE)
                    .map(|(e, _)| e.clone())
            })
    }

    /// When the lease session's error starts to count, if it is pending.
    fn link_grace_end(&self) -> Option<Instant> {
        match &self.link_error {
            Some((_, since)) if self.synced && !self.shown_error => Some(*since + LINK_GRACE),
            _ => None,
        }
    }

    /// The set, validated: an address two records claim goes to its
    /// holder, or to neither.
    fn validated(&self, local: &LocalNode) -> Validated {
        let records = self.held.records();
        let candidates: Vec<Candidate> = match &self.own {
            // In key order, with this node's own in its place.
            Some(own) => {
                use std::ops::Bound::{Excluded, Unbounded};
                let key = self.limits.own_key.as_str();
                let before = records.range::<str, _>((Unbounded, Excluded(key)));
                let after = records.range::<str, _>((Excluded(key), Unbounded));
                before
                    .map(|(_, c)| c.clone())
                    .chain(std::iter::once(own.clone()))
                    .chain(after.map(|(_, c)| c.clone()))
                    .collect()
            }
            None => records.values().cloned().collect(),
        };
        Validated {
            unheld: self.held.unheld(),
            ..validate::validate_allocated(
                candidates,
                (local, self.allocations.as_ref()),
                &self.holders,
            )
        }
    }

    /// Validates the set and hands it to `nodes`; whether it was taken.
    /// Records that could be nodes past `--max-nodes` are not all held: the
    /// set is refused without a look.
    fn accept(&mut self, local: &LocalNode, nodes: &Nodes) -> bool {
        // The allocations' listing is theirs: kept current even while the
        // set is refused.
        if let Some(allocations) = self.allocations.as_mut() {
            allocations.settle();
            let (shown, total) = allocations.uncounted();
            nodes.set_allocations_uncounted(shown, total);
        }
        if self.held.over() > 0 {
            nodes.reject(format!(
                "{} records under {} could be nodes, more than --max-nodes {} ({} not held)",
                self.held.nodes(),
                self.prefix,
                self.limits.max_nodes,
                self.held.over(),
            ));
            return false;
        }
        if let Some(e) = self.allocations.as_ref().and_then(Allocations::error) {
            nodes.reject(e);
            return false;
        }
        let update = self.validated(local);
        let holders = self
            .holders
            .after(&update.nodes, Instant::now().into_std(), self.hold);
        let taken = nodes.accept(update);
        if taken {
            self.holders = holders;
        }
        taken
    }

    /// When a departed node's hold ends, making a change; none while a
    /// change waits already (the hold's end changes nothing more).
    fn hold_end(&self) -> Option<std::time::Instant> {
        if self.dirty {
            None
        } else {
            self.holders.next_expiry()
        }
    }

    /// The records, and the allocations when followed, were listed since
    /// their watches last broke: a set may be validated.
    fn all_synced(&self) -> bool {
        self.synced && self.allocations.as_ref().is_none_or(Allocations::synced)
    }

    /// When a pending change is to be validated, if one waits (a time
    /// past already: at once).
    fn publish_due(&self) -> Option<Instant> {
        self.quiet_until.filter(|_| self.dirty && self.all_synced())
    }

    /// Validates and publishes the set if it changed. A change after a
    /// quiet spell is published at once; then the next waits
    /// [`VALIDATE_GAP`] times the validation's own time (at least
    /// [`MIN_VALIDATE_GAP`]), and what changed meanwhile is published
    /// together: a storm of records (a rolling restart of 50,000 agents,
    /// 0.1-0.2 s a validation) takes at most about a fifth of a CPU.
    fn publish(&mut self, endpoint: &str, local: &LocalNode, nodes: &Nodes) {
        let recovered = self.shown_error && self.error().is_none();
        let now = Instant::now();
        let quiet = self.quiet_until.is_none_or(|t| now >= t);
        if self.all_synced() && (self.dirty || recovered) && (quiet || recovered) {
            // A set refused whole (past --max-nodes) holds no address, and
            // the holds that ended are let go.
            if !self.accept(local, nodes) {
                self.holders = self.holders.unexpired(now.into_std());
            }
            self.dirty = false;
            self.shown_error = false;
            let gap = now.elapsed().mul_f64(VALIDATE_GAP).max(MIN_VALIDATE_GAP);
            self.quiet_until = Some(Instant::now() + gap);
        }
        if let Some(e) = self.error()
            && !self.shown_error
        {
            nodes.unreachable(format!(
                "etcd at {endpoint}: {e}; probing the last known set"
            ));
            self.shown_error = true;
        }
    }
}

/// A prefix whose records that could be nodes went past `--max-nodes`
/// and came back under it is read again at most this often.
const REREAD_GAP: Duration = Duration::from_secs(30);

/// Between two validations of the set, this many times the last one's
/// time: validation takes at most about 1/(1 + this) of a CPU.
const VALIDATE_GAP: f64 = 4.0;

/// Between two validations of the set, at least this.
const MIN_VALIDATE_GAP: Duration = Duration::from_millis(20);

/// The largest value read as a node record: a record is a few hundred
/// bytes; a larger value is refused before it is decoded.
pub const MAX_RECORD_BYTES: usize = 4096;

/// A record as validation sees it: decoded, or why not, named by its key.
/// What a writer put there is shown only in part: a verdict is logged on
/// every agent and served by `GET /v1/nodes`.
fn candidate(e: &Entry, prefix: &str) -> Candidate {
    let key = e.key_str().into_owned();
    let node = if e.value.len() > MAX_RECORD_BYTES {
        Err(format!(
            "the value is {} bytes, more than a node record's {MAX_RECORD_BYTES}",
            e.value.len()
        ))
    } else {
        serde_json::from_slice::<NodeRecord>(&e.value)
            .map(Node::from)
            .map_err(|err| clip(&format!("the value is not a node record: {err}"), 256))
    };
    Candidate {
        record: Record {
            name: node.as_ref().ok().map(|n| n.name.clone()),
            origin: Origin::Etcd {
                prefix_len: if key.starts_with(prefix) {
                    prefix.len()
                } else {
                    0
                },
                key,
            },
        },
        node,
    }
}

/// Revokes this agent's lease (its keys go with it): a graceful leave.
pub async fn deregister(registration: &Registration) {
    let Some(store) = registration.0.get() else {
        return;
    };
    match Box::pin(store.revoke()).await {
        Ok(Some(lease)) => info!(lease = %format!("{lease:x}"), "left etcd (lease revoked)"),
        Ok(None) => {}
        Err(e) => warn!(
            "revoking the etcd lease: {}",
            crate::util::errors::chain(&e)
        ),
    }
}

#[cfg(test)]
mod tests;
