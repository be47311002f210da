use std::net::Ipv4Addr;

use super::*;
use crate::{
    cluster::{
        subset::{ProbePeers, SubsetPlan},
        test_nodes,
    },
    membership::{Node, NodeSet},
    probe::status::{Connectivity, RoundInfo},
};

/// A small PRNG for the tests (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn ok(rtt_us: u32) -> PathSample {
    PathSample {
        state: ProbeResult::Success,
        rtt_us: Some(rtt_us),
        failing: false,
        lossy: false,
        plaintext: false,
        split: false,
    }
}

fn peer(name: &str, paths: [PathSample; 4]) -> PeerSummary {
    PeerSummary::new(name, paths)
}

fn failed() -> PathSample {
    PathSample::new(ProbeResult::Failure, None)
}

fn sample() -> Summary {
    Summary::new(
        "node-b".into(),
        42,
        1_790_000_000_123,
        vec![
            peer("node-c", [ok(120), ok(480), failed(), PathSample::UNKNOWN]),
            peer(
                "node-d",
                [PathSample::FAILING, ok(9), failed(), PathSample::FAILING],
            ),
            peer(
                "node-a",
                [
                    ok(0),
                    ok(u32::MAX),
                    ok(70),
                    PathSample::new(ProbeResult::Success, None),
                ],
            ),
            peer("node-b", [failed(); 4]),
            peer("nod", [PathSample::UNKNOWN; 4]),
        ],
    )
    .expect("valid")
}

#[test]
fn round_trips() {
    let s = sample();
    let names: Vec<&str> = s.peers().iter().map(|p| &*p.name).collect();
    assert_eq!(
        names,
        ["nod", "node-a", "node-b", "node-c", "node-d"],
        "sorted"
    );
    assert_eq!(
        s.peer("node-d").map(|p| p.paths().map(|p| p.failing)),
        Some([true, false, false, true]),
        "failing paths are kept"
    );
    assert_eq!(
        s.peer("node-a").map(|p| p.paths()[1].rtt_us),
        Some(Some(MAX_RTT_US)),
        "saturated"
    );
    let bytes = s.encode();
    assert_eq!(bytes[0], VERSION);
    assert_eq!(Summary::decode(&bytes), Ok(s.clone()));
    assert_eq!(
        s.peer("node-c").map(PeerSummary::state),
        Some(ProbeResult::Failure)
    );
}

#[test]
fn construction_refuses_what_cannot_be_encoded() {
    let long = "x".repeat(MAX_NAME_LEN + 1);
    assert!(matches!(
        Summary::new(long.clone(), 1, 1, vec![]),
        Err(SummaryError::NameLength {
            what: "observer",
            ..
        })
    ));
    let err = Summary::new("a".into(), 1, 1, vec![peer(&long, [failed(); 4])]).expect_err("long");
    assert!(err.to_string().contains("254 bytes long"), "{err}");
    let err = Summary::new(
        "a".into(),
        1,
        1,
        vec![peer("b", [failed(); 4]), peer("b", [failed(); 4])],
    )
    .expect_err("dup");
    assert_eq!(err, SummaryError::DuplicatePeer { name: "b".into() });
    let many = (0..=MAX_PEERS)
        .map(|i| peer(&format!("n{i}"), [failed(); 4]))
        .collect();
    assert!(matches!(
        Summary::new("a".into(), 1, 1, many),
        Err(SummaryError::TooManyPeers { .. })
    ));
    // The longest names round-trip.
    let a = "a".repeat(MAX_NAME_LEN);
    let b = "b".repeat(MAX_NAME_LEN);
    let s = Summary::new(
        a.clone(),
        1,
        1,
        vec![peer(&a, [ok(1); 4]), peer(&b, [ok(1); 4])],
    )
    .expect("valid");
    assert_eq!(Summary::decode(&s.encode()), Ok(s));
}

fn path(result: ProbeResult, rtt_ns: Option<u64>) -> PathState {
    PathState {
        result,
        rtt_ns,
        ..PathState::default()
    }
}

#[test]
fn a_dual_stack_peers_path_is_the_worse_of_its_families() {
    let conn = |ip: std::net::IpAddr, icmp, http| Connectivity {
        ip,
        family: crate::probe::family::Family::of(ip),
        icmp,
        http,
        encryption: None,
    };
    let v4: std::net::IpAddr = Ipv4Addr::new(198, 18, 0, 2).into();
    let v6: std::net::IpAddr = "2001:2::2".parse().expect("ip");
    let ok_path = |us: u64| path(ProbeResult::Success, Some(us * 1000));
    let n = NodeStatus {
        name: "peer".into(),
        host: conn(v4, ok_path(10), ok_path(20)),
        endpoint: conn(v4, path(ProbeResult::Unknown, None), ok_path(40)),
        host_secondary: Some(Box::new(conn(
            v6,
            path(ProbeResult::Failure, None),
            ok_path(21),
        ))),
        endpoint_secondary: Some(Box::new(conn(v6, ok_path(31), ok_path(41)))),
    };
    let p = PeerSummary::from_status(&n);
    assert_eq!(
        p.paths().map(|p| p.state),
        [
            ProbeResult::Failure,
            ProbeResult::Success,
            ProbeResult::Unknown,
            ProbeResult::Success
        ]
    );
    assert_eq!(p.paths()[1].rtt_us, Some(20), "the primary family's RTT");
    assert_eq!(p.state(), ProbeResult::Failure);
    // The host ICMP path failed over IPv6 alone, IPv4 reaching it: split.
    // The endpoint ICMP path, unknown over IPv4, is not.
    assert_eq!(p.split_bits(), 0b0001, "{p:?}");
}

