//! Who holds an address. Two records claiming one address are never decided
//! by their order (an etcd writer chooses its key, and so the order): the
//! node that held the address in the last good set keeps it, and when
//! neither claimant held it, neither takes it. With health allocations, a
//! claim they back comes before any hold (`validate::check_claims`): the
//! admin says whose the address is.
//!
//! [`Holders`] is that memory. Built from the last good set, a holder keeps
//! its addresses while it has a record; with etcd, a node whose record went
//! (a restart, a re-registration) keeps them for a while longer, so that no
//! other record can take them in between, and so does a node whose record
//! no longer claims one (a writer of the prefix who moves a node's record
//! away from an address, to claim it for another node in the next update,
//! takes it from no one: the node's agent writes its record back within
//! seconds, and takes the address back).

use std::{
    collections::HashMap,
    net::IpAddr,
    time::{Duration, Instant},
};

use super::NodeSet;

/// How an address is held.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Hold {
    /// By a node of the last good set: while it has a record.
    Present,
    /// By a node whose record went: until the instant given.
    Departed { until: Instant },
}

/// Who held each address, and how.
#[derive(Debug, Clone)]
pub struct Holders {
    held: HashMap<IpAddr, (String, Hold)>,
    /// A node of the last good set without a record in an update, or
    /// whose record no longer claims an address, holds its addresses (or
    /// that one) as one departing now (etcd: its record went or changed,
    /// and its hold begins once the update is taken). Without it (a nodes
    /// file), an edit may remove or move a node and give its addresses to
    /// another.
    departing: bool,
    /// The most addresses held by nodes without a record (or whose record
    /// gave them up): past it, the holds ending first end now, so that a
    /// writer who makes and deletes records in a loop holds no more.
    most_departed: usize,
}

impl Default for Holders {
    fn default() -> Self {
        Self {
            held: HashMap::new(),
            departing: false,
            most_departed: usize::MAX,
        }
    }
}

impl Holders {
    /// The holders of `set`'s addresses.
    #[must_use]
    pub fn of(set: &NodeSet) -> Self {
        let mut held = HashMap::with_capacity(set.len() * 2);
        for node in set.iter() {
            for ip in node.addresses() {
                held.insert(ip, (node.name.clone(), Hold::Present));
            }
        }
        Self {
            held,
            ..Self::default()
        }
    }

    /// `self`, where a holder without a record in an update keeps its
    /// addresses as one departing now (the etcd source's holders), at
    /// most `most` of them: the set's bound on nodes (`--max-nodes`) times
    /// their four addresses covers every node of a set leaving at once.
    #[must_use]
    pub const fn departing(mut self, most: usize) -> Self {
        self.departing = true;
        self.most_departed = most;
        self
    }

    /// The holders of `set` (the new good set), keeping for `hold` past
    /// `now` the addresses of nodes of `self` that are no longer in it
    /// (their record went, or was refused), and when departing, those
    /// nodes of `set` no longer claim.
    #[must_use]
    pub fn after(&self, set: &NodeSet, now: Instant, hold: Duration) -> Self {
        let mut next = Self {
            departing: self.departing,
            most_departed: self.most_departed,
            ..Self::of(set)
        };
        let mut departed = 0;
        for (ip, (name, how)) in &self.held {
            if next.held.contains_key(ip) || (!self.departing && set.get(name).is_some()) {
                continue;
            }
            let until = match how {
                Hold::Present => now + hold,
                Hold::Departed { until } if *until > now => *until,
                Hold::Departed { .. } => continue,
            };
            next.held
                .insert(*ip, (name.clone(), Hold::Departed { until }));
            departed += 1;
        }
        if departed > next.most_departed {
            next.end_first_holds(departed - next.most_departed);
        }
        next
    }

    /// Ends the `n` departed holds that end first.
    fn end_first_holds(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        let mut ends: Vec<(Instant, IpAddr)> = self
            .held
            .iter()
            .filter_map(|(ip, (_, how))| match how {
                Hold::Departed { until } => Some((*until, *ip)),
                Hold::Present => None,
            })
            .collect();
        let n = n.min(ends.len());
        ends.select_nth_unstable(n.saturating_sub(1));
        for (_, ip) in &ends[..n] {
            self.held.remove(ip);
        }
    }

    /// The holder of `ip`, and whether its hold lasts without a record.
    pub(super) fn holder(&self, ip: IpAddr, now: Instant) -> Option<(&str, bool)> {
        self.held.get(&ip).and_then(|(name, how)| match how {
            Hold::Present => Some((name.as_str(), self.departing)),
            Hold::Departed { until } => (*until > now).then_some((name.as_str(), true)),
        })
    }

