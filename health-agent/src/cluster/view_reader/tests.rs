use super::*;
use crate::cluster::view::{ClusterView, VerdictCounts};

fn value(at_ms: u64, assembler: &str) -> Vec<u8> {
    value_every(at_ms, assembler, 1_000)
}

/// A view of two healthy nodes, saying it is assembled every
/// `interval_ms`.
fn value_every(at_ms: u64, assembler: &str, interval_ms: u64) -> Vec<u8> {
    let view = ClusterView {
        plaintext_nodes: Vec::new(),
        reports: 2,
        ignored: 0,
        counts: VerdictCounts {
            healthy: 2,
            ..VerdictCounts::default()
        },
        nodes: Vec::new(),
    };
    PublishedView::of(assembler, 3, at_ms, interval_ms, &view).encode()
}

/// The reader of node `me`, in a node set of the tests' assemblers.
fn reader() -> ViewReader {
    let mut r = ViewReader::new("/h/view/".into(), "me".into(), Duration::from_secs(1));
    let names: Vec<String> = ["a", "b", "c", "leader", "liar", "me"]
        .into_iter()
        .map(str::to_owned)
        .chain((0..=MAX_VIEWS).map(|i| format!("n{i:02}")))
        .chain((0..MAX_VIEWS + 4).map(|i| format!("z{i:02}")))
        .collect();
    r.set_members(NodeSet::named(
        &names.iter().map(String::as_str).collect::<Vec<_>>(),
    ));
    r
}

fn put(key: &str, value: Vec<u8>) -> WatchEvent {
    WatchEvent::put_at(key, value)
}

#[test]
fn a_refused_view_keeps_the_last_good_one_which_goes_stale() {
    let mut r = reader();
    let now = 1_000_000;
    r.apply(put("/h/view/leader", value(now, "leader")), now);
    let a = r
        .reply(now + 500)
        .and_then(|x| x.assembly)
        .expect("assembly");
    assert_eq!(
        (
            a.assembled_by.as_str(),
            a.here,
            a.stale,
            a.age_ms,
            a.key.as_str()
        ),
        ("leader", false, false, 500, "/h/view/leader")
    );
    assert!(r.holds_current(now + 500));
    // Garbage, a view from the future, a view at another's key:
    // refused, the good one kept.
    r.apply(put("/h/view/leader", b"\x01\x05junk!".to_vec()), now);
    r.apply(put("/h/view/liar", value(now + 7_001, "liar")), now);
    r.apply(put("/h/view/other", value(now + 1, "leader")), now);
    assert_eq!(r.refused, 3);
    assert_eq!(
        r.current().map(|(_, v)| v.assembler.as_str()),
        Some("leader")
    );
    // The first refusal of a tick is said at once, the others counted
    // and said at its end.
    assert!(r.unsaid.said);
    assert_eq!(r.unsaid.refused, 2);
    assert!(
        r.unsaid.first.as_deref().is_some_and(|f| f.starts_with(
            "the published view at \"/h/view/liar\" was refused: its time is 7001 ms ahead"
        )),
        "{:?}",
        r.unsaid.first
    );
    r.report_refused(None, 0);
    assert!(!r.unsaid.said && r.unsaid.refused == 0 && r.unsaid.first.is_none());
    // Two rounds on, the view held is stale, not current.
    let a = r
        .reply(now + 2_001)
        .and_then(|x| x.assembly)
        .expect("assembly");
    assert!(a.stale, "{a:?}");
    assert!(!r.holds_current(now + 2_001));
    // A newer view (a new assembler) is shown; this agent's own is
    // marked as such; the old one goes with its lease.
    r.apply(put("/h/view/me", value(now + 3_000, "me")), now + 3_000);
    let a = r
        .reply(now + 3_000)
        .and_then(|x| x.assembly)
        .expect("assembly");
    assert!(a.here && !a.stale, "{a:?}");
    assert!(r.holds_current(now + 3_000), "this agent's own counts too");
    r.apply(
        WatchEvent::Delete {
            key: b"/h/view/leader".to_vec(),
            revision: 9,
        },
        now,
    );
    assert_eq!(r.by_key.len(), 1);
}

