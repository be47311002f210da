//! An agent's reading of the published view: the one prefix it watches
//! ([`super::published_view::view_prefix`]), where the elected assembler
//! writes its view at its own name on its election lease (one key; two
//! while the previous assembler's lease ends). Each value is checked
//! ([`PublishedView::decode`], at exactly `<prefix><assembler>`, not from
//! the future by more than two of this agent's own intervals, by a node
//! of the node set, at most [`MAX_VIEWS`] held, the oldest making room
//! for a newer one); a refused value is reported with its key and the
//! last good view kept (it goes stale). A view read before the node set
//! (at start) waits for it, [`MAX_VIEWS`] at most, and counts once the
//! set holds its assembler. The newest view held is shown,
//! newest by its time but never later than when it was read (a view dated
//! ahead does not outrank those written after it), and checked against
//! this agent's own rounds ([`super::contradiction`]) once per view.

use std::{collections::BTreeMap, time::Duration};

use tracing::{debug, warn};

use crate::{
    cluster::{
        contradiction::{Checker, Contradiction},
        published_view::{MAX_DECODED_BYTES, PublishedView},
        view_cell::{Assembly, ClusterReply},
    },
    membership::{
        NodeSet,
        kvstore::{Entry, Listing, WatchEvent},
    },
};

/// How far ahead of the local clock a view's time may be, beyond two of
/// this agent's intervals.
const FUTURE_SLACK_MS: u64 = 5_000;

/// The longest a view's interval is believed, as a multiple of this
/// agent's own, when its observations are weighed against the view (an
/// assembler that says it assembles once an hour would otherwise have
/// every failure of the last hour left out of the check).
const HOLD_INTERVALS: u64 = 2;

/// The most views held (one per key): a new one past it takes the place
/// of the oldest.
pub const MAX_VIEWS: usize = 16;

/// The most the views held may cost decoded together (by
/// [`PublishedView::cost`]), and again those waiting for the node set: a
/// new one past it takes the place of the oldest. Two of the largest a
/// reader takes, where [`MAX_VIEWS`] of them would be 384 MiB.
pub const HELD_DECODED_BYTES: usize = 2 * MAX_DECODED_BYTES;

/// How much of a refused view's key or assembler the log shows.
const KEY_SHOWN: usize = 512;

/// The view read last, and what this agent found against it.
#[derive(Debug)]
pub struct ViewReader {
    prefix: String,
    local: String,
    /// Each view held, and its rank: its time, or when it was read when
    /// that is earlier.
    by_key: Views,
    /// This agent's interval, ms: how far ahead a view may be dated.
    cadence_ms: u64,
    /// The assembler and time of the view last checked.
    checked: Option<(String, u64)>,
    contradictions: Vec<Contradiction>,
    contradictions_total: u64,
    /// Views refused since the start.
    pub refused: u64,
    /// Values of the views' keys skipped since the start, as of the last
    /// tick ([`super::view_inbox::ViewInbox::skipped`]).
    skipped: u64,
    /// The key and time of the last view this agent published itself: the
    /// watch's echo of an earlier one, read after it, is not taken.
    own: Option<(Vec<u8>, u64)>,
    /// Refusals not said yet: one is said at once, the rest of a tick
    /// counted and said at its end.
    unsaid: Unsaid,
    /// A listing under way: it replaces `by_key` once whole.
    listing: Listing<Views>,
    /// The node set: a view counts only from one of its nodes.
    members: NodeSet,
    /// Views refused only for their assembler not being in the node set,
    /// with their rank (at most [`MAX_VIEWS`]): at start the set is read
    /// after the views, and a view waits here for its assembler's record.
    waiting: Views,
}

/// Makes room in `views` for a view at `key` ranked `ranked` (its rank,
/// then its time) that costs `cost` decoded: while the others number
/// [`MAX_VIEWS`], or they and it would cost more than
/// [`HELD_DECODED_BYTES`], the oldest goes, unless the newcomer is older
/// than it (then `false`, and nothing goes). Views no one renews so never
/// keep a new leader's out.
fn make_room(views: &mut Views, key: &[u8], ranked: (u64, u64), cost: usize) -> bool {
    // The others, newest first: the oldest is the last.
    let mut others: Vec<((u64, u64), &[u8], usize)> = views
        .iter()
        .filter(|(k, _)| k.as_slice() != key)
        .map(|(k, (v, rank, c))| ((*rank, v.at_ms), k.as_slice(), *c))
        .collect();
    others.sort_unstable_by_key(|o| std::cmp::Reverse(o.0));
    let mut held: usize = others.iter().map(|o| o.2).sum();
    let mut gone = Vec::new();
    while others.len() >= MAX_VIEWS || held.saturating_add(cost) > HELD_DECODED_BYTES {
        match others.pop() {
            Some((older, k, c)) if older <= ranked => {
                held -= c;
                gone.push(k.to_vec());
            }
            _ => return false,
        }
    }
    for k in gone {
        views.remove(&k);
    }
    true
}