#[test]
fn paths_failed_in_one_family_travel_in_their_own_column_and_bad_masks_are_refused() {
    let conn = |ip: std::net::IpAddr, icmp, http| Connectivity {
        ip,
        family: crate::probe::family::Family::of(ip),
        icmp,
        http,
        encryption: None,
    };
    let v4: std::net::IpAddr = Ipv4Addr::new(198, 18, 0, 3).into();
    let v6: std::net::IpAddr = "2001:2::3".parse().expect("ip");
    let ok_path = || path(ProbeResult::Success, Some(50_000));
    let failed_path = || path(ProbeResult::Failure, None);
    let failing_path = || PathState {
        consecutive_failures: 1,
        ..ok_path()
    };
    // IPv6 broken whole, IPv4 answering: every path split. Over the
    // endpoint, IPv4's last probe failed too: failed in both, not split.
    let n = NodeStatus {
        name: "peer".into(),
        host: conn(v4, ok_path(), ok_path()),
        endpoint: conn(v4, failing_path(), ok_path()),
        host_secondary: Some(Box::new(conn(v6, failed_path(), failing_path()))),
        endpoint_secondary: Some(Box::new(conn(v6, failed_path(), failed_path()))),
    };
    let p = PeerSummary::from_status(&n);
    assert_eq!(p.split_bits(), 0b1011, "{p:?}");
    assert!(p.paths()[1].failing && p.paths()[1].split);
    let s = Summary::new("a".into(), 1, 2, vec![p]).expect("summary");
    let back = Summary::decode(&s.encode()).expect("decoded");
    assert_eq!(back.peers()[0].split_bits(), 0b1011);
    assert_eq!(back, s);
    // A path in Success, not failing, or unknown is never split.
    assert!(!ok_path_sample().with_split(true).split);
    assert!(!PathSample::UNKNOWN.with_split(true).split);
    // Forged columns: refused, named. Paths: success, failure, failing,
    // unknown.
    let base = message(&[(0, 0, "node-a", 0b00_11_10_01)], vec![1]);
    let with = |peer: Vec<u32>, paths: Vec<u32>| wire::proto::Summary {
        split_peer: peer,
        split_paths: paths,
        ..base.clone()
    };
    assert!(Summary::decode(&forged(&with(vec![0], vec![0b0110]))).is_ok());
    let cases = [
        (vec![1], vec![0b0010]),
        (vec![0], vec![0]),
        (vec![0], vec![0b0001]),
        (vec![0], vec![0b1000]),
        (vec![0, 0], vec![0b0010, 0b0100]),
    ];
    masks_refused(with, &cases, |e| matches!(e, SummaryError::Split { .. }));
}

/// Each of `cases` (a sparse column's peers and masks, put in a message
/// by `with`) refused as `is_its_error` says, and masks without their
/// peers refused as columns of different lengths.
fn masks_refused(
    with: impl Fn(Vec<u32>, Vec<u32>) -> wire::proto::Summary,
    cases: &[(Vec<u32>, Vec<u32>)],
    is_its_error: impl Fn(&SummaryError) -> bool,
) {
    for (peer, paths) in cases {
        let e = refused(&with(peer.clone(), paths.clone()));
        assert!(is_its_error(&e), "{peer:?} {paths:?}: {e:?}");
    }
    assert!(matches!(
        refused(&with(vec![0], Vec::new())),
        SummaryError::Columns { .. }
    ));
}

fn ok_path_sample() -> PathSample {
    PathSample::new(ProbeResult::Success, Some(50))
}

#[test]
fn a_path_in_success_whose_last_probe_failed_is_failing() {
    let state = |result, consecutive_failures| PathState {
        result,
        consecutive_failures,
        rtt_ns: Some(80_000),
        ..PathState::default()
    };
    assert_eq!(
        PathSample::from_state(&state(ProbeResult::Success, 1)),
        PathSample::FAILING
    );
    assert_eq!(
        PathSample::from_state(&state(ProbeResult::Success, 0)),
        PathSample::new(ProbeResult::Success, Some(80))
    );
    // Past the threshold it is a failure, not failing; unknown stays so.
    for result in [ProbeResult::Failure, ProbeResult::Unknown] {
        let p = PathSample::from_state(&state(result, 2));
        assert_eq!((p.state, p.failing), (result, false));
    }
}

