//! What the leader holds while it leads, and when it hands the role over:
//! a leader that cannot publish (its writes fail, or it cannot read the
//! summaries) leaves every agent's view stale for as long as it holds the
//! role, so after a few ticks without a view out it resigns, and another
//! candidate leads (this one campaigns again, behind the others). A new
//! leader is at least as patient as the view has been stale to it: when
//! every agent shares the cause (no permission for the view's key), each
//! one in turn waits about as long as all before it together, so the role
//! passes ever more slowly rather than every few ticks, each leader
//! reading every summary anew.

use tokio::sync::mpsc;
use tracing::warn;

use super::{Deposal, Held, STALE_ROUNDS};
use crate::membership::kvstore::{Leadership, WatchEvent};

/// Ticks in a row without a view published, the summaries read, after
/// which the leader hands the role over: two failed writes are let pass
/// (a moment without etcd), a third is not.
pub(super) const HAND_OVER_TICKS: u32 = 3;

/// Ticks in a row after which a leader still reading the summaries (a
/// large cluster's first listing takes a while) hands the role over: by
/// then its view is as old as a summary left out.
pub(super) const HAND_OVER_UNREAD_TICKS: u32 = STALE_ROUNDS;

/// The most ticks a leader waits for: 32 times [`HAND_OVER_TICKS`].
const MOST_PATIENCE: u32 = HAND_OVER_TICKS << 5;

/// The leader's election key, the summaries (watched from when its node
/// set is read) and how its ticks went.
pub(super) struct Leading {
    pub(super) leadership: Leadership,
    /// The summaries' watch, from when the node set is read (the
    /// summaries of nodes it does not hold yet would be refused).
    pub(super) events: Option<mpsc::Receiver<WatchEvent>>,
    pub(super) held: Held,
    /// A view was assembled (and its write tried) since the election.
    pub(super) published: bool,
    /// Ticks in a row without the summaries read, and, once read, ticks
    /// in a row whose view was not published.
    unread: u32,
    unpublished: u32,
    /// The ticks the view had been stale to this agent when it was
    /// elected: the least it waits for either count.
    stale_before: u32,
}

impl Leading {
    /// A new leadership, the view stale to this agent for `stale_ticks`
    /// ticks before it.
    pub(super) fn new(leadership: Leadership, held: Held, stale_ticks: u64) -> Self {
        Self {
            leadership,
            events: None,
            held,
            published: false,
            unread: 0,
            unpublished: 0,
            stale_before: u32::try_from(stale_ticks)
                .unwrap_or(u32::MAX)
                .min(MOST_PATIENCE),
        }
    }

    /// A view went out (at a tick, or as soon as the summaries were
    /// read): the counts start anew.
    pub(super) const fn published_now(&mut self) {
        self.unread = 0;
        self.unpublished = 0;
    }

    /// Counts a tick at which a view was published (`out`) or not, and
    /// hands the role over (through `deposal`) when it is time; whether it
    /// did. A tick without a node set (`members` false: no view to make
    /// yet) is not counted.
    pub(super) fn tick(&mut self, out: bool, members: bool, deposal: &Deposal<'_>) -> bool {
        if !members || !self.ticked(out) {
            return false;
        }
        warn!(
            ticks = self.unread.max(self.unpublished),
            summaries_read = self.held.loaded,
            "cluster view: no view published for as many ticks as the leader; handing the role over"
        );
        deposal.tell(&self.leadership);
        true
    }

    /// Counts a tick at which a view was published (`out`) or not;
    /// whether the role is to be handed over.
    fn ticked(&mut self, out: bool) -> bool {
        if out {
            self.published_now();
            return false;
        }
        let (count, most) = if self.held.loaded {
            (&mut self.unpublished, HAND_OVER_TICKS)
        } else {
            (&mut self.unread, HAND_OVER_UNREAD_TICKS)
        };
        *count = count.saturating_add(1);
        *count >= most.max(self.stale_before)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn leading() -> Leading {
        let leadership = Leadership {
            name: b"assembler".to_vec(),
            key: b"assembler/1".to_vec(),
            rev: 7,
            lease: 1,
        };
        Leading::new(
            leadership,
            Held::new("/health/summaries/", Duration::from_secs(3), 16),
            0,
        )
    }

    #[test]
    fn a_leader_that_cannot_publish_hands_the_role_over() {
        let mut lead = leading();
        lead.held.loaded = true;
        // A failed write is let pass, and a view out starts the count anew.
        assert!(!lead.ticked(false));
        assert!(!lead.ticked(false));
        assert!(!lead.ticked(true));
        assert!(!lead.ticked(false));
        assert!(!lead.ticked(false));
        assert!(lead.ticked(false), "the third tick in a row");
    }

    /// The campaign hears of it (and so gives the role up) at the third
    /// tick, not before.
    #[tokio::test]
    async fn the_campaign_is_told_at_the_hand_over() {
        let mut lead = leading();
        lead.held.loaded = true;
        let notify = tokio::sync::Notify::new();
        let (_tx, role) = tokio::sync::watch::channel(crate::membership::kvstore::Role::Leader(
            lead.leadership.clone(),
        ));
        let deposal = Deposal {
            notify: &notify,
            role: &role,
        };
        let told = || tokio::time::timeout(Duration::from_millis(20), notify.notified());
        for _ in 0..5 {
            assert!(
                !lead.tick(false, false, &deposal),
                "no node set: not counted"
            );
        }
        lead.tick(false, true, &deposal);
        lead.tick(false, true, &deposal);
        assert!(told().await.is_err(), "two ticks are let pass");
        assert!(lead.tick(false, true, &deposal));
        assert!(told().await.is_ok(), "the third hands the role over");
    }

    /// Ticks spent reading the summaries are not failed writes: once
    /// read, a failed write is let pass as it is to any leader.
    #[test]
    fn a_leader_still_reading_the_summaries_has_longer() {
        let mut lead = leading();
        for tick in 1..HAND_OVER_UNREAD_TICKS {
            assert!(!lead.ticked(false), "tick {tick}");
        }
        lead.held.loaded = true;
        assert!(!lead.ticked(false), "a first failed write");
        assert!(!lead.ticked(false));
        assert!(lead.ticked(false));
        let mut lead = leading();
        for _ in 1..HAND_OVER_UNREAD_TICKS {
            lead.ticked(false);
        }
        assert!(lead.ticked(false), "never read");
    }

    /// A leader elected while the view has been stale to it for longer
    /// than its usual patience waits at least as long, up to a bound.
    #[test]
    fn a_leader_waits_as_long_as_the_view_was_stale_before_it() {
        for (stale, ticks) in [(0, 3), (2, 3), (6, 6), (50, 50), (10_000, MOST_PATIENCE)] {
            let mut lead = leading();
            lead.stale_before = u32::try_from(stale).unwrap_or(u32::MAX).min(MOST_PATIENCE);
            lead.held.loaded = true;
            for tick in 1..ticks {
                assert!(!lead.ticked(false), "stale {stale}: tick {tick}");
            }
            assert!(lead.ticked(false), "stale {stale}");
        }
    }
}
