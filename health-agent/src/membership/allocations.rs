//! Health allocations: the health CIDRs an admin gave each node, one key a
//! node under a prefix beside the node records (`/health/nodes/` gives
//! `/health/allocations/`), which no node's etcd role may write.
//!
//! A node's role writes its own record, and so chooses the health address
//! in it; the health range alone says which addresses it may choose, so a
//! node could take one no node holds yet (a node not yet registered) and
//! have every agent route it through itself. With `--kvstore-allocations`,
//! a peer's health address counts only inside its node's allocation: the
//! admin, not the node, says which health addresses are a node's.
//!
//! An allocation is `{"health_cidr": "198.18.64.0/24", "health_cidr6":
//! "2001:2:0:40::/64"}` (either or both) at `<allocations><name>`. A key
//! that is not exactly the prefix and a node name is no allocation; a
//! value that does not decode, a CIDR that is not a network, or one
//! outside the cluster's health range of its family is refused, and so
//! are two allocations that overlap (`overlap.rs`): a record of such a node
//! is refused naming why. With allocations the health range holds health
//! addresses alone: a peer's node address inside it is refused too, so no
//! node can hold an allocated address under another field. At most
//! `--max-nodes` allocations are held.

use std::{collections::HashMap, fmt, net::IpAddr, str::FromStr};

use ipnet::{Ipv4Net, Ipv6Net};
use serde::Deserialize;

use super::{
    Node,
    kvstore::{Listing, WatchEvent},
    record::{Field, LocalNode, Rule, clip},
    validate::check_name,
};

/// The largest value read as an allocation: one is under 100 bytes.
pub const MAX_ALLOCATION_BYTES: usize = 512;

/// An allocation as it is written in etcd: exactly these fields.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AllocationRecord {
    #[serde(default)]
    health_cidr: Option<String>,
    #[serde(default)]
    health_cidr6: Option<String>,
}

/// The health CIDRs allocated to one node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Allocation {
    pub cidr: Option<Ipv4Net>,
    pub cidr6: Option<Ipv6Net>,
}

impl fmt::Display for Allocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.cidr, self.cidr6) {
            (Some(c), Some(c6)) => write!(f, "{c} and {c6}"),
            (Some(c), None) => write!(f, "{c}"),
            (None, Some(c6)) => write!(f, "{c6}"),
            (None, None) => f.write_str("nothing"),
        }
    }
}

/// A network as written: `198.18.64.0/24`, never `198.18.64.9/24`.
fn network<N: FromStr + Copy + PartialEq + fmt::Display>(
    text: &str,
    field: &str,
    trunc: impl Fn(N) -> N,
) -> Result<N, String> {
    let net: N = text
        .parse()
        .map_err(|_| format!("{field} {:?} is not a CIDR", clip(text, 64)))?;
    if trunc(net) != net {
        return Err(format!(
            "{field} {net} is not a network (its network is {})",
            trunc(net)
        ));
    }
    Ok(net)
}

impl Allocation {
    /// The allocation a value says, checked against the cluster's health
    /// ranges in `local`; why not, in a sentence.
    ///
    /// # Errors
    /// The value is too large, does not decode, has no CIDR, or a CIDR is
    /// not a network or lies outside its family's health range.
    pub fn decode(value: &[u8], local: &LocalNode) -> Result<Self, String> {
        if value.len() > MAX_ALLOCATION_BYTES {
            return Err(format!(
                "the value is {} bytes, more than an allocation's {MAX_ALLOCATION_BYTES}",
                value.len()
            ));
        }
        let record: AllocationRecord = serde_json::from_slice(value)
            .map_err(|e| clip(&format!("the value is not an allocation: {e}"), 256))?;
        let cidr = record
            .health_cidr
            .as_deref()
            .map(|t| network(t, "health_cidr", |n: Ipv4Net| n.trunc()))
            .transpose()?;
        let cidr6 = record
            .health_cidr6
            .as_deref()
            .map(|t| network(t, "health_cidr6", |n: Ipv6Net| n.trunc()))
            .transpose()?;
        if cidr.is_none() && cidr6.is_none() {
            return Err(
                "it allocates nothing: an allocation has health_cidr, health_cidr6 or both".into(),
            );
        }
        if let (Some(c), Some(range)) = (cidr, local.health_range)
            && !range.contains(&c)
        {
            return Err(format!(
                "health_cidr {c} is outside the cluster's health range {range} (--health-range)"
            ));
        }
        if let (Some(c), Some(range)) = (cidr6, local.health_range6)
            && !range.contains(&c)
        {
            return Err(format!(
                "health_cidr6 {c} is outside the cluster's health range {range} (--health-range6)"
            ));
        }
        Ok(Self { cidr, cidr6 })
    }
}

mod overlap;