#[test]
fn from_status_takes_the_states_and_the_round() {
    let conn = |icmp, http| Connectivity {
        ip: Ipv4Addr::new(198, 18, 0, 1).into(),
        family: crate::probe::family::Family::Ipv4,
        icmp,
        http,
        encryption: None,
    };
    let status = ClusterStatus {
        local_node: Some("me".into()),
        probe_interval_ms: 3000,
        probe_timeout_ms: 1000,
        round: Some(RoundInfo {
            seq: 7,
            started_ms: 1000,
            duration_ms: 250,
            probes: 8,
        }),
        encryption: None,
        nodes: vec![
            NodeStatus {
                name: "me".into(),
                host: conn(
                    path(ProbeResult::Success, Some(81_999)),
                    path(ProbeResult::Success, Some(400_000)),
                ),
                endpoint: conn(
                    path(ProbeResult::Failure, Some(5_000)),
                    path(ProbeResult::Unknown, None),
                ),
                host_secondary: None,
                endpoint_secondary: None,
            },
            NodeStatus {
                name: "peer".into(),
                host: conn(
                    path(ProbeResult::Success, None),
                    path(ProbeResult::Success, Some(u64::MAX)),
                ),
                endpoint: conn(
                    path(ProbeResult::Success, Some(999)),
                    path(ProbeResult::Success, Some(1000)),
                ),
                host_secondary: None,
                endpoint_secondary: None,
            },
        ],
    };
    let s = Summary::from_status(&status).expect("summary");
    assert_eq!((s.observer(), s.seq(), s.at_ms()), ("me", 7, 1250));
    let me = s.peer("me").expect("self is a peer");
    assert_eq!(me.paths()[0], ok(81));
    assert_eq!(me.paths()[1], ok(400));
    assert_eq!(me.paths()[2], failed(), "no RTT kept for a failed path");
    assert_eq!(me.paths()[3], PathSample::UNKNOWN);
    let p = s.peer("peer").expect("peer");
    assert_eq!(
        p.paths().map(|p| p.rtt_us),
        [None, Some(MAX_RTT_US), Some(0), Some(1)]
    );
    assert_eq!(Summary::decode(&s.encode()), Ok(s));

    let mut no_round = status.clone();
    no_round.round = None;
    assert_eq!(Summary::from_status(&no_round), Err(SummaryError::NoRound));
    let mut nameless = status;
    nameless.local_node = None;
    assert_eq!(
        Summary::from_status(&nameless),
        Err(SummaryError::NoLocalNode)
    );
}

#[test]
fn a_large_full_mesh_keeps_its_failures() {
    let conn = |r| Connectivity {
        ip: Ipv4Addr::new(198, 18, 0, 1).into(),
        family: crate::probe::family::Family::Ipv4,
        icmp: path(r, Some(100_000)),
        http: path(r, Some(100_000)),
        encryption: None,
    };
    let nodes = (0..MAX_PEERS + 10)
        .map(|i| NodeStatus {
            name: format!("n{i:05}"),
            host: conn(if i % 1000 == 999 || i == 4100 {
                ProbeResult::Failure
            } else {
                ProbeResult::Success
            }),
            endpoint: conn(ProbeResult::Success),
            host_secondary: None,
            endpoint_secondary: None,
        })
        .collect();
    let status = ClusterStatus {
        local_node: Some("n00000".into()),
        probe_interval_ms: 3000,
        probe_timeout_ms: 1000,
        round: Some(RoundInfo {
            seq: 1,
            started_ms: 0,
            duration_ms: 0,
            probes: 0,
        }),
        encryption: None,
        nodes,
    };
    let s = Summary::from_status(&status).expect("summary");
    assert_eq!(s.peers().len(), MAX_PEERS);
    assert!(
        s.peer("n04100").is_some(),
        "the failing peer past the bound is kept"
    );
    assert!(
        s.peer("n04105").is_none(),
        "a reachable one past the bound is not"
    );
}

/// Names of a 50,000-node cluster in zones of 20 and the peers one node
/// probes with K = 32: self, its zone, 32 others.
fn realistic(name: impl Fn(usize) -> String) -> (NodeSet, Vec<usize>) {
    let nodes: Vec<Node> = (0..50_000)
        .map(|i| test_nodes::node(i, name(i), Some(format!("zone-{}", i / 20))))
        .collect();
    let nodes = NodeSet::new(nodes).expect("unique");
    let plan = SubsetPlan::new(&nodes);
    let picks = plan.assigned_index(12_345, ProbePeers::Count(32));
    assert_eq!(picks.len(), 52, "self, 19 zone peers, 32 others");
    (nodes, picks)
}

