//! `bench-page`: the connectivity page of an agent with N peers, in
//! headless Chromium.
//!
//! ```text
//! node namespace: health-agent (198.18.0.10, page on :9962) + Chromium
//!                 default route via 198.18.0.1, which nobody holds
//! ```
//!
//! The peers (node IPs 198.19.0.0 + k, health IPs 198.19.64.0 + k) exist
//! only in the nodes file: nothing answers, so after the first round every
//! path of every peer shows failure with its error, the page's worst case
//! (every row failing, every cell with an error to show).
//!
//! Measured by the page itself (`window.healthPage`, `performance.now()`):
//! the first view after navigation, then refreshes from fetch to the frame
//! painted (fetch + parse + model + DOM + paint; the history of every node
//! is fetched in parallel and included); the bytes on the wire; frame
//! intervals while scrolling a screen a frame; a name filter.

use std::{
    fmt::Write as _,
    net::Ipv4Addr,
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use health_agent::sys::netlink::in_netns;
use health_tests::{
    agent::{AgentNode, NODE_IP},
    browser::Browser,
};
use serde_json::Value;

pub(crate) struct Options {
    pub(crate) peers: usize,
    pub(crate) refreshes: u32,
    pub(crate) interval: Duration,
}

/// What the page must stay under.
const BUDGET_MS: f64 = 1000.0;
const WEB_PORT: u16 = 9962;

/// The `k`-th peer's node and health IPs.
fn peer_ips(k: usize) -> (Ipv4Addr, Ipv4Addr) {
    let k = u32::try_from(k).unwrap_or(u32::MAX);
    (
        Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 19, 0, 0)) + k),
        Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 19, 64, 0)) + k),
    )
}

fn nodes_file(node: &AgentNode, n: usize) -> anyhow::Result<PathBuf> {
    let mut yaml = String::with_capacity(n * 80);
    yaml.push_str("nodes:\n");
    for k in 0..n {
        let (ip, health) = peer_ips(k);
        let _ = writeln!(
            yaml,
            "  - name: peer-{k:05}\n    node-ip: {ip}\n    health-ip: {health}"
        );
    }
    let path = node.dir.join("nodes.yaml");
    std::fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// Starts the agent and waits until its first round has shown every peer.
fn start_agent(node: &mut AgentNode, opts: &Options) -> anyhow::Result<()> {
    in_netns(Some(&node.node), |nl| async move {
        nl.replace_route_via(Ipv4Addr::UNSPECIFIED, 0, Ipv4Addr::new(198, 18, 0, 1))
            .await
    })?;
    let file = nodes_file(node, opts.peers)?;
    let interval = format!("{}ms", opts.interval.as_millis());
    let web = format!("{NODE_IP}:{WEB_PORT}");
    let file = file.display().to_string();
    node.start(&[
        "--node-name",
        "bench",
        "--nodes-file",
        &file,
        // The agent's own CIDR (198.18.64.0/24) and the peers' health IPs.
        "--health-range",
        "198.18.0.0/15",
        "--probe-interval",
        &interval,
        "--probe-timeout",
        "1s",
        "--failure-threshold",
        "1",
        // Every peer on the page (above 64 nodes, a node probes a subset).
        "--probe-peers",
        "all",
        "--prometheus-serve-addr",
        &web,
    ]);
    let socket = node.socket();
    let deadline = Instant::now() + Duration::from_secs(60) + opts.interval * 3;
    loop {
        let summary = health_tests::api::call(&socket, |c| async move { c.status_summary().await });
        if let Ok(s) = &summary
            && s.round.is_some()
            && s.nodes == opts.peers
            && s.unreachable == opts.peers
        {
            return Ok(());
        }
        if let Some(status) = node.ended() {
            bail!(
                "the agent ended before a round showing {} failing peers: \
                 the agent exited ({status}); the last lines of its log:\n{}",
                opts.peers,
                tail(&node.log(), 15)
            );
        }
        if Instant::now() > deadline {
            bail!(
                "the agent did not finish a round showing {} failing peers; \
                 last summary: {summary:?}; the log's end:\n{}",
                opts.peers,
                tail(&node.log(), 15)
            );
        }
        crate::stop::sleep(Duration::from_millis(200))?;
    }
}

/// The last `n` lines of `text`.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// What the page measured.
struct Measured {
    first_view_ms: f64,
    first_load: Value,
    refreshes: Vec<Value>,
    wire: Value,
    frames: Vec<f64>,
    filter: Value,
    dom_rows: u64,
    /// `window.healthPage.heat()`: the loss heat map as drawn.
    heat: Value,
}

pub(crate) fn run(opts: &Options) -> anyhow::Result<String> {
    if opts.peers == 0 || opts.peers > 16_000 {
        bail!("--peers {} is out of range (1 to 16000)", opts.peers);
    }
    eprintln!("starting an agent with {} silent peers...", opts.peers);
    let mut node = AgentNode::new();
    start_agent(&mut node, opts)?;
    eprintln!("first round done; loading the page in headless Chromium...");
    let browser = Browser::start(&node.node);
    browser.goto(&format!("http://{NODE_IP}:{WEB_PORT}/"));
    browser.wait_for(
        "every peer on the page",
        Duration::from_secs(30),
        &format!(
            "const p = window.healthPage;
             return p && p.ready && p.summary().unreachable === {};",
            opts.peers
        ),
    );
    let m = measure(&browser, opts.refreshes)?;
    drop(browser);
    drop(node);
    let (text, pass) = render(opts, &m);
    if !pass {
        bail!("over budget:\n{text}");
    }
    Ok(text)
}

fn measure(browser: &Browser, refreshes: u32) -> anyhow::Result<Measured> {
    let first_view_ms = browser
        .eval("return window.healthPage.firstReadyAt")
        .as_f64()
        .context("firstReadyAt")?;
    let first_load = browser.eval("return window.healthPage.timings.find(t => t.ok)");
    let mut samples = Vec::new();
    for _ in 0..refreshes {
        let t = browser.eval_async(
            "const done = arguments[arguments.length - 1];
             window.healthPage.refresh().then(done, e => done({ error: String(e) }));",
        );
        if t["ok"] != true {
            bail!("a refresh failed: {t}");
        }
        samples.push(t);
    }
    let wire = browser.eval(
        "const e = performance.getEntriesByType('resource')
             .filter(e => /api\\/v1\\/status$/.test(e.name)).pop();
         return e ? { transfer: e.transferSize, encoded: e.encodedBodySize,
                      decoded: e.decodedBodySize } : null;",
    );
    // A screen further at every frame, for 120 frames.
    let frames = browser.eval_async(
        "const done = arguments[arguments.length - 1];
         const l = document.getElementById('list');
         const gaps = []; let last = null; let i = 0;
         const frame = (ts) => {
           if (last !== null) gaps.push(ts - last);
           last = ts;
           l.scrollTop = (i * l.clientHeight) % Math.max(1, l.scrollHeight - l.clientHeight);
           if (++i <= 120) requestAnimationFrame(frame); else { l.scrollTop = 0; done(gaps); }
         };
         requestAnimationFrame(frame);",
    );
    let frames = frames
        .as_array()
        .context("frame gaps")?
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    let filter = browser.eval(
        "const t = performance.now();
         const shown = window.healthPage.setFilters({ search: 'peer-04' });
         const ms = performance.now() - t;
         window.healthPage.setFilters({ search: '' });
         return { ms, shown };",
    );
    let dom_rows = browser
        .eval("return document.querySelectorAll('#rows .row').length")
        .as_u64()
        .context("row count")?;
    let heat = browser.eval("return window.healthPage.heat()");
    Ok(Measured {
        first_view_ms,
        first_load,
        refreshes: samples,
        wire,
        frames,
        filter,
        dom_rows,
        heat,
    })
}

/// p50 and max of `v`.
fn p50_max(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN),
        v.last().copied().unwrap_or(f64::NAN),
    )
}

