use std::sync::Arc;

use super::*;
use crate::membership::{
    Node,
    claims::Holders,
    kvstore::{Entry, KvError},
    record::{Candidate, Field, LocalNode, Origin, Record, Rule},
    validate::validate_allocated,
};

const PREFIX: &str = "/health/allocations/";

fn local() -> LocalNode {
    LocalNode {
        name: Some("me".into()),
        health_cidr: Some("198.18.64.0/24".parse().expect("cidr")),
        health_range: Some("198.18.64.0/18".parse().expect("range")),
        health_range6: Some("2001:2:0:40::/58".parse().expect("range6")),
        ..LocalNode::default()
    }
}

fn entry(key: &str, value: &str) -> Entry {
    Entry {
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
        mod_revision: 1,
        lease: 0,
    }
}

fn cidr(name: &str, cidr: &str) -> Entry {
    entry(
        &format!("{PREFIX}{name}"),
        &format!(r#"{{"health_cidr":"{cidr}"}}"#),
    )
}

fn page(entries: Vec<Entry>, first: bool, last: bool) -> WatchEvent {
    WatchEvent::Snapshot {
        revision: 1,
        entries,
        first,
        last,
    }
}

fn listed(max: usize, entries: Vec<Entry>) -> Allocations {
    listed_by(local(), max, entries)
}

/// Allocations listed by an agent of `local`'s health ranges.
fn listed_by(local: LocalNode, max: usize, entries: Vec<Entry>) -> Allocations {
    let mut a = Allocations::new(PREFIX.into(), local, max);
    assert!(a.apply(page(entries, true, true)));
    a.settle();
    a
}

fn node(name: &str, node_ip: &str, health_ip: &str) -> Node {
    Node {
        name: name.into(),
        node_ip: Some(node_ip.parse().expect("ip")),
        health_ip: Some(health_ip.parse().expect("ip")),
        node_ip6: None,
        health_ip6: None,
        zone: None,
    }
}

fn reason(a: &Allocations, n: &Node) -> Option<String> {
    a.check(n).err().map(|rule| rule.to_string())
}

#[test]
fn an_allocation_decodes_or_is_refused_naming_why() {
    let l = local();
    let ok = |v: &str| Allocation::decode(v.as_bytes(), &l);
    assert_eq!(
        ok(r#"{"health_cidr":"198.18.65.0/24","health_cidr6":"2001:2:0:41::/64"}"#),
        Ok(Allocation {
            cidr: Some("198.18.65.0/24".parse().expect("cidr")),
            cidr6: Some("2001:2:0:41::/64".parse().expect("cidr6")),
            ..Allocation::default()
        })
    );
    assert_eq!(
        ok(r#"{"node_ip":"198.18.0.5","node_ip6":"2001:2::5"}"#),
        Ok(Allocation {
            node_ip: Some("198.18.0.5".parse().expect("ip")),
            node_ip6: Some("2001:2::5".parse().expect("ip6")),
            ..Allocation::default()
        }),
        "node addresses alone"
    );
    for (value, why) in [
        ("{}", "it allocates nothing"),
        ("[1]", "the value is not an allocation"),
        (
            r#"{"health_cidr":"198.18.65.0/24","pod_cidr":"x"}"#,
            "unknown field `pod_cidr`",
        ),
        (r#"{"health_cidr":"198.18.65.0"}"#, "is not a CIDR"),
        (r#"{"health_cidr":"2001:2::/64"}"#, "is not a CIDR"),
        (
            r#"{"health_cidr":"198.18.65.9/24"}"#,
            "health_cidr 198.18.65.9/24 is not a network (its network is 198.18.65.0/24)",
        ),
        (
            r#"{"health_cidr":"198.18.0.0/24"}"#,
            "health_cidr 198.18.0.0/24 is outside the cluster's health range 198.18.64.0/18 (--health-range)",
        ),
        (
            r#"{"health_cidr6":"2001:2::/64"}"#,
            "health_cidr6 2001:2::/64 is outside the cluster's health range 2001:2:0:40::/58 (--health-range6)",
        ),
        (
            r#"{"health_cidr":"198.18.0.0/16"}"#,
            "outside the cluster's health range",
        ),
        (
            r#"{"node_ip":"2001:2::5"}"#,
            r#"node_ip "2001:2::5" is not an IPv4 address"#,
        ),
        (
            r#"{"node_ip6":"198.18.0.5"}"#,
            r#"node_ip6 "198.18.0.5" is not an IPv6 address"#,
        ),
        (r#"{"node_ip":"198.18.0.5/32"}"#, "is not an IPv4 address"),
        (
            r#"{"node_ip":"224.0.0.1"}"#,
            "node_ip 224.0.0.1 is multicast (224.0.0.0/4), which no node may hold",
        ),
        (
            r#"{"node_ip6":"::ffff:198.18.0.5"}"#,
            "node_ip6 ::ffff:198.18.0.5 is IPv4-mapped (::ffff:0:0/96), which no node may hold",
        ),
        (
            r#"{"node_ip":"198.18.70.1"}"#,
            "node_ip 198.18.70.1 is inside the cluster's health range 198.18.64.0/18 (--health-range), which holds health addresses",
        ),
        (
            r#"{"node_ip6":"2001:2:0:41::1"}"#,
            "node_ip6 2001:2:0:41::1 is inside the cluster's health range 2001:2:0:40::/58 (--health-range6)",
        ),
    ] {
        let e = ok(value).expect_err(value);
        assert!(e.contains(why), "{value}: {e}");
    }
    let big = format!(r#"{{"health_cidr":"{}"}}"#, "1".repeat(600));
    let e = ok(&big).expect_err("too large");
    assert!(
        e.starts_with("the value is 618 bytes, more than an allocation's 512"),
        "{e}"
    );
    assert!(
        Allocation::decode(br#"{"health_cidr":"198.18.0.0/24"}"#, &LocalNode::default()).is_ok(),
        "without a range, any network"
    );
    assert_eq!(
        Allocation::decode(
            br#"{"health_cidr":"198.18.0.0/24","node_ip":"198.18.0.9"}"#,
            &LocalNode::default()
        ),
        Err("node_ip 198.18.0.9 is inside the allocation's own health_cidr 198.18.0.0/24".into()),
        "without a range, still not inside its own CIDR"
    );
    assert!(
        Allocation::decode(
            br#"{"health_cidr6":"2001:2::/64","node_ip6":"2001:2::9"}"#,
            &LocalNode::default()
        )
        .is_err_and(|e| e.contains("inside the allocation's own health_cidr6")),
    );
}

#[test]
fn a_health_address_counts_only_inside_its_nodes_allocation() {
    let a = listed(
        10,
        vec![
            cidr("b", "198.18.65.0/24"),
            cidr("c", "198.18.66.0/24"),
            entry(&format!("{PREFIX}d"), "not json"),
            entry(
                &format!("{PREFIX}v6"),
                r#"{"health_cidr6":"2001:2:0:41::/64"}"#,
            ),
            cidr("x", "198.18.72.0/23"),
            cidr("y", "198.18.73.0/24"),
        ],
    );
    assert_eq!(
        reason(&a, &node("y", "198.18.0.25", "198.18.73.1")).as_deref(),
        Some(
            "health-ip 198.18.73.1 is not allocated: the allocation at etcd key \"/health/allocations/y\" overlaps the one at \"/health/allocations/x\", and neither counts"
        )
    );
    assert!(
        reason(&a, &node("x", "198.18.0.24", "198.18.72.1"))
            .is_some_and(|r| r.contains("overlaps the one at \"/health/allocations/y\"")),
        "both refused"
    );
    assert_eq!(
        reason(&a, &node("b", "198.18.66.7", "198.18.65.7")).as_deref(),
        Some(
            "node-ip 198.18.66.7 is inside the cluster's health range 198.18.64.0/18 (--health-range), which holds only allocated health addresses (--kvstore-allocations)"
        ),
        "c's address, claimed by b as its node address"
    );
    let mut v6_node = node("b", "198.18.0.2", "198.18.65.7");
    v6_node.node_ip6 = Some("2001:2:0:41::9".parse().expect("ip6"));
    v6_node.health_ip6 = Some("2001:2:0:41::1".parse().expect("ip6"));
    assert_eq!(
        reason(&a, &v6_node).as_deref(),
        Some(
            "node-ip6 2001:2:0:41::9 is inside the cluster's health range 2001:2:0:40::/58 (--health-range6), which holds only allocated health addresses (--kvstore-allocations)"
        )
    );
    assert_eq!(reason(&a, &node("b", "198.18.0.2", "198.18.65.7")), None);
    assert_eq!(
        reason(&a, &node("b", "198.18.0.2", "198.18.66.7")).as_deref(),
        Some(
            "health-ip 198.18.66.7 is outside the node's allocation 198.18.65.0/24 (etcd key \"/health/allocations/b\")"
        ),
        "c's address, claimed by b"
    );
    assert_eq!(
        reason(&a, &node("e", "198.18.0.5", "198.18.67.1")).as_deref(),
        Some(
            "health-ip 198.18.67.1 is not allocated: no allocation at etcd key \"/health/allocations/e\" (--kvstore-allocations)"
        )
    );
    let refused = reason(&a, &node("d", "198.18.0.4", "198.18.68.1")).expect("refused");
    assert!(
        refused.starts_with(
            "health-ip 198.18.68.1 is not allocated: the allocation at etcd key \"/health/allocations/d\" is refused: the value is not an allocation"
        ),
        "{refused}"
    );
    assert_eq!(
        reason(&a, &node("v6", "198.18.0.6", "198.18.69.1")).as_deref(),
        Some(
            "health-ip 198.18.69.1 is not allocated: the allocation at etcd key \"/health/allocations/v6\" has no health_cidr"
        )
    );
    let mut dual = node("v6", "198.18.0.6", "198.18.69.1");
    dual.health_ip = None;
    dual.node_ip = None;
    dual.node_ip6 = Some("2001:2::6".parse().expect("ip6"));
    dual.health_ip6 = Some("2001:2:0:41::1".parse().expect("ip6"));
    assert_eq!(reason(&a, &dual), None);
    dual.health_ip6 = Some("2001:2:0:42::1".parse().expect("ip6"));
    assert_eq!(
        reason(&a, &dual).as_deref(),
        Some(
            "health-ip6 2001:2:0:42::1 is outside the node's allocation 2001:2:0:41::/64 (etcd key \"/health/allocations/v6\")"
        )
    );
}

/// An agent without a health range of a family (an IPv4-only agent and
/// IPv6 allocations) still refuses a node address some node is allocated.
#[test]
fn a_node_address_allocated_to_a_node_is_refused_without_a_range() {
    let mut a = listed_by(
        LocalNode::default(),
        10,
        vec![
            cidr("b", "198.18.65.0/24"),
            entry(
                &format!("{PREFIX}c"),
                r#"{"health_cidr":"198.18.66.0/24","health_cidr6":"2001:2:0:42::/64"}"#,
            ),
        ],
    );
    let mut squat = node("b", "198.18.66.9", "198.18.65.7");
    assert_eq!(
        reason(&a, &squat).as_deref(),
        Some(
            "node-ip 198.18.66.9 is a health address allocated to a node (--kvstore-allocations), not a node address"
        )
    );
    squat.node_ip = Some("198.18.0.2".parse().expect("ip"));
    assert_eq!(reason(&a, &squat), None);
    squat.node_ip6 = Some("2001:2:0:42::1".parse().expect("ip6"));
    squat.health_ip6 = Some("2001:2:0:41::1".parse().expect("ip6"));
    assert!(
        reason(&a, &squat)
            .is_some_and(|r| r
                .starts_with("node-ip6 2001:2:0:42::1 is a health address allocated to a node")),
        "{:?}",
        reason(&a, &squat)
    );
    // A change is seen once settled.
    assert!(a.apply(WatchEvent::Delete {
        key: format!("{PREFIX}c").into_bytes(),
        revision: 2,
    }));
    a.settle();
    squat.node_ip6 = None;
    squat.health_ip6 = None;
    squat.node_ip = Some("198.18.66.9".parse().expect("ip"));
    assert_eq!(reason(&a, &squat), None, "c's allocation went");
}

/// A node address an allocation names is that node's: another node's
/// record claiming it is refused (also before that node has a record), and
/// the node itself holds no other address of that family.
#[test]
fn a_node_address_an_allocation_names_is_its_nodes_alone() {
    let named = |name: &str, value: &str| entry(&format!("{PREFIX}{name}"), value);
    let a = listed(
        10,
        vec![
            named(
                "b",
                r#"{"health_cidr":"198.18.65.0/24","node_ip":"198.18.0.2","node_ip6":"2001:2::2"}"#,
            ),
            named(
                "c",
                r#"{"health_cidr":"198.18.66.0/24","node_ip":"198.18.0.3"}"#,
            ),
            cidr("d", "198.18.67.0/24"),
            named("twin-1", r#"{"node_ip":"198.18.0.9"}"#),
            named("twin-2", r#"{"node_ip":"198.18.0.9"}"#),
            named("inside", r#"{"node_ip":"198.18.66.200"}"#),
        ],
    );
    assert_eq!(reason(&a, &node("b", "198.18.0.2", "198.18.65.7")), None);
    assert_eq!(
        reason(&a, &node("b", "198.18.0.20", "198.18.65.7")).as_deref(),
        Some(
            "node-ip 198.18.0.20 is not the node's allocated node address 198.18.0.2 (etcd key \"/health/allocations/b\")"
        )
    );
    assert_eq!(
        reason(&a, &node("c", "198.18.0.2", "198.18.66.7")).as_deref(),
        Some(
            "node-ip 198.18.0.2 is not the node's allocated node address 198.18.0.3 (etcd key \"/health/allocations/c\")"
        ),
        "its own allocation's address is told first"
    );
    assert_eq!(
        reason(&a, &node("d", "198.18.0.3", "198.18.67.7")).as_deref(),
        Some("node-ip 198.18.0.3 is allocated to node \"c\" (etcd key \"/health/allocations/c\")"),
        "d's allocation names no node address; c's names this one"
    );
    assert_eq!(
        reason(&a, &node("d", "198.18.0.4", "198.18.67.7")),
        None,
        "an address no allocation names"
    );
    let mut v6 = node("c", "198.18.0.3", "198.18.66.7");
    v6.node_ip6 = Some("2001:2::2".parse().expect("ip6"));
    assert_eq!(
        reason(&a, &v6).as_deref(),
        Some("node-ip6 2001:2::2 is allocated to node \"b\" (etcd key \"/health/allocations/b\")"),
        "c's allocation names no IPv6 node address"
    );
    v6.node_ip6 = Some("2001:2::3".parse().expect("ip6"));
    assert_eq!(reason(&a, &v6), None);
    for (twin, other) in [("twin-1", "twin-2"), ("twin-2", "twin-1")] {
        let mut n = node(twin, "198.18.0.9", "198.18.64.1");
        n.health_ip = None;
        assert_eq!(
            reason(&a, &n),
            Some(format!(
                "node-ip 198.18.0.9 is not allocated: the allocation at etcd key \"/health/allocations/{twin}\" overlaps the one at \"/health/allocations/{other}\", and neither counts"
            )),
            "two allocations naming one address: neither node holds it"
        );
    }
    assert_eq!(
        reason(&a, &node("d", "198.18.0.9", "198.18.67.7")).as_deref(),
        Some(
            "node-ip 198.18.0.9 is named by the allocation at etcd key \"/health/allocations/twin-1\", which overlaps another and counts for nothing"
        ),
        "an overlapping allocation's address stays reserved from a third node"
    );
    assert!(
        a.held
            .get("inside")
            .is_some_and(|v| v.as_ref().is_err_and(|e| e
                .why
                .starts_with("node_ip 198.18.66.200 is inside the cluster's health range")
                && e.names.is_empty())),
        "a node address inside another's CIDR is refused at decode where there is a range: {:?}",
        a.held.get("inside")
    );
    assert_eq!(
        reason(&a, &node("c", "198.18.0.3", "198.18.66.7")),
        None,
        "a refused allocation's node address overlaps nothing"
    );
}

/// The node addresses a refused value still names: those that read as
/// addresses a node may hold, outside the health range and the value's
/// own CIDR, in a value of JSON within the size.
#[test]
fn a_refused_value_names_the_node_addresses_a_node_may_hold() {
    let ranges = local();
    let names = |value: &str| Allocation::named_by_refused(value.as_bytes(), &ranges);
    assert_eq!(
        names(r#"{"health_cidr":"198.18.2.0/24","node_ip":"198.18.0.31","node_ip6":"2001:2::9"}"#),
        [
            "198.18.0.31".parse::<std::net::IpAddr>().expect("ip"),
            "2001:2::9".parse().expect("ip6")
        ]
    );
    let big = format!(r#"{{"node_ip":"198.18.0.31","pad":"{}"}}"#, "x".repeat(600));
    assert!(names(&big).is_empty(), "over the size");
    assert!(
        names(r#"{"health_cidr":"198.18.0.0/24x","node_ip":"198.18.70.1"}"#).is_empty(),
        "inside the health range"
    );
    assert!(
        Allocation::named_by_refused(
            br#"{"health_cidr":"198.18.0.0/24","node_ip":"198.18.0.9"}"#,
            &LocalNode::default()
        )
        .is_empty(),
        "inside its own CIDR: the address is the slip"
    );
}

/// An allocation refused for a slip elsewhere in its value still keeps
/// the node address it names from every other node: the address is not
/// left to the first node that claims it. A counted allocation naming it
/// holds it all the same, and what no node may hold reserves nothing.
#[test]
fn a_refused_allocations_node_address_is_no_other_nodes() {
    let alloc = |name: &str, value: &str| entry(&format!("{PREFIX}{name}"), value);
    let mut a = listed(
        10,
        vec![
            // health_cidr outside the health range: refused.
            alloc(
                "a",
                r#"{"health_cidr":"198.18.2.0/24","node_ip":"198.18.0.31"}"#,
            ),
            cidr("b", "198.18.65.0/24"),
            alloc(
                "m",
                r#"{"health_cidr":"198.18.0.0/24","node_ip":"224.0.0.1"}"#,
            ),
            alloc("n", r#"{"node_ip":"198.18.0.32","pod_cidr":"x"}"#),
            alloc("j", "not json"),
            alloc(
                "x",
                r#"{"health_cidr":"198.18.1.0/24","node_ip6":"2001:2::40"}"#,
            ),
        ],
    );
    // What no node may hold, or a value that is no JSON, reserves nothing.
    for refused in ["m", "j"] {
        assert!(
            a.held[refused].as_ref().is_err_and(|r| r.names.is_empty()),
            "{refused}: {:?}",
            a.held[refused]
        );
    }
    let reserved = |owner: &str| {
        format!(
            "is named by the allocation at etcd key \"{PREFIX}{owner}\", which is refused and counts for nothing: it is no other node's"
        )
    };
    let b = reason(&a, &node("b", "198.18.0.31", "198.18.65.1"));
    assert_eq!(
        b,
        Some(format!("node-ip 198.18.0.31 {}", reserved("a"))),
        "a's address"
    );
    let b = reason(&a, &node("b", "198.18.0.32", "198.18.65.1"));
    assert_eq!(
        b,
        Some(format!("node-ip 198.18.0.32 {}", reserved("n"))),
        "refused for an unknown field, its address all the same"
    );
    let mut b6 = node("b", "198.18.0.33", "198.18.65.1");
    b6.node_ip6 = Some("2001:2::40".parse().expect("ip6"));
    assert_eq!(
        reason(&a, &b6),
        Some(format!("node-ip6 2001:2::40 {}", reserved("x"))),
    );
    assert_eq!(reason(&a, &node("b", "198.18.0.33", "198.18.65.1")), None);
    let own = reason(&a, &node("a", "198.18.0.31", "198.18.65.1")).expect("refused");
    assert!(
        own.contains("the allocation at etcd key \"/health/allocations/a\" is refused: health_cidr 198.18.2.0/24 is outside"),
        "{own}"
    );
    // A counted allocation naming the address holds it; the refused one
    // contests nothing.
    a.apply(WatchEvent::Put(alloc(
        "c",
        r#"{"health_cidr":"198.18.66.0/24","node_ip":"198.18.0.31"}"#,
    )));
    a.settle();
    assert_eq!(reason(&a, &node("c", "198.18.0.31", "198.18.66.1")), None);
    assert_eq!(
        reason(&a, &node("b", "198.18.0.31", "198.18.65.1")),
        Some(
            "node-ip 198.18.0.31 is allocated to node \"c\" (etcd key \"/health/allocations/c\")"
                .into()
        )
    );
    // Once the refused allocation goes, its address is free again.
    for gone in ["a", "c", "n"] {
        a.apply(WatchEvent::Delete {
            key: format!("{PREFIX}{gone}").into_bytes(),
            revision: 2,
        });
    }
    a.settle();
    assert_eq!(reason(&a, &node("b", "198.18.0.31", "198.18.65.1")), None);
    assert_eq!(reason(&a, &node("b", "198.18.0.32", "198.18.65.1")), None);
}

/// Without a health range, a node address named inside another node's
/// CIDR makes the two allocations overlap: neither counts.
#[test]
fn a_node_address_named_inside_another_allocation_overlaps_it() {
    let a = listed_by(
        LocalNode::default(),
        10,
        vec![
            cidr("b", "198.18.65.0/24"),
            entry(&format!("{PREFIX}c"), r#"{"node_ip":"198.18.65.9"}"#),
        ],
    );
    assert_eq!(
        reason(&a, &node("b", "198.18.0.2", "198.18.65.7")).as_deref(),
        Some(
            "health-ip 198.18.65.7 is not allocated: the allocation at etcd key \"/health/allocations/b\" overlaps the one at \"/health/allocations/c\", and neither counts"
        )
    );
    let mut c = node("c", "198.18.65.9", "198.18.65.7");
    c.health_ip = None;
    assert!(
        reason(&a, &c).is_some_and(|r| r.contains("is a health address allocated to a node")),
        "{:?}",
        reason(&a, &c)
    );
}

#[test]
fn keys_not_exactly_the_prefix_and_a_name_allocate_nothing() {
    let a = listed(
        10,
        vec![
            cidr("b/c", "198.18.65.0/24"),
            cidr("-b", "198.18.65.0/24"),
            cidr("", "198.18.65.0/24"),
            entry(
                "/health/allocationsb",
                r#"{"health_cidr":"198.18.65.0/24"}"#,
            ),
        ],
    );
    assert!(a.held.is_empty(), "{:?}", a.held);
    let mut a = a;
    assert!(
        !a.apply(WatchEvent::Put(cidr("x/y", "198.18.65.0/24"))),
        "no change"
    );
    assert!(a.held.is_empty());
}

#[test]
fn a_listing_in_pages_replaces_the_allocations_at_its_last_page() {
    let mut a = Allocations::new(PREFIX.into(), local(), 10);
    assert!(!a.synced(), "nothing listed yet");
    assert!(!a.apply(page(vec![cidr("b", "198.18.65.0/24")], true, false)));
    assert!(!a.synced(), "a listing under way");
    assert!(a.apply(page(vec![cidr("c", "198.18.66.0/24")], false, true)));
    assert!(a.synced());
    let c = node("c", "198.18.0.3", "198.18.66.1");
    assert_eq!(reason(&a, &c), None, "the second page's");
    assert_eq!(reason(&a, &node("b", "198.18.0.2", "198.18.65.1")), None);
    // The watch breaks: what is held stays, the error is said, and no set
    // is judged until the prefix is listed again.
    assert!(!a.apply(WatchEvent::Lost {
        error: Arc::new(KvError::Timeout {
            op: "watch".into(),
            timeout: std::time::Duration::from_secs(5),
        }),
    }));
    assert!(!a.synced());
    let e = a.error().expect("error");
    assert!(
        e.starts_with("the allocations under /health/allocations/: "),
        "{e}"
    );
    assert!(a.apply(page(vec![cidr("b", "198.18.65.0/24")], true, true)));
    assert_eq!(a.error(), None);
    assert!(
        reason(&a, &c).is_some_and(|r| r.contains("no allocation")),
        "c's allocation went with the new listing"
    );
    // A delete and a put, one key at a time.
    assert!(a.apply(WatchEvent::Delete {
        key: format!("{PREFIX}b").into_bytes(),
        revision: 3,
    }));
    assert!(reason(&a, &node("b", "198.18.0.2", "198.18.65.1")).is_some());
    assert!(a.apply(WatchEvent::Put(cidr("b", "198.18.70.0/24"))));
    assert!(reason(&a, &node("b", "198.18.0.2", "198.18.70.1")).is_none());
}

#[test]
fn allocations_past_the_bound_are_not_held_said_and_read_again_once_one_goes() {
    let mut a = listed(
        2,
        vec![
            cidr("a", "198.18.65.0/24"),
            cidr("b", "198.18.66.0/24"),
            cidr("c", "198.18.67.0/24"),
        ],
    );
    assert_eq!(a.held.len(), 2);
    // Left unheld on an earlier page of a listing: said at its last.
    let mut paged = Allocations::new(PREFIX.into(), local(), 2);
    assert!(!paged.apply(page(
        vec![
            cidr("a", "198.18.65.0/24"),
            cidr("b", "198.18.66.0/24"),
            cidr("c", "198.18.67.0/24"),
        ],
        true,
        false
    )));
    assert!(paged.apply(page(Vec::new(), false, true)));
    assert!(paged.error().is_some(), "the first page's breach is kept");
    assert_eq!(
        a.error().as_deref(),
        Some(
            "more allocations under /health/allocations/ than --max-nodes 2: the node set is refused whole until some go"
        )
    );
    assert!(a.apply(WatchEvent::Put(cidr("a", "198.18.68.0/24"))));
    assert_eq!(
        a.held.get("a"),
        Some(&Ok(Allocation {
            cidr: Some("198.18.68.0/24".parse().expect("cidr")),
            ..Allocation::default()
        })),
        "a held one changes in place"
    );
    assert!(!a.take_reread(), "nothing went yet");
    assert!(a.apply(WatchEvent::Delete {
        key: format!("{PREFIX}a").into_bytes(),
        revision: 2,
    }));
    assert!(a.take_reread(), "room for one not held: read again");
    assert!(!a.take_reread(), "asked once");
    // A listing under way leaves the bound's breach said until its last
    // page: what is held meanwhile is still the partial set.
    assert!(!a.apply(page(vec![cidr("b", "198.18.66.0/24")], true, false)));
    assert!(a.error().is_some(), "said until the listing is whole");
    assert!(a.apply(page(vec![cidr("c", "198.18.67.0/24")], false, true)));
    assert_eq!(a.error(), None);
    assert_eq!(a.held.len(), 2);
}

fn etcd_record(name: &str, node_ip: &str, health_ip: &str) -> Candidate {
    Candidate {
        record: Record {
            origin: Origin::Etcd {
                key: format!("/health/nodes/{name}"),
                prefix_len: "/health/nodes/".len(),
            },
            name: Some(name.into()),
        },
        node: Ok(node(name, node_ip, health_ip)),
    }
}

/// A node that registers before the one a health address is allocated to
/// cannot take it: refused alone, it claims nothing, and the rightful
/// node takes it, whatever the order.
#[test]
fn a_record_outside_its_allocation_claims_nothing() {
    let a = listed(
        10,
        vec![
            cidr("me", "198.18.64.0/24"),
            cidr("b", "198.18.65.0/24"),
            cidr("squatter", "198.18.66.0/24"),
        ],
    );
    let l = local();
    let records = || {
        vec![
            etcd_record("a-squatter", "198.18.0.9", "198.18.65.1"),
            etcd_record("b", "198.18.0.2", "198.18.65.1"),
            etcd_record("me", "198.18.0.1", "198.18.71.1"),
            etcd_record("squatter", "198.18.0.8", "198.18.65.2"),
        ]
    };
    let v = validate_allocated(records(), (&l, Some(&a)), &Holders::default());
    let names: Vec<&str> = v.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["b", "me"]);
    let reasons: Vec<(String, String)> = v
        .rejected
        .iter()
        .map(|r| (r.record.location(), r.rule.to_string()))
        .collect();
    assert_eq!(
        reasons,
        [
            (
                "/health/nodes/a-squatter".to_owned(),
                "health-ip 198.18.65.1 is not allocated: no allocation at etcd key \"/health/allocations/a-squatter\" (--kvstore-allocations)".to_owned()
            ),
            (
                "/health/nodes/squatter".to_owned(),
                "health-ip 198.18.65.2 is outside the node's allocation 198.18.66.0/24 (etcd key \"/health/allocations/squatter\")".to_owned()
            ),
        ]
    );
    // Without allocations, the squatter's earlier claim contests b's.
    let v = crate::membership::validate::validate(records(), &l, &Holders::default());
    assert!(v.nodes.get("b").is_none(), "{:?}", v.nodes);
    // This node's own record (outside its allocation above) is its own
    // configuration: not judged here, but said.
    let stray = node("me", "198.18.0.1", "198.18.70.1");
    assert_eq!(
        a.own_mismatch(&stray).as_deref(),
        Some(
            "this node's record is refused by its peers: health-ip 198.18.70.1 is outside the node's allocation 198.18.64.0/24 (etcd key \"/health/allocations/me\")"
        )
    );
    assert_eq!(
        a.own_mismatch(&node("me", "198.18.0.1", "198.18.64.1")),
        None
    );
}

/// A node address named in an allocation cannot be taken by a node that
/// registers first: refused alone, its record claims nothing, and the
/// named node takes the address when it comes.
#[test]
fn a_record_claiming_a_named_node_address_claims_nothing() {
    let a = listed(
        10,
        vec![
            entry(
                &format!("{PREFIX}b"),
                r#"{"health_cidr":"198.18.65.0/24","node_ip":"198.18.0.2"}"#,
            ),
            cidr("a-squatter", "198.18.66.0/24"),
        ],
    );
    let l = local();
    let squat = etcd_record("a-squatter", "198.18.0.2", "198.18.66.1");
    let v = validate_allocated(vec![squat], (&l, Some(&a)), &Holders::default());
    assert!(v.nodes.is_empty());
    let v = validate_allocated(
        vec![
            etcd_record("a-squatter", "198.18.0.2", "198.18.66.1"),
            etcd_record("b", "198.18.0.2", "198.18.65.1"),
        ],
        (&l, Some(&a)),
        &Holders::default(),
    );
    let names: Vec<&str> = v.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["b"]);
    assert_eq!(
        v.rejected
            .iter()
            .map(|r| r.rule.to_string())
            .collect::<Vec<_>>(),
        ["node-ip 198.18.0.2 is allocated to node \"b\" (etcd key \"/health/allocations/b\")"]
    );
    // Without allocations the first claimant's record contests b's.
    let v = crate::membership::validate::validate(
        vec![
            etcd_record("a-squatter", "198.18.0.2", "198.18.66.1"),
            etcd_record("b", "198.18.0.2", "198.18.65.1"),
        ],
        &l,
        &Holders::default(),
    );
    assert!(v.nodes.get("b").is_none(), "{:?}", v.nodes);
}

/// The allocations are the authority: a claim they back outranks the hold
/// of a node that held the address before (its record now refused, or gone
/// and still within its hold), where without them the holder keeps it.
#[test]
fn an_allocated_claim_outranks_a_hold() {
    let l = local();
    let a = listed(
        10,
        vec![
            entry(
                &format!("{PREFIX}b"),
                r#"{"health_cidr":"198.18.65.0/24","node_ip":"198.18.0.2"}"#,
            ),
            entry(
                &format!("{PREFIX}h"),
                r#"{"health_cidr":"198.18.66.0/24","node_ip":"198.18.0.8"}"#,
            ),
        ],
    );
    // h held 198.18.0.2 and 198.18.65.1 in the last good set.
    let before =
        crate::membership::NodeSet::new(vec![node("h", "198.18.0.2", "198.18.65.1")]).expect("set");
    let b = || etcd_record("b", "198.18.0.2", "198.18.65.1");
    for (holders, gone) in [
        (Holders::of(&before), false),
        (Holders::of(&before).departing(usize::MAX), true),
    ] {
        let records = if gone {
            vec![b()]
        } else {
            vec![b(), etcd_record("h", "198.18.0.2", "198.18.65.1")]
        };
        let v = validate_allocated(records.clone(), (&l, Some(&a)), &holders);
        let names: Vec<&str> = v.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(names, ["b"], "h gone: {gone}: {:?}", v.rejected);
        let without = crate::membership::validate::validate(records, &l, &holders);
        assert!(
            without.nodes.get("b").is_none(),
            "h gone: {gone}: without allocations the hold stands"
        );
    }
}

/// Only the allocations' word outranks a hold: a claimant whose allocation
/// names no node address, or does not count, or claims the address in
/// another field, is not backed, and the holder keeps the address; two
/// claimants neither is given it to contest it as without allocations.
#[test]
fn an_unallocated_claim_does_not_outrank_a_hold() {
    let l = local();
    let a = listed(
        10,
        vec![
            cidr("b", "198.18.65.0/24"),
            cidr("h", "198.18.66.0/24"),
            cidr("x", "198.18.67.0/24"),
            entry(
                &format!("{PREFIX}o"),
                r#"{"health_cidr":"198.18.68.0/24","node_ip":"198.18.0.7"}"#,
            ),
            cidr("o-twin", "198.18.68.0/25"),
        ],
    );
    assert!(!a.backs("b", Field::NodeIp, "198.18.0.2".parse().expect("ip")));
    assert!(a.backs("b", Field::HealthIp, "198.18.65.1".parse().expect("ip")));
    assert!(
        !a.backs("b", Field::NodeIp, "198.18.65.1".parse().expect("ip")),
        "a health address claimed as a node address"
    );
    assert!(
        !a.backs("o", Field::NodeIp, "198.18.0.7".parse().expect("ip")),
        "an allocation that overlaps another backs nothing"
    );
    assert!(!a.backs("o", Field::HealthIp, "198.18.68.1".parse().expect("ip")));
    let before =
        crate::membership::NodeSet::new(vec![node("h", "198.18.0.2", "198.18.66.1")]).expect("set");
    let b = || etcd_record("b", "198.18.0.2", "198.18.65.1");
    let v = validate_allocated(
        vec![b(), etcd_record("h", "198.18.0.2", "198.18.66.1")],
        (&l, Some(&a)),
        &Holders::of(&before),
    );
    let names: Vec<&str> = v.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["h"], "h's record there: {:?}", v.rejected);
    let v = validate_allocated(
        vec![b()],
        (&l, Some(&a)),
        &Holders::of(&before).departing(usize::MAX),
    );
    assert!(v.nodes.is_empty(), "h gone, within its hold");
    assert_eq!(
        v.rejected
            .iter()
            .map(|r| r.rule.clone())
            .collect::<Vec<_>>(),
        [Rule::Held {
            field: Field::NodeIp,
            ip: "198.18.0.2".parse().expect("ip"),
            holder: "h".into(),
        }]
    );
    let v = validate_allocated(
        vec![b(), etcd_record("x", "198.18.0.2", "198.18.67.1")],
        (&l, Some(&a)),
        &Holders::default(),
    );
    assert!(v.nodes.is_empty(), "{:?}", v.nodes);
    assert!(
        v.rejected
            .iter()
            .all(|r| matches!(r.rule, Rule::Contested { .. })),
        "{:?}",
        v.rejected
    );
}