#[test]
fn a_round_of_k_32_and_a_zone_of_20_fits_in_1_5_kib() {
    let aws = |i: usize| {
        format!(
            "ip-10-{}-{}-{}.eu-west-1.compute.internal",
            16 + i / 65_536,
            (i / 256) % 256,
            i % 256
        )
    };
    let gke = |i: usize| {
        let h = super::super::subset::name_hash(&i.to_string());
        format!("gke-prod-default-pool-{:08x}-{:04x}", h >> 32, h & 0xffff)
    };
    let mut rng = Rng(7);
    for (style, name) in [("aws", &aws as &dyn Fn(usize) -> String), ("gke", &gke)] {
        let (nodes, picks) = realistic(name);
        // ICMP 50-500 µs, HTTP 200-5,000 µs.
        let peers = picks
            .iter()
            .map(|&i| {
                let paths = std::array::from_fn(|p| {
                    if p % 2 == 0 {
                        ok(50 + rng.below(450) as u32)
                    } else {
                        ok(200 + rng.below(4800) as u32)
                    }
                });
                peer(&nodes[i].name, paths)
            })
            .collect();
        let me = nodes[picks[0]].name.clone();
        let s = Summary::new(me, 1_000_000, 1_790_000_000_000, peers).expect("valid");
        let bytes = s.encode();
        assert!(
            bytes.len() <= 1536,
            "{style}: {} bytes for 52 peers",
            bytes.len()
        );
        let v2 = s.encode_version_2();
        // The protobuf form costs the columns' tags and lengths, and
        // the envelope's length: a few bytes (aws 893 against 875,
        // gke 1,322 against 1,304).
        assert!(
            bytes.len() <= v2.len() + 32,
            "{style}: {} bytes, {} in version 2",
            bytes.len(),
            v2.len()
        );
        assert_eq!(Summary::decode(&v2).as_ref(), Ok(&s));
        assert_eq!(Summary::decode(&bytes), Ok(s));
    }
    // The bound per peer is what the worst case takes.
    let names: Vec<String> = (0..3)
        .map(|i| format!("{i}{}", "x".repeat(MAX_NAME_LEN - 1)))
        .collect();
    let worst: Vec<PeerSummary> = names.iter().map(|n| peer(n, [ok(MAX_RTT_US); 4])).collect();
    let bytes = Summary::new("a".into(), 0, 0, worst)
        .expect("valid")
        .encode();
    assert!(bytes.len() <= 16 + 3 * MAX_PEER_BYTES, "{}", bytes.len());
}

#[test]
fn garbage_is_refused_never_panics() {
    assert_eq!(Summary::decode(&[]), Err(SummaryError::Empty));
    assert_eq!(
        Summary::decode(&[9]),
        Err(SummaryError::Version { found: 9 })
    );
    for good in [sample().encode(), sample().encode_version_2()] {
        // Every truncation is an error.
        for n in 0..good.len() {
            assert!(
                Summary::decode(&good[..n]).is_err(),
                "version {}: truncated to {n}",
                good[0]
            );
        }
        let mut longer = good.clone();
        longer.push(0);
        assert_eq!(
            Summary::decode(&longer),
            Err(SummaryError::Trailing { extra: 1 })
        );
    }
    // Version 2: a peer count beyond the bound, with no bytes behind it.
    let mut huge = vec![VERSION_2, 1, b'a', 0, 0];
    v2::put_varint(&mut huge, u64::MAX);
    assert!(matches!(
        Summary::decode(&huge),
        Err(SummaryError::TooManyPeers { .. })
    ));
    // An overlong varint.
    let mut overlong = vec![VERSION_2, 1, b'a'];
    overlong.extend([0xff; 11]);
    assert!(matches!(
        Summary::decode(&overlong),
        Err(SummaryError::Varint { .. })
    ));
    // Peers out of order, a state code of 3, a name built past the previous one.
    let unsorted = [
        VERSION_2, 1, b'a', 0, 0, 2, 0, 0, 1, b'b', 0, 0, 0, 1, b'a', 0,
    ];
    assert!(
        matches!(Summary::decode(&unsorted), Err(SummaryError::Order { .. })),
        "{:?}",
        Summary::decode(&unsorted)
    );
    // State code 3 (failing) is not in version 1; in version 2 it is a
    // path in Success whose last probe failed, with no RTT behind it.
    let state3 = [VERSION_1, 1, b'a', 0, 0, 1, 0, 0, 1, b'b', 3];
    assert_eq!(
        Summary::decode(&state3),
        Err(SummaryError::State { at: At::Byte(10) })
    );
    let mut failing = state3;
    failing[0] = VERSION_2;
    let read = Summary::decode(&failing).expect("version 2 reads code 3");
    assert_eq!(
        read.peer("b").map(PeerSummary::paths),
        Some([
            PathSample::FAILING,
            PathSample::UNKNOWN,
            PathSample::UNKNOWN,
            PathSample::UNKNOWN
        ])
    );
    // A version-1 summary (no code 3) still reads.
    let v1 = [VERSION_1, 1, b'a', 0, 0, 1, 0, 0, 1, b'b', 2];
    assert_eq!(
        Summary::decode(&v1).map(|s| s.peer("b").map(|p| p.paths()[0].state)),
        Ok(Some(ProbeResult::Failure))
    );
    let coding = [VERSION_2, 1, b'a', 0, 0, 1, 1, 0, 1, b'b', 0];
    assert!(matches!(
        Summary::decode(&coding),
        Err(SummaryError::NameCoding { .. })
    ));
    let utf8 = [VERSION_2, 1, 0xff, 0, 0, 0];
    assert!(matches!(
        Summary::decode(&utf8),
        Err(SummaryError::NameUtf8 { .. })
    ));

    // Random bytes, and random flips of a good summary, in both
    // versions: an answer, never a panic; what decodes re-encodes to a
    // summary that decodes the same.
    let mut rng = Rng(1);
    for good in [sample().encode(), sample().encode_version_2()] {
        for i in 0..20_000 {
            let bytes: Vec<u8> = if i % 2 == 0 {
                let len = rng.below(64) as usize;
                let mut b: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                if let Some(v) = b.first_mut() {
                    *v = good[0];
                }
                b
            } else {
                let mut b = good.clone();
                for _ in 0..=rng.below(3) {
                    let at = rng.below(b.len() as u64) as usize;
                    b[at] ^= 1 << rng.below(8);
                }
                b
            };
            if let Ok(s) = Summary::decode(&bytes) {
                assert!(s.peers().windows(2).all(|w| w[0].name < w[1].name));
                assert_eq!(Summary::decode(&s.encode()), Ok(s));
            }
        }
    }
}