/// Why a view was refused, and whether only because its assembler is not
/// in the node set (which, at start, may not be read yet).
struct Refused {
    reason: String,
    /// The view, refused only for its assembler not being in the node set.
    not_a_node: Option<Box<PublishedView>>,
}

impl From<String> for Refused {
    fn from(reason: String) -> Self {
        Self {
            reason,
            not_a_node: None,
        }
    }
}

/// The refusals of a tick: whether one was said, and how many more came,
/// the first of them with its key and reason.
#[derive(Debug, Default)]
struct Unsaid {
    said: bool,
    refused: u64,
    first: Option<String>,
}

/// Views by key, each with its rank and its cost decoded.
type Views = BTreeMap<Vec<u8>, (PublishedView, u64, usize)>;

impl ViewReader {
    /// The reader of the views under `prefix` for the agent `local`, whose
    /// interval is `cadence`.
    #[must_use]
    pub fn new(prefix: String, local: String, cadence: Duration) -> Self {
        Self {
            prefix,
            local,
            by_key: BTreeMap::new(),
            cadence_ms: millis(cadence),
            checked: None,
            contradictions: Vec::new(),
            contradictions_total: 0,
            refused: 0,
            skipped: 0,
            own: None,
            unsaid: Unsaid::default(),
            listing: Listing::default(),
            members: NodeSet::default(),
            waiting: BTreeMap::new(),
        }
    }

    /// The node set changed: views are taken from its nodes only (those
    /// of assemblers that left go with them), and a view waiting for its
    /// assembler's record counts once it is in. Returns whether the views
    /// held changed.
    pub fn set_members(&mut self, members: NodeSet) -> bool {
        self.members = members;
        let held = self.by_key.len();
        self.drop_departed();
        let promoted = self.promote();
        promoted || self.by_key.len() != held
    }

    /// Drops the views of assemblers not in the node set (an empty set is
    /// one not read yet, which drops nothing).
    fn drop_departed(&mut self) {
        if !self.members.is_empty() {
            let members = &self.members;
            self.by_key
                .retain(|_, (v, _, _)| members.contains(&v.assembler));
        }
    }

    /// Takes the views waiting for the node set once it is read: those of
    /// its nodes as if read now (the oldest held making room, as for any
    /// view), the others dropped. Returns whether one was taken.
    fn promote(&mut self) -> bool {
        if self.members.is_empty() || self.waiting.is_empty() {
            return false;
        }
        let mut taken = false;
        for (key, (v, rank, cost)) in std::mem::take(&mut self.waiting) {
            if !self.members.contains(&v.assembler) {
                continue;
            }
            if make_room(&mut self.by_key, &key, (rank, v.at_ms), cost) {
                self.by_key.insert(key, (v, rank, cost));
                taken = true;
            }
        }
        taken
    }

    /// This agent's interval changed (a reload): views are judged by it.
    pub fn set_cadence(&mut self, cadence: Duration) {
        self.cadence_ms = millis(cadence);
    }

    /// The view shown and its key: the newest held, by rank.
    #[must_use]
    pub fn current(&self) -> Option<(&[u8], &PublishedView)> {
        self.by_key
            .iter()
            .max_by_key(|(_, (v, rank, _))| (*rank, v.at_ms))
            .map(|(k, (v, _, _))| (k.as_slice(), v))
    }

    /// Takes an event of the watch on the views' prefix.
    pub fn apply(&mut self, event: WatchEvent, now_ms: u64) {
        match event {
            // A listing's pages replace the views together, at its last.
            WatchEvent::Snapshot {
                entries,
                first,
                last,
                ..
            } => {
                let Some(mut listing) = self.listing.page(first, BTreeMap::new) else {
                    return;
                };
                if first {
                    self.waiting.clear();
                }
                for e in &entries {
                    self.put_in(&mut listing, e, now_ms);
                }
                if let Some(whole) = self.listing.after_page(listing, last) {
                    self.by_key = whole;
                    // Its first pages may predate a change of the set.
                    self.drop_departed();
                    self.promote();
                }
            }
            WatchEvent::Put(e) => self.put(&e, now_ms),
            // Its assembler's election lease ended (or it was deleted).
            WatchEvent::Delete { key, .. } => {
                self.by_key.remove(&key);
                self.waiting.remove(&key);
            }
            // The views held go stale until the watch is back.
            WatchEvent::Lost { .. } => self.listing.abandon(),
        }
    }

