//! `GET /v1/status?summary=true&after=SEQ[&wait=DURATION]`: the summary
//! once a round later than `SEQ` is published, so that a client following
//! the rounds (`status --watch`, a benchmark) makes one request a round
//! and hears of each as it ends, instead of asking again and again.
//!
//! The wait ends, and the summary as it is then is the answer, when a
//! later round is published, when `wait` has passed (the answer's round
//! is then still `SEQ` or earlier), when a reload replaces the prober, or
//! when the agent stops. A `SEQ` the agent has not reached is answered at
//! once: it comes from an earlier run of the agent, whose rounds were
//! numbered further, and the client learns that the numbering began
//! again. A waiting request holds its connection and a
//! small task, no thread. Waits are served on the agent's socket only:
//! the network listener answers from its own connection cap and idle
//! timeout, which a held request would tie up.

use std::{sync::Arc, time::Duration};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::probe::Prober;

/// How long a wait lasts when the request names none.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(60);
/// The longest wait a request may ask for.
pub const MAX_WAIT: Duration = Duration::from_secs(600);

/// What a request asks to wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoundWait {
    /// A round later than this one.
    pub after: u64,
    /// For at most this long.
    pub wait: Duration,
}

/// A bad `after=` or `wait=`, with the value it names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoundWaitError {
    #[error("after={0:?}: expected a round number (0, 1, 2, ...)")]
    After(String),
    /// The reason begins with the value, quoted.
    #[error("wait={0}")]
    Wait(String),
    #[error("wait= goes with after=SEQ (the round to wait past)")]
    WaitAlone,
}

impl RoundWait {
    /// The wait `after` and `wait` (the query's values, when given) ask for.
    pub fn parse(after: Option<&str>, wait: Option<&str>) -> Result<Option<Self>, RoundWaitError> {
        let Some(after) = after else {
            return match wait {
                Some(_) => Err(RoundWaitError::WaitAlone),
                None => Ok(None),
            };
        };
        // Digits only: `parse` would take a leading `+` too.
        let after = match after.parse::<u64>() {
            Ok(n) if after.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => return Err(RoundWaitError::After(after.to_owned())),
        };
        let wait = match wait {
            None => DEFAULT_WAIT,
            Some(v) => {
                let d = crate::util::duration::parse(v).map_err(RoundWaitError::Wait)?;
                if d > MAX_WAIT {
                    return Err(RoundWaitError::Wait(format!(
                        "{v:?}: at most {}",
                        humantime::format_duration(MAX_WAIT)
                    )));
                }
                d
            }
        };
        Ok(Some(Self { after, wait }))
    }

    /// Waits until `probers`' prober has published a round other than
    /// `self.after` (a later one; or an earlier one, `after` being from an
    /// earlier run), `self.wait` has passed, the prober was replaced or
    /// `stop` is cancelled, whichever comes first.
    pub async fn until_done(
        self,
        probers: &watch::Receiver<Arc<Prober>>,
        stop: &CancellationToken,
    ) {
        let mut probers = probers.clone();
        let mut rounds = probers.borrow_and_update().published_rounds();
        tokio::select! {
            _ = rounds.wait_for(|&seq| seq != self.after) => {}
            () = replaced(&mut probers) => {}
            () = tokio::time::sleep(self.wait) => {}
            () = stop.cancelled() => {}
        }
    }
}

