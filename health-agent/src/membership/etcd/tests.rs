use serde_json::{Value, json};

use super::*;
use crate::membership::held::MAX_JUNK_HELD;
use crate::membership::record::RejectedRecord;

fn local() -> LocalNode {
    LocalNode {
        name: Some("n1".into()),
        health_cidr: Some("198.18.64.0/24".parse().expect("cidr")),
        health_cidr6: None,
        ..LocalNode::default()
    }
}

fn kv(key: &str, value: &Value) -> Entry {
    raw(key, &value.to_string())
}

fn raw(key: &str, value: &str) -> Entry {
    Entry {
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
        mod_revision: 1,
        lease: 0,
    }
}

fn record(name: &str, node_ip: &str, health_ip: &str) -> Value {
    json!({"name": name, "node_ip": node_ip, "health_ip": health_ip})
}

/// The set a snapshot of `entries` (in any order) makes.
fn nodes_from(entries: Vec<Entry>, prefix: &str) -> Validated {
    nodes_with_own(entries, prefix, None)
}

/// [`nodes_from`], with `own` as this node's record as its agent
/// wrote it.
fn nodes_with_own(entries: Vec<Entry>, prefix: &str, own: Option<&Node>) -> Validated {
    let mut view = View::new(prefix, Duration::from_secs(60), usize::MAX, "/h/n1");
    if let Some(me) = own {
        view = view.with_own(me.clone());
    }
    view.apply(WatchEvent::Snapshot {
        revision: 1,
        first: true,
        last: true,
        entries,
    });
    view.validated(&local())
}

/// A change after a quiet spell is published at once; the next one
/// waits for the gap after it, then goes out with what else changed.
#[tokio::test(start_paused = true)]
async fn changes_close_together_are_validated_together() {
    let nodes = Nodes::new("etcd".into());
    let names = || -> Vec<String> { nodes.current().iter().map(|n| n.name.clone()).collect() };
    let mut view = View::new("/h/", Duration::from_secs(60), usize::MAX, "/h/n1");
    view.apply(WatchEvent::Snapshot {
        revision: 1,
        first: true,
        last: true,
        entries: vec![kv("/h/a", &record("a", "198.18.0.2", "198.18.65.2"))],
    });
    view.publish("e", &local(), &nodes);
    assert_eq!(names(), ["a"]);
    assert_eq!(view.publish_due(), None, "nothing waits");
    for (key, name, ip, health) in [
        ("/h/b", "b", "198.18.0.3", "198.18.66.2"),
        ("/h/c", "c", "198.18.0.4", "198.18.67.2"),
    ] {
        view.apply(WatchEvent::Put(kv(key, &record(name, ip, health))));
        view.publish("e", &local(), &nodes);
    }
    assert_eq!(names(), ["a"], "within the gap: not yet");
    let due = view.publish_due().expect("a change waits");
    assert!(due - Instant::now() >= MIN_VALIDATE_GAP);
    tokio::time::advance(due - Instant::now() + Duration::from_millis(5)).await;
    assert_eq!(
        view.publish_due(),
        Some(due),
        "past due, it still wakes the loop"
    );
    view.publish("e", &local(), &nodes);
    assert_eq!(names(), ["a", "b", "c"], "both, at once");
    assert_eq!(view.publish_due(), None);
    // A node leaves: its addresses are held; while a change waits,
    // the hold's end does not wake the loop again and again.
    tokio::time::advance(MIN_VALIDATE_GAP).await;
    view.apply(WatchEvent::Delete {
        key: b"/h/c".to_vec(),
        revision: 3,
    });
    view.publish("e", &local(), &nodes);
    assert_eq!(names(), ["a", "b"]);
    let ends = view.hold_end().expect("c's addresses held");
    view.apply(WatchEvent::Delete {
        key: b"/h/b".to_vec(),
        revision: 4,
    });
    view.publish("e", &local(), &nodes);
    assert!(view.publish_due().is_some(), "b's leaving waits");
    assert_eq!(view.hold_end(), None, "a change waits already");
    tokio::time::advance(Duration::from_secs(61)).await;
    view.publish("e", &local(), &nodes);
    assert_eq!(names(), ["a"]);
    assert!(
        view.hold_end().is_some_and(|t| t > ends),
        "c's hold ended; b's runs"
    );
}

