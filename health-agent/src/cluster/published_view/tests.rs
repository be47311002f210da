use super::*;

fn node(name: &str, verdict: Verdict) -> NodeView {
    NodeView {
        // "a" and "e": reached in plain text by their one observer.
        plaintext: u32::from(name == "a" || name == "e"),
        name: name.into(),
        zone: Some("z1".into()),
        reporting: verdict != Verdict::NodeDown,
        observers: 4,
        seen_reachable: 1,
        failing: 2,
        discounted: 1,
        verdict,
        failing_observers: vec!["o1".into(), "o2".into()],
        unreached: 0,
        unreached_nodes: Vec::new(),
        lossy: u32::from(verdict == Verdict::PathDegraded),
    }
}

fn full_view() -> ClusterView {
    let nodes = vec![
        node("a", Verdict::Healthy),
        node("b", Verdict::Unknown),
        node("c", Verdict::NodeDown),
        node("d", Verdict::Healthy),
        node("e", Verdict::PathDegraded),
    ];
    ClusterView {
        plaintext_nodes: vec!["a".into(), "e".into()],
        reports: 5,
        ignored: 1,
        counts: VerdictCounts {
            plaintext: 2,
            healthy: 2,
            node_down: 1,
            path_degraded: 1,
            observer_problem: 0,
            unknown: 1,
            lossy: 1,
        },
        nodes,
    }
}

fn published() -> PublishedView {
    PublishedView::of("node-1", 9, 1_000_000, 2_000, &full_view())
}

#[test]
fn a_view_lists_the_nodes_not_healthy_worst_first_and_reads_back() {
    let p = published();
    let names: Vec<&str> = p.view.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["b", "c", "e"]);
    assert_eq!(p.unlisted, 0);
    let bytes = p.encode();
    assert_eq!(bytes[0], VERSION);
    assert_eq!(PublishedView::decode(&bytes), Ok(p.clone()));
    assert_eq!(p.verdict_on("a"), Some(Verdict::Healthy));
    assert_eq!(p.verdict_on("c"), Some(Verdict::NodeDown));
    // A healthy node reached in plain text is named though not listed.
    let back = PublishedView::decode(&bytes).expect("decoded");
    assert_eq!(back.view.counts.plaintext, 2);
    assert_eq!(back.view.plaintext_nodes, ["a", "e"]);
    assert_eq!(back.view.nodes[2].plaintext, 1, "node e");
}

#[test]
fn a_view_past_its_byte_budget_lists_the_worst_and_counts_the_rest() {
    let n = 20_000;
    let nodes: Vec<NodeView> = (0..n)
        .map(|i| {
            let mut v = node(
                &format!("node-{i:05}-{}", "x".repeat(40)),
                Verdict::NodeDown,
            );
            v.failing_observers = (0..16)
                .map(|j| format!("observer-{j:02}-{}", "y".repeat(30)))
                .collect();
            v.failing = 16;
            v.observers = 20;
            v
        })
        .collect();
    // With WireGuard, up to 100 nodes' paths in plain text are named too:
    // their names count against the budget (before, a view naming them
    // passed the size its readers refuse).
    let view = ClusterView {
        plaintext_nodes: (0..100)
            .map(|i| format!("{i:03}{}", "p".repeat(250)))
            .collect(),
        reports: n,
        ignored: 0,
        counts: VerdictCounts {
            node_down: n,
            plaintext: 100,
            ..VerdictCounts::default()
        },
        nodes,
    };
    let p = PublishedView::of("node-1", 1, 5, 1_000, &view);
    assert!(
        p.unlisted > 0 && p.view.nodes.len() + usize_of(p.unlisted) == n,
        "{}",
        p.unlisted
    );
    let bytes = p.encode();
    assert!(bytes.len() <= MAX_MESSAGE_BYTES + 8, "{}", bytes.len());
    let back = PublishedView::decode(&bytes).expect("decodes");
    assert_eq!(back.view.counts.node_down, n);
    assert_eq!(back.view.plaintext_nodes.len(), 100);
    // A node not listed while some are unlisted: no verdict can be read.
    assert_eq!(back.verdict_on("nobody"), None);
}

/// A value of the current version whose message is `message`.
fn framed(message: &[u8]) -> Vec<u8> {
    let mut out = vec![VERSION];
    prost::encode_length_delimiter(message.len(), &mut out).expect("varint");
    out.extend_from_slice(message);
    out
}

