use std::fmt::Write as _;

use super::*;
use crate::membership::NodeSet;

const YAML: &str = "nodes:\n  - name: node-2\n    node-ip: 198.18.0.12\n    health-cidr: 198.18.65.0/24\n  - name: node-1\n    node-ip: 198.18.0.11\n    health-ip: 198.18.64.2\n";

/// This node is node-1, health CIDRs 198.18.64.0/24 and
/// `2001:2:0:40::/64`.
fn local() -> LocalNode {
    LocalNode {
        name: Some("node-1".into()),
        health_cidr: Some("198.18.64.0/24".parse().expect("cidr")),
        health_cidr6: Some("2001:2:0:40::/64".parse().expect("cidr")),
        ..LocalNode::default()
    }
}

fn yaml(text: &str) -> Result<Validated, NodesFileError> {
    parse(Path::new("nodes.yaml"), text, &local(), &Holders::default())
}

fn json(text: &str) -> Result<Validated, NodesFileError> {
    parse(Path::new("nodes.json"), text, &local(), &Holders::default())
}

fn good(text: &str) -> NodeSet {
    let v = yaml(text).expect("parses");
    assert!(v.rejected.is_empty(), "{:?}", v.rejected);
    v.nodes
}

/// The names kept and the rejections' texts.
fn outcome(v: &Validated) -> (Vec<String>, Vec<String>) {
    (
        v.nodes.iter().map(|n| n.name.clone()).collect(),
        v.rejected.iter().map(ToString::to_string).collect(),
    )
}

/// Two good records around `bad` (YAML lines, indented as a record).
/// `record` (node "bad", line 5) between two good nodes: only it is
/// rejected, with an error naming its line and node that says `needle`.
fn only_bad_is_rejected(record: &str, needle: &str) {
    let (kept, rejected) = outcome(&yaml(&around(record)).expect("parses"));
    assert_eq!(kept, ["node-1", "node-3"], "{record}");
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert!(
        rejected[0].starts_with("nodes.yaml:5: node \"bad\": ") && rejected[0].contains(needle),
        "{} lacks {needle:?}",
        rejected[0]
    );
}

fn around(bad: &str) -> String {
    format!(
        "nodes:\n  - name: node-1\n    node-ip: 198.18.0.11\n    health-ip: 198.18.64.2\n{bad}  - name: node-3\n    node-ip: 198.18.0.13\n    health-ip: 198.18.66.2\n"
    )
}

#[test]
fn yaml_and_json_give_the_same_sorted_set() {
    let from_yaml = good(YAML);
    let from_json = json(
        r#"{"nodes": [
        {"name": "node-2", "node-ip": "198.18.0.12", "health-cidr": "198.18.65.0/24"},
        {"name": "node-1", "node-ip": "198.18.0.11", "health-ip": "198.18.64.2"}]}"#,
    )
    .expect("valid");
    assert!(from_json.rejected.is_empty(), "{:?}", from_json.rejected);
    assert_eq!(from_yaml, from_json.nodes);
    assert_eq!(from_yaml[0].name, "node-1");
    assert_eq!(
        from_yaml[1].health_ip,
        Some(Ipv4Addr::new(198, 18, 65, 2)),
        "first usable of the CIDR"
    );
}

#[test]
fn syntax_errors_refuse_the_whole_file_naming_the_line() {
    let e = yaml("nodes:\n  - name: a\n    node-ip: [\n").expect_err("bad");
    assert!(e.line.is_some(), "{e}");
    assert!(e.to_string().starts_with("nodes.yaml:"), "{e}");
    let e = json("{\"nodes\": [\n  {\"name\": \"a\",\n   \"node-ip\": \"198.18.0.1\",,\n")
        .expect_err("bad");
    assert_eq!(e.line, Some(3), "{e}");
    let e = yaml("nodez:\n  - name: a\n").expect_err("no nodes list");
    assert!(e.message.contains("nodez"), "{e}");
    let e = yaml("nodes: 3\n").expect_err("not a list");
    assert!(e.to_string().starts_with("nodes.yaml:"), "{e}");
    assert!(e.message.starts_with("as YAML: "), "{e}");
    // A YAML file whose name does not say so is read as JSON, and the
    // error says why.
    let e = parse(
        Path::new("nodes"),
        "nodes: []\n",
        &local(),
        &Holders::default(),
    )
    .expect_err("YAML read as JSON");
    assert!(
        e.message
            .contains("as JSON (the name does not end in .yaml or .yml)"),
        "{e}"
    );
}