/// With allocations followed, no set is judged before they are listed;
/// a record outside its node's allocation is refused and claims
/// nothing; allocations past the bound refuse the set whole, and a
/// broken watch of them is said.
#[tokio::test(start_paused = true)]
async fn records_are_judged_by_the_allocations_once_they_are_listed() {
    let nodes = Nodes::new("etcd".into());
    let names = || -> Vec<String> { nodes.current().iter().map(|n| n.name.clone()).collect() };
    let mut view = View::new("/h/", Duration::from_secs(60), usize::MAX, "/h/n1");
    view.allocations = Some(Allocations::new("/a/".into(), local(), 2));
    let allocation = |name: &str, cidr: &str| {
        raw(
            &format!("/a/{name}"),
            &format!(r#"{{"health_cidr":"{cidr}"}}"#),
        )
    };
    view.apply(page(
        vec![
            kv("/h/a", &record("a", "198.18.0.2", "198.18.65.2")),
            kv("/h/squat", &record("squat", "198.18.0.9", "198.18.66.2")),
        ],
        true,
        true,
    ));
    view.publish("e", &local(), &nodes);
    assert_eq!(
        names(),
        Vec::<String>::new(),
        "the allocations not read yet"
    );
    let status = nodes.status();
    assert_eq!(
        (status.updated_ms, status.rejected_total, status.error),
        (None, 0, None),
        "nothing judged"
    );
    view.apply_allocation(page(
        vec![
            allocation("a", "198.18.65.0/24"),
            allocation("b", "198.18.66.0/24"),
        ],
        true,
        true,
    ));
    view.publish("e", &local(), &nodes);
    assert_eq!(names(), ["a"]);
    let status = nodes.status();
    assert_eq!(status.rejected.len(), 1, "{status:?}");
    assert_eq!(
        status.rejected[0].reason,
        "health-ip 198.18.66.2 is not allocated: no allocation at etcd key \"/a/squat\" (--kvstore-allocations)"
    );
    // b comes for the address the squatter claimed first: it is b's.
    tokio::time::advance(Duration::from_secs(1)).await;
    view.apply(WatchEvent::Put(kv(
        "/h/b",
        &record("b", "198.18.0.3", "198.18.66.2"),
    )));
    view.publish("e", &local(), &nodes);
    assert_eq!(names(), ["a", "b"]);
    // Past the bound: the set is refused whole, the last good one kept.
    tokio::time::advance(Duration::from_secs(1)).await;
    view.apply_allocation(WatchEvent::Put(allocation("c", "198.18.67.0/24")));
    view.publish("e", &local(), &nodes);
    assert_eq!(names(), ["a", "b"]);
    let error = nodes.status().error.expect("refused");
    assert!(
        error.starts_with("more allocations under /a/ than --max-nodes 2"),
        "{error}"
    );
    // The allocations' watch breaks: said, and nothing judged.
    tokio::time::advance(Duration::from_secs(1)).await;
    view.apply_allocation(page(vec![allocation("a", "198.18.65.0/24")], true, true));
    view.apply_allocation(WatchEvent::Lost {
        error: Arc::new(super::super::kvstore::KvError::Timeout {
            op: "watch".into(),
            timeout: Duration::from_secs(5),
        }),
    });
    view.publish("e", &local(), &nodes);
    assert_eq!(names(), ["a", "b"], "not judged while the watch is out");
    view.apply(WatchEvent::Put(kv(
        "/h/c",
        &record("c", "198.18.0.4", "198.18.65.9"),
    )));
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(
        view.publish_due(),
        None,
        "a change waits without waking the loop"
    );
    let error = nodes.status().error.expect("said");
    assert!(
        error.starts_with("etcd at e: the allocations under /a/: "),
        "{error}"
    );
    view.apply_allocation(page(vec![allocation("a", "198.18.65.0/24")], true, true));
    view.publish("e", &local(), &nodes);
    assert_eq!(names(), ["a"], "b's allocation went");
    assert_eq!(nodes.status().error, None);
}

/// Allocations that count for nothing are listed at their keys, on
/// their own beside the rejected records, whether or not their nodes
/// have records: an admin's mistake shows before its node comes.
#[tokio::test(start_paused = true)]
async fn allocations_that_count_for_nothing_are_listed() {
    let nodes = Nodes::new("etcd".into());
    let mut view = View::new("/h/", Duration::from_secs(60), usize::MAX, "/h/n1");
    view.allocations = Some(Allocations::new("/a/".into(), local(), 10));
    view.apply(page(
        vec![
            kv("/h/a", &record("a", "198.18.0.2", "198.18.65.2")),
            kv("/h/z", &record("z", "198.18.0.26", "198.18.69.2")),
        ],
        true,
        true,
    ));
    view.apply_allocation(page(
        vec![
            raw("/a/a", r#"{"health_cidr":"198.18.65.0/24"}"#),
            raw("/a/o-1", r#"{"health_cidr":"198.18.66.0/24"}"#),
            raw("/a/o-2", r#"{"health_cidr":"198.18.66.0/25"}"#),
            raw(
                "/a/typo",
                r#"{"health_cidr":"198.18.67.0/24","node_ip":"198.18.0.300"}"#,
            ),
        ],
        true,
        true,
    ));
    view.publish("e", &local(), &nodes);
    let status = nodes.status();
    let listed = |l: &[RejectedRecord]| -> Vec<(String, String)> {
        l.iter()
            .map(|r| (r.record.clone(), r.reason.clone()))
            .collect()
    };
    assert_eq!(
        listed(&status.allocations_uncounted),
        [
            (
                "/a/o-1".to_owned(),
                "overlaps the one at \"/a/o-2\", and neither counts".to_owned()
            ),
            (
                "/a/o-2".to_owned(),
                "overlaps the one at \"/a/o-1\", and neither counts".to_owned()
            ),
            (
                "/a/typo".to_owned(),
                "refused: node_ip \"198.18.0.300\" is not an IPv4 address".to_owned()
            ),
        ]
    );
    assert_eq!(status.allocations_uncounted_total, 3);
    assert_eq!(
            listed(&status.rejected),
            [(
                "/h/z".to_owned(),
                "health-ip 198.18.69.2 is not allocated: no allocation at etcd key \"/a/z\" (--kvstore-allocations)".to_owned()
            )],
            "the rejected records are node records alone"
        );
    assert_eq!(
        nodes
            .current()
            .iter()
            .map(|n| n.name.as_str())
            .collect::<Vec<_>>(),
        ["a"]
    );
    // Fixed, it is listed no more.
    tokio::time::advance(Duration::from_secs(1)).await;
    view.apply_allocation(WatchEvent::Put(raw(
        "/a/typo",
        r#"{"health_cidr":"198.18.67.0/24","node_ip":"198.18.0.30"}"#,
    )));
    view.publish("e", &local(), &nodes);
    assert_eq!(nodes.status().allocations_uncounted_total, 2);
}

/// The allocations' listing stays current while the node set is
/// refused whole (records past --max-nodes).
#[tokio::test(start_paused = true)]
async fn the_allocations_listing_follows_them_while_the_set_is_refused() {
    let nodes = Nodes::new("etcd".into());
    let mut view = View::new("/h/", Duration::from_secs(60), 1, "/h/n1");
    view.allocations = Some(Allocations::new("/a/".into(), local(), 10));
    view.apply(page(
        vec![
            kv("/h/a", &record("a", "198.18.0.2", "198.18.65.2")),
            kv("/h/b", &record("b", "198.18.0.3", "198.18.66.2")),
        ],
        true,
        true,
    ));
    view.apply_allocation(page(vec![raw("/a/a", "not json")], true, true));
    view.publish("e", &local(), &nodes);
    let status = nodes.status();
    assert!(
        status
            .error
            .as_deref()
            .is_some_and(|e| e.contains("more than --max-nodes 1")),
        "{status:?}"
    );
    assert_eq!(status.allocations_uncounted_total, 1);
    tokio::time::advance(Duration::from_secs(1)).await;
    view.apply_allocation(WatchEvent::Put(raw(
        "/a/a",
        r#"{"health_cidr":"198.18.65.0/24"}"#,
    )));
    view.publish("e", &local(), &nodes);
    let status = nodes.status();
    assert!(status.error.is_some(), "still refused whole");
    assert_eq!(status.allocations_uncounted_total, 0, "{status:?}");
}

/// What a writer puts under the prefix is shown only in part: a value
/// past a record's size is refused undecoded, a decoding error and a
/// long key are cut short; the good record beside them counts.
#[test]
fn a_writers_bytes_are_refused_or_shown_in_part() {
    let huge = format!("{{\"name\": \"{}\"}}", "x".repeat(1 << 20));
    let wrong = json!({"name": "y".repeat(3000), "node_ip": 7, "health_ip": "198.18.65.2"});
    let long_key = format!("/h/{}", "k".repeat(5000));
    let v = nodes_from(
        vec![
            raw("/h/huge", &huge),
            kv("/h/wrong", &wrong),
            kv(&long_key, &record("z", "198.18.0.13", "198.18.67.2")),
            kv("/h/good", &record("good", "198.18.0.12", "198.18.66.2")),
        ],
        "/h/",
    );
    assert_eq!(outcome(&v).0, ["good"]);
    let texts: Vec<String> = v.rejected.iter().map(ToString::to_string).collect();
    assert_eq!(texts.len(), 2, "{texts:?}");
    assert_eq!(v.unheld, 1, "the key too long to be a node's is counted");
    for t in &texts {
        assert!(t.len() < 1200, "{} bytes: {}", t.len(), &t[..200]);
    }
    assert!(
        texts
            .iter()
            .any(|t| t.contains("1048588 bytes, more than a node record's 4096")),
        "{texts:?}"
    );
    assert!(
        v.summary().is_some_and(
            |t| t.contains("3 node records rejected") && t.contains("; and 1 not held")
        ),
        "{:?}",
        v.summary()
    );
}

/// A writer filling the prefix with junk is counted, not held: past
/// the first undecodable records, a key costs the agent its hash; the
/// good records still count, and deleting the junk takes it away.
#[test]
fn junk_past_a_bound_is_counted_not_held() {
    let mut view = View::new("/h/", Duration::from_secs(60), usize::MAX, "/h/n1");
    let junk = |i: usize| raw(&format!("/h/junk-{i:05}"), "not json");
    let mut entries: Vec<Entry> = (0..MAX_JUNK_HELD + 1000).map(junk).collect();
    entries.push(kv("/h/good", &record("good", "198.18.0.12", "198.18.66.2")));
    view.apply(WatchEvent::Snapshot {
        revision: 1,
        first: true,
        last: true,
        entries,
    });
    assert_eq!(
        view.held.records().len(),
        MAX_JUNK_HELD + 1,
        "the held junk and the good record"
    );
    let v = view.validated(&local());
    assert_eq!(outcome(&v).0, ["good"]);
    assert_eq!((v.rejected.len(), v.unheld), (MAX_JUNK_HELD, 1000));
    assert_eq!(v.rejected_total(), MAX_JUNK_HELD + 1000);
    // A held junk key deleted, an unheld one deleted, one made good.
    let delete = |key: String| WatchEvent::Delete {
        key: key.into_bytes(),
        revision: 2,
    };
    view.apply(delete("/h/junk-00000".into()));
    view.apply(delete(format!("/h/junk-{:05}", MAX_JUNK_HELD + 999)));
    let fixed = format!("/h/junk-{:05}", MAX_JUNK_HELD + 5);
    let name = &fixed["/h/".len()..];
    view.apply(WatchEvent::Put(kv(
        &fixed,
        &record(name, "198.18.0.13", "198.18.67.2"),
    )));
    let v = view.validated(&local());
    assert_eq!(outcome(&v).0, ["good", name]);
    assert_eq!((v.rejected.len(), v.unheld), (MAX_JUNK_HELD - 1, 998));
    // Room again: the next junk is held and listed.
    view.apply(WatchEvent::Put(junk(99_999)));
    assert_eq!(view.validated(&local()).rejected.len(), MAX_JUNK_HELD);
    // Records that decode but can never be a node are junk too: at
    // another name's key, or with a loopback address.
    view.apply(WatchEvent::Put(kv(
        "/h/elsewhere",
        &record("x", "198.18.0.20", "198.18.68.2"),
    )));
    view.apply(WatchEvent::Put(kv(
        "/h/lo",
        &record("lo", "127.0.0.1", "198.18.69.2"),
    )));
    let v = view.validated(&local());
    assert_eq!((v.rejected.len(), v.unheld), (MAX_JUNK_HELD, 1000));
}

/// A set refused whole (past `--max-nodes`) holds no address: the
/// next set is judged as if it had not been read.
#[test]
fn a_set_refused_whole_holds_no_address() {
    let mut view = View::new("/h/", Duration::from_secs(60), usize::MAX, "/h/n1");
    view.apply(WatchEvent::Snapshot {
        revision: 1,
        first: true,
        last: true,
        entries: vec![
            kv("/h/a", &record("a", "198.18.0.11", "198.18.65.2")),
            kv("/h/b", &record("b", "198.18.0.12", "198.18.66.2")),
        ],
    });
    let nodes = Nodes::new("etcd".into()).with_max_nodes(1);
    view.publish("etcd", &local(), &nodes);
    assert!(view.holders.is_empty(), "{:?}", view.holders);
    let nodes = Nodes::new("etcd".into()).with_max_nodes(2);
    view.dirty = true;
    // Past the gap between two validations.
    view.quiet_until = None;
    view.publish("etcd", &local(), &nodes);
    assert_eq!(view.holders.len(), 4, "two addresses of each");
}

fn page(entries: Vec<Entry>, first: bool, last: bool) -> WatchEvent {
    WatchEvent::Snapshot {
        revision: 7,
        entries,
        first,
        last,
    }
}

fn node_kv(i: u8) -> Entry {
    let name = format!("n{i}");
    kv(
        &format!("/h/{name}"),
        &record(
            &name,
            &format!("198.18.0.{i}"),
            &format!("198.18.{}.2", 64 + i),
        ),
    )
}

/// Records that could be nodes past --max-nodes are counted, not held,
/// and the set is refused whole; once they fit again the prefix is
/// read again, and the set is taken.
#[tokio::test(start_paused = true)]
async fn records_past_max_nodes_are_not_held_and_refuse_the_set() {
    let nodes = Nodes::new("etcd".into()).with_max_nodes(3);
    let mut view = View::new("/h/", Duration::from_secs(60), 3, "/h/n1");
    // n1's own record comes last, past the bound: it is held all the
    // same.
    let all: Vec<Entry> = [10, 11, 12, 13, 14, 1].into_iter().map(node_kv).collect();
    view.apply(page(all.clone(), true, true));
    assert_eq!((view.held.records().len(), view.held.over()), (4, 2));
    assert!(view.held.records().contains_key("/h/n1"));
    view.publish("etcd", &local(), &nodes);
    assert!(nodes.current().is_empty(), "refused whole");
    let error = nodes.status().error.expect("said why");
    assert!(
        error.contains("6 records under /h/ could be nodes, more than --max-nodes 3"),
        "{error}"
    );
    assert_eq!(nodes.updates_rejected(), 1);
    assert_eq!(view.reread_due(), None, "six do not fit in three");
    // Three leave: the three left fit, but one of them is not held.
    for i in [10, 11, 12] {
        view.apply(WatchEvent::Delete {
            key: format!("/h/n{i}").into_bytes(),
            revision: 8,
        });
    }
    assert_eq!(view.held.nodes(), 3);
    let due = view.reread_due().expect("read again");
    assert!(due <= Instant::now(), "at once the first time");
    view.rereading(Instant::now());
    assert_eq!(view.reread_due(), None, "one listing at a time");
    let left: Vec<Entry> = [13, 14, 1].into_iter().map(node_kv).collect();
    view.apply(page(left, true, true));
    assert_eq!(view.held.over(), 0);
    tokio::time::advance(Duration::from_secs(1)).await;
    view.publish("etcd", &local(), &nodes);
    let names: Vec<String> = nodes.current().iter().map(|n| n.name.clone()).collect();
    assert_eq!(names, ["n1", "n13", "n14"]);
    // Past the bound again, then under it: read again only after the gap.
    view.apply(WatchEvent::Put(node_kv(15)));
    view.apply(WatchEvent::Delete {
        key: b"/h/n13".to_vec(),
        revision: 9,
    });
    let again = view.reread_due().expect("read again");
    assert!(
        again - Instant::now() >= REREAD_GAP.saturating_sub(Duration::from_secs(2)),
        "{again:?}"
    );
}

/// A re-read asked for while a listing is under way leaves that
/// listing whole: it is the stream's, and the watch goes on from its
/// revision. Its last page ends the re-read.
#[tokio::test(start_paused = true)]
async fn a_reread_asked_during_a_listing_leaves_it_whole() {
    let mut view = View::new("/h/", Duration::from_secs(60), 3, "/h/n1");
    view.apply(page(vec![node_kv(1)], true, true));
    assert!(view.synced);
    // A listing after a quiet break: the view stays in sync meanwhile.
    view.apply(page(vec![node_kv(1), node_kv(2)], true, false));
    view.rereading(Instant::now());
    assert_eq!(view.reread_due(), None, "one listing at a time");
    view.apply(page(vec![node_kv(3)], false, true));
    let held: Vec<&String> = view.held.records().keys().collect();
    assert_eq!(held, ["/h/n1", "/h/n2", "/h/n3"], "the listing, whole");
    assert!(matches!(view.reread, Reread::Done(_)), "{:?}", view.reread);
}

/// A departed node's address is held for the hold's length by the
/// agent's clock, then a new record may take it.
#[tokio::test(start_paused = true)]
async fn a_departed_nodes_address_is_free_when_its_hold_ends() {
    let nodes = Nodes::new("etcd".into());
    let names = || -> Vec<String> { nodes.current().iter().map(|n| n.name.clone()).collect() };
    let mut view = View::new("/h/", Duration::from_secs(60), usize::MAX, "/h/n1");
    view.apply(page(vec![node_kv(2)], true, true));
    view.publish("e", &local(), &nodes);
    assert_eq!(names(), ["n2"]);
    view.apply(WatchEvent::Delete {
        key: b"/h/n2".to_vec(),
        revision: 8,
    });
    tokio::time::advance(Duration::from_secs(1)).await;
    view.publish("e", &local(), &nodes);
    let taker = || kv("/h/x", &record("x", "198.18.0.2", "198.18.90.2"));
    view.apply(WatchEvent::Put(taker()));
    tokio::time::advance(Duration::from_secs(1)).await;
    view.publish("e", &local(), &nodes);
    assert!(names().is_empty(), "n2's address is held");
    tokio::time::advance(Duration::from_secs(60)).await;
    view.apply(WatchEvent::Put(taker()));
    view.publish("e", &local(), &nodes);
    assert_eq!(names(), ["x"], "the hold ended");
}

/// A listing's pages replace what is held together, at the last one;
/// a listing cut off by a lost watch replaces nothing.
#[test]
fn a_listing_in_pages_replaces_the_records_at_its_last_page() {
    let mut view = View::new("/h/", Duration::from_secs(60), usize::MAX, "/h/n1");
    view.apply(page(vec![node_kv(1), node_kv(2)], true, true));
    let keys = |v: &View<'_>| v.held.records().keys().cloned().collect::<Vec<_>>();
    view.apply(page(vec![node_kv(3)], true, false));
    view.apply(page(vec![node_kv(4)], false, false));
    assert_eq!(keys(&view), ["/h/n1", "/h/n2"], "not yet");
    view.apply(WatchEvent::Lost {
        error: Arc::new(super::super::kvstore::KvError::StreamEnded { what: "watch" }),
    });
    view.apply(page(vec![node_kv(5)], false, true));
    assert_eq!(
        keys(&view),
        ["/h/n1", "/h/n2"],
        "a broken listing is dropped"
    );
    assert!(!view.synced);
    view.apply(page(vec![node_kv(3)], true, false));
    view.apply(page(vec![node_kv(4)], false, true));
    assert_eq!(keys(&view), ["/h/n3", "/h/n4"]);
    assert!(view.synced && view.dirty);
}

fn outcome(v: &Validated) -> (Vec<&str>, Vec<String>) {
    (
        v.nodes.iter().map(|n| n.name.as_str()).collect(),
        v.rejected.iter().map(ToString::to_string).collect(),
    )
}

/// This node's record counts as taken by someone else only once the
/// view has seen this agent's write of it: a listing read just before
/// the write (an agent starting) is no reason to write it back.
#[test]
fn a_record_counts_as_taken_only_after_the_view_saw_this_agents_write() {
    let value = record("n1", "198.18.0.11", "198.18.64.2");
    let me = Node::from(serde_json::from_value::<NodeRecord>(value.clone()).expect("a record"));
    let own = OwnRecord {
        key: "/h/n1".into(),
        node: me.clone(),
        value: value.to_string().into_bytes(),
    };
    let at = |mut e: Entry, revision| {
        e.mod_revision = revision;
        e
    };
    let listing = |revision, entries| WatchEvent::Snapshot {
        revision,
        entries,
        first: true,
        last: true,
    };
    let mut view = View::new("/h/", Duration::from_secs(60), usize::MAX, "/h/n1").with_own(me);
    view.apply(listing(5, vec![at(node_kv(2), 3)]));
    assert!(!own.taken_from(&view, None), "nothing written yet");
    assert!(
        !own.taken_from(&view, Some(6)),
        "the write at 6 not seen yet"
    );
    view.apply(WatchEvent::Put(at(kv("/h/n1", &value), 6)));
    assert!(
        !own.taken_from(&view, Some(6)),
        "the write seen, as written"
    );
    view.apply(WatchEvent::Delete {
        key: b"/h/n1".to_vec(),
        revision: 7,
    });
    assert!(own.taken_from(&view, Some(6)), "deleted after the write");
    let changed = record("n1", "198.18.0.11", "198.18.64.9");
    view.apply(WatchEvent::Put(at(kv("/h/n1", &changed), 8)));
    assert!(own.taken_from(&view, Some(6)), "changed after the write");
    assert!(
        !own.taken_from(&view, Some(9)),
        "written back at 9, not seen yet"
    );
    view.apply(listing(9, vec![at(kv("/h/n1", &value), 9)]));
    assert!(
        !own.taken_from(&view, Some(9)),
        "a listing at 9 holds the write"
    );
    // An event older than the listing (none comes, but a stale one
    // would) leaves the view at the listing's revision.
    view.apply(WatchEvent::Delete {
        key: b"/h/n2".to_vec(),
        revision: 4,
    });
    assert_eq!(view.revision.at, 9);
    // etcd's history went back (restored from an older backup) with
    // the lease kept: the write at 9 is not to be waited for.
    view.apply(listing(4, vec![at(node_kv(2), 3)]));
    assert!(
        own.taken_from(&view, Some(9)),
        "gone in a history gone back"
    );
    view.apply(listing(6, vec![at(kv("/h/n1", &value), 5)]));
    assert!(!own.taken_from(&view, Some(9)), "held as written");
    assert!(!view.revision.went_back, "a listing past the last one");
}

/// A write-back names whose write it undoes, from the lease the watch
/// saw this node's key written under: another lease is most likely
/// another agent under this node's name. Its warning is said once a
/// minute for each kind of writer (every other lease is one kind),
/// with the write-backs since, not at every write-back.
#[test]
fn a_write_back_names_the_lease_it_undoes_and_says_so_once_a_minute() {
    let mut view = View::new("/h/", Duration::from_secs(60), usize::MAX, "/h/n1");
    let under = |lease| {
        let mut e = node_kv(1);
        e.lease = lease;
        e
    };
    let listing = |entries, first, last| WatchEvent::Snapshot {
        revision: 5,
        entries,
        first,
        last,
    };
    view.apply(listing(vec![under(0xabc), node_kv(2)], true, true));
    assert_eq!(view.own_lease, Some(0xabc));
    // A listing's lease counts once the listing is whole.
    view.apply(listing(vec![node_kv(2)], true, false));
    view.apply(listing(vec![under(0xdef)], false, false));
    assert_eq!(view.own_lease, Some(0xabc), "not yet");
    view.apply(listing(vec![node_kv(3)], false, true));
    assert_eq!(view.own_lease, Some(0xdef));
    view.apply(listing(vec![node_kv(2)], true, true));
    assert_eq!(view.own_lease, None, "absent from the listing");
    view.apply(WatchEvent::Put(under(0x123)));
    assert_eq!(view.own_lease, Some(0x123));
    view.apply(WatchEvent::Put(node_kv(2)));
    assert_eq!(view.own_lease, Some(0x123), "another key's lease");
    let by = Writer::of(view.own_lease, Some(0x777));
    assert_eq!(by, Writer::Lease(0x123));
    let said = by.to_string();
    assert!(
        said.contains("lease 123") && said.contains("another agent"),
        "{said}"
    );
    assert_eq!(Writer::of(Some(0x777), Some(0x777)), Writer::OwnLease);
    assert_eq!(Writer::of(Some(0), Some(0x777)), Writer::NoLease);
    assert_eq!(Writer::of(Some(0), None), Writer::NoLease);
    view.apply(WatchEvent::Delete {
        key: b"/h/n1".to_vec(),
        revision: 6,
    });
    assert_eq!(view.own_lease, None);
    assert_eq!(Writer::of(view.own_lease, Some(0x777)), Writer::Deleted);

    let mut rewrites = Rewrites::default();
    let t0 = Instant::now();
    let at = |s| t0 + Duration::from_secs(s);
    assert_eq!(rewrites.said(by, at(0)), Some(0), "said at once");
    assert_eq!(rewrites.said(by, at(5)), None);
    // Another lease is the same kind of writer: counted, not said.
    assert_eq!(rewrites.said(Writer::Lease(0x456), at(10)), None);
    assert_eq!(rewrites.said(by, at(60)), Some(2), "a minute on, counted");
    assert_eq!(rewrites.said(by, at(65)), None);
    // Another kind is said at once, and each keeps its own count.
    assert_eq!(rewrites.said(Writer::Deleted, at(70)), Some(0));
    assert_eq!(rewrites.said(Writer::Deleted, at(75)), None);
    assert_eq!(rewrites.said(by, at(80)), None);
    assert_eq!(rewrites.said(by, at(120)), Some(2));
    assert_eq!(rewrites.said(Writer::Deleted, at(130)), Some(1));
}

/// This node's record, changed or deleted by someone else, counts as
/// this agent wrote it: the forgery takes no other node's address and
/// the node stays in its own set until the record is written back.
#[test]
fn a_forged_own_record_counts_as_this_agent_wrote_it() {
    let me = Node::from(
        serde_json::from_value::<NodeRecord>(record("n1", "198.18.0.11", "198.18.64.2"))
            .expect("a record"),
    );
    let node_2 = kv("/h/node-2", &record("node-2", "198.18.0.12", "198.18.66.2"));
    // At n1's key: n1, with node-2's node address and another health
    // address.
    let forged = kv("/h/n1", &record("n1", "198.18.0.12", "198.18.64.9"));
    let snapshot = |entries: Vec<Entry>, own: Option<&Node>| nodes_with_own(entries, "/h/", own);
    // Without its own record to stand for it, the forgery wins.
    let got = snapshot(vec![node_2.clone(), forged.clone()], None);
    assert_eq!(outcome(&got).0, ["n1"]);
    // With it, n1 is as written and node-2 keeps its address.
    let got = snapshot(vec![node_2.clone(), forged], Some(&me));
    let (kept, rejected) = outcome(&got);
    assert_eq!(kept, ["n1", "node-2"]);
    assert!(rejected.is_empty(), "{rejected:?}");
    assert_eq!(got.nodes.get("n1"), Some(&me));
    // Deleted: still in its own set.
    let got = snapshot(
        vec![
            kv("/h/a", &record("a", "198.18.0.13", "198.18.67.2")),
            node_2,
        ],
        Some(&me),
    );
    assert_eq!(outcome(&got).0, ["a", "n1", "node-2"]);
    assert_eq!(got.nodes.get("n1"), Some(&me));
}

#[test]
fn records_decode_and_garbage_is_rejected_by_key() {
    let got = nodes_from(
        vec![
            kv("/h/n1", &record("n1", "198.18.0.11", "198.18.64.2")),
            raw("/h/bad", "not json"),
            kv("/h/n2", &record("n2", "198.18.0.12", "198.18.65.2")),
        ],
        "/h/",
    );
    let (kept, rejected) = outcome(&got);
    assert_eq!(kept, ["n1", "n2"]);
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert!(
        rejected[0].starts_with("etcd key \"/h/bad\": the value is not a node record: "),
        "{rejected:?}"
    );
    assert_eq!(nodes_from(Vec::new(), "/h/"), Validated::default());
}

#[test]
fn ipv6_records_decode_and_bad_ones_are_rejected_by_key() {
    let v6 = json!({"name": "v6", "node_ip6": "2001:2::12", "health_ip6": "2001:2:0:41::2"});
    let mixed = json!({"name": "mixed", "node_ip6": "198.18.0.13", "health_ip6": "2001:2:0:42::2"});
    let half = json!({"name": "half", "node_ip": "198.18.0.14", "health_ip": "198.18.67.2", "node_ip6": "2001:2::14"});
    let got = nodes_from(
        vec![
            kv("/h/half", &half),
            kv("/h/mixed", &mixed),
            kv("/h/v6", &v6),
        ],
        "/h/",
    );
    let (kept, rejected) = outcome(&got);
    assert_eq!(kept, ["v6"]);
    assert_eq!(
        got.nodes.get("v6").and_then(|n| n.health_ip6),
        Some("2001:2:0:41::2".parse().expect("ip"))
    );
    assert!(
        rejected[0].starts_with("etcd key \"/h/half\": node-ip6 without health-ip6"),
        "{rejected:?}"
    );
    assert!(
        rejected[1].starts_with("etcd key \"/h/mixed\": the value is not a node record: ")
            && rejected[1].contains("IPv6"),
        "{rejected:?}"
    );
}

#[test]
fn zones_are_kept() {
    let mut r = record("n2", "198.18.0.12", "198.18.65.2");
    r["zone"] = json!("rack-1");
    let got = nodes_from(vec![kv("/h/n2", &r)], "/h/");
    assert_eq!(
        got.nodes.get("n2").and_then(|n| n.zone.as_deref()),
        Some("rack-1")
    );
}

#[test]
fn events_update_one_record_at_a_time() {
    let mut view = View::new("/h/", Duration::from_secs(60), usize::MAX, "/h/n1");
    view.apply(WatchEvent::Snapshot {
        revision: 5,
        first: true,
        last: true,
        entries: vec![
            kv("/h/n1", &record("n1", "198.18.0.11", "198.18.64.2")),
            kv("/h/n2", &record("n2", "198.18.0.12", "198.18.65.2")),
        ],
    });
    view.apply(WatchEvent::Put(kv(
        "/h/n3",
        &record("n3", "198.18.0.13", "198.18.66.2"),
    )));
    view.apply(WatchEvent::Put(kv(
        "/h/n2",
        &record("n2", "198.18.0.22", "198.18.65.2"),
    )));
    view.apply(WatchEvent::Delete {
        key: b"/h/n1".to_vec(),
        revision: 8,
    });
    let got = view.validated(&local());
    assert_eq!(outcome(&got).0, ["n2", "n3"]);
    assert_eq!(
        got.nodes
            .get("n2")
            .and_then(|n| n.node_ip)
            .map(|ip| ip.to_string()),
        Some("198.18.0.22".into())
    );
    // A new snapshot replaces everything.
    view.apply(WatchEvent::Snapshot {
        revision: 9,
        first: true,
        last: true,
        entries: vec![kv("/h/n1", &record("n1", "198.18.0.11", "198.18.64.2"))],
    });
    assert_eq!(outcome(&view.validated(&local())).0, ["n1"]);
}

#[test]
fn each_rule_rejects_the_record_by_key_and_keeps_the_others() {
    let good = kv("/h/n1", &record("n1", "198.18.0.11", "198.18.64.2"));
    for (bad, needle) in [
        (
            kv("/h/n5", &record("n5", "127.0.0.1", "198.18.66.2")),
            "etcd key \"/h/n5\": node-ip 127.0.0.1 is loopback",
        ),
        (
            kv("/h/n5", &record("n5", "198.18.0.15", "0.0.0.0")),
            "etcd key \"/h/n5\": health-ip 0.0.0.0 is unspecified",
        ),
        (
            kv("/h/n5", &record("n5", "169.254.9.9", "198.18.66.2")),
            "node-ip 169.254.9.9 is link-local",
        ),
        (
            kv("/h/n5", &record("n5", "198.18.0.15", "239.1.1.1")),
            "health-ip 239.1.1.1 is multicast",
        ),
        (
            kv("/h/n5", &record("n5", "255.255.255.255", "198.18.66.2")),
            "limited broadcast",
        ),
        (
            kv("/h/n5", &record("n5", "198.18.0.15", "241.0.0.1")),
            "reserved (240.0.0.0/4)",
        ),
        (
            kv("/h/n5", &record("n5", "198.18.0.15", "198.18.64.77")),
            "etcd key \"/h/n5\": health-ip 198.18.64.77 is inside this node's health CIDR 198.18.64.0/24",
        ),
        (
            kv("/h/n5", &record("other", "198.18.0.15", "198.18.66.2")),
            "etcd key \"/h/n5\": a node record counts only at exactly <prefix><name>: \"other\" belongs at \"/h/other\"",
        ),
        (
            kv("/h/", &record("", "198.18.0.15", "198.18.66.2")),
            "etcd key \"/h/\": the name is empty",
        ),
        (
            kv("/h/a b", &record("a b", "198.18.0.15", "198.18.66.2")),
            "the name \"a b\" is not a node name",
        ),
        (
            kv("/h/n5", &record("n5", "198.18.0.11", "198.18.66.2")),
            "etcd key \"/h/n5\": node-ip 198.18.0.11 is already the node-ip of node \"n1\" at etcd key \"/h/n1\", which is kept",
        ),
        (
            kv("/h/n5", &record("n5", "198.18.0.15", "198.18.0.11")),
            "health-ip 198.18.0.11 is already the node-ip of node \"n1\"",
        ),
    ] {
        let got = nodes_from(vec![good.clone(), bad], "/h/");
        let (kept, rejected) = outcome(&got);
        assert_eq!(kept, ["n1"], "{needle}");
        assert_eq!(rejected.len(), 1, "{rejected:?}");
        assert!(
            rejected[0].contains(needle),
            "{} lacks {needle:?}",
            rejected[0]
        );
    }
}

#[test]
fn a_record_counts_only_at_exactly_the_prefix_and_its_name() {
    // A prefix without a trailing '/': the agent registers `<prefix><name>`.
    let got = nodes_from(
        vec![
            kv(
                "/health/nodesn1",
                &record("n1", "198.18.0.11", "198.18.64.2"),
            ),
            kv(
                "/health/nodesn2",
                &record("n2", "198.18.0.12", "198.18.65.2"),
            ),
            kv(
                "/health/nodesx/n3",
                &record("n3", "198.18.0.13", "198.18.66.2"),
            ),
            kv(
                "/health/nodesn4",
                &record("nodesn4", "198.18.0.14", "198.18.67.2"),
            ),
        ],
        "/health/nodes",
    );
    let (kept, rejected) = outcome(&got);
    assert_eq!(kept, ["n1", "n2"]);
    assert_eq!(
        rejected,
        [
            "etcd key \"/health/nodesn4\": a node record counts only at exactly <prefix><name>: \"nodesn4\" belongs at \"/health/nodesnodesn4\"",
            "etcd key \"/health/nodesx/n3\": a node record counts only at exactly <prefix><name>: \"n3\" belongs at \"/health/nodesn3\"",
        ]
    );
}

#[test]
fn key_order_decides_nothing_and_this_node_wins() {
    // A record at a key that sorts first cannot take node-2's name or
    // address; two new claimants of one address both lose it.
    let got = nodes_from(
        vec![
            kv(
                "/h/0/node-2",
                &record("node-2", "198.18.0.99", "198.18.69.2"),
            ),
            kv("/h/a", &record("a", "198.18.0.12", "198.18.70.2")),
            kv("/h/node-2", &record("node-2", "198.18.0.12", "198.18.66.2")),
            kv("/h/0", &record("0", "198.18.0.11", "198.18.65.2")),
            kv("/h/n1", &record("n1", "198.18.0.11", "198.18.64.2")),
        ],
        "/h/",
    );
    let (kept, rejected) = outcome(&got);
    assert_eq!(kept, ["n1"]);
    assert_eq!(
        rejected,
        [
            "etcd key \"/h/0\": node-ip 198.18.0.11 is already the node-ip of node \"n1\" at etcd key \"/h/n1\", which is kept",
            "etcd key \"/h/0/node-2\": a node record counts only at exactly <prefix><name>: \"node-2\" belongs at \"/h/node-2\"",
            "etcd key \"/h/a\": node-ip 198.18.0.12 is also claimed as node-ip by node \"node-2\" at etcd key \"/h/node-2\": neither takes it",
            "etcd key \"/h/node-2\": node-ip 198.18.0.12 is also claimed as node-ip by node \"a\" at etcd key \"/h/a\": neither takes it",
        ]
    );
    // Once node-2 held its address (an agent that saw it first), the
    // newcomer at a key that sorts before it is the one refused.
    let mut view = View::new("/h/", Duration::from_secs(60), usize::MAX, "/h/n1");
    view.apply(WatchEvent::Snapshot {
        revision: 1,
        first: true,
        last: true,
        entries: vec![kv(
            "/h/node-2",
            &record("node-2", "198.18.0.12", "198.18.66.2"),
        )],
    });
    // Taken as the agent takes a set: its holders are the etcd
    // source's.
    let nodes = Nodes::new("etcd".into());
    view.publish("etcd", &local(), &nodes);
    assert_eq!(view.holders.len(), 2, "node-2's two addresses");
    view.apply(WatchEvent::Put(kv(
        "/h/a",
        &record("a", "198.18.0.12", "198.18.70.2"),
    )));
    let second = view.validated(&local());
    let (kept, rejected) = outcome(&second);
    assert_eq!(kept, ["node-2"]);
    assert_eq!(
        rejected,
        [
            "etcd key \"/h/a\": node-ip 198.18.0.12 is already the node-ip of node \"node-2\" at etcd key \"/h/node-2\", which is kept"
        ]
    );
    // node-2's record goes (a restart): the claim that waited for it
    // does not take its address in the same update, nor until its
    // hold ends.
    view.apply(WatchEvent::Delete {
        key: b"/h/node-2".to_vec(),
        revision: 3,
    });
    let third = view.validated(&local());
    let (kept, rejected) = outcome(&third);
    assert!(kept.is_empty(), "{kept:?}");
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert!(
        rejected[0].contains("node-ip 198.18.0.12") && rejected[0].contains("node-2"),
        "{rejected:?}"
    );
}

#[test]
fn unknown_fields_are_refused() {
    let got = nodes_from(
        vec![kv(
            "/h/n2",
            &json!({"name": "n2", "node_ip": "198.18.0.12", "health_ip": "198.18.65.2", "healt_ip6": "2001:2::1"}),
        )],
        "/h/",
    );
    let (kept, rejected) = outcome(&got);
    assert_eq!(kept, Vec::<&str>::new());
    assert!(
        rejected[0].starts_with(
            "etcd key \"/h/n2\": the value is not a node record: unknown field `healt_ip6`"
        ),
        "{rejected:?}"
    );
}
