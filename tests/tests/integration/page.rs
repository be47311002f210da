//! The connectivity page (`GET /` on the metrics listener) in real headless
//! Chromium: read through the page's hook (`window.healthPage`) and
//! through the DOM as `WebDriver` sees it.
//!
//! The cluster tests load a real agent's page (nodes from a file: no
//! cluster section; through etcd: the cluster view and its matrix); the
//! others serve the same embedded page from a stand-in agent (the page's
//! own router, and bodies made from the agent's types) to feed it what a
//! healthy agent never sends: 5,000 peers, a 1,000-node matrix, malformed
//! JSON, no answer at all.

use std::{
    net::{Ipv4Addr, SocketAddrV4},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{
    Router,
    extract::RawQuery,
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use health_agent::util::timefmt::now_ms;
use health_agent::{
    cluster::{
        cadence::STALE_ROUNDS,
        matrix::ClusterMatrix,
        view::{ClusterView, NodeView, Verdict, VerdictCounts},
    },
    encryption::{EncState, PathEncryption},
    probe::{
        family::Family,
        history::{HistoryRound, HistoryStrips, NodeStrips},
        path::{PathState, ProbeResult, RttSource},
        status::{ClusterStatus, Connectivity, NodeStatus, RoundInfo},
    },
    sys::{netlink::in_netns, netns::Netns},
};
use health_tests::{
    browser::Browser,
    cluster::{Cluster, Settings},
    names, patience,
};
use serde_json::Value;

/// Where the screenshots go: the integration tests' scratch directory.
fn output_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("page")
}

/// Writes a screenshot to the output directory and prints its path; with
/// `HEALTH_UPDATE_DOCS=1`, copies it to `docs/` as `docs_name` too.
fn screenshot(browser: &Browser, name: &str, docs_name: Option<&str>) {
    let path = output_dir().join(name);
    browser.screenshot(&path);
    println!("screenshot: {}", path.display());
    if let Some(docs_name) = docs_name
        && std::env::var("HEALTH_UPDATE_DOCS").is_ok_and(|v| v == "1")
    {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("the workspace")
            .join("docs")
            .join(docs_name);
        std::fs::create_dir_all(docs.parent().expect("docs dir")).expect("docs dir");
        std::fs::copy(&path, &docs).expect("copy the screenshot to docs/");
        println!("updated {}", docs.display());
    }
}

/// `(data-node, data-state)` of every row in the DOM.
fn dom_rows(browser: &Browser) -> Vec<(String, String)> {
    browser
        .attributes("#rows .row[data-node]", &["data-node", "data-state"])
        .into_iter()
        .map(|a| {
            (
                a[0].clone().unwrap_or_default(),
                a[1].clone().unwrap_or_default(),
            )
        })
        .collect()
}

/// How many row elements are displayed (a hidden one of the pool is not).
fn displayed_rows(browser: &Browser) -> u64 {
    browser
        .eval(
            "return [...document.querySelectorAll('#rows .row')]
                 .filter(r => r.offsetParent !== null).length",
        )
        .as_u64()
        .expect("count")
}

/// The `data-state` of the four path cells of `node`'s row in the DOM.
fn dom_paths(browser: &Browser, node: &str) -> Vec<(String, String)> {
    browser
        .attributes(
            &format!("#rows .row[data-node='{node}'] .c-path"),
            &["data-path", "data-state"],
        )
        .into_iter()
        .map(|a| {
            (
                a[0].clone().unwrap_or_default(),
                a[1].clone().unwrap_or_default(),
            )
        })
        .collect()
}

fn names_of(rows: &Value) -> Vec<String> {
    rows.as_array()
        .expect("rows")
        .iter()
        .map(|r| r["name"].as_str().expect("name").to_owned())
        .collect()
}

/// The page's rows once every node it shows is reachable on every path.
const THREE_REACHABLE: &str = "
    const p = window.healthPage;
    if (!p || !p.ready) return null;
    const rows = p.rows();
    const ok = rows.length === 3 && rows.every(
        n => n.state === 'success' && n.paths.every(x => x.state === 'success'));
    return ok ? rows : null;";

/// The page's rows once node-3 is failing on all four paths and the
/// others are still reachable.
const NODE_3_FAILING: &str = "
    const rows = window.healthPage.rows();
    const n3 = rows.find(n => n.name === 'node-3');
    const ok = n3 && n3.state === 'failure'
        && n3.paths.every(x => x.state === 'failure' && x.error)
        && rows.filter(n => n.name !== 'node-3').every(n => n.state === 'success');
    return ok ? rows : null;";

#[test]
fn the_page_shows_every_peer_reachable_then_a_downed_link_as_failure() {
    let settings = Settings {
        nodes: 3,
        failure_threshold: 2,
        ..Settings::default()
    };
    let cluster = Cluster::start(&settings);
    cluster.wait_status(0, Duration::from_secs(20), |s| s.reachable() == 3);
    let browser = Browser::start(&cluster.fabric);
    browser.goto(&cluster.nodes[0].web_url());

    // Every node of the status (node-1 itself included, as the status
    // has it) is shown reachable, in the model and in the DOM.
    let rows = browser.wait_for(
        "every node reachable on node-1's page",
        Duration::from_secs(20),
        THREE_REACHABLE,
    );
    assert_eq!(names_of(&rows), ["node-1", "node-2", "node-3"]);
    assert_eq!(rows[0]["local"], true, "{rows}");
    let summary = browser.eval("return window.healthPage.summary()");
    assert_eq!(summary["localNode"], "node-1", "{summary}");
    assert_eq!(summary["reachable"], 3, "{summary}");
    assert_eq!(
        dom_rows(&browser),
        [
            ("node-1", "success"),
            ("node-2", "success"),
            ("node-3", "success")
        ]
        .map(|(n, s)| (n.to_owned(), s.to_owned()))
    );
    for node in ["node-1", "node-2", "node-3"] {
        let cells = dom_paths(&browser, node);
        assert_eq!(cells.len(), 4, "{node}: {cells:?}");
        assert!(
            cells.iter().all(|(_, s)| s == "success"),
            "{node}: {cells:?}"
        );
    }
    assert_eq!(browser.eval("return window.healthPage.error"), Value::Null);
    // Nodes from a file: no cluster view (a 404), no section, no banner.
    assert_eq!(
        browser.eval("return window.healthPage.clusterState"),
        "missing"
    );
    assert_eq!(
        browser.eval("return window.healthPage.cluster()"),
        Value::Null
    );
    assert!(!browser.is_displayed("#cluster"));
    screenshot(&browser, "reachable.png", None);

    // A reload would lose this mark: the page must update in place.
    let _ = browser.eval("window.sameDocument = true; return true");
    cluster.nodes[2].set_uplink(false);
    let down = Instant::now();
    // node-1 sees failure after `failure_threshold` failed rounds (plus a
    // probe timeout); the page shows it at its next poll (1 s).
    let bound = Duration::from_secs(u64::from(settings.failure_threshold))
        + Duration::from_millis(500)
        + Duration::from_secs(1)
        + Duration::from_secs(3);
    let rows = browser.wait_for("node-3 failing on the page", bound, NODE_3_FAILING);
    println!(
        "node-3 shown failing {} ms after its link went down (bound {} ms)",
        down.elapsed().as_millis(),
        patience(bound).as_millis()
    );
    assert_eq!(
        browser.eval("return window.sameDocument === true"),
        true,
        "the page reloaded"
    );
    // Failing first, in the model and in the DOM.
    assert_eq!(names_of(&rows), ["node-3", "node-1", "node-2"]);
    let dom = dom_rows(&browser);
    assert_eq!(
        dom[0],
        ("node-3".to_owned(), "failure".to_owned()),
        "{dom:?}"
    );
    assert!(dom[1..].iter().all(|(_, s)| s == "success"), "{dom:?}");
    let cells = dom_paths(&browser, "node-3");
    assert!(
        cells.iter().all(|(_, s)| s == "failure"),
        "node-3's cells: {cells:?}"
    );
    let title = browser.attributes(
        "#rows .row[data-node='node-3'] .c-path[data-path='host-icmp']",
        &["title"],
    );
    assert!(
        title[0][0]
            .as_deref()
            .is_some_and(|t| t.contains("last error:")),
        "the failing cell's hover text: {title:?}"
    );
    let banner = browser.eval("return window.healthPage.error");
    assert_eq!(banner, Value::Null, "no banner while the agent answers");

    // The history strip: node-3's paths went from S to F.
    let strip = browser.wait_for(
        "node-3's history strip ending in failures",
        Duration::from_secs(5),
        "const s = window.healthPage.strip('node-3');
         return s && s.every(p => /S+F+$/.test(p)) ? s : null;",
    );
    println!("node-3's strips: {strip}");
    check_filters_and_detail(&browser);
}

/// The filters and the detail of a node, on the cluster page with node-3
/// failing.
fn check_filters_and_detail(browser: &Browser) {
    browser.click("#failing-only");
    let rows = browser.eval("return window.healthPage.rows()");
    assert_eq!(names_of(&rows), ["node-3"]);
    assert_eq!(
        dom_rows(browser),
        [("node-3".to_owned(), "failure".to_owned())]
    );
    assert_eq!(displayed_rows(browser), 1);
    browser.click("#failing-only");
    browser.type_into("#search", "node-2");
    let rows = browser.eval("return window.healthPage.rows()");
    assert_eq!(names_of(&rows), ["node-2"]);
    assert_eq!(
        dom_rows(browser),
        [("node-2".to_owned(), "success".to_owned())]
    );
    assert_eq!(displayed_rows(browser), 1);
    let _ = browser.eval("return window.healthPage.setFilters({search: ''})");
    assert_eq!(dom_rows(browser).len(), 3);
    assert_eq!(displayed_rows(browser), 3);

    // A few more rounds for the strips to show the change; then a click on
    // a row shows its detail, with the agent's history.
    std::thread::sleep(Duration::from_secs(3));
    browser.click("#rows .row[data-node='node-3']");
    let cards = browser.wait_for(
        "node-3's detail with its history",
        Duration::from_secs(5),
        "const cards = [...document.querySelectorAll('#detail .path-card')];
         const ok = !document.getElementById('detail').hidden && cards.length === 4
             && cards.every(c => c.querySelector('canvas')
                 && c.querySelector('.badge').dataset.state === 'failure');
         return ok ? cards.map(c => c.dataset.path) : null;",
    );
    assert_eq!(
        cards,
        serde_json::json!(["host-icmp", "host-http", "endpoint-icmp", "endpoint-http"])
    );
    assert!(browser.is_displayed("#detail"));
    // The node's chart: percentiles while its paths answered, loss once
    // they failed, from the same history.
    let chart = browser.wait_for(
        "node-3's chart with percentiles and loss",
        Duration::from_secs(5),
        "const c = window.healthPage.chart();
         const canvas = document.querySelector('#detail .node-chart canvas');
         return c && canvas && canvas.width > 0 && c.points.length >= 3
             && c.points.some(p => p.p50 !== null) && c.points[c.points.length - 1].loss > 0
             ? c : null;",
    );
    let points = chart["points"].as_array().expect("points");
    assert!(
        points
            .iter()
            .all(|p| p["loss"].as_f64().is_some_and(|l| (0.0..=1.0).contains(&l))),
        "{chart}"
    );
    // The heat map: node-3, cut off for rounds, lost more of its probes
    // than node-2 (which may have lost a few while the agents started).
    let heat = browser.eval("return window.healthPage.heat()");
    assert!(
        heat["nodes"] == 3 && heat["lossy"].as_u64() >= Some(1),
        "{heat}"
    );
    assert!(browser.is_displayed("#heat-map"));
    let three = browser.eval("return window.healthPage.heatOf('node-3')");
    let two = browser.eval("return window.healthPage.heatOf('node-2')");
    let loss = |v: &Value| v["loss"].as_f64().unwrap_or(0.0);
    assert!(
        three["lost"].as_u64() > two["lost"].as_u64() && loss(&three) > loss(&two) + 0.1,
        "node-3 {three}, node-2 {two}"
    );
    // node-1 traced its failing ICMP path to node-3: the hops, and where
    // the way ends, on node-3's host ICMP card and in its cell's title.
    let traced = browser.wait_for(
        "node-3's host ICMP card with its trace",
        Duration::from_secs(10),
        "const t = document.querySelector(\"#detail .path-card[data-path='host-icmp'] .trace\");
         const cell = document.querySelector(\"#rows .row[data-node='node-3'] .c-path[data-path='host-icmp']\");
         return t && t.querySelectorAll('li').length > 0 && cell && cell.title.includes('traced: ')
             ? [t.querySelector('p').textContent, t.querySelectorAll('li').length] : null;",
    );
    assert!(
        traced[0]
            .as_str()
            .is_some_and(|t| t.contains("no answer past hop")),
        "the way to a node whose link is down ends before it: {traced}"
    );
    // The picture of the page for the README.
    screenshot(
        browser,
        "connectivity-page.png",
        Some("connectivity-page.png"),
    );
}

// ---- the cluster view ------------------------------------------------------

/// The cluster section once node-1's page shows a 3×3 matrix all 'S' (each
/// node's own cell included) and every node healthy.
const CLUSTER_HEALTHY: &str = "
    const p = window.healthPage;
    const c = p && p.ready && p.cluster();
    if (!c || c.state !== 'ok' || !c.matrix) return null;
    const names = ['node-1', 'node-2', 'node-3'];
    const ok = JSON.stringify(c.matrix.nodes) === JSON.stringify(names)
        && c.matrix.rows.every(r => r === 'SSS')
        && names.every(n => c.verdicts[n] === 'healthy')
        && c.counts.healthy === 3;
    return ok ? c : null;";

/// The cluster section once node-1 and node-2 see node-3 fail every path
/// and the view says node-3 is down.
const CLUSTER_NODE_3_DOWN: &str = "
    const c = window.healthPage.cluster();
    if (!c || !c.matrix) return null;
    const row = n => c.matrix.rows[c.matrix.nodes.indexOf(n)] || '';
    const ok = c.matrix.nodes[2] === 'node-3'
        && row('node-1')[2] === 'F' && row('node-2')[2] === 'F'
        && c.verdicts['node-3'] === 'node-down';
    return ok ? c : null;";

/// The matrix as drawn: each cell's colour read back from the canvas (a
/// pixel inside the cell) and named by the page's cell colours ('x' for
/// none of them).
const MATRIX_PIXELS: &str = "
    const L = window.healthPage.cluster().layout;
    const cv = document.getElementById('matrix');
    const k = cv.width / cv.getBoundingClientRect().width;
    const px = cv.getContext('2d').getImageData(0, 0, cv.width, cv.height).data;
    const css = getComputedStyle(document.documentElement);
    const probe = document.createElement('canvas').getContext('2d', { willReadFrequently: true });
    const rgb = v => {
        probe.fillStyle = css.getPropertyValue(v).trim();
        probe.fillRect(0, 0, 1, 1);
        return [...probe.getImageData(0, 0, 1, 1).data.slice(0, 3)];
    };
    const ref = [['S', '--success'], ['D', '--degraded'], ['F', '--failure'],
                 ['?', '--unknown'], ['.', '--line']].map(([c, v]) => [c, rgb(v)]);
    const rows = [];
    for (let i = 0; i < L.n; i++) {
        let r = '';
        for (let j = 0; j < L.n; j++) {
            const x = Math.floor((L.left + (j + 0.4) * L.cell) * k);
            const y = Math.floor((L.top + (i + 0.4) * L.cell) * k);
            const o = (y * cv.width + x) * 4;
            const hit = ref.find(([, q]) => q.every((v, t) => Math.abs(v - px[o + t]) <= 2));
            r += hit ? hit[0] : 'x';
        }
        rows.push(r);
    }
    return rows;";

/// Moves the mouse over the cell (observer `i`, target `j`) of the matrix
/// and returns the tooltip's text (`null` if none shows).
fn hover_cell(browser: &Browser, i: usize, j: usize) -> Value {
    let at = browser.eval(&format!(
        "const L = window.healthPage.cluster().layout;
         const r = document.getElementById('matrix').getBoundingClientRect();
         return [Math.floor(r.left + L.left + ({j} + 0.5) * L.cell),
                 Math.floor(r.top + L.top + ({i} + 0.5) * L.cell)];"
    ));
    let (x, y) = (at[0].as_f64().expect("x"), at[1].as_f64().expect("y"));
    browser.move_mouse(x, y);
    browser.eval(
        "const tip = document.getElementById('matrix-tip');
         return tip.hidden ? null : tip.textContent;",
    )
}

/// The verdict counts as the section shows them, by verdict.
fn dom_verdict_counts(browser: &Browser) -> std::collections::BTreeMap<String, String> {
    browser
        .eval(
            "return [...document.querySelectorAll('#cluster-counts [data-verdict]')]
                 .map(s => [s.dataset.verdict, s.querySelector('b').textContent]);",
        )
        .as_array()
        .expect("counts")
        .iter()
        .map(|p| {
            (
                p[0].as_str().expect("verdict").to_owned(),
                p[1].as_str().expect("count").to_owned(),
            )
        })
        .collect()
}

#[test]
fn the_page_shows_the_cluster_matrix_then_a_node_down() {
    let settings = Settings {
        nodes: 3,
        etcd: true,
        // A node that goes down stays in the node set.
        lease_ttl: "5m",
        ..Settings::default()
    };
    let mut cluster = Cluster::start(&settings);
    // node-1 assembles the view and so serves the matrix.
    cluster.make_assembler(0);
    let browser = Browser::start(&cluster.fabric);
    browser.goto(&cluster.nodes[0].web_url());

    // etcd, the agents' registrations and first rounds, the first views.
    let c = browser.wait_for(
        "a 3×3 matrix all 'S' and every node healthy on node-1's page",
        Duration::from_secs(60),
        CLUSTER_HEALTHY,
    );
    assert!(browser.is_displayed("#cluster"));
    assert!(browser.is_displayed("#matrix"));
    assert_eq!(c["matrix"]["truncated"], false, "{c}");
    assert_eq!(c["matrix"]["total"], 3, "{c}");
    assert_eq!(c["problems"], serde_json::json!([]), "{c}");
    assert_eq!(
        browser.eval(MATRIX_PIXELS),
        serde_json::json!(["SSS", "SSS", "SSS"]),
        "the matrix as drawn"
    );
    let counts = dom_verdict_counts(&browser);
    assert_eq!(counts.len(), 5, "{counts:?}");
    for (verdict, k) in &counts {
        let want = if verdict == "healthy" { "3" } else { "0" };
        assert_eq!(k, want, "{verdict}: {counts:?}");
    }
    // Names beside the rows and above the columns for 3 nodes.
    assert!(c["layout"]["left"].as_f64().expect("left") > 0.0, "{c}");
    assert_eq!(browser.eval("return window.healthPage.error"), Value::Null);

    let _ = browser.eval("window.sameDocument = true; return true");
    cluster.nodes[2].set_uplink(false);
    let down = Instant::now();
    // node-1 and node-2 fail node-3 after `failure_threshold` rounds (and a
    // probe timeout); then each publishes its round's summary, node-1
    // assembles its view and the page polls: an interval each, and slack.
    let bound = Duration::from_secs(u64::from(settings.failure_threshold))
        + Duration::from_millis(500)
        + Duration::from_secs(3)
        + Duration::from_secs(2);
    let c = browser.wait_for(
        "node-3's column failed and node-3 down on node-1's page",
        bound,
        CLUSTER_NODE_3_DOWN,
    );
    println!(
        "node-3 shown down in the matrix {} ms after its link went down (bound {} ms)",
        down.elapsed().as_millis(),
        patience(bound).as_millis()
    );
    assert_eq!(browser.eval("return window.sameDocument === true"), true);
    let rows = c["matrix"]["rows"].as_array().expect("rows");
    // node-1 and node-2 still reach each other (and themselves).
    assert_eq!(rows[0], "SSF", "{c}");
    assert_eq!(rows[1], "SSF", "{c}");
    assert_eq!(c["counts"]["node_down"], 1, "{c}");
    // node-3 cannot publish with its link down: once its last summary is
    // stale (`STALE_ROUNDS` ticks of 1 s after its last write, which may
    // have been its heartbeat just before the link went down), its row is
    // '.' (no summary), and node-1 and node-2 have one observer left each,
    // too few for a verdict. Counted from the link going down, plus a tick
    // to assemble, a page poll and slack.
    let stale_by = Duration::from_secs(u64::from(STALE_ROUNDS) + 1 + 1 + 2);
    let c = browser.wait_for(
        "node-3's stale summary left out",
        stale_by.saturating_sub(down.elapsed()),
        "const c = window.healthPage.cluster();
         return c.matrix.rows[2] === '...' && c.verdicts['node-1'] === 'unknown'
             && c.verdicts['node-2'] === 'unknown' ? c : null;",
    );
    println!(
        "node-3's summary left out {} ms after its link went down (bound {} ms)",
        down.elapsed().as_millis(),
        patience(stale_by).as_millis()
    );
    check_node_3_down(&browser, &c);
}

/// The section with node-3 down: verdicts, the problem list, the matrix as
/// drawn, the hover text; then the screenshot for docs/architecture.md.
fn check_node_3_down(browser: &Browser, c: &Value) {
    assert_eq!(
        c["matrix"]["rows"],
        serde_json::json!(["SSF", "SSF", "..."]),
        "{c}"
    );
    assert_eq!(c["verdicts"]["node-3"], "node-down", "{c}");
    assert_eq!(c["counts"]["node_down"], 1, "{c}");
    assert_eq!(c["counts"]["unknown"], 2, "{c}");
    // Worst first.
    assert_eq!(
        c["problems"],
        serde_json::json!(["node-3", "node-1", "node-2"]),
        "{c}"
    );
    let drawn = browser.eval(MATRIX_PIXELS);
    assert_eq!(drawn, c["matrix"]["rows"], "the matrix as drawn");
    let counts = dom_verdict_counts(browser);
    assert_eq!(counts["node-down"], "1", "{counts:?}");
    assert_eq!(counts["unknown"], "2", "{counts:?}");
    assert_eq!(counts["healthy"], "0", "{counts:?}");
    let problem = browser.attributes("#cluster-problems li", &["data-node", "data-verdict"]);
    assert_eq!(
        problem[0],
        [Some("node-3".to_owned()), Some("node-down".to_owned())]
    );
    let why = browser.eval(
        "return document.querySelector('#cluster-problems li[data-node=\"node-3\"] .why').textContent",
    );
    let why = why.as_str().expect("text");
    assert!(
        why.contains("node-1") && why.contains("node-2"),
        "node-3's failing observers: {why:?}"
    );
    assert_eq!(browser.eval("return window.healthPage.error"), Value::Null);

    // A click on the node in the list shows its detail.
    browser.click("#cluster-problems li[data-node='node-3'] .node");
    browser.wait_for(
        "node-3's detail",
        Duration::from_secs(5),
        "return !document.getElementById('detail').hidden
             && document.getElementById('detail-name').textContent === 'node-3'",
    );

    // Hovering a cell names it: observer → target: state.
    let tip = hover_cell(browser, 0, 2);
    assert!(
        tip.as_str()
            .is_some_and(|t| t.starts_with("node-1 → node-3: failure")),
        "hover over (node-1, node-3): {tip}"
    );
    assert!(browser.is_displayed("#matrix-tip"));
    let tip = hover_cell(browser, 1, 0);
    assert!(
        tip.as_str()
            .is_some_and(|t| t.starts_with("node-2 → node-1: success")),
        "hover over (node-2, node-1): {tip}"
    );
    // The picture for docs/architecture.md, with the pointer on node-2 → node-3.
    let tip = hover_cell(browser, 1, 2);
    assert!(
        tip.as_str()
            .is_some_and(|t| t.starts_with("node-2 → node-3: failure")),
        "hover over (node-2, node-3): {tip}"
    );
    screenshot(
        browser,
        "cluster-node-down.png",
        Some("connectivity-page-cluster.png"),
    );
}

// ---- a stand-in agent ----------------------------------------------------

/// An answer of the stand-in agent: a status code and a JSON body.
type Answer = Arc<Mutex<(StatusCode, String)>>;

/// The page's router and a status, history, cluster view and matrix set
/// by the test, on loopback in a namespace of its own.
struct FakeAgent {
    ns: Netns,
    rt: Option<tokio::runtime::Runtime>,
    status: Arc<Mutex<String>>,
    history: Arc<Mutex<Option<String>>>,
    cluster: Answer,
    matrix: Answer,
    port: u16,
}

/// No cluster view, as the agent answers with nodes from a file.
fn no_cluster_view() -> (StatusCode, String) {
    (
        StatusCode::NOT_FOUND,
        r#"{"code": 404, "message": "no cluster view"}"#.into(),
    )
}

fn answer(a: &Answer) -> Response {
    let (code, body) = a.lock().expect("lock").clone();
    (code, json(body)).into_response()
}

fn json(body: String) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

impl FakeAgent {
    fn start() -> Self {
        health_tests::require_root();
        names::sweep_stale_netns();
        let ns = Netns::create(&names::unique("page")).expect("netns");
        in_netns(Some(&ns), |nl| async move { nl.set_up("lo").await }).expect("lo up");
        let listener = ns
            .run(|| std::net::TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)))
            .expect("enter netns")
            .expect("bind loopback");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("address").port();
        let status = Arc::new(Mutex::new(String::new()));
        let history: Arc<Mutex<Option<String>>> = Arc::new(Mutex::new(None));
        let (s, h) = (status.clone(), history.clone());
        let cluster: Answer = Arc::new(Mutex::new(no_cluster_view()));
        let matrix: Answer = Arc::new(Mutex::new(no_cluster_view()));
        let (view_answer, matrix_answer) = (cluster.clone(), matrix.clone());
        let app = Router::new()
            .merge(health_agent::page::routes())
            .route(
                "/api/v1/status",
                get(move || {
                    let body = s.lock().expect("lock").clone();
                    async move { json(body) }
                }),
            )
            .route(
                "/api/v1/status/history",
                get(move |RawQuery(q): RawQuery| {
                    // Strips only: the detail of a node is not kept here.
                    let body = h.lock().expect("lock").clone();
                    async move {
                        match body {
                            Some(body) if q.is_none() => json(body),
                            _ => (StatusCode::NOT_FOUND, "no history").into_response(),
                        }
                    }
                }),
            )
            .route(
                "/api/v1/cluster",
                get(move || {
                    let r = answer(&view_answer);
                    async move { r }
                }),
            )
            .route(
                "/api/v1/cluster/matrix",
                get(move || {
                    let r = answer(&matrix_answer);
                    async move { r }
                }),
            );
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let listener = {
            let _guard = rt.enter();
            tokio::net::TcpListener::from_std(listener).expect("tokio listener")
        };
        rt.spawn(async move { axum::serve(listener, app).await });
        Self {
            ns,
            rt: Some(rt),
            status,
            history,
            cluster,
            matrix,
            port,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    fn set_status(&self, body: String) {
        *self.status.lock().expect("lock") = body;
    }

    fn set_history(&self, body: Option<String>) {
        *self.history.lock().expect("lock") = body;
    }

    /// What `api/v1/cluster` and `api/v1/cluster/matrix` answer.
    fn set_cluster(&self, view: (StatusCode, String), matrix: (StatusCode, String)) {
        *self.cluster.lock().expect("lock") = view;
        *self.matrix.lock().expect("lock") = matrix;
    }

    /// Gone: the listener and every connection closed.
    fn stop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for FakeAgent {
    fn drop(&mut self) {
        self.stop();
        let _ = self.ns.delete();
    }
}

fn ok_path(rtt_us: u64, at: u64) -> PathState {
    PathState {
        result: ProbeResult::Success,
        consecutive_successes: 5,
        rtt_ns: Some(rtt_us * 1000),
        rtt_source: Some(RttSource::Kernel),
        probes: 5,
        last_probe_ms: Some(at),
        ..PathState::default()
    }
}

fn failed_path(at: u64) -> PathState {
    PathState {
        result: ProbeResult::Failure,
        consecutive_failures: 5,
        last_error: Some("no echo reply within 1s".into()),
        probes: 5,
        last_probe_ms: Some(at),
        ..PathState::default()
    }
}

/// `peer-00000` .. : every tenth fails on its host ICMP path.
fn synthetic_status(n: usize) -> ClusterStatus {
    let at = now_ms();
    let ip =
        |base: Ipv4Addr, k: usize| Ipv4Addr::from(u32::from(base) + u32::try_from(k).expect("k"));
    let nodes = (0..n)
        .map(|k| {
            let rtt = 80 + (k as u64 * 37) % 400;
            NodeStatus {
                name: format!("peer-{k:05}"),
                host: Connectivity {
                    ip: ip(Ipv4Addr::new(198, 18, 64, 0), k).into(),
                    family: Family::Ipv4,
                    icmp: if k % 10 == 3 {
                        failed_path(at)
                    } else {
                        ok_path(rtt, at)
                    },
                    http: ok_path(rtt + 40, at),
                    // Every fiftieth (from 21): probes to its node address left in plain text.
                    encryption: (k % 50 == 21).then(|| {
                        Box::new(PathEncryption {
                            state: EncState::Plaintext,
                            peer: Some("KEY".into()),
                            reason: Some("around the tunnel".into()),
                        })
                    }),
                },
                endpoint: Connectivity {
                    ip: ip(Ipv4Addr::new(198, 19, 0, 0), k).into(),
                    family: Family::Ipv4,
                    icmp: PathState {
                        // Every tenth (from 7) and the first row loses
                        // probes; every hundredth (from 11) is an MTU
                        // black hole.
                        degraded: k % 10 == 7 || k == 3,
                        mtu_blackhole: (k % 100 == 11).then_some(1500),
                        ..ok_path(rtt + 5, at)
                    },
                    http: ok_path(rtt + 50, at),
                    encryption: None,
                },
                host_secondary: None,
                endpoint_secondary: None,
            }
        })
        .collect();
    ClusterStatus {
        local_node: Some("peer-00000".into()),
        probe_interval_ms: 1000,
        probe_timeout_ms: 1000,
        round: Some(RoundInfo {
            seq: 42,
            started_ms: at - 200,
            duration_ms: 150,
            probes: 4 * n,
        }),
        encryption: None,
        nodes,
    }
}

fn synthetic_history(status: &ClusterStatus) -> HistoryStrips {
    let at = now_ms();
    HistoryStrips {
        window: 60,
        rounds: (0..60)
            .map(|seq| HistoryRound {
                seq,
                started_ms: at - (60 - seq) * 1000,
            })
            .collect(),
        nodes: status
            .nodes
            .iter()
            .map(|n| {
                let strip = |r: &PathState| {
                    let last = if r.result == ProbeResult::Failure {
                        'F'
                    } else {
                        'S'
                    };
                    format!("{}{}", ".".repeat(10), "S".repeat(45)) + &last.to_string().repeat(5)
                };
                NodeStrips {
                    name: n.name.clone(),
                    paths: [
                        strip(&n.host.icmp),
                        strip(&n.host.http),
                        strip(&n.endpoint.icmp),
                        strip(&n.endpoint.http),
                    ],
                    secondary: None,
                }
            })
            .collect(),
    }
}

const PEERS: usize = 5000;

#[test]
fn the_page_draws_5000_peers_and_keeps_its_data_through_bad_answers() {
    let mut agent = FakeAgent::start();
    // Malformed from the first answer: an error banner, not a blank page.
    agent.set_status(r#"{"nodes": [{"name": 1}]}"#.into());
    let browser = Browser::start(&agent.ns);
    browser.goto(&agent.url());
    let error = browser.wait_for(
        "the malformed-status banner",
        Duration::from_secs(10),
        "return window.healthPage && window.healthPage.error",
    );
    assert!(
        error
            .as_str()
            .is_some_and(|e| e.contains("Malformed status")),
        "{error}"
    );
    assert!(browser.is_displayed("#banner"));
    assert!(browser.is_displayed("#empty"));

    // A good status replaces it without a reload.
    let status = synthetic_status(PEERS);
    agent.set_status(serde_json::to_string(&status).expect("JSON"));
    let rows = browser.wait_for(
        "5,000 peers on the page",
        Duration::from_secs(10),
        "const p = window.healthPage;
         return p.ready && p.error === null && p.rows().length === 5000 ? p.rows() : null;",
    );
    check_order(&rows);
    check_quality(&browser, &rows);
    check_virtualised(&browser, &rows);
    check_render_time(&browser);

    // No history (404): no strips; then strips once the agent has them.
    assert_eq!(
        browser.eval("return window.healthPage.historyState"),
        "missing"
    );
    assert_eq!(
        browser.eval("return [...document.querySelectorAll('#rows canvas')].some(c => !c.hidden)"),
        false
    );
    let history = synthetic_history(&status);
    agent.set_history(Some(serde_json::to_string(&history).expect("JSON")));
    let strip = browser.wait_for(
        "the history strips",
        Duration::from_secs(5),
        "return window.healthPage.strip('peer-00003')",
    );
    assert_eq!(
        strip,
        serde_json::to_value(&history.nodes[3].paths).expect("JSON")
    );
    assert_eq!(
        browser.eval("return [...document.querySelectorAll('#rows canvas')].every(c => !c.hidden)"),
        true
    );
    check_heat(&browser);

    check_bad_answers(&mut agent, &browser);
}

/// The heat map of 5,000 nodes' loss: every node a cell, at least 3 px, in
/// at most 200 px of height; the failing tenth, and only it, lossy.
fn check_heat(browser: &Browser) {
    let heat = browser.wait_for(
        "the heat map of 5,000 nodes",
        Duration::from_secs(5),
        "const h = window.healthPage.heat(); return h && h.nodes === 5000 ? h : null;",
    );
    assert!(browser.is_displayed("#heat-map"));
    let failing = (0..PEERS).filter(|k| k % 10 == 3).count();
    assert_eq!(heat["lossy"], failing, "{heat}");
    let layout = &heat["layout"];
    let (cell, cols, rows) = (
        layout["cell"].as_u64().expect("cell"),
        layout["cols"].as_u64().expect("cols"),
        layout["rows"].as_u64().expect("rows"),
    );
    assert!(
        cell >= 3 && cols * rows >= 5000 && cell * rows <= 200,
        "{heat}"
    );
    let failed = browser.eval("return window.healthPage.heatOf('peer-00003')");
    let fine = browser.eval("return window.healthPage.heatOf('peer-00004')");
    assert!(failed["lost"].as_u64() >= Some(5), "{failed}");
    assert_eq!(fine["lost"], 0, "{fine}");
    assert!(
        heat["line"]
            .as_str()
            .is_some_and(|l| l.starts_with("5000 nodes, 500 with probes lost")),
        "{heat}"
    );
}

/// Failing first (by name), then the rest by name.
fn check_order(rows: &Value) {
    let names = names_of(rows);
    let failing: Vec<String> = (0..PEERS)
        .filter(|k| k % 10 == 3)
        .map(|k| format!("peer-{k:05}"))
        .collect();
    assert_eq!(names[..failing.len()], failing[..]);
    assert!(
        rows.as_array().expect("rows")[failing.len()..]
            .iter()
            .all(|r| r["state"] == "success")
    );
    assert_eq!(names[failing.len()], "peer-00000");
    assert_eq!(names.last().map(String::as_str), Some("peer-04999"));
}

/// Paths that answer but lose probes, or are MTU black holes, are marked
/// in the model and on their cells; the others are not.
fn check_quality(browser: &Browser, rows: &Value) {
    for r in rows.as_array().expect("rows") {
        let name = r["name"].as_str().expect("name");
        let k: usize = name["peer-".len()..].parse().expect("a peer number");
        let want = match (k % 10 == 7 || k == 3, k % 100 == 11) {
            (true, _) => Value::from("lossy"),
            (false, true) => Value::from("MTU"),
            (false, false) => Value::Null,
        };
        let endpoint_icmp = r["paths"]
            .as_array()
            .expect("paths")
            .iter()
            .find(|p| p["path"] == "endpoint-icmp")
            .expect("endpoint-icmp");
        assert_eq!(endpoint_icmp["quality"], want, "{name}: {r}");
        let host_http = r["paths"]
            .as_array()
            .expect("paths")
            .iter()
            .find(|p| p["path"] == "host-http")
            .expect("host-http");
        let plain = (k % 50 == 21).then_some("plaintext");
        assert_eq!(host_http["quality"].as_str(), plain, "{name}: {r}");
    }
    // The first row, in view: its lossy cell says so and is marked for
    // the style.
    let cell = browser.eval(
        "const c = document.querySelector(\"#rows .row[data-node='peer-00003'] .c-path[data-path='endpoint-icmp']\");
         return c ? [c.dataset.quality || null, c.textContent] : null;",
    );
    assert_eq!(cell[0], "lossy", "{cell}");
    assert!(
        cell[1].as_str().is_some_and(|t| t.ends_with(" lossy")),
        "{cell}"
    );
}

/// Only the rows in view exist in the DOM, and scrolling brings others.
fn check_virtualised(browser: &Browser, rows: &Value) {
    let in_dom = browser.eval("return document.querySelectorAll('#rows .row').length");
    let in_dom = in_dom.as_u64().expect("count");
    assert!(
        (20..=120).contains(&in_dom),
        "{in_dom} row elements for 5,000 peers"
    );
    let names = names_of(rows);
    let dom: Vec<String> = dom_rows(browser).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        dom[..],
        names[..dom.len()],
        "the DOM shows the model's first rows"
    );
    let _ = browser.eval(
        "const l = document.getElementById('list'); l.scrollTop = l.scrollHeight; return true",
    );
    browser.wait_for(
        "the last peer after scrolling to the bottom",
        Duration::from_secs(5),
        "return window.healthPage.visibleRows().includes('peer-04999')",
    );
    let dom: Vec<String> = dom_rows(browser).into_iter().map(|(n, _)| n).collect();
    assert_eq!(dom[..], names[names.len() - dom.len()..]);
    let _ = browser.eval("document.getElementById('list').scrollTop = 0; return true");
}

/// fetch + parse + render + paint of 5,000 peers, over a few refreshes.
fn check_render_time(browser: &Browser) {
    let mut ms: Vec<f64> = (0..5)
        .map(|_| {
            let t = browser.eval_async(
                "const done = arguments[arguments.length - 1];
                 window.healthPage.refresh().then(done, e => done({ error: String(e) }));",
            );
            assert_eq!(t["ok"], true, "{t}");
            assert_eq!(t["nodes"], 5000, "{t}");
            t["paintedMs"].as_f64().expect("paintedMs")
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    let p50 = ms[ms.len() / 2];
    println!("5,000 peers: fetch to painted {ms:?} ms, p50 {p50:.0} ms");
    assert!(
        p50 < patience(Duration::from_secs(1)).as_secs_f64() * 1000.0,
        "5,000 peers took {p50:.0} ms to render (p50), over 1 s"
    );
}

/// Malformed answers and a vanished agent: a banner, the last data kept.
fn check_bad_answers(agent: &mut FakeAgent, browser: &Browser) {
    let _ = browser.eval("window.sameDocument = true; return true");
    check_hostile_text(agent, browser);
    for bad in [
        "{\"nodes\": [",
        "[1, 2, 3]",
        "{\"nodes\": [{\"name\": \"x\"}]}",
    ] {
        agent.set_status(bad.into());
        let error = browser.wait_for(
            "the malformed-status banner",
            Duration::from_secs(5),
            "return window.healthPage.error",
        );
        assert!(
            error
                .as_str()
                .is_some_and(|e| e.contains("Malformed status")),
            "{bad}: {error}"
        );
        assert!(browser.is_displayed("#banner"), "{bad}");
        assert_eq!(
            browser.eval("return window.healthPage.rows().length"),
            5000,
            "{bad}: the last good data stays"
        );
        assert_eq!(dom_rows(browser)[0].0, "peer-00003", "{bad}");
        agent.set_status(serde_json::to_string(&synthetic_status(PEERS)).expect("JSON"));
        browser.wait_for(
            "the banner gone",
            Duration::from_secs(5),
            "return window.healthPage.error === null",
        );
    }
    agent.stop();
    let error = browser.wait_for(
        "the agent-not-reachable banner",
        Duration::from_secs(10),
        "return window.healthPage.error",
    );
    assert!(
        error
            .as_str()
            .is_some_and(|e| e.contains("Agent not reachable")),
        "{error}"
    );
    assert_eq!(browser.eval("return window.healthPage.rows().length"), 5000);
    assert_eq!(dom_rows(browser)[0].0, "peer-00003");
    assert_eq!(browser.eval("return window.sameDocument === true"), true);
    screenshot(browser, "agent-gone.png", None);
}

/// Markup in what peers and records write (a name, an error) is shown as
/// text: no element is made of it, and no script of it runs.
fn check_hostile_text(agent: &FakeAgent, browser: &Browser) {
    const MARKUP: &str = "<img src=x onerror=\"window.pwned=1\">";
    let mut status = synthetic_status(PEERS);
    let first = &mut status.nodes[3];
    first.name = format!("{MARKUP}__proto__");
    first.host.icmp.last_error =
        Some(format!("{MARKUP}</div><script>window.pwned=2</script>").into());
    agent.set_status(serde_json::to_string(&status).expect("JSON"));
    browser.wait_for(
        "the hostile name's row",
        Duration::from_secs(5),
        &format!(
            "return Array.from(document.querySelectorAll('#rows .row[data-node]')).some(r => r.textContent.includes({}))",
            serde_json::to_string(MARKUP).expect("JSON")
        ),
    );
    assert_eq!(
        browser.eval("return document.querySelectorAll('img, script:not([src])').length"),
        0,
        "markup from the status became elements"
    );
    assert_eq!(
        browser.eval("return window.pwned === undefined"),
        true,
        "a script from the status ran"
    );
    agent.set_status(serde_json::to_string(&synthetic_status(PEERS)).expect("JSON"));
    browser.wait_for(
        "the usual rows back",
        Duration::from_secs(5),
        "return document.querySelector('#rows .row[data-node]').dataset.node === 'peer-00003'",
    );
}

// ---- a 1,000-node cluster view ---------------------------------------------

/// Nodes in the synthetic cluster; its matrix shows the first 1,000.
const CLUSTER_NODES: usize = 1200;
const MATRIX_NODES: usize = 1000;
/// Down: every observer fails it; it publishes nothing.
const DOWN: usize = 42;
/// An observer problem: fails some path towards every fifth node.
const FLAKY: usize = 7;
/// Its first round not finished: nothing known.
const FRESH: usize = 99;

fn cluster_name(k: usize) -> String {
    format!("n-{k:04}")
}

/// What observer `i` saw of target `j`; `fresh` as [`FRESH`] sees it.
fn synthetic_cell(i: usize, j: usize, fresh: char) -> char {
    if i == DOWN {
        '.'
    } else if j == DOWN {
        'F'
    } else if i == FRESH {
        fresh
    } else if i == FLAKY && j.is_multiple_of(5) && j != i {
        'D'
    } else {
        'S'
    }
}

fn synthetic_matrix(fresh: char) -> ClusterMatrix {
    ClusterMatrix {
        nodes: (0..MATRIX_NODES).map(cluster_name).collect(),
        rows: (0..MATRIX_NODES)
            .map(|i| {
                (0..MATRIX_NODES)
                    .map(|j| synthetic_cell(i, j, fresh))
                    .collect()
            })
            .collect(),
        total: CLUSTER_NODES,
        truncated: true,
    }
}

fn synthetic_view() -> ClusterView {
    let names = |ks: &mut dyn Iterator<Item = usize>| ks.take(16).map(cluster_name).collect();
    let nodes: Vec<NodeView> = (0..CLUSTER_NODES)
        .map(|k| {
            let observers = u32::try_from(CLUSTER_NODES - 2).expect("u32");
            let mut n = NodeView {
                name: cluster_name(k),
                zone: None,
                reporting: k != DOWN,
                observers,
                seen_reachable: observers,
                failing: 0,
                discounted: 0,
                verdict: Verdict::Healthy,
                failing_observers: Vec::new(),
                unreached: 0,
                unreached_nodes: Vec::new(),
                lossy: u32::from(k % 100 == 7),
                plaintext: u32::from(k % 100 == 9),
            };
            if k == DOWN {
                n.seen_reachable = 0;
                n.failing = observers;
                n.verdict = Verdict::NodeDown;
                n.failing_observers = names(&mut (0..CLUSTER_NODES).filter(|&o| o != DOWN));
            } else if k == FLAKY {
                n.verdict = Verdict::ObserverProblem;
                n.unreached = 200;
                n.unreached_nodes = names(&mut (0..CLUSTER_NODES).filter(|j| j.is_multiple_of(5)));
            } else if k.is_multiple_of(5) {
                n.discounted = 1;
            }
            n
        })
        .collect();
    ClusterView {
        plaintext_nodes: (0..CLUSTER_NODES)
            .filter(|k| k % 100 == 9)
            .map(cluster_name)
            .collect(),
        reports: CLUSTER_NODES - 1,
        ignored: 0,
        counts: VerdictCounts {
            plaintext: CLUSTER_NODES.div_ceil(100),
            healthy: CLUSTER_NODES - 2,
            node_down: 1,
            path_degraded: 0,
            observer_problem: 1,
            unknown: 0,
            lossy: CLUSTER_NODES.div_ceil(100),
        },
        nodes,
    }
}

fn ok_json(body: &str) -> (StatusCode, String) {
    (StatusCode::OK, body.to_owned())
}

fn assembling() -> (StatusCode, String) {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        r#"{"code": 503, "message": "the cluster view is not assembled yet"}"#.into(),
    )
}

#[test]
fn the_page_draws_a_1000_node_matrix_and_the_cluster_views_states() {
    let agent = FakeAgent::start();
    agent.set_status(serde_json::to_string(&synthetic_status(5)).expect("JSON"));
    // Before the first view: the section says it is being assembled.
    agent.set_cluster(assembling(), assembling());
    let browser = Browser::start(&agent.ns);
    browser.goto(&agent.url());
    browser.wait_for(
        "the cluster section assembling",
        Duration::from_secs(10),
        "const p = window.healthPage;
         return p && p.ready && p.clusterState === 'assembling';",
    );
    assert!(browser.is_displayed("#cluster"));
    assert!(!browser.is_displayed("#matrix"));
    let line = browser.eval("return document.getElementById('cluster-line').textContent");
    assert!(
        line.as_str().is_some_and(|l| l.contains("assembling")),
        "{line}"
    );
    assert_eq!(browser.eval("return window.healthPage.error"), Value::Null);

    let view = serde_json::to_string(&synthetic_view()).expect("JSON");
    let matrix = synthetic_matrix('?');
    agent.set_cluster(
        ok_json(&view),
        ok_json(&serde_json::to_string(&matrix).expect("JSON")),
    );
    let c = browser.wait_for(
        "the 1,000-node matrix",
        Duration::from_secs(10),
        "const c = window.healthPage.cluster();
         return c && c.matrix && c.matrix.nodes.length === 1000 ? c : null;",
    );
    assert_eq!(
        c["matrix"]["rows"],
        serde_json::to_value(&matrix.rows).expect("JSON")
    );
    assert_eq!(
        c["matrix"]["total"], CLUSTER_NODES,
        "{}",
        c["matrix"]["total"]
    );
    assert_eq!(c["matrix"]["truncated"], true);
    assert_eq!(c["counts"]["healthy"], CLUSTER_NODES - 2);
    assert_eq!(c["lossy"], CLUSTER_NODES.div_ceil(100), "{}", c["lossy"]);
    assert_eq!(
        browser.eval("return document.querySelector('#cluster-lossy b').textContent"),
        CLUSTER_NODES.div_ceil(100).to_string()
    );
    // Reached in plain text: counted, the first named.
    assert_eq!(
        c["plaintext"],
        CLUSTER_NODES.div_ceil(100),
        "{}",
        c["plaintext"]
    );
    assert_eq!(
        c["plaintextNodes"][0],
        cluster_name(9),
        "{}",
        c["plaintextNodes"]
    );
    assert!(
        browser
            .eval("return document.querySelector('#cluster-plaintext').title")
            .as_str()
            .is_some_and(|t| t.contains(&cluster_name(9))),
    );
    assert_eq!(c["verdicts"][cluster_name(DOWN)], "node-down");
    assert_eq!(c["verdicts"][cluster_name(FLAKY)], "observer-problem");
    assert_eq!(
        c["problems"],
        serde_json::json!([cluster_name(DOWN), cluster_name(FLAKY)]),
        "worst first"
    );
    // Small cells and no names for 1,000 nodes.
    assert_eq!(c["layout"]["cell"], 2, "{}", c["layout"]);
    assert_eq!(c["layout"]["left"], 0, "{}", c["layout"]);
    assert!(
        c["note"]
            .as_str()
            .is_some_and(|n| n.contains("first 1000 of 1200")),
        "{}",
        c["note"]
    );
    let drawn = browser.eval(MATRIX_PIXELS);
    assert!(
        drawn == c["matrix"]["rows"],
        "the matrix as drawn differs from the matrix received"
    );
    check_matrix_hover(&browser);
    screenshot(&browser, "cluster-1000.png", None);
    check_matrix_render_time(&agent, &browser, &view);
    check_cluster_answers(&agent, &browser, &view);
}

fn check_matrix_hover(browser: &Browser) {
    for (i, j, want) in [
        (FLAKY, DOWN, "failure"),
        (FLAKY, 5, "degraded"),
        (FRESH, 3, "unknown"),
        (DOWN, 3, "not probed"),
        (3, 4, "success"),
    ] {
        let tip = hover_cell(browser, i, j);
        let prefix = format!("{} → {}: {want}", cluster_name(i), cluster_name(j));
        assert!(
            tip.as_str().is_some_and(|t| t.starts_with(&prefix)),
            "hover over ({i}, {j}): {tip}, not {prefix:?}"
        );
    }
}

/// fetch + parse + draw + paint of a 1,000 × 1,000 matrix that changes at
/// every refresh (so that it is drawn anew each time).
fn check_matrix_render_time(agent: &FakeAgent, browser: &Browser, view: &str) {
    let mut ms: Vec<f64> = (0..6)
        .map(|k| {
            let fresh = if k % 2 == 0 { 'S' } else { '?' };
            let matrix = serde_json::to_string(&synthetic_matrix(fresh)).expect("JSON");
            agent.set_cluster(ok_json(view), ok_json(&matrix));
            let t = browser.eval_async(
                "const done = arguments[arguments.length - 1];
                 window.healthPage.refresh().then(done, e => done({ error: String(e) }));",
            );
            assert_eq!(t["ok"], true, "{t}");
            let row = browser.eval(&format!(
                "return window.healthPage.cluster().matrix.rows[{FRESH}].slice(0, 3)"
            ));
            assert_eq!(row, format!("{fresh}{fresh}{fresh}"), "refresh {k}");
            t["paintedMs"].as_f64().expect("paintedMs")
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    let p50 = ms[ms.len() / 2];
    println!("1,000-node matrix: fetch to painted {ms:?} ms, p50 {p50:.0} ms");
    assert!(
        p50 < patience(Duration::from_secs(1)).as_secs_f64() * 1000.0,
        "a 1,000-node matrix took {p50:.0} ms to fetch and draw (p50), over 1 s"
    );
}

/// A malformed matrix keeps the last one (a note, not the banner); a 404
/// hides the section.
fn check_cluster_answers(agent: &FakeAgent, browser: &Browser, view: &str) {
    agent.set_cluster(
        ok_json(view),
        (StatusCode::OK, r#"{"nodes": ["a"], "rows": []}"#.into()),
    );
    let c = browser.wait_for(
        "the malformed-matrix note",
        Duration::from_secs(5),
        "const c = window.healthPage.cluster();
         return c && c.note && c.note.includes('matrix unavailable') ? c : null;",
    );
    assert_eq!(c["matrix"]["nodes"].as_array().map(Vec::len), Some(1000));
    assert_eq!(browser.eval("return window.healthPage.error"), Value::Null);
    assert!(browser.is_displayed("#cluster-note"));

    agent.set_cluster(no_cluster_view(), no_cluster_view());
    browser.wait_for(
        "the cluster section hidden",
        Duration::from_secs(5),
        "return window.healthPage.clusterState === 'missing'
             && window.healthPage.cluster() === null;",
    );
    assert!(!browser.is_displayed("#cluster"));
    assert_eq!(browser.eval("return window.healthPage.error"), Value::Null);
    assert_eq!(browser.eval("return window.healthPage.rows().length"), 5);
}