#[test]
fn bad_addresses_reject_the_record_naming_line_name_and_field() {
    let v = yaml(&around(
        "  - name: bad\n    node-ip: 198.18.0.300\n    health-ip: 198.18.65.2\n",
    ))
    .expect("parses");
    assert_eq!(
        outcome(&v),
        (
            vec!["node-1".to_owned(), "node-3".to_owned()],
            vec![
                "nodes.yaml:5: node \"bad\": field `node-ip`: invalid IPv4 address \"198.18.0.300\""
                    .to_owned()
            ]
        )
    );
    for (record, needle) in [
        (
            "  - name: bad\n    node-ip: 0.0.0.0\n    health-ip: 198.18.65.2\n",
            "node-ip 0.0.0.0 is unspecified (0.0.0.0/8), not a node address",
        ),
        (
            "  - name: bad\n    node-ip: 127.0.0.1\n    health-ip: 198.18.65.2\n",
            "node-ip 127.0.0.1 is loopback (127.0.0.0/8), not a node address",
        ),
        (
            "  - name: bad\n    node-ip: 198.18.0.12\n    health-ip: 169.254.0.2\n",
            "health-ip 169.254.0.2 is link-local",
        ),
        (
            "  - name: bad\n    node-ip: 224.0.0.5\n    health-ip: 198.18.65.2\n",
            "node-ip 224.0.0.5 is multicast",
        ),
        (
            "  - name: bad\n    node-ip: 198.18.0.12\n    health-ip: 255.255.255.255\n",
            "health-ip 255.255.255.255 is the limited broadcast address",
        ),
        (
            "  - name: bad\n    node-ip: 250.1.2.3\n    health-ip: 198.18.65.2\n",
            "node-ip 250.1.2.3 is reserved (240.0.0.0/4)",
        ),
        (
            "  - name: bad\n    node-ip: 198.18.0.12\n    health-cidr: 198.18.65.1/24\n",
            "field `health-cidr`: invalid CIDR \"198.18.65.1/24\"",
        ),
        (
            "  - name: bad\n    node-ip: 198.18.0.12\n    health-cidr: 198.18.65.0/31\n",
            "198.18.65.0/31 has no usable address",
        ),
        (
            "  - name: bad\n    node-ip: 198.18.0.12\n    health-ip: 198.18.64.9\n",
            "health-ip 198.18.64.9 is inside this node's health CIDR 198.18.64.0/24",
        ),
    ] {
        only_bad_is_rejected(record, needle);
    }
}

#[test]
fn this_nodes_own_record_may_sit_in_its_health_cidr() {
    let v = good(YAML);
    assert_eq!(
        v.get("node-1").and_then(|n| n.health_ip),
        Some(Ipv4Addr::new(198, 18, 64, 2))
    );
}

