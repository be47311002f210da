//! Where a path breaks: an agent probing a peer three routers away
//! (`health_tests::router_chain`). When the middle router drops
//! everything from the agent's endpoint (so it does not even say "time
//! exceeded"), the ICMP path to the peer fails and its trace ends at the
//! hop before that router; once the drop is gone the path succeeds and
//! the trace is cleared.

use std::net::IpAddr;

use health_agent::probe::path::ProbeResult;
use health_tests::{
    agent::{agent_binary, socket_in},
    nft::NftTable,
    router_chain::{AGENT_CIDR, Chain, R1_NEAR, ip},
};

#[test]
fn a_failing_paths_trace_ends_before_the_router_that_drops() {
    let mut chain = Chain::new();
    chain.start_agent(&[]);
    let up = chain.wait_path("the peer answers three routers away", |p| {
        p.result == ProbeResult::Success
    });
    assert!(
        up.trace.is_none(),
        "a path that answers is not traced: {up:?}"
    );
    // The middle router drops everything from the agent's endpoint as it
    // arrives: it forwards nothing and says nothing.
    let r2 = chain.ns[2].clone();
    let rule = NftTable::netdev(
        &r2,
        &format!(
            "chain blackhole {{ type filter hook ingress device \"west\" priority 0; \
             ip saddr {AGENT_CIDR} drop; }}"
        ),
    )
    .expect("nft in r2");
    let failed = chain.wait_path("the path fails and is traced", |p| {
        p.result == ProbeResult::Failure && p.trace.is_some()
    });
    let trace = failed.trace.expect("traced");
    let hops: Vec<Option<IpAddr>> = trace.hops.iter().map(|h| h.ip).collect();
    assert!(!trace.reached, "{trace:?}");
    assert_eq!(hops.len(), 2, "the agent's node, then r1: {trace:?}");
    assert!(
        matches!(hops[0], Some(IpAddr::V4(a)) if a == ip(10, 2) || a.octets()[..3] == [198, 19, 255]),
        "hop 1 is the agent's own node (its uplink's or its endpoint router's address): {trace:?}"
    );
    assert_eq!(hops[1], Some(IpAddr::V4(R1_NEAR)), "{trace:?}");
    let out = std::process::Command::new(agent_binary())
        .args(["status", "--verbose", "--socket"])
        .arg(socket_in(&chain.dir))
        .output()
        .expect("the CLI");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("2 {R1_NEAR}")) && text.contains("no answer past hop 2"),
        "{text}"
    );
    drop(rule);
    let back = chain.wait_path("the path answers again", |p| {
        p.result == ProbeResult::Success
    });
    assert!(
        back.trace.is_none(),
        "the trace goes with the failure: {back:?}"
    );
}