fn field(samples: &[Value], name: &str) -> Vec<f64> {
    samples.iter().filter_map(|t| t[name].as_f64()).collect()
}

#[allow(
    clippy::cast_precision_loss,
    reason = "byte counts for display, far below 2^52"
)]
fn render(opts: &Options, m: &Measured) -> (String, bool) {
    let mut text = String::new();
    let kib = |v: &Value| v.as_u64().map_or(f64::NAN, |b| b as f64 / 1024.0);
    let _ = writeln!(
        text,
        "bench-page: {} peers, every path failing; status {:.0} KiB of JSON, {:.0} KiB on the wire",
        opts.peers,
        kib(&m.wire["decoded"]),
        kib(&m.wire["transfer"]),
    );
    let _ = writeln!(
        text,
        "first view: navigation start to data painted {:.0} ms (of which fetch to painted {:.0} ms)",
        m.first_view_ms,
        m.first_load["paintedMs"].as_f64().unwrap_or(f64::NAN)
    );
    let row = |text: &mut String, what: &str, name: &str| {
        let (p50, max) = p50_max(field(&m.refreshes, name));
        let _ = writeln!(text, "  {what:<44} p50 {p50:>6.1} ms, max {max:>6.1} ms");
    };
    let _ = writeln!(text, "refreshes (n={}):", m.refreshes.len());
    row(&mut text, "fetch of the status", "fetchMs");
    row(&mut text, "JSON.parse + model (sort, counts)", "parseMs");
    row(&mut text, "status and history fetched and parsed", "sideMs");
    row(&mut text, "DOM update of the rows in view", "renderMs");
    row(&mut text, "fetch to painted (the figure)", "paintedMs");
    let (f50, fmax) = p50_max(m.frames.clone());
    let _ = writeln!(
        text,
        "scrolling a screen every frame ({} frames): frame interval p50 {f50:.1} ms, \
         max {fmax:.1} ms, {} over 50 ms",
        m.frames.len(),
        m.frames.iter().filter(|f| **f > 50.0).count()
    );
    let _ = writeln!(
        text,
        "name filter ('peer-04', {} of {} rows): {:.1} ms; rows in the DOM: {}",
        m.filter["shown"],
        opts.peers,
        m.filter["ms"].as_f64().unwrap_or(f64::NAN),
        m.dom_rows
    );
    let heat_nodes = m.heat["nodes"].as_u64().unwrap_or(0);
    let _ = writeln!(
        text,
        "loss heat map: {heat_nodes} nodes in {}x{} squares of {} px, {} with probes lost (drawn within each refresh)",
        m.heat["layout"]["cols"],
        m.heat["layout"]["rows"],
        m.heat["layout"]["cell"],
        m.heat["lossy"]
    );
    let (p50, max) = p50_max(field(&m.refreshes, "paintedMs"));
    let first = m.first_load["paintedMs"].as_f64().unwrap_or(f64::NAN);
    let heat_ok =
        heat_nodes >= opts.peers as u64 && m.heat["lossy"].as_u64() >= Some(opts.peers as u64);
    let pass = p50 < BUDGET_MS && max < BUDGET_MS && first < BUDGET_MS && heat_ok;
    let _ = writeln!(
        text,
        "result: {} (fetch to painted: first {first:.0} ms, p50 {p50:.0} ms, max {max:.0} ms; budget {BUDGET_MS:.0} ms)",
        if pass { "PASS" } else { "FAIL" }
    );
    (text, pass)
}
