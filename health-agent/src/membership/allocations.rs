//! Health allocations: the health CIDRs, and the node addresses, an admin
//! gave each node, one key a node under a prefix beside the node records
//! (`/health/nodes/` gives `/health/allocations/`), which no node's etcd
//! role may write.
//!
//! A node's role writes its own record, and so chooses the addresses in
//! it; the health range alone says which health addresses it may choose,
//! so a node could take one no node holds yet (a node not yet registered)
//! and have every agent route it through itself, or take a node address
//! from the node that comes with it later. With `--kvstore-allocations`, a
//! peer's health address counts only inside its node's allocation, and a
//! node address an allocation names is that node's alone: the admin, not
//! the node, says which addresses are a node's.
//!
//! An allocation is `{"health_cidr": "198.18.64.0/24", "health_cidr6":
//! "2001:2:0:40::/64", "node_ip": "198.18.0.11", "node_ip6": "2001:2::11"}`
//! (any of them) at `<allocations><name>` (`decode.rs`). A key that is not
//! exactly the prefix and a node name is no allocation; a value that does
//! not decode is refused, and so are two allocations that overlap
//! (`overlap.rs`): a record of such a node is refused naming why
//! (`check.rs`). The node addresses a refused value still names are no
//! other node's: a slip elsewhere in it does not free them. With allocations the health range holds health addresses
//! alone: a peer's node address inside it is refused too, so no node can
//! hold an allocated address under another field. At most `--max-nodes`
//! allocations are held.

use std::collections::HashMap;

use super::{
    kvstore::{Listing, WatchEvent},
    record::LocalNode,
    validate::check_name,
};

mod check;
mod decode;
mod overlap;

pub use decode::{Allocation, MAX_ALLOCATION_BYTES};

/// A node's allocation as held: what it allocates, or why it was refused.
type Held = Result<Allocation, Refused>;

/// Every node's allocation (or why it was refused), by node name.
type ByName = HashMap<String, Held>;

/// An allocation refused: why, and the node addresses it names all the
/// same ([`Allocation::named_by_refused`]), which are no other node's.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Refused {
    why: String,
    names: Vec<std::net::IpAddr>,
}

/// Allocations against the most held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bound {
    /// Every allocation is held.
    Within,
    /// Some were left unheld.
    Past,
    /// Some were left unheld and a key has gone since: the prefix is to be
    /// read again.
    PastAndOneWent,
}

/// The allocations under a prefix, as its watch left them.
#[derive(Debug)]
pub struct Allocations {
    prefix: String,
    local: LocalNode,
    max: usize,
    held: ByName,
    /// A listing's pages, and whether allocations were left unheld past
    /// `max` in them.
    listing: Listing<(ByName, bool)>,
    /// A listing was applied since the watch last broke.
    synced: bool,
    /// Whether allocations were left unheld past `max` since the last
    /// listing.
    bound: Bound,
    /// The overlaps, the health addresses allocated and the node
    /// addresses named.
    survey: overlap::Survey,
    /// The allocations that count for nothing, as listed (the first
    /// [`super::record::MAX_REJECTED_SHOWN`]), and how many in all.
    uncounted: (Vec<super::record::RejectedRecord>, usize),
    /// `survey` is to be made again ([`Self::settle`]).
    stale: bool,
    watch_error: Option<String>,
}

impl Allocations {
    /// The allocations under `prefix`, checked against `local`'s health
    /// ranges, at most `max` of them held.
    #[must_use]
    pub fn new(prefix: String, local: LocalNode, max: usize) -> Self {
        Self {
            prefix,
            local,
            max,
            held: HashMap::new(),
            listing: Listing::default(),
            synced: false,
            bound: Bound::Within,
            survey: overlap::Survey::default(),
            uncounted: (Vec::new(), 0),
            stale: false,
            watch_error: None,
        }
    }

    /// A listing was applied since the watch last broke: records may be
    /// judged by what is held.
    #[must_use]
    pub const fn synced(&self) -> bool {
        self.synced
    }

