use super::*;

use crate::membership::kvstore::Entry;

/// The node set of the tests' observers.
fn members() -> NodeSet {
    NodeSet::named(&["a", "b", "c", "d", "e", "w", "x", "y", "z"])
}

fn summary(observer: &str, at_ms: u64) -> Vec<u8> {
    Summary::new(observer.into(), 1, at_ms, Vec::new())
        .expect("summary")
        .encode()
}

/// `observer`'s summary at `at_ms` reporting on `peers`, every path
/// reached.
fn reporting(observer: &str, at_ms: u64, peers: impl Iterator<Item = String>) -> Vec<u8> {
    use crate::{
        cluster::summary::{PathSample, PeerSummary},
        probe::path::ProbeResult,
    };
    let ok = PathSample::new(ProbeResult::Success, Some(50));
    let peers = peers.map(|name| PeerSummary::new(name, [ok; 4])).collect();
    Summary::new(observer.into(), 1, at_ms, peers)
        .expect("summary")
        .encode()
}

fn put(key: &str, value: Vec<u8>) -> WatchEvent {
    WatchEvent::put_at(key, value)
}

#[test]
fn summaries_count_only_at_their_observers_key_and_not_from_the_future() {
    let now = 1_000_000;
    let mut held = Held::new("/h/s/", Duration::from_secs(10), 3);
    assert_eq!(held.future_ms, 25_000);
    held.apply(put("/h/s/a", summary("a", now)), now, &members());
    held.apply(put("/h/s/x/b", summary("b", now)), now, &members());
    held.apply(put("/h/s/c", summary("a", now)), now, &members());
    assert_eq!(held.by_key.len(), 1);
    assert_eq!(held.refused, 2);
    assert_eq!(
        held.first_refusal.as_deref(),
        Some(
            "\"/h/s/x/b\": a summary counts only at exactly <prefix><observer>: \"b\" belongs at \"/h/s/b\""
        )
    );
    // Within the limit ahead of the clock, and past it.
    held.apply(put("/h/s/d", summary("d", now + 25_000)), now, &members());
    held.apply(put("/h/s/e", summary("e", now + 25_001)), now, &members());
    assert!(held.by_key.contains_key(&b"/h/s/d"[..]));
    assert!(!held.by_key.contains_key(&b"/h/s/e"[..]));
    held.report_refused();
    held.apply(put("/h/s/e", summary("e", now + 25_001)), now, &members());
    assert_eq!(
        held.first_refusal.as_deref(),
        Some("\"/h/s/e\": its time is 25001 ms ahead of this node's clock (at most 25000 ms)")
    );
    // An agent's summary that went to the future is dropped, not kept
    // at its old value.
    held.apply(put("/h/s/a", summary("a", now + 60_000)), now, &members());
    assert!(!held.by_key.contains_key(&b"/h/s/a"[..]));
}

fn page(keys: &[&str], first: bool, last: bool, now: u64) -> WatchEvent {
    WatchEvent::Snapshot {
        revision: 3,
        entries: keys
            .iter()
            .map(|k| Entry {
                key: format!("/h/s/{k}").into_bytes(),
                value: summary(k, now),
                mod_revision: 3,
                lease: 0,
            })
            .collect(),
        first,
        last,
    }
}

/// A listing's pages replace the summaries together at the last one:
/// until then the leader works from the ones held, and only a whole
/// listing makes it lead.
#[test]
fn a_listing_in_pages_replaces_the_summaries_at_its_last_page() {
    let now = 1_000_000;
    let mut held = Held::new("/h/s/", Duration::from_secs(10), 3);
    held.apply(page(&["a", "b"], true, false, now), now, &members());
    assert!(!held.loaded && held.by_key.is_empty(), "not whole yet");
    held.apply(page(&["c"], false, true, now), now, &members());
    assert!(held.loaded);
    assert_eq!(held.by_key.len(), 3);
    held.apply(page(&["x", "y"], true, false, now), now, &members());
    assert!(
        held.by_key.contains_key(&b"/h/s/a"[..]),
        "the old ones meanwhile"
    );
    held.apply(page(&["z", "w"], false, true, now), now, &members());
    let mut keys: Vec<_> = held.by_key.keys().cloned().collect();
    keys.sort();
    assert_eq!(
        keys,
        [&b"/h/s/x"[..], b"/h/s/y", b"/h/s/z"],
        "bounded across pages"
    );
    assert_eq!(held.refused, 1);
}

