use std::{net::Ipv4Addr, time::Duration};

use super::*;
use crate::{
    api::client::Client,
    membership::NodeSet,
    probe::{
        ProbeConfig,
        error::{ProbeError, Proto},
        history::EntryOutcome,
        path::{Outcome, RttSource},
        status::ClusterStatus,
    },
};

/// A prober of nodes `a` and `b` with 4 rounds recorded (3 kept): `a`'s
/// host ICMP path times out in rounds 2 and 4.
fn prober() -> Arc<Prober> {
    let prober = Prober::new(ProbeConfig {
        history_length: 3,
        ..ProbeConfig::default()
    });
    let set = NodeSet::named(&["a", "b"]);
    prober.set_nodes(set.clone());
    let ok = |us| Outcome::Ok {
        rtt: Duration::from_micros(us),
        warning: None,
        source: RttSource::Kernel,
    };
    let timeout = Outcome::Failed(ProbeError::Timeout {
        proto: Proto::Icmp,
        after: Duration::from_secs(1),
    });
    for seq in 1..=4u64 {
        let a_icmp = if seq % 2 == 0 {
            timeout.clone()
        } else {
            ok(100 * seq)
        };
        let outcomes = vec![
            (a_icmp, ok(1)),
            (ok(1), ok(1)),
            (ok(1), ok(1)),
            (ok(1), ok(1)),
        ];
        // a's node and health address, then b's.
        let keys = [(0, 0), (0, 1), (1, 0), (1, 1)];
        prober.record(&set, &keys, outcomes, seq, seq * 1000, seq * 1000 + 1);
    }
    prober
}

/// Serves `prober` on a socket of its own (within a runtime) until the
/// token is cancelled.
fn serve_prober(prober: Arc<Prober>) -> (Client, SocketGuard, CancellationToken) {
    serve_probers(watch::channel(prober).1)
}

/// Serves the prober in service in `probers` on a socket of its own
/// (within a runtime) until the token is cancelled.
pub(crate) fn serve_probers(
    probers: watch::Receiver<Arc<Prober>>,
) -> (Client, SocketGuard, CancellationToken) {
    serve_with_nodes(probers, Nodes::new("none".into()))
}

/// [`serve_probers`], with `nodes` as the node set's source.
fn serve_with_nodes(
    probers: watch::Receiver<Arc<Prober>>,
    nodes: Nodes,
) -> (Client, SocketGuard, CancellationToken) {
    serve_state(probers, nodes, |state| state)
}

/// [`serve_with_nodes`], the state as `with` makes it.
fn serve_state(
    probers: watch::Receiver<Arc<Prober>>,
    nodes: Nodes,
    with: impl FnOnce(ApiState) -> ApiState,
) -> (Client, SocketGuard, CancellationToken) {
    let path = std::env::temp_dir().join(format!(
        "health-agent-api-{}-{}.sock",
        std::process::id(),
        fastrand::u64(..)
    ));
    let (guard, listener) = bind(&path, None).expect("bind");
    let state = with(ApiState::new(
        crate::endpoint::shared_view(),
        probers,
        nodes,
        Health::default(),
        Duration::from_secs(1),
    ));
    let stop = CancellationToken::new();
    tokio::spawn(serve(listener, state, stop.clone()));
    (Client::new(path), guard, stop)
}