/// Resolves when the prober in service is replaced; never, once nothing
/// can replace it (a wait then ends by its other causes, not at once).
async fn replaced(probers: &mut watch::Receiver<Arc<Prober>>) {
    if probers.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::{
        api::{
            client::{Client, ClientError},
            server::{SocketGuard, tests::serve_probers},
        },
        membership::NodeSet,
        probe::{
            ProbeConfig,
            status::{RoundInfo, StatusSummary},
        },
    };

    /// A prober of two nodes, served on a socket of its own until the
    /// token is cancelled; the sender replaces the prober in service.
    fn served() -> (
        Client,
        SocketGuard,
        CancellationToken,
        watch::Sender<Arc<Prober>>,
    ) {
        let prober = Prober::new(ProbeConfig::default());
        prober.set_nodes(NodeSet::named(&["a", "b"]));
        let (probers_tx, probers) = watch::channel(prober);
        let (client, guard, stop) = serve_probers(probers);
        (client, guard, stop, probers_tx)
    }

    fn round(seq: u64) -> RoundInfo {
        RoundInfo {
            seq,
            started_ms: seq * 1000,
            duration_ms: 10,
            probes: 8,
        }
    }

    /// A request waiting for a round after `after`, for `secs` at most.
    fn wait_past(
        client: &Client,
        after: u64,
        secs: u64,
    ) -> tokio::task::JoinHandle<Result<StatusSummary, ClientError>> {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .status_summary_after(after, Duration::from_secs(secs))
                .await
        })
    }

    /// The answer to the request in `task`, within 2 s (`what` otherwise).
    async fn answered(
        task: tokio::task::JoinHandle<Result<StatusSummary, ClientError>>,
        what: &str,
    ) -> StatusSummary {
        tokio::time::timeout(Duration::from_secs(2), task)
            .await
            .expect(what)
            .expect("task")
            .expect("summary")
    }

    /// The request in `task` is still waiting.
    async fn still_waiting<T>(task: &tokio::task::JoinHandle<T>) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!task.is_finished(), "answered before its round");
    }

    #[tokio::test]
    async fn a_wait_ends_when_a_later_round_is_published() {
        let (client, _guard, _stop, probers) = served();
        let prober = probers.borrow().clone();
        let waiting = wait_past(&client, 0, 30);
        still_waiting(&waiting).await;
        // A node-set change publishes without a round: still waiting.
        prober.set_nodes(NodeSet::named(&["a", "b", "c"]));
        still_waiting(&waiting).await;
        let t0 = Instant::now();
        prober.publish(Some(round(1)), false);
        let summary = answered(waiting, "answered once round 1 was published").await;
        assert_eq!(summary.round.map(|r| r.seq), Some(1));
        assert_eq!(summary.nodes, 3);
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());

        // Answered at once, with the round the agent is at: a round
        // already later than `after`, and a round this agent has not
        // reached (the client followed an earlier run of it).
        for after in [0, 500] {
            let t0 = Instant::now();
            let now = client
                .status_summary_after(after, Duration::from_secs(30))
                .await
                .expect("summary");
            assert_eq!(now.round.map(|r| r.seq), Some(1), "after={after}");
            assert!(
                t0.elapsed() < Duration::from_secs(1),
                "after={after}: {:?}",
                t0.elapsed()
            );
        }

        // Many waiters, one round: each hears of it.
        let waiters: Vec<_> = (0..20).map(|_| wait_past(&client, 1, 30)).collect();
        tokio::time::sleep(Duration::from_millis(200)).await;
        prober.publish(Some(round(2)), false);
        for w in waiters {
            let s = answered(w, "every waiter answered").await;
            assert_eq!(s.round.map(|r| r.seq), Some(2));
        }
    }

    #[tokio::test]
    async fn a_wait_ends_at_its_length_a_reload_or_the_agent_stopping() {
        let (client, _guard, stop, probers) = served();
        probers.borrow().publish(Some(round(4)), false);

        // No later round within `wait`: the round as it is, after `wait`.
        let t0 = Instant::now();
        let same = client
            .status_summary_after(4, Duration::from_millis(300))
            .await
            .expect("summary");
        assert_eq!(same.round.map(|r| r.seq), Some(4));
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(2),
            "{took:?}"
        );

        // A reload's new prober (taking over the old one's rounds).
        let waiting = wait_past(&client, 4, 30);
        still_waiting(&waiting).await;
        // The old prober lives on a while (its last round ending), so its
        // rounds do not end the wait: the replacement does.
        let old = probers.borrow().clone();
        let new = Prober::new(ProbeConfig::default());
        new.take_over(&old);
        probers.send_replace(new);
        let s = answered(waiting, "answered on the reload").await;
        assert_eq!(s.round.map(|r| r.seq), Some(4));
        drop(old);

        // The agent stopping answers a waiting request, and soon.
        let waiting = wait_past(&client, 4, 60);
        still_waiting(&waiting).await;
        stop.cancel();
        let s = answered(waiting, "answered when the agent stopped").await;
        assert_eq!(s.round.map(|r| r.seq), Some(4));
    }

    #[tokio::test]
    async fn bad_waits_are_refused_naming_the_value() {
        let (client, _guard, _stop, _probers) = served();
        for (query, says) in [
            ("summary=true&after=x", "after=\"x\""),
            ("summary=true&after=-1", "after=\"-1\""),
            ("summary=true&after=1&wait=11m", "wait=\"11m\": at most 10m"),
            ("summary=true&after=1&wait=0s", "wait=\"0s\""),
            ("summary=true&wait=1s", "wait= goes with after="),
            ("after=1", "after= goes with summary=true"),
            ("state=failure&after=1", "after= goes with summary=true"),
        ] {
            let (status, body) = client
                .raw("GET", &format!("/v1/status?{query}"))
                .await
                .expect("answered");
            let said: crate::api::types::ApiError =
                serde_json::from_slice(&body).expect("an error as JSON");
            assert_eq!(status.as_u16(), 400, "{query}: {}", said.message);
            assert!(said.message.contains(says), "{query}: {}", said.message);
        }
    }

    #[test]
    fn a_wait_is_a_round_number_and_a_duration() {
        assert_eq!(RoundWait::parse(None, None), Ok(None));
        assert_eq!(
            RoundWait::parse(Some("7"), None),
            Ok(Some(RoundWait {
                after: 7,
                wait: DEFAULT_WAIT
            }))
        );
        assert_eq!(
            RoundWait::parse(Some("0"), Some("2s")),
            Ok(Some(RoundWait {
                after: 0,
                wait: Duration::from_secs(2)
            }))
        );
        assert_eq!(
            RoundWait::parse(Some("10"), Some("10m")).map(|w| w.map(|w| w.wait)),
            Ok(Some(MAX_WAIT))
        );
    }

    #[test]
    fn bad_values_are_named() {
        for bad in ["", "-1", "+5", " 5", "x", "1.5", "18446744073709551616"] {
            let e = RoundWait::parse(Some(bad), None).expect_err(bad);
            assert_eq!(e, RoundWaitError::After(bad.to_owned()), "{bad:?}");
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
        for bad in ["0s", "soon", "11m", "1h"] {
            let e = RoundWait::parse(Some("1"), Some(bad))
                .expect_err(bad)
                .to_string();
            assert!(e.starts_with(&format!("wait={bad:?}")), "{e}");
            assert_eq!(e.matches(bad).count(), 1, "the value named once: {e}");
        }
        assert_eq!(
            RoundWait::parse(None, Some("1s")),
            Err(RoundWaitError::WaitAlone)
        );
    }
}
