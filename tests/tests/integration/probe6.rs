//! The prober over both families, driven through the library (no agent,
//! no endpoint): the probes leave from a source namespace the test makes
//! (`ProbeConfig.source_netns`), joined by a veth to a peers namespace
//! whose addresses (on its loopback, routed through the veth) play three
//! dual-stack nodes: node addresses `198.18.1.k` and `2001:2:0:1::k`, health
//! addresses `198.18.2.k` and `2001:2:0:2::k`, answering ICMP and `ICMPv6` echo
//! from their kernel and HTTP :4240 over both families (one `[::]`
//! listener). The connectivity page is fed the same prober's answers and
//! shows the IPv6 paths too.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    sync::Arc,
    time::Duration,
};

use health_agent::{
    membership::{Node, NodeSet},
    probe::{
        ProbeConfig, Prober,
        family::{Families, Family},
        path::{ProbeResult, Thresholds},
        status::{ClusterStatus, Connectivity, NodeStatus},
    },
    sys::netlink::in_netns,
};
use health_tests::{
    browser::Browser,
    topology::{A_IF, B_IP, B_IP6, TwoNodes},
};

const PEERS: u8 = 3;

fn node_ip(k: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 1, k)
}

fn health_ip(k: u8) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 2, k)
}

fn node_ip6(k: u8) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, u16::from(k))
}

fn health_ip6(k: u8) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 2, 0, 2, 0, 0, 0, u16::from(k))
}

/// The two namespaces (removed on drop, panics included) and a runtime
/// serving :4240 in the peers namespace.
struct Lab {
    nodes: TwoNodes,
    rt: tokio::runtime::Runtime,
}

impl Lab {
    fn new() -> Self {
        let nodes = TwoNodes::new();
        nodes.add_ipv6();
        in_netns(Some(&nodes.b), |nl| async move {
            for k in 1..=PEERS {
                nl.add_address("lo", node_ip(k), 32).await?;
                nl.add_address("lo", health_ip(k), 32).await?;
                nl.add_address("lo", node_ip6(k), 128).await?;
                nl.add_address("lo", health_ip6(k), 128).await?;
            }
            Ok(())
        })
        .expect("the peers' addresses");
        in_netns(Some(&nodes.a), |nl| async move {
            nl.replace_route_via(Ipv4Addr::new(198, 18, 1, 0), 24, B_IP)
                .await?;
            nl.replace_route_via(Ipv4Addr::new(198, 18, 2, 0), 24, B_IP)
                .await?;
            nl.replace_route(node_ip6(0), 64, A_IF, Some(B_IP6)).await?;
            nl.replace_route(health_ip6(0), 64, A_IF, Some(B_IP6)).await
        })
        .expect("routes to the peers");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        // The agent's own listener, one for both families: IPv4
        // connections arrive as IPv4-mapped addresses.
        let listener = nodes
            .b
            .run(|| health_agent::probe::hello::listen(4240))
            .expect("enter the peers namespace")
            .expect("bind [::]:4240");
        rt.spawn(async move {
            health_agent::probe::hello::serve_with(
                tokio::net::TcpListener::from_std(listener).expect("listener"),
                tokio_util::sync::CancellationToken::new(),
                health_agent::probe::hello::Limits::NODE,
                None,
            )
            .await;
        });
        let lab = Self { nodes, rt };
        lab.warm_up();
        lab
    }

    /// Probes every path until all answer (at most 5 rounds): the
    /// namespaces' neighbour entries are resolved and the server accepts
    /// before a test's own prober runs. On a loaded machine the first
    /// packets towards a next hop still unresolved can miss a 500 ms
    /// timeout (CI saw one peer's first three probes do so).
    fn warm_up(&self) {
        let prober = self.prober(Families::Dual);
        for _ in 0..5 {
            if self.round(&prober).reachable() == usize::from(PEERS) {
                return;
            }
        }
        panic!("the peers do not all answer after 5 rounds");
    }

    /// A prober of `families` leaving from the source namespace, every
    /// threshold 1 (each round decides).
    fn prober(&self, families: Families) -> Arc<Prober> {
        let prober = Prober::new(ProbeConfig {
            timeout: Duration::from_millis(500),
            spread: Duration::from_millis(20),
            thresholds: Thresholds {
                success: 1,
                failure: 1,
            },
            source_netns: Some(self.nodes.a.clone()),
            families,
            ..ProbeConfig::default()
        });
        let peers = (1..=PEERS)
            .map(|k| Node {
                name: format!("peer-{k}"),
                node_ip: Some(node_ip(k)),
                health_ip: Some(health_ip(k)),
                node_ip6: Some(node_ip6(k)),
                health_ip6: Some(health_ip6(k)),
                zone: None,
            })
            .collect();
        prober.set_nodes(NodeSet::new(peers).expect("unique names"));
        prober
    }