    /// Checks and takes a value under the prefix: the last good view at
    /// that key stays when it is refused.
    pub fn put(&mut self, e: &Entry, now_ms: u64) {
        let mut held = std::mem::take(&mut self.by_key);
        self.put_in(&mut held, e, now_ms);
        self.by_key = held;
    }

    /// [`Self::put`] into `into`: the views held, or a listing's. A
    /// listing keeps the last good view at a key whose value it refuses.
    fn put_in(&mut self, into: &mut Views, e: &Entry, now_ms: u64) {
        let decoded = PublishedView::decode(&e.value).map_err(|e| Refused::from(e.to_string()));
        if let (Some((key, at_ms)), Ok(v)) = (&self.own, &decoded)
            && *key == e.key
            && v.at_ms < *at_ms
        {
            // The echo of an earlier view of this agent's own, read after
            // a later one was published.
            return;
        }
        match decoded.and_then(|v| self.check(into, &e.key, v, now_ms)) {
            Ok((v, cost)) => {
                let rank = v.at_ms.min(now_ms);
                into.insert(e.key.clone(), (v, rank, cost));
                self.waiting.remove(&e.key);
            }
            Err(Refused { reason, not_a_node }) => {
                // Before the node set is read (at start), a view of one of
                // its nodes waits for it; after, it is refused.
                let quiet = not_a_node.is_some() && self.members.is_empty();
                match not_a_node {
                    Some(v) if quiet => self.wait_for_its_node(e.key.clone(), *v, now_ms),
                    _ => {
                        self.waiting.remove(&e.key);
                    }
                }
                if let Some(good) = self.by_key.get(&e.key)
                    && !into.contains_key(&e.key)
                    && make_room(into, &e.key, (good.1, good.0.at_ms), good.2)
                {
                    into.insert(e.key.clone(), good.clone());
                }
                self.refused += 1;
                let key = crate::membership::record::clip(&e.key_str(), KEY_SHOWN);
                if quiet {
                    // The node set is not read yet (at start): the view
                    // waits for it.
                    debug!("cluster view: the published view at {key:?} came before the node set");
                } else if self.unsaid.said {
                    // Said at the tick's end, with a count.
                    self.unsaid.refused += 1;
                    self.unsaid.first.get_or_insert_with(|| {
                        format!("the published view at {key:?} was refused: {reason}")
                    });
                } else {
                    self.unsaid.said = true;
                    warn!(
                        "cluster view: the published view at {key:?} was refused and the last good one kept: {reason}"
                    );
                }
            }
        }
    }

    /// Checks `v`, read at `key`, against the rules, making room for it in
    /// `into`; returns it with what it costs decoded.
    fn check(
        &self,
        into: &mut Views,
        key: &[u8],
        v: PublishedView,
        now_ms: u64,
    ) -> Result<(PublishedView, usize), Refused> {
        if key.strip_prefix(self.prefix.as_bytes()) != Some(v.assembler.as_bytes()) {
            return Err(Refused::from(format!(
                "a view counts only at exactly <prefix><assembler>: {:?} belongs at {:?}",
                v.assembler,
                format!("{}{}", self.prefix, v.assembler)
            )));
        }
        let limit = self
            .cadence_ms
            .saturating_mul(2)
            .saturating_add(FUTURE_SLACK_MS);
        let ahead = v.ahead_ms(now_ms);
        if ahead > limit {
            return Err(Refused::from(format!(
                "its time is {ahead} ms ahead of this node's clock (at most {limit} ms)"
            )));
        }
        if !self.members.contains(&v.assembler) {
            return Err(Refused {
                reason: format!(
                    "its assembler {:?} is not in the node set",
                    crate::membership::record::clip(&v.assembler, KEY_SHOWN)
                ),
                not_a_node: Some(Box::new(v)),
            });
        }
        let cost = v.cost();
        if !make_room(into, key, (v.at_ms.min(now_ms), v.at_ms), cost) {
            return Err(Refused::from(format!(
                "the views held (at most {MAX_VIEWS}, {} MiB decoded) are each newer than this one",
                HELD_DECODED_BYTES >> 20
            )));
        }
        Ok((v, cost))
    }