#[test]
fn the_summaries_held_are_bounded_and_the_excess_reported() {
    let now = 1_000_000;
    let mut held = Held::new("/h/s/", Duration::from_secs(10), 2);
    for name in ["a", "b", "c", "d"] {
        held.apply(
            put(&format!("/h/s/{name}"), summary(name, now)),
            now,
            &members(),
        );
    }
    assert_eq!(held.by_key.len(), 2);
    assert_eq!(held.refused, 2);
    assert!(
        held.first_refusal
            .as_deref()
            .is_some_and(|r| r.ends_with(": 2 summaries are held already")),
        "{:?}",
        held.first_refusal
    );
    // A key already held is still updated when full.
    held.apply(put("/h/s/a", summary("a", now + 1)), now, &members());
    assert_eq!(
        held.by_key.get(&b"/h/s/a"[..]).map(|k| k.summary.at_ms()),
        Some(now + 1)
    );
}

/// Keys of no node, however many and however early, take no place a
/// node's summary needs; a node that leaves the set has its summary
/// let go.
#[test]
fn summaries_of_observers_outside_the_node_set_are_refused_and_let_go() {
    let now = 1_000_000;
    let mut held = Held::new("/h/s/", Duration::from_secs(10), 2);
    for junk in ["!0001", "!0002", "!0003"] {
        held.apply(
            put(&format!("/h/s/{junk}"), summary(junk, now)),
            now,
            &members(),
        );
    }
    assert!(held.by_key.is_empty());
    assert_eq!(held.refused, 3);
    assert_eq!(
        held.first_refusal.as_deref(),
        Some("\"/h/s/!0001\": its observer \"!0001\" is not in the node set")
    );
    for name in ["a", "b"] {
        held.apply(
            put(&format!("/h/s/{name}"), summary(name, now)),
            now,
            &members(),
        );
    }
    assert_eq!(held.by_key.len(), 2, "the nodes' summaries, every one");
    held.prune(&NodeSet::named(&["b"]), now);
    let keys: Vec<&[u8]> = held.by_key.keys().map(Vec::as_slice).collect();
    assert_eq!(keys, [&b"/h/s/b"[..]]);
    // A refused key is shown cut short.
    let long = "y".repeat(2_000);
    held.report_refused();
    held.apply(
        put(&format!("/h/s/{long}"), summary("y", now)),
        now,
        &members(),
    );
    assert!(
        held.first_refusal.as_ref().is_some_and(|r| r.len() < 1_200),
        "{:?}",
        held.first_refusal.as_ref().map(String::len)
    );
}

