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

/// The most bytes kept of summaries held, values and names: at 50,000
/// nodes a node is observed by about 50 others, whose summaries take
/// about 900 bytes each, so this covers dozens of nodes joining at once.
/// Past it a summary is not kept (its observations count from its next
/// write).
pub(super) const REREAD_BYTES: usize = 4 << 20;

/// The most bytes kept of summaries refused, apart from those held: a
/// refused summary needs no node's record, so any writer of the prefix
/// can fill this, and nothing else. A joining node's summary is about
/// 1 KB at 50,000 nodes.
pub(super) const REFUSED_BYTES: usize = 1 << 20;

/// How long a refused summary is kept for its observer to join: a
/// joining node's record and its first summary are seconds apart. At
/// the leader's round past this it is let go (it counts from its next
/// write, should its observer join later).
pub(super) const REFUSED_KEPT_MS: u64 = 60_000;

/// A summary's value and the names it named that the node set did not
/// hold.
struct Kept {
    value: Vec<u8>,
    missing: Vec<PeerName>,
    /// `None` if it is held; else when it was refused, its observer (its
    /// one missing name) not in the node set.
    refused_at_ms: Option<u64>,
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

/// A summary taken out to be read again.
pub(super) struct Due {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    /// Whether it is held (else it was refused).
    pub held: bool,
}

/// The summaries kept to be read again, by key.
#[derive(Default)]
pub(super) struct Rereads {
    by_key: HashMap<Vec<u8>, Kept>,
    /// The bytes of those held, and of those refused.
    bytes: (usize, usize),
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
        self.insert(key, value, missing, None);
    }

    /// Keeps `value` of `key`, refused at `now_ms` because its `observer`
    /// is not in the node set, to be read again when the node set has it,
    /// within [`REFUSED_BYTES`] and for [`REFUSED_KEPT_MS`]. Replaces what
    /// was kept for `key`.
    pub(super) fn keep_refused(&mut self, key: &[u8], value: &[u8], observer: &str, now_ms: u64) {
        self.forget(key);
        self.insert(key, value, vec![PeerName::from(observer)], Some(now_ms));
    }

    fn insert(
        &mut self,
        key: &[u8],
        value: &[u8],
        missing: Vec<PeerName>,
        refused_at_ms: Option<u64>,
    ) {
        let cost = cost(key, value, &missing);
        let (bytes, most) = match refused_at_ms {
            None => (&mut self.bytes.0, REREAD_BYTES),
            Some(_) => (&mut self.bytes.1, REFUSED_BYTES),
        };
        if *bytes + cost > most {
            return;
        }
        *bytes += cost;
        let kept = Kept {
            value: value.to_vec(),
            missing,
            refused_at_ms,
            cost,
        };
        self.by_key.insert(key.to_vec(), kept);
    }

    /// Lets go of what was kept for `key` (deleted, rewritten, refused).
    pub(super) fn forget(&mut self, key: &[u8]) {
        if let Some(k) = self.by_key.remove(key) {
            self.uncount(&k);
        }
    }

    fn uncount(&mut self, k: &Kept) {
        match k.refused_at_ms {
            None => self.bytes.0 -= k.cost,
            Some(_) => self.bytes.1 -= k.cost,
        }
    }

    /// Keeps only the summaries held whose keys `held` accepts, and the
    /// refused ones if `refused`.
    pub(super) fn retain(&mut self, held: impl Fn(&[u8]) -> bool, refused: bool) {
        self.retain_by(|key, k| match k.refused_at_ms {
            None => held(key),
            Some(_) => refused,
        });
    }

    /// Lets go of the refused summaries kept longer than
    /// [`REFUSED_KEPT_MS`] at `now_ms`.
    pub(super) fn expire_refused(&mut self, now_ms: u64) {
        self.retain_by(|_, k| {
            k.refused_at_ms
                .is_none_or(|at| now_ms.saturating_sub(at) <= REFUSED_KEPT_MS)
        });
    }

    fn retain_by(&mut self, keep: impl Fn(&[u8], &Kept) -> bool) {
        self.by_key.retain(|key, k| keep(key, k));
        let counted = |refused: bool| {
            self.by_key
                .values()
                .filter(|k| k.refused_at_ms.is_some() == refused)
                .map(|k| k.cost)
                .sum()
        };
        self.bytes = (counted(false), counted(true));
    }

    /// Takes out the summaries that named a node `members` now holds; the
    /// others stay.
    pub(super) fn due(&mut self, members: &NodeSet) -> Vec<Due> {
        let keys: Vec<Vec<u8>> = self
            .by_key
            .iter()
            .filter(|(_, k)| k.missing.iter().any(|n| members.contains(n)))
            .map(|(key, _)| key.clone())
            .collect();
        keys.into_iter()
            .filter_map(|key| {
                let k = self.by_key.remove(&key)?;
                self.uncount(&k);
                Some(Due {
                    key,
                    value: k.value,
                    held: k.refused_at_ms.is_none(),
                })
            })
            .collect()
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_key.len()
    }

    /// The bytes kept, held and refused, as counted, and as recounted
    /// from what is kept.
    #[cfg(test)]
    pub(super) fn bytes(&self) -> ((usize, usize), (usize, usize)) {
        let recount = |refused: bool| {
            self.by_key
                .iter()
                .filter(|(_, k)| k.refused_at_ms.is_some() == refused)
                .map(|(key, k)| cost(key, &k.value, &k.missing))
                .sum()
        };
        (self.bytes, (recount(false), recount(true)))
    }
}
