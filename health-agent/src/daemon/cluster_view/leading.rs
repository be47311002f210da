//! What the leader holds while it leads, and when it hands the role over:
//! a leader that cannot publish (its writes fail, or it cannot read the
//! summaries) leaves every agent's view stale for as long as it holds the
//! role, so after a few ticks without a view out it resigns, and another
//! candidate leads (this one campaigns again, behind the others).

use tokio::sync::mpsc;
use tracing::warn;

use super::{Deposal, Held, STALE_ROUNDS};
use crate::membership::kvstore::{Leadership, WatchEvent};

/// Ticks in a row without a view published, the summaries read, after
/// which the leader hands the role over: one failed write is let pass (a
/// moment without etcd), a third is not.
pub(super) const HAND_OVER_TICKS: u32 = 3;

/// Ticks in a row after which a leader still reading the summaries (a
/// large cluster's first listing takes a while) hands the role over: by
/// then its view is as old as a summary left out.
pub(super) const HAND_OVER_UNREAD_TICKS: u32 = STALE_ROUNDS;

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
    /// Ticks in a row without a view published.
    pub(super) unpublished: u32,
}

impl Leading {
    pub(super) const fn new(leadership: Leadership, held: Held) -> Self {
        Self {
            leadership,
            events: None,
            held,
            published: false,
            unpublished: 0,
        }
    }

    /// Counts a tick at which a view was published (`out`) or not, and
    /// hands the role over (through `deposal`) when it is time.
    pub(super) fn tick(&mut self, out: bool, deposal: &Deposal<'_>) {
        if self.ticked(out) {
            warn!(
                ticks = self.unpublished,
                summaries_read = self.held.loaded,
                "cluster view: no view published for as many ticks as the leader; handing the role over"
            );
            deposal.tell(&self.leadership);
        }
    }

    /// Counts a tick at which a view was published (`out`) or not;
    /// whether the role is to be handed over.
    pub(super) fn ticked(&mut self, out: bool) -> bool {
        if out {
            self.unpublished = 0;
            return false;
        }
        self.unpublished = self.unpublished.saturating_add(1);
        let most = if self.held.loaded {
            HAND_OVER_TICKS
        } else {
            HAND_OVER_UNREAD_TICKS
        };
        self.unpublished >= most
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
        lead.tick(false, &deposal);
        lead.tick(false, &deposal);
        assert!(told().await.is_err(), "two ticks are let pass");
        lead.tick(false, &deposal);
        assert!(told().await.is_ok(), "the third hands the role over");
    }

    #[test]
    fn a_leader_still_reading_the_summaries_has_longer() {
        let mut lead = leading();
        for tick in 1..HAND_OVER_UNREAD_TICKS {
            assert!(!lead.ticked(false), "tick {tick}");
        }
        assert!(lead.ticked(false));
    }
}
