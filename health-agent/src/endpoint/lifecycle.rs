//! Endpoint states and the transitions between them, after Cilium's
//! endpoint lifecycle: while running, an endpoint moves among
//! waiting-for-identity, waiting-to-regenerate, regenerating and ready; it
//! enters restoring when found at startup, and disconnecting from any state
//! when deleted.

use std::{collections::VecDeque, fmt};

use serde::{Deserialize, Serialize};

use crate::util::timefmt::now_ms;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum State {
    Restoring,
    WaitingForIdentity,
    WaitingToRegenerate,
    Regenerating,
    Ready,
    Disconnecting,
    Disconnected,
}

impl State {
    /// Every state, in lifecycle order.
    pub const ALL: [Self; 7] = [
        Self::Restoring,
        Self::WaitingForIdentity,
        Self::WaitingToRegenerate,
        Self::Regenerating,
        Self::Ready,
        Self::Disconnecting,
        Self::Disconnected,
    ];

    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Restoring => "restoring",
            Self::WaitingForIdentity => "waiting-for-identity",
            Self::WaitingToRegenerate => "waiting-to-regenerate",
            Self::Regenerating => "regenerating",
            Self::Ready => "ready",
            Self::Disconnecting => "disconnecting",
            Self::Disconnected => "disconnected",
        }
    }

    /// Whether `self -> to` is a documented transition.
    #[must_use]
    pub const fn can_become(self, to: Self) -> bool {
        use State::{
            Disconnected, Disconnecting, Ready, Regenerating, Restoring, WaitingForIdentity,
            WaitingToRegenerate,
        };
        match (self, to) {
            // Deletion wins from any live state.
            (Disconnecting, Disconnected) => true,
            (Disconnecting | Disconnected, _) | (_, Disconnected) => false,
            (_, Disconnecting)
            | (Restoring, Regenerating | WaitingForIdentity)
            | (WaitingForIdentity, WaitingToRegenerate | Ready)
            | (WaitingToRegenerate, Regenerating | WaitingForIdentity | Restoring)
            | (Regenerating, Ready | WaitingToRegenerate | WaitingForIdentity)
            | (Ready, WaitingForIdentity | WaitingToRegenerate | Restoring) => true,
            _ => false,
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One transition, as kept in the history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transition {
    pub from: Option<State>,
    pub to: State,
    pub reason: String,
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid endpoint state transition {from} -> {to} ({reason})")]
pub struct InvalidTransition {
    pub from: State,
    pub to: State,
    pub reason: String,
}

/// The current state and a bounded history of transitions.
#[derive(Debug, Clone)]
pub struct Lifecycle {
    state: Option<State>,
    history: VecDeque<Transition>,
    capacity: usize,
}

/// Transitions kept per endpoint.
pub const HISTORY_CAPACITY: usize = 64;

impl Default for Lifecycle {
    fn default() -> Self {
        Self::with_capacity(HISTORY_CAPACITY)
    }
}

impl Lifecycle {
    #[must_use]
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            state: None,
            history: VecDeque::with_capacity(capacity),
            capacity: capacity.max(1),
        }
    }

    /// The current state; `None` before the first transition.
    #[must_use]
    pub const fn state(&self) -> Option<State> {
        self.state
    }

    /// Oldest first.
    pub fn history(&self) -> impl Iterator<Item = &Transition> {
        self.history.iter()
    }

    /// Moves to `to`, recording why. The first transition may only enter
    /// restoring or waiting-for-identity.
    pub fn transition(
        &mut self,
        to: State,
        reason: impl Into<String>,
    ) -> Result<(), InvalidTransition> {
        let reason = reason.into();
        let allowed = match self.state {
            None => matches!(to, State::Restoring | State::WaitingForIdentity),
            Some(from) => from.can_become(to),
        };
        if !allowed {
            return Err(InvalidTransition {
                from: self.state.unwrap_or(State::Disconnected),
                to,
                reason,
            });
        }
        tracing::info!(from = self.state.map(State::as_str), to = to.as_str(), %reason, "endpoint state");
        if self.history.len() == self.capacity {
            self.history.pop_front();
        }
        self.history.push_back(Transition {
            from: self.state,
            to,
            reason,
            at_ms: now_ms(),
        });
        self.state = Some(to);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{State::*, *};

    const ALL: [State; 7] = State::ALL;

    #[test]
    fn fresh_endpoint_path_is_valid() {
        let mut l = Lifecycle::default();
        for s in [
            WaitingForIdentity,
            WaitingToRegenerate,
            Regenerating,
            Ready,
            Disconnecting,
            Disconnected,
        ] {
            l.transition(s, "test").expect("valid");
        }
        assert_eq!(l.state(), Some(Disconnected));
        assert_eq!(l.history().count(), 6);
    }

    #[test]
    fn restore_and_repair_paths_are_valid() {
        let mut l = Lifecycle::default();
        for s in [
            Restoring,
            Regenerating,
            Ready,
            WaitingToRegenerate,
            Regenerating,
            Ready,
        ] {
            l.transition(s, "test").expect("valid");
        }
    }

    #[test]
    fn any_live_state_can_be_deleted_and_disconnected_is_final() {
        for s in ALL {
            let deletable = !matches!(s, Disconnecting | Disconnected);
            assert_eq!(s.can_become(Disconnecting), deletable, "{s}");
        }
        for s in ALL {
            assert!(!Disconnected.can_become(s), "disconnected -> {s}");
        }
        assert!(
            !Ready.can_become(Disconnected),
            "must pass through disconnecting"
        );
    }

    #[test]
    fn invalid_transitions_are_refused_and_not_recorded() {
        let mut l = Lifecycle::default();
        let err = l
            .transition(Ready, "skip ahead")
            .expect_err("first must be restoring or waiting-for-identity");
        assert_eq!(err.to, Ready);
        assert!(l.state().is_none());
        l.transition(WaitingForIdentity, "start").expect("valid");
        let err = l
            .transition(Regenerating, "no identity yet")
            .expect_err("invalid");
        assert_eq!(
            err.to_string(),
            "invalid endpoint state transition waiting-for-identity -> regenerating (no identity yet)"
        );
        assert_eq!(l.state(), Some(WaitingForIdentity));
        assert_eq!(l.history().count(), 1);
    }

    #[test]
    fn history_is_bounded_keeping_the_newest() {
        let mut l = Lifecycle::with_capacity(3);
        l.transition(WaitingForIdentity, "0").expect("valid");
        for i in 1..=10 {
            let to = if i % 2 == 1 {
                WaitingToRegenerate
            } else {
                WaitingForIdentity
            };
            l.transition(to, i.to_string()).expect("valid");
        }
        let reasons: Vec<_> = l.history().map(|t| t.reason.clone()).collect();
        assert_eq!(reasons, ["8", "9", "10"]);
    }

    #[test]
    fn states_serialize_as_cilium_names() {
        assert_eq!(
            serde_json::to_string(&WaitingToRegenerate).expect("json"),
            "\"waiting-to-regenerate\""
        );
        for s in ALL {
            assert_eq!(serde_json::to_string(&s).expect("json"), format!("\"{s}\""));
        }
    }
}
