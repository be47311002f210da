// Charts of the connectivity page, drawn on canvases from the agent's own
// data (no library, nothing fetched from elsewhere):
//
// - a node's RTT percentiles and loss over time, from its history
//   (GET api/v1/status/history?node=NAME): for each round, p50, p90 and
//   p99 of the RTTs its paths answered with over the last WINDOW rounds,
//   and the share of its probes lost over those rounds;
// - the loss heat map: every node one square, coloured by the share of
//   its probes lost over the rounds of the history strips
//   (GET api/v1/status/history), readable at 5,000 nodes.
//
// Pure functions over plain data, and two drawing functions; app.js owns
// the state and calls them. Exposed as `window.healthCharts`.
"use strict";

(() => {
  const WINDOW = 25; // rounds each point covers: 100 answers of 4 paths, enough for p99
  const PERCENTILES = [
    { key: "p50", q: 0.5, colour: "#2b6cb0" },
    { key: "p90", q: 0.9, colour: "#805ad5" },
    { key: "p99", q: 0.99, colour: "#d53f8c" },
  ];
  const HEAT_MAX_H = 200; // the heat map's height at most, in CSS pixels
  const HEAT_MIN_CELL = 3;
  const HEAT_MAX_CELL = 18;

  // Nearest-rank percentile of sorted numbers.
  function rank(sorted, q) {
    if (!sorted.length) return null;
    return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))];
  }

  // A node's rounds over time from its history's paths (each a list of
  // entries {at_ms, outcome, rtt_ns}): per round, the percentiles of the
  // RTTs answered and the loss over the last `window` rounds.
  function nodeSeries(paths, window = WINDOW) {
    const rounds = new Map(); // at_ms -> { rtts: [], probes, lost }
    for (const p of Array.isArray(paths) ? paths : []) {
      for (const e of p && Array.isArray(p.entries) ? p.entries : []) {
        if (!e || typeof e.at_ms !== "number") continue;
        if (e.outcome !== "success" && e.outcome !== "failure") continue;
        let r = rounds.get(e.at_ms);
        if (!r) rounds.set(e.at_ms, (r = { rtts: [], probes: 0, lost: 0 }));
        r.probes++;
        if (e.outcome === "failure") r.lost++;
        else if (typeof e.rtt_ns === "number") r.rtts.push(e.rtt_ns);
      }
    }
    const at = [...rounds.keys()].sort((a, b) => a - b);
    const points = at.map((t, i) => {
      const span = at.slice(Math.max(0, i - window + 1), i + 1).map((k) => rounds.get(k));
      const rtts = span.flatMap((r) => r.rtts).sort((a, b) => a - b);
      const probes = span.reduce((s, r) => s + r.probes, 0);
      const lost = span.reduce((s, r) => s + r.lost, 0);
      const point = { at_ms: t, probes, lost, loss: probes ? lost / probes : null };
      // A percentile only where the window holds enough answers for it.
      for (const p of PERCENTILES) point[p.key] = rtts.length >= Math.ceil(1 / (1 - p.q)) ? rank(rtts, p.q) : null;
      return point;
    });
    return { window, points };
  }

  function fmtMs(ns) {
    const ms = ns / 1e6;
    return ms >= 10 ? `${ms.toFixed(0)} ms` : `${ms.toFixed(ms >= 1 ? 1 : 2)} ms`;
  }

  function clock(ms) {
    const d = new Date(ms);
    return d.toTimeString().slice(0, 8);
  }

  function sized(canvas, fallbackW, fallbackH) {
    const dpr = window.devicePixelRatio || 1;
    const w = canvas.clientWidth || fallbackW;
    const h = canvas.clientHeight || fallbackH;
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    return { ctx, w, h };
  }

  // The node chart: loss as bars from the bottom (right axis, 0-100 %),
  // the percentiles as lines (left axis, 0 to the largest p99), the
  // first and last round's times below.
  function drawNodeChart(canvas, series, colours) {
    const { ctx, w, h } = sized(canvas, 420, 140);
    const pts = series.points;
    const pad = { l: 48, r: 34, t: 8, b: 16 };
    const pw = w - pad.l - pad.r;
    const ph = h - pad.t - pad.b;
    ctx.font = "10px sans-serif";
    ctx.fillStyle = colours.muted;
    ctx.strokeStyle = colours.line;
    ctx.strokeRect(pad.l + 0.5, pad.t + 0.5, pw, ph);
    if (!pts.length) {
      ctx.fillText("no rounds yet", pad.l + 6, pad.t + 14);
      return;
    }
    // One slot a round: its loss bar fills the slot, its percentiles sit
    // at the slot's middle, so nothing is drawn past the frame.
    const slot = pw / pts.length;
    const x = (i) => pad.l + (i + 0.5) * slot;
    const bw = Math.max(1, slot - 1);
    ctx.fillStyle = colours.failure;
    ctx.globalAlpha = 0.35;
    pts.forEach((p, i) => {
      if (p.loss) ctx.fillRect(pad.l + i * slot + 0.5, pad.t + ph * (1 - p.loss), bw, ph * p.loss);
    });
    ctx.globalAlpha = 1;
    const top = Math.max(1, ...pts.map((p) => p.p99 || p.p90 || p.p50 || 0));
    const y = (ns) => pad.t + ph * (1 - ns / top);
    for (const pc of PERCENTILES) {
      ctx.strokeStyle = pc.colour;
      ctx.lineWidth = 1.5;
      ctx.beginPath();
      let open = false;
      pts.forEach((p, i) => {
        const v = p[pc.key];
        if (v === null) {
          open = false;
          return;
        }
        if (open) ctx.lineTo(x(i), y(v));
        else ctx.moveTo(x(i), y(v));
        open = true;
      });
      ctx.stroke();
    }
    ctx.lineWidth = 1;
    ctx.fillStyle = colours.muted;
    ctx.textAlign = "right";
    ctx.fillText(fmtMs(top), pad.l - 4, pad.t + 9);
    ctx.fillText("0", pad.l - 4, pad.t + ph);
    ctx.textAlign = "left";
    ctx.fillText("100%", pad.l + pw + 3, pad.t + 9);
    ctx.fillText("loss", pad.l + pw + 3, pad.t + ph);
    ctx.fillText(clock(pts[0].at_ms), pad.l, h - 3);
    ctx.textAlign = "right";
    ctx.fillText(clock(pts[pts.length - 1].at_ms), pad.l + pw, h - 3);
    ctx.textAlign = "left";
  }

  // A node's loss over its strips (one string a path, a character a
  // round: S success, F failure, anything else not probed).
  function lossOfStrips(lanes) {
    let probes = 0;
    let lost = 0;
    for (const s of Array.isArray(lanes) ? lanes : []) {
      for (const c of typeof s === "string" ? s : "") {
        if (c === "S") probes++;
        else if (c === "F") {
          probes++;
          lost++;
        }
      }
    }
    return { probes, lost, loss: probes ? lost / probes : null };
  }

  // Squares of the heat map for `n` nodes in `width` pixels: as large as
  // the height bound allows, at least HEAT_MIN_CELL.
  function heatLayout(n, width) {
    const w = Math.max(40, width);
    let cell = Math.floor(Math.sqrt((w * HEAT_MAX_H) / Math.max(1, n)));
    cell = Math.max(HEAT_MIN_CELL, Math.min(HEAT_MAX_CELL, cell));
    const cols = Math.max(1, Math.floor(w / cell));
    const rows = Math.ceil(n / cols);
    return { cell, cols, rows, width: cols * cell, height: rows * cell };
  }

  // The colour of a loss share: the success colour at 0, then from amber
  // (any loss) to the failure colour (all lost); grey when not known.
  function heatColour(loss, colours) {
    if (loss === null) return colours.unknown;
    if (loss === 0) return colours.success;
    const t = Math.min(1, Math.max(0, loss));
    const a = [0xd6, 0x9e, 0x2e];
    const b = [0xc5, 0x30, 0x30];
    const c = a.map((v, i) => Math.round(v + (b[i] - v) * t));
    return `rgb(${c[0]},${c[1]},${c[2]})`;
  }

  // Draws `cells` ({loss}) in `layout`'s grid, row after row.
  function drawHeat(canvas, cells, layout, colours) {
    const dpr = window.devicePixelRatio || 1;
    canvas.style.width = `${layout.width}px`;
    canvas.style.height = `${layout.height}px`;
    canvas.width = Math.max(1, Math.round(layout.width * dpr));
    canvas.height = Math.max(1, Math.round(layout.height * dpr));
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    const gap = layout.cell >= 6 ? 1 : 0;
    cells.forEach((c, i) => {
      ctx.fillStyle = heatColour(c.loss, colours);
      const col = i % layout.cols;
      const row = Math.floor(i / layout.cols);
      ctx.fillRect(col * layout.cell, row * layout.cell, layout.cell - gap, layout.cell - gap);
    });
  }

  window.healthCharts = { WINDOW, nodeSeries, drawNodeChart, lossOfStrips, heatLayout, heatColour, drawHeat };
})();
