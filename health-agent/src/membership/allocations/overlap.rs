//! Allocations that overlap, and every address allocated. Two CIDRs either
//! nest or lie apart, so sorted by first address (the wider first where two
//! start together), a CIDR overlaps an earlier one exactly when it starts
//! before the end of the outermost one still open: that one holds it. The
//! outermost ones, apart from each other, are every health address
//! allocated. A node address two allocations name, or one inside another
//! allocation's CIDR, makes them overlap too.

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

/// A span of addresses (first and last) and the node it is allocated to.
type Span<'a> = (u128, u128, &'a str);

/// What the allocations held say together.
#[derive(Debug, Default)]
pub(super) struct Survey {
    /// Every node whose allocation overlaps another's, with one it
    /// overlaps (neither counts: an address two allocations hold is
    /// neither node's): a CIDR or address is paired with the outermost
    /// CIDR holding it, two naming one address with the first by name, and
    /// of several found, the smallest name is kept.
    pub(super) overlaps: HashMap<String, String>,
    /// Every health address allocated.
    pub(super) spans: Spans,
    /// Each node address an allocation names, with its node (of several
    /// naming one, the first by name; they overlap).
    pub(super) named: HashMap<IpAddr, String>,
    /// Each node address a refused allocation names and no other does,
    /// with its node (the first by name): no other node's.
    pub(super) reserved: HashMap<IpAddr, String>,
}

/// Surveys the allocations held.
#[must_use]
pub(super) fn survey(held: &ByName) -> Survey {
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
    let named = name_node_addresses(held, (&v4, &v6), &mut found);
    let reserved = reserve_refused_names(held, &named);
    let strip =
        |outer: Vec<(u128, u128, &str)>| outer.into_iter().map(|(f, l, _)| (f, l)).collect();
    Survey {
        overlaps: found,
        spans: Spans {
            v4: strip(v4),
            v6: strip(v6),
        },
        named,
        reserved,
    }
}

/// The node addresses refused allocations name that no counted one does,
/// each with the first of its namers by name, whatever the map's order.
fn reserve_refused_names(
    held: &ByName,
    named: &HashMap<IpAddr, String>,
) -> HashMap<IpAddr, String> {
    let mut reserved: HashMap<IpAddr, String> = HashMap::new();
    let refused = held
        .iter()
        .filter_map(|(n, a)| Some((n, a.as_ref().err()?)))
        .flat_map(|(n, r)| r.names.iter().map(move |ip| (n, *ip)));
    for (name, ip) in refused.filter(|(_, ip)| !named.contains_key(ip)) {
        match reserved.get_mut(&ip) {
            Some(first) if name < first => name.clone_into(first),
            Some(_) => {}
            None => {
                reserved.insert(ip, name.clone());
            }
        }
    }
    reserved
}

/// Marks `a` and `b` as overlapping each other (each keeps the smallest
/// name it overlaps, the same whatever the order they were found in).
fn overlap(found: &mut HashMap<String, String>, a: &str, b: &str) {
    for (one, other) in [(a, b), (b, a)] {
        match found.get_mut(one) {
            Some(kept) if other < kept.as_str() => other.clone_into(kept),
            Some(_) => {}
            None => {
                found.insert(one.to_owned(), other.to_owned());
            }
        }
    }
}

/// The node that holds `at` among the outermost spans, if one does.
fn holder<'a>(outer: &[Span<'a>], at: u128) -> Option<&'a str> {
    let after = outer.partition_point(|&(first, _, _)| first <= at);
    let &(_, last, name) = outer.get(after.checked_sub(1)?)?;
    (last >= at).then_some(name)
}

/// Each node address named by an allocation, with its node; allocations
/// naming one overlap the first of them by name, and one naming an address
/// inside another's CIDR overlaps that one.
fn name_node_addresses(
    held: &ByName,
    (v4, v6): (&[Span<'_>], &[Span<'_>]),
    found: &mut HashMap<String, String>,
) -> HashMap<IpAddr, String> {
    let naming = || {
        held.iter()
            .filter_map(|(n, a)| Some((n, a.as_ref().ok()?)))
            .flat_map(|(n, a)| a.node_addresses().map(move |ip| (n, ip)))
    };
    // Each address to the first of its namers by name, whatever the map's
    // order.
    let mut named: HashMap<IpAddr, String> = HashMap::with_capacity(naming().count());
    for (name, ip) in naming() {
        match named.get_mut(&ip) {
            Some(first) if name < first => name.clone_into(first),
            Some(_) => {}
            None => {
                named.insert(ip, name.clone());
            }
        }
    }
    for (name, ip) in naming() {
        let inside = match ip {
            IpAddr::V4(v4ip) => holder(v4, u128::from(u32::from(v4ip))),
            IpAddr::V6(v6ip) => holder(v6, u128::from(v6ip)),
        };
        if let Some(other) = inside {
            overlap(found, name, other);
        }
        if let Some(first) = named.get(&ip).filter(|first| *first != name) {
            overlap(found, name, first);
        }
    }
    named
}

