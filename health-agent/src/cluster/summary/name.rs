//! A peer's name as a summary holds it: one pointer to a shared,
//! counted copy of the name, whose length is kept with its bytes.
//!
//! The elected assembler holds every observer's summary, about 52 peers
//! each at 50,000 nodes: 2.6 million names, nearly all shared with other
//! summaries ([`super::Names`]). A `std::sync::Arc<str>` is a pointer and
//! a length, 16 bytes; this handle is 8, which takes a held peer from 40
//! bytes to 32.

use std::{borrow::Borrow, fmt, hash, ops::Deref};

use triomphe::ThinArc;

/// A peer's name: shared, counted, 8 bytes.
#[derive(Clone)]
pub struct PeerName(ThinArc<(), u8>);

impl PeerName {
    #[must_use]
    pub fn as_str(&self) -> &str {
        let bytes = &self.0.slice;
        // SAFETY: the bytes were copied from a `&str` when the name was
        // made (`From<&str>`, the only way to make one) and are never
        // changed: they are valid UTF-8.
        unsafe { std::str::from_utf8_unchecked(bytes) }
    }

    /// Whether `a` and `b` share one copy of their name.
    #[must_use]
    pub fn same_copy(a: &Self, b: &Self) -> bool {
        std::ptr::eq(a.0.ptr(), b.0.ptr())
    }

    /// How many handles share this copy of the name.
    #[must_use]
    pub fn shared_by(this: &Self) -> usize {
        ThinArc::strong_count(&this.0)
    }
}

impl From<&str> for PeerName {
    fn from(name: &str) -> Self {
        Self(ThinArc::from_header_and_slice((), name.as_bytes()))
    }
}

impl From<String> for PeerName {
    fn from(name: String) -> Self {
        Self::from(name.as_str())
    }
}

impl From<&String> for PeerName {
    fn from(name: &String) -> Self {
        Self::from(name.as_str())
    }
}

impl Deref for PeerName {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl Borrow<str> for PeerName {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for PeerName {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq for PeerName {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for PeerName {}

impl PartialOrd for PeerName {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for PeerName {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

/// As the `str` it holds, so that a set of names is searched by `&str`.
impl hash::Hash for PeerName {
    fn hash<H: hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl fmt::Debug for PeerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for PeerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self.as_str(), f)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn a_name_is_one_pointer_and_reads_as_its_str() {
        assert_eq!(size_of::<PeerName>(), size_of::<usize>());
        assert_eq!(size_of::<Option<PeerName>>(), size_of::<usize>());
        let n = PeerName::from("ip-198-18-0-1.ec2.internal");
        assert_eq!(&*n, "ip-198-18-0-1.ec2.internal");
        assert_eq!(n.len(), 26);
        assert_eq!(PeerName::from("").as_str(), "");
        assert_eq!(PeerName::from("nœud-é").as_str(), "nœud-é");
        assert_eq!(format!("{n}"), "ip-198-18-0-1.ec2.internal");
        assert_eq!(format!("{n:?}"), "\"ip-198-18-0-1.ec2.internal\"");
    }

    #[test]
    fn names_compare_hash_and_are_found_as_their_str() {
        let (a, b) = (PeerName::from("node-a"), PeerName::from("node-b"));
        assert!(a < b && a == PeerName::from("node-a".to_owned()));
        let set: HashSet<PeerName> = [a.clone(), b].into_iter().collect();
        assert!(set.contains("node-a") && set.contains("node-b") && !set.contains("node-c"));
        assert_eq!(PeerName::shared_by(&a), 2, "a and the set's copy");
        let c = a.clone();
        assert_eq!(PeerName::shared_by(&c), 3);
        drop(set);
        assert_eq!(PeerName::shared_by(&c), 2);
        assert!(PeerName::same_copy(&a, &c));
        assert!(!PeerName::same_copy(&a, &PeerName::from("node-a")));
    }
}