    fn round(&self, prober: &Arc<Prober>) -> Arc<ClusterStatus> {
        self.rt.block_on(prober.round())
    }
}

fn results(c: &Connectivity) -> [ProbeResult; 2] {
    [c.icmp.result, c.http.result]
}

/// Every path of `c` succeeded, with a user-space RTT (no BPF maps here).
fn assert_ok(n: &NodeStatus, what: &str, c: &Connectivity) {
    assert_eq!(
        results(c),
        [ProbeResult::Success; 2],
        "{} {what} {}: {c:#?}",
        n.name,
        c.ip
    );
    assert!(c.icmp.rtt_ns.is_some() && c.http.rtt_ns.is_some(), "{c:?}");
}

fn secondary(n: &NodeStatus) -> (&Connectivity, &Connectivity) {
    (
        n.host_secondary
            .as_ref()
            .expect("an IPv6 host connectivity"),
        n.endpoint_secondary
            .as_ref()
            .expect("an IPv6 endpoint connectivity"),
    )
}

#[test]
fn dual_stack_peers_are_reachable_over_eight_paths_each() {
    let lab = Lab::new();
    let prober = lab.prober(Families::Dual);
    let status = lab.round(&prober);
    assert_eq!(
        status.round.as_ref().map(|r| r.probes),
        Some(usize::from(PEERS) * 8),
        "8 probes a peer"
    );
    assert_eq!(status.reachable(), usize::from(PEERS), "{status:#?}");
    for (n, k) in status.nodes.iter().zip(1..) {
        assert_eq!(n.host.ip, IpAddr::V4(node_ip(k)));
        assert_eq!(n.endpoint.ip, IpAddr::V4(health_ip(k)));
        assert_eq!(n.host.family, Family::Ipv4);
        assert_ok(n, "host", &n.host);
        assert_ok(n, "endpoint", &n.endpoint);
        let (host6, endpoint6) = secondary(n);
        assert_eq!(
            (host6.ip, host6.family),
            (IpAddr::V6(node_ip6(k)), Family::Ipv6)
        );
        assert_eq!(endpoint6.ip, IpAddr::V6(health_ip6(k)));
        assert_ok(n, "host (IPv6)", host6);
        assert_ok(n, "endpoint (IPv6)", endpoint6);
    }
    // The JSON says each address's family.
    let json: serde_json::Value = serde_json::from_slice(&prober.status_json()).expect("JSON");
    assert_eq!(json["nodes"][0]["host"]["family"], "ipv4");
    assert_eq!(json["nodes"][0]["endpoint_secondary"]["family"], "ipv6");
    assert_eq!(
        json["nodes"][0]["endpoint_secondary"]["ip"],
        "2001:2:0:2::1"
    );
    // The history has the eight paths, each with its address.
    let h = prober.node_history("peer-2").expect("peer-2");
    let paths: Vec<(String, Family, IpAddr)> = h
        .paths
        .iter()
        .map(|p| (p.path.clone(), p.family, p.ip))
        .collect();
    assert_eq!(paths.len(), 8, "{paths:?}");
    assert_eq!(
        paths[4..],
        [
            ("host-icmp".into(), Family::Ipv6, IpAddr::V6(node_ip6(2))),
            ("host-http".into(), Family::Ipv6, IpAddr::V6(node_ip6(2))),
            (
                "endpoint-icmp".into(),
                Family::Ipv6,
                IpAddr::V6(health_ip6(2))
            ),
            (
                "endpoint-http".into(),
                Family::Ipv6,
                IpAddr::V6(health_ip6(2))
            ),
        ]
    );
    assert!(
        h.paths
            .iter()
            .all(|p| p.entries.len() == 1 && p.loss_ratio == Some(0.0))
    );
}