/// A value at a key naming no node is refused before it is decoded:
/// megabytes written at such keys cost the readers no decode.
#[test]
fn a_value_at_a_key_naming_no_node_is_refused_undecoded() {
    let now = 1_000_000;
    for key in ["/h/view/stranger", "/h/view/a/b", "/h/viewer"] {
        let mut r = reader();
        // The first refusal of a tick is logged at once; the next kept
        // to be said at its end, with its reason.
        r.apply(put("/h/view/leader", b"\x01\x05junk!".to_vec()), now);
        r.apply(put(key, b"\x01\x05junk!".to_vec()), now);
        assert_eq!(r.refused, 2);
        let said = r.unsaid.first.clone().unwrap_or_default();
        assert!(
            said.ends_with("a view counts only at \"/h/view/\" followed by a node's name, and this key names no node"),
            "{key}: {said}"
        );
    }
    // Before the node set is read, any valid node name may be a node's.
    let early = ViewReader::new("/h/view/".into(), "me".into(), Duration::from_secs(1));
    assert_eq!(early.key_refused(b"/h/view/stranger"), None);
    assert!(early.key_refused(b"/h/view/a/b").is_some());
    assert_eq!(reader().key_refused(b"/h/view/leader"), None);
}

/// A view of an assembler that leaves the node set goes with it.
#[test]
fn the_view_of_an_assembler_that_left_the_set_goes() {
    let mut r = reader();
    let now = 1_000_000;
    r.apply(put("/h/view/leader", value(now, "leader")), now);
    r.apply(put("/h/view/a", value(now - 10, "a")), now);
    assert_eq!(
        r.current().map(|(_, v)| v.assembler.as_str()),
        Some("leader")
    );
    assert!(r.set_members(NodeSet::named(&["a", "me"])), "changed");
    assert_eq!(r.current().map(|(_, v)| v.assembler.as_str()), Some("a"));
    assert_eq!(r.by_key.len(), 1);
    assert!(!r.set_members(NodeSet::named(&["a", "me"])), "unchanged");

    // A listing whose first page came before the leader left.
    let mut r = reader();
    let entry = |key: &str, value: Vec<u8>| Entry {
        key: key.as_bytes().to_vec(),
        value,
        mod_revision: 1,
        lease: 0,
    };
    let page = |entries, first, last| WatchEvent::Snapshot {
        revision: 1,
        entries,
        first,
        last,
    };
    let leader = entry("/h/view/leader", value(now, "leader"));
    r.apply(page(vec![leader], true, false), now);
    r.set_members(NodeSet::named(&["a", "me"]));
    let a = entry("/h/view/a", value(now - 10, "a"));
    r.apply(page(vec![a], false, true), now);
    assert_eq!(r.current().map(|(_, v)| v.assembler.as_str()), Some("a"));
    assert_eq!(r.by_key.len(), 1);
}

/// A listing's pages replace the views together: a view it did not
/// list goes at its last page, one it lists refused keeps the last
/// good one, and a listing holds at most as many as are held.
#[test]
fn a_listing_drops_at_its_last_page_the_views_it_did_not_list() {
    let mut r = reader();
    let now = 1_000_000;
    r.apply(put("/h/view/a", value(now, "a")), now);
    r.apply(put("/h/view/b", value(now, "b")), now);
    let page = |entries: Vec<(&str, Vec<u8>)>, first, last| WatchEvent::Snapshot {
        revision: 4,
        entries: entries
            .into_iter()
            .map(|(k, value)| Entry {
                key: k.as_bytes().to_vec(),
                value,
                mod_revision: 4,
                lease: 0,
            })
            .collect(),
        first,
        last,
    };
    r.apply(
        page(vec![("/h/view/a", b"junk".to_vec())], true, false),
        now,
    );
    assert_eq!(r.by_key.len(), 2, "nothing goes before the last page");
    r.apply(page(vec![("/h/view/c", value(now, "c"))], false, true), now);
    let mut keys: Vec<_> = r.by_key.keys().cloned().collect();
    keys.sort();
    assert_eq!(keys, [&b"/h/view/a"[..], b"/h/view/c"]);
    assert_eq!(r.refused, 1);
    // A listing is bounded on its own, whatever is held.
    let many: Vec<(String, Vec<u8>)> = (0..MAX_VIEWS + 4)
        .map(|i| (format!("/h/view/z{i:02}"), value(now, &format!("z{i:02}"))))
        .collect();
    let many = || many.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    r.apply(page(many(), true, false), now);
    assert_eq!(r.listing.under_way().map(BTreeMap::len), Some(MAX_VIEWS));
    assert_eq!(r.by_key.len(), 2, "held meanwhile");
    r.apply(page(Vec::new(), false, true), now);
    assert_eq!((r.by_key.len(), r.refused), (MAX_VIEWS, 1));
}

