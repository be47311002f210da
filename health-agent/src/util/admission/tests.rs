use std::net::IpAddr;

use super::*;
use crate::util::source::Source;

fn ip(s: &str) -> Source {
    Source::of(s.parse::<IpAddr>().expect("an address"))
}

fn counts(a: &Admission<Source>) -> (usize, usize) {
    let s = a.lock();
    (s.open.len(), s.per_key.len())
}

#[test]
fn a_full_listener_closes_its_oldest_idle_connection() {
    let admission = Admission::new(Limits {
        total: 3,
        per_key: 2,
    });
    let (a, b, c) = (ip("198.18.0.1"), ip("198.18.0.2"), ip("198.18.0.3"));
    let first = admission.take(a).expect("room");
    let second = admission.take(b).expect("room");
    let third = admission.take(b).expect("room");
    // Full: the first connection, the oldest idle, makes room.
    let fourth = admission.take(c).expect("the oldest evicted");
    assert!(first.evicted().is_cancelled());
    assert!(!second.evicted().is_cancelled() && !third.evicted().is_cancelled());
    assert_eq!(counts(&admission), (3, 2), "a given back at once");
    drop(first);
    assert_eq!(
        counts(&admission),
        (3, 2),
        "an evicted place is given back once"
    );
    // Busy connections are not closed for an idle one's sake, and no key
    // holds two more than c.
    for s in [&second, &third, &fourth] {
        s.busy();
    }
    assert_eq!(admission.take(c).err(), Some(Refused::Full));
    assert_eq!(
        admission.take(b).err(),
        Some(Refused::KeyFull),
        "a key whose connections are all busy holds its share"
    );
    // Answered and kept alive: idle again, and closed for a new one.
    second.idle();
    let fifth = admission.take(c).expect("the idle one evicted");
    assert!(second.evicted().is_cancelled() && !third.evicted().is_cancelled());
    drop((second, third, fourth, fifth));
    assert_eq!(counts(&admission), (0, 0));
}

/// A host flooding from an IPv6 /64 holds that key's whole share with
/// idle connections; a peer in the same /64 is still admitted, in the
/// place of the flood's oldest, and the flood turns over its own
/// connections, not the peer's.
#[test]
fn a_key_at_its_share_turns_over_its_own_idle_connections() {
    let admission = Admission::new(Limits {
        total: 8,
        per_key: 2,
    });
    let (flood, peer) = (ip("2001:2::1:1"), ip("2001:2::1"));
    assert_eq!(flood, peer, "one /64, one key");
    let idle = [
        admission.take(flood).expect("room"),
        admission.take(flood).expect("room"),
    ];
    let probe = admission.take(peer).expect("admitted at the share");
    assert!(idle[0].evicted().is_cancelled() && !idle[1].evicted().is_cancelled());
    probe.busy();
    let again = admission.take(flood).expect("the flood's own turned over");
    assert!(idle[1].evicted().is_cancelled() && !probe.evicted().is_cancelled());
    assert_eq!(admission.lock().per_key.get(&flood), Some(&2));
    drop((idle, again, probe));
    assert_eq!(counts(&admission), (0, 0));
}

/// Four clients each fill their share with answers they read slowly (busy
/// to the end): a fifth, holding none, takes the place of the oldest of
/// the one holding the most; the four cannot take it back, and a client
/// holding one is never closed for a client holding as many.
#[test]
fn a_listener_full_of_busy_connections_closes_one_of_the_largest_holder() {
    let admission = Admission::new(Limits {
        total: 8,
        per_key: 2,
    });
    let slow: Vec<Source> = (1..=4).map(|i| ip(&format!("198.18.0.{i}"))).collect();
    let mut held = Vec::new();
    for key in slow.iter().flat_map(|k| [*k, *k]) {
        let s = admission.take(key).expect("room");
        s.busy();
        held.push(s);
    }
    let prometheus = ip("198.18.1.1");
    let scrape = admission.take(prometheus).expect("room made");
    assert!(held[0].evicted().is_cancelled(), "the oldest of a largest");
    assert_eq!(
        held.iter().filter(|s| s.evicted().is_cancelled()).count(),
        1
    );
    scrape.busy();
    // The slow client that lost one holds 1, the others 2 and Prometheus
    // 1: none of them is two past the newcomer's.
    assert_eq!(admission.take(slow[0]).err(), Some(Refused::Full));
    for key in &slow[1..] {
        assert_eq!(
            admission.take(*key).err(),
            Some(Refused::KeyFull),
            "{key:?}"
        );
    }
    assert!(!scrape.evicted().is_cancelled());
    // A second new client: the others hold 2, it holds 0.
    let another = admission.take(ip("198.18.1.2")).expect("room made");
    assert!(
        held[2].evicted().is_cancelled(),
        "the oldest of those holding 2"
    );
    another.busy();
    let third = admission.take(ip("198.18.1.3")).expect("room made");
    assert!(held[4].evicted().is_cancelled());
    third.busy();
    let fourth = admission.take(ip("198.18.1.4")).expect("room made");
    assert!(held[6].evicted().is_cancelled());
    fourth.busy();
    // Eight keys hold one each: a new one is not two short of any.
    assert_eq!(admission.take(ip("198.18.1.5")).err(), Some(Refused::Full));
    assert_eq!(
        held.iter().filter(|s| s.evicted().is_cancelled()).count(),
        4
    );
    drop((held, scrape, another, third, fourth));
    assert_eq!(counts(&admission), (0, 0));
}
