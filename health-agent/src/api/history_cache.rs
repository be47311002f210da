//! The whole history's answers (every node's strips, every node's
//! figures), each made once per published round and node set and shared
//! by every request until either changes. A walk of every path is made
//! once, not once a request, and the answer's bytes are one shared copy:
//! clients that ask and never read hold references to it, not copies of
//! megabytes each. One answer of each kind is kept, with the node set it
//! was made of, until a request of its kind finds them out of date.

use std::sync::{Arc, Mutex, PoisonError, Weak};

use bytes::Bytes;

use crate::{membership::NodeSet, probe::Prober};

/// Which whole-history answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Whole {
    /// Every node's results, a character a round.
    Strips,
    /// Every node's loss ratio and RTT percentiles.
    Stats,
}

/// What an answer was made of: the prober (a reload makes a new one), its
/// newest published round, and the node set.
#[derive(Clone)]
pub(super) struct Made {
    prober: Weak<Prober>,
    round: u64,
    nodes: NodeSet,
}

impl Made {
    /// What `prober`'s answers are made of now. Taken before the walk: an
    /// answer is at least as new as its key (a round recorded during the
    /// walk is seen by the next request, which finds a newer key).
    pub(super) fn now(prober: &Arc<Prober>) -> Self {
        Self {
            prober: Arc::downgrade(prober),
            round: *prober.published_rounds().borrow(),
            nodes: prober.nodes(),
        }
    }

    fn same(&self, other: &Self) -> bool {
        Weak::ptr_eq(&self.prober, &other.prober)
            && self.round == other.round
            && self.nodes.same_snapshot(&other.nodes)
    }
}

/// The latest answer of each kind, with what it was made of.
#[derive(Default)]
pub(super) struct HistoryCache {
    answers: Mutex<[Option<(Made, Bytes)>; 2]>,
}

impl HistoryCache {
    fn slot(which: Whole) -> usize {
        match which {
            Whole::Strips => 0,
            Whole::Stats => 1,
        }
    }

    /// The answer of kind `which` made of `made`, if there is one.
    pub(super) fn get(&self, which: Whole, made: &Made) -> Option<Bytes> {
        let answers = self.answers.lock().unwrap_or_else(PoisonError::into_inner);
        answers[Self::slot(which)]
            .as_ref()
            .filter(|(m, _)| m.same(made))
            .map(|(_, bytes)| bytes.clone())
    }

    /// Keeps `bytes` as the answer of kind `which` made of `made`.
    pub(super) fn put(&self, which: Whole, made: Made, bytes: Bytes) {
        let mut answers = self.answers.lock().unwrap_or_else(PoisonError::into_inner);
        answers[Self::slot(which)] = Some((made, bytes));
    }
}