#[test]
fn a_view_of_many_empty_nodes_is_refused_before_it_is_decoded() {
    // 1 MiB of empty node messages (tag 12, length 0): 2 bytes each on
    // the wire, a few hundred each decoded, 100 MB and more in all.
    let message: Vec<u8> = [0x62, 0x00].repeat(MAX_MESSAGE_BYTES / 2);
    let refusal = PublishedView::decode(&framed(&message)).expect_err("refused");
    // Decoded, the message would be refused for its empty assembler;
    // it is refused first, for what decoding it would take.
    assert_eq!(refusal, ViewError::TooCostly, "{refusal}");
    assert_eq!(
        refusal.to_string(),
        format!(
            "its nodes and names would take more than the {MAX_DECODED_BYTES} bytes accepted once decoded"
        )
    );
    // So are nodes of one-byte names, 5 bytes each on the wire.
    let named_nodes = [0x62, 0x03, 0x0a, 0x01, b'n'].repeat(MAX_MESSAGE_BYTES / 5);
    assert_eq!(
        PublishedView::decode(&framed(&named_nodes)),
        Err(ViewError::TooCostly)
    );
    // Names cost at most about 14 times their bytes: 1 MiB of them stays
    // under the cap, and each is counted.
    let names = 300_000;
    let names_in_a_node: Vec<u8> = {
        let inner = [0x4a, 0x01, b'o'].repeat(names);
        let mut m = vec![0x62];
        prost::encoding::encode_varint(inner.len() as u64, &mut m);
        m.extend(inner);
        m
    };
    assert!(names_in_a_node.len() <= MAX_MESSAGE_BYTES);
    assert_eq!(
        cost::check(&names_in_a_node),
        Ok(cost::NODE_COST + names * (cost::STRING_COST + 1))
    );
    // A malformed field is named as such, not decoded.
    assert!(refused(&framed(&[0x62, 0x05, 0x00])).starts_with("not a view message"));
    assert!(refused(&framed(&[0x63])).starts_with("not a view message: a group"));
}

#[test]
fn a_view_of_short_names_lists_within_what_readers_decode() {
    // Short names, each node down with 16 failing observers named: small
    // on the wire, large decoded, so the decoded budget binds first.
    let n = 20_000;
    let nodes: Vec<NodeView> = (0..n)
        .map(|i| {
            let mut v = node(&format!("{i:x}"), Verdict::NodeDown);
            v.zone = None;
            v.failing_observers = (0..16).map(|j| format!("{j:x}")).collect();
            (v.failing, v.observers, v.plaintext) = (16, 20, 0);
            v
        })
        .collect();
    let view = ClusterView {
        plaintext_nodes: Vec::new(),
        reports: n,
        ignored: 0,
        counts: VerdictCounts {
            node_down: n,
            ..VerdictCounts::default()
        },
        nodes,
    };
    let p = PublishedView::of("node-1", 1, 5, 1_000, &view);
    let bytes = p.encode();
    assert!(
        bytes.len() < MAX_MESSAGE_BYTES * 3 / 4,
        "the wire's budget is not what binds: {} bytes",
        bytes.len()
    );
    assert!(p.unlisted > 0, "{}", p.unlisted);
    // The reader's count of what it decodes is the assembler's, within the
    // budget, and one more node would have passed it.
    let mut message = &bytes[1..];
    prost::decode_length_delimiter(&mut message).expect("a length");
    let counted = cost::check(message).expect("within the budget");
    assert!(counted <= LISTED_DECODED_BYTES, "{counted}");
    assert!(
        counted + cost::node_cost(&p.view.nodes[0]) > LISTED_DECODED_BYTES,
        "{counted}: the budget is used"
    );
    let back = PublishedView::decode(&bytes).expect("decodes");
    assert_eq!(back.view.nodes.len() + usize_of(back.unlisted), n);
    // A view's cost counted from what it holds is the wire's count.
    assert_eq!(back.cost(), counted);
}

fn refused(bytes: &[u8]) -> String {
    PublishedView::decode(bytes)
        .expect_err("refused")
        .to_string()
}