#[test]
fn a_contradiction_is_counted_once_per_view_and_checked_at_each_round() {
    use crate::cluster::summary::{PathSample, PeerSummary, Summary};
    use crate::probe::path::ProbeResult;
    let own = |at_ms, state| {
        let p = PeerSummary::new("b", [PathSample::new(state, None); 4]);
        Summary::new("me".into(), 1, at_ms, vec![p]).expect("summary")
    };
    let mut r = reader();
    let mut checker = Checker::default();
    // The view (all healthy, of 10_000) arrives before this agent has
    // failed b for an interval: nothing yet.
    r.apply(put("/h/view/leader", value(10_000, "leader")), 10_000);
    checker.observe(&own(9_500, ProbeResult::Failure));
    r.check_contradictions(&checker);
    assert_eq!(r.contradictions_total, 0);
    // Since 9,000: a contradiction of the same view, counted once.
    checker.observe(&own(9_000, ProbeResult::Success));
    checker.observe(&own(9_000, ProbeResult::Failure));
    r.check_contradictions(&checker);
    r.check_contradictions(&checker);
    assert_eq!(r.contradictions_total, 1);
    let reply = r.reply(10_000).expect("reply");
    assert_eq!(reply.contradictions.len(), 1);
    assert_eq!(reply.contradictions[0].node, "b");
    // A new view saying the same: counted again.
    r.apply(put("/h/view/leader", value(11_000, "leader")), 11_000);
    r.check_contradictions(&checker);
    assert_eq!(r.contradictions_total, 2);
}

/// At start the views come before the node set: a view read then
/// waits, and counts once its node is in; one of no node is dropped
/// then, and once the set is read such a view waits for nothing.
#[test]
fn a_view_read_before_the_node_set_counts_once_its_node_is_in() {
    let mut r = ViewReader::new("/h/view/".into(), "me".into(), Duration::from_secs(1));
    let now = 1_000_000;
    r.apply(put("/h/view/leader", value(now, "leader")), now);
    r.apply(put("/h/view/stranger", value(now + 1, "stranger")), now + 1);
    assert!(r.current().is_none());
    assert_eq!(r.refused, 2);
    // A later value at a waiting key that is refused for another
    // reason drops the waiting one.
    r.apply(put("/h/view/other", value(now, "other")), now);
    assert_eq!(r.waiting.len(), 3);
    r.apply(put("/h/view/other", b"junk".to_vec()), now);
    assert_eq!(r.waiting.len(), 2, "the leader's and the stranger's");
    assert!(r.set_members(NodeSet::named(&["leader", "me"])));
    assert_eq!(
        r.current().map(|(_, v)| v.assembler.as_str()),
        Some("leader")
    );
    assert!(
        r.waiting.is_empty(),
        "the stranger's dropped once the set is in"
    );
    // Once the set is read, a view of no node waits for nothing.
    r.apply(put("/h/view/stranger", value(now + 3, "stranger")), now + 3);
    assert!(r.waiting.is_empty());
    assert!(!r.set_members(NodeSet::named(&["leader", "me", "stranger"])));
    assert_eq!(
        r.current().map(|(_, v)| v.assembler.as_str()),
        Some("leader")
    );
}

#[test]
fn the_views_held_are_bounded() {
    let mut r = reader();
    for i in 0..=MAX_VIEWS {
        let name = format!("n{i:02}");
        r.apply(
            put(&format!("/h/view/{name}"), value(5 + i as u64, &name)),
            5 + i as u64,
        );
    }
    assert_eq!(r.by_key.len(), MAX_VIEWS);
    assert_eq!(r.refused, 0);
    assert!(
        !r.by_key.contains_key(&b"/h/view/n00"[..]) && r.by_key.contains_key(&b"/h/view/n16"[..]),
        "the oldest made room for the newest"
    );
    // One older than every view held is refused.
    r.apply(put("/h/view/n00", value(4, "n00")), 30);
    assert_eq!(r.refused, 1);
    assert!(!r.by_key.contains_key(&b"/h/view/n00"[..]));
    // A view of no node is refused, however fresh.
    r.apply(put("/h/view/stranger", value(100, "stranger")), 100);
    assert_eq!(r.refused, 2);
    assert!(!r.by_key.contains_key(&b"/h/view/stranger"[..]));
    assert_eq!(r.current().map(|(_, v)| v.assembler.as_str()), Some("n16"));
}

/// The watch's echo of an earlier view of this agent's own, read after
/// it published a later one, is not taken: the round shown never goes
/// back.
#[test]
fn an_echo_of_an_earlier_own_view_is_not_taken() {
    let mut r = reader();
    let later = PublishedView::decode(&value(2_000, "me")).expect("a view");
    r.published("/h/view/me".into(), later);
    r.apply(put("/h/view/me", value(1_000, "me")), 2_500);
    assert_eq!(r.current().map(|(_, v)| v.at_ms), Some(2_000));
    assert_eq!(r.refused, 0, "not a refusal");
    // Its own echo, and another's older view, are taken.
    r.apply(put("/h/view/me", value(2_000, "me")), 2_500);
    r.apply(put("/h/view/a", value(1_500, "a")), 2_500);
    assert_eq!(r.by_key.len(), 2);
    assert_eq!(r.current().map(|(_, v)| v.at_ms), Some(2_000));
}

