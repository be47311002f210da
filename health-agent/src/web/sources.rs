//! The listener's cap per source: at most so many connections at once from
//! one client ([`Source`]: an IPv4 address or an IPv6 /64).

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

use crate::util::source::Source;

/// Connections open per source.
#[derive(Debug)]
pub(super) struct PerSource {
    open: Mutex<HashMap<Source, usize>>,
    cap: usize,
}

/// A connection's place in its source's share, given back when dropped.
#[derive(Debug)]
pub(super) struct SourceSlot {
    table: Arc<PerSource>,
    source: Source,
}

impl PerSource {
    pub(super) fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            open: Mutex::new(HashMap::new()),
            cap,
        })
    }

    /// A place for one more connection from `source`; `None` when it has
    /// its share open.
    pub(super) fn take(self: &Arc<Self>, source: Source) -> Option<SourceSlot> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let n = open.entry(source).or_insert(0);
        if *n >= self.cap {
            return None;
        }
        *n += 1;
        Some(SourceSlot {
            table: Arc::clone(self),
            source,
        })
    }

    #[cfg(test)]
    fn open(&self, source: Source) -> usize {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.get(&source).copied().unwrap_or(0)
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut open = self
            .table
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.source) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.source);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use super::*;

    #[test]
    fn a_source_holds_its_share_and_gets_places_back_as_they_end() {
        let table = PerSource::new(2);
        let a = Source::of(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)));
        let b = Source::of(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)));
        let first = table.take(a).expect("1 of 2");
        let second = table.take(a).expect("2 of 2");
        assert!(table.take(a).is_none(), "past its share");
        let _other = table.take(b).expect("another source has its own");
        drop(first);
        assert_eq!(table.open(a), 1);
        let again = table.take(a).expect("a place came back");
        drop(again);
        drop(second);
        assert_eq!(table.open(a), 0);
        assert_eq!(table.open.lock().expect("lock").len(), 1, "only b left");
    }
}
