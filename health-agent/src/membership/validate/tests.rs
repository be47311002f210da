use super::*;
use crate::membership::record::{Record, RejectedRecord};

fn ip(s: &str) -> Ipv4Addr {
    s.parse().expect("test address")
}

fn file(entry: usize, name: &str, node_ip: &str, health_ip: &str) -> Candidate {
    Candidate {
        record: Record {
            origin: Origin::File {
                path: "nodes.yaml".into(),
                line: Some(entry * 3),
                entry,
            },
            name: Some(name.into()),
        },
        node: Ok(Node {
            name: name.into(),
            node_ip: Some(ip(node_ip)),
            health_ip: Some(ip(health_ip)),
            node_ip6: None,
            health_ip6: None,
            zone: None,
        }),
    }
}

fn local() -> LocalNode {
    LocalNode {
        name: Some("me".into()),
        health_cidr: Some("198.18.64.0/24".parse().expect("cidr")),
        health_cidr6: None,
        ..LocalNode::default()
    }
}

fn names(v: &Validated) -> Vec<&str> {
    v.nodes.iter().map(|n| n.name.as_str()).collect()
}

#[test]
fn good_records_make_the_set() {
    let v = validate(
        vec![
            file(1, "me", "198.18.0.10", "198.18.64.2"),
            file(2, "b", "198.18.0.12", "198.18.65.2"),
        ],
        &local(),
        &Holders::default(),
    );
    assert!(v.rejected.is_empty(), "{:?}", v.rejected);
    assert_eq!(names(&v), ["b", "me"]);
    assert_eq!(v.summary(), None);
}