/// The summaries held share their peers' names, one copy each however
/// many observers name a node (at 50,000 nodes each of the leader's
/// 50,000 summaries names about 50 of the same nodes), and a name goes
/// with the last summary that names it.
#[test]
fn summaries_held_share_their_peers_names() {
    let now = 1_000_000;
    let members = NodeSet::numbered(20);
    let of = |observer: &str| reporting(observer, now, (2..=10).map(|i| format!("node-{i:04}")));
    let mut held = Held::new("/h/s/", Duration::from_secs(10), 8);
    held.apply(put("/h/s/node-0000", of("node-0000")), now, &members);
    held.apply(put("/h/s/node-0001", of("node-0001")), now, &members);
    let peers = |key: &[u8]| held.by_key[key].summary.peers().to_vec();
    let (a, b) = (peers(b"/h/s/node-0000"), peers(b"/h/s/node-0001"));
    assert_eq!(a.len(), 9);
    for (x, y) in a.iter().zip(&b) {
        assert!(
            crate::cluster::summary::PeerName::same_copy(&x.name, &y.name),
            "{} held twice",
            x.name
        );
    }
    drop((a, b));
    assert_eq!(held.names.len(), 9);
    // node-0001 leaves the set: its summary goes, the names stay with
    // node-0000's. node-0005 leaves too: its name is let go though
    // node-0000's summary names it, and a summary naming it is asked
    // about it anew.
    let without = |gone: &[&str]| {
        let left = members.iter().filter(|n| !gone.contains(&n.name.as_str()));
        NodeSet::new(left.cloned().collect()).expect("a set")
    };
    held.prune(&without(&["node-0001"]), now);
    assert_eq!((held.by_key.len(), held.names.len()), (1, 9));
    let smaller = without(&["node-0001", "node-0005"]);
    held.prune(&smaller, now);
    assert_eq!((held.by_key.len(), held.names.len()), (1, 8));
    held.apply(put("/h/s/node-0002", of("node-0002")), now, &smaller);
    let kept = held.by_key[&b"/h/s/node-0002"[..]].summary.peers().len();
    assert_eq!((kept, held.names.len(), held.unknown_peers), (8, 8, 1));
    held.apply(
        WatchEvent::Delete {
            key: b"/h/s/node-0002".to_vec(),
            revision: 2,
        },
        now,
        &members,
    );
    held.unknown_peers = 0;
    held.apply(
        WatchEvent::Delete {
            key: b"/h/s/node-0000".to_vec(),
            revision: 2,
        },
        now,
        &members,
    );
    held.prune(&members, now);
    assert!(held.by_key.is_empty() && held.names.is_empty());
    // A summary rewritten over and over with other peers between the
    // leader's rounds: the names it no longer holds are let go once
    // they pass the bound, not kept until the next round.
    let members = NodeSet::numbered(20_001);
    let renaming = |round: usize| {
        reporting(
            "node-0000",
            now,
            (1..=100).map(|i| format!("node-{:04}", round * 100 + i)),
        )
    };
    for round in 0..200 {
        held.apply(put("/h/s/node-0000", renaming(round)), now, &members);
        assert!(
            held.names.len() <= NAMES_PRUNED_PAST + 100,
            "{}",
            held.names.len()
        );
    }
    assert!(held.names.len() >= 100, "the held summary's");
    assert_eq!(held.unknown_peers, 0);
}

/// A summary's observations of names not in the node set are left
/// out when it is taken in: a writer of every summary key who makes
/// up long names makes the leader hold none of them, and a node the
/// leader comes to know later is reported again by its observer's
/// next write.
#[test]
fn names_not_in_the_node_set_are_not_held() {
    let now = 1_000_000;
    let members = NodeSet::numbered(50);
    let mut held = Held::new("/h/s/", Duration::from_secs(10), 64);
    let made_up = |observer: usize| {
        let known = (1..=3).map(|i| format!("node-{i:04}"));
        let long = (0..40).map(move |i| format!("{}-{observer}-{i:02}", "x".repeat(200)));
        reporting(&format!("node-{observer:04}"), now, known.chain(long))
    };
    for observer in 0..50 {
        held.apply(
            put(&format!("/h/s/node-{observer:04}"), made_up(observer)),
            now,
            &members,
        );
    }
    assert_eq!(held.by_key.len(), 50, "the summaries are taken");
    assert_eq!(held.refused, 0);
    assert_eq!(held.names.len(), 3, "only the nodes' names are held");
    assert_eq!(held.unknown_peers, 50 * 40);
    assert_eq!(held.unknown_most, ("node-0049".to_owned(), 40));
    for k in held.by_key.values() {
        let names: Vec<&str> = k.summary.peers().iter().map(|p| &*p.name).collect();
        assert_eq!(names, ["node-0001", "node-0002", "node-0003"]);
    }
    held.report_refused();
    assert_eq!(held.unknown_peers, 0, "counted until reported");
    assert_eq!(held.unknown_most.1, 0);
    // node-0050 joins: the observer's next write reports it.
    let joined = NodeSet::numbered(51);
    let with_new = reporting("node-0000", now + 1, ["node-0050".to_owned()].into_iter());
    held.apply(put("/h/s/node-0000", with_new.clone()), now, &members);
    let peers = |held: &Held| held.by_key[&b"/h/s/node-0000"[..]].summary.peers().len();
    assert_eq!(peers(&held), 0, "not in this node set yet");
    held.apply(put("/h/s/node-0000", with_new), now, &joined);
    assert_eq!(peers(&held), 1);
}