    /// Keeps `v`, refused for its assembler not being in the node set, to
    /// count once it is: the oldest waiting makes room.
    fn wait_for_its_node(&mut self, key: Vec<u8>, v: PublishedView, now_ms: u64) {
        let (rank, cost) = (v.at_ms.min(now_ms), v.cost());
        if make_room(&mut self.waiting, &key, (rank, v.at_ms), cost) {
            self.waiting.insert(key, (v, rank, cost));
        }
    }

    /// Takes a view this agent published itself, at `key`.
    pub fn published(&mut self, key: String, v: PublishedView) {
        let (key, rank, cost) = (key.into_bytes(), v.at_ms, v.cost());
        self.own = Some((key.clone(), v.at_ms));
        if make_room(&mut self.by_key, &key, (rank, v.at_ms), cost) {
            self.by_key.insert(key, (v, rank, cost));
        }
    }

    /// Checks the view held against this agent's own rounds (at each of
    /// them: an observation may come to hold after the view arrived); a
    /// contradiction is logged and counted once per view.
    pub fn check_contradictions(&mut self, checker: &Checker) {
        let Some((_, v)) = self.current() else {
            return;
        };
        let (id, round) = ((v.assembler.clone(), v.at_ms), v.round);
        let found = if v.assembler == self.local {
            Vec::new()
        } else {
            checker.check(&self.local, v, self.believed_interval(v))
        };
        let same_view = self.checked.as_ref() == Some(&id);
        let new: Vec<&Contradiction> = found
            .iter()
            .filter(|c| !same_view || !self.contradictions.contains(c))
            .collect();
        if let Some(first) = new.first() {
            self.contradictions_total += new.len() as u64;
            warn!(
                assembler = %id.0,
                round,
                count = new.len(),
                "cluster view: the published view contradicts this agent's rounds (first: {} is {:?} in the view; this agent {})",
                first.node,
                first.published,
                first.here
            );
        }
        self.contradictions = found;
        self.checked = Some(id);
    }

    /// At the end of a tick: says how many views were refused since the
    /// one said at once, and how many changes of the views' keys were
    /// `replaced` before they were read (see
    /// [`super::view_inbox::ViewInbox::to_say`]): a node rewriting its
    /// view key in a loop is said once a tick at most, not once a write.
    pub fn report_refused(&mut self, replaced: Option<u64>, skipped: u64) {
        self.skipped = skipped;
        let unsaid = std::mem::take(&mut self.unsaid);
        if let Some(first) = unsaid.first {
            warn!(
                refused = unsaid.refused,
                "cluster view: more published views refused since the last said, the last good ones kept (first: {first})"
            );
        }
        if let Some(replaced) = replaced {
            warn!(
                skipped = replaced,
                "cluster view: published views rewritten faster than they are read (at most one batch every {} ms), only the last of each taken: a node writing its view key in a loop?",
                super::view_inbox::MIN_GAP.as_millis()
            );
        }
    }

    /// The interval `v` says it is assembled at, believed up to
    /// [`HOLD_INTERVALS`] of this agent's own.
    fn believed_interval(&self, v: &PublishedView) -> u64 {
        v.interval_ms
            .min(self.cadence_ms.saturating_mul(HOLD_INTERVALS))
    }

    /// Whether a view is held and current at `now_ms`.
    #[must_use]
    pub fn holds_current(&self, now_ms: u64) -> bool {
        self.current().is_some_and(|(_, v)| {
            !crate::cluster::published_view::is_stale(v.at_ms, self.believed_interval(v), now_ms)
        })
    }

    /// What the API serves at `now_ms`, if a view was read: stale two of
    /// its believed intervals after its time.
    #[must_use]
    pub fn reply(&self, now_ms: u64) -> Option<ClusterReply> {
        let (key, v) = self.current()?;
        let interval_ms = self.believed_interval(v);
        Some(ClusterReply {
            view: v.view.clone(),
            assembly: Some(Assembly {
                assembled_by: v.assembler.clone(),
                here: v.assembler == self.local,
                round: v.round,
                at_ms: v.at_ms,
                interval_ms,
                age_ms: v.age_ms(now_ms),
                stale: crate::cluster::published_view::is_stale(v.at_ms, interval_ms, now_ms),
                unlisted: v.unlisted,
                key: String::from_utf8_lossy(key).into_owned(),
            }),
            contradictions: self.contradictions.clone(),
            contradictions_total: self.contradictions_total,
            views_refused_total: self.refused,
            views_skipped_total: self.skipped,
        })
    }
}