#[test]
fn unusable_addresses_are_rejected_naming_record_field_and_class() {
    for (addr, class) in [
        ("0.0.0.0", "unspecified"),
        ("0.1.2.3", "unspecified"),
        ("127.0.0.1", "loopback"),
        ("169.254.1.1", "link-local"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("255.255.255.255", "broadcast"),
        ("240.0.0.1", "reserved"),
    ] {
        for (node_ip, health_ip, field) in [
            (addr, "198.18.66.2", "node-ip"),
            ("198.18.0.13", addr, "health-ip"),
        ] {
            let v = validate(
                vec![
                    file(1, "a", "198.18.0.11", "198.18.65.2"),
                    file(2, "bad", node_ip, health_ip),
                    file(3, "c", "198.18.0.14", "198.18.67.2"),
                ],
                &local(),
                &Holders::default(),
            );
            assert_eq!(names(&v), ["a", "c"], "the good ones stay");
            assert_eq!(v.rejected.len(), 1);
            let text = v.rejected[0].to_string();
            assert!(
                text.starts_with("nodes.yaml:6: node \"bad\": ")
                    && text.contains(&format!("{field} {addr} is "))
                    && text.contains(class),
                "{text}"
            );
        }
    }
}

#[test]
fn address_classes() {
    let class = |s: &str| address_class(s.parse().expect(s));
    assert_eq!(class("198.18.0.1"), None);
    assert_eq!(class("10.0.0.1"), None);
    assert_eq!(class("169.253.0.1"), None);
    assert_eq!(class("223.255.255.255"), None);
    assert!(class("127.255.0.1").is_some());
    assert_eq!(class("2001:2::1"), None);
    assert_eq!(class("fd00::1"), None);
    assert_eq!(class("febf::1"), Some("link-local (fe80::/10)"));
    assert_eq!(class("fec0::1"), None);
    assert!(class("::").is_some());
    assert!(class("::ffff:198.18.0.1").is_some());
}

#[test]
fn peers_inside_this_nodes_health_cidr_are_rejected_but_not_this_node() {
    let v = validate(
        vec![
            file(1, "peer", "198.18.0.11", "198.18.64.9"),
            file(2, "me", "198.18.0.10", "198.18.64.2"),
            file(3, "peer2", "198.18.64.7", "198.18.66.2"),
            file(4, "ok", "198.18.0.12", "198.18.65.2"),
        ],
        &local(),
        &Holders::default(),
    );
    assert_eq!(names(&v), ["me", "ok"]);
    let texts: Vec<String> = v.rejected.iter().map(ToString::to_string).collect();
    assert_eq!(
        texts,
        [
            "nodes.yaml:3: node \"peer\": health-ip 198.18.64.9 is inside this node's health CIDR 198.18.64.0/24",
            "nodes.yaml:9: node \"peer2\": node-ip 198.18.64.7 is inside this node's health CIDR 198.18.64.0/24",
        ]
    );
    // Without a local CIDR (no endpoint known) the rule does not apply.
    let v = validate(
        vec![file(1, "peer", "198.18.0.11", "198.18.64.9")],
        &LocalNode::default(),
        &Holders::default(),
    );
    assert_eq!(names(&v), ["peer"]);
}

#[test]
fn names_are_checked() {
    let long = "a".repeat(MAX_NAME_LEN + 1);
    let just = "a".repeat(MAX_NAME_LEN);
    for (name, needle) in [
        ("", "the name is empty"),
        (long.as_str(), "254 bytes long, more than 253"),
        ("a b", "\"a b\" is not a node name"),
        ("a/b", "\"a/b\" is not a node name"),
        ("-rf", "\"-rf\" is not a node name"),
        (".hidden", "\".hidden\" is not a node name"),
        ("nöde", "is not a node name"),
        ("a\nb", "is not a node name"),
    ] {
        let v = validate(
            vec![
                file(1, name, "198.18.0.11", "198.18.65.2"),
                file(2, "good", "198.18.0.12", "198.18.66.2"),
            ],
            &local(),
            &Holders::default(),
        );
        assert_eq!(names(&v), ["good"], "{name:?}");
        let text = v.rejected[0].to_string();
        assert!(text.contains(needle), "{text}");
        assert!(text.starts_with("nodes.yaml:3: node "), "{text}");
    }
    for name in [just.as_str(), "node-1.example_a", "0a", "A"] {
        let v = validate(
            vec![file(1, name, "198.18.0.11", "198.18.65.2")],
            &local(),
            &Holders::default(),
        );
        assert!(v.rejected.is_empty(), "{name:?}: {:?}", v.rejected);
    }
}

/// Records that conflict with "a" (198.18.0.11, 198.18.65.2) over a
/// name or an address, and two that are fine or bad alone.
fn contenders() -> Vec<Candidate> {
    vec![
        file(1, "b", "198.18.0.11", "198.18.67.2"),
        file(2, "a", "198.18.0.11", "198.18.65.2"),
        file(3, "a", "198.18.0.12", "198.18.66.2"),
        file(4, "c", "198.18.0.13", "198.18.65.2"),
        file(5, "d", "198.18.0.14", "198.18.0.11"),
        file(6, "e", "198.18.65.2", "198.18.68.2"),
        file(7, "f", "198.18.0.15", "198.18.0.15"),
        file(8, "g", "198.18.0.16", "198.18.69.2"),
    ]
}

#[test]
fn conflicts_without_a_holder_give_the_address_to_neither() {
    let v = validate(contenders(), &local(), &Holders::default());
    assert_eq!(names(&v), ["g"]);
    let texts: Vec<String> = v.rejected.iter().map(ToString::to_string).collect();
    assert_eq!(texts.len(), 7, "{texts:#?}");
    assert!(
        texts[0].starts_with("nodes.yaml:3: node \"b\": node-ip 198.18.0.11 is also claimed as ")
            && texts[0].ends_with(": neither takes it"),
        "{}",
        texts[0]
    );
    assert!(
        texts[1].starts_with("nodes.yaml:6: node \"a\": node-ip 198.18.0.11 is also claimed as node-ip by node \"b\" at nodes.yaml:3")
            || texts[1].starts_with("nodes.yaml:6: node \"a\": node-ip 198.18.0.11 is also claimed as health-ip by node \"d\""),
        "{}",
        texts[1]
    );
    assert_eq!(
        texts[2],
        "nodes.yaml:9: node \"a\": duplicate name \"a\": node \"a\" at nodes.yaml:6 came before it (a name's later records are refused)"
    );
    assert_eq!(
        texts[6],
        "nodes.yaml:21: node \"f\": node-ip and health-ip are the same address 198.18.0.15"
    );
    // The order of the records decides no address (only which of two
    // records of one name counts: the first good one).
    let mut reversed = contenders();
    reversed.reverse();
    let w = validate(reversed, &local(), &Holders::default());
    assert_eq!(names(&w), ["a", "g"]);
    assert_eq!(w.nodes[0].node_ip, Some(ip("198.18.0.12")), "the later a");
}

#[test]
fn the_holder_of_an_address_keeps_it_whatever_the_order() {
    let held = validate(
        vec![file(1, "a", "198.18.0.11", "198.18.65.2")],
        &local(),
        &Holders::default(),
    );
    let holders = Holders::of(&held.nodes);
    // Without the second record of the name "a".
    let one_a: Vec<Candidate> = contenders()
        .into_iter()
        .filter(|c| !matches!(c.record.origin, Origin::File { entry: 3, .. }))
        .collect();
    for order in [one_a.clone(), one_a.into_iter().rev().collect()] {
        let v = validate(order, &local(), &holders);
        assert_eq!(names(&v), ["a", "g"]);
        let texts: Vec<String> = v.rejected.iter().map(ToString::to_string).collect();
        for (who, field, ip, of) in [
            ("b", "node-ip", "198.18.0.11", "node-ip"),
            ("c", "health-ip", "198.18.65.2", "health-ip"),
            ("d", "health-ip", "198.18.0.11", "node-ip"),
            ("e", "node-ip", "198.18.65.2", "health-ip"),
        ] {
            let want = format!(
                "node \"{who}\": {field} {ip} is already the {of} of node \"a\" at nodes.yaml:6, which is kept"
            );
            assert!(
                texts.iter().any(|t| t.ends_with(&want)),
                "{want}\n{texts:#?}"
            );
        }
    }
}

#[test]
fn a_departed_holder_keeps_its_addresses_for_the_hold() {
    let t0 = std::time::Instant::now();
    let hold = std::time::Duration::from_mins(15);
    let first = validate(
        vec![
            file(1, "node-2", "198.18.0.12", "198.18.66.2"),
            file(2, "node-3", "198.18.0.13", "198.18.67.2"),
        ],
        &local(),
        &Holders::default(),
    );
    // node-2's record goes (its agent restarts); an impostor claims its
    // node address meanwhile: refused, naming node-2.
    let gone = validate(
        vec![file(2, "node-3", "198.18.0.13", "198.18.67.2")],
        &local(),
        &Holders::default(),
    );
    let holders = Holders::of(&first.nodes).after(&gone.nodes, t0, hold);
    let v = validate(
        vec![
            file(1, "evil", "198.18.0.12", "198.18.70.2"),
            file(2, "node-3", "198.18.0.13", "198.18.67.2"),
        ],
        &local(),
        &holders,
    );
    assert_eq!(names(&v), ["node-3"]);
    assert_eq!(
        v.rejected[0].to_string(),
        "nodes.yaml:3: node \"evil\": node-ip 198.18.0.12 belongs to node \"node-2\", which held it first and keeps it"
    );
    // node-2 registers again: it takes its address back; evil does not.
    let back = validate(
        vec![
            file(1, "evil", "198.18.0.12", "198.18.70.2"),
            file(2, "node-2", "198.18.0.12", "198.18.66.2"),
            file(3, "node-3", "198.18.0.13", "198.18.67.2"),
        ],
        &local(),
        &holders,
    );
    assert_eq!(names(&back), ["node-2", "node-3"]);
    // A holder whose new record is refused keeps the claim too.
    let broken = validate(
        vec![
            file(1, "evil", "198.18.0.12", "198.18.70.2"),
            file(2, "node-2", "127.0.0.1", "198.18.66.2"),
        ],
        &local(),
        &Holders::of(&first.nodes),
    );
    assert_eq!(names(&broken), Vec::<&str>::new());
    assert!(
        broken
            .rejected
            .iter()
            .any(|r| r.to_string().contains("belongs to node \"node-2\"")),
        "{:?}",
        broken.rejected
    );
}

#[test]
fn peers_outside_the_health_range_are_refused() {
    let local = LocalNode {
        health_range: Some("198.18.64.0/18".parse().expect("cidr")),
        health_range6: Some("2001:2:0:40::/58".parse().expect("cidr")),
        ..local()
    };
    let mut v6 = file(3, "six", "198.18.0.13", "198.18.67.2");
    if let Ok(n) = &mut v6.node {
        n.node_ip6 = Some("2001:2::13".parse().expect("ip"));
        n.health_ip6 = Some("2001:2::14".parse().expect("ip"));
    }
    let v = validate(
        vec![
            file(1, "ok", "198.18.0.11", "198.18.65.2"),
            // Another node's address as a health address: outside.
            file(2, "evil", "198.18.0.12", "198.18.0.11"),
            v6,
        ],
        &local,
        &Holders::default(),
    );
    assert_eq!(names(&v), ["ok"]);
    let texts: Vec<String> = v.rejected.iter().map(ToString::to_string).collect();
    assert_eq!(
        texts,
        [
            "nodes.yaml:6: node \"evil\": health-ip 198.18.0.11 is outside the cluster's health range 198.18.64.0/18 (--health-range)",
            "nodes.yaml:9: node \"six\": health-ip6 2001:2::14 is outside the cluster's health range 2001:2:0:40::/58 (--health-range6)",
        ]
    );
}

#[test]
fn a_rejected_record_claims_nothing() {
    // The first "a" is bad: the second one, and its addresses, are free.
    let v = validate(
        vec![
            file(1, "a", "127.0.0.1", "198.18.65.2"),
            file(2, "a", "198.18.0.12", "198.18.65.2"),
        ],
        &local(),
        &Holders::default(),
    );
    assert_eq!(names(&v), ["a"]);
    assert_eq!(v.nodes[0].node_ip, Some(ip("198.18.0.12")));
    assert_eq!(v.rejected.len(), 1);
}

#[test]
fn this_nodes_record_wins_conflicts_wherever_it_is() {
    let v = validate(
        vec![
            file(1, "impostor", "198.18.0.10", "198.18.65.2"),
            file(2, "me", "198.18.0.10", "198.18.64.2"),
        ],
        &local(),
        &Holders::default(),
    );
    assert_eq!(names(&v), ["me"]);
    assert!(
        v.rejected[0]
            .to_string()
            .contains("node \"impostor\": node-ip 198.18.0.10 is already the node-ip of node \"me\" at nodes.yaml:6"),
        "{}",
        v.rejected[0]
    );
}

/// A record of node `name` at etcd key `key` (prefix `/h/`).
fn etcd_at(key: &str, name: &str, node_ip: &str, health_ip: &str) -> Candidate {
    Candidate {
        record: Record {
            origin: Origin::Etcd {
                key: key.into(),
                prefix_len: "/h/".len(),
            },
            name: Some(name.into()),
        },
        node: Ok(Node {
            name: name.into(),
            node_ip: Some(ip(node_ip)),
            health_ip: Some(ip(health_ip)),
            node_ip6: None,
            health_ip6: None,
            zone: None,
        }),
    }
}

/// The set of node `b` alone, at etcd key `/h/b`.
fn b_alone() -> NodeSet {
    validate(
        vec![etcd_at("/h/b", "b", "198.18.0.12", "198.18.66.2")],
        &local(),
        &Holders::default(),
    )
    .nodes
}

/// Only a record at its own key speaks for a node: a copy elsewhere
/// neither keeps nor takes an address for it.
#[test]
fn a_copy_of_a_nodes_record_elsewhere_keeps_no_address_for_it() {
    let holders = Holders::of(&b_alone()).departing(usize::MAX);
    let v = validate(
        vec![
            etcd_at("/h/0", "b", "198.18.0.99", "198.18.66.3"),
            etcd_at("/h/b", "b", "198.18.0.12", "198.18.66.2"),
            etcd_at("/h/c", "c", "198.18.0.13", "198.18.66.3"),
        ],
        &local(),
        &holders,
    );
    assert_eq!(names(&v), ["b", "c"], "{:?}", v.rejected);
    assert_eq!(v.rejected.len(), 1, "the copy alone: {:?}", v.rejected);
}

/// With etcd, a record moved away from an address keeps it for its node
/// as one departing: a writer of the prefix who moves a node's record and
/// claims the address for another node, in the same update or the next,
/// takes it from no one, and the node's agent writing its record back
/// takes it back. Past the hold, it is free. A nodes file's edit may move
/// an address from one node to another at once.
#[test]
fn a_record_moved_away_from_an_address_keeps_it_from_other_claims() {
    let t0 = std::time::Instant::now();
    let hold = std::time::Duration::from_mins(15);
    let refusal = "etcd key \"/h/c\": health-ip 198.18.66.2 belongs to node \"b\", which held it first and keeps it";
    let moved = || etcd_at("/h/b", "b", "198.18.0.12", "198.18.66.3");
    let claim = || etcd_at("/h/c", "c", "198.18.0.13", "198.18.66.2");
    let holders = Holders::of(&b_alone()).departing(usize::MAX);
    let v = validate(vec![moved(), claim()], &local(), &holders);
    assert_eq!(names(&v), ["b"], "{:?}", v.rejected);
    assert_eq!(v.rejected[0].to_string(), refusal);
    // The update after: b's record still moved, then written back.
    let holders = holders.after(&v.nodes, t0, hold);
    let v = validate(vec![moved(), claim()], &local(), &holders);
    assert_eq!(names(&v), ["b"], "{:?}", v.rejected);
    assert_eq!(v.rejected[0].to_string(), refusal);
    let holders = holders.after(&v.nodes, t0, hold);
    let back = etcd_at("/h/b", "b", "198.18.0.12", "198.18.66.2");
    let v = validate(vec![back, claim()], &local(), &holders);
    assert_eq!(names(&v), ["b"], "{:?}", v.rejected);
    assert_eq!(
        v.nodes.get("b").and_then(|n| n.health_ip),
        Some(ip("198.18.66.2"))
    );
    // b moved for good: the address is free once the hold has ended.
    let holders = holders.after(&b_alone(), t0, hold);
    let holders = holders.after(&validate(vec![moved()], &local(), &holders).nodes, t0, hold);
    let later = holders.unexpired(t0 + hold);
    assert_eq!(later.len(), 2, "b's two addresses now");
    let v = validate(vec![moved(), claim()], &local(), &later);
    assert_eq!(names(&v), ["b", "c"], "{:?}", v.rejected);
    // A nodes file's edit moves it at once.
    let edited = validate(
        vec![
            file(1, "b", "198.18.0.12", "198.18.66.3"),
            file(2, "c", "198.18.0.13", "198.18.66.2"),
        ],
        &local(),
        &Holders::of(&b_alone()),
    );
    assert_eq!(names(&edited), ["b", "c"], "{:?}", edited.rejected);
}

/// With etcd, a node of the last good set whose record goes in an update
/// keeps its addresses as one departing then: a claim that waited for
/// them is refused in that update, not given them.
#[test]
fn a_claim_waiting_for_an_address_does_not_take_it_when_its_holder_leaves() {
    let v = validate(
        vec![etcd_at("/h/evil", "evil", "198.18.0.20", "198.18.66.2")],
        &local(),
        &Holders::of(&b_alone()).departing(usize::MAX),
    );
    assert!(names(&v).is_empty(), "{:?}", v.rejected);
    assert_eq!(
        v.rejected[0].to_string(),
        "etcd key \"/h/evil\": health-ip 198.18.66.2 belongs to node \"b\", which held it first and keeps it"
    );
    // A nodes file's edit may move an address from one node to another.
    let edited = validate(
        vec![file(1, "evil", "198.18.0.20", "198.18.66.2")],
        &local(),
        &Holders::of(&b_alone()),
    );
    assert_eq!(names(&edited), ["evil"]);
}

#[test]
fn etcd_records_must_match_their_keys() {
    let at = etcd_at;
    let v = validate(
        vec![
            at("/h/a", "a", "198.18.0.11", "198.18.65.2"),
            at("/h/b", "x", "198.18.0.12", "198.18.66.2"),
            at("/h/c", "a", "198.18.0.13", "198.18.67.2"),
        ],
        &local(),
        &Holders::default(),
    );
    assert_eq!(names(&v), ["a"]);
    let texts: Vec<String> = v.rejected.iter().map(ToString::to_string).collect();
    assert_eq!(
        texts,
        [
            "etcd key \"/h/b\": a node record counts only at exactly <prefix><name>: \"x\" belongs at \"/h/x\"",
            "etcd key \"/h/c\": a node record counts only at exactly <prefix><name>: \"a\" belongs at \"/h/a\"",
        ]
    );
    let api = RejectedRecord::from(&v.rejected[0]);
    assert_eq!(api.record, "/h/b");
    assert_eq!(api.name.as_deref(), Some("x"));
    assert_eq!(
        api.reason,
        "a node record counts only at exactly <prefix><name>: \"x\" belongs at \"/h/x\""
    );
}

/// A copy of this node's record at a key that sorts before its own is
/// rejected as misplaced, and this node's record at its key still counts
/// as its own (before, the copy was taken as this node's, and its real
/// record then lost its addresses to the node's own range).
#[test]
fn a_copy_of_this_nodes_record_at_another_key_does_not_displace_it() {
    let at = |key: &str| Candidate {
        record: Record {
            origin: Origin::Etcd {
                key: key.into(),
                prefix_len: "/h/".len(),
            },
            name: Some("me".into()),
        },
        node: Ok(Node {
            name: "me".into(),
            node_ip: Some(ip("198.18.0.10")),
            health_ip: Some(ip("198.18.64.2")),
            node_ip6: None,
            health_ip6: None,
            zone: None,
        }),
    };
    let v = validate(
        vec![at("/h/0/me"), at("/h/me")],
        &local(),
        &Holders::default(),
    );
    assert_eq!(names(&v), ["me"]);
    assert_eq!(v.rejected.len(), 1, "{:?}", v.rejected);
    assert_eq!(RejectedRecord::from(&v.rejected[0]).record, "/h/0/me");
}

#[test]
fn the_summary_counts_and_names_the_first_few() {
    let mut all = vec![file(1, "ok", "198.18.0.1", "198.18.65.1")];
    all.extend((2..=9).map(|i| file(i, &format!("n{i}"), "127.0.0.1", "198.18.66.1")));
    let v = validate(all, &local(), &Holders::default());
    let s = v.summary().expect("rejections");
    assert!(s.starts_with("8 node records rejected, 1 in use: nodes.yaml:6: node \"n2\": node-ip 127.0.0.1 is loopback"), "{s}");
    assert!(
        s.contains("node \"n6\"") && !s.contains("node \"n7\""),
        "{s}"
    );
    assert!(
        s.ends_with("; and 3 more (GET /v1/nodes lists them)"),
        "{s}"
    );
}

#[test]
fn ten_thousand_records_validate_quickly() {
    let all: Vec<Candidate> = (0..10_000u32)
        .map(|k| {
            let node = Ipv4Addr::from(u32::from(ip("198.18.64.0")) + k).to_string();
            let health = Ipv4Addr::from(u32::from(ip("198.19.0.0")) + k + 1).to_string();
            file(k as usize + 1, &format!("peer-{k:05}"), &node, &health)
        })
        .collect();
    let started = std::time::Instant::now();
    let v = validate(all, &LocalNode::default(), &Holders::default());
    assert_eq!(v.nodes.len(), 10_000);
    assert_eq!(v.rejected, []);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
}
