//! The published views' changes, taken at a bounded rate. A node may
//! write its own view key as often as etcd lets it, and every agent
//! decodes each value it is sent (up to 1 MiB, a view of many nodes):
//! a node rewriting its key in a loop would otherwise cost every agent
//! of the cluster a decode, a check and a new reply per write. Changes
//! are taken at once when none was taken for [`MIN_GAP`], and otherwise
//! held, only the last value of each key (after its delete, when one came
//! first), until then: an assembler writes once a tick (a second at the
//! least), so its views wait for nothing, while a flood costs each agent
//! at most one batch of views per [`MIN_GAP`]. A listing, and a lost
//! watch, go through at once, after what was held.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use crate::membership::kvstore::WatchEvent;

/// The least time between two batches of changes taken.
pub const MIN_GAP: Duration = Duration::from_millis(250);

/// The least time between two warnings of skipped changes.
const SAID_EVERY: Duration = Duration::from_secs(60);

/// Skipped changes since the last warning past which one is due: an
/// assembler elected publishes at once and again at its tick, which may
/// come within [`MIN_GAP`]; a node writing its key in a loop skips many.
const SAID_PAST: u64 = 4;

/// Past this many keys held, the changes are taken at once: only a writer
/// of the whole prefix makes so many, and holding them would be memory.
const MOST_HELD: usize = 64;

/// A key's changes held: its delete, when one came before the value
/// held, and the last change.
#[derive(Debug)]
struct Held {
    deleted: Option<WatchEvent>,
    last: WatchEvent,
}

/// The changes held, and when the last were taken.
#[derive(Debug, Default)]
pub struct ViewInbox {
    held: BTreeMap<Vec<u8>, Held>,
    last: Option<Instant>,
    /// Changes skipped (replaced by a later value of their key before
    /// they were taken) since the start.
    skipped: u64,
    /// When a warning of them was last due, and their count then.
    said: Option<(Instant, u64)>,
}

impl ViewInbox {
    /// Takes `event` at `now`: the changes to apply now, in order (none
    /// when it is held).
    pub fn take(&mut self, event: WatchEvent, now: Instant) -> Vec<WatchEvent> {
        let (key, is_delete) = match &event {
            WatchEvent::Put(e) => (e.key.clone(), false),
            WatchEvent::Delete { key, .. } => (key.clone(), true),
            WatchEvent::Snapshot { .. } | WatchEvent::Lost { .. } => {
                let mut out = self.release(now);
                out.push(event);
                return out;
            }
        };
        let held = match self.held.remove(&key) {
            None => Held {
                deleted: None,
                last: event,
            },
            Some(old) => {
                self.skipped += u64::from(matches!(old.last, WatchEvent::Put(_)));
                // A value written after a delete comes after it: the view
                // deleted does not come back if the value is refused.
                let deleted = match old.last {
                    WatchEvent::Delete { .. } if !is_delete => Some(old.last),
                    _ if is_delete => None,
                    _ => old.deleted,
                };
                Held {
                    deleted,
                    last: event,
                }
            }
        };
        self.held.insert(key, held);
        let due = self.last.is_none_or(|at| now >= at + MIN_GAP);
        if due || self.held.len() > MOST_HELD {
            self.release(now)
        } else {
            Vec::new()
        }
    }

    /// When the changes held are to be taken, if any are held.
    #[must_use]
    pub fn due(&self) -> Option<Instant> {
        // Something is held only after a batch was taken: the first
        // change is taken at once.
        self.last
            .map(|at| at + MIN_GAP)
            .filter(|_| !self.held.is_empty())
    }

    /// The changes held, taken at `now`, in key order, a key's delete
    /// before its value.
    pub fn release(&mut self, now: Instant) -> Vec<WatchEvent> {
        self.last = Some(now);
        std::mem::take(&mut self.held)
            .into_values()
            .flat_map(|h| h.deleted.into_iter().chain([h.last]))
            .collect()
    }

    /// Changes skipped since the start: a later value of their key was
    /// written before they were taken.
    #[must_use]
    pub const fn skipped(&self) -> u64 {
        self.skipped
    }

