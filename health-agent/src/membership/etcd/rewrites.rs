//! This node's record written back: how often, and what is said of
//! whose write it undoes.

use std::{fmt, time::Duration};

use tokio::time::Instant;

/// This node's record is written back at most this often: two agents
/// given the same name would otherwise overwrite each other without pause.
pub(super) const REWRITE_EVERY: Duration = Duration::from_secs(5);

/// A write-back's warning for one kind of writer is repeated at most this
/// often; the write-backs between are counted in the next.
const REWRITE_SAID_EVERY: Duration = Duration::from_mins(1);

/// When this node's record was last written back, and when it may be next.
#[derive(Debug, Default)]
pub(super) struct Rewrites {
    last: Option<Instant>,
    /// A write-back waits for this instant.
    pub(super) due: Option<Instant>,
    /// For each kind of writer ([`Writer`]), when a write-back was last
    /// warned about, and the write-backs since.
    said: [Option<(Instant, u64)>; 4],
}

/// Who changed this node's record, as far as the watch can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Writer {
    /// The key was deleted.
    Deleted,
    /// Written without a lease.
    NoLease,
    /// Written under this agent's own lease.
    OwnLease,
    /// Written under another lease (named).
    Lease(i64),
}

impl Writer {
    /// From the lease the key was written under as the watch saw it
    /// (`at_key`: `Some(0)` for none, `None` for a deleted key) and this
    /// agent's lease (`ours`).
    pub(super) fn of(at_key: Option<i64>, ours: Option<i64>) -> Self {
        match at_key {
            None => Self::Deleted,
            Some(0) => Self::NoLease,
            Some(l) if Some(l) == ours => Self::OwnLease,
            Some(l) => Self::Lease(l),
        }
    }

    /// Its slot in [`Rewrites::said`], and in
    /// [`crate::membership::published::REWRITTEN_AFTER`]: every other
    /// lease is one kind, so that writers changing leases are told no more
    /// often than one.
    pub(super) const fn kind(self) -> usize {
        match self {
            Self::Deleted => 0,
            Self::NoLease => 1,
            Self::OwnLease => 2,
            Self::Lease(_) => 3,
        }
    }
}

/// What became of this node's record, for the write-back's warning: a
/// write under a lease not this agent's is most likely another agent's
/// under the same name.
impl fmt::Display for Writer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Deleted => f.write_str("deleted, not by this agent (by another writer, or by the lease it was under ending)"),
            Self::NoLease => f.write_str("changed without a lease, not by this agent (by an etcd user writing under the prefix)"),
            Self::OwnLease => f.write_str("changed under this agent's own lease, not by this agent (by a writer that took the lease over)"),
            Self::Lease(l) => write!(f, "changed under etcd lease {l:x}, not this agent's: another agent may run under this node's name (a machine cloned with its name?), or another writer used a lease"),
        }
    }
}

impl Rewrites {
    /// Whether a write-back undoing `by`'s write is to be warned about at
    /// `now`, with the write-backs for that kind of writer since the last
    /// warning (`None`: said less than [`REWRITE_SAID_EVERY`] ago, counted
    /// for the next): two agents under one name overwrite each other
    /// every [`REWRITE_EVERY`], which says the same every time.
    pub(super) fn said(&mut self, by: Writer, now: Instant) -> Option<u64> {
        match &mut self.said[by.kind()] {
            Some((at, since)) if now < *at + REWRITE_SAID_EVERY => {
                *since += 1;
                None
            }
            Some((at, since)) => {
                *at = now;
                Some(std::mem::take(since))
            }
            slot @ None => {
                *slot = Some((now, 0));
                Some(0)
            }
        }
    }

    /// Whether a write-back may go now; if not, when it may is kept.
    pub(super) fn may_write(&mut self, now: Instant) -> bool {
        match self.last {
            Some(t) if now < t + REWRITE_EVERY => {
                self.due = Some(t + REWRITE_EVERY);
                false
            }
            _ => {
                self.last = Some(now);
                self.due = None;
                true
            }
        }
    }
}