    /// The node a key allocates to: exactly the prefix and a node name.
    fn name_of<'k>(&self, key: &'k str) -> Option<&'k str> {
        key.strip_prefix(self.prefix.as_str())
            .filter(|name| check_name(name).is_ok())
    }

    /// `key`'s allocation: its node's name and its verdict (`None`: the
    /// key is no allocation).
    fn judged(&self, key: &str, value: &[u8]) -> Option<(String, Held)> {
        let name = self.name_of(key)?;
        let verdict = Allocation::decode(value, &self.local).map_err(|why| Refused {
            why,
            names: Allocation::named_by_refused(value, &self.local),
        });
        Some((name.to_owned(), verdict))
    }

    /// Keeps an allocation in `map`, within the bound: whether it was.
    fn hold(map: &mut ByName, max: usize, (name, verdict): (String, Held)) -> bool {
        if map.len() >= max && !map.contains_key(&name) {
            return false;
        }
        map.insert(name, verdict);
        true
    }

    /// Applies a watch event; whether what is held changed (then
    /// [`Self::settle`] before judging records).
    pub fn apply(&mut self, ev: WatchEvent) -> bool {
        let changed = self.take(ev);
        self.stale |= changed;
        changed
    }

    /// Finds the overlapping allocations, the addresses allocated and the
    /// node addresses named again after changes.
    pub fn settle(&mut self) {
        if std::mem::replace(&mut self.stale, false) {
            self.survey = overlap::survey(&self.held);
            self.uncounted = self.list_uncounted();
        }
    }

    fn take(&mut self, ev: WatchEvent) -> bool {
        match ev {
            WatchEvent::Snapshot {
                entries,
                first,
                last,
                ..
            } => {
                let Some((mut page, mut over)) =
                    self.listing.page(first, || (HashMap::new(), false))
                else {
                    return false;
                };
                for e in &entries {
                    if let Some(judged) = self.judged(&e.key_str(), &e.value) {
                        over |= !Self::hold(&mut page, self.max, judged);
                    }
                }
                let Some((whole, over)) = self.listing.after_page((page, over), last) else {
                    return false;
                };
                self.held = whole;
                self.bound = if over { Bound::Past } else { Bound::Within };
                self.synced = true;
                self.watch_error = None;
                true
            }
            WatchEvent::Put(e) => {
                let Some(judged) = self.judged(&e.key_str(), &e.value) else {
                    return false;
                };
                if !Self::hold(&mut self.held, self.max, judged) && self.bound == Bound::Within {
                    self.bound = Bound::Past;
                }
                true
            }
            WatchEvent::Delete { key, .. } => {
                let key = String::from_utf8_lossy(&key);
                if let Some(name) = self.name_of(&key) {
                    self.held.remove(name);
                }
                if self.bound == Bound::Past {
                    self.bound = Bound::PastAndOneWent;
                }
                true
            }
            WatchEvent::Lost { error } => {
                self.synced = false;
                self.listing.abandon();
                self.watch_error = Some(crate::util::errors::chain(&*error));
                false
            }
        }
    }

    /// The allocations that count for nothing (refused, or overlapping
    /// another), by name: the first ones listed, and how many in all.
    #[must_use]
    pub fn uncounted(&self) -> (Vec<super::record::RejectedRecord>, usize) {
        (self.uncounted.0.clone(), self.uncounted.1)
    }

    /// Whether the prefix is to be read again (allocations went unheld and
    /// a key has gone since); asking clears it.
    pub fn take_reread(&mut self) -> bool {
        let went = self.bound == Bound::PastAndOneWent;
        if went {
            self.bound = Bound::Past;
        }
        went
    }

    /// What is wrong with the allocations as a whole, for the status.
    #[must_use]
    pub fn error(&self) -> Option<String> {
        if let Some(e) = &self.watch_error {
            return Some(format!("the allocations under {}: {e}", self.prefix));
        }
        (self.bound != Bound::Within).then(|| {
            format!(
                "more allocations under {} than --max-nodes {}: the node set is refused whole until some go",
                self.prefix, self.max
            )
        })
    }
}

#[cfg(test)]
mod tests;