    /// The changes skipped since the last warning, when more than a few
    /// and no warning was due for a minute: an assembler writes its key
    /// once a tick, so these are a node writing its own in a loop, to be
    /// said, not once a write.
    pub fn to_say(&mut self, now: Instant) -> Option<u64> {
        let (at, before) = self.said.unwrap_or((now, 0));
        let since = self.skipped - before;
        let quiet = self.said.is_some() && now < at + SAID_EVERY;
        if since <= SAID_PAST || quiet {
            return None;
        }
        self.said = Some((now, self.skipped));
        Some(since)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::membership::kvstore::{Entry, KvError};

    fn put(key: &str, value: &str) -> WatchEvent {
        WatchEvent::Put(Entry {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            mod_revision: 1,
            lease: 0,
        })
    }

    fn values(events: &[WatchEvent]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                WatchEvent::Put(e) => format!(
                    "{}={}",
                    String::from_utf8_lossy(&e.key),
                    String::from_utf8_lossy(&e.value)
                ),
                WatchEvent::Delete { key, .. } => format!("-{}", String::from_utf8_lossy(key)),
                WatchEvent::Snapshot { .. } => "snapshot".to_owned(),
                WatchEvent::Lost { .. } => "lost".to_owned(),
            })
            .collect()
    }

    /// A change after a quiet spell is taken at once; a flood of writes
    /// to one key is taken a batch per gap, only its last value each.
    #[test]
    fn a_flood_of_writes_is_taken_once_a_gap_and_only_its_last() {
        let t0 = Instant::now();
        let mut inbox = ViewInbox::default();
        assert_eq!(values(&inbox.take(put("/v/a", "1"), t0)), ["/v/a=1"]);
        assert_eq!(inbox.due(), None);
        let mut taken = Vec::new();
        let mut now = t0;
        // 1,000 writes over a second: 4 gaps.
        for i in 0..1_000u32 {
            now = t0 + Duration::from_millis(u64::from(i)) + Duration::from_micros(500);
            taken.extend(values(&inbox.take(put("/v/a", &i.to_string()), now)));
        }
        assert_eq!(taken, ["/v/a=250", "/v/a=500", "/v/a=750"]);
        let due = t0 + Duration::from_micros(1_000_500);
        assert_eq!(inbox.due(), Some(due));
        assert!(now < due);
        // The last write is never lost: it is taken when due.
        assert_eq!(values(&inbox.release(due)), ["/v/a=999"]);
        assert_eq!(inbox.skipped(), 1_000 - 4);
        assert_eq!(inbox.to_say(due), Some(1_000 - 4));
        assert_eq!(inbox.to_say(due), None, "counted since last said");
        // "x" taken at once, "y" held and replaced by "z": one skipped,
        // too few to say (an assembler elected writes twice in a gap).
        let later = due + Duration::from_secs(1);
        assert_eq!(inbox.take(put("/v/a", "x"), later).len(), 1);
        assert!(inbox.take(put("/v/a", "y"), later).is_empty());
        assert!(inbox.take(put("/v/a", "z"), later).is_empty());
        assert_eq!(inbox.to_say(due + SAID_EVERY), None);
        // More: said again, a minute after the last at the earliest.
        for v in ["1", "2", "3", "4"] {
            assert!(inbox.take(put("/v/a", v), later).is_empty());
        }
        assert_eq!(inbox.skipped(), 1_000 - 4 + 5);
        assert_eq!(inbox.to_say(later), None);
        assert_eq!(inbox.to_say(due + SAID_EVERY), Some(5));
    }

    /// A value written after a delete within a gap is taken after it, so
    /// that a refused value does not bring back the view deleted; a
    /// delete after a value takes its place.
    #[test]
    fn a_delete_is_taken_before_the_value_written_after_it() {
        let t0 = Instant::now();
        let delete = |key: &str| WatchEvent::Delete {
            key: key.as_bytes().to_vec(),
            revision: 2,
        };
        let mut inbox = ViewInbox::default();
        assert_eq!(inbox.take(put("/v/x", "0"), t0).len(), 1);
        let soon = t0 + Duration::from_millis(1);
        for e in [
            delete("/v/a"),
            put("/v/a", "1"),
            put("/v/a", "2"),
            put("/v/b", "1"),
            delete("/v/b"),
            delete("/v/c"),
            delete("/v/c"),
        ] {
            assert!(inbox.take(e, soon).is_empty());
        }
        assert_eq!(
            values(&inbox.release(t0 + MIN_GAP)),
            ["-/v/a", "/v/a=2", "-/v/b", "-/v/c"]
        );
        assert_eq!(inbox.skipped(), 2, "a=1 and b=1");
    }

    /// Two keys written within a gap (an assembler's hand-over) are both
    /// taken, in key order, a delete as a delete; a listing or a lost
    /// watch goes through at once, after what was held.
    #[test]
    fn keys_are_held_apart_and_a_listing_is_not_held() {
        let t0 = Instant::now();
        let mut inbox = ViewInbox::default();
        assert_eq!(inbox.take(put("/v/b", "1"), t0).len(), 1);
        let soon = t0 + Duration::from_millis(10);
        assert!(inbox.take(put("/v/b", "2"), soon).is_empty());
        assert!(
            inbox
                .take(
                    WatchEvent::Delete {
                        key: b"/v/a".to_vec(),
                        revision: 3
                    },
                    soon
                )
                .is_empty()
        );
        assert!(inbox.take(put("/v/c", "1"), soon).is_empty());
        let listing = WatchEvent::Snapshot {
            revision: 4,
            entries: Vec::new(),
            first: true,
            last: true,
        };
        assert_eq!(
            values(&inbox.take(listing, soon)),
            ["-/v/a", "/v/b=2", "/v/c=1", "snapshot"]
        );
        let lost = WatchEvent::Lost {
            error: Arc::new(KvError::StreamEnded { what: "watch" }),
        };
        assert_eq!(values(&inbox.take(lost, soon)), ["lost"]);
        assert_eq!(inbox.due(), None);
    }

    /// Held keys are bounded: past [`MOST_HELD`], everything goes at once.
    #[test]
    fn many_keys_are_not_held() {
        let t0 = Instant::now();
        let mut inbox = ViewInbox::default();
        inbox.take(put("/v/first", "1"), t0);
        let soon = t0 + Duration::from_millis(1);
        for i in 0..MOST_HELD {
            assert!(inbox.take(put(&format!("/v/{i:03}"), "x"), soon).is_empty());
        }
        assert_eq!(inbox.take(put("/v/last", "x"), soon).len(), MOST_HELD + 1);
        assert_eq!(inbox.due(), None);
    }
}
