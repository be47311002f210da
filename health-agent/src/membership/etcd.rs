//! Node discovery through etcd (over [`super::kvstore`]): each agent puts
//! its record at `<prefix><name>` with its lease (kept alive by the
//! lease-keepalive stream), reads the prefix once and then follows it from
//! the watch stream's events, one record at a time. When etcd is
//! unreachable the last known set stays in use (probing goes on); when it
//! returns the prefix is read again and the watch resumes after it.

mod rewrites;

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
    record::{Candidate, LocalNode, Origin, Record, Validated, clip},
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
            holders: Holders::default().departing(),
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
            nodes.reject(format!(
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
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::membership::held::MAX_JUNK_HELD;
    use crate::membership::record::RejectedRecord;

    fn local() -> LocalNode {
        LocalNode {
            name: Some("n1".into()),
            health_cidr: Some("198.18.64.0/24".parse().expect("cidr")),
            health_cidr6: None,
            ..LocalNode::default()
        }
    }

    fn kv(key: &str, value: &Value) -> Entry {
        raw(key, &value.to_string())
    }

    fn raw(key: &str, value: &str) -> Entry {
        Entry {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            mod_revision: 1,
            lease: 0,
        }
    }

    fn record(name: &str, node_ip: &str, health_ip: &str) -> Value {
        json!({"name": name, "node_ip": node_ip, "health_ip": health_ip})
    }

    /// The set a snapshot of `entries` (in any order) makes.
    fn nodes_from(entries: Vec<Entry>, prefix: &str) -> Validated {
        nodes_with_own(entries, prefix, None)
    }

    /// [`nodes_from`], with `own` as this node's record as its agent
    /// wrote it.
    fn nodes_with_own(entries: Vec<Entry>, prefix: &str, own: Option<&Node>) -> Validated {
        let mut view = View::new(prefix, Duration::from_secs(60), usize::MAX, "/h/n1");
        if let Some(me) = own {
            view = view.with_own(me.clone());
        }
        view.apply(WatchEvent::Snapshot {
            revision: 1,
            first: true,
            last: true,
            entries,
        });
        view.validated(&local())
    }

    /// A change after a quiet spell is published at once; the next one
    /// waits for the gap after it, then goes out with what else changed.
    #[tokio::test(start_paused = true)]
    async fn changes_close_together_are_validated_together() {
        let nodes = Nodes::new("etcd".into());
        let names = || -> Vec<String> { nodes.current().iter().map(|n| n.name.clone()).collect() };
        let mut view = View::new("/h/", Duration::from_secs(60), usize::MAX, "/h/n1");
        view.apply(WatchEvent::Snapshot {
            revision: 1,
            first: true,
            last: true,
            entries: vec![kv("/h/a", &record("a", "198.18.0.2", "198.18.65.2"))],
        });
        view.publish("e", &local(), &nodes);
        assert_eq!(names(), ["a"]);
        assert_eq!(view.publish_due(), None, "nothing waits");
        for (key, name, ip, health) in [
            ("/h/b", "b", "198.18.0.3", "198.18.66.2"),
            ("/h/c", "c", "198.18.0.4", "198.18.67.2"),
        ] {
            view.apply(WatchEvent::Put(kv(key, &record(name, ip, health))));
            view.publish("e", &local(), &nodes);
        }
        assert_eq!(names(), ["a"], "within the gap: not yet");
        let due = view.publish_due().expect("a change waits");
        assert!(due - Instant::now() >= MIN_VALIDATE_GAP);
        tokio::time::advance(due - Instant::now() + Duration::from_millis(5)).await;
        assert_eq!(
            view.publish_due(),
            Some(due),
            "past due, it still wakes the loop"
        );
        view.publish("e", &local(), &nodes);
        assert_eq!(names(), ["a", "b", "c"], "both, at once");
        assert_eq!(view.publish_due(), None);
        // A node leaves: its addresses are held; while a change waits,
        // the hold's end does not wake the loop again and again.
        tokio::time::advance(MIN_VALIDATE_GAP).await;
        view.apply(WatchEvent::Delete {
            key: b"/h/c".to_vec(),
            revision: 3,
        });
        view.publish("e", &local(), &nodes);
        assert_eq!(names(), ["a", "b"]);
        let ends = view.hold_end().expect("c's addresses held");
        view.apply(WatchEvent::Delete {
            key: b"/h/b".to_vec(),
            revision: 4,
        });
        view.publish("e", &local(), &nodes);
        assert!(view.publish_due().is_some(), "b's leaving waits");
        assert_eq!(view.hold_end(), None, "a change waits already");
        tokio::time::advance(Duration::from_secs(61)).await;
        view.publish("e", &local(), &nodes);
        assert_eq!(names(), ["a"]);
        assert!(
            view.hold_end().is_some_and(|t| t > ends),
            "c's hold ended; b's runs"
        );
    }

    /// With allocations followed, no set is judged before they are listed;
    /// a record outside its node's allocation is refused and claims
    /// nothing; allocations past the bound refuse the set whole, and a
    /// broken watch of them is said.
    #[tokio::test(start_paused = true)]
    async fn records_are_judged_by_the_allocations_once_they_are_listed() {
        let nodes = Nodes::new("etcd".into());
        let names = || -> Vec<String> { nodes.current().iter().map(|n| n.name.clone()).collect() };
        let mut view = View::new("/h/", Duration::from_secs(60), usize::MAX, "/h/n1");
        view.allocations = Some(Allocations::new("/a/".into(), local(), 2));
        let allocation = |name: &str, cidr: &str| {
            raw(
                &format!("/a/{name}"),
                &format!(r#"{{"health_cidr":"{cidr}"}}"#),
            )
        };
        view.apply(page(
            vec![
                kv("/h/a", &record("a", "198.18.0.2", "198.18.65.2")),
                kv("/h/squat", &record("squat", "198.18.0.9", "198.18.66.2")),
            ],
            true,
            true,
        ));
        view.publish("e", &local(), &nodes);
        assert_eq!(
            names(),
            Vec::<String>::new(),
            "the allocations not read yet"
        );
        let status = nodes.status();
        assert_eq!(
            (status.updated_ms, status.rejected_total, status.error),
            (None, 0, None),
            "nothing judged"
        );
        view.apply_allocation(page(
            vec![
                allocation("a", "198.18.65.0/24"),
                allocation("b", "198.18.66.0/24"),
            ],
            true,
            true,
        ));
        view.publish("e", &local(), &nodes);
        assert_eq!(names(), ["a"]);
        let status = nodes.status();
        assert_eq!(status.rejected.len(), 1, "{status:?}");
        assert_eq!(
            status.rejected[0].reason,
            "health-ip 198.18.66.2 is not allocated: no allocation at etcd key \"/a/squat\" (--kvstore-allocations)"
        );
        // b comes for the address the squatter claimed first: it is b's.
        tokio::time::advance(Duration::from_secs(1)).await;
        view.apply(WatchEvent::Put(kv(
            "/h/b",
            &record("b", "198.18.0.3", "198.18.66.2"),
        )));
        view.publish("e", &local(), &nodes);
        assert_eq!(names(), ["a", "b"]);
        // Past the bound: the set is refused whole, the last good one kept.
        tokio::time::advance(Duration::from_secs(1)).await;
        view.apply_allocation(WatchEvent::Put(allocation("c", "198.18.67.0/24")));
        view.publish("e", &local(), &nodes);
        assert_eq!(names(), ["a", "b"]);
        let error = nodes.status().error.expect("refused");
        assert!(
            error.starts_with("more allocations under /a/ than --max-nodes 2"),
            "{error}"
        );
        // The allocations' watch breaks: said, and nothing judged.
        tokio::time::advance(Duration::from_secs(1)).await;
        view.apply_allocation(page(vec![allocation("a", "198.18.65.0/24")], true, true));
        view.apply_allocation(WatchEvent::Lost {
            error: Arc::new(super::super::kvstore::KvError::Timeout {
                op: "watch".into(),
                timeout: Duration::from_secs(5),
            }),
        });
        view.publish("e", &local(), &nodes);
        assert_eq!(names(), ["a", "b"], "not judged while the watch is out");
        view.apply(WatchEvent::Put(kv(
            "/h/c",
            &record("c", "198.18.0.4", "198.18.65.9"),
        )));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            view.publish_due(),
            None,
            "a change waits without waking the loop"
        );
        let error = nodes.status().error.expect("said");
        assert!(
            error.starts_with("etcd at e: the allocations under /a/: "),
            "{error}"
        );
        view.apply_allocation(page(vec![allocation("a", "198.18.65.0/24")], true, true));
        view.publish("e", &local(), &nodes);
        assert_eq!(names(), ["a"], "b's allocation went");
        assert_eq!(nodes.status().error, None);
    }

    /// Allocations that count for nothing are listed at their keys, on
    /// their own beside the rejected records, whether or not their nodes
    /// have records: an admin's mistake shows before its node comes.
    #[tokio::test(start_paused = true)]
    async fn allocations_that_count_for_nothing_are_listed() {
        let nodes = Nodes::new("etcd".into());
        let mut view = View::new("/h/", Duration::from_secs(60), usize::MAX, "/h/n1");
        view.allocations = Some(Allocations::new("/a/".into(), local(), 10));
        view.apply(page(
            vec![
                kv("/h/a", &record("a", "198.18.0.2", "198.18.65.2")),
                kv("/h/z", &record("z", "198.18.0.26", "198.18.69.2")),
            ],
            true,
            true,
        ));
        view.apply_allocation(page(
            vec![
                raw("/a/a", r#"{"health_cidr":"198.18.65.0/24"}"#),
                raw("/a/o-1", r#"{"health_cidr":"198.18.66.0/24"}"#),
                raw("/a/o-2", r#"{"health_cidr":"198.18.66.0/25"}"#),
                raw(
                    "/a/typo",
                    r#"{"health_cidr":"198.18.67.0/24","node_ip":"198.18.0.300"}"#,
                ),
            ],
            true,
            true,
        ));
        view.publish("e", &local(), &nodes);
        let status = nodes.status();
        let listed = |l: &[RejectedRecord]| -> Vec<(String, String)> {
            l.iter()
                .map(|r| (r.record.clone(), r.reason.clone()))
                .collect()
        };
        assert_eq!(
            listed(&status.allocations_uncounted),
            [
                (
                    "/a/o-1".to_owned(),
                    "overlaps the one at \"/a/o-2\", and neither counts".to_owned()
                ),
                (
                    "/a/o-2".to_owned(),
                    "overlaps the one at \"/a/o-1\", and neither counts".to_owned()
                ),
                (
                    "/a/typo".to_owned(),
                    "refused: node_ip \"198.18.0.300\" is not an IPv4 address".to_owned()
                ),
            ]
        );
        assert_eq!(status.allocations_uncounted_total, 3);
        assert_eq!(
            listed(&status.rejected),
            [(
                "/h/z".to_owned(),
                "health-ip 198.18.69.2 is not allocated: no allocation at etcd key \"/a/z\" (--kvstore-allocations)".to_owned()
            )],
            "the rejected records are node records alone"
        );
        assert_eq!(
            nodes
                .current()
                .iter()
                .map(|n| n.name.as_str())
                .collect::<Vec<_>>(),
            ["a"]
        );
        // Fixed, it is listed no more.
        tokio::time::advance(Duration::from_secs(1)).await;
        view.apply_allocation(WatchEvent::Put(raw(
            "/a/typo",
            r#"{"health_cidr":"198.18.67.0/24","node_ip":"198.18.0.30"}"#,
        )));
        view.publish("e", &local(), &nodes);
        assert_eq!(nodes.status().allocations_uncounted_total, 2);
    }

    /// The allocations' listing stays current while the node set is
    /// refused whole (records past --max-nodes).
    #[tokio::test(start_paused = true)]
    async fn the_allocations_listing_follows_them_while_the_set_is_refused() {
        let nodes = Nodes::new("etcd".into());
        let mut view = View::new("/h/", Duration::from_secs(60), 1, "/h/n1");
        view.allocations = Some(Allocations::new("/a/".into(), local(), 10));
        view.apply(page(
            vec![
                kv("/h/a", &record("a", "198.18.0.2", "198.18.65.2")),
                kv("/h/b", &record("b", "198.18.0.3", "198.18.66.2")),
            ],
            true,
            true,
        ));
        view.apply_allocation(page(vec![raw("/a/a", "not json")], true, true));
        view.publish("e", &local(), &nodes);
        let status = nodes.status();
        assert!(
            status
                .error
                .as_deref()
                .is_some_and(|e| e.contains("more than --max-nodes 1")),
            "{status:?}"
        );
        assert_eq!(status.allocations_uncounted_total, 1);
        tokio::time::advance(Duration::from_secs(1)).await;
        view.apply_allocation(WatchEvent::Put(raw(
            "/a/a",
            r#"{"health_cidr":"198.18.65.0/24"}"#,
        )));
        view.publish("e", &local(), &nodes);
        let status = nodes.status();
        assert!(status.error.is_some(), "still refused whole");
        assert_eq!(status.allocations_uncounted_total, 0, "{status:?}");
    }

    /// What a writer puts under the prefix is shown only in part: a value
    /// past a record's size is refused undecoded, a decoding error and a
    /// long key are cut short; the good record beside them counts.
    #[test]
    fn a_writers_bytes_are_refused_or_shown_in_part() {
        let huge = format!("{{\"name\": \"{}\"}}", "x".repeat(1 << 20));
        let wrong = json!({"name": "y".repeat(3000), "node_ip": 7, "health_ip": "198.18.65.2"});
        let long_key = format!("/h/{}", "k".repeat(5000));
        let v = nodes_from(
            vec![
                raw("/h/huge", &huge),
                kv("/h/wrong", &wrong),
                kv(&long_key, &record("z", "198.18.0.13", "198.18.67.2")),
                kv("/h/good", &record("good", "198.18.0.12", "198.18.66.2")),
            ],
            "/h/",
        );
        assert_eq!(outcome(&v).0, ["good"]);
        let texts: Vec<String> = v.rejected.iter().map(ToString::to_string).collect();
        assert_eq!(texts.len(), 2, "{texts:?}");
        assert_eq!(v.unheld, 1, "the key too long to be a node's is counted");
        for t in &texts {
            assert!(t.len() < 1200, "{} bytes: {}", t.len(), &t[..200]);
        }
        assert!(
            texts
                .iter()
                .any(|t| t.contains("1048588 bytes, more than a node record's 4096")),
            "{texts:?}"
        );
        assert!(
            v.summary().is_some_and(
                |t| t.contains("3 node records rejected") && t.contains("; and 1 not held")
            ),
            "{:?}",
            v.summary()
        );
    }

    /// A writer filling the prefix with junk is counted, not held: past
    /// the first undecodable records, a key costs the agent its hash; the
    /// good records still count, and deleting the junk takes it away.
    #[test]
    fn junk_past_a_bound_is_counted_not_held() {
        let mut view = View::new("/h/", Duration::from_secs(60), usize::MAX, "/h/n1");
        let junk = |i: usize| raw(&format!("/h/junk-{i:05}"), "not json");
        let mut entries: Vec<Entry> = (0..MAX_JUNK_HELD + 1000).map(junk).collect();
        entries.push(kv("/h/good", &record("good", "198.18.0.12", "198.18.66.2")));
        view.apply(WatchEvent::Snapshot {
            revision: 1,
            first: true,
            last: true,
            entries,
        });
        assert_eq!(
            view.held.records().len(),
            MAX_JUNK_HELD + 1,
            "the held junk and the good record"
        );
        let v = view.validated(&local());
        assert_eq!(outcome(&v).0, ["good"]);
        assert_eq!((v.rejected.len(), v.unheld), (MAX_JUNK_HELD, 1000));
        assert_eq!(v.rejected_total(), MAX_JUNK_HELD + 1000);
        // A held junk key deleted, an unheld one deleted, one made good.
        let delete = |key: String| WatchEvent::Delete {
            key: key.into_bytes(),
            revision: 2,
        };
        view.apply(delete("/h/junk-00000".into()));
        view.apply(delete(format!("/h/junk-{:05}", MAX_JUNK_HELD + 999)));
        let fixed = format!("/h/junk-{:05}", MAX_JUNK_HELD + 5);
        let name = &fixed["/h/".len()..];
        view.apply(WatchEvent::Put(kv(
            &fixed,
            &record(name, "198.18.0.13", "198.18.67.2"),
        )));
        let v = view.validated(&local());
        assert_eq!(outcome(&v).0, ["good", name]);
        assert_eq!((v.rejected.len(), v.unheld), (MAX_JUNK_HELD - 1, 998));
        // Room again: the next junk is held and listed.
        view.apply(WatchEvent::Put(junk(99_999)));
        assert_eq!(view.validated(&local()).rejected.len(), MAX_JUNK_HELD);
        // Records that decode but can never be a node are junk too: at
        // another name's key, or with a loopback address.
        view.apply(WatchEvent::Put(kv(
            "/h/elsewhere",
            &record("x", "198.18.0.20", "198.18.68.2"),
        )));
        view.apply(WatchEvent::Put(kv(
            "/h/lo",
            &record("lo", "127.0.0.1", "198.18.69.2"),
        )));
        let v = view.validated(&local());
        assert_eq!((v.rejected.len(), v.unheld), (MAX_JUNK_HELD, 1000));
    }

    /// A set refused whole (past `--max-nodes`) holds no address: the
    /// next set is judged as if it had not been read.
    #[test]
    fn a_set_refused_whole_holds_no_address() {
        let mut view = View::new("/h/", Duration::from_secs(60), usize::MAX, "/h/n1");
        view.apply(WatchEvent::Snapshot {
            revision: 1,
            first: true,
            last: true,
            entries: vec![
                kv("/h/a", &record("a", "198.18.0.11", "198.18.65.2")),
                kv("/h/b", &record("b", "198.18.0.12", "198.18.66.2")),
            ],
        });
        let nodes = Nodes::new("etcd".into()).with_max_nodes(1);
        view.publish("etcd", &local(), &nodes);
        assert!(view.holders.is_empty(), "{:?}", view.holders);
        let nodes = Nodes::new("etcd".into()).with_max_nodes(2);
        view.dirty = true;
        // Past the gap between two validations.
        view.quiet_until = None;
        view.publish("etcd", &local(), &nodes);
        assert_eq!(view.holders.len(), 4, "two addresses of each");
    }

    fn page(entries: Vec<Entry>, first: bool, last: bool) -> WatchEvent {
        WatchEvent::Snapshot {
            revision: 7,
            entries,
            first,
            last,
        }
    }

    fn node_kv(i: u8) -> Entry {
        let name = format!("n{i}");
        kv(
            &format!("/h/{name}"),
            &record(
                &name,
                &format!("198.18.0.{i}"),
                &format!("198.18.{}.2", 64 + i),
            ),
        )
    }

    /// Records that could be nodes past --max-nodes are counted, not held,
    /// and the set is refused whole; once they fit again the prefix is
    /// read again, and the set is taken.
    #[tokio::test(start_paused = true)]
    async fn records_past_max_nodes_are_not_held_and_refuse_the_set() {
        let nodes = Nodes::new("etcd".into()).with_max_nodes(3);
        let mut view = View::new("/h/", Duration::from_secs(60), 3, "/h/n1");
        // n1's own record comes last, past the bound: it is held all the
        // same.
        let all: Vec<Entry> = [10, 11, 12, 13, 14, 1].into_iter().map(node_kv).collect();
        view.apply(page(all.clone(), true, true));
        assert_eq!((view.held.records().len(), view.held.over()), (4, 2));
        assert!(view.held.records().contains_key("/h/n1"));
        view.publish("etcd", &local(), &nodes);
        assert!(nodes.current().is_empty(), "refused whole");
        let error = nodes.status().error.expect("said why");
        assert!(
            error.contains("6 records under /h/ could be nodes, more than --max-nodes 3"),
            "{error}"
        );
        assert_eq!(nodes.updates_rejected(), 1);
        assert_eq!(view.reread_due(), None, "six do not fit in three");
        // Three leave: the three left fit, but one of them is not held.
        for i in [10, 11, 12] {
            view.apply(WatchEvent::Delete {
                key: format!("/h/n{i}").into_bytes(),
                revision: 8,
            });
        }
        assert_eq!(view.held.nodes(), 3);
        let due = view.reread_due().expect("read again");
        assert!(due <= Instant::now(), "at once the first time");
        view.rereading(Instant::now());
        assert_eq!(view.reread_due(), None, "one listing at a time");
        let left: Vec<Entry> = [13, 14, 1].into_iter().map(node_kv).collect();
        view.apply(page(left, true, true));
        assert_eq!(view.held.over(), 0);
        tokio::time::advance(Duration::from_secs(1)).await;
        view.publish("etcd", &local(), &nodes);
        let names: Vec<String> = nodes.current().iter().map(|n| n.name.clone()).collect();
        assert_eq!(names, ["n1", "n13", "n14"]);
        // Past the bound again, then under it: read again only after the gap.
        view.apply(WatchEvent::Put(node_kv(15)));
        view.apply(WatchEvent::Delete {
            key: b"/h/n13".to_vec(),
            revision: 9,
        });
        let again = view.reread_due().expect("read again");
        assert!(
            again - Instant::now() >= REREAD_GAP.saturating_sub(Duration::from_secs(2)),
            "{again:?}"
        );
    }

    /// A re-read asked for while a listing is under way leaves that
    /// listing whole: it is the stream's, and the watch goes on from its
    /// revision. Its last page ends the re-read.
    #[tokio::test(start_paused = true)]
    async fn a_reread_asked_during_a_listing_leaves_it_whole() {
        let mut view = View::new("/h/", Duration::from_secs(60), 3, "/h/n1");
        view.apply(page(vec![node_kv(1)], true, true));
        assert!(view.synced);
        // A listing after a quiet break: the view stays in sync meanwhile.
        view.apply(page(vec![node_kv(1), node_kv(2)], true, false));
        view.rereading(Instant::now());
        assert_eq!(view.reread_due(), None, "one listing at a time");
        view.apply(page(vec![node_kv(3)], false, true));
        let held: Vec<&String> = view.held.records().keys().collect();
        assert_eq!(held, ["/h/n1", "/h/n2", "/h/n3"], "the listing, whole");
        assert!(matches!(view.reread, Reread::Done(_)), "{:?}", view.reread);
    }

    /// A departed node's address is held for the hold's length by the
    /// agent's clock, then a new record may take it.
    #[tokio::test(start_paused = true)]
    async fn a_departed_nodes_address_is_free_when_its_hold_ends() {
        let nodes = Nodes::new("etcd".into());
        let names = || -> Vec<String> { nodes.current().iter().map(|n| n.name.clone()).collect() };
        let mut view = View::new("/h/", Duration::from_secs(60), usize::MAX, "/h/n1");
        view.apply(page(vec![node_kv(2)], true, true));
        view.publish("e", &local(), &nodes);
        assert_eq!(names(), ["n2"]);
        view.apply(WatchEvent::Delete {
            key: b"/h/n2".to_vec(),
            revision: 8,
        });
        tokio::time::advance(Duration::from_secs(1)).await;
        view.publish("e", &local(), &nodes);
        let taker = || kv("/h/x", &record("x", "198.18.0.2", "198.18.90.2"));
        view.apply(WatchEvent::Put(taker()));
        tokio::time::advance(Duration::from_secs(1)).await;
        view.publish("e", &local(), &nodes);
        assert!(names().is_empty(), "n2's address is held");
        tokio::time::advance(Duration::from_secs(60)).await;
        view.apply(WatchEvent::Put(taker()));
        view.publish("e", &local(), &nodes);
        assert_eq!(names(), ["x"], "the hold ended");
    }

    /// A listing's pages replace what is held together, at the last one;
    /// a listing cut off by a lost watch replaces nothing.
    #[test]
    fn a_listing_in_pages_replaces_the_records_at_its_last_page() {
        let mut view = View::new("/h/", Duration::from_secs(60), usize::MAX, "/h/n1");
        view.apply(page(vec![node_kv(1), node_kv(2)], true, true));
        let keys = |v: &View<'_>| v.held.records().keys().cloned().collect::<Vec<_>>();
        view.apply(page(vec![node_kv(3)], true, false));
        view.apply(page(vec![node_kv(4)], false, false));
        assert_eq!(keys(&view), ["/h/n1", "/h/n2"], "not yet");
        view.apply(WatchEvent::Lost {
            error: Arc::new(super::super::kvstore::KvError::StreamEnded { what: "watch" }),
        });
        view.apply(page(vec![node_kv(5)], false, true));
        assert_eq!(
            keys(&view),
            ["/h/n1", "/h/n2"],
            "a broken listing is dropped"
        );
        assert!(!view.synced);
        view.apply(page(vec![node_kv(3)], true, false));
        view.apply(page(vec![node_kv(4)], false, true));
        assert_eq!(keys(&view), ["/h/n3", "/h/n4"]);
        assert!(view.synced && view.dirty);
    }

    fn outcome(v: &Validated) -> (Vec<&str>, Vec<String>) {
        (
            v.nodes.iter().map(|n| n.name.as_str()).collect(),
            v.rejected.iter().map(ToString::to_string).collect(),
        )
    }

    /// This node's record counts as taken by someone else only once the
    /// view has seen this agent's write of it: a listing read just before
    /// the write (an agent starting) is no reason to write it back.
    #[test]
    fn a_record_counts_as_taken_only_after_the_view_saw_this_agents_write() {
        let value = record("n1", "198.18.0.11", "198.18.64.2");
        let me = Node::from(serde_json::from_value::<NodeRecord>(value.clone()).expect("a record"));
        let own = OwnRecord {
            key: "/h/n1".into(),
            node: me.clone(),
            value: value.to_string().into_bytes(),
        };
        let at = |mut e: Entry, revision| {
            e.mod_revision = revision;
            e
        };
        let listing = |revision, entries| WatchEvent::Snapshot {
            revision,
            entries,
            first: true,
            last: true,
        };
        let mut view = View::new("/h/", Duration::from_secs(60), usize::MAX, "/h/n1").with_own(me);
        view.apply(listing(5, vec![at(node_kv(2), 3)]));
        assert!(!own.taken_from(&view, None), "nothing written yet");
        assert!(
            !own.taken_from(&view, Some(6)),
            "the write at 6 not seen yet"
        );
        view.apply(WatchEvent::Put(at(kv("/h/n1", &value), 6)));
        assert!(
            !own.taken_from(&view, Some(6)),
            "the write seen, as written"
        );
        view.apply(WatchEvent::Delete {
            key: b"/h/n1".to_vec(),
            revision: 7,
        });
        assert!(own.taken_from(&view, Some(6)), "deleted after the write");
        let changed = record("n1", "198.18.0.11", "198.18.64.9");
        view.apply(WatchEvent::Put(at(kv("/h/n1", &changed), 8)));
        assert!(own.taken_from(&view, Some(6)), "changed after the write");
        assert!(
            !own.taken_from(&view, Some(9)),
            "written back at 9, not seen yet"
        );
        view.apply(listing(9, vec![at(kv("/h/n1", &value), 9)]));
        assert!(
            !own.taken_from(&view, Some(9)),
            "a listing at 9 holds the write"
        );
        // An event older than the listing (none comes, but a stale one
        // would) leaves the view at the listing's revision.
        view.apply(WatchEvent::Delete {
            key: b"/h/n2".to_vec(),
            revision: 4,
        });
        assert_eq!(view.revision.at, 9);
        // etcd's history went back (restored from an older backup) with
        // the lease kept: the write at 9 is not to be waited for.
        view.apply(listing(4, vec![at(node_kv(2), 3)]));
        assert!(
            own.taken_from(&view, Some(9)),
            "gone in a history gone back"
        );
        view.apply(listing(6, vec![at(kv("/h/n1", &value), 5)]));
        assert!(!own.taken_from(&view, Some(9)), "held as written");
        assert!(!view.revision.went_back, "a listing past the last one");
    }

    /// A write-back names whose write it undoes, from the lease the watch
    /// saw this node's key written under: another lease is most likely
    /// another agent under this node's name. Its warning is said once a
    /// minute for each kind of writer (every other lease is one kind),
    /// with the write-backs since, not at every write-back.
    #[test]
    fn a_write_back_names_the_lease_it_undoes_and_says_so_once_a_minute() {
        let mut view = View::new("/h/", Duration::from_secs(60), usize::MAX, "/h/n1");
        let under = |lease| {
            let mut e = node_kv(1);
            e.lease = lease;
            e
        };
        let listing = |entries, first, last| WatchEvent::Snapshot {
            revision: 5,
            entries,
            first,
            last,
        };
        view.apply(listing(vec![under(0xabc), node_kv(2)], true, true));
        assert_eq!(view.own_lease, Some(0xabc));
        // A listing's lease counts once the listing is whole.
        view.apply(listing(vec![node_kv(2)], true, false));
        view.apply(listing(vec![under(0xdef)], false, false));
        assert_eq!(view.own_lease, Some(0xabc), "not yet");
        view.apply(listing(vec![node_kv(3)], false, true));
        assert_eq!(view.own_lease, Some(0xdef));
        view.apply(listing(vec![node_kv(2)], true, true));
        assert_eq!(view.own_lease, None, "absent from the listing");
        view.apply(WatchEvent::Put(under(0x123)));
        assert_eq!(view.own_lease, Some(0x123));
        view.apply(WatchEvent::Put(node_kv(2)));
        assert_eq!(view.own_lease, Some(0x123), "another key's lease");
        let by = Writer::of(view.own_lease, Some(0x777));
        assert_eq!(by, Writer::Lease(0x123));
        let said = by.to_string();
        assert!(
            said.contains("lease 123") && said.contains("another agent"),
            "{said}"
        );
        assert_eq!(Writer::of(Some(0x777), Some(0x777)), Writer::OwnLease);
        assert_eq!(Writer::of(Some(0), Some(0x777)), Writer::NoLease);
        assert_eq!(Writer::of(Some(0), None), Writer::NoLease);
        view.apply(WatchEvent::Delete {
            key: b"/h/n1".to_vec(),
            revision: 6,
        });
        assert_eq!(view.own_lease, None);
        assert_eq!(Writer::of(view.own_lease, Some(0x777)), Writer::Deleted);

        let mut rewrites = Rewrites::default();
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        assert_eq!(rewrites.said(by, at(0)), Some(0), "said at once");
        assert_eq!(rewrites.said(by, at(5)), None);
        // Another lease is the same kind of writer: counted, not said.
        assert_eq!(rewrites.said(Writer::Lease(0x456), at(10)), None);
        assert_eq!(rewrites.said(by, at(60)), Some(2), "a minute on, counted");
        assert_eq!(rewrites.said(by, at(65)), None);
        // Another kind is said at once, and each keeps its own count.
        assert_eq!(rewrites.said(Writer::Deleted, at(70)), Some(0));
        assert_eq!(rewrites.said(Writer::Deleted, at(75)), None);
        assert_eq!(rewrites.said(by, at(80)), None);
        assert_eq!(rewrites.said(by, at(120)), Some(2));
        assert_eq!(rewrites.said(Writer::Deleted, at(130)), Some(1));
    }

    /// This node's record, changed or deleted by someone else, counts as
    /// this agent wrote it: the forgery takes no other node's address and
    /// the node stays in its own set until the record is written back.
    #[test]
    fn a_forged_own_record_counts_as_this_agent_wrote_it() {
        let me = Node::from(
            serde_json::from_value::<NodeRecord>(record("n1", "198.18.0.11", "198.18.64.2"))
                .expect("a record"),
        );
        let node_2 = kv("/h/node-2", &record("node-2", "198.18.0.12", "198.18.66.2"));
        // At n1's key: n1, with node-2's node address and another health
        // address.
        let forged = kv("/h/n1", &record("n1", "198.18.0.12", "198.18.64.9"));
        let snapshot =
            |entries: Vec<Entry>, own: Option<&Node>| nodes_with_own(entries, "/h/", own);
        // Without its own record to stand for it, the forgery wins.
        let got = snapshot(vec![node_2.clone(), forged.clone()], None);
        assert_eq!(outcome(&got).0, ["n1"]);
        // With it, n1 is as written and node-2 keeps its address.
        let got = snapshot(vec![node_2.clone(), forged], Some(&me));
        let (kept, rejected) = outcome(&got);
        assert_eq!(kept, ["n1", "node-2"]);
        assert!(rejected.is_empty(), "{rejected:?}");
        assert_eq!(got.nodes.get("n1"), Some(&me));
        // Deleted: still in its own set.
        let got = snapshot(
            vec![
                kv("/h/a", &record("a", "198.18.0.13", "198.18.67.2")),
                node_2,
            ],
            Some(&me),
        );
        assert_eq!(outcome(&got).0, ["a", "n1", "node-2"]);
        assert_eq!(got.nodes.get("n1"), Some(&me));
    }

    #[test]
    fn records_decode_and_garbage_is_rejected_by_key() {
        let got = nodes_from(
            vec![
                kv("/h/n1", &record("n1", "198.18.0.11", "198.18.64.2")),
                raw("/h/bad", "not json"),
                kv("/h/n2", &record("n2", "198.18.0.12", "198.18.65.2")),
            ],
            "/h/",
        );
        let (kept, rejected) = outcome(&got);
        assert_eq!(kept, ["n1", "n2"]);
        assert_eq!(rejected.len(), 1, "{rejected:?}");
        assert!(
            rejected[0].starts_with("etcd key \"/h/bad\": the value is not a node record: "),
            "{rejected:?}"
        );
        assert_eq!(nodes_from(Vec::new(), "/h/"), Validated::default());
    }

    #[test]
    fn ipv6_records_decode_and_bad_ones_are_rejected_by_key() {
        let v6 = json!({"name": "v6", "node_ip6": "2001:2::12", "health_ip6": "2001:2:0:41::2"});
        let mixed =
            json!({"name": "mixed", "node_ip6": "198.18.0.13", "health_ip6": "2001:2:0:42::2"});
        let half = json!({"name": "half", "node_ip": "198.18.0.14", "health_ip": "198.18.67.2", "node_ip6": "2001:2::14"});
        let got = nodes_from(
            vec![
                kv("/h/half", &half),
                kv("/h/mixed", &mixed),
                kv("/h/v6", &v6),
            ],
            "/h/",
        );
        let (kept, rejected) = outcome(&got);
        assert_eq!(kept, ["v6"]);
        assert_eq!(
            got.nodes.get("v6").and_then(|n| n.health_ip6),
            Some("2001:2:0:41::2".parse().expect("ip"))
        );
        assert!(
            rejected[0].starts_with("etcd key \"/h/half\": node-ip6 without health-ip6"),
            "{rejected:?}"
        );
        assert!(
            rejected[1].starts_with("etcd key \"/h/mixed\": the value is not a node record: ")
                && rejected[1].contains("IPv6"),
            "{rejected:?}"
        );
    }

    #[test]
    fn zones_are_kept() {
        let mut r = record("n2", "198.18.0.12", "198.18.65.2");
        r["zone"] = json!("rack-1");
        let got = nodes_from(vec![kv("/h/n2", &r)], "/h/");
        assert_eq!(
            got.nodes.get("n2").and_then(|n| n.zone.as_deref()),
            Some("rack-1")
        );
    }

    #[test]
    fn events_update_one_record_at_a_time() {
        let mut view = View::new("/h/", Duration::from_secs(60), usize::MAX, "/h/n1");
        view.apply(WatchEvent::Snapshot {
            revision: 5,
            first: true,
            last: true,
            entries: vec![
                kv("/h/n1", &record("n1", "198.18.0.11", "198.18.64.2")),
                kv("/h/n2", &record("n2", "198.18.0.12", "198.18.65.2")),
            ],
        });
        view.apply(WatchEvent::Put(kv(
            "/h/n3",
            &record("n3", "198.18.0.13", "198.18.66.2"),
        )));
        view.apply(WatchEvent::Put(kv(
            "/h/n2",
            &record("n2", "198.18.0.22", "198.18.65.2"),
        )));
        view.apply(WatchEvent::Delete {
            key: b"/h/n1".to_vec(),
            revision: 8,
        });
        let got = view.validated(&local());
        assert_eq!(outcome(&got).0, ["n2", "n3"]);
        assert_eq!(
            got.nodes
                .get("n2")
                .and_then(|n| n.node_ip)
                .map(|ip| ip.to_string()),
            Some("198.18.0.22".into())
        );
        // A new snapshot replaces everything.
        view.apply(WatchEvent::Snapshot {
            revision: 9,
            first: true,
            last: true,
            entries: vec![kv("/h/n1", &record("n1", "198.18.0.11", "198.18.64.2"))],
        });
        assert_eq!(outcome(&view.validated(&local())).0, ["n1"]);
    }

    #[test]
    fn each_rule_rejects_the_record_by_key_and_keeps_the_others() {
        let good = kv("/h/n1", &record("n1", "198.18.0.11", "198.18.64.2"));
        for (bad, needle) in [
            (
                kv("/h/n5", &record("n5", "127.0.0.1", "198.18.66.2")),
                "etcd key \"/h/n5\": node-ip 127.0.0.1 is loopback",
            ),
            (
                kv("/h/n5", &record("n5", "198.18.0.15", "0.0.0.0")),
                "etcd key \"/h/n5\": health-ip 0.0.0.0 is unspecified",
            ),
            (
                kv("/h/n5", &record("n5", "169.254.9.9", "198.18.66.2")),
                "node-ip 169.254.9.9 is link-local",
            ),
            (
                kv("/h/n5", &record("n5", "198.18.0.15", "239.1.1.1")),
                "health-ip 239.1.1.1 is multicast",
            ),
            (
                kv("/h/n5", &record("n5", "255.255.255.255", "198.18.66.2")),
                "limited broadcast",
            ),
            (
                kv("/h/n5", &record("n5", "198.18.0.15", "241.0.0.1")),
                "reserved (240.0.0.0/4)",
            ),
            (
                kv("/h/n5", &record("n5", "198.18.0.15", "198.18.64.77")),
                "etcd key \"/h/n5\": health-ip 198.18.64.77 is inside this node's health CIDR 198.18.64.0/24",
            ),
            (
                kv("/h/n5", &record("other", "198.18.0.15", "198.18.66.2")),
                "etcd key \"/h/n5\": a node record counts only at exactly <prefix><name>: \"other\" belongs at \"/h/other\"",
            ),
            (
                kv("/h/", &record("", "198.18.0.15", "198.18.66.2")),
                "etcd key \"/h/\": the name is empty",
            ),
            (
                kv("/h/a b", &record("a b", "198.18.0.15", "198.18.66.2")),
                "the name \"a b\" is not a node name",
            ),
            (
                kv("/h/n5", &record("n5", "198.18.0.11", "198.18.66.2")),
                "etcd key \"/h/n5\": node-ip 198.18.0.11 is already the node-ip of node \"n1\" at etcd key \"/h/n1\", which is kept",
            ),
            (
                kv("/h/n5", &record("n5", "198.18.0.15", "198.18.0.11")),
                "health-ip 198.18.0.11 is already the node-ip of node \"n1\"",
            ),
        ] {
            let got = nodes_from(vec![good.clone(), bad], "/h/");
            let (kept, rejected) = outcome(&got);
            assert_eq!(kept, ["n1"], "{needle}");
            assert_eq!(rejected.len(), 1, "{rejected:?}");
            assert!(
                rejected[0].contains(needle),
                "{} lacks {needle:?}",
                rejected[0]
            );
        }
    }

    #[test]
    fn a_record_counts_only_at_exactly_the_prefix_and_its_name() {
        // A prefix without a trailing '/': the agent registers `<prefix><name>`.
        let got = nodes_from(
            vec![
                kv(
                    "/health/nodesn1",
                    &record("n1", "198.18.0.11", "198.18.64.2"),
                ),
                kv(
                    "/health/nodesn2",
                    &record("n2", "198.18.0.12", "198.18.65.2"),
                ),
                kv(
                    "/health/nodesx/n3",
                    &record("n3", "198.18.0.13", "198.18.66.2"),
                ),
                kv(
                    "/health/nodesn4",
                    &record("nodesn4", "198.18.0.14", "198.18.67.2"),
                ),
            ],
            "/health/nodes",
        );
        let (kept, rejected) = outcome(&got);
        assert_eq!(kept, ["n1", "n2"]);
        assert_eq!(
            rejected,
            [
                "etcd key \"/health/nodesn4\": a node record counts only at exactly <prefix><name>: \"nodesn4\" belongs at \"/health/nodesnodesn4\"",
                "etcd key \"/health/nodesx/n3\": a node record counts only at exactly <prefix><name>: \"n3\" belongs at \"/health/nodesn3\"",
            ]
        );
    }

    #[test]
    fn key_order_decides_nothing_and_this_node_wins() {
        // A record at a key that sorts first cannot take node-2's name or
        // address; two new claimants of one address both lose it.
        let got = nodes_from(
            vec![
                kv(
                    "/h/0/node-2",
                    &record("node-2", "198.18.0.99", "198.18.69.2"),
                ),
                kv("/h/a", &record("a", "198.18.0.12", "198.18.70.2")),
                kv("/h/node-2", &record("node-2", "198.18.0.12", "198.18.66.2")),
                kv("/h/0", &record("0", "198.18.0.11", "198.18.65.2")),
                kv("/h/n1", &record("n1", "198.18.0.11", "198.18.64.2")),
            ],
            "/h/",
        );
        let (kept, rejected) = outcome(&got);
        assert_eq!(kept, ["n1"]);
        assert_eq!(
            rejected,
            [
                "etcd key \"/h/0\": node-ip 198.18.0.11 is already the node-ip of node \"n1\" at etcd key \"/h/n1\", which is kept",
                "etcd key \"/h/0/node-2\": a node record counts only at exactly <prefix><name>: \"node-2\" belongs at \"/h/node-2\"",
                "etcd key \"/h/a\": node-ip 198.18.0.12 is also claimed as node-ip by node \"node-2\" at etcd key \"/h/node-2\": neither takes it",
                "etcd key \"/h/node-2\": node-ip 198.18.0.12 is also claimed as node-ip by node \"a\" at etcd key \"/h/a\": neither takes it",
            ]
        );
        // Once node-2 held its address (an agent that saw it first), the
        // newcomer at a key that sorts before it is the one refused.
        let mut view = View::new("/h/", Duration::from_secs(60), usize::MAX, "/h/n1");
        view.apply(WatchEvent::Snapshot {
            revision: 1,
            first: true,
            last: true,
            entries: vec![kv(
                "/h/node-2",
                &record("node-2", "198.18.0.12", "198.18.66.2"),
            )],
        });
        // Taken as the agent takes a set: its holders are the etcd
        // source's.
        let nodes = Nodes::new("etcd".into());
        view.publish("etcd", &local(), &nodes);
        assert_eq!(view.holders.len(), 2, "node-2's two addresses");
        view.apply(WatchEvent::Put(kv(
            "/h/a",
            &record("a", "198.18.0.12", "198.18.70.2"),
        )));
        let second = view.validated(&local());
        let (kept, rejected) = outcome(&second);
        assert_eq!(kept, ["node-2"]);
        assert_eq!(
            rejected,
            [
                "etcd key \"/h/a\": node-ip 198.18.0.12 is already the node-ip of node \"node-2\" at etcd key \"/h/node-2\", which is kept"
            ]
        );
        // node-2's record goes (a restart): the claim that waited for it
        // does not take its address in the same update, nor until its
        // hold ends.
        view.apply(WatchEvent::Delete {
            key: b"/h/node-2".to_vec(),
            revision: 3,
        });
        let third = view.validated(&local());
        let (kept, rejected) = outcome(&third);
        assert!(kept.is_empty(), "{kept:?}");
        assert_eq!(rejected.len(), 1, "{rejected:?}");
        assert!(
            rejected[0].contains("node-ip 198.18.0.12") && rejected[0].contains("node-2"),
            "{rejected:?}"
        );
    }

    #[test]
    fn unknown_fields_are_refused() {
        let got = nodes_from(
            vec![kv(
                "/h/n2",
                &json!({"name": "n2", "node_ip": "198.18.0.12", "health_ip": "198.18.65.2", "healt_ip6": "2001:2::1"}),
            )],
            "/h/",
        );
        let (kept, rejected) = outcome(&got);
        assert_eq!(kept, Vec::<&str>::new());
        assert!(
            rejected[0].starts_with(
                "etcd key \"/h/n2\": the value is not a node record: unknown field `healt_ip6`"
            ),
            "{rejected:?}"
        );
    }
}