#[tokio::test]
async fn history_is_served_per_node_as_strips_and_as_figures() {
    let (client, _guard, stop) = serve_prober(prober());

    let a = client.history("a").await.expect("a's history");
    assert_eq!((a.node.as_str(), a.window, a.paths.len()), ("a", 3, 4));
    let icmp = &a.paths[0];
    assert_eq!(
        (icmp.path.as_str(), icmp.ip),
        ("host-icmp", Ipv4Addr::new(198, 18, 0, 1).into())
    );
    let seen: Vec<(u64, EntryOutcome, Option<u64>)> = icmp
        .entries
        .iter()
        .map(|e| (e.at_ms, e.outcome, e.rtt_ns))
        .collect();
    // 300 µs as the history keeps it: within 0.1 %.
    let kept = 300_032;
    assert_eq!(
        seen,
        [
            (2001, EntryOutcome::Failure, None),
            (3001, EntryOutcome::Success, Some(kept)),
            (4001, EntryOutcome::Failure, None)
        ]
    );
    assert_eq!(icmp.entries[0].error.as_deref(), Some("timeout"));
    assert!((icmp.loss_ratio.expect("results") - 2.0 / 3.0).abs() < 1e-9);
    assert_eq!((icmp.rtt_p50_ns, icmp.rtt_p99_ns), (Some(kept), Some(kept)));
    assert_eq!(a.paths[3].path, "endpoint-http");
    assert_eq!(a.paths[3].ip, Ipv4Addr::new(198, 19, 0, 1));

    // The JSON is exactly the documented shape.
    let (code, body) = client
        .raw("GET", "/v1/status/history?node=a")
        .await
        .expect("raw");
    assert_eq!(code, StatusCode::OK);
    let json: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    let keys = |v: &serde_json::Value| {
        let mut k: Vec<String> = v.as_object().expect("object").keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(&json), ["node", "paths", "window"]);
    assert_eq!(
        keys(&json["paths"][0]),
        [
            "entries",
            "family",
            "ip",
            "loss_ratio",
            "path",
            "rtt_p50_ns",
            "rtt_p99_ns"
        ]
    );
    assert_eq!(
        json["paths"][0]["entries"][0],
        serde_json::json!({"at_ms": 2001, "outcome": "failure", "rtt_ns": null, "error": "timeout"})
    );

    let strips = client.history_strips().await.expect("strips");
    assert_eq!(strips.window, 3);
    assert_eq!(
        strips.rounds.iter().map(|r| r.seq).collect::<Vec<_>>(),
        [2, 3, 4]
    );
    assert_eq!(strips.rounds[0].started_ms, 2000);
    let names: Vec<&str> = strips.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(
        strips.nodes[0].paths,
        ["FSF", "SSS", "SSS", "SSS"].map(String::from)
    );

    let stats = client.history_stats().await.expect("stats");
    assert_eq!(stats.nodes[1].name, "b");
    assert_eq!(stats.nodes[1].paths[0].loss_ratio, Some(0.0));
    assert_eq!(stats.nodes[0].paths[0].results, 3);

    let missing = client.history("nobody").await.expect_err("no such node");
    assert_eq!(missing.status(), Some(StatusCode::NOT_FOUND), "{missing}");
    assert!(missing.to_string().contains("\"nobody\""), "{missing}");
    for bad in ["?since=1", "?node=a&stats=true", "?stats=maybe"] {
        let (code, body) = client
            .raw("GET", &format!("/v1/status/history{bad}"))
            .await
            .expect("raw");
        assert_eq!(code, StatusCode::BAD_REQUEST, "{bad}");
        let err: ApiError = serde_json::from_slice(&body).expect("an API error");
        assert_eq!(err.code, 400);
    }
    stop.cancel();
}