#[test]
fn ipv6_only_and_dual_stack_records_are_read_and_checked() {
    let v = good(&around(
        "  - name: v6\n    node-ip6: 2001:2::12\n    health-ip6: 2001:2:0:41::2\n  - name: dual\n    node-ip: 198.18.0.14\n    health-ip: 198.18.67.2\n    node-ip6: 2001:2::14\n    health-ip6: 2001:2:0:43::2\n",
    ));
    let from_cidr = good(&around(
        "  - name: v6\n    node-ip6: 2001:2::12\n    health-cidr6: 2001:2:0:41::/64\n",
    ));
    assert_eq!(
        from_cidr.get("v6").and_then(|n| n.health_ip6),
        Some("2001:2:0:41::2".parse().expect("ip")),
        "first usable of the CIDR, as the endpoint's IPAM gives it"
    );
    let v6 = v.get("v6").expect("v6");
    assert_eq!((v6.node_ip, v6.health_ip), (None, None));
    assert_eq!(v6.node_ip6, Some("2001:2::12".parse().expect("ip")));
    let dual = v.get("dual").expect("dual");
    assert_eq!(dual.addresses().count(), 4);
    assert!(dual.primary_node_ip().is_some_and(|ip| ip.is_ipv4()));
    for (record, needle) in [
        (
            "  - name: bad\n    node-ip6: 2001:2::12\n",
            "node-ip6 without health-ip6",
        ),
        (
            "  - name: bad\n    node-ip: 198.18.0.12\n    health-ip: 198.18.65.2\n    health-ip6: 2001:2:0:41::2\n",
            "health-ip6 without node-ip6",
        ),
        (
            "  - name: bad\n    node-ip: 2001:2::12\n    health-ip: 198.18.65.2\n",
            "field `node-ip`: 2001:2::12 is an IPv6 address; give it as `node-ip6`",
        ),
        (
            "  - name: bad\n    node-ip6: 198.18.0.12\n    health-ip6: 2001:2:0:41::2\n",
            "field `node-ip6`: 198.18.0.12 is an IPv4 address; give it as `node-ip`",
        ),
        (
            "  - name: bad\n    node-ip6: 2001:2::zz\n    health-ip6: 2001:2:0:41::2\n",
            "field `node-ip6`: invalid IPv6 address \"2001:2::zz\"",
        ),
        (
            "  - name: bad\n    node-ip6: fe80::1\n    health-ip6: 2001:2:0:41::2\n",
            "node-ip6 fe80::1 is link-local (fe80::/10)",
        ),
        (
            "  - name: bad\n    node-ip6: 2001:2::12\n    health-ip6: ::1\n",
            "health-ip6 ::1 is loopback",
        ),
        (
            "  - name: bad\n    node-ip6: ff02::1\n    health-ip6: 2001:2:0:41::2\n",
            "node-ip6 ff02::1 is multicast",
        ),
        (
            "  - name: bad\n    node-ip6: ::ffff:198.18.0.1\n    health-ip6: 2001:2:0:41::2\n",
            "is IPv4-mapped",
        ),
        (
            "  - name: bad\n    node-ip6: 2001:2::12\n    health-ip6: 2001:2:0:40::9\n",
            "health-ip6 2001:2:0:40::9 is inside this node's health CIDR 2001:2:0:40::/64",
        ),
        (
            "  - name: bad\n    node-ip6: 2001:2::12\n    health-ip6: 2001:2::12\n",
            "node-ip6 and health-ip6 are the same address 2001:2::12",
        ),
    ] {
        let (kept, rejected) = outcome(&yaml(&around(record)).expect("parses"));
        assert_eq!(kept, ["node-1", "node-3"], "{record}");
        assert_eq!(rejected.len(), 1, "{rejected:?}");
        assert!(
            rejected[0].starts_with("nodes.yaml:5: node \"bad\": ") && rejected[0].contains(needle),
            "{} lacks {needle:?}",
            rejected[0]
        );
    }
    // An IPv6 address claimed twice: neither record takes it.
    let twice = "  - name: a6\n    node-ip6: 2001:2::12\n    health-ip6: 2001:2:0:41::2\n  - name: b6\n    node-ip6: 2001:2::13\n    health-ip6: 2001:2::12\n";
    let (kept, rejected) = outcome(&yaml(&around(twice)).expect("parses"));
    assert_eq!(kept, ["node-1", "node-3"]);
    assert!(
        rejected[1].contains("health-ip6 2001:2::12 is also claimed as node-ip6 by node \"a6\""),
        "{rejected:?}"
    );
}

