//! An agent's reading of the published view: the one key it watches
//! ([`super::published_view::view_key`]). Each value is checked
//! ([`PublishedView::decode`], and not from the future); a refused value
//! is reported with its key and the last good view kept (it goes stale);
//! the view is checked against this agent's own rounds
//! ([`super::contradiction`]) once per view.

use std::time::Duration;

use tracing::warn;

use crate::{
    cluster::{
        contradiction::{Checker, Contradiction},
        published_view::PublishedView,
        view_cell::{Assembly, ClusterReply},
    },
    membership::kvstore::{Entry, WatchEvent},
};

/// How far ahead of the local clock a view's time may be, beyond two of
/// its intervals.
const FUTURE_SLACK_MS: u64 = 5_000;

/// The view read last, and what this agent found against it.
#[derive(Debug)]
pub struct ViewReader {
    key: String,
    local: String,
    current: Option<PublishedView>,
    /// The round and assembler of the view last checked.
    checked: Option<(String, u64)>,
    contradictions: Vec<Contradiction>,
    contradictions_total: u64,
    /// Views refused since the start.
    pub refused: u64,
}

impl ViewReader {
    #[must_use]
    pub fn new(key: String, local: String) -> Self {
        Self {
            key,
            local,
            current: None,
            checked: None,
            contradictions: Vec::new(),
            contradictions_total: 0,
            refused: 0,
        }
    }

    /// The view's key.
    #[must_use]
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The view held (the last good one).
    #[must_use]
    pub const fn current(&self) -> Option<&PublishedView> {
        self.current.as_ref()
    }

    /// Takes an event of the watch on the view's key (others are ignored:
    /// the watch is on a prefix).
    pub fn apply(&mut self, event: WatchEvent, now_ms: u64) {
        match event {
            WatchEvent::Snapshot { entries, .. } => {
                if let Some(e) = entries.into_iter().find(|e| e.key == self.key.as_bytes()) {
                    self.put(&e, now_ms);
                }
            }
            WatchEvent::Put(e) if e.key == self.key.as_bytes() => self.put(&e, now_ms),
            // Deleted, or the watch lost: the view held goes stale.
            WatchEvent::Put(_) | WatchEvent::Delete { .. } | WatchEvent::Lost { .. } => {}
        }
    }

    /// Checks and takes a value of the key: the last good view stays when
    /// it is refused.
    pub fn put(&mut self, e: &Entry, now_ms: u64) {
        match Self::check(&e.value, now_ms) {
            Ok(v) => self.current = Some(v),
            Err(reason) => {
                self.refused += 1;
                warn!(
                    key = %e.key_str(),
                    "cluster view: the published view at {:?} was refused and the last good one kept: {reason}",
                    e.key_str()
                );
            }
        }
    }

    fn check(value: &[u8], now_ms: u64) -> Result<PublishedView, String> {
        let v = PublishedView::decode(value).map_err(|e| e.to_string())?;
        let limit = v
            .interval_ms
            .saturating_mul(2)
            .saturating_add(FUTURE_SLACK_MS);
        let ahead = v.ahead_ms(now_ms);
        if ahead > limit {
            return Err(format!(
                "its time is {ahead} ms ahead of this node's clock (at most {limit} ms)"
            ));
        }
        Ok(v)
    }

    /// Takes a view this agent published itself.
    pub fn published(&mut self, v: PublishedView) {
        self.current = Some(v);
    }

    /// Checks the view held against this agent's own rounds, once per
    /// view; a contradiction is logged and counted.
    pub fn check_contradictions(&mut self, checker: &Checker) {
        let Some(v) = &self.current else {
            return;
        };
        let id = (v.assembler.clone(), v.round);
        if self.checked.as_ref() == Some(&id) {
            return;
        }
        self.checked = Some(id);
        if v.assembler == self.local {
            self.contradictions.clear();
            return;
        }
        self.contradictions = checker.check(&self.local, v);
        if let Some(first) = self.contradictions.first() {
            self.contradictions_total += self.contradictions.len() as u64;
            warn!(
                assembler = %v.assembler,
                round = v.round,
                count = self.contradictions.len(),
                "cluster view: the published view contradicts this agent's rounds (first: {} is {:?} in the view; this agent {})",
                first.node,
                first.published,
                first.here
            );
        }
    }

    /// What the API serves at `now_ms`, if a view was read.
    #[must_use]
    pub fn reply(&self, now_ms: u64) -> Option<ClusterReply> {
        let v = self.current.as_ref()?;
        Some(ClusterReply {
            view: v.view.clone(),
            assembly: Some(Assembly {
                assembled_by: v.assembler.clone(),
                here: v.assembler == self.local,
                round: v.round,
                at_ms: v.at_ms,
                interval_ms: v.interval_ms,
                age_ms: v.age_ms(now_ms),
                stale: v.stale(now_ms),
                unlisted: v.unlisted,
                key: self.key.clone(),
            }),
            contradictions: self.contradictions.clone(),
            contradictions_total: self.contradictions_total,
        })
    }
}

/// `d` in ms.
#[must_use]
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::view::{ClusterView, VerdictCounts};

    fn value(at_ms: u64, assembler: &str) -> Vec<u8> {
        let view = ClusterView {
            reports: 2,
            ignored: 0,
            counts: VerdictCounts {
                healthy: 2,
                ..VerdictCounts::default()
            },
            nodes: Vec::new(),
        };
        PublishedView::of(assembler, 3, at_ms, 1_000, &view).encode()
    }

    fn put(key: &str, value: Vec<u8>) -> WatchEvent {
        WatchEvent::Put(Entry {
            key: key.as_bytes().to_vec(),
            value,
            mod_revision: 1,
            lease: 0,
        })
    }

    #[test]
    fn a_refused_view_keeps_the_last_good_one_which_goes_stale() {
        let mut r = ViewReader::new("/h/view".into(), "me".into());
        let now = 1_000_000;
        r.apply(put("/h/view", value(now, "leader")), now);
        let a = r
            .reply(now + 500)
            .and_then(|x| x.assembly)
            .expect("assembly");
        assert_eq!(
            (a.assembled_by.as_str(), a.here, a.stale, a.age_ms),
            ("leader", false, false, 500)
        );
        // Garbage, a view from the future, another key: refused or ignored.
        r.apply(put("/h/view", b"\x01\x05junk!".to_vec()), now);
        r.apply(put("/h/view", value(now + 7_001, "liar")), now);
        r.apply(put("/h/viewer", value(now, "other")), now);
        assert_eq!(r.refused, 2);
        assert_eq!(r.current().map(|v| v.assembler.as_str()), Some("leader"));
        // Two rounds on, the view held is stale, not current.
        let a = r
            .reply(now + 2_001)
            .and_then(|x| x.assembly)
            .expect("assembly");
        assert!(a.stale, "{a:?}");
        // A new view replaces it; this agent's own is marked as such.
        r.apply(put("/h/view", value(now + 3_000, "me")), now + 3_000);
        let a = r
            .reply(now + 3_000)
            .and_then(|x| x.assembly)
            .expect("assembly");
        assert!(a.here && !a.stale, "{a:?}");
    }
}