#[tokio::test]
async fn bad_queries_are_refused_naming_what_is_wrong() {
    let (client, _guard, stop) = serve_prober(prober());
    let gets = [
        (
            "/v1/status?node=a&node=b",
            "node given twice: \"a\" and \"b\"",
        ),
        (
            "/v1/status?state=failure&state=success",
            "state given twice",
        ),
        ("/v1/status?node=", "node= is empty"),
        ("/v1/status?node", "\"node\" has no value"),
        ("/v1/status?node=a%2", "node=\"a%2\": a % not followed"),
        (
            "/v1/status?summary=maybe",
            "summary \"maybe\": expected true or false",
        ),
        (
            "/v1/status?summary=true&node=a",
            "does not go with node= or state=",
        ),
        (
            "/v1/status?summary=true&state=failure",
            "does not go with node= or state=",
        ),
        ("/v1/status/history?node=", "node= is empty"),
        (
            "/v1/status/history?stats=true&stats=false",
            "stats given twice",
        ),
        ("/v1/status/quality?node=a&node=a", "node given twice"),
        ("/v1/endpoints/%FF", "endpoint ID: "),
        ("/v1/endpoints/+1", "\"+1\" is not a number"),
        ("/v1/endpoints/01", "\"01\" is not a number"),
        (
            "/v1/nodes?state=failure",
            "/v1/nodes takes no query parameters (given \"state=failure\")",
        ),
        ("/v1/healthz?x=1", "takes no query parameters"),
        ("/v1/cluster?node=a", "takes no query parameters"),
    ]
    .map(|(request, says)| ("GET", request, says));
    let puts = [
        (
            "/v1/status/probe?timeout=1s&timeout=2s",
            "timeout given twice",
        ),
        (
            "/v1/status/probe?timeout=121s",
            "timeout 121s is over the 120s limit",
        ),
        ("/v1/status/probe?timeout=soon", "timeout: "),
    ]
    .map(|(request, says)| ("PUT", request, says));
    for (method, request, says) in gets.into_iter().chain(puts) {
        let (code, body) = client.raw(method, request).await.expect("raw");
        assert_eq!(code, StatusCode::BAD_REQUEST, "{method} {request}");
        let err: ApiError = serde_json::from_slice(&body).expect("an API error");
        assert!(err.message.contains(says), "{request}: {}", err.message);
    }
    // An escaped name is the name.
    let (code, body) = client.raw("GET", "/v1/status?node=%61").await.expect("raw");
    assert_eq!(code, StatusCode::OK);
    let one: ClusterStatus = serde_json::from_slice(&body).expect("a status");
    assert_eq!(one.nodes.len(), 1);
    assert_eq!(one.nodes[0].name, "a");

    // A known path asked with another method: a JSON error naming both.
    let (code, body) = client.raw("POST", "/v1/healthz").await.expect("raw");
    assert_eq!(code, StatusCode::METHOD_NOT_ALLOWED);
    let err: ApiError = serde_json::from_slice(&body).expect("an API error");
    assert_eq!(err.code, 405);
    assert!(
        err.message.contains("POST") && err.message.contains("/v1/healthz"),
        "{}",
        err.message
    );
    stop.cancel();
}

/// A status filtered by state is made and sent a chunk of nodes at a
/// time, and is the whole status's nodes of that state, byte for byte.
#[tokio::test]
async fn a_status_filtered_by_state_is_sent_a_chunk_at_a_time() {
    let many = Prober::new(ProbeConfig::default());
    // Three chunks' worth: of the first 500, every third node fails;
    // the last 100 are not probed yet (unknown).
    let set = NodeSet::numbered(600);
    many.set_nodes(set.clone());
    let ok = Outcome::Ok {
        rtt: Duration::from_micros(50),
        warning: None,
        source: RttSource::Kernel,
    };
    let timeout = Outcome::Failed(ProbeError::Timeout {
        proto: Proto::Icmp,
        after: Duration::from_secs(1),
    });
    let keys: Vec<(u32, u8)> = (0..500).flat_map(|i| [(i, 0), (i, 1)]).collect();
    // Failing past the failure threshold's rounds.
    for seq in 1..=5 {
        let outcomes = keys.iter().map(|&(i, _)| {
            let o = if i % 3 == 0 { &timeout } else { &ok };
            (o.clone(), o.clone())
        });
        many.record(&set, &keys, outcomes, seq, seq * 1000, seq * 1000 + 1);
    }
    many.publish(None, true);
    let whole = many.status();
    let (_, guard, stop) = serve_prober(many.clone());
    for (state, result, count) in [
        ("success", ProbeResult::Success, 333),
        ("failure", ProbeResult::Failure, 167),
        ("unknown", ProbeResult::Unknown, 100),
    ] {
        let mut expected = ClusterStatus::clone(&whole);
        expected.nodes.retain(|n| n.state() == result);
        assert_eq!(expected.nodes.len(), count, "{state}");
        let one = many.clone();
        let pieces: Vec<Bytes> =
            Prober::status_where_pieces(move || one.clone(), move |n| n.state() == result)
                .expect("a node list")
                .collect();
        assert!(pieces.len() >= 3, "{state}: {} pieces", pieces.len());
        let (status, headers, body) =
            plain(&guard.path, &format!("/v1/status?state={state}")).await;
        assert_eq!(status, StatusCode::OK, "{state}");
        assert_chunked(&headers);
        assert_eq!(
            body,
            serde_json::to_vec(&expected).expect("json"),
            "{state}"
        );
        assert_eq!(pieces.concat(), body.to_vec(), "{state}");
    }
    stop.cancel();

    // No node of the state asked for: an empty list, as JSON.
    let small = prober();
    let mut expected = ClusterStatus::clone(&small.status());
    expected.nodes.clear();
    let (_, guard, stop) = serve_prober(small);
    let (status, _, body) = plain(&guard.path, "/v1/status?state=unknown").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, serde_json::to_vec(&expected).expect("json"));
    stop.cancel();
}