/// An observation of a node the leader's node set does not hold yet (the
/// observer read the node's record first) counts as soon as the node set
/// has it, not from the observer's next write; a summary deleted, or
/// replaced by one naming only known nodes, is not read again, nor one
/// whose missing node has not joined.
#[test]
fn observations_of_a_node_that_joined_count_once_the_node_set_has_it() {
    let now = 1_000_000;
    let (before, joined) = (NodeSet::numbered(50), NodeSet::numbered(52));
    let mut held = Held::new("/h/s/", Duration::from_secs(10), 64);
    for (observer, seen) in [
        (0, &[1, 50][..]),
        (2, &[3, 51]),
        (4, &[5, 50]),
        (6, &[7, 8]),
        (8, &[9, 77]),
        (10, &[11, 50, 77]),
    ] {
        let value = observing(observer, now, seen);
        held.apply(put(&key_of(observer), value), now, &before);
    }
    assert_eq!(
        peers_of(&held, 0),
        named(&[1]),
        "node-0050 not in the set yet"
    );
    assert_eq!(
        held.rereads.len(),
        5,
        "the summaries naming a node not in the set"
    );
    // One is deleted and one rewritten with known nodes only before the
    // node set has the new nodes.
    held.apply(
        WatchEvent::Delete {
            key: key_of(2).into_bytes(),
            revision: 2,
        },
        now,
        &before,
    );
    held.apply(put(&key_of(4), observing(4, now + 1, &[5])), now, &before);
    assert_eq!(held.rereads.len(), 3);
    let version = |held: &Held, o| held.by_key[key_of(o).as_bytes()].version;
    let unjoined = version(&held, 8);
    held.reread(now + 2, &joined);
    assert_eq!(peers_of(&held, 0), named(&[1, 50]), "counted at once");
    assert!(
        !held.by_key.contains_key(key_of(2).as_bytes()),
        "not brought back"
    );
    assert_eq!(peers_of(&held, 4), named(&[5]), "its newer value stays");
    assert_eq!(peers_of(&held, 6), named(&[7, 8]));
    assert_eq!(
        version(&held, 8),
        unjoined,
        "node-0077 has not joined: not read again"
    );
    assert_eq!(peers_of(&held, 10), named(&[11, 50]));
    assert_eq!(held.rereads.len(), 2, "kept for node-0077");
    assert_eq!(held.rereads.bytes().0, held.rereads.bytes().1);
    assert_eq!(held.refused, 0);
    assert_eq!(
        held.unknown_peers, 6,
        "node-0050, 51, 50, 77, 50 and 77 as they came; none counted again by reading again"
    );
}

/// A summary read again after its observer left the node set is neither
/// refused nor warned about: it stays as it was, for the leader's round
/// to let go.
#[test]
fn a_summary_read_again_after_its_observer_left_is_not_refused() {
    let now = 1_000_000;
    let mut held = Held::new("/h/s/", Duration::from_secs(10), 64);
    held.apply(
        put(&key_of(10), observing(10, now, &[11, 50])),
        now,
        &NodeSet::numbered(50),
    );
    let mut names: Vec<String> = (0..52).map(|i| format!("node-{i:04}")).collect();
    names.retain(|n| n != "node-0010");
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    held.reread(now + 1, &NodeSet::named(&names));
    assert_eq!((held.refused, held.first_refusal.as_deref()), (0, None));
    assert_eq!(peers_of(&held, 10), named(&[11]), "held as it was");
    held.prune(&NodeSet::named(&names), now);
    assert!(held.by_key.is_empty() && held.rereads.len() == 0);
}

