//! The summaries the leader took while they named nodes its node set did
//! not hold yet (the observer read a joining node's record first), and
//! those it refused because their observer was not in it yet (a joining
//! node's own summary read before its record): their values, kept to be
//! read again once the node set has one of those nodes, so that the
//! observations count from then, not from the observer's next write (a
//! heartbeat may be 5 ticks away).

use std::collections::HashMap;

use super::UNKNOWN_PEERS_SAID;
use crate::{cluster::summary::PeerName, membership::NodeSet};

/// The most bytes kept, values and names: at 50,000 nodes a node is
/// observed by about 50 others, whose summaries take about 900 bytes
/// each, so this covers dozens of nodes joining at once. Past it a
/// summary is not kept (its observations count from its next write).
pub(super) const REREAD_BYTES: usize = 4 << 20;

/// A summary's value and the names it named that the node set did not
/// hold.
struct Kept {
    value: Vec<u8>,
    missing: Vec<PeerName>,
    /// Whether it is held; if not, it was refused, its observer (its one
    /// missing name) not in the node set.
    held: bool,
    /// What it takes with its key ([`cost`]).
    cost: usize,
}

/// What keeping `value` and `missing` under `key` takes: the bytes of
/// each, each name's handle and its shared copy's count and length, and
/// the map's entry.
fn cost(key: &[u8], value: &[u8], missing: &[PeerName]) -> usize {
    let name = |n: &PeerName| n.len() + size_of::<PeerName>() + 2 * size_of::<usize>();
    key.len()
        + value.len()
        + missing.iter().map(name).sum::<usize>()
        + size_of::<Vec<u8>>()
        + size_of::<Kept>()
}

/// The summaries kept to be read again, by key.
#[derive(Default)]
pub(super) struct Rereads {
    by_key: HashMap<Vec<u8>, Kept>,
    bytes: usize,
}

impl Rereads {
    /// Keeps `value` of `key` to be read again when the node set has one
    /// of `missing`: only when it names a few (a join seen first accounts
    /// for a few, a writer making names up for many: at most
    /// [`UNKNOWN_PEERS_SAID`]), within [`REREAD_BYTES`]. Replaces what was
    /// kept for `key`.
    pub(super) fn keep(&mut self, key: &[u8], value: &[u8], missing: Vec<PeerName>) {
        self.forget(key);
        if missing.is_empty() || missing.len() > UNKNOWN_PEERS_SAID {
            return;
        }
        self.insert(key, value, missing, true);
    }

    /// Keeps `value` of `key`, refused because its `observer` is not in
    /// the node set, to be read again when the node set has it, within
    /// [`REREAD_BYTES`]. Replaces what was kept for `key`.
    pub(super) fn keep_refused(&mut self, key: &[u8], value: &[u8], observer: &str) {
        self.forget(key);
        self.insert(key, value, vec![PeerName::from(observer)], false);
    }

    fn insert(&mut self, key: &[u8], value: &[u8], missing: Vec<PeerName>, held: bool) {
        let cost = cost(key, value, &missing);
        if self.bytes + cost <= REREAD_BYTES {
            self.bytes += cost;
            let value = value.to_vec();
            self.by_key.insert(
                key.to_vec(),
                Kept {
                    value,
                    missing,
                    held,
                    cost,
                },
            );
        }
    }

    /// Lets go of what was kept for `key` (deleted, rewritten, refused).
    pub(super) fn forget(&mut self, key: &[u8]) {
        if let Some(k) = self.by_key.remove(key) {
            self.bytes -= k.cost;
        }
    }

    /// Keeps only the summaries held whose keys `held` accepts, and the
    /// refused ones if `refused`.
    pub(super) fn retain(&mut self, held: impl Fn(&[u8]) -> bool, refused: bool) {
        self.by_key
            .retain(|key, k| if k.held { held(key) } else { refused });
        self.bytes = self.by_key.values().map(|k| k.cost).sum();
    }

    /// Takes out the values of the summaries that named a node `members`
    /// now holds, with their keys and whether they are held; the others
    /// stay.
    pub(super) fn due(&mut self, members: &NodeSet) -> Vec<(Vec<u8>, Vec<u8>, bool)> {
        let keys: Vec<Vec<u8>> = self
            .by_key
            .iter()
            .filter(|(_, k)| k.missing.iter().any(|n| members.contains(n)))
            .map(|(key, _)| key.clone())
            .collect();
        keys.into_iter()
            .filter_map(|key| {
                let k = self.by_key.remove(&key)?;
                self.bytes -= k.cost;
                Some((key, k.value, k.held))
            })
            .collect()
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_key.len()
    }

    /// The bytes kept, as counted, and as recounted from what is kept.
    #[cfg(test)]
    pub(super) fn bytes(&self) -> (usize, usize) {
        let recounted = self
            .by_key
            .iter()
            .map(|(key, k)| cost(key, &k.value, &k.missing));
        (self.bytes, recounted.sum())
    }
}