/// The node set is sent a chunk of nodes at a time, the same bytes as
/// the whole view's JSON, with what was rejected and refused.
#[tokio::test]
async fn the_node_set_is_sent_a_chunk_at_a_time() {
    let nodes = Nodes::new(r#"file:/etc/health/"nodes":[].json"#.into());
    nodes.accept(crate::membership::record::Validated {
        nodes: NodeSet::numbered(600),
        ..Default::default()
    });
    nodes.set_refused_routes(vec![crate::membership::routes::RefusedRoute {
        node: "node-0007".into(),
        address: Ipv4Addr::new(198, 19, 0, 7).into(),
        reason: r#"in a connected network "nodes":[]"#.into(),
    }]);
    nodes.reject("an update of 70,000 nodes".into());
    let whole = NodesView::new(nodes.current(), nodes.status());
    let (client, guard, stop) = serve_with_nodes(watch::channel(prober()).1, nodes);
    let (status, headers, body) = plain(&guard.path, "/v1/nodes").await;
    assert_eq!(status, StatusCode::OK);
    assert_chunked(&headers);
    assert_eq!(body, serde_json::to_vec(&whole).expect("json"));
    let read = client.nodes().await.expect("the node set");
    assert_eq!(read.nodes.len(), 600);
    assert_eq!(read.refused_routes_total, 1);
    assert_eq!(read.error.as_deref(), Some("an update of 70,000 nodes"));
    stop.cancel();
}

/// The answer was sent in chunks, as its pieces were made.
fn assert_chunked(headers: &axum::http::HeaderMap) {
    assert_eq!(
        headers
            .get("transfer-encoding")
            .map(axum::http::HeaderValue::as_bytes),
        Some(&b"chunked"[..]),
        "{headers:?}"
    );
}

/// One request as written, without `Accept-Encoding`: the answer's
/// status, headers and body (hyper's client undoes the chunks).
async fn plain(
    client_path: &std::path::Path,
    path: &str,
) -> (StatusCode, axum::http::HeaderMap, Bytes) {
    use http_body_util::BodyExt as _;
    let stream = tokio::net::UnixStream::connect(client_path)
        .await
        .expect("connect");
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    let conn = tokio::spawn(conn);
    let req = axum::http::Request::get(path)
        .header("host", "health-agent")
        .body(http_body_util::Empty::<Bytes>::new())
        .expect("request");
    let resp = sender.send_request(req).await.expect("answer");
    let (status, headers) = (resp.status(), resp.headers().clone());
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    conn.abort();
    (status, headers, body)
}

/// The metrics on the socket: a `GET` has the exposition, a `HEAD`
/// its head without a body or a length.
#[tokio::test]
async fn the_socket_serves_the_metrics_and_their_head() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let (_, probers) = watch::channel(prober());
    let metrics = Arc::new(crate::metrics::Metrics::of_probers(probers.clone(), false));
    let (_, guard, stop) = serve_state(probers, Nodes::new("none".into()), |state| {
        state.with_metrics(metrics)
    });
    let path = guard.path.clone();
    let (status, _, body) = plain(&path, "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    let text = String::from_utf8(body.to_vec()).expect("UTF-8");
    assert!(text.contains("health_node_connectivity_status{"), "{text}");
    assert!(text.ends_with("# EOF\n"));
    // Gzipped, a GET has a length: a HEAD, made without the text, none.
    for accept in ["", "Accept-Encoding: gzip\r\n"] {
        let mut raw = tokio::net::UnixStream::connect(&path)
            .await
            .expect("connect");
        let head =
            format!("HEAD /metrics HTTP/1.1\r\nHost: a\r\n{accept}Connection: close\r\n\r\n");
        raw.write_all(head.as_bytes()).await.expect("written");
        let mut answer = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), raw.read_to_end(&mut answer))
            .await
            .expect("answered")
            .expect("read");
        let answer = String::from_utf8_lossy(&answer).to_ascii_lowercase();
        assert!(answer.starts_with("http/1.1 200"), "{answer}");
        assert!(answer.contains("content-type: application/openmetrics-text"));
        assert_eq!(
            answer.contains("content-encoding: gzip"),
            !accept.is_empty()
        );
        assert!(!answer.contains("content-length"), "{answer}");
        assert!(answer.ends_with("\r\n\r\n"), "no body: {answer}");
    }
    stop.cancel();
}