/// A joining node's own summary read before its record is refused, and
/// kept: it counts once the node set has its observer, without being
/// refused again. A listing refuses again the summaries it still holds,
/// and one that breaks off, or a delete, lets them go.
#[test]
fn a_summary_refused_before_its_observer_joined_counts_once_it_has() {
    use super::rereads::REFUSED_KEPT_MS;
    let now = 1_000_000;
    let (before, joined) = (NodeSet::numbered(50), NodeSet::numbered(51));
    let mut held = Held::new("/h/s/", Duration::from_secs(10), 64);
    held.apply(put(&key_of(50), observing(50, now, &[1, 2])), now, &before);
    held.apply(put(&key_of(77), observing(77, now, &[1])), now, &before);
    assert_eq!((held.refused, held.by_key.len()), (2, 0));
    assert_eq!(held.rereads.len(), 2, "both kept");
    held.reread(now + 1, &before);
    assert_eq!((held.by_key.len(), held.rereads.len()), (0, 2));
    held.reread(now + 2, &joined);
    assert_eq!(peers_of(&held, 50), named(&[1, 2]), "counted at once");
    assert_eq!(held.refused, 2, "not refused again");
    assert_eq!(held.rereads.len(), 1, "node-0077 has not joined");
    assert_eq!(held.rereads.bytes().0, held.rereads.bytes().1);
    // The leader's round keeps it; a delete lets it go.
    held.prune(&joined, now);
    assert_eq!(held.rereads.len(), 1);
    let delete = |key: String| WatchEvent::Delete {
        key: key.into_bytes(),
        revision: 4,
    };
    held.apply(delete(key_of(77)), now, &joined);
    assert_eq!(held.rereads.len(), 0);
    // One refused is kept for a while, not for good.
    held.apply(put(&key_of(90), observing(90, now, &[1])), now, &joined);
    held.prune(&joined, now + REFUSED_KEPT_MS);
    assert_eq!(held.rereads.len(), 1);
    held.prune(&joined, now + REFUSED_KEPT_MS + 1);
    assert_eq!(held.rereads.len(), 0);
    // A listing lets go of those it does not refuse again, and keeps
    // those it does.
    let snapshot = |observers: &[usize], first, last| WatchEvent::Snapshot {
        revision: 5,
        entries: observers
            .iter()
            .map(|&o| Entry {
                key: key_of(o).into_bytes(),
                value: observing(o, now, &[1]),
                mod_revision: 5,
                lease: 0,
            })
            .collect(),
        first,
        last,
    };
    held.apply(put(&key_of(77), observing(77, now, &[1])), now, &joined);
    held.apply(put(&key_of(78), observing(78, now, &[1])), now, &joined);
    held.apply(snapshot(&[0, 78], true, false), now, &joined);
    held.prune(&joined, now);
    held.apply(snapshot(&[1], false, true), now, &joined);
    assert_eq!(held.rereads.len(), 1, "node-0078's, refused again");
    held.reread(now + 3, &NodeSet::numbered(79));
    assert_eq!(peers_of(&held, 78), named(&[1]));
    assert_eq!(peers_of(&held, 77), named(&[]), "deleted by the listing");
    // A listing that breaks off lets go of those refused.
    held.apply(snapshot(&[80], true, false), now, &joined);
    let error = Arc::new(crate::membership::kvstore::KvError::StreamEnded { what: "watch" });
    held.apply(WatchEvent::Lost { error }, now, &joined);
    held.reread(now + 4, &NodeSet::numbered(81));
    assert_eq!(peers_of(&held, 80), named(&[]));
    assert_eq!(held.rereads.len(), 0);
}