#[test]
fn missing_unknown_and_mistyped_fields_reject_the_record() {
    for (record, needle) in [
        (
            "  - name: bad\n    node-ip: 198.18.0.12\n",
            "missing field `health-ip` (or `health-cidr`)",
        ),
        (
            "  - name: bad\n    health-ip: 198.18.65.2\n",
            "missing field `node-ip`",
        ),
        (
            "  - name: bad\n    node-ip: 198.18.0.12\n    health-ip: 198.18.65.2\n    colour: red\n",
            "unknown field `colour`",
        ),
        (
            "  - name: bad\n    node-ip: 198.18.0.12\n    health-ip: 198.18.65.2\n    health-cidr: 198.18.65.0/24\n",
            "give `health-ip` or `health-cidr`, not both",
        ),
        (
            "  - name: bad\n    node-ip: 5\n    health-ip: 198.18.65.2\n",
            "field `node-ip`: expected a string, found number `5`",
        ),
        (
            "  - name: \"\"\n    node-ip: 198.18.0.12\n    health-ip: 198.18.65.2\n",
            "the name is empty",
        ),
    ] {
        let (kept, rejected) = outcome(&yaml(&around(record)).expect("parses"));
        assert_eq!(kept, ["node-1", "node-3"], "{record}");
        assert_eq!(rejected.len(), 1, "{rejected:?}");
        assert!(
            rejected[0].starts_with("nodes.yaml:5: node "),
            "{}",
            rejected[0]
        );
        assert!(
            rejected[0].contains(needle),
            "{} lacks {needle:?}",
            rejected[0]
        );
    }
    // Without a name (or not a string), the record is named by its number.
    for record in [
        "  - node-ip: 198.18.0.12\n    health-ip: 198.18.65.2\n",
        "  - name: [x]\n    node-ip: 198.18.0.12\n    health-ip: 198.18.65.2\n",
        "  - just a string\n",
    ] {
        let (kept, rejected) = outcome(&yaml(&around(record)).expect("parses"));
        assert_eq!(kept, ["node-1", "node-3"], "{record}");
        assert!(
            rejected[0].starts_with("nodes.yaml: node #2: "),
            "{}",
            rejected[0]
        );
    }
}

/// What a generic value would hide: a field given twice (its last value
/// silently taken) and a float no value holds (`.nan`, `.inf`: read as
/// null, so as absent) reject the record, naming the field, in YAML and
/// in JSON alike.
#[test]
fn a_field_given_twice_or_a_float_no_field_holds_rejects_the_record() {
    for (record, needle) in [
        (
            "  - name: bad\n    node-ip: 198.18.0.12\n    health-ip: 198.18.65.2\n    node-ip: 198.18.0.99\n",
            "field `node-ip` is given twice",
        ),
        (
            "  - name: bad\n    node-ip: 198.18.0.12\n    health-ip: 198.18.65.2\n    zone: .nan\n",
            "field `zone`: expected a string, found number `NaN`",
        ),
        (
            "  - name: bad\n    node-ip: 198.18.0.12\n    health-ip: 198.18.65.2\n    node-ip6: .inf\n    health-ip6: .inf\n",
            "field `node-ip6`: expected a string, found number `inf`",
        ),
    ] {
        only_bad_is_rejected(record, needle);
    }
    let text = r#"{"nodes": [
        {"name": "node-1", "node-ip": "198.18.0.11", "health-ip": "198.18.64.2"},
        {"name": "bad", "node-ip": "198.18.0.12", "health-ip": "198.18.65.2", "health-ip": "198.18.65.3"}
    ]}"#;
    let (kept, rejected) = outcome(&json(text).expect("parses"));
    assert_eq!(kept, ["node-1"]);
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert!(
        rejected[0].contains("node \"bad\"")
            && rejected[0].contains("field `health-ip` is given twice"),
        "{}",
        rejected[0]
    );
}