#[test]
fn ipv6_faults_fail_exactly_the_ipv6_paths() {
    let lab = Lab::new();
    let prober = lab.prober(Families::Dual);
    assert_eq!(lab.round(&prober).reachable(), usize::from(PEERS));

    // The peers' kernel stops answering ICMPv6 echo: the four ICMPv6 paths
    // of every peer fail; HTTP over IPv6 and everything over IPv4 stay OK.
    TwoNodes::sysctl(&lab.nodes.b, "net/ipv6/icmp/echo_ignore_all", "1");
    let status = lab.round(&prober);
    assert_eq!(status.reachable(), 0);
    assert_eq!(status.summary().unreachable, usize::from(PEERS));
    for n in &status.nodes {
        assert_ok(n, "host", &n.host);
        assert_ok(n, "endpoint", &n.endpoint);
        let (host6, endpoint6) = secondary(n);
        for c in [host6, endpoint6] {
            assert_eq!(
                results(c),
                [ProbeResult::Failure, ProbeResult::Success],
                "{}: {c:#?}",
                n.name
            );
            assert!(
                c.icmp
                    .last_error
                    .as_deref()
                    .is_some_and(|e| e.contains("no echo reply")),
                "{c:?}"
            );
        }
    }
    TwoNodes::sysctl(&lab.nodes.b, "net/ipv6/icmp/echo_ignore_all", "0");
    assert_eq!(lab.round(&prober).reachable(), usize::from(PEERS));

    // peer-2's IPv6 addresses are removed: its four IPv6 paths fail (the
    // peers' namespace does not forward: no answer at all), its IPv4 ones
    // and the other peers stay OK.
    in_netns(Some(&lab.nodes.b), |nl| async move {
        nl.delete_address("lo", node_ip6(2).into()).await?;
        nl.delete_address("lo", health_ip6(2).into()).await
    })
    .expect("remove peer-2's IPv6 addresses");
    let status = lab.round(&prober);
    let peer2 = &status.nodes[1];
    assert_eq!(peer2.name, "peer-2");
    assert_ok(peer2, "host", &peer2.host);
    assert_ok(peer2, "endpoint", &peer2.endpoint);
    let (host6, endpoint6) = secondary(peer2);
    assert_eq!(results(host6), [ProbeResult::Failure; 2], "{host6:#?}");
    assert_eq!(
        results(endpoint6),
        [ProbeResult::Failure; 2],
        "{endpoint6:#?}"
    );
    assert_eq!(peer2.state(), ProbeResult::Failure);
    assert_eq!(peer2.state_of(false), ProbeResult::Failure);
    let summary = status.summary();
    assert_eq!(
        (summary.reachable, summary.unreachable, summary.unknown),
        (usize::from(PEERS) - 1, 1, 0),
        "{status:#?}"
    );
    // The history shows it path by path: IPv4 all successes, IPv6's last
    // result a failure.
    let strips = prober.history_strips();
    let s2 = &strips.nodes[1];
    assert!(s2.paths.iter().all(|s| s.ends_with('S')), "{s2:?}");
    let v6 = s2.secondary.as_ref().expect("IPv6 strips");
    assert!(v6.iter().all(|s| s.ends_with('F')), "{s2:?}");

    check_page(&lab, &prober);
}