/// The node set changing while a listing of the summaries is under way (a
/// newly elected leader's first, or one after a broken watch): the
/// summaries are read again once the listing is whole.
#[test]
fn a_node_set_change_during_a_listing_is_read_once_it_is_whole() {
    let now = 1_000_000;
    let (before, joined) = (NodeSet::numbered(50), NodeSet::numbered(51));
    let snapshot = |entries: Vec<(usize, Vec<usize>)>, first, last| WatchEvent::Snapshot {
        revision: 3,
        entries: entries
            .into_iter()
            .map(|(o, seen)| Entry {
                key: key_of(o).into_bytes(),
                value: observing(o, now, &seen),
                mod_revision: 1,
                lease: 0,
            })
            .collect(),
        first,
        last,
    };
    for relisting in [false, true] {
        let mut held = Held::new("/h/s/", Duration::from_secs(10), 64);
        if relisting {
            held.apply(snapshot(vec![(0, vec![1])], true, true), now, &before);
            assert_eq!(peers_of(&held, 0), named(&[1]));
        }
        // node-0004 is in the listing alone, not (yet) held.
        let first_page = vec![(0, vec![1, 50]), (4, vec![5, 50])];
        held.apply(snapshot(first_page, true, false), now, &before);
        held.reread(now, &joined);
        assert!(held.reread_due, "waits for the listing");
        // The leader's round between the pages keeps the listing's.
        held.prune(&joined, now);
        assert_eq!(held.rereads.len(), 2, "relisting: {relisting}");
        held.apply(snapshot(vec![(2, vec![3])], false, true), now, &joined);
        assert_eq!(
            peers_of(&held, 0),
            named(&[1, 50]),
            "relisting: {relisting}"
        );
        assert_eq!(
            peers_of(&held, 4),
            named(&[5, 50]),
            "relisting: {relisting}"
        );
        assert!(!held.reread_due && held.rereads.len() == 0);
    }
    // A listing that breaks off: the summaries held are read again at
    // once, the listing's pages let go.
    let mut held = Held::new("/h/s/", Duration::from_secs(10), 64);
    held.apply(snapshot(vec![(0, vec![1, 50])], true, true), now, &before);
    held.apply(snapshot(vec![(4, vec![5, 50])], true, false), now, &before);
    held.reread(now, &joined);
    let error = Arc::new(crate::membership::kvstore::KvError::StreamEnded { what: "watch" });
    held.apply(WatchEvent::Lost { error }, now, &joined);
    assert_eq!(peers_of(&held, 0), named(&[1, 50]));
    assert!(!held.by_key.contains_key(key_of(4).as_bytes()));
    assert!(!held.reread_due && held.rereads.len() == 0);
}

/// The values kept to be read again, and their names, take at most
/// `REREAD_BYTES`.
#[test]
fn the_summaries_kept_to_be_read_again_are_bounded_in_bytes() {
    use super::rereads::{REFUSED_BYTES, REREAD_BYTES};
    let now = 1_000_000;
    // 100 known peers and one not in the set, within what an observer
    // may report; twice as many bytes of such summaries as are kept.
    let value = |o: usize, set: usize| {
        let mut seen: Vec<usize> = (1..=100).map(|d| (o + d) % set).collect();
        seen.push(99_999);
        observing(o, now, &seen)
    };
    let observers = 2 * REREAD_BYTES / value(0, 9_000).len();
    let members = NodeSet::numbered(u16::try_from(observers).expect("under 10,000"));
    let mut held = Held::new("/h/s/", Duration::from_secs(10), observers);
    for o in 0..observers {
        held.apply(put(&key_of(o), value(o, observers)), now, &members);
    }
    assert_eq!(held.by_key.len(), observers, "every summary is taken");
    let ((counted, refused), recounted) = held.rereads.bytes();
    assert_eq!((counted, refused), recounted);
    assert!(counted <= REREAD_BYTES, "{counted} bytes");
    assert!(
        counted > REREAD_BYTES - 2 * value(0, 9_000).len(),
        "{counted} bytes: as many as fit"
    );
    // Summaries of observers not in the node set, twice as many bytes as
    // are kept of them: kept apart, within their own bound.
    let refusals = 2 * REFUSED_BYTES / value(0, 9_000).len();
    for o in observers..observers + refusals {
        held.apply(put(&key_of(o), value(o, observers)), now, &members);
    }
    let ((held_bytes, refused), recounted) = held.rereads.bytes();
    assert_eq!((held_bytes, refused), recounted);
    assert_eq!(held_bytes, counted, "the held ones' bound is theirs");
    assert!(refused <= REFUSED_BYTES, "{refused} bytes");
    assert!(
        refused > REFUSED_BYTES - 2 * value(0, 9_000).len(),
        "{refused} bytes: as many as fit"
    );
}

