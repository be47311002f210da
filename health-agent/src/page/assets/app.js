// The connectivity page: this node's view of every peer and path.
//
// Data: GET api/v1/status (the agent's ClusterStatus), polled every
// max(1 s, probe interval); GET api/v1/status/history (compact strips of
// every node, optional: a 404 shows no strip); GET
// api/v1/status/history?node=NAME for the detail of the selected node;
// GET api/v1/cluster and api/v1/cluster/matrix (the cluster view, when
// the agents discover each other through etcd: a 404 hides its section,
// a 503 says it is being assembled).
//
// Rendering: a virtualised list. The rows are sorted and filtered once per
// data update; only the rows in view (plus a few) exist in the DOM, taken
// from a pool and refilled on scroll. One delegated listener serves every
// row. The cluster matrix is one canvas: one pixel per cell drawn into an
// N x N image, scaled up without smoothing. The test hook is
// `window.healthPage`.
"use strict";

(() => {
  const ROW_H = 26;
  const OVERSCAN = 6;
  const MIN_POLL_MS = 1000;
  const FETCH_TIMEOUT_MS = 10000;
  const STRIP_W = 120;
  const STRIP_H = 18;
  const RANK = { failure: 0, unknown: 1, success: 2 };
  const RESULTS = new Set(["success", "failure", "unknown"]);
  // The four paths of a family: the row's columns. A dual-stack node has
  // them twice: its primary family's (the status's host and endpoint) and
  // its secondary's (host_secondary, endpoint_secondary), keyed with the
  // family ("host-icmp-ipv6").
  const PATHS = [
    { key: "host-icmp", label: "host ICMP", addr: "host", proto: "icmp" },
    { key: "host-http", label: "host HTTP", addr: "host", proto: "http" },
    { key: "endpoint-icmp", label: "endpoint ICMP", addr: "endpoint", proto: "icmp" },
    { key: "endpoint-http", label: "endpoint HTTP", addr: "endpoint", proto: "http" },
  ];
  const FAMILY_LABEL = { ipv4: "IPv4", ipv6: "IPv6" };
  const COLOURS = {};
  const RGB = {};
  // The cluster view: verdicts as the API spells them (and its counts' keys).
  const VERDICTS = [
    { key: "node-down", count: "node_down", label: "node down", colour: "failure" },
    { key: "path-degraded", count: "path_degraded", label: "path degraded", colour: "degraded" },
    { key: "observer-problem", count: "observer_problem", label: "observer problem", colour: "observer" },
    { key: "unknown", count: "unknown", label: "unknown", colour: "unknown" },
    { key: "healthy", count: "healthy", label: "healthy", colour: "success" },
  ];
  const VERDICT = new Map(VERDICTS.map((v, i) => [v.key, { ...v, rank: i }]));
  // A matrix cell: an observer's last round towards a target.
  const CELLS = {
    S: { colour: "success", text: "success (all four paths)" },
    D: { colour: "degraded", text: "degraded (some path failed, or every one over one address family)" },
    F: { colour: "failure", text: "failure (every path failed)" },
    "?": { colour: "unknown", text: "unknown (not known yet)" },
    ".": { colour: "line", text: "not probed" },
  };
  const CELL_RE = /^[SDF?.]*$/;
  const MATRIX_PX = 360; // the matrix's side, cells permitting
  const MIN_CELL = 2;
  const MAX_CELL = 22;
  const LABEL_CELL = 10; // names beside the rows and above the columns from this size
  const LABEL_MAX_W = 140;
  const STRIP = 4; // the targets' verdicts above the columns
  const MAX_PROBLEMS = 100;
  const collator = new Intl.Collator(undefined, { numeric: true, sensitivity: "base" });

  const $ = (id) => document.getElementById(id);
  const el = {
    local: $("local-node"),
    round: $("round"),
    reachable: $("n-reachable"),
    unreachable: $("n-unreachable"),
    unknown: $("n-unknown"),
    banner: $("banner"),
    failingOnly: $("failing-only"),
    search: $("search"),
    shown: $("shown"),
    histHead: $("hist-head"),
    cols: $("cols"),
    list: $("list"),
    spacer: $("spacer"),
    rows: $("rows"),
    empty: $("empty"),
    detail: $("detail"),
    detailName: $("detail-name"),
    detailBody: $("detail-body"),
    detailClose: $("detail-close"),
    cluster: $("cluster"),
    clusterLine: $("cluster-line"),
    clusterCounts: $("cluster-counts"),
    clusterLossy: $("cluster-lossy"),
    clusterPlaintext: $("cluster-plaintext"),
    clusterNote: $("cluster-note"),
    clusterProblems: $("cluster-problems"),
    matrixBox: $("matrix-box"),
    matrix: $("matrix"),
    matrixTip: $("matrix-tip"),
    heat: $("heat"),
    heatMap: $("heat-map"),
    heatLine: $("heat-line"),
  };

  const st = {
    status: null, // the last good ClusterStatus
    model: [], // every node, sorted failing first then by name
    byName: new Map(),
    view: [], // the model after the filters
    counts: { reachable: 0, unreachable: 0, unknown: 0 },
    history: null, // { window, rounds, strips: Map(name -> [4 strings]) }
    historyState: "pending", // "ok" | "missing" (404) | "error" | "pending"
    filters: { failingOnly: false, search: "" },
    selected: null,
    detail: null, // { name, data } | { name, missing: true } | { name, error }
    heat: null, // { from: the history it was made of, names, cells, layout, lossy, worst }
    chart: null, // the selected node's series, as drawn
    lastOkAt: 0,
    problems: { status: null, history: null },
    cluster: {
      state: "pending", // "ok" | "assembling" (503) | "missing" (404) | "pending"
      view: null, // the last good cluster view
      matrix: null, // the last good matrix
      matrixState: "pending", // as `state`, for api/v1/cluster/matrix
      problem: null, // why the data shown may be old
      shown: null, // what was rendered: the test hook's cluster()
      drawnKey: null,
      layout: null, // { n, cell, left, top } in CSS pixels
    },
    pool: [],
    scrollbar: -1,
    timer: 0,
    inflight: null,
    renders: 0,
    renderPending: false,
    timings: [],
    lastRenderMs: null,
    renderedAt: null,
    ready: false,
    firstReadyAt: null,
  };

  // ---- formatting ------------------------------------------------------

  function fmtRtt(ns) {
    if (typeof ns !== "number" || !isFinite(ns)) return "";
    if (ns < 1e6) return (ns / 1e3).toFixed(0) + " µs";
    if (ns < 1e7) return (ns / 1e6).toFixed(2) + " ms";
    if (ns < 1e9) return (ns / 1e6).toFixed(1) + " ms";
    return (ns / 1e9).toFixed(2) + " s";
  }

  function fmtAge(ms) {
    if (ms < 0) ms = 0;
    if (ms < 10000) return (ms / 1000).toFixed(1) + " s";
    if (ms < 120000) return Math.round(ms / 1000) + " s";
    if (ms < 7200000) return Math.round(ms / 60000) + " min";
    return Math.round(ms / 3600000) + " h";
  }

  function fmtClock(ms) {
    return new Date(ms).toLocaleTimeString();
  }

  // ---- the model -------------------------------------------------------

  function fail(what) {
    throw new Error(what);
  }

  // The family of a connectivity: as the agent names it, else from its
  // address (an older agent: IPv4 only).
  function familyOf(conn) {
    if (conn.family === "ipv4" || conn.family === "ipv6") return conn.family;
    return typeof conn.ip === "string" && conn.ip.includes(":") ? "ipv6" : "ipv4";
  }

  // `secondary`: the path of the node's secondary family (its
  // host_secondary / endpoint_secondary).
  function readPath(n, i, p, secondary) {
    const addr = secondary ? `${p.addr}_secondary` : p.addr;
    const conn = n[addr];
    const ps = conn[p.proto];
    if (ps === null || typeof ps !== "object") fail(`nodes[${i}].${addr}.${p.proto} is not an object`);
    if (!RESULTS.has(ps.result)) fail(`nodes[${i}].${addr}.${p.proto}.result is ${JSON.stringify(ps.result)}`);
    const family = familyOf(conn);
    return {
      path: secondary ? `${p.key}-${family}` : p.key,
      kind: p.key,
      family,
      label: secondary ? `${p.label} (${FAMILY_LABEL[family]})` : p.label,
      state: ps.result,
      rttNs: typeof ps.rtt_ns === "number" ? ps.rtt_ns : null,
      error: typeof ps.last_error === "string" ? ps.last_error : null,
      warning: typeof ps.warning === "string" ? ps.warning : null,
      lastProbeMs: typeof ps.last_probe_ms === "number" ? ps.last_probe_ms : null,
      failures: ps.consecutive_failures | 0,
      ip: typeof conn.ip === "string" ? conn.ip : "",
      degraded: ps.degraded === true,
      mtuBlackhole: Number.isInteger(ps.mtu_blackhole) ? ps.mtu_blackhole : null,
      trace: parseTrace(ps.trace),
      partial: parsePartial(ps.flows),
      encryption: parseEncryption(conn.encryption),
    };
  }

  // The address's encryption (--encryption wireguard): {state, reason};
  // null when not checked or malformed.
  function parseEncryption(e) {
    if (e === null || typeof e !== "object" || typeof e.state !== "string") return null;
    return { state: e.state, reason: typeof e.reason === "string" ? e.reason : null };
  }

  // Encryption states that are a problem, as a cell names them.
  const ENCRYPTION_PROBLEMS = { plaintext: "plaintext", not_covered: "not covered", stale: "stale" };

  // The failing flows of a path probed over several flows (PathFlows),
  // when others answer: [{flow, source, lost, probes}]; null otherwise.
  function parsePartial(flows) {
    if (!flows || !Array.isArray(flows.flows)) return null;
    const all = flows.flows.filter((f) => f && Number.isInteger(f.flow));
    const failing = all.filter((f) => f.failing === true);
    if (!failing.length || failing.length === all.length) return null;
    return failing.map((f) => ({
      flow: f.flow,
      source: f.source | 0,
      lost: f.lost | 0,
      probes: f.probes | 0,
    }));
  }

  // A failing path's traceroute (PathTrace): its hops, each with who
  // answered (null: nobody), and whether the address answered. Anything
  // malformed reads as no trace.
  function parseTrace(t) {
    if (t === null || typeof t !== "object" || !Array.isArray(t.hops)) return null;
    const hops = [];
    for (const h of t.hops) {
      if (h === null || typeof h !== "object" || !Number.isInteger(h.ttl)) return null;
      hops.push({
        ttl: h.ttl,
        ip: typeof h.ip === "string" ? h.ip : null,
        rttNs: typeof h.rtt_ns === "number" ? h.rtt_ns : null,
        unreachable: Number.isInteger(h.unreachable),
      });
    }
    return { hops, reached: t.reached === true, atMs: typeof t.at_ms === "number" ? t.at_ms : null };
  }

  // One hop as text: "2 198.18.10.1 0.21 ms", "3 *".
  function hopText(h) {
    const who = h.ip === null ? "*" : h.ip;
    const rtt = h.rttNs !== null ? ` ${fmtRtt(h.rttNs)}` : "";
    return `${h.ttl} ${who}${rtt}${h.unreachable ? " (unreachable)" : ""}`;
  }

  // Where the trace says the way ends.
  function traceEnd(t) {
    if (t.reached) return "the address answers the trace";
    const last = t.hops[t.hops.length - 1];
    return last ? `no answer past hop ${last.ttl}` : "no hop answered";
  }

  // NodeStatus::state: failure if any path failed, else unknown if any is
  // unknown, else success.
  function nodeState(paths) {
    let s = "success";
    for (const p of paths) {
      if (p.state === "failure") return "failure";
      if (p.state === "unknown") s = "unknown";
    }
    return s;
  }

  function buildModel(status) {
    if (status === null || typeof status !== "object" || Array.isArray(status)) fail("the status is not an object");
    if (!Array.isArray(status.nodes)) fail("the status has no nodes list");
    if (status.round !== null && status.round !== undefined && typeof status.round !== "object") fail("round is not an object");
    const local = typeof status.local_node === "string" ? status.local_node : null;
    const model = new Array(status.nodes.length);
    const counts = { reachable: 0, unreachable: 0, unknown: 0 };
    status.nodes.forEach((n, i) => {
      if (n === null || typeof n !== "object") fail(`nodes[${i}] is not an object`);
      if (typeof n.name !== "string") fail(`nodes[${i}].name is not a string`);
      for (const a of ["host", "endpoint"]) {
        if (n[a] === null || typeof n[a] !== "object") fail(`nodes[${i}].${a} is not an object`);
      }
      // The secondary family's paths when the node has both connectivities.
      const dual = isObject(n.host_secondary) && isObject(n.endpoint_secondary);
      const paths = PATHS.map((p) => readPath(n, i, p, false));
      if (dual) for (const p of PATHS) paths.push(readPath(n, i, p, true));
      const state = nodeState(paths);
      if (state === "success") counts.reachable++;
      else if (state === "failure") counts.unreachable++;
      else counts.unknown++;
      // The row's error: the first failing path's, else none.
      const failing = paths.find((p) => p.state === "failure");
      model[i] = {
        name: n.name,
        lname: n.name.toLowerCase(),
        hostIp: paths[0].ip,
        endpointIp: paths[2].ip,
        // Every address, primary first: the search matches any of them.
        ips: paths.filter((p, k) => k % 2 === 0).map((p) => p.ip),
        state,
        rank: RANK[state],
        local: n.name === local,
        paths,
        error: failing ? `${failing.path}: ${failing.error || "failed"}` : "",
      };
    });
    model.sort((a, b) => a.rank - b.rank || collator.compare(a.name, b.name));
    return { model, counts };
  }

  function applyFilters() {
    const { failingOnly, search } = st.filters;
    const q = search.trim().toLowerCase();
    if (!failingOnly && !q) {
      st.view = st.model;
      return;
    }
    st.view = st.model.filter(
      (n) =>
        (!failingOnly || n.state === "failure") &&
        (!q || n.lname.includes(q) || n.ips.some((ip) => ip.startsWith(q))),
    );
  }

  function buildHistory(h) {
    if (h === null || typeof h !== "object" || !Array.isArray(h.nodes)) fail("the history has no nodes list");
    const rounds = Array.isArray(h.rounds) ? h.rounds : [];
    const strips = new Map();
    for (const n of h.nodes) {
      if (n && typeof n.name === "string" && Array.isArray(n.paths)) {
        // The primary family's four lanes, then the secondary's.
        const lanes = Array.isArray(n.secondary) ? n.paths.concat(n.secondary) : n.paths;
        strips.set(n.name, lanes.map((s) => (typeof s === "string" ? s : "")));
      }
    }
    return { window: typeof h.window === "number" ? h.window : rounds.length, rounds, strips };
  }

  const isObject = (x) => x !== null && typeof x === "object" && !Array.isArray(x);
  const num = (x) => (typeof x === "number" && isFinite(x) ? x : 0);
  const names = (x) => (Array.isArray(x) ? x.filter((s) => typeof s === "string") : []);

  function buildClusterView(v) {
    if (!isObject(v) || !Array.isArray(v.nodes)) fail("the cluster view has no nodes list");
    if (!isObject(v.counts)) fail("the cluster view has no counts");
    const counts = {};
    for (const d of VERDICTS) counts[d.count] = num(v.counts[d.count]);
    const nodes = v.nodes.map((n, i) => {
      if (!isObject(n) || typeof n.name !== "string") fail(`nodes[${i}] has no name`);
      if (typeof n.verdict !== "string") fail(`nodes[${i}].verdict is not a string`);
      return {
        name: n.name,
        verdict: n.verdict,
        reporting: n.reporting !== false,
        observers: num(n.observers),
        seenReachable: num(n.seen_reachable),
        failing: num(n.failing),
        discounted: num(n.discounted),
        failingObservers: names(n.failing_observers),
        unreached: num(n.unreached),
        unreachedNodes: names(n.unreached_nodes),
      };
    });
    // Who assembled it (the elected agent), when, and whether it is stale.
    const a = isObject(v.assembly) ? v.assembly : null;
    const assembly = a && typeof a.assembled_by === "string"
      ? { by: a.assembled_by, here: a.here === true, round: num(a.round), ageMs: num(a.age_ms), stale: a.stale === true, unlisted: num(a.unlisted) }
      : null;
    const total = Math.max(nodes.length, VERDICTS.reduce((k, d) => k + counts[d.count], 0));
    // Not a verdict: nodes some observer reaches over a lossy path.
    const lossy = num(v.counts.lossy);
    // Nor this: nodes some observer reaches in plain text (outside the
    // WireGuard tunnel), the first of them by name.
    const plaintext = num(v.counts.plaintext);
    const plaintextNodes = names(v.plaintext_nodes);
    return { reports: num(v.reports), ignored: num(v.ignored), counts, lossy, plaintext, plaintextNodes, nodes, assembly, total };
  }

  function buildMatrix(m) {
    if (!isObject(m) || !Array.isArray(m.nodes) || !Array.isArray(m.rows)) fail("the matrix has no nodes or rows");
    const n = m.nodes.length;
    if (m.rows.length !== n) fail(`the matrix has ${n} nodes but ${m.rows.length} rows`);
    m.nodes.forEach((x, i) => typeof x === "string" || fail(`matrix nodes[${i}] is not a string`));
    m.rows.forEach((r, i) => {
      if (typeof r !== "string" || r.length !== n || !CELL_RE.test(r)) fail(`matrix rows[${i}] is not ${n} cells of SDF?.`);
    });
    const total = typeof m.total === "number" ? m.total : n;
    return { nodes: m.nodes, rows: m.rows, total, truncated: m.truncated === true };
  }

  // ---- fetching --------------------------------------------------------

  class HttpError extends Error {
    constructor(url, status) {
      super(`${url}: HTTP ${status}`);
      this.status = status;
    }
  }

  async function fetchText(url) {
    const opts = { cache: "no-store", headers: { Accept: "application/json" } };
    if (typeof AbortSignal !== "undefined" && AbortSignal.timeout) opts.signal = AbortSignal.timeout(FETCH_TIMEOUT_MS);
    const res = await fetch(url, opts);
    if (!res.ok) throw new HttpError(url, res.status);
    return res.text();
  }

  function pollMs() {
    const interval = st.status && typeof st.status.probe_interval_ms === "number" ? st.status.probe_interval_ms : 0;
    return Math.max(MIN_POLL_MS, interval);
  }

  // Asked at every refresh: a 404 (an agent without history) costs a few
  // bytes, and the strips appear as soon as the agent has them.
  async function loadHistory() {
    try {
      st.history = buildHistory(JSON.parse(await fetchText("api/v1/status/history")));
      st.historyState = "ok";
      st.problems.history = null;
    } catch (e) {
      st.history = null;
      if (e instanceof HttpError && e.status === 404) {
        st.historyState = "missing";
        st.problems.history = null;
      } else {
        st.historyState = "error";
        st.problems.history = `history unavailable: ${e.message}`;
      }
    }
  }

  // The view and its matrix, in parallel. A 404 (no cluster view: the
  // nodes come from a file) hides the section; a 503 (before the first
  // view, or the matrix of a stale view) shows it as being assembled, or
  // as stale; any other failure keeps the last
  // data and says so in the section, not in the banner.
  async function loadCluster() {
    const c = st.cluster;
    const [view, matrix] = await Promise.allSettled([
      fetchText("api/v1/cluster").then((t) => buildClusterView(JSON.parse(t))),
      fetchText("api/v1/cluster/matrix").then((t) => buildMatrix(JSON.parse(t))),
    ]);
    const problems = [];
    const outcome = (r, what) => {
      if (r.status === "fulfilled") return "ok";
      const e = r.reason;
      if (e instanceof HttpError && e.status === 404) return "missing";
      if (e instanceof HttpError && e.status === 503) return "assembling";
      problems.push(`${what} unavailable: ${e.message}`);
      return null;
    };
    const vs = outcome(view, "cluster view");
    if (vs !== null) {
      c.state = vs;
      c.view = vs === "ok" ? view.value : null;
    }
    const ms = outcome(matrix, "matrix");
    if (ms !== null) {
      c.matrixState = ms;
      c.matrix = ms === "ok" ? matrix.value : null;
    }
    c.problem = problems.length ? problems.join("; ") : null;
  }

  async function loadDetail() {
    const name = st.selected;
    if (name === null) return;
    const url = "api/v1/status/history?node=" + encodeURIComponent(name);
    try {
      const data = JSON.parse(await fetchText(url));
      if (data === null || typeof data !== "object" || !Array.isArray(data.paths)) fail("no paths list");
      if (st.selected === name) st.detail = { name, data };
    } catch (e) {
      if (st.selected !== name) return;
      st.detail = e instanceof HttpError && e.status === 404 ? { name, missing: true } : { name, error: e.message };
    }
  }

  // One refresh: status, history and the selected node's detail in
  // parallel, then one render. Resolves with the timings once painted.
  async function refreshOnce() {
    const t0 = performance.now();
    const now = Date.now();
    const side = Promise.all([loadHistory(), loadDetail(), loadCluster()]);
    let text = null;
    let t1 = t0;
    try {
      text = await fetchText("api/v1/status");
      t1 = performance.now();
      const status = JSON.parse(text);
      const { model, counts } = buildModel(status);
      st.status = status;
      st.model = model;
      st.byName = new Map(model.map((n) => [n.name, n]));
      st.counts = counts;
      st.lastOkAt = now;
      st.problems.status = null;
    } catch (e) {
      const since = st.lastOkAt ? ` Showing the data of ${fmtClock(st.lastOkAt)}.` : "";
      if (text === null) {
        st.problems.status = `Agent not reachable (${e.message}); retrying every ${pollMs() / 1000} s.${since}`;
      } else {
        st.problems.status = `Malformed status from the agent: ${e.message}.${since}`;
      }
    }
    const t2 = performance.now();
    await side;
    const t3 = performance.now();
    applyFilters();
    renderAll();
    const t4 = performance.now();
    await painted();
    const t5 = performance.now();
    const timing = {
      fetchMs: t1 - t0,
      parseMs: t2 - t1,
      sideMs: t3 - t0,
      renderMs: t4 - t3,
      paintedMs: t5 - t0,
      totalMs: t4 - t0,
      nodes: st.model.length,
      ok: st.problems.status === null,
    };
    st.timings.push(timing);
    if (st.timings.length > 100) st.timings.shift();
    st.lastRenderMs = timing.paintedMs;
    st.renderedAt = performance.now();
    if (st.problems.status === null && !st.ready) {
      st.ready = true;
      // Milliseconds from the navigation's start to the first data painted.
      st.firstReadyAt = st.renderedAt;
    }
    return timing;
  }

  // After the next frame has been produced (two animation frames).
  function painted() {
    if (document.hidden) return Promise.resolve();
    return new Promise((resolve) => requestAnimationFrame(() => requestAnimationFrame(() => resolve())));
  }

  function schedule() {
    clearTimeout(st.timer);
    st.timer = setTimeout(cycle, pollMs());
  }

  function cycle() {
    clearTimeout(st.timer);
    const run = refreshOnce().finally(() => {
      if (st.inflight === run) st.inflight = null;
      schedule();
    });
    st.inflight = run;
    return run;
  }

  async function refreshNow() {
    clearTimeout(st.timer);
    if (st.inflight) {
      try {
        await st.inflight;
      } catch (_) {
        // Reported by the cycle itself.
      }
    }
    return cycle();
  }

  // ---- rendering -------------------------------------------------------

  function renderAll() {
    renderHeader();
    renderBanner();
    renderRows();
    renderDetail();
    renderCluster();
    renderHeat();
    st.renders++;
  }

  function renderHeader() {
    const s = st.status;
    if (!s) return;
    el.local.textContent = s.local_node ? `on ${s.local_node}` : "";
    document.title = `${st.counts.unreachable ? `(${st.counts.unreachable}) ` : ""}health: ${s.local_node || "connectivity"}`;
    el.reachable.textContent = st.counts.reachable;
    el.unreachable.textContent = st.counts.unreachable;
    el.unknown.textContent = st.counts.unknown;
    const total = st.model.length;
    el.shown.textContent = st.view.length === total ? `${total} nodes` : `${st.view.length} of ${total} nodes`;
    if (st.historyState === "ok" && st.history) {
      el.histHead.textContent = `last ${st.history.rounds.length} rounds`;
    } else {
      el.histHead.textContent = "history";
    }
    renderRoundAge();
  }

  function renderRoundAge() {
    const s = st.status;
    if (!s) return;
    const r = s.round;
    if (!r) {
      el.round.textContent = "first round not finished: every path is unknown";
      el.round.classList.remove("stale");
      return;
    }
    const age = Date.now() - r.started_ms;
    el.round.textContent =
      `round ${r.seq} started ${fmtAge(age)} ago, took ${r.duration_ms} ms; ` +
      `${r.probes} probes every ${fmtAge(s.probe_interval_ms)}`;
    // Rounds start every interval: three intervals without one is news.
    el.round.classList.toggle("stale", age > 3 * Math.max(s.probe_interval_ms, 1000) + r.duration_ms);
  }

  function renderBanner() {
    // The status's problem says it all when there is one.
    const msgs = [st.problems.status || st.problems.history].filter(Boolean);
    el.banner.hidden = msgs.length === 0;
    el.banner.textContent = msgs.join(" ");
    el.banner.classList.toggle("warn", st.problems.status === null);
  }

  function makeRow() {
    const row = document.createElement("div");
    row.className = "row";
    row.setAttribute("role", "listitem");
    const cell = (cls) => {
      const c = document.createElement("span");
      c.className = cls;
      row.appendChild(c);
      return c;
    };
    const dotCell = cell("c-dot");
    const dot = document.createElement("span");
    dot.className = "dot";
    dotCell.appendChild(dot);
    const name = cell("c-name");
    const paths = PATHS.map((p) => {
      const c = cell("c-path");
      c.dataset.path = p.key;
      return c;
    });
    const hist = cell("c-hist");
    const canvas = document.createElement("canvas");
    hist.appendChild(canvas);
    const err = cell("c-err");
    row._c = { name, paths, hist, canvas, err, drawn: null };
    return row;
  }

  // A path that answers but is not well: lossy (degraded) and/or an MTU
  // black hole; null when it is neither.
  function pathQuality(p) {
    if (p.state !== "success") return null;
    const q = [];
    if (p.degraded) q.push("lossy");
    if (p.mtuBlackhole !== null) q.push("MTU");
    if (p.partial) q.push("flows");
    if (p.encryption && ENCRYPTION_PROBLEMS[p.encryption.state]) q.push(ENCRYPTION_PROBLEMS[p.encryption.state]);
    return q.length ? q.join(" ") : null;
  }

  function pathText(p) {
    if (p.state === "success") {
      const q = pathQuality(p);
      const rtt = fmtRtt(p.rttNs) || "ok";
      return q ? `${rtt} ${q}` : rtt;
    }
    if (p.state === "failure") return "failed";
    return p.failures > 0 ? `failing ×${p.failures}` : "—";
  }

  function pathTitle(n, p) {
    const lines = [`${n.name} ${p.label} (${p.ip}): ${p.state}`];
    if (p.rttNs !== null) lines.push(`RTT ${fmtRtt(p.rttNs)} (last success)`);
    if (p.error) lines.push(`last error: ${p.error}`);
    if (p.warning) lines.push(`warning: ${p.warning}`);
    if (p.degraded && p.state === "success") lines.push("degraded: answers, but loses probes (status --quality NODE)");
    if (p.mtuBlackhole !== null && p.state === "success") lines.push(`MTU black hole: ${p.mtuBlackhole}-byte probes lost`);
    if (p.partial && p.state === "success") {
      const named = p.partial.map((f) => `flow ${f.flow} (source ${f.source}) lost ${f.lost} of ${f.probes}`);
      lines.push(`partial loss: ${named.join(", ")}`);
    }
    if (p.trace) lines.push(`traced: ${p.trace.hops.map(hopText).join(", ")}; ${traceEnd(p.trace)}`);
    if (p.encryption) {
      const why = p.encryption.reason ? `: ${p.encryption.reason}` : "";
      lines.push(`encryption: ${p.encryption.state.replace("_", " ")}${why}`);
    }
    if (p.lastProbeMs) lines.push(`probed ${fmtAge(Date.now() - p.lastProbeMs)} ago`);
    return lines.join("\n");
  }

  function fillRow(row, n) {
    const c = row._c;
    row.dataset.node = n.name;
    row.dataset.state = n.state;
    row.classList.toggle("selected", n.name === st.selected);
    c.name.textContent = n.name;
    if (n.local) {
      const me = document.createElement("span");
      me.className = "me";
      me.textContent = "(this node)";
      c.name.appendChild(me);
    }
    const ips = n.ips.length > 2 ? `node ${n.ips[0]}, ${n.ips[2]}, endpoint ${n.ips[1]}, ${n.ips[3]}` : `node ${n.hostIp}, endpoint ${n.endpointIp}`;
    c.name.title = `${n.name}: ${n.state}\n${ips}`;
    for (let i = 0; i < PATHS.length; i++) {
      // A column shows the path in every family the node has: the worst
      // of them, the family named when they differ.
      const p = n.paths[i];
      const q = n.paths[i + PATHS.length] || null;
      const worst = q && RANK[q.state] < RANK[p.state] ? q : p;
      const cellEl = c.paths[i];
      cellEl.dataset.state = worst.state;
      const quality = pathQuality(p) || (q && pathQuality(q));
      if (quality) cellEl.dataset.quality = quality;
      else delete cellEl.dataset.quality;
      cellEl.dataset.families = q ? `${p.family} ${q.family}` : p.family;
      cellEl.textContent = q && q.state !== p.state ? `${pathText(worst)} ${FAMILY_LABEL[worst.family]}` : pathText(p);
      cellEl.title = q ? `${pathTitle(n, p)}\n\n${pathTitle(n, q)}` : pathTitle(n, p);
    }
    c.err.textContent = n.error;
    c.err.title = n.error;
    drawStrip(c, n.name);
  }

  function colour(name) {
    if (!COLOURS[name]) {
      COLOURS[name] = getComputedStyle(document.documentElement).getPropertyValue(`--${name}`).trim() || "#888";
    }
    return COLOURS[name];
  }

  // Four lanes (one per path), one column per round, oldest on the left.
  function drawStrip(c, name) {
    const strips = st.historyState === "ok" && st.history ? st.history.strips.get(name) : null;
    const labels = (i) => (i < PATHS.length ? PATHS[i].label : `${PATHS[i % PATHS.length].label} (secondary)`);
    c.hist.title = strips ? `${name}: ${strips.map((s, i) => `${labels(i)} ${s || ""}`).join("\n")}` : "";
    const key = strips ? strips.join("|") : "";
    if (c.drawn === key) return;
    c.drawn = key;
    const canvas = c.canvas;
    canvas.hidden = !strips;
    if (!strips) return;
    const dpr = window.devicePixelRatio || 1;
    if (canvas.width !== STRIP_W * dpr) {
      canvas.width = STRIP_W * dpr;
      canvas.height = STRIP_H * dpr;
    }
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, STRIP_W, STRIP_H);
    const len = Math.max(1, ...strips.map((s) => s.length));
    const w = STRIP_W / len;
    // Four lanes per family, eight for a dual-stack node.
    const lanes = Math.max(PATHS.length, strips.length);
    const laneH = STRIP_H / lanes;
    const gap = w > 2 ? 0.5 : 0;
    // One rectangle per run of equal results: a steady path is one.
    for (let lane = 0; lane < lanes; lane++) {
      const s = strips[lane] || "";
      const off = len - s.length;
      let i = 0;
      while (i < s.length) {
        const ch = s[i];
        let j = i + 1;
        while (j < s.length && s[j] === ch) j++;
        ctx.fillStyle = colour(ch === "S" ? "success" : ch === "F" ? "failure" : "line");
        ctx.fillRect((off + i) * w, lane * laneH, Math.max(1, (j - i) * w - gap), Math.max(0.5, laneH - (lanes > 4 ? 0.5 : 1)));
        i = j;
      }
    }
  }

  function renderRows() {
    const n = st.view.length;
    el.spacer.style.height = `${n * ROW_H}px`;
    const top = el.list.scrollTop;
    const height = el.list.clientHeight || window.innerHeight;
    const first = Math.max(0, Math.floor(top / ROW_H) - OVERSCAN);
    const last = Math.min(n, Math.ceil((top + height) / ROW_H) + OVERSCAN);
    el.rows.style.transform = `translateY(${first * ROW_H}px)`;
    // The column heads stay above their columns beside a scrollbar.
    const bar = el.list.offsetWidth - el.list.clientWidth;
    if (st.scrollbar !== bar) {
      st.scrollbar = bar;
      el.cols.style.paddingRight = `${16 + bar}px`;
    }
    while (st.pool.length < last - first) {
      const row = makeRow();
      st.pool.push(row);
      el.rows.appendChild(row);
    }
    for (let i = 0; i < st.pool.length; i++) {
      const row = st.pool[i];
      const node = first + i < last ? st.view[first + i] : null;
      if (node) {
        row.hidden = false;
        fillRow(row, node);
      } else if (!row.hidden) {
        row.hidden = true;
        delete row.dataset.node;
        delete row.dataset.state;
      }
    }
    el.empty.hidden = n > 0;
    if (n === 0) {
      el.empty.textContent = !st.status
        ? "no data yet"
        : st.model.length === 0
          ? "this agent knows no nodes"
          : "no node matches the filters";
    }
  }

  function requestRows() {
    if (st.renderPending) return;
    st.renderPending = true;
    requestAnimationFrame(() => {
      st.renderPending = false;
      renderRows();
    });
  }

  // ---- the cluster view --------------------------------------------------

  function rgb(name) {
    if (!RGB[name]) {
      const c = document.createElement("canvas");
      c.width = c.height = 1;
      const ctx = c.getContext("2d", { willReadFrequently: true });
      ctx.fillStyle = colour(name);
      ctx.fillRect(0, 0, 1, 1);
      RGB[name] = Array.from(ctx.getImageData(0, 0, 1, 1).data.slice(0, 3));
    }
    return RGB[name];
  }

  const plural = (k, one, many) => `${k} ${k === 1 ? one : many}`;

  function renderCluster() {
    const c = st.cluster;
    const shown = c.state === "ok" || c.state === "assembling";
    el.cluster.hidden = !shown;
    if (!shown) {
      c.shown = null;
      hideTip();
      return;
    }
    const v = c.state === "ok" ? c.view : null;
    const m = c.matrixState === "ok" ? c.matrix : null;
    el.clusterLine.classList.toggle("assembling", !v);
    el.clusterLine.classList.toggle("stale", !!(v && v.assembly && v.assembly.stale));
    el.clusterLine.textContent = v ? clusterLine(v) : "assembling: the first view comes after the first probe interval";
    const counts = {};
    for (const d of VERDICTS) {
      const k = v ? v.counts[d.count] : null;
      counts[d.count] = k;
      const span = el.clusterCounts.querySelector(`[data-verdict="${d.key}"]`);
      span.querySelector("b").textContent = k === null ? "–" : k;
      span.classList.toggle("zero", !k);
    }
    el.clusterLossy.querySelector("b").textContent = v ? v.lossy : "–";
    el.clusterLossy.classList.toggle("zero", !(v && v.lossy));
    el.clusterPlaintext.querySelector("b").textContent = v ? v.plaintext : "–";
    el.clusterPlaintext.classList.toggle("zero", !(v && v.plaintext));
    el.clusterPlaintext.title = v && v.plaintextNodes.length
      ? `reached outside the WireGuard tunnel: ${v.plaintextNodes.join(", ")}`
      : "nodes some observer reaches in plain text, outside the WireGuard tunnel (not a verdict)";
    const notes = [];
    if (c.problem) notes.push(c.problem);
    if (v && v.assembly && v.assembly.stale) notes.push(`Stale: no view published for ${Math.round(v.assembly.ageMs / 1000)} s (more than 2 of its rounds); shown as last published, not current.`);
    if (v && c.matrixState === "missing") notes.push(v.assembly && !v.assembly.here ? `The matrix is served by the assembling agent, ${v.assembly.by}.` : "This agent serves no matrix.");
    if (v && c.matrixState === "assembling") {
      // 503: none yet, or (this agent's view gone stale) no current one.
      notes.push(v.assembly && v.assembly.stale ? "No current matrix: the view is stale." : "The matrix is being assembled.");
    }
    if (m && m.truncated) notes.push(`The matrix shows the first ${m.nodes.length} of ${m.total} nodes.`);
    el.clusterNote.hidden = notes.length === 0;
    el.clusterNote.textContent = notes.join(" ");
    renderProblems(v);
    // Keyed by node names: no prototype, so a node named `constructor` has
    // no verdict but its own.
    const verdicts = Object.create(null);
    // The view lists the nodes not healthy: the other nodes it counts
    // (those of the matrix) are healthy.
    if (v && (!v.assembly || v.assembly.unlisted === 0) && !(v.assembly && v.assembly.stale)) {
      const known = m ? m.nodes : [];
      for (const name of known) verdicts[name] = "healthy";
    }
    if (v) for (const n of v.nodes) verdicts[n.name] = n.verdict;
    el.matrixBox.hidden = !m;
    drawMatrix(m, verdicts);
    c.shown = {
      state: c.state,
      counts,
      lossy: v ? v.lossy : null,
      plaintext: v ? v.plaintext : null,
      plaintextNodes: v ? v.plaintextNodes.slice() : null,
      verdicts,
      problems: [...el.clusterProblems.querySelectorAll("li[data-node]")].map((li) => li.dataset.node),
      matrix: m ? { nodes: m.nodes.slice(), rows: m.rows.slice(), total: m.total, truncated: m.truncated } : null,
      layout: c.layout ? { ...c.layout } : null,
      note: el.clusterNote.hidden ? null : el.clusterNote.textContent,
      assembly: v && v.assembly ? { ...v.assembly } : null,
    };
  }

  function clusterLine(v) {
    const bad = VERDICTS.filter((d) => d.key !== "healthy" && v.counts[d.count] > 0).map(
      (d) => `${v.counts[d.count]} ${d.label}`,
    );
    const ignored = v.ignored ? `, ${v.ignored} ignored` : "";
    const a = v.assembly;
    const by = a ? `; assembled by ${a.here ? "this agent" : a.by}, ${Math.round(a.ageMs / 1000)} s ago${a.stale ? ", STALE" : ""}` : "";
    return `${plural(v.total, "node", "nodes")}, ${plural(v.reports, "report", "reports")}${ignored}: ${
      bad.length ? bad.join(", ") : "all healthy"
    }${by}`;
  }

  function problemWhy(n) {
    const parts = [];
    if (n.verdict === "observer-problem" || n.unreached > 0) {
      const list = n.unreachedNodes.length ? `: ${n.unreachedNodes.join(", ")}${n.unreached > n.unreachedNodes.length ? ", …" : ""}` : "";
      if (n.unreached > 0) parts.push(`fails towards ${plural(n.unreached, "node", "nodes")} the others reach${list}`);
    }
    if (n.failing > 0) {
      const more = n.failing > n.failingObservers.length ? ", …" : "";
      parts.push(`failing observers (${n.failing} of ${n.observers}): ${n.failingObservers.join(", ")}${more}`);
    } else if (n.verdict !== "observer-problem") {
      parts.push(`${n.seenReachable} of ${plural(n.observers, "observer reaches", "observers reach")} it`);
    }
    if (n.discounted > 0) parts.push(`${n.discounted} discounted (failures from observer problems, or reaches of a silent node the others fail)`);
    if (!n.reporting) parts.push("publishes no summary");
    return parts.join("; ");
  }

  // The nodes whose verdict is not healthy, worst first.
  function renderProblems(v) {
    const list = v ? v.nodes.filter((n) => n.verdict !== "healthy") : [];
    const rank = (n) => (VERDICT.has(n.verdict) ? VERDICT.get(n.verdict).rank : -1);
    list.sort((a, b) => rank(a) - rank(b) || collator.compare(a.name, b.name));
    const frag = document.createDocumentFragment();
    for (const n of list.slice(0, MAX_PROBLEMS)) {
      const li = document.createElement("li");
      li.dataset.node = n.name;
      li.dataset.verdict = n.verdict;
      const name = document.createElement("span");
      name.className = "node";
      name.textContent = n.name;
      if (st.byName.has(n.name)) {
        name.classList.add("known");
        name.title = "show this node's detail";
      }
      const verdict = document.createElement("span");
      verdict.className = "verdict";
      verdict.textContent = VERDICT.has(n.verdict) ? VERDICT.get(n.verdict).label : n.verdict;
      const why = document.createElement("span");
      why.className = "why";
      why.textContent = problemWhy(n);
      li.append(name, verdict, why);
      frag.appendChild(li);
    }
    if (list.length > MAX_PROBLEMS) frag.appendChild(note(`and ${list.length - MAX_PROBLEMS} more`));
    el.clusterProblems.replaceChildren(frag);
  }

  function fitLabel(ctx, text) {
    if (ctx.measureText(text).width <= LABEL_MAX_W) return text;
    let t = text;
    while (t.length > 1 && ctx.measureText(t + "…").width > LABEL_MAX_W) t = t.slice(0, -1);
    return t + "…";
  }

  // Rows are observers, columns targets; above the columns, a strip of
  // the targets' verdicts; names when the cells are big enough.
  function drawMatrix(m, verdicts) {
    const c = st.cluster;
    if (!m) {
      c.layout = null;
      c.drawnKey = null;
      return;
    }
    const n = m.nodes.length;
    const colours = m.nodes.map((name) => (VERDICT.has(verdicts[name]) ? VERDICT.get(verdicts[name]).colour : "line"));
    const key = `${m.nodes.join("\n")}\n${m.rows.join("")}\n${colours.join(",")}`;
    if (c.drawnKey === key) return;
    c.drawnKey = key;
    hideTip();
    const canvas = el.matrix;
    const ctx = canvas.getContext("2d");
    const cell = Math.max(MIN_CELL, Math.min(MAX_CELL, Math.floor(MATRIX_PX / Math.max(1, n))));
    const labels = cell >= LABEL_CELL;
    // Measured in bold, as this node's name is drawn.
    ctx.font = "600 11px system-ui, sans-serif";
    const texts = labels ? m.nodes.map((name) => fitLabel(ctx, name)) : [];
    const labelW = labels ? Math.ceil(Math.max(0, ...texts.map((t) => ctx.measureText(t).width))) + 6 : 0;
    const left = labelW;
    const top = labelW + STRIP + 2;
    const w = left + n * cell;
    const h = top + n * cell;
    // A device-pixel canvas, but not one of hundreds of megabytes.
    const dpr = Math.max(1, Math.min(window.devicePixelRatio || 1, 4096 / Math.max(w, h, 1)));
    canvas.style.width = `${w}px`;
    canvas.style.height = `${h}px`;
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    c.layout = { n, cell, left, top, strip: STRIP };
    if (n === 0) return;
    // One pixel per cell, scaled up.
    const img = new ImageData(n, n);
    const px = img.data;
    const rgbs = {};
    for (const ch of Object.keys(CELLS)) rgbs[ch] = rgb(CELLS[ch].colour);
    for (let i = 0; i < n; i++) {
      const row = m.rows[i];
      for (let j = 0; j < n; j++) {
        const p = rgbs[row[j]];
        const o = (i * n + j) * 4;
        px[o] = p[0];
        px[o + 1] = p[1];
        px[o + 2] = p[2];
        px[o + 3] = 255;
      }
    }
    const off = document.createElement("canvas");
    off.width = n;
    off.height = n;
    off.getContext("2d").putImageData(img, 0, 0);
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(off, left, top, n * cell, n * cell);
    const gap = cell >= 6 ? 1 : 0;
    if (gap) {
      // A line of the panel's colour between cells.
      ctx.fillStyle = colour("panel");
      for (let k = 1; k < n; k++) {
        ctx.fillRect(left + k * cell - gap, top, gap, n * cell);
        ctx.fillRect(left, top + k * cell - gap, n * cell, gap);
      }
    }
    for (let j = 0; j < n; j++) {
      ctx.fillStyle = colour(colours[j]);
      ctx.fillRect(left + j * cell, top - STRIP - 2, Math.max(1, cell - gap), STRIP);
    }
    if (labels) drawLabels(ctx, m, texts, { cell, left, top });
  }

  function drawLabels(ctx, m, texts, { cell, left, top }) {
    const local = st.status ? st.status.local_node : null;
    ctx.textBaseline = "middle";
    texts.forEach((t, i) => {
      ctx.font = `${m.nodes[i] === local ? "600 " : ""}11px system-ui, sans-serif`;
      ctx.fillStyle = colour("fg");
      ctx.textAlign = "right";
      ctx.fillText(t, left - 4, top + i * cell + cell / 2);
      ctx.save();
      ctx.translate(left + i * cell + cell / 2, top - STRIP - 4);
      ctx.rotate(-Math.PI / 2);
      ctx.textAlign = "left";
      ctx.fillText(t, 0, 0);
      ctx.restore();
    });
  }

  // What the pointer is over: a cell, or a target's verdict above it.
  function matrixTipText(clientX, clientY) {
    const c = st.cluster;
    const L = c.layout;
    const m = c.shown && c.shown.matrix;
    if (!L || !m) return null;
    const r = el.matrix.getBoundingClientRect();
    const x = clientX - r.left - L.left;
    const y = clientY - r.top - L.top;
    const j = Math.floor(x / L.cell);
    if (j < 0 || j >= L.n) return null;
    if (y < 0 && y >= -L.strip - 2) {
      const v = c.shown.verdicts[m.nodes[j]];
      return `${m.nodes[j]}: ${v ? (VERDICT.has(v) ? VERDICT.get(v).label : v) : "no verdict"}`;
    }
    const i = Math.floor(y / L.cell);
    if (i < 0 || i >= L.n) return null;
    return `${m.nodes[i]} → ${m.nodes[j]}: ${CELLS[m.rows[i][j]].text}`;
  }

  function onMatrixHover(e) {
    const text = matrixTipText(e.clientX, e.clientY);
    if (text === null) {
      hideTip();
      return;
    }
    const tip = el.matrixTip;
    tip.textContent = text;
    tip.hidden = false;
    const x = Math.min(e.clientX + 14, window.innerWidth - tip.offsetWidth - 4);
    const y = e.clientY + 18 + tip.offsetHeight > window.innerHeight ? e.clientY - tip.offsetHeight - 8 : e.clientY + 18;
    tip.style.left = `${Math.max(0, x)}px`;
    tip.style.top = `${Math.max(0, y)}px`;
  }

  function hideTip() {
    el.matrixTip.hidden = true;
  }

  // ---- the loss heat map -------------------------------------------------

  const chartColours = () => ({
    success: colour("success"),
    failure: colour("failure"),
    unknown: colour("unknown"),
    muted: colour("muted"),
    line: colour("line"),
  });

  // Every node of the history's strips, by name, with its loss over the
  // strips' rounds; made again only when a new history came.
  function heatModel(h) {
    if (st.heat && st.heat.from === h) return st.heat;
    const C = window.healthCharts;
    const names = [...h.strips.keys()].sort(collator.compare);
    const cells = names.map((name) => ({ name, ...C.lossOfStrips(h.strips.get(name)) }));
    const lossy = cells.filter((c) => c.lost > 0);
    const worst = lossy.reduce((w, c) => (w === null || c.loss > w.loss ? c : w), null);
    return { from: h, names, cells, lossy: lossy.length, worst, layout: null, drawnWidth: null };
  }

  function renderHeat() {
    const h = st.history;
    el.heat.hidden = !h || h.strips.size === 0 || !window.healthCharts;
    if (el.heat.hidden) return;
    const m = heatModel(h);
    const width = el.heat.clientWidth - 32;
    if (st.heat === m && m.drawnWidth === width) return;
    st.heat = m;
    m.layout = window.healthCharts.heatLayout(m.cells.length, width);
    m.drawnWidth = width;
    window.healthCharts.drawHeat(el.heatMap, m.cells, m.layout, chartColours());
    const rounds = h.window || (h.rounds ? h.rounds.length : 0);
    const worst = m.worst ? `; most: ${m.worst.name}, ${(m.worst.loss * 100).toFixed(1)} % of ${m.worst.probes}` : "";
    el.heatLine.textContent = `${m.cells.length} nodes, ${m.lossy} with probes lost over the last ${rounds} rounds${worst}`;
  }

  // The node under the pointer on the heat map, or null.
  function heatNodeAt(ev) {
    const m = st.heat;
    if (!m || !m.layout) return null;
    const r = el.heatMap.getBoundingClientRect();
    const col = Math.floor((ev.clientX - r.left) / m.layout.cell);
    const row = Math.floor((ev.clientY - r.top) / m.layout.cell);
    if (col < 0 || col >= m.layout.cols || row < 0) return null;
    return m.cells[row * m.layout.cols + col] || null;
  }

  function onHeatHover(ev) {
    const c = heatNodeAt(ev);
    el.heatMap.title = c
      ? `${c.name}: ${c.loss === null ? "not probed" : `${(c.loss * 100).toFixed(1)} % lost (${c.lost} of ${c.probes})`}`
      : "";
  }

  // ---- the detail of one node -------------------------------------------

  function dl(pairs) {
    const d = document.createElement("dl");
    for (const [k, v] of pairs) {
      if (v === null || v === undefined || v === "") continue;
      const dt = document.createElement("dt");
      dt.textContent = k;
      const dd = document.createElement("dd");
      dd.textContent = v;
      d.append(dt, dd);
    }
    return d;
  }

  // One bar per probe: colour by outcome, height by RTT (failures full).
  function drawEntries(canvas, entries) {
    const dpr = window.devicePixelRatio || 1;
    const w = canvas.clientWidth || 420;
    const h = canvas.clientHeight || 48;
    canvas.width = w * dpr;
    canvas.height = h * dpr;
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    if (!entries.length) return;
    const rtts = entries.map((e) => (typeof e.rtt_ns === "number" ? e.rtt_ns : 0));
    const max = Math.max(1, ...rtts);
    const bw = w / entries.length;
    entries.forEach((e, i) => {
      const ok = e.outcome === "success";
      ctx.fillStyle = colour(ok ? "success" : e.outcome === "failure" ? "failure" : "unknown");
      const bh = ok ? Math.max(2, (rtts[i] / max) * (h - 2)) : h;
      ctx.fillRect(i * bw, h - bh, Math.max(1, bw - 1), bh);
    });
  }

  function renderDetail() {
    const name = st.selected;
    el.detail.hidden = name === null;
    if (name === null) return;
    const n = st.byName.get(name);
    el.detailName.textContent = name;
    const body = document.createDocumentFragment();
    if (!n) {
      const p = document.createElement("p");
      p.textContent = "This node is no longer in the status.";
      body.appendChild(p);
    }
    const hist = st.detail && st.detail.name === name ? st.detail : null;
    if (hist && hist.missing) body.appendChild(note("This agent keeps no history for this node."));
    if (hist && hist.error) body.appendChild(note(`History unavailable: ${hist.error}`));
    const detailPaths = hist && hist.data ? hist.data.paths : [];
    let chartCanvas = null;
    st.chart = null;
    if (hist && hist.data && window.healthCharts) {
      st.chart = window.healthCharts.nodeSeries(detailPaths);
      const fig = document.createElement("figure");
      fig.className = "node-chart";
      chartCanvas = document.createElement("canvas");
      chartCanvas.setAttribute("aria-label", `RTT percentiles and loss of ${name} over time`);
      const cap = document.createElement("figcaption");
      cap.append(`Each round: over the last ${st.chart.window} rounds of every path,`);
      for (const [label, c] of [["p50", "#2b6cb0"], ["p90", "#805ad5"], ["p99", "#d53f8c"]]) {
        const i = document.createElement("i");
        i.style.background = c;
        cap.append(i, label);
      }
      const i = document.createElement("i");
      i.style.background = colour("failure");
      cap.append(i, "loss");
      fig.append(chartCanvas, cap);
      body.appendChild(fig);
    }
    // Every path of the node: four per family (a node gone: the four).
    const cards = n ? n.paths : PATHS.map((p) => ({ path: p.key, kind: p.key, family: null, label: p.label, gone: true }));
    cards.forEach((p) => {
      const cur = p.gone ? null : p;
      // The history's paths name their family (an older agent's: IPv4).
      const h =
        detailPaths.find((d) => d && d.path === p.kind && (p.family === null || (d.family || "ipv4") === p.family)) || null;
      const card = document.createElement("div");
      card.className = "path-card";
      card.dataset.path = p.path;
      const title = document.createElement("h3");
      title.textContent = p.label;
      const badge = document.createElement("span");
      badge.className = "badge";
      badge.dataset.state = cur ? cur.state : "unknown";
      badge.textContent = cur ? cur.state : "gone";
      title.appendChild(badge);
      card.appendChild(title);
      const pct = (x) => (typeof x === "number" ? `${(x * 100).toFixed(1)} %` : null);
      card.appendChild(
        dl([
          ["address", (h && h.ip) || (cur && cur.ip)],
          ["RTT (last success)", cur && fmtRtt(cur.rttNs)],
          ["RTT p50 / p99", h && h.rtt_p50_ns != null ? `${fmtRtt(h.rtt_p50_ns)} / ${fmtRtt(h.rtt_p99_ns)}` : null],
          ["loss", h && pct(h.loss_ratio)],
          ["last error", cur && cur.error],
          ["warning", cur && cur.warning],
          ["last probe", cur && cur.lastProbeMs ? `${fmtAge(Date.now() - cur.lastProbeMs)} ago` : null],
        ]),
      );
      if (cur && cur.trace) card.appendChild(traceList(cur.trace));
      if (h && Array.isArray(h.entries)) {
        const canvas = document.createElement("canvas");
        card.appendChild(canvas);
        card._entries = h.entries;
        card._canvas = canvas;
        const errs = h.entries.filter((e) => e && e.error).slice(-3).reverse();
        for (const e of errs) {
          card.appendChild(note(`${typeof e.at_ms === "number" ? fmtClock(e.at_ms) : "?"}: ${e.error}`));
        }
      }
      body.appendChild(card);
    });
    el.detailBody.replaceChildren(body);
    if (chartCanvas) window.healthCharts.drawNodeChart(chartCanvas, st.chart, chartColours());
    for (const card of el.detailBody.querySelectorAll(".path-card")) {
      if (card._canvas) drawEntries(card._canvas, card._entries);
    }
  }

  // A failing path's hops, in order, and where the way ends.
  function traceList(t) {
    const box = document.createElement("div");
    box.className = "trace";
    const head = document.createElement("p");
    head.textContent = `traced${t.atMs ? ` at ${fmtClock(t.atMs)}` : ""}: ${traceEnd(t)}`;
    box.appendChild(head);
    const list = document.createElement("ol");
    for (const h of t.hops) {
      const li = document.createElement("li");
      li.value = h.ttl;
      li.textContent = hopText(h).replace(/^\d+ /, "");
      if (h.ip === null) li.className = "muted";
      list.appendChild(li);
    }
    box.appendChild(list);
    return box;
  }

  function note(text) {
    const p = document.createElement("p");
    p.className = "muted";
    p.textContent = text;
    return p;
  }

  function select(name) {
    st.selected = name;
    st.detail = null;
    renderRows();
    renderDetail();
    if (name !== null) loadDetail().then(renderDetail);
  }

  // ---- wiring ----------------------------------------------------------

  function onFilters() {
    st.filters.failingOnly = el.failingOnly.checked;
    st.filters.search = el.search.value;
    applyFilters();
    renderHeader();
    renderRows();
  }

  el.failingOnly.addEventListener("change", onFilters);
  el.search.addEventListener("input", onFilters);
  el.list.addEventListener("scroll", requestRows, { passive: true });
  window.addEventListener("resize", requestRows);
  el.rows.addEventListener("click", (e) => {
    const row = e.target.closest(".row");
    if (row && row.dataset.node) select(row.dataset.node === st.selected ? null : row.dataset.node);
  });
  el.detailClose.addEventListener("click", () => select(null));
  el.matrix.addEventListener("mousemove", onMatrixHover);
  el.heatMap.addEventListener("mousemove", onHeatHover);
  el.heatMap.addEventListener("click", (ev) => {
    const c = heatNodeAt(ev);
    if (c && st.byName.has(c.name)) select(c.name);
  });
  el.matrix.addEventListener("mouseleave", hideTip);
  el.clusterProblems.addEventListener("click", (e) => {
    const name = e.target.closest(".node.known");
    const li = name && name.closest("li[data-node]");
    if (li && st.byName.has(li.dataset.node)) select(li.dataset.node);
  });
  document.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && st.selected !== null) select(null);
    if (e.key === "/" && document.activeElement !== el.search) {
      e.preventDefault();
      el.search.focus();
    }
  });
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) refreshNow();
  });
  setInterval(renderRoundAge, 1000);

  const publicRow = (n) => ({
    name: n.name,
    state: n.state,
    local: n.local,
    paths: n.paths.map((p) => ({
      path: p.path,
      state: p.state,
      rttNs: p.rttNs,
      error: p.error,
      quality: pathQuality(p),
    })),
  });

  // The test hook: the model after the filters (not only the rows in
  // view), the cluster section as drawn, the rendering's timings, and a
  // way to refresh now.
  window.healthPage = {
    get ready() {
      return st.ready;
    },
    get lastRenderMs() {
      return st.lastRenderMs;
    },
    get renderedAt() {
      return st.renderedAt;
    },
    get firstReadyAt() {
      return st.firstReadyAt;
    },
    get renders() {
      return st.renders;
    },
    get error() {
      return el.banner.hidden ? null : el.banner.textContent;
    },
    get timings() {
      return st.timings.slice();
    },
    get historyState() {
      return st.historyState;
    },
    summary() {
      const r = st.status && st.status.round;
      return {
        localNode: st.status ? st.status.local_node : null,
        seq: r ? r.seq : null,
        nodes: st.model.length,
        shown: st.view.length,
        ...st.counts,
      };
    },
    rows() {
      return st.view.map(publicRow);
    },
    visibleRows() {
      return st.pool.filter((r) => !r.hidden && r.dataset.node).map((r) => r.dataset.node);
    },
    get clusterState() {
      return st.cluster.state;
    },
    // The cluster section as rendered: null while hidden.
    cluster() {
      const s = st.cluster.shown;
      return s ? JSON.parse(JSON.stringify(s)) : null;
    },
    // The loss heat map as drawn: null while hidden.
    heat() {
      const m = st.heat;
      if (!m || el.heat.hidden) return null;
      return {
        nodes: m.cells.length,
        lossy: m.lossy,
        worst: m.worst ? m.worst.name : null,
        layout: m.layout,
        line: el.heatLine.textContent,
      };
    },
    heatOf(name) {
      const c = st.heat && st.heat.cells.find((x) => x.name === name);
      return c ? { loss: c.loss, lost: c.lost, probes: c.probes } : null;
    },
    // The selected node's chart series, as drawn.
    chart() {
      return st.chart ? JSON.parse(JSON.stringify(st.chart)) : null;
    },
    strip(name) {
      return st.history ? st.history.strips.get(name) || null : null;
    },
    setFilters({ failingOnly = st.filters.failingOnly, search = st.filters.search } = {}) {
      el.failingOnly.checked = failingOnly;
      el.search.value = search;
      onFilters();
      return st.view.length;
    },
    select,
    refresh: refreshNow,
  };

  cycle();
})();
