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
        validate::check_name,
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
        let decoded = match self.key_refused(&e.key) {
            Some(reason) => Err(Refused::from(reason)),
            None => PublishedView::decode(&e.value).map_err(|e| Refused::from(e.to_string())),
        };
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
                let key = crate::util::text::clip(&e.key_str(), KEY_SHOWN);
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

    /// Why a value at `key` is refused before it is decoded: a view counts
    /// only at `<prefix><node>`, a node of the set (any valid name before
    /// the set is read), so values written at other keys cost no decode.
    fn key_refused(&self, key: &[u8]) -> Option<String> {
        let name = key
            .strip_prefix(self.prefix.as_bytes())
            .and_then(|n| std::str::from_utf8(n).ok());
        let node = match name {
            Some(n) if self.members.is_empty() => check_name(n).is_ok(),
            Some(n) => self.members.contains(n),
            None => false,
        };
        (!node).then(|| {
            format!(
                "a view counts only at {:?} followed by a node's name, and this key names no node",
                self.prefix
            )
        })
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
                    crate::util::text::clip(&v.assembler, KEY_SHOWN)
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
mod tests;