#[test]
fn zones_are_read_from_the_file_and_bad_ones_reject_the_record() {
    let longest = "z".repeat(validate::MAX_ZONE_LEN);
    let set = good(&format!(
        "nodes:\n  - name: node-1\n    node-ip: 198.18.0.11\n    health-ip: 198.18.64.2\n    zone: rack-1.a_b\n  - name: node-2\n    node-ip: 198.18.0.12\n    health-ip: 198.18.65.2\n  - name: node-3\n    node-ip: 198.18.0.13\n    health-ip: 198.18.66.2\n    zone: {longest}\n  - name: node-4\n    node-ip: 198.18.0.14\n    health-ip: 198.18.67.2\n    zone:\n"
    ));
    let zone = |name: &str| set.get(name).and_then(|n| n.zone.clone());
    assert_eq!(zone("node-1").as_deref(), Some("rack-1.a_b"));
    assert_eq!(zone("node-2"), None, "no zone field");
    assert_eq!(zone("node-3"), Some(longest), "63 bytes is a zone name");
    assert_eq!(zone("node-4"), None, "a null zone is none");
    // JSON alike.
    let v = json(
        r#"{"nodes": [{"name": "node-2", "node-ip": "198.18.0.12", "health-ip": "198.18.65.2", "zone": "eu-1"}]}"#,
    )
    .expect("valid");
    assert!(v.rejected.is_empty(), "{:?}", v.rejected);
    assert_eq!(
        v.nodes.get("node-2").and_then(|n| n.zone.as_deref()),
        Some("eu-1")
    );
    let too_long = "z".repeat(validate::MAX_ZONE_LEN + 1);
    for (zone, needle) in [
        (
            "\"rack 1\"",
            "field `zone`: only letters, digits, '.', '_' and '-'",
        ),
        (
            "rack/1",
            "field `zone`: only letters, digits, '.', '_' and '-'",
        ),
        ("\"\"", "field `zone`: a zone name is not empty"),
        (too_long.as_str(), "field `zone`: 64 bytes, more than 63"),
        ("5", "field `zone`: expected a string, found number `5`"),
        ("[a]", "field `zone`: expected a string, found a list"),
    ] {
        let record = format!(
            "  - name: bad\n    node-ip: 198.18.0.12\n    health-ip: 198.18.65.2\n    zone: {zone}\n"
        );
        only_bad_is_rejected(&record, needle);
    }
}

#[test]
fn bad_names_reject_the_record() {
    for (name, needle) in [
        ("\"a b\"", "the name \"a b\" is not a node name"),
        ("a/b", "the name \"a/b\" is not a node name"),
        ("-x", "the name \"-x\" is not a node name"),
    ] {
        let record =
            format!("  - name: {name}\n    node-ip: 198.18.0.12\n    health-ip: 198.18.65.2\n");
        let (kept, rejected) = outcome(&yaml(&around(&record)).expect("parses"));
        assert_eq!(kept, ["node-1", "node-3"]);
        assert!(
            rejected[0].starts_with("nodes.yaml:5: node "),
            "{}",
            rejected[0]
        );
        assert!(
            rejected[0].contains(needle),
            "{} lacks {needle:?}",
            rejected[0]
        );
    }
    let long = "n".repeat(254);
    let record =
        format!("  - name: {long}\n    node-ip: 198.18.0.12\n    health-ip: 198.18.65.2\n");
    let (_, rejected) = outcome(&yaml(&around(&record)).expect("parses"));
    assert!(
        rejected[0].ends_with("the name is 254 bytes long, more than 253"),
        "{}",
        rejected[0]
    );
}

#[test]
fn conflicts_give_an_address_to_neither_new_claimant_and_name_both() {
    let text = "nodes:\n  - name: a\n    node-ip: 198.18.0.1\n    health-ip: 198.18.65.2\n  - name: a\n    node-ip: 198.18.0.2\n    health-ip: 198.18.66.2\n  - name: b\n    node-ip: 198.18.0.1\n    health-ip: 198.18.67.2\n  - name: c\n    node-ip: 198.18.0.3\n    health-ip: 198.18.0.1\n  - name: d\n    node-ip: 198.18.0.4\n    health-ip: 198.18.68.2\n";
    let v = yaml(text).expect("parses");
    assert_eq!(
        outcome(&v),
        (
            vec!["d".to_owned()],
            vec![
                "nodes.yaml:2: node \"a\": node-ip 198.18.0.1 is also claimed as node-ip by node \"b\" at nodes.yaml:8: neither takes it".to_owned(),
                "nodes.yaml:5: node \"a\": duplicate name \"a\": node \"a\" at nodes.yaml:2 came before it (a name's later records are refused)".to_owned(),
                "nodes.yaml:8: node \"b\": node-ip 198.18.0.1 is also claimed as node-ip by node \"a\" at nodes.yaml:2: neither takes it".to_owned(),
                "nodes.yaml:11: node \"c\": health-ip 198.18.0.1 is also claimed as node-ip by node \"a\" at nodes.yaml:2: neither takes it".to_owned(),
            ]
        )
    );
    // Where the last good set had "a", it keeps its address.
    let held = yaml("nodes:\n  - name: a\n    node-ip: 198.18.0.1\n    health-ip: 198.18.65.2\n")
        .expect("parses");
    let v = parse(
        Path::new("nodes.yaml"),
        text,
        &local(),
        &Holders::of(&held.nodes),
    )
    .expect("parses");
    assert_eq!(outcome(&v).0, ["a", "d"]);
    assert_eq!(
        v.nodes.get("a").and_then(|n| n.node_ip),
        Some(Ipv4Addr::new(198, 18, 0, 1)),
        "the first a"
    );
}