/// A client that does not take gzip gets the status's JSON decompressed
/// as it is sent, in pieces (chunked), not made whole first; a head
/// past 64 KiB is refused before it is held.
#[tokio::test]
async fn the_plain_status_is_streamed_and_an_oversized_head_refused() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let prober = prober();
    let json = prober.status_json();
    let pieces: Vec<Bytes> = crate::util::gzip::pieces(prober.status_json_gzip(), 100)
        .collect::<Result<_, _>>()
        .expect("pieces");
    assert!(pieces.len() > 2 && pieces.iter().all(|p| p.len() <= 100));
    assert_eq!(pieces.concat(), json.to_vec());
    let (client, guard, stop) = serve_prober(prober);
    let (status, headers, body) = plain(&guard.path, "/v1/status").await;
    assert_eq!(status, StatusCode::OK);
    assert!(headers.get("content-encoding").is_none());
    assert_chunked(&headers);
    assert_eq!(body, json);
    serde_json::from_slice::<ClusterStatus>(&body).expect("a status");

    let mut raw = tokio::net::UnixStream::connect(&guard.path)
        .await
        .expect("connect");
    // Past 64 KiB by more than one read: hyper checks between reads.
    let big = "x".repeat(200 << 10);
    raw.write_all(
        format!("GET /v1/healthz HTTP/1.1\r\nHost: a\r\nX-Big: {big}\r\n\r\n").as_bytes(),
    )
    .await
    .ok();
    let mut answer = Vec::new();
    let _ = raw.read_to_end(&mut answer).await;
    assert!(
        answer.starts_with(b"HTTP/1.1 431"),
        "{:?}",
        String::from_utf8_lossy(&answer[..answer.len().min(80)])
    );
    // The server serves on.
    client.healthz().await.expect("healthz");
    stop.cancel();
}