#[test]
fn hostile_views_are_refused_with_the_reason() {
    let good = published().encode();
    assert_eq!(refused(&[]), "empty");
    let mut v2 = good.clone();
    v2[0] = 2;
    assert_eq!(
        refused(&v2),
        "format version 2 (this agent reads version 1)"
    );
    assert!(refused(&good[..good.len() - 1]).starts_with("truncated or trailing bytes"));
    let mut long = good.clone();
    long.push(0);
    assert!(refused(&long).starts_with("truncated or trailing bytes"));
    // A length past the cap is refused before anything is read.
    let mut huge = vec![VERSION];
    prost::encode_length_delimiter(MAX_MESSAGE_BYTES + 1, &mut huge).expect("varint");
    assert_eq!(
        refused(&huge),
        format!(
            "{} bytes of message, more than the {MAX_MESSAGE_BYTES} accepted",
            MAX_MESSAGE_BYTES + 1
        )
    );
    assert!(refused(b"\x01\x03abc").starts_with("not a view message"));

    let edit = |f: &dyn Fn(&mut PublishedView)| {
        let mut p = published();
        f(&mut p);
        refused(&p.encode())
    };
    assert_eq!(
        edit(&|p| p.assembler.clear()),
        format!("assembler \"\": {NAME_RULE}")
    );
    assert_eq!(
        edit(&|p| p.interval_ms = 0),
        "interval of 0 ms (1 ms to 1 h)"
    );
    assert_eq!(
        edit(&|p| p.view.counts.node_down = 2),
        "the counts say 4 nodes not healthy; 3 are listed and 0 unlisted"
    );
    assert_eq!(
        edit(&|p| {
            p.view.counts.node_down = 0;
            p.view.counts.unknown = 2;
        }),
        "the counts say 3 nodes not healthy; 3 are listed and 0 unlisted"
    );
    // Nodes left unlisted with room to spare: a writer hiding a node from
    // the readers' checks (one not listed reads as healthy only when none
    // is unlisted).
    let hiding = edit(&|p| {
        p.view.nodes.pop();
        p.unlisted = 1;
    });
    assert!(
        hiding.starts_with("1 nodes not healthy left unlisted, with room for ")
            && hiding.ends_with("an assembler lists them all until its message is full"),
        "{hiding}"
    );
    assert_eq!(
        edit(&|p| p.view.nodes.swap(0, 1)),
        "node \"b\": listed twice or out of order"
    );
    assert_eq!(
        edit(&|p| p.view.nodes[1].verdict = Verdict::Healthy),
        "node \"c\": verdict code 0 (1 to 4)"
    );
    assert_eq!(
        edit(&|p| p.view.nodes[1].observers = 1),
        "node \"c\": more observers reaching or failing it than observe it"
    );
    assert_eq!(
        edit(&|p| p.view.nodes[1].failing_observers = (0..17).map(|i| format!("o{i}")).collect()),
        "node \"c\": more names than a view lists"
    );
    assert_eq!(
        edit(&|p| p.view.counts.healthy = 1 << 21),
        "2097155 nodes counted, more than 1048576"
    );
    assert_eq!(
        edit(&|p| p.view.counts.lossy = 6),
        "6 nodes counted with lossy paths, of 5 nodes"
    );
    assert_eq!(
        edit(&|p| p.view.nodes[2].lossy = 2),
        "node \"e\": more observers reaching it over a lossy path than reach it"
    );
    assert_eq!(
        edit(&|p| p.view.nodes[2].plaintext = 2),
        "node \"e\": more observers reaching it in plain text than reach it"
    );
    assert_eq!(
        edit(&|p| p.view.counts.plaintext = 1),
        "1 nodes counted reached in plain text (2 named, at most 100), of 5 nodes"
    );
    assert_eq!(
        edit(&|p| p.view.plaintext_nodes.reverse()),
        "node \"a\": listed twice or out of order"
    );
}

const NAME_RULE: &str =
    "a name is 1 to 253 bytes of letters, digits, '.', '_' and '-', the first a letter or digit";

/// What a terminal or the page would show: no escape sequence, control
/// character or space gets there from a view, whose names and zones
/// follow the records' rules.
#[test]
fn names_in_a_view_follow_the_records_rules() {
    let edit = |f: &dyn Fn(&mut PublishedView)| {
        let mut p = published();
        f(&mut p);
        refused(&p.encode())
    };
    assert_eq!(
        edit(&|p| p.view.nodes[1].name = "c\u{1b}[2J".into()),
        format!("node \"c\\u{{1b}}[2J\": {NAME_RULE}")
    );
    assert_eq!(
        edit(&|p| p.view.nodes[1].failing_observers = vec!["a\rSTALE".into()]),
        format!("named node \"a\\rSTALE\": {NAME_RULE}")
    );
    assert_eq!(
        edit(&|p| p.view.nodes[1].zone = Some("zone a".into())),
        "zone \"zone a\": only letters, digits, '.', '_' and '-'"
    );
    assert_eq!(
        edit(&|p| p.assembler = "-x".into()),
        format!("assembler \"-x\": {NAME_RULE}")
    );
}

#[test]
fn a_view_older_than_two_of_its_rounds_is_stale() {
    let p = published();
    assert_eq!(p.interval_ms, 2_000);
    assert!(!p.stale(p.at_ms));
    assert!(!p.stale(p.at_ms + 4_000));
    assert!(p.stale(p.at_ms + 4_001));
    // From the future: not stale, and how far ahead is told.
    assert!(!p.stale(p.at_ms - 10));
    assert_eq!(p.ahead_ms(p.at_ms - 10), 10);
    assert_eq!(p.age_ms(p.at_ms + 7), 7);
}

#[test]
fn the_view_and_the_election_sit_beside_the_node_records() {
    assert_eq!(view_prefix("/health/nodes/"), "/health/view/");
    assert_eq!(election_name("/health/nodes/"), "/health/assembler/");
    assert_eq!(view_prefix("nodes"), "nodes-view/");
}