/// The views held are bounded by what they cost decoded too: the
/// oldest make room for a newer one, an older one than every view
/// held is refused with nothing let go, and a view replacing one at
/// its key counts without it.
#[test]
fn the_views_held_are_bounded_in_bytes() {
    let half = HELD_DECODED_BYTES / 2;
    let view = |at: u64| PublishedView::decode(&value(at, "a")).expect("a view");
    let mut views = Views::new();
    for (key, at) in [("a", 10), ("b", 20)] {
        assert!(make_room(&mut views, key.as_bytes(), (at, at), half));
        views.insert(key.as_bytes().to_vec(), (view(at), at, half));
    }
    let keys = |views: &Views| views.keys().cloned().collect::<Vec<_>>();
    assert!(make_room(&mut views, b"b", (30, 30), half), "b replaced");
    assert_eq!(keys(&views), [b"a".to_vec(), b"b".to_vec()]);
    assert!(!make_room(&mut views, b"old", (5, 5), 1), "older than all");
    assert_eq!(views.len(), 2);
    assert!(make_room(&mut views, b"c", (30, 30), half));
    assert_eq!(keys(&views), [b"b".to_vec()], "the oldest went");
    views.insert(b"c".to_vec(), (view(30), 30, half));
    // One that takes the whole budget: every older one goes.
    assert!(make_room(&mut views, b"d", (40, 40), HELD_DECODED_BYTES));
    assert!(views.is_empty());
    // Many small ones: the count binds.
    for i in 0..MAX_VIEWS as u64 {
        views.insert(i.to_be_bytes().to_vec(), (view(50 + i), 50 + i, 1));
    }
    assert!(make_room(&mut views, b"e", (100, 100), 1));
    assert_eq!(views.len(), MAX_VIEWS - 1);
    assert!(!views.contains_key(&0u64.to_be_bytes()[..]));
}

/// A view dated ahead ranks as of when it was read, so the leader's
/// next view, written after it, is shown; one dated further ahead
/// than two of this agent's intervals is refused, whatever interval
/// it claims; and a claim of a long interval does not put this agent's
/// older observations out of the check. (Before, a view dated 55
/// minutes ahead and claiming an hour's interval was shown for 55
/// minutes, and contradicted by no failure of its last hour.)
#[test]
fn a_view_dated_ahead_does_not_outrank_those_written_after_it() {
    use crate::cluster::summary::{PathSample, PeerSummary, Summary};
    use crate::probe::path::ProbeResult;
    let hour = 3_600_000;
    let mut r = reader();
    let now = 1_000_000;
    r.apply(
        put("/h/view/liar", value_every(now + 3_000, "liar", hour)),
        now,
    );
    r.apply(
        put("/h/view/leader", value(now + 1_000, "leader")),
        now + 1_000,
    );
    assert_eq!(r.refused, 0);
    assert_eq!(
        r.current().map(|(_, v)| v.assembler.as_str()),
        Some("leader")
    );
    r.apply(
        put("/h/view/liar", value_every(now + 60_000, "liar", hour)),
        now + 1_000,
    );
    assert_eq!(r.refused, 1, "dated a minute ahead");
    // Its hour's interval is believed up to two of this agent's 1 s:
    // stale 4 s (two of those) after its time, not 2 hours.
    let shown = |r: &ViewReader, at| r.reply(at).and_then(|x| x.assembly).expect("assembly");
    let liar = r.by_key.get(&b"/h/view/liar"[..]).map(|(v, _, _)| v.at_ms);
    assert_eq!(liar, Some(now + 3_000));
    // The liar's view alone, all healthy, at now + 3 s: this agent has
    // failed every path to b since now - 5 s.
    r.apply(
        WatchEvent::Delete {
            key: b"/h/view/leader".to_vec(),
            revision: 2,
        },
        now + 1_000,
    );
    let failed = PeerSummary::new("b", [PathSample::new(ProbeResult::Failure, None); 4]);
    let mut checker = Checker::default();
    checker.observe(&Summary::new("me".into(), 1, now - 5_000, vec![failed]).expect("summary"));
    r.check_contradictions(&checker);
    assert_eq!(r.contradictions_total, 1, "b is healthy in the view");
    let believed = 2_000 * crate::cluster::published_view::STALE_ROUNDS;
    let a = shown(&r, now + 3_000 + believed);
    assert_eq!(
        (a.assembled_by.as_str(), a.interval_ms, a.stale),
        ("liar", 2_000, false)
    );
    assert!(shown(&r, now + 3_001 + believed).stale);
}