/// Serves the connectivity page with `prober`'s answers (status, strips,
/// a node's history) on the source namespace's loopback; returns its URL.
fn serve_page(lab: &Lab, prober: &Arc<Prober>) -> String {
    use axum::{extract::RawQuery, http::header, response::IntoResponse, routing::get};
    let json = |body: Vec<u8>| ([(header::CONTENT_TYPE, "application/json")], body);
    let listener = lab
        .nodes
        .a
        .run(|| std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .expect("enter the source namespace")
        .expect("bind loopback");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("address").port();
    let (p1, p2) = (prober.clone(), prober.clone());
    let app = axum::Router::new()
        .merge(health_agent::page::routes())
        .route(
            "/api/v1/status",
            get(move || {
                let body = p1.status_json().to_vec();
                async move { json(body) }
            }),
        )
        .route(
            "/api/v1/status/history",
            get(move |RawQuery(q): RawQuery| {
                let body = match q.as_deref().and_then(|q| q.strip_prefix("node=")) {
                    Some(name) => serde_json::to_vec(&p2.node_history(name)),
                    None => serde_json::to_vec(&p2.history_strips()),
                };
                async move { json(body.unwrap_or_default()) }
            }),
        )
        .fallback(|| async { (axum::http::StatusCode::NOT_FOUND, "not here").into_response() });
    let listener = {
        let _guard = lab.rt.enter();
        tokio::net::TcpListener::from_std(listener).expect("tokio listener")
    };
    lab.rt
        .spawn(async move { axum::serve(listener, app).await });
    format!("http://127.0.0.1:{port}/")
}

/// The page of a round where peer-2's IPv6 paths fail: its row fails, each
/// of its columns names the failing family, its strip has eight lanes and
/// its detail eight cards, the IPv6 ones failing.
fn check_page(lab: &Lab, prober: &Arc<Prober>) {
    let url = serve_page(lab, prober);
    let browser = Browser::start(&lab.nodes.a);
    browser.goto(&url);
    let rows = browser.wait_for(
        "peer-2 failing on the page",
        Duration::from_secs(20),
        "const p = window.healthPage;
         if (!p || !p.ready) return null;
         const rows = p.rows();
         const n2 = rows.find(n => n.name === 'peer-2');
         return n2 && n2.state === 'failure' && p.strip('peer-2') ? rows : null;",
    );
    let peer2 = rows
        .as_array()
        .and_then(|r| r.iter().find(|n| n["name"] == "peer-2"))
        .expect("peer-2's row");
    let paths: Vec<(String, String)> = peer2["paths"]
        .as_array()
        .expect("paths")
        .iter()
        .map(|p| {
            (
                p["path"].as_str().unwrap_or_default().to_owned(),
                p["state"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> =
        ["host-icmp", "host-http", "endpoint-icmp", "endpoint-http"]
            .iter()
            .map(|k| ((*k).to_owned(), "success".to_owned()))
            .chain(
                ["host-icmp", "host-http", "endpoint-icmp", "endpoint-http"]
                    .iter()
                    .map(|k| (format!("{k}-ipv6"), "failure".to_owned())),
            )
            .collect();
    assert_eq!(paths, expected, "{peer2}");
    let others: Vec<&serde_json::Value> = rows
        .as_array()
        .expect("rows")
        .iter()
        .filter(|n| n["name"] != "peer-2")
        .collect();
    assert!(
        others.iter().all(|n| n["state"] == "success"
            && n["paths"].as_array().is_some_and(|p| p.len() == 8)),
        "{rows}"
    );
    // The row's four columns show the worst family, IPv6 here, and say so.
    let cells = browser.attributes(
        "#rows .row[data-node='peer-2'] .c-path",
        &["data-path", "data-state", "data-families"],
    );
    assert_eq!(cells.len(), 4, "{cells:?}");
    assert!(
        cells
            .iter()
            .all(|c| c[1].as_deref() == Some("failure") && c[2].as_deref() == Some("ipv4 ipv6")),
        "{cells:?}"
    );
    let text = browser.eval(
        "return document.querySelector(\"#rows .row[data-node='peer-2'] .c-path\").textContent",
    );
    assert!(text.as_str().is_some_and(|t| t.contains("IPv6")), "{text}");
    assert_eq!(
        browser.eval("return window.healthPage.strip('peer-2').length"),
        8,
        "eight history lanes"
    );
    // The detail: eight cards, the IPv6 ones failing at their addresses.
    let selected = browser.eval("window.healthPage.select('peer-2'); return true");
    assert_eq!(selected, true);
    let cards = browser.wait_for(
        "peer-2's detail with its eight paths",
        Duration::from_secs(10),
        "const cards = [...document.querySelectorAll('#detail .path-card')];
         if (cards.length !== 8 || !cards.every(c => c.querySelector('canvas'))) return null;
         return cards.map(c => [c.dataset.path, c.querySelector('.badge').dataset.state,
             c.querySelector('dd').textContent]);",
    );
    let cards = cards.as_array().expect("cards");
    assert_eq!(
        cards[4],
        serde_json::json!(["host-icmp-ipv6", "failure", "2001:2:0:1::2"])
    );
    assert_eq!(
        cards[7],
        serde_json::json!(["endpoint-http-ipv6", "failure", "2001:2:0:2::2"])
    );
    assert_eq!(
        cards[0],
        serde_json::json!(["host-icmp", "success", "198.18.1.2"])
    );
}

#[test]
fn an_ipv6_only_source_probes_only_ipv6_paths() {
    let lab = Lab::new();
    // IPv4 echo is off at the peers: any IPv4 ICMP probe would fail.
    TwoNodes::sysctl(&lab.nodes.b, "net/ipv4/icmp_echo_ignore_all", "1");
    let prober = lab.prober(Families::Ipv6);
    let status = lab.round(&prober);
    assert_eq!(
        status.round.as_ref().map(|r| r.probes),
        Some(usize::from(PEERS) * 4),
        "4 probes a peer"
    );
    assert_eq!(status.reachable(), usize::from(PEERS), "{status:#?}");
    for (n, k) in status.nodes.iter().zip(1..) {
        assert_eq!(n.host.ip, IpAddr::V6(node_ip6(k)), "the primary is IPv6");
        assert_eq!(n.endpoint.family, Family::Ipv6);
        assert!(n.host_secondary.is_none() && n.endpoint_secondary.is_none());
        assert_ok(n, "host", &n.host);
        assert_ok(n, "endpoint", &n.endpoint);
    }
    assert_eq!(
        prober.node_history("peer-1").expect("peer-1").paths.len(),
        4
    );
    // The same peers from a dual-stack source: IPv4 ICMP fails there.
    let dual = lab.prober(Families::Dual);
    let status = lab.round(&dual);
    assert_eq!(status.reachable(), 0);
    assert_eq!(status.nodes[0].host.icmp.result, ProbeResult::Failure);
}