/// Every node's history is made once a published round and node set,
/// and shared: a round recorded and not yet published changes no
/// answer (it is the one kept); once published, with another node set,
/// or once a reload's prober is in service, the answer is made again.
#[tokio::test]
async fn whole_history_answers_are_made_once_a_round_and_shared() {
    let prober = prober();
    let (probers, in_service) = watch::channel(prober.clone());
    let state = ApiState::new(
        crate::endpoint::shared_view(),
        in_service,
        Nodes::new("none".into()),
        Health::default(),
        Duration::from_secs(1),
    );
    let ask = |stats: bool| {
        let uri = if stats {
            "/v1/status/history?stats=true"
        } else {
            "/v1/status/history"
        };
        let state = state.clone();
        async move {
            let r = history(State(state), uri.parse().expect("uri")).await;
            assert_eq!(r.status(), StatusCode::OK);
            axum::body::to_bytes(r.into_body(), usize::MAX)
                .await
                .expect("body")
        }
    };
    let (strips, figures) = (ask(false).await, ask(true).await);
    assert_ne!(strips, figures);
    let set = NodeSet::named(&["a", "b"]);
    let keys = [(0, 0), (0, 1), (1, 0), (1, 1)];
    let timeout = || {
        Outcome::Failed(ProbeError::Timeout {
            proto: Proto::Icmp,
            after: Duration::from_secs(1),
        })
    };
    let failed = (0..4).map(|_| (timeout(), timeout()));
    prober.record(&set, &keys, failed, 5, 5000, 5001);
    assert_eq!(ask(false).await, strips, "the kept answer");
    assert_eq!(ask(true).await, figures, "the kept answer");
    prober.publish(
        Some(crate::probe::status::RoundInfo {
            seq: 5,
            started_ms: 5000,
            duration_ms: 1,
            probes: 8,
        }),
        false,
    );
    let (new_strips, new_figures) = (ask(false).await, ask(true).await);
    assert_ne!(new_strips, strips, "round 5 published");
    assert_ne!(new_figures, figures, "round 5 published");
    prober.set_nodes(NodeSet::named(&["a", "b", "c"]));
    let more = ask(false).await;
    assert!(
        String::from_utf8_lossy(&more).contains("\"c\""),
        "the new node set: {more:?}"
    );
    // A reload's prober, with no round yet, while a request waits for
    // its turn: its answer is the prober's in service once the turn
    // comes.
    let turn = state.walks.clone().try_acquire_owned().expect("the turn");
    let waiting = tokio::spawn(ask(false));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let reloaded = Prober::new(ProbeConfig::default());
    reloaded.set_nodes(NodeSet::named(&["a", "b", "c"]));
    probers.send(reloaded).expect("in service");
    drop(turn);
    let fresh = waiting.await.expect("answered");
    assert!(
        String::from_utf8_lossy(&fresh).contains("\"rounds\":[]"),
        "the reloaded prober's: {fresh:?}"
    );
}

/// Walks of every node's history go one at a time, waited for before
/// any work: a request waiting for its turn holds no thread, and one
/// dropped while it waits costs nothing. One node's does not wait.
#[tokio::test]
async fn history_walks_take_turns() {
    let state = ApiState::new(
        crate::endpoint::shared_view(),
        watch::channel(prober()).1,
        Nodes::new("none".into()),
        Health::default(),
        Duration::from_secs(1),
    );
    let turn = state.walks.clone().try_acquire_owned().expect("the turn");
    let uri: axum::http::Uri = "/v1/status/history".parse().expect("uri");
    let waiting = history(State(state.clone()), uri.clone());
    assert!(
        tokio::time::timeout(Duration::from_millis(200), waiting)
            .await
            .is_err(),
        "a walk while another has the turn waits"
    );
    assert_eq!(state.walks.available_permits(), 0);
    // One node's history waits for no walk.
    let one = tokio::time::timeout(
        Duration::from_secs(5),
        history(
            State(state.clone()),
            "/v1/status/history?node=a".parse().expect("uri"),
        ),
    )
    .await
    .expect("at once");
    assert_eq!(one.status(), StatusCode::OK);
    drop(turn);
    let answer = tokio::time::timeout(Duration::from_secs(5), history(State(state.clone()), uri))
        .await
        .expect("its turn");
    assert_eq!(answer.status(), StatusCode::OK);
    assert_eq!(state.walks.available_permits(), 1, "given back");
}
