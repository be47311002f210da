//! The node records an agent holds of an etcd prefix, bounded whatever a
//! writer puts there: at most `--max-nodes` records that could be nodes
//! (this node's own always among them) and [`MAX_JUNK_HELD`] that never
//! can; the keys of the rest are kept as hashes (8 bytes a key), counted,
//! never stored.

use std::{
    collections::{BTreeMap, HashSet},
    hash::{BuildHasher as _, RandomState},
};

use super::{record::Candidate, validate};

/// The most records that can never be a node held to be listed (`GET
/// /v1/nodes`); past them, rejected records are only counted.
pub const MAX_JUNK_HELD: usize = 256;

/// What may be held.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The longest key that can be a node's: the prefix and a name.
    pub key_max: usize,
    /// Records that could be nodes held at most (`--max-nodes`).
    pub max_nodes: usize,
    /// This node's own key, held past `max_nodes`.
    pub own_key: String,
}

/// The records held, by key, and the keys only counted.
#[derive(Debug)]
pub struct Held {
    limits: Limits,
    records: BTreeMap<String, Candidate>,
    /// Records held that can never be a node: [`is_junk`].
    junk: usize,
    /// The keys of rejected records not held (past [`MAX_JUNK_HELD`], or
    /// longer than a node's key), by hash.
    unheld: HashSet<u64>,
    /// The keys of records that could be nodes past `max_nodes`, by hash.
    over: HashSet<u64>,
    hasher: RandomState,
}

impl Held {
    #[must_use]
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            records: BTreeMap::new(),
            junk: 0,
            unheld: HashSet::new(),
            over: HashSet::new(),
            hasher: RandomState::new(),
        }
    }

    /// The records held, by key.
    #[must_use]
    pub const fn records(&self) -> &BTreeMap<String, Candidate> {
        &self.records
    }

    /// Rejected records only counted.
    #[must_use]
    pub fn unheld(&self) -> usize {
        self.unheld.len()
    }

    /// Records that could be nodes, held or not.
    #[must_use]
    pub fn nodes(&self) -> usize {
        self.records.len() - self.junk + self.over.len()
    }

    /// Records that could be nodes not held: past `max_nodes`.
    #[must_use]
    pub fn over(&self) -> usize {
        self.over.len()
    }

    /// Records that could be nodes went unheld, and now all of them fit:
    /// the prefix must be read again to have them.
    #[must_use]
    pub fn must_reread(&self) -> bool {
        !self.over.is_empty() && self.nodes() <= self.limits.max_nodes
    }

    /// Drops what is held of `key`.
    pub fn forget(&mut self, key: &str) {
        if let Some(old) = self.records.remove(key) {
            self.junk -= usize::from(is_junk(&old));
        }
        let h = self.hasher.hash_one(key);
        self.unheld.remove(&h);
        self.over.remove(&h);
    }

    /// Holds the record at `key`, made by `decode` when the key could be
    /// a node's: listed when it could be a node ([`is_junk`]) and fewer
    /// than `max_nodes` such are held, or it cannot be one and fewer than
    /// [`MAX_JUNK_HELD`] such are; otherwise only counted.
    pub fn hold(&mut self, key: &str, decode: impl FnOnce() -> Candidate) {
        self.forget(key);
        let c = (key.len() <= self.limits.key_max).then(decode);
        let h = self.hasher.hash_one(key);
        let Some(c) = c else {
            self.unheld.insert(h);
            return;
        };
        if is_junk(&c) {
            if self.junk < MAX_JUNK_HELD {
                self.junk += 1;
                self.records.insert(key.to_owned(), c);
            } else {
                self.unheld.insert(h);
            }
        } else if self.records.len() - self.junk < self.limits.max_nodes
            || key == self.limits.own_key
        {
            self.records.insert(key.to_owned(), c);
        } else {
            self.over.insert(h);
        }
    }
}

/// Whether a record can never be a node: it does not decode, or fails
/// the checks that need nothing but itself.
#[must_use]
pub fn is_junk(c: &Candidate) -> bool {
    c.node.as_ref().map_or(true, |n| {
        validate::check_shape(n, &c.record.origin).is_err()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::membership::{
        Node,
        record::{Origin, Record},
    };

    fn limits(max_nodes: usize) -> Limits {
        Limits {
            key_max: 3 + 253,
            max_nodes,
            own_key: "/h/me".into(),
        }
    }

    fn node(key: &str) -> Candidate {
        let name = key.trim_start_matches("/h/");
        let i = u8::try_from(name.len() % 200).unwrap_or(0);
        let n = Node::v4(
            name.to_owned(),
            std::net::Ipv4Addr::new(198, 18, 0, i),
            std::net::Ipv4Addr::new(198, 18, 64, i),
        );
        Candidate {
            record: Record {
                name: Some(name.to_owned()),
                origin: Origin::Etcd {
                    key: key.to_owned(),
                    prefix_len: 3,
                },
            },
            node: Ok(n),
        }
    }

    fn junk(key: &str) -> Candidate {
        Candidate {
            node: Err("not a record".into()),
            ..node(key)
        }
    }

    #[test]
    fn records_past_max_nodes_are_counted_not_held() {
        let mut h = Held::new(limits(3));
        for k in ["/h/a", "/h/b", "/h/c", "/h/d", "/h/e"] {
            h.hold(k, || node(k));
        }
        assert_eq!((h.records().len(), h.over(), h.nodes()), (3, 2, 5));
        assert!(!h.must_reread(), "five still do not fit in three");
        // This node's own record is held all the same.
        h.hold("/h/me", || node("/h/me"));
        assert!(h.records().contains_key("/h/me"));
        assert_eq!((h.over(), h.nodes()), (2, 6));
        // Records that can never be nodes do not take nodes' room.
        h.hold("/h/x", || junk("/h/x"));
        assert_eq!((h.records().len(), h.nodes()), (5, 6));
        // Two leave, one held and one only counted: four do not fit either.
        h.forget("/h/a");
        h.forget("/h/e");
        assert_eq!((h.over(), h.nodes()), (1, 4));
        assert!(!h.must_reread());
        h.forget("/h/b");
        assert_eq!(h.nodes(), 3);
        assert!(h.must_reread(), "all three fit, one is not held");
    }

    #[test]
    fn a_held_record_changed_keeps_its_place_and_a_counted_one_its_count() {
        let mut h = Held::new(limits(2));
        for k in ["/h/a", "/h/b", "/h/c"] {
            h.hold(k, || node(k));
        }
        h.hold("/h/c", || node("/h/c"));
        h.hold("/h/a", || node("/h/a"));
        assert_eq!((h.records().len(), h.over(), h.nodes()), (2, 1, 3));
        // A held record turned to junk frees its room, but the counted one
        // is not here to take it: read again.
        h.hold("/h/a", || junk("/h/a"));
        assert_eq!((h.nodes(), h.over()), (2, 1));
        assert!(h.must_reread());
    }

    #[test]
    fn junk_past_its_bound_and_overlong_keys_are_counted() {
        let mut h = Held::new(limits(10));
        for i in 0..MAX_JUNK_HELD + 5 {
            let k = format!("/h/j{i}");
            h.hold(&k, || junk(&k));
        }
        let long = format!("/h/{}", "x".repeat(254));
        h.hold(&long, || unreachable!("an overlong key is never decoded"));
        assert_eq!(
            (h.records().len(), h.unheld(), h.nodes()),
            (MAX_JUNK_HELD, 6, 0)
        );
        h.forget(&long);
        assert_eq!(h.unheld(), 5);
    }
}