/// A version-3 value around a message written by hand.
fn forged(m: &wire::proto::Summary) -> Vec<u8> {
    let mut out = vec![VERSION];
    prost::Message::encode_length_delimited(m, &mut out).expect("a Vec");
    out
}

/// A message of peers given as (prefix, suffix, middle, states).
fn message(peers: &[(u32, u32, &str, u32)], rtt: Vec<u32>) -> wire::proto::Summary {
    wire::proto::Summary {
        plaintext_paths: Vec::new(),
        plaintext_peer: Vec::new(),
        split_paths: Vec::new(),
        split_peer: Vec::new(),
        observer: "a".into(),
        seq: 1,
        at_ms: 2,
        prefix: peers.iter().map(|p| p.0).collect(),
        suffix: peers.iter().map(|p| p.1).collect(),
        middle_len: peers.iter().map(|p| p.2.len() as u32).collect(),
        middles: peers.iter().flat_map(|p| p.2.bytes()).collect(),
        states: peers.iter().map(|p| p.3).collect(),
        rtt,
        lossy_peer: Vec::new(),
        lossy_paths: Vec::new(),
        cadence_ms: 0,
    }
}

/// The cadence travels with the summary; one written without it (an
/// older agent, version 2) reads as not said.
#[test]
fn the_cadence_travels_and_is_not_said_by_older_forms() {
    let s = sample().with_cadence(std::time::Duration::from_secs(60));
    let back = Summary::decode(&s.encode()).expect("decodes");
    assert_eq!(back.cadence_ms(), 60_000);
    assert_eq!(back, s);
    let v2 = Summary::decode(&s.encode_version_2()).expect("decodes");
    assert_eq!(v2.cadence_ms(), 0);
}

/// A reader at a 3 s cadence counts a summary older than its window
/// stale, unless the summary says its observer summarises less often
/// and it is within that cadence's window; a claimed cadence is
/// believed up to [`MAX_CADENCE_MS`].
#[test]
fn a_summary_is_current_by_its_own_cadence_when_slower_than_the_readers() {
    let at = sample().at_ms();
    let mine = u64::from(STALE_ROUNDS) * 3_000;
    let now = at + mine + 1;
    let oldest = now - mine;
    let unsaid = sample();
    assert!(
        !unsaid.current(oldest, now),
        "stale at the reader's cadence"
    );
    assert!(unsaid.current(at, now), "within the reader's window");
    let slow = sample().with_cadence(std::time::Duration::from_secs(60));
    assert!(slow.current(oldest, now));
    assert!(slow.current(oldest, at + u64::from(STALE_ROUNDS) * 60_000));
    assert!(!slow.current(oldest, at + u64::from(STALE_ROUNDS) * 60_000 + 1));
    let claims = sample().with_cadence(std::time::Duration::from_hours(24));
    let past_max = at + u64::from(STALE_ROUNDS) * MAX_CADENCE_MS + 1;
    assert!(
        !claims.current(oldest, past_max),
        "believed up to the maximum"
    );
    assert!(!slow.current(oldest, 0), "no clock, no extension");
}

