//! A node's first round timed from its endpoint's readiness: the agent's
//! start is done when the health endpoint is ready, and a node that comes
//! up should know its peers within a timeout and a half of that.

use health_agent::endpoint::{
    EndpointView,
    lifecycle::{State, Transition},
};

/// When the first round started and ended, in milliseconds after the
/// endpoint first became ready (negative: before it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SinceReady {
    pub(crate) started: i64,
    pub(crate) ended: i64,
}

impl SinceReady {
    /// The round that started at `started_ms` and lasted `wall_ms` (epoch
    /// milliseconds, the agent's round record), against the health
    /// endpoint's first move to `ready` in `endpoints` (its history, on
    /// the agent's same clock); `None` when no endpoint was ever ready.
    pub(crate) fn of(endpoints: &[EndpointView], started_ms: u64, wall_ms: u64) -> Option<Self> {
        let ready = endpoints
            .iter()
            .flat_map(|e| e.history.iter())
            .filter(|t: &&Transition| t.to == State::Ready)
            .map(|t| t.at_ms)
            .min()?;
        let since = |ms: u64| {
            i64::try_from(ms)
                .ok()?
                .checked_sub(i64::try_from(ready).ok()?)
        };
        Some(Self {
            started: since(started_ms)?,
            ended: since(started_ms.saturating_add(wall_ms))?,
        })
    }

    /// The bench's line for it (the target: the probe timeout and half a
    /// second).
    pub(crate) fn line(r: Option<Self>) -> String {
        r.map_or_else(
            || "first round: not seen, or the endpoint's readiness not on record".to_owned(),
            |r| {
                format!(
                    "first round: started {} ms and ended {} ms after the endpoint was ready \
                     (target: the timeout + 500 ms)",
                    r.started, r.ended
                )
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(history: &[(State, u64)]) -> EndpointView {
        EndpointView {
            id: 1,
            identity: 4,
            labels: vec![],
            ipv4: None,
            ipv6: None,
            interface: "lxc_health".into(),
            netns: "ns".into(),
            state: history.last().map(|&(s, _)| s),
            repairs: 0,
            history: history
                .iter()
                .map(|&(to, at_ms)| Transition {
                    from: None,
                    to,
                    reason: String::new(),
                    at_ms,
                })
                .collect(),
        }
    }

    #[test]
    fn the_first_round_counts_from_the_endpoints_first_readiness() {
        let ep = endpoint(&[
            (State::WaitingForIdentity, 1_000),
            (State::Ready, 1_040),
            (State::Regenerating, 5_000),
            (State::Ready, 5_010),
        ]);
        assert_eq!(
            SinceReady::of(&[ep], 1_045, 1_300),
            Some(SinceReady {
                started: 5,
                ended: 1_305
            })
        );
    }

    #[test]
    fn a_round_before_readiness_is_negative_and_no_readiness_is_none() {
        let ep = endpoint(&[(State::Ready, 2_000)]);
        assert_eq!(
            SinceReady::of(&[ep], 1_990, 1_000),
            Some(SinceReady {
                started: -10,
                ended: 990
            })
        );
        let never = endpoint(&[(State::WaitingForIdentity, 1_000)]);
        assert_eq!(SinceReady::of(&[never], 1_990, 1_000), None);
        assert_eq!(SinceReady::of(&[], 1_990, 1_000), None);
    }
}
