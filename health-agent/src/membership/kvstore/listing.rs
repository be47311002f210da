//! A listing's pages gathered aside: a reader of
//! [`super::WatchEvent::Snapshot`] keeps what it held until the listing is
//! whole, then takes it at once.

/// A listing under way, if any.
#[derive(Debug)]
pub struct Listing<T>(Option<T>);

impl<T> Default for Listing<T> {
    fn default() -> Self {
        Self(None)
    }
}

impl<T> Listing<T> {
    /// What a page goes into: a new listing (`make`) at a listing's first
    /// page, else the one under way; `None` for a page of a listing that
    /// broke off.
    pub fn page(&mut self, first: bool, make: impl FnOnce() -> T) -> Option<T> {
        if first { Some(make()) } else { self.0.take() }
    }

    /// The listing back after a page: whole at its last page, else kept
    /// for the next one.
    pub fn after_page(&mut self, listing: T, last: bool) -> Option<T> {
        if last {
            Some(listing)
        } else {
            self.0 = Some(listing);
            None
        }
    }

    /// The listing broke off (the watch was lost): its pages are
    /// dropped.
    pub fn abandon(&mut self) {
        self.0 = None;
    }

    /// The listing under way.
    #[must_use]
    pub const fn under_way(&self) -> Option<&T> {
        self.0.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_are_gathered_until_the_last_and_a_broken_listing_is_dropped() {
        let mut l = Listing::<Vec<u8>>::default();
        let take = |l: &mut Listing<Vec<u8>>, first, last, page: &[u8]| {
            let mut into = l.page(first, Vec::new)?;
            into.extend_from_slice(page);
            l.after_page(into, last)
        };
        assert_eq!(take(&mut l, true, false, &[1]), None);
        assert_eq!(take(&mut l, false, true, &[2]), Some(vec![1, 2]));
        assert_eq!(
            take(&mut l, false, true, &[3]),
            None,
            "no listing under way"
        );
        assert_eq!(take(&mut l, true, false, &[4]), None);
        l.abandon();
        assert_eq!(l.under_way(), None);
        assert_eq!(take(&mut l, false, true, &[5]), None, "its pages dropped");
        assert_eq!(take(&mut l, true, true, &[6]), Some(vec![6]), "one page");
    }
}