#[test]
fn json_and_flow_yaml_records_are_found_by_line() {
    let v = json(
        "{\"nodes\": [\n  {\"name\": \"node-1\", \"node-ip\": \"198.18.0.11\", \"health-ip\": \"198.18.64.2\"},\n  {\"name\": \"bad\", \"node-ip\": \"127.0.0.1\", \"health-ip\": \"198.18.65.2\"},\n  {\"node-ip\": \"198.18.0.13\", \"name\": \"bad\", \"health-ip\": \"198.18.66.2\"}\n]}\n",
    )
    .expect("parses");
    let (kept, rejected) = outcome(&v);
    assert_eq!(kept, ["bad", "node-1"], "the second bad is good");
    assert!(
        rejected[0].starts_with("nodes.json:3: node \"bad\": node-ip 127.0.0.1 is loopback"),
        "{rejected:?}"
    );
    let v = yaml("nodes:\n- {name: node-1, node-ip: 198.18.0.11, health-ip: 198.18.64.2}\n# name: x\n- {node-ip: 198.18.0.12, 'name': 'x', health-ip: 169.254.1.1}  # a comment\n")
        .expect("parses");
    let (_, rejected) = outcome(&v);
    assert!(
        rejected[0].starts_with("nodes.yaml:4: node \"x\": health-ip 169.254.1.1"),
        "{rejected:?}"
    );
}

#[test]
fn name_lines_find_keys_not_values() {
    let text = "nodes:\n  - name: a  # first\n    node-name: x\n    hostname: y\n  - {\"name\" : \"b\", other: 1}\n  - {nickname: z, name: c}\n";
    let lines = name_lines(text);
    let get = |n: &str| lines.get(n).map(|l| l.iter().copied().collect::<Vec<_>>());
    assert_eq!(get("a"), Some(vec![2]));
    assert_eq!(get("b"), Some(vec![5]));
    assert_eq!(get("c"), Some(vec![6]));
    assert_eq!(lines.len(), 3, "{lines:?}");
}