/// A summary read again when the summaries held are at their bound takes
/// the place of one whose observer left the node set, though the leader's
/// round has not let that one go yet.
#[test]
fn a_summary_read_again_takes_a_departed_observers_place() {
    let now = 1_000_000;
    let mut held = Held::new("/h/s/", Duration::from_secs(10), 3);
    let first = NodeSet::named(&["node-0000", "node-0001", "node-0002"]);
    for o in 0..3 {
        held.apply(put(&key_of(o), observing(o, now, &[1])), now, &first);
    }
    held.apply(put(&key_of(5), observing(5, now, &[1])), now, &first);
    assert_eq!((held.by_key.len(), held.refused), (3, 1));
    held.reread(
        now + 1,
        &NodeSet::named(&["node-0001", "node-0002", "node-0005"]),
    );
    assert_eq!(peers_of(&held, 5), named(&[1]));
    assert_eq!(held.by_key.len(), 3);
}

fn key_of(observer: usize) -> String {
    format!("/h/s/node-{observer:04}")
}

/// Node `observer`'s summary at `at_ms` reporting on `seen` (by number).
fn observing(observer: usize, at_ms: u64, seen: &[usize]) -> Vec<u8> {
    reporting(
        &format!("node-{observer:04}"),
        at_ms,
        named(seen).into_iter(),
    )
}

/// The peers of `observer`'s summary as held.
fn peers_of(held: &Held, observer: usize) -> Vec<String> {
    held.by_key
        .get(key_of(observer).as_bytes())
        .map_or_else(Vec::new, |k| {
            k.summary
                .peers()
                .iter()
                .map(|p| p.name.to_string())
                .collect()
        })
}

fn named(numbers: &[usize]) -> Vec<String> {
    numbers.iter().map(|i| format!("node-{i:04}")).collect()
}

/// A summary reporting on more peers than an observer can be assigned
/// is refused: summaries are held whole until the view is assembled,
/// so a writer of every node's summary key could otherwise make the
/// leader hold thousands of peers for each node.
#[test]
fn a_summary_past_what_an_observer_is_assigned_is_refused() {
    use crate::membership::Node;
    let now = 1_000_000;
    // 200 nodes, 30 of them in zone "z1": K = 32 by default above 64
    // nodes, so 2 × (32 + 30 + 1) + 64 = 190 peers at most.
    let nodes: Vec<Node> = NodeSet::numbered(200)
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let mut n = n.clone();
            n.zone = (i < 30).then(|| "z1".to_owned());
            n
        })
        .collect();
    let members = NodeSet::new(nodes).expect("a set");
    assert_eq!(peer_bound(&members, None), 190);
    assert_eq!(peer_bound(&members, Some(ProbePeers::Count(100))), 326);
    assert_eq!(peer_bound(&members, Some(ProbePeers::All)), 464);
    assert_eq!(peer_bound(&NodeSet::numbered(40), None), 144, "a full mesh");
    let of_peers = |peers: usize| {
        reporting(
            "node-0000",
            now,
            (1..=peers).map(|i| format!("node-{i:04}")),
        )
    };
    let mut held = Held::new("/h/s/", Duration::from_secs(10), 8);
    held.apply(put("/h/s/node-0000", of_peers(190)), now, &members);
    assert!(held.by_key.contains_key(&b"/h/s/node-0000"[..]));
    held.apply(put("/h/s/node-0000", of_peers(191)), now, &members);
    assert!(!held.by_key.contains_key(&b"/h/s/node-0000"[..]));
    assert_eq!(
        held.first_refusal.as_deref(),
        Some(
            "\"/h/s/node-0000\": it reports on 191 peers, more than the 190 taken: twice what an observer can be assigned in this node set (every node in a full mesh, else the largest zone and --probe-peers), and 64"
        )
    );
    // Bounded by this agent's --probe-peers: a full mesh, reported by
    // an observer whose set holds nodes this agent's does not.
    let mut held = Held::new("/h/s/", Duration::from_secs(10), 8).with_peers(Some(ProbePeers::All));
    held.apply(put("/h/s/node-0000", of_peers(464)), now, &members);
    assert!(held.by_key.contains_key(&b"/h/s/node-0000"[..]));
    held.apply(put("/h/s/node-0000", of_peers(465)), now, &members);
    assert!(!held.by_key.contains_key(&b"/h/s/node-0000"[..]));
}

