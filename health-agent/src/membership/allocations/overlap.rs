//! Allocations that overlap, and every address allocated. Two CIDRs either
//! nest or lie apart, so sorted by first address (the wider first where two
//! start together), a CIDR overlaps an earlier one exactly when it starts
//! before the end of the outermost one still open: that one holds it. The
//! outermost ones, apart from each other, are every address allocated.

use std::{collections::HashMap, net::IpAddr};

use super::ByName;

/// The addresses allocated to any node: in each family, the outermost
/// allocations' spans (first and last address), sorted and apart.
#[derive(Debug, Default)]
pub(super) struct Spans {
    v4: Vec<(u128, u128)>,
    v6: Vec<(u128, u128)>,
}

impl Spans {
    /// Whether `ip` is allocated to some node.
    pub(super) fn cover(&self, ip: IpAddr) -> bool {
        let (spans, at) = match ip {
            IpAddr::V4(v4) => (&self.v4, u128::from(u32::from(v4))),
            IpAddr::V6(v6) => (&self.v6, u128::from(v6)),
        };
        let after = spans.partition_point(|&(first, _)| first <= at);
        after > 0 && spans[after - 1].1 >= at
    }
}

/// Every node whose allocation overlaps another's, with one node it
/// overlaps (neither counts: an address two allocations hold is neither
/// node's), and every address allocated.
#[must_use]
pub(super) fn survey(held: &ByName) -> (HashMap<String, String>, Spans) {
    let mut found = HashMap::new();
    let allocated = || {
        held.iter()
            .filter_map(|(name, a)| Some((name, a.as_ref().ok()?)))
    };
    let v4 = allocated()
        .filter_map(|(name, a)| {
            let c = a.cidr?;
            Some((
                u128::from(u32::from(c.network())),
                u128::from(u32::from(c.broadcast())),
                name.as_str(),
            ))
        })
        .collect();
    let v4 = sweep(v4, &mut found);
    let v6 = allocated()
        .filter_map(|(name, a)| {
            let c = a.cidr6?;
            Some((
                u128::from(c.network()),
                u128::from(c.broadcast()),
                name.as_str(),
            ))
        })
        .collect();
    let v6 = sweep(v6, &mut found);
    (found, Spans { v4, v6 })
}

/// Finds the overlaps among `spans` (first address, last address, node);
/// the outermost spans.
fn sweep(
    mut spans: Vec<(u128, u128, &str)>,
    found: &mut HashMap<String, String>,
) -> Vec<(u128, u128)> {
    spans.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(b.2)));
    let mut outer: Vec<(u128, u128)> = Vec::new();
    let mut open: Option<(u128, &str)> = None;
    for (first, last, name) in spans {
        match open {
            Some((end, holder)) if first <= end => {
                found
                    .entry(name.to_owned())
                    .or_insert_with(|| holder.to_owned());
                found
                    .entry(holder.to_owned())
                    .or_insert_with(|| name.to_owned());
            }
            _ => {
                open = Some((last, name));
                outer.push((first, last));
            }
        }
    }
    outer
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::membership::allocations::Allocation;

    fn held(entries: &[(&str, Option<&str>, Option<&str>)]) -> ByName {
        entries
            .iter()
            .map(|(name, c4, c6)| {
                (
                    (*name).to_owned(),
                    Ok(Allocation {
                        cidr: c4.map(|c| c.parse().expect("cidr")),
                        cidr6: c6.map(|c| c.parse().expect("cidr6")),
                    }),
                )
            })
            .collect()
    }

    fn pairs(found: &HashMap<String, String>) -> Vec<(&str, &str)> {
        let mut v: Vec<(&str, &str)> = found
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn nested_and_equal_cidrs_overlap_and_adjacent_ones_do_not() {
        let (found, spans) = survey(&held(&[
            ("a", Some("198.18.64.0/24"), None),
            ("b", Some("198.18.65.0/24"), None),
            ("wide", Some("198.18.66.0/23"), None),
            ("inside", Some("198.18.67.0/25"), None),
            ("twin-1", Some("198.18.70.0/24"), None),
            ("twin-2", Some("198.18.70.0/24"), None),
            ("v6", None, Some("2001:2:0:41::/64")),
            (
                "v6-inside",
                Some("198.18.80.0/24"),
                Some("2001:2:0:41:8000::/65"),
            ),
            ("v6-apart", None, Some("2001:2:0:42::/64")),
            ("deep-1", Some("198.18.88.0/22"), None),
            ("deep-2", Some("198.18.89.0/24"), None),
            ("deep-3", Some("198.18.89.128/25"), None),
            ("deep-4", Some("198.18.89.128/25"), None),
        ]));
        assert_eq!(
            pairs(&found),
            [
                ("deep-1", "deep-2"),
                ("deep-2", "deep-1"),
                ("deep-3", "deep-1"),
                ("deep-4", "deep-1"),
                ("inside", "wide"),
                ("twin-1", "twin-2"),
                ("twin-2", "twin-1"),
                ("v6", "v6-inside"),
                ("v6-inside", "v6"),
                ("wide", "inside"),
            ]
        );
        for (ip, allocated) in [
            ("198.18.63.255", false),
            ("198.18.64.0", true),
            ("198.18.65.255", true),
            ("198.18.67.200", true),
            ("198.18.68.0", false),
            ("198.18.89.200", true),
            ("198.18.91.255", true),
            ("198.18.92.0", false),
            ("2001:2:0:41::9", true),
            ("2001:2:0:43::", false),
            ("0.0.0.0", false),
            ("::", false),
        ] {
            assert_eq!(spans.cover(ip.parse().expect("ip")), allocated, "{ip}");
        }
    }

    #[test]
    fn a_refused_allocation_overlaps_nothing() {
        let mut h = held(&[("a", Some("198.18.64.0/24"), None)]);
        h.insert("b".into(), Err("refused".into()));
        let (found, spans) = survey(&h);
        assert!(found.is_empty());
        assert!(spans.cover("198.18.64.1".parse().expect("ip")));
    }
}