#[test]
fn ten_thousand_records_parse_in_one_pass() {
    let mut text = String::from("nodes:\n");
    for k in 0..10_000u32 {
        let node = Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 128, 0)) + k);
        let health = Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 19, 0, 0)) + k);
        let _ = write!(
            text,
            "  - name: peer-{k:05}\n    node-ip: {node}\n    health-ip: {health}\n"
        );
    }
    text.push_str("  - name: peer-00001\n    node-ip: 198.18.0.1\n    health-ip: 198.18.0.2\n");
    let started = std::time::Instant::now();
    let v = yaml(&text).expect("parses");
    assert_eq!(v.nodes.len(), 10_000);
    assert_eq!(v.rejected.len(), 1);
    assert!(
        v.rejected[0]
            .to_string()
            .starts_with("nodes.yaml:30002: node \"peer-00001\": duplicate name"),
        "{}",
        v.rejected[0]
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// A file without a record named as this node is warned about (its
/// peers would fail every HTTP probe of it); one with it, or with no
/// node at all, is not.
#[test]
fn a_file_naming_no_record_as_this_node_is_warned_about() {
    let path = Path::new("nodes.yaml");
    let with = yaml(YAML).expect("parses");
    assert!(!warn_if_unnamed(path, &with, &local()));
    let other = LocalNode {
        name: Some("node-9".into()),
        ..local()
    };
    assert!(warn_if_unnamed(path, &with, &other));
    let empty = yaml("nodes: []\n").expect("parses");
    assert!(!warn_if_unnamed(path, &empty, &other));
    let unnamed = LocalNode {
        name: None,
        ..local()
    };
    assert!(!warn_if_unnamed(path, &with, &unnamed));
}

/// Text from the file is never copied whole into a verdict: a name past
/// the longest is not kept (the record is named by its number and the
/// rule says how long the name is), and an address, a key or a string of
/// the wrong field is cut short with its control characters escaped (no
/// forged log line).
#[test]
fn long_or_hostile_text_is_cut_short_in_verdicts() {
    let long = "n".repeat(100_000);
    let text = format!(
        "nodes:\n  - name: {long}\n    node-ip: 198.18.0.12\n    health-ip: 198.18.65.2\n  \
         - name: bad\n    node-ip: \"{long}\"\n    health-ip: 198.18.66.2\n  \
         - name: bad2\n    \"x\\nINFO forged\": 1\n    node-ip: 198.18.0.14\n    \
         health-ip: 198.18.67.2\n  - name: bad3\n    node-ip: [1]\n    zone: {long}\n    \
         health-ip: 198.18.68.2\n"
    );
    let (kept, rejected) = outcome(&yaml(&text).expect("parses"));
    assert!(kept.is_empty(), "{kept:?}");
    assert_eq!(rejected.len(), 4, "{rejected:?}");
    for r in &rejected {
        assert!(r.len() < 400, "{} bytes: {}", r.len(), &r[..400]);
        assert!(!r.contains('\n'), "{r}");
    }
    assert!(
        rejected[0].starts_with("nodes.yaml: node #1:")
            && rejected[0].contains("100000 bytes long"),
        "{}",
        rejected[0]
    );
    assert!(rejected[1].contains("(100000 bytes)"), "{}", rejected[1]);
    assert!(
        rejected[2].contains(r"unknown field `x\nINFO forged`"),
        "{}",
        rejected[2]
    );
}

/// A file whose YAML aliases repeat a value far past what it holds is
/// refused whole, naming why, before it can take the agent's memory; an
/// alias or two within a file's size is read as YAML says.
#[test]
fn aliases_repeating_a_value_past_the_files_size_are_refused() {
    let big = "a".repeat(100_000);
    let mut text = format!("nodes:\n  - &r {{name: \"{big}\"}}\n");
    for _ in 0..1_000 {
        text.push_str("  - *r\n");
    }
    let err = yaml(&text).expect_err("100 MB from 108 kB").to_string();
    assert!(
        err.starts_with("nodes.yaml") && err.contains("more than twice the file's size"),
        "{err}"
    );
    let few =
        "nodes:\n  - &one {name: node-2, node-ip: 198.18.0.12, health-ip: 198.18.65.2}\n  - *one\n";
    let v = yaml(few).expect("parses");
    assert_eq!(v.nodes.len(), 1);
    assert_eq!(v.rejected.len(), 1, "the same name twice");
}

/// Lines of many `name`s (a long comment, a flow list on one line) are
/// found in time linear in the line: no name is looked for past the
/// longest a name can be.
#[test]
fn many_names_on_one_line_cost_one_pass() {
    let text = format!("nodes: [] # {}\n", "name: x ".repeat(200_000));
    let started = std::time::Instant::now();
    assert!(good(&text).is_empty());
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // Found still: quoted, plain, and cut by a comment or a separator.
    let lines = name_lines("- {name: 'a b', x: 1}\n- name: c # c\n- {name: d}\n");
    assert_eq!(lines.get("a b").map(|l| l[0]), Some(1));
    assert_eq!(lines.get("c").map(|l| l[0]), Some(2));
    assert_eq!(lines.get("d").map(|l| l[0]), Some(3));
}

/// A file that is not UTF-8 is refused naming the line and byte where it
/// stops being text.
#[test]
fn a_file_that_is_not_utf8_is_refused_naming_where() {
    let bytes = b"nodes:\n  - name: caf\xe9\n";
    let err = text(Path::new("nodes.yaml"), bytes).expect_err("Latin-1");
    assert_eq!(
        err.to_string(),
        "nodes.yaml:2: not UTF-8 text: byte 20 of the file is not"
    );
    assert_eq!(
        text(Path::new("n.yaml"), b"nodes: []\n").expect("text"),
        "nodes: []\n"
    );
}