#[test]
fn lossy_paths_travel_in_a_sparse_column_and_cost_nothing_without_them() {
    let plain = sample();
    let mut lossy = plain.clone();
    let d = lossy
        .peers
        .iter_mut()
        .find(|p| &*p.name == "node-d")
        .expect("node-d");
    // A path in Success, lossy; one failing its last probe, lossy too.
    let mut paths = d.paths();
    paths[1] = paths[1].with_lossy(true);
    paths[3] = paths[3].with_lossy(true);
    d.set_paths(paths);
    assert_eq!(d.lossy_bits(), 0b1010, "{d:?}");
    let bytes = lossy.encode();
    assert_eq!(Summary::decode(&bytes), Ok(lossy.clone()));
    assert!(bytes.len() > plain.encode().len(), "the column is written");
    assert!(
        !PathSample::new(ProbeResult::Failure, None)
            .with_lossy(true)
            .lossy,
        "only a path in Success is lossy"
    );
    assert!(
        PathSample::from_state(&PathState {
            result: ProbeResult::Success,
            degraded: true,
            ..PathState::UNKNOWN
        })
        .lossy
    );
}

#[test]
fn version_3_refuses_lossy_paths_out_of_order_empty_or_not_in_success() {
    // node-a: 4 paths in Success; node-b: success, unknown, failure,
    // failing.
    let base = message(
        &[(0, 0, "node-a", 0b01_01_01_01), (5, 0, "b", 0b11_10_00_01)],
        vec![1, 2, 3, 4, 5],
    );
    let with = |peer: Vec<u32>, paths: Vec<u32>| wire::proto::Summary {
        lossy_peer: peer,
        lossy_paths: paths,
        ..base.clone()
    };
    let ok = Summary::decode(&forged(&with(vec![0, 1], vec![0b1111, 0b1001]))).expect("valid");
    assert_eq!(
        ok.peers()
            .iter()
            .map(PeerSummary::lossy_bits)
            .collect::<Vec<_>>(),
        [0b1111, 0b1001]
    );
    let cases = [
        (vec![1, 0], vec![1, 1]),  // out of order
        (vec![0, 0], vec![1, 2]),  // twice
        (vec![2], vec![1]),        // no such peer
        (vec![0], vec![0]),        // an empty mask
        (vec![0], vec![0b1_0000]), // a fifth path
        (vec![1], vec![0b0100]),   // a path in Failure
        (vec![1], vec![0b0010]),   // a path unknown
    ];
    masks_refused(with, &cases, |e| matches!(e, SummaryError::Lossy { .. }));
    assert!(matches!(
        refused(&with(vec![0, 1], vec![1])),
        SummaryError::Columns { .. }
    ));
}

#[test]
fn plain_text_paths_travel_in_their_own_column_and_bad_masks_are_refused() {
    use crate::encryption::{EncState, PathEncryption};
    // From the status: the endpoint address in plain text marks its
    // two paths; an encrypted host address marks none.
    let mut n = NodeStatus {
        name: "node-b".into(),
        host: Connectivity::new(
            Ipv4Addr::new(198, 18, 1, 12),
            path(ProbeResult::Success, Some(1000)),
            path(ProbeResult::Success, Some(1000)),
        ),
        endpoint: Connectivity::new(
            Ipv4Addr::new(198, 18, 65, 2),
            path(ProbeResult::Success, Some(1000)),
            path(ProbeResult::Success, Some(1000)),
        ),
        host_secondary: None,
        endpoint_secondary: None,
    };
    let enc = |state| {
        Some(Box::new(PathEncryption {
            state,
            peer: None,
            reason: None,
        }))
    };
    n.host.encryption = enc(EncState::Encrypted);
    n.endpoint.encryption = enc(EncState::Plaintext);
    let p = PeerSummary::from_status(&n);
    assert_eq!(p.plaintext_bits(), 0b1100, "{p:?}");
    let s = Summary::new("a".into(), 1, 2, vec![p.clone()]).expect("summary");
    let back = Summary::decode(&s.encode()).expect("decoded");
    assert_eq!(back.peers()[0].plaintext_bits(), 0b1100);
    assert_eq!(back, s);
    // A path not in Success is never plain text.
    assert!(
        !PathSample::new(ProbeResult::Failure, None)
            .with_plaintext(true)
            .plaintext
    );
    // Forged columns: refused, named.
    let base = message(&[(0, 0, "node-a", 0b01_01_01_01)], vec![1, 2, 3, 4]);
    let with = |peer: Vec<u32>, paths: Vec<u32>| wire::proto::Summary {
        plaintext_peer: peer,
        plaintext_paths: paths,
        ..base.clone()
    };
    assert!(Summary::decode(&forged(&with(vec![0], vec![0b0011]))).is_ok());
    let cases = [
        (vec![1], vec![1]),
        (vec![0], vec![0]),
        (vec![0], vec![0b1_0000]),
    ];
    masks_refused(with, &cases, |e| {
        matches!(e, SummaryError::Plaintext { .. })
    });
}