#[test]
fn summaries_sit_beside_the_node_records() {
    assert_eq!(summaries_prefix("/health/nodes/"), "/health/summaries/");
    assert_eq!(summaries_prefix("/health/nodes"), "/health/summaries/");
    assert_eq!(summaries_prefix("/a/b/c/"), "/a/b/summaries/");
    assert_eq!(summaries_prefix("nodes"), "nodes-summaries/");
}

fn round(seq: u64) -> crate::probe::status::RoundInfo {
    crate::probe::status::RoundInfo {
        seq,
        started_ms: seq * 1000,
        duration_ms: 10,
        probes: 4,
    }
}

/// Whether `next` yields a prober within 100 ms, and which.
async fn within<F: Future<Output = Arc<Prober>>>(
    next: std::pin::Pin<&mut F>,
) -> Option<Arc<Prober>> {
    tokio::time::timeout(Duration::from_millis(100), next)
        .await
        .ok()
}

#[tokio::test]
async fn rounds_are_followed_once_each_and_across_reloads() {
    use crate::{membership::NodeSet, probe::ProbeConfig};

    let first = Prober::new(ProbeConfig::default());
    first.set_nodes(NodeSet::named(&["a", "b"]));
    let (probers_tx, probers) = watch::channel(Arc::clone(&first));
    let mut rounds = Rounds::new(&probers);
    assert!(within(std::pin::pin!(rounds.next())).await.is_none());

    // A round published while nothing waited counts, once; a node-set
    // change is not a round.
    first.publish(Some(round(1)), false);
    let got = within(std::pin::pin!(rounds.next()))
        .await
        .expect("round 1");
    assert!(Arc::ptr_eq(&got, &first));
    first.set_nodes(NodeSet::named(&["a", "b", "c"]));
    assert!(within(std::pin::pin!(rounds.next())).await.is_none());

    // A reload while waiting: the old prober's rounds no longer count,
    // the new one's do. Taking over, it publishes the round already
    // handed out, which is not a new one.
    let second = Prober::new(ProbeConfig::default());
    {
        let mut waiting = std::pin::pin!(rounds.next());
        assert!(within(waiting.as_mut()).await.is_none());
        second.take_over(&first);
        probers_tx.send_replace(Arc::clone(&second));
        first.publish(Some(round(2)), false);
        assert!(within(waiting.as_mut()).await.is_none());
        second.publish(Some(round(2)), false);
        let got = within(waiting.as_mut())
            .await
            .expect("the new prober's round");
        assert!(Arc::ptr_eq(&got, &second));
    }

    // A reload whose prober published a round before the view looked:
    // that round counts.
    let third = Prober::new(ProbeConfig::default());
    third.take_over(&second);
    probers_tx.send_replace(Arc::clone(&third));
    third.publish(Some(round(3)), false);
    let got = within(std::pin::pin!(rounds.next()))
        .await
        .expect("round 3");
    assert!(Arc::ptr_eq(&got, &third));
    assert!(within(std::pin::pin!(rounds.next())).await.is_none());

    // Nothing left to reload it: its rounds go on counting.
    drop(probers_tx);
    assert!(within(std::pin::pin!(rounds.next())).await.is_none());
    third.publish(Some(round(4)), false);
    let got = within(std::pin::pin!(rounds.next()))
        .await
        .expect("round 4");
    assert!(Arc::ptr_eq(&got, &third));
}