/// Every node's allocation (or why it was refused), by node name.
type ByName = HashMap<String, Result<Allocation, String>>;

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
    /// Each node whose allocation overlaps another's, with that other.
    overlaps: HashMap<String, String>,
    /// Every address allocated to a node.
    spans: overlap::Spans,
    /// `overlaps` is to be found again ([`Self::settle`]).
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
            overlaps: HashMap::new(),
            spans: overlap::Spans::default(),
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
    fn judged(&self, key: &str, value: &[u8]) -> Option<(String, Result<Allocation, String>)> {
        let name = self.name_of(key)?;
        Some((name.to_owned(), Allocation::decode(value, &self.local)))
    }

    /// Keeps an allocation in `map`, within the bound: whether it was.
    fn hold(
        map: &mut ByName,
        max: usize,
        (name, verdict): (String, Result<Allocation, String>),
    ) -> bool {
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

    /// Finds the overlapping allocations, and the addresses allocated,
    /// again after changes.
    pub fn settle(&mut self) {
        if std::mem::replace(&mut self.stale, false) {
            (self.overlaps, self.spans) = overlap::survey(&self.held);
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

    /// Whether `node`'s health addresses lie in its allocation, and its
    /// node addresses outside the health range and every allocation: the
    /// rule its record breaks if not.
    ///
    /// # Errors
    /// A health address outside the node's allocation, or the node has no
    /// allocation of that family, or its allocation was refused or
    /// overlaps another; a node address inside the health range or an
    /// allocation.
    pub fn check(&self, node: &Node) -> Result<(), Rule> {
        self.check_node_addresses(node)?;
        let fields = [
            node.health_ip.map(|ip| (Field::HealthIp, IpAddr::V4(ip))),
            node.health_ip6.map(|ip| (Field::HealthIp6, IpAddr::V6(ip))),
        ];
        for (field, ip) in fields.into_iter().flatten() {
            if let Some(reason) = self.outside(&node.name, ip) {
                return Err(Rule::Unallocated { field, ip, reason });
            }
        }
        Ok(())
    }

    /// A node address is never a health address: not inside the health
    /// range (where this agent has one of its family), nor inside any
    /// node's allocation (where it has none).
    fn check_node_addresses(&self, node: &Node) -> Result<(), Rule> {
        let in_range = [
            node.node_ip.and_then(|ip| {
                let range = self.local.health_range.filter(|r| r.contains(&ip))?;
                Some((
                    Field::NodeIp,
                    IpAddr::V4(ip),
                    range.to_string(),
                    "--health-range",
                ))
            }),
            node.node_ip6.and_then(|ip| {
                let range = self.local.health_range6.filter(|r| r.contains(&ip))?;
                Some((
                    Field::NodeIp6,
                    IpAddr::V6(ip),
                    range.to_string(),
                    "--health-range6",
                ))
            }),
        ];
        if let Some((field, ip, range, flag)) = in_range.into_iter().flatten().next() {
            return Err(Rule::Unallocated {
                field,
                ip,
                reason: format!(
                    "is inside the cluster's health range {range} ({flag}), which holds only allocated health addresses (--kvstore-allocations)"
                ),
            });
        }
        let allocated = [
            node.node_ip.map(|ip| (Field::NodeIp, IpAddr::V4(ip))),
            node.node_ip6.map(|ip| (Field::NodeIp6, IpAddr::V6(ip))),
        ];
        if let Some((field, ip)) = allocated
            .into_iter()
            .flatten()
            .find(|&(_, ip)| self.spans.cover(ip))
        {
            return Err(Rule::Unallocated {
                field,
                ip,
                reason: "is a health address allocated to a node (--kvstore-allocations), not a node address".into(),
            });
        }
        Ok(())
    }

    /// Why `ip` is not allocated to node `name`, if it is not.
    fn outside(&self, name: &str, ip: IpAddr) -> Option<String> {
        // The key is made only for a verdict: a validation of 50,000
        // records passes here once a record.
        let key = || format!("{}{name}", self.prefix);
        let allocation = match self.held.get(name) {
            None => {
                return Some(format!(
                    "is not allocated: no allocation at etcd key {:?} (--kvstore-allocations)",
                    key()
                ));
            }
            Some(Err(why)) => {
                return Some(format!(
                    "is not allocated: the allocation at etcd key {:?} is refused: {why}",
                    key()
                ));
            }
            Some(Ok(a)) => a,
        };
        if let Some(other) = self.overlaps.get(name) {
            return Some(format!(
                "is not allocated: the allocation at etcd key {:?} overlaps the one at {:?}, and neither counts",
                key(),
                format!("{}{other}", self.prefix)
            ));
        }
        let inside = match ip {
            IpAddr::V4(v4) => allocation.cidr.map(|c| c.contains(&v4)),
            IpAddr::V6(v6) => allocation.cidr6.map(|c| c.contains(&v6)),
        };
        match inside {
            Some(true) => None,
            Some(false) => Some(format!(
                "is outside the node's allocation {allocation} (etcd key {:?})",
                key()
            )),
            None => Some(format!(
                "is not allocated: the allocation at etcd key {:?} has no {}",
                key(),
                if ip.is_ipv4() {
                    "health_cidr"
                } else {
                    "health_cidr6"
                }
            )),
        }
    }

    /// This node's own record against its allocation: what is wrong, for
    /// a warning (its peers refuse its record while it holds).
    #[must_use]
    pub fn own_mismatch(&self, own: &Node) -> Option<String> {
        self.check(own)
            .err()
            .map(|rule| format!("this node's record is refused by its peers: {rule}"))
    }
}

#[cfg(test)]
mod tests;