    /// The same without the holds that ended by `now`.
    #[must_use]
    pub fn unexpired(&self, now: Instant) -> Self {
        let mut held = self.held.clone();
        held.retain(|_, (_, how)| match how {
            Hold::Present => true,
            Hold::Departed { until } => *until > now,
        });
        Self {
            held,
            departing: self.departing,
            most_departed: self.most_departed,
        }
    }

    /// When the first departed node's hold ends, if any does.
    #[must_use]
    pub fn next_expiry(&self) -> Option<Instant> {
        self.held
            .values()
            .filter_map(|(_, how)| match how {
                Hold::Departed { until } => Some(*until),
                Hold::Present => None,
            })
            .min()
    }

    /// Addresses held.
    #[must_use]
    pub fn len(&self) -> usize {
        self.held.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::membership::Node;

    fn set(nodes: &[(&str, u8)]) -> NodeSet {
        NodeSet::new(
            nodes
                .iter()
                .map(|(name, n)| {
                    Node::v4(
                        *name,
                        Ipv4Addr::new(198, 18, 0, *n),
                        Ipv4Addr::new(198, 18, 64 + n, 2),
                    )
                })
                .collect(),
        )
        .expect("unique")
    }

    fn ip(n: u8) -> IpAddr {
        IpAddr::V4(Ipv4Addr::new(198, 18, 0, n))
    }

    #[test]
    fn departed_holders_keep_their_addresses_for_the_hold_only() {
        let t0 = Instant::now();
        let hold = Duration::from_secs(60);
        let h = Holders::of(&set(&[("a", 1), ("b", 2)]));
        assert_eq!(h.len(), 4);
        assert_eq!(h.holder(ip(2), t0), Some(("b", false)));
        assert_eq!(h.next_expiry(), None);
        // b's record goes: its addresses are held for `hold`.
        let h = h.after(&set(&[("a", 1)]), t0, hold);
        assert_eq!(h.holder(ip(2), t0), Some(("b", true)));
        assert_eq!(h.next_expiry(), Some(t0 + hold));
        // A later update keeps the original end of the hold.
        let t1 = t0 + Duration::from_secs(30);
        let h = h.after(&set(&[("a", 1)]), t1, hold);
        assert_eq!(h.next_expiry(), Some(t0 + hold));
        assert_eq!(h.holder(ip(2), t0 + hold), None, "ended");
        let h = h.after(&set(&[("a", 1)]), t0 + hold, hold);
        assert_eq!(h.len(), 2, "forgotten once the hold ended");
        // b back with the same addresses: held again as present.
        let h = h.after(&set(&[("a", 1), ("b", 2)]), t1, hold);
        assert_eq!(h.holder(ip(2), t1), Some(("b", false)));
    }

    /// A writer who makes records and deletes them in a loop makes holds
    /// of their addresses: past the bound, those ending first end.
    #[test]
    fn departed_holds_are_bounded_the_first_to_end_going_first() {
        let t0 = Instant::now();
        let hold = Duration::from_secs(60);
        let mut h = Holders::of(&set(&[("a", 1)])).departing(4);
        for (k, n) in (10..16).enumerate() {
            let at = t0 + Duration::from_secs(u64::try_from(k).expect("small"));
            h = h.after(&set(&[("a", 1), ("x", n)]), at, hold);
            h = h.after(&set(&[("a", 1)]), at, hold);
        }
        assert_eq!(h.len(), 2 + 4, "a's two and four departed");
        assert_eq!(h.holder(ip(1), t0), Some(("a", true)));
        // x's last two records' addresses, held the longest.
        for n in [14, 15] {
            assert_eq!(h.holder(ip(n), t0), Some(("x", true)), "{n}");
        }
        for n in 10..14 {
            assert_eq!(h.holder(ip(n), t0), None, "{n}");
        }
    }

    #[test]
    fn a_node_that_moved_releases_its_old_address() {
        let t0 = Instant::now();
        let h = Holders::of(&set(&[("a", 1), ("b", 2)]));
        // b is still there, at another address: the old one is free.
        let h = h.after(&set(&[("a", 1), ("b", 3)]), t0, Duration::from_secs(60));
        assert_eq!(h.holder(ip(2), t0), None);
        assert_eq!(h.holder(ip(3), t0), Some(("b", false)));
    }
}
