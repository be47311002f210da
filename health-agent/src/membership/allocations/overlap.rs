//! Allocations that overlap. Two CIDRs either nest or lie apart, so sorted
//! by first address (the wider first where two start together), a CIDR
//! overlaps an earlier one exactly when it starts before the end of the
//! widest one still open: that one holds it.

use std::collections::HashMap;

use super::ByName;

/// Every node whose allocation overlaps another's, with one node it
/// overlaps: neither counts (an address two allocations hold is neither
/// node's).
#[must_use]
pub(super) fn overlapping(held: &ByName) -> HashMap<String, String> {
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
    sweep(v4, &mut found);
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
    sweep(v6, &mut found);
    found
}

/// Finds the overlaps among `spans` (first address, last address, node).
fn sweep(mut spans: Vec<(u128, u128, &str)>, found: &mut HashMap<String, String>) {
    spans.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(b.2)));
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
            _ => open = Some((last, name)),
        }
    }
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
        let found = overlapping(&held(&[
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
        ]));
        assert_eq!(
            pairs(&found),
            [
                ("inside", "wide"),
                ("twin-1", "twin-2"),
                ("twin-2", "twin-1"),
                ("v6", "v6-inside"),
                ("v6-inside", "v6"),
                ("wide", "inside"),
            ]
        );
    }

    #[test]
    fn a_refused_allocation_overlaps_nothing() {
        let mut h = held(&[("a", Some("198.18.64.0/24"), None)]);
        h.insert("b".into(), Err("refused".into()));
        assert!(overlapping(&h).is_empty());
    }
}