#[test]
fn version_3_reads_its_schema() {
    // Names against the previous one; RTTs in peer then path order.
    let m = message(
        &[(0, 0, "node-a", 0b01_00_01_01), (5, 0, "b", 0b11_10_00_01)],
        vec![0, 8, 121, 10],
    );
    let s = Summary::decode(&forged(&m)).expect("valid");
    assert_eq!((s.observer(), s.seq(), s.at_ms()), ("a", 1, 2));
    assert_eq!(
        s.peer("node-a").map(PeerSummary::paths),
        Some([
            PathSample::new(ProbeResult::Success, None),
            ok(7),
            PathSample::UNKNOWN,
            ok(120)
        ])
    );
    let b = s.peer("node-b").expect("node-b");
    assert_eq!(
        b.paths(),
        [
            ok(9),
            PathSample::UNKNOWN,
            PathSample::new(ProbeResult::Failure, None),
            PathSample::FAILING
        ]
    );
    assert_eq!(Summary::decode(&s.encode()), Ok(s));
}

#[test]
fn version_3_refuses_what_breaks_its_bounds_or_columns() {
    let many = wire::proto::Summary {
        states: vec![0; MAX_PEERS + 1],
        ..message(&[], vec![])
    };
    assert_eq!(
        refused(&many),
        SummaryError::TooManyPeers {
            count: MAX_PEERS as u64 + 1
        }
    );
    let mut short = message(&[(0, 0, "a", 0), (0, 0, "b", 0)], vec![]);
    short.prefix.pop();
    assert_eq!(
        refused(&short),
        SummaryError::Columns {
            what: "name prefixes",
            len: 1,
            expected: 2
        }
    );
    let mut bytes_short = message(&[(0, 0, "ab", 0)], vec![]);
    bytes_short.middles.pop();
    assert!(matches!(
        refused(&bytes_short),
        SummaryError::Columns {
            what: "middle bytes",
            ..
        }
    ));
    for rtt in [vec![], vec![1, 2]] {
        assert_eq!(
            refused(&message(&[(0, 0, "a", 1)], rtt.clone())),
            SummaryError::Columns {
                what: "RTTs",
                len: rtt.len(),
                expected: 1
            }
        );
    }
    // A length past the bound, with no bytes behind it; not protobuf.
    let mut huge = vec![VERSION];
    v2::put_varint(&mut huge, wire::MAX_MESSAGE_BYTES as u64 + 1);
    assert!(matches!(
        Summary::decode(&huge),
        Err(SummaryError::TooLong { .. })
    ));
    assert!(matches!(
        Summary::decode(&[VERSION, 2, 0xff, 0xff]),
        Err(SummaryError::Protobuf(_))
    ));
}

fn refused(m: &wire::proto::Summary) -> SummaryError {
    Summary::decode(&forged(m)).expect_err("refused")
}

#[test]
fn version_3_refuses_bad_names_and_states() {
    assert!(matches!(
        refused(&message(&[(0, 0, "b", 0), (0, 0, "a", 0)], vec![])),
        SummaryError::Order {
            at: At::Peer(1),
            ..
        }
    ));
    assert!(
        matches!(
            refused(&message(&[(0, 0, "a", 0), (1, 0, "", 0)], vec![])),
            SummaryError::Order {
                at: At::Peer(1),
                ..
            }
        ),
        "a duplicate"
    );
    assert_eq!(
        refused(&message(&[(1, 0, "b", 0)], vec![])),
        SummaryError::NameCoding {
            at: At::Peer(0),
            prefix: 1,
            suffix: 0,
            previous: 0
        }
    );
    let long = "x".repeat(MAX_NAME_LEN + 1);
    assert_eq!(
        refused(&message(&[(0, 0, &long, 0)], vec![])),
        SummaryError::BadNameLength {
            at: At::Peer(0),
            what: "peer",
            len: MAX_NAME_LEN + 1
        }
    );
    for observer in [String::new(), long.clone()] {
        let m = wire::proto::Summary {
            observer,
            ..message(&[], vec![])
        };
        assert!(matches!(
            refused(&m),
            SummaryError::BadNameLength {
                at: At::Observer,
                ..
            }
        ));
    }
    let mut utf8 = message(&[(0, 0, "a", 0)], vec![]);
    utf8.middles = vec![0xff];
    assert!(matches!(
        refused(&utf8),
        SummaryError::NameUtf8 {
            at: At::Peer(0),
            ..
        }
    ));
    assert_eq!(
        refused(&message(&[(0, 0, "a", 0x100)], vec![])),
        SummaryError::States {
            at: At::Peer(0),
            value: 0x100
        }
    );
}

