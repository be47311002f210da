//! Rounds asked for through the API (`PUT /v1/status/probe`): a request
//! joins the round that is waiting for its turn, if one is, and asks for
//! one otherwise. So however many requests come, and however soon their
//! clients go away, at most one such round runs and one waits: a client
//! looping on the request cannot queue rounds that probe every peer back
//! to back long after it has gone, or hold the scheduler's rounds and the
//! liveness echoes behind them.
//!
//! A request's answer is always a round that began after the request
//! came: a round that has begun is no longer joined. A round runs to its
//! end whatever becomes of the requests waiting for it (a round cut short
//! would be recorded and never published).

use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

use crate::probe::{Prober, status::StatusSummary};

/// What a round asked for through the API ends with: its counts, or
/// `None` while it runs. (Its status is the published one, served as
/// published: made once, not once a request.)
type Outcome = Option<Arc<StatusSummary>>;

/// The round that requests join until it begins.
struct Waiting {
    /// The prober it runs on: a request to a prober a reload put in its
    /// place asks that one for a round of its own.
    prober: Arc<Prober>,
    ended: watch::Receiver<Outcome>,
}

/// The rounds asked for through the API; shared by the API's handlers.
#[derive(Clone, Default)]
pub(super) struct Demand {
    waiting: Arc<Mutex<Option<Waiting>>>,
}

/// The round ended without a status: its task panicked or was cancelled
/// when the runtime stopped.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the round ended without a status (its task failed)")]
pub(super) struct RoundLost;

impl Demand {
    /// A round on `prober` that begins after this call: the one waiting
    /// for its turn, or a new one. Its counts when it ends.
    pub(super) async fn round(&self, prober: Arc<Prober>) -> Result<Arc<StatusSummary>, RoundLost> {
        let mut ended = self.join_or_ask(prober);
        let outcome = ended
            .wait_for(Option::is_some)
            .await
            .map_err(|_| RoundLost)?;
        outcome.clone().ok_or(RoundLost)
    }

    fn join_or_ask(&self, prober: Arc<Prober>) -> watch::Receiver<Outcome> {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        // Not one whose task ended without a status.
        if let Some(w) = waiting.as_ref()
            && Arc::ptr_eq(&w.prober, &prober)
            && w.ended.has_changed().is_ok()
        {
            return w.ended.clone();
        }
        let (done, ended) = watch::channel(None);
        *waiting = Some(Waiting {
            prober: prober.clone(),
            ended: ended.clone(),
        });
        let slot = self.waiting.clone();
        let ours = ended.clone();
        tokio::spawn(async move {
            let summary = prober
                .round_when_started(|| {
                    // Begun: later requests ask for a round of their own.
                    let mut waiting = slot.lock().unwrap_or_else(PoisonError::into_inner);
                    if waiting
                        .as_ref()
                        .is_some_and(|w| w.ended.same_channel(&ours))
                    {
                        *waiting = None;
                    }
                })
                .await;
            // Nobody waiting any more is no error.
            let _ = done.send(Some(summary));
        });
        ended
    }

    /// Whether a round asked for through the API waits for its turn.
    #[cfg(test)]
    pub(crate) fn is_waiting(&self) -> bool {
        self.waiting
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::probe::ProbeConfig;

    /// Requests that come before their round begins share it; one that
    /// comes after it began gets a round of its own.
    #[tokio::test]
    async fn requests_waiting_together_share_one_round() {
        // No nodes: a round sends nothing.
        let prober = Prober::new(ProbeConfig::default());
        let demand = Demand::default();
        let asked = (0..50).map(|_| demand.round(prober.clone()));
        let statuses = futures::future::join_all(asked).await;
        let seqs: Vec<u64> = statuses
            .into_iter()
            .map(|s| s.expect("a status").round.as_ref().expect("a round").seq)
            .collect();
        assert_eq!(seqs, vec![1; 50], "one round for all fifty");
        assert!(!demand.is_waiting());
        let again = demand.round(prober.clone()).await.expect("a status");
        assert_eq!(again.round.as_ref().map(|r| r.seq), Some(2));
        // A prober put in the place of another runs a round of its own.
        let other = Prober::new(ProbeConfig::default());
        let (a, b) = tokio::join!(demand.round(prober.clone()), demand.round(other));
        assert_eq!(a.expect("a").round.as_ref().map(|r| r.seq), Some(3));
        assert_eq!(b.expect("b").round.as_ref().map(|r| r.seq), Some(1));
    }
}