/// `d` in ms.
#[must_use]
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::view::{ClusterView, VerdictCounts};

    fn value(at_ms: u64, assembler: &str) -> Vec<u8> {
        value_every(at_ms, assembler, 1_000)
    }

    /// A view of two healthy nodes, saying it is assembled every
    /// `interval_ms`.
    fn value_every(at_ms: u64, assembler: &str, interval_ms: u64) -> Vec<u8> {
        let view = ClusterView {
            plaintext_nodes: Vec::new(),
            reports: 2,
            ignored: 0,
            counts: VerdictCounts {
                healthy: 2,
                ..VerdictCounts::default()
            },
            nodes: Vec::new(),
        };
        PublishedView::of(assembler, 3, at_ms, interval_ms, &view).encode()
    }

    /// The reader of node `me`, in a node set of the tests' assemblers.
    fn reader() -> ViewReader {
        let mut r = ViewReader::new("/h/view/".into(), "me".into(), Duration::from_secs(1));
        let names: Vec<String> = ["a", "b", "c", "leader", "liar", "me"]
            .into_iter()
            .map(str::to_owned)
            .chain((0..=MAX_VIEWS).map(|i| format!("n{i:02}")))
            .chain((0..MAX_VIEWS + 4).map(|i| format!("z{i:02}")))
            .collect();
        r.set_members(NodeSet::named(
            &names.iter().map(String::as_str).collect::<Vec<_>>(),
        ));
        r
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
    fn a_refused_view_keeps_the_last_good_one_which_goes_stale() {
        let mut r = reader();
        let now = 1_000_000;
        r.apply(put("/h/view/leader", value(now, "leader")), now);
        let a = r
            .reply(now + 500)
            .and_then(|x| x.assembly)
            .expect("assembly");
        assert_eq!(
            (
                a.assembled_by.as_str(),
                a.here,
                a.stale,
                a.age_ms,
                a.key.as_str()
            ),
            ("leader", false, false, 500, "/h/view/leader")
        );
        assert!(r.holds_current(now + 500));
        // Garbage, a view from the future, a view at another's key:
        // refused, the good one kept.
        r.apply(put("/h/view/leader", b"\x01\x05junk!".to_vec()), now);
        r.apply(put("/h/view/liar", value(now + 7_001, "liar")), now);
        r.apply(put("/h/view/other", value(now + 1, "leader")), now);
        assert_eq!(r.refused, 3);
        assert_eq!(
            r.current().map(|(_, v)| v.assembler.as_str()),
            Some("leader")
        );
        // The first refusal of a tick is said at once, the others counted
        // and said at its end.
        assert!(r.unsaid.said);
        assert_eq!(r.unsaid.refused, 2);
        assert!(
            r.unsaid.first.as_deref().is_some_and(|f| f.starts_with(
                "the published view at \"/h/view/liar\" was refused: its time is 7001 ms ahead"
            )),
            "{:?}",
            r.unsaid.first
        );
        r.report_refused(None, 0);
        assert!(!r.unsaid.said && r.unsaid.refused == 0 && r.unsaid.first.is_none());
        // Two rounds on, the view held is stale, not current.
        let a = r
            .reply(now + 2_001)
            .and_then(|x| x.assembly)
            .expect("assembly");
        assert!(a.stale, "{a:?}");
        assert!(!r.holds_current(now + 2_001));
        // A newer view (a new assembler) is shown; this agent's own is
        // marked as such; the old one goes with its lease.
        r.apply(put("/h/view/me", value(now + 3_000, "me")), now + 3_000);
        let a = r
            .reply(now + 3_000)
            .and_then(|x| x.assembly)
            .expect("assembly");
        assert!(a.here && !a.stale, "{a:?}");
        assert!(r.holds_current(now + 3_000), "this agent's own counts too");
        r.apply(
            WatchEvent::Delete {
                key: b"/h/view/leader".to_vec(),
                revision: 9,
            },
            now,
        );
        assert_eq!(r.by_key.len(), 1);
    }

    /// A view of an assembler that leaves the node set goes with it.
    #[test]
    fn the_view_of_an_assembler_that_left_the_set_goes() {
        let mut r = reader();
        let now = 1_000_000;
        r.apply(put("/h/view/leader", value(now, "leader")), now);
        r.apply(put("/h/view/a", value(now - 10, "a")), now);
        assert_eq!(
            r.current().map(|(_, v)| v.assembler.as_str()),
            Some("leader")
        );
        assert!(r.set_members(NodeSet::named(&["a", "me"])), "changed");
        assert_eq!(r.current().map(|(_, v)| v.assembler.as_str()), Some("a"));
        assert_eq!(r.by_key.len(), 1);
        assert!(!r.set_members(NodeSet::named(&["a", "me"])), "unchanged");

        // A listing whose first page came before the leader left.
        let mut r = reader();
        let entry = |key: &str, value: Vec<u8>| Entry {
            key: key.as_bytes().to_vec(),
            value,
            mod_revision: 1,
            lease: 0,
        };
        let page = |entries, first, last| WatchEvent::Snapshot {
            revision: 1,
            entries,
            first,
            last,
        };
        let leader = entry("/h/view/leader", value(now, "leader"));
        r.apply(page(vec![leader], true, false), now);
        r.set_members(NodeSet::named(&["a", "me"]));
        let a = entry("/h/view/a", value(now - 10, "a"));
        r.apply(page(vec![a], false, true), now);
        assert_eq!(r.current().map(|(_, v)| v.assembler.as_str()), Some("a"));
        assert_eq!(r.by_key.len(), 1);
    }

    /// A listing's pages replace the views together: a view it did not
    /// list goes at its last page, one it lists refused keeps the last
    /// good one, and a listing holds at most as many as are held.
    #[test]
    fn a_listing_drops_at_its_last_page_the_views_it_did_not_list() {
        let mut r = reader();
        let now = 1_000_000;
        r.apply(put("/h/view/a", value(now, "a")), now);
        r.apply(put("/h/view/b", value(now, "b")), now);
        let page = |entries: Vec<(&str, Vec<u8>)>, first, last| WatchEvent::Snapshot {
            revision: 4,
            entries: entries
                .into_iter()
                .map(|(k, value)| Entry {
                    key: k.as_bytes().to_vec(),
                    value,
                    mod_revision: 4,
                    lease: 0,
                })
                .collect(),
            first,
            last,
        };
        r.apply(
            page(vec![("/h/view/a", b"junk".to_vec())], true, false),
            now,
        );
        assert_eq!(r.by_key.len(), 2, "nothing goes before the last page");
        r.apply(page(vec![("/h/view/c", value(now, "c"))], false, true), now);
        let mut keys: Vec<_> = r.by_key.keys().cloned().collect();
        keys.sort();
        assert_eq!(keys, [&b"/h/view/a"[..], b"/h/view/c"]);
        assert_eq!(r.refused, 1);
        // A listing is bounded on its own, whatever is held.
        let many: Vec<(String, Vec<u8>)> = (0..MAX_VIEWS + 4)
            .map(|i| (format!("/h/view/z{i:02}"), value(now, &format!("z{i:02}"))))
            .collect();
        let many = || many.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        r.apply(page(many(), true, false), now);
        assert_eq!(r.listing.under_way().map(BTreeMap::len), Some(MAX_VIEWS));
        assert_eq!(r.by_key.len(), 2, "held meanwhile");
        r.apply(page(Vec::new(), false, true), now);
        assert_eq!((r.by_key.len(), r.refused), (MAX_VIEWS, 1));
    }

    #[test]
    fn a_contradiction_is_counted_once_per_view_and_checked_at_each_round() {
        use crate::cluster::summary::{PathSample, PeerSummary, Summary};
        use crate::probe::path::ProbeResult;
        let own = |at_ms, state| {
            let p = PeerSummary::new("b", [PathSample::new(state, None); 4]);
            Summary::new("me".into(), 1, at_ms, vec![p]).expect("summary")
        };
        let mut r = reader();
        let mut checker = Checker::default();
        // The view (all healthy, of 10_000) arrives before this agent has
        // failed b for an interval: nothing yet.
        r.apply(put("/h/view/leader", value(10_000, "leader")), 10_000);
        checker.observe(&own(9_500, ProbeResult::Failure));
        r.check_contradictions(&checker);
        assert_eq!(r.contradictions_total, 0);
        // Since 9,000: a contradiction of the same view, counted once.
        checker.observe(&own(9_000, ProbeResult::Success));
        checker.observe(&own(9_000, ProbeResult::Failure));
        r.check_contradictions(&checker);
        r.check_contradictions(&checker);
        assert_eq!(r.contradictions_total, 1);
        let reply = r.reply(10_000).expect("reply");
        assert_eq!(reply.contradictions.len(), 1);
        assert_eq!(reply.contradictions[0].node, "b");
        // A new view saying the same: counted again.
        r.apply(put("/h/view/leader", value(11_000, "leader")), 11_000);
        r.check_contradictions(&checker);
        assert_eq!(r.contradictions_total, 2);
    }

    /// At start the views come before the node set: a view read then
    /// waits, and counts once its node is in; one of no node is dropped
    /// then, and once the set is read such a view waits for nothing.
    #[test]
    fn a_view_read_before_the_node_set_counts_once_its_node_is_in() {
        let mut r = ViewReader::new("/h/view/".into(), "me".into(), Duration::from_secs(1));
        let now = 1_000_000;
        r.apply(put("/h/view/leader", value(now, "leader")), now);
        r.apply(put("/h/view/stranger", value(now + 1, "stranger")), now + 1);
        assert!(r.current().is_none());
        assert_eq!(r.refused, 2);
        // A later value at a waiting key that is refused for another
        // reason drops the waiting one.
        r.apply(put("/h/view/other", value(now, "other")), now);
        assert_eq!(r.waiting.len(), 3);
        r.apply(put("/h/view/other", b"junk".to_vec()), now);
        assert_eq!(r.waiting.len(), 2, "the leader's and the stranger's");
        assert!(r.set_members(NodeSet::named(&["leader", "me"])));
        assert_eq!(
            r.current().map(|(_, v)| v.assembler.as_str()),
            Some("leader")
        );
        assert!(
            r.waiting.is_empty(),
            "the stranger's dropped once the set is in"
        );
        // Once the set is read, a view of no node waits for nothing.
        r.apply(put("/h/view/stranger", value(now + 3, "stranger")), now + 3);
        assert!(r.waiting.is_empty());
        assert!(!r.set_members(NodeSet::named(&["leader", "me", "stranger"])));
        assert_eq!(
            r.current().map(|(_, v)| v.assembler.as_str()),
            Some("leader")
        );
    }

    #[test]
    fn the_views_held_are_bounded() {
        let mut r = reader();
        for i in 0..=MAX_VIEWS {
            let name = format!("n{i:02}");
            r.apply(
                put(&format!("/h/view/{name}"), value(5 + i as u64, &name)),
                5 + i as u64,
            );
        }
        assert_eq!(r.by_key.len(), MAX_VIEWS);
        assert_eq!(r.refused, 0);
        assert!(
            !r.by_key.contains_key(&b"/h/view/n00"[..])
                && r.by_key.contains_key(&b"/h/view/n16"[..]),
            "the oldest made room for the newest"
        );
        // One older than every view held is refused.
        r.apply(put("/h/view/n00", value(4, "n00")), 30);
        assert_eq!(r.refused, 1);
        assert!(!r.by_key.contains_key(&b"/h/view/n00"[..]));
        // A view of no node is refused, however fresh.
        r.apply(put("/h/view/stranger", value(100, "stranger")), 100);
        assert_eq!(r.refused, 2);
        assert!(!r.by_key.contains_key(&b"/h/view/stranger"[..]));
        assert_eq!(r.current().map(|(_, v)| v.assembler.as_str()), Some("n16"));
    }

    /// The watch's echo of an earlier view of this agent's own, read after
    /// it published a later one, is not taken: the round shown never goes
    /// back.
    #[test]
    fn an_echo_of_an_earlier_own_view_is_not_taken() {
        let mut r = reader();
        let later = PublishedView::decode(&value(2_000, "me")).expect("a view");
        r.published("/h/view/me".into(), later);
        r.apply(put("/h/view/me", value(1_000, "me")), 2_500);
        assert_eq!(r.current().map(|(_, v)| v.at_ms), Some(2_000));
        assert_eq!(r.refused, 0, "not a refusal");
        // Its own echo, and another's older view, are taken.
        r.apply(put("/h/view/me", value(2_000, "me")), 2_500);
        r.apply(put("/h/view/a", value(1_500, "a")), 2_500);
        assert_eq!(r.by_key.len(), 2);
        assert_eq!(r.current().map(|(_, v)| v.at_ms), Some(2_000));
    }

    /// The views held are bounded by what they cost decoded too: the
    /// oldest make room for a newer one, an older one than every view
    /// held is refused with nothing let go, and a view replacing one at
    /// its key counts without it.
    #[test]
    fn the_views_held_are_bounded_in_bytes() {
        let half = HELD_DECODED_BYTES / 2;
        let view = |at: u64| PublishedView::decode(&value(at, "a")).expect("a view");
        let mut views = Views::new();
        for (key, at) in [("a", 10), ("b", 20)] {
            assert!(make_room(&mut views, key.as_bytes(), (at, at), half));
            views.insert(key.as_bytes().to_vec(), (view(at), at, half));
        }
        let keys = |views: &Views| views.keys().cloned().collect::<Vec<_>>();
        assert!(make_room(&mut views, b"b", (30, 30), half), "b replaced");
        assert_eq!(keys(&views), [b"a".to_vec(), b"b".to_vec()]);
        assert!(!make_room(&mut views, b"old", (5, 5), 1), "older than all");
        assert_eq!(views.len(), 2);
        assert!(make_room(&mut views, b"c", (30, 30), half));
        assert_eq!(keys(&views), [b"b".to_vec()], "the oldest went");
        views.insert(b"c".to_vec(), (view(30), 30, half));
        // One that takes the whole budget: every older one goes.
        assert!(make_room(&mut views, b"d", (40, 40), HELD_DECODED_BYTES));
        assert!(views.is_empty());
        // Many small ones: the count binds.
        for i in 0..MAX_VIEWS as u64 {
            views.insert(i.to_be_bytes().to_vec(), (view(50 + i), 50 + i, 1));
        }
        assert!(make_room(&mut views, b"e", (100, 100), 1));
        assert_eq!(views.len(), MAX_VIEWS - 1);
        assert!(!views.contains_key(&0u64.to_be_bytes()[..]));
    }

    /// A view dated ahead ranks as of when it was read, so the leader's
    /// next view, written after it, is shown; one dated further ahead
    /// than two of this agent's intervals is refused, whatever interval
    /// it claims; and a claim of a long interval does not put this agent's
    /// older observations out of the check. (Before, a view dated 55
    /// minutes ahead and claiming an hour's interval was shown for 55
    /// minutes, and contradicted by no failure of its last hour.)
    #[test]
    fn a_view_dated_ahead_does_not_outrank_those_written_after_it() {
        use crate::cluster::summary::{PathSample, PeerSummary, Summary};
        use crate::probe::path::ProbeResult;
        let hour = 3_600_000;
        let mut r = reader();
        let now = 1_000_000;
        r.apply(
            put("/h/view/liar", value_every(now + 3_000, "liar", hour)),
            now,
        );
        r.apply(
            put("/h/view/leader", value(now + 1_000, "leader")),
            now + 1_000,
        );
        assert_eq!(r.refused, 0);
        assert_eq!(
            r.current().map(|(_, v)| v.assembler.as_str()),
            Some("leader")
        );
        r.apply(
            put("/h/view/liar", value_every(now + 60_000, "liar", hour)),
            now + 1_000,
        );
        assert_eq!(r.refused, 1, "dated a minute ahead");
        // Its hour's interval is believed up to two of this agent's 1 s:
        // stale 4 s (two of those) after its time, not 2 hours.
        let shown = |r: &ViewReader, at| r.reply(at).and_then(|x| x.assembly).expect("assembly");
        let liar = r.by_key.get(&b"/h/view/liar"[..]).map(|(v, _, _)| v.at_ms);
        assert_eq!(liar, Some(now + 3_000));
        // The liar's view alone, all healthy, at now + 3 s: this agent has
        // failed every path to b since now - 5 s.
        r.apply(
            WatchEvent::Delete {
                key: b"/h/view/leader".to_vec(),
                revision: 2,
            },
            now + 1_000,
        );
        let failed = PeerSummary::new("b", [PathSample::new(ProbeResult::Failure, None); 4]);
        let mut checker = Checker::default();
        checker.observe(&Summary::new("me".into(), 1, now - 5_000, vec![failed]).expect("summary"));
        r.check_contradictions(&checker);
        assert_eq!(r.contradictions_total, 1, "b is healthy in the view");
        let believed = 2_000 * crate::cluster::published_view::STALE_ROUNDS;
        let a = shown(&r, now + 3_000 + believed);
        assert_eq!(
            (a.assembled_by.as_str(), a.interval_ms, a.stale),
            ("liar", 2_000, false)
        );
        assert!(shown(&r, now + 3_001 + believed).stale);
    }
}