#[test]
fn the_most_peers_fit_the_bounds_in_both_versions() {
    // Names of the longest, sharing nothing; every RTT of 5 bytes.
    let mut rng = Rng(3);
    let peers = (0..MAX_PEERS)
        .map(|_| {
            let name: String = (0..MAX_NAME_LEN)
                .map(|_| char::from(b'a' + rng.below(26) as u8))
                .collect();
            peer(&name, [ok(MAX_RTT_US); 4])
        })
        .collect();
    let s = Summary::new("x".repeat(MAX_NAME_LEN), u64::MAX, u64::MAX, peers).expect("valid");
    let (v3, v2) = (s.encode(), s.encode_version_2());
    assert!(v3.len() <= 1 + 5 + wire::MAX_MESSAGE_BYTES, "{}", v3.len());
    assert!(v2.len() <= 512 + MAX_PEERS * MAX_PEER_BYTES, "{}", v2.len());
    assert_eq!(Summary::decode(&v3).as_ref(), Ok(&s));
    assert_eq!(Summary::decode(&v2), Ok(s));
}

/// A peer is held in 32 bytes, its four paths packed, where it took 88
/// (the elected assembler holds every observer's summary), and read
/// back exactly: every state, mark and RTT.
#[test]
fn a_peers_paths_are_held_packed_and_read_back_exactly() {
    assert_eq!(
        size_of::<PeerSummary>(),
        32,
        "a thin shared name and 20 bytes of paths"
    );
    for state in [
        ProbeResult::Unknown,
        ProbeResult::Success,
        ProbeResult::Failure,
    ] {
        for marks in 0..16u8 {
            for rtt_us in [None, Some(0), Some(1), Some(70_000), Some(MAX_RTT_US)] {
                let p = PathSample {
                    state,
                    rtt_us,
                    failing: marks & 1 != 0,
                    lossy: marks & 2 != 0,
                    plaintext: marks & 4 != 0,
                    split: marks & 8 != 0,
                };
                let paths = [p, PathSample::UNKNOWN, p, ok(5)];
                let mut peer = PeerSummary::new("n", [PathSample::UNKNOWN; 4]);
                peer.set_paths(paths);
                assert_eq!(peer.paths(), paths);
                assert_eq!(PeerSummary::new("n", paths).paths(), paths);
            }
        }
    }
    // Saturated as the wire form saturates it.
    let peer = PeerSummary::new("n", [ok(u32::MAX); 4]);
    assert_eq!(peer.paths()[0].rtt_us, Some(MAX_RTT_US));
}

/// Summaries interned together share their peers' names; a name is let
/// go once no summary names it; names not known are neither kept nor
/// held.
#[test]
fn interned_summaries_share_their_peers_names() {
    let mut names = Names::default();
    let decoded = || Summary::decode(&sample().encode()).expect("decodes");
    let everyone = |_: &str| true;
    let (a, none) = decoded().interned(&mut names, everyone);
    let (b, _) = decoded().interned(&mut names, everyone);
    assert_eq!(none, [], "every name known");
    assert_eq!(a, sample());
    assert_eq!(b, sample());
    for (x, y) in a.peers().iter().zip(b.peers()) {
        assert!(PeerName::same_copy(&x.name, &y.name), "{}", x.name);
    }
    assert_eq!(names.len(), 5);
    assert_eq!(names.prune(everyone), 0, "named by both");
    drop(a);
    assert_eq!(names.prune(everyone), 0, "named by one");
    drop(b);
    assert_eq!(names.prune(everyone), 5);
    assert!(names.is_empty());
    // Only the names known are kept, and only those are held.
    let (known, left_out) = decoded().interned(&mut names, |n| n.starts_with("node-"));
    assert_eq!(left_out, [PeerName::from("nod")], "the names left out");
    let kept: Vec<&str> = known.peers().iter().map(|p| &*p.name).collect();
    assert_eq!(kept, ["node-a", "node-b", "node-c", "node-d"]);
    assert_eq!(known.peer("node-c"), sample().peer("node-c"));
    assert_eq!(
        (known.observer(), known.seq(), known.at_ms()),
        ("node-b", 42, 1_790_000_000_123)
    );
    assert_eq!(names.len(), 4);
    // A name held already is shared without asking.
    let (again, left_out) = decoded().interned(&mut names, |_| false);
    assert_eq!((again.peers().len(), left_out.len()), (4, 1));
    assert!(PeerName::same_copy(
        &known.peers()[0].name,
        &again.peers()[0].name
    ));
    // A name no longer known is let go though summaries still hold it,
    // and asked about anew.
    assert_eq!(names.prune(|n| n != "node-a"), 1);
    let (anew, left_out) = decoded().interned(&mut names, |_| false);
    assert_eq!((anew.peers().len(), left_out.len()), (3, 2));
    assert!(anew.peer("node-a").is_none());
}