/// Finds the overlaps among `spans` (first address, last address, node);
/// the outermost spans.
fn sweep<'a>(mut spans: Vec<Span<'a>>, found: &mut HashMap<String, String>) -> Vec<Span<'a>> {
    spans.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)).then(a.2.cmp(b.2)));
    let mut outer: Vec<Span<'_>> = Vec::new();
    let mut open: Option<(u128, &str)> = None;
    for (first, last, name) in spans {
        match open {
            Some((end, holder)) if first <= end => overlap(found, name, holder),
            _ => {
                open = Some((last, name));
                outer.push((first, last, name));
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
                        ..Allocation::default()
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
        let Survey {
            overlaps: found,
            spans,
            ..
        } = survey(&held(&[
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
            ("z-outer", Some("198.18.96.0/22"), None),
            ("m-middle", Some("198.18.97.0/24"), None),
            ("n-inner", Some("198.18.97.128/25"), None),
        ]));
        assert_eq!(
            pairs(&found),
            [
                ("deep-1", "deep-2"),
                ("deep-2", "deep-1"),
                ("deep-3", "deep-1"),
                ("deep-4", "deep-1"),
                ("inside", "wide"),
                ("m-middle", "z-outer"),
                ("n-inner", "z-outer"),
                ("twin-1", "twin-2"),
                ("twin-2", "twin-1"),
                ("v6", "v6-inside"),
                ("v6-inside", "v6"),
                ("wide", "inside"),
                ("z-outer", "m-middle"),
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
        let refused = super::super::Refused {
            why: "refused".into(),
            names: vec!["198.18.0.9".parse().expect("ip")],
        };
        h.insert("b".into(), Err(refused));
        let s = survey(&h);
        assert!(s.overlaps.is_empty());
        assert!(s.named.is_empty());
        assert_eq!(
            s.reserved
                .get(&"198.18.0.9".parse().expect("ip"))
                .map(String::as_str),
            Some("b"),
            "its node address is no other node's"
        );
        assert!(s.spans.cover("198.18.64.1".parse().expect("ip")));
    }

    #[test]
    fn node_addresses_named_twice_or_inside_a_cidr_overlap() {
        let mut h = held(&[
            ("a", Some("198.18.64.0/24"), None),
            ("b", Some("198.18.65.0/24"), None),
            ("g", None, Some("2001:2:0:41::/64")),
            ("c", None, None),
            ("d", None, None),
            ("e", None, None),
            ("f", None, None),
        ]);
        let name = |h: &mut ByName, n: &str, ip: Option<&str>, ip6: Option<&str>| {
            if let Some(Ok(a)) = h.get_mut(n) {
                a.node_ip = ip.map(|i| i.parse().expect("ip"));
                a.node_ip6 = ip6.map(|i| i.parse().expect("ip6"));
            }
        };
        name(&mut h, "a", Some("198.18.0.1"), None);
        name(&mut h, "c", Some("198.18.0.3"), Some("2001:2::3"));
        name(&mut h, "d", Some("198.18.65.4"), None);
        name(&mut h, "e", None, Some("2001:2::3"));
        name(&mut h, "f", None, Some("2001:2:0:41::6"));
        for three in ["x-3", "x-1", "x-2"] {
            h.insert(
                three.into(),
                Ok(Allocation {
                    node_ip: Some("198.18.0.30".parse().expect("ip")),
                    ..Allocation::default()
                }),
            );
        }
        let s = survey(&h);
        assert_eq!(
            pairs(&s.overlaps),
            [
                ("b", "d"),
                ("c", "e"),
                ("d", "b"),
                ("e", "c"),
                ("f", "g"),
                ("g", "f"),
                ("x-1", "x-2"),
                ("x-2", "x-1"),
                ("x-3", "x-1"),
            ],
            "d's node address is in b's CIDR, f's in g's; c and e name one"
        );
        let mut named: Vec<(String, &str)> = s
            .named
            .iter()
            .map(|(ip, n)| (ip.to_string(), n.as_str()))
            .collect();
        named.sort_unstable();
        assert_eq!(
            named,
            [
                ("198.18.0.1".to_owned(), "a"),
                ("198.18.0.3".to_owned(), "c"),
                ("198.18.0.30".to_owned(), "x-1"),
                ("198.18.65.4".to_owned(), "d"),
                ("2001:2:0:41::6".to_owned(), "f"),
                ("2001:2::3".to_owned(), "c"),
            ],
            "of two naming one address, the first by name"
        );
    }
}
