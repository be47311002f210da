//! The run's report, as printed, each figure beside its target.

use std::{fmt::Write as _, time::Duration};

use health_agent::cluster::cadence::HEARTBEAT_ROUNDS;

use super::{
    Cluster, FAULT_ROUND, INTERVAL_MS, NODE_DOWN_ROUNDS, Options, SUMMARY_BUDGET, VIEW_BUDGET,
    VIEW_WIRE_FAULTS, VIEW_WIRE_STEADY, ratio,
};

use super::selection::{LeaderCheck, Selection};

use super::faults::Faults;

use super::rounds::Rounds;

fn pass(ok: bool) -> &'static str {
    if ok { "PASS" } else { "FAIL" }
}

pub(super) fn render(
    opts: &Options,
    zones: usize,
    c: &Cluster,
    f: &Faults,
    sel: &Selection,
    r: &Rounds,
) -> String {
    let mut s = String::new();
    render_selection(&mut s, opts, zones, c, sel);
    render_rounds(&mut s, opts, c, f, r);
    s
}

fn render_selection(s: &mut String, opts: &Options, zones: usize, c: &Cluster, sel: &Selection) {
    let (n, k) = (opts.nodes, opts.peers);
    let zmin = c.zone_size.iter().min().copied().unwrap_or(0);
    let zmax = c.zone_size.iter().max().copied().unwrap_or(0);
    let _ = writeln!(
        s,
        "cluster-sim: {n} nodes in {zones} zones of {zmin}-{zmax}, K = {k}, {} rounds, failure threshold {}",
        opts.rounds, opts.failure_threshold
    );
    let _ = writeln!(
        s,
        "\nselection ({:.2} s for every node, {} CPUs)",
        sel.time.as_secs_f64(),
        std::thread::available_parallelism().map_or(1, usize::from)
    );
    let _ = writeln!(
        s,
        "  probes per node per round: max {}, mean {:.1}; max / 4·(K + zone) = {:.2}  [{}: ≤ 1]",
        sel.probes_max,
        sel.probes_mean,
        sel.budget_ratio,
        pass(sel.budget_ratio <= 1.0)
    );
    let _ = writeln!(
        s,
        "  probes per round, cluster-wide: {} ({:.4} % of the full mesh's {})",
        sel.cluster_probes,
        100.0 * ratio(sel.cluster_probes, sel.full_mesh_probes),
        sel.full_mesh_probes
    );
    let _ = writeln!(
        s,
        "  observers per node: min {}, mean {:.1}  [{}: min ≥ K/2 = {}]",
        sel.observers_min,
        sel.observers_mean,
        pass(sel.observers_min >= k / 2),
        k / 2
    );
    for (what, m) in [("join", &sel.join), ("leave", &sel.leave)] {
        let _ = writeln!(
            s,
            "  a {what}: {} of {} probers changed ({:.5}; K/N = {:.5}, (K + zone)/N = {:.5}), {} of {} picks moved ({:.6}; 1/N = {:.6})",
            m.changed,
            m.probers,
            ratio(m.changed, m.probers),
            ratio(k, n),
            ratio(k, n) + ratio(n, zones * n),
            m.moved,
            m.picks,
            ratio(m.moved, m.picks),
            ratio(1, n)
        );
    }
    render_leader(s, n, &sel.leader);
}

fn render_leader(s: &mut String, nodes: usize, l: &LeaderCheck) {
    let _ = writeln!(
        s,
        "  the leader's check of what observers may report: {:.2} s for all {nodes} the first time (on every CPU but one); a round on one CPU: {:.0} ms with every summary new, {:.1} ms with none; a join {:.1} ms ({} observers selected again), a leave {:.1} ms ({})",
        l.first.as_secs_f64(),
        l.round_new.as_secs_f64() * 1e3,
        l.round_same.as_secs_f64() * 1e3,
        l.join.as_secs_f64() * 1e3,
        l.join_selected,
        l.leave.as_secs_f64() * 1e3,
        l.leave_selected
    );
}

fn render_rounds(out: &mut String, opts: &Options, c: &Cluster, faults: &Faults, r: &Rounds) {
    let n = opts.nodes;
    let t = &r.tracker;
    let _ = writeln!(
        out,
        "\nfaults from round {FAULT_ROUND}: rounds until the right verdict (counting round {FAULT_ROUND} as 1; the path states need {} failed rounds)",
        opts.failure_threshold
    );
    for fault in [
        "node down",
        "link down",
        "zone partition",
        "flapping observer",
        "dropping observer",
    ] {
        let rounds = t
            .first_right
            .get(fault)
            .map(|&first| first + 1 - FAULT_ROUND);
        let view_delay = rounds.map(|x| x.saturating_sub(opts.failure_threshold.max(1) - 1));
        let shown = rounds.map_or_else(
            || "never".to_owned(),
            |x| {
                if fault == "node down" {
                    format!("{x} (read from every observer's last probes)")
                } else {
                    format!(
                        "{x} (the view: {} after the states turned)",
                        view_delay.unwrap_or(0)
                    )
                }
            },
        );
        // A node down is read from every observer's last probes, not from
        // the states: it is due within two rounds of the fault whatever
        // the threshold.
        let target = if fault == "node down" {
            format!(
                "  [{}: within {NODE_DOWN_ROUNDS} rounds of the fault]",
                pass(rounds.is_some_and(|d| d <= NODE_DOWN_ROUNDS))
            )
        } else {
            String::new()
        };
        let _ = writeln!(out, "  {fault:<18} {shown}{target}");
    }
    let _ = writeln!(
        out,
        "  (nodes: down {}, link {} – {}, zone {} partitioned, flapping {}, dropping {})",
        c.nodes[faults.down].name,
        c.nodes[faults.a].name,
        c.nodes[faults.b].name,
        faults.partition,
        c.nodes[faults.flap].name,
        c.nodes[faults.deaf].name
    );
    let _ = writeln!(
        out,
        "  wrong verdicts: {} over {} node-rounds  [{}: 0]; converging verdicts (healthy or degraded before right): {}",
        t.wrong.len(),
        n * opts.rounds as usize,
        pass(t.wrong.is_empty()),
        t.converging
    );
    for (round, name, v) in t.wrong.iter().take(10) {
        let _ = writeln!(out, "    round {round}: {name} {v:?}");
    }
    let _ = writeln!(out, "  last round's view: {}", r.last_counts);
    let budget = n * SUMMARY_BUDGET;
    let _ = writeln!(
        out,
        "\netcd writes per round (summary values): max {} B, mean {:.0} B, largest summary {} B  [{}: ≤ {n} × 1.5 KiB = {budget} B]",
        r.bytes_max,
        r.bytes_mean,
        r.summary_max,
        pass(r.bytes_max <= budget)
    );
    render_puts(out, n, r);
    render_memory(out, r);
    let _ = writeln!(
        out,
        "time: summaries made and encoded {:.2} s, decoded and assembled {:.2} s, over {} rounds",
        r.publish_time.as_secs_f64(),
        r.assemble_time.as_secs_f64(),
        opts.rounds
    );
    render_assembler(out, opts, r);
}

/// Summaries written: etcd puts a round and a second, steady and with the
/// faults on. A round of the simulation is one of the agent's publisher
/// ticks: the liveness interval, 3 s by default with a subset of peers.
fn render_puts(out: &mut String, n: usize, r: &Rounds) {
    #[expect(
        clippy::cast_precision_loss,
        reason = "millisecond counts far below 2^52"
    )]
    let tick_s = INTERVAL_MS as f64 / 1000.0;
    let _ = writeln!(
        out,
        "summaries written (etcd puts), when an agent's verdicts change and every {HEARTBEAT_ROUNDS} ticks as a heartbeat:"
    );
    for (what, (mean, max)) in [
        ("before the faults", r.puts_steady),
        ("with the faults on", r.puts_faults),
    ] {
        let _ = writeln!(
            out,
            "  {what}: {mean:.0} a tick (max {max}; {:.1} % of the {n} agents), {:.0}/s at the default {tick_s} s tick (the liveness interval)",
            100.0 * mean / ratio(n.max(1), 1),
            mean / tick_s,
        );
    }
    let _ = writeln!(
        out,
        "  bytes written: {:.0} B a tick (every summary every tick would be {:.0} B)",
        r.put_bytes_mean, r.bytes_mean
    );
}

/// The elected assembler's figures: what the leader and every other agent
/// download a round, the leader's CPU, the cluster's etcd egress.
fn render_assembler(out: &mut String, opts: &Options, r: &Rounds) {
    let n = opts.nodes;
    let rounds = opts.rounds.max(1);
    let leader_cpu = (r.assemble_time + r.encode_time) / rounds;
    // The leader's watch delivers the summaries written, not every one.
    let summaries = r.put_bytes_mean;
    #[expect(clippy::cast_precision_loss, reason = "byte counts far below 2^52")]
    let egress_of = |view: usize| summaries + (n.saturating_sub(1) * view) as f64;
    let steady = egress_of(r.view_wire_steady);
    let egress = egress_of(r.view_wire_faults.max(r.view_wire_steady));
    #[expect(clippy::cast_precision_loss, reason = "byte counts far below 2^52")]
    let budget = 2.0 * summaries + (n * VIEW_WIRE_STEADY) as f64;
    let _ = writeln!(
        out,
        "
the elected assembler (the view published once a round under one key, read by every other agent):"
    );
    let _ = writeln!(
        out,
        "  a non-leader downloads the view: {} B a round before the faults  [{}: ≤ 64 KiB], at most {} B with the faults on (a zone partitioned among them)  [{}: ≤ 1 MiB]",
        r.view_wire_steady,
        pass(r.view_wire_steady <= VIEW_WIRE_STEADY),
        r.view_wire_faults,
        pass(r.view_wire_faults <= VIEW_WIRE_FAULTS)
    );
    let _ = writeln!(
        out,
        "  the leader downloads the summaries, {summaries:.0} B a round, and spends {:.0} ms a round decoding, assembling and encoding  [{}: ≤ 1 s]",
        leader_cpu.as_secs_f64() * 1e3,
        pass(leader_cpu <= Duration::from_secs(1))
    );
    let _ = writeln!(
        out,
        "  the cluster's etcd egress a round: the summaries to the leader and the view to {} agents, {steady:.0} B before the faults ({:.2}x the summaries written), {egress:.0} B with them ({:.2}x)  [{}: ≤ 2x the summaries + 64 KiB an agent = {budget:.0} B]",
        n.saturating_sub(1),
        steady / summaries.max(1.0),
        egress / summaries.max(1.0),
        pass(egress <= budget)
    );
}

/// The memory of the view, its assembly and the summaries held.
fn render_memory(out: &mut String, r: &Rounds) {
    let mib = |b: usize| ratio(b, 1 << 20);
    let _ = writeln!(
        out,
        "one agent's cluster view: {:.1} MiB allocated (by capacities: {:.1} MiB)  [{}: ≤ 64 MiB]",
        mib(r.view_bytes),
        mib(r.view_estimate),
        pass(r.view_bytes.max(r.view_estimate) <= VIEW_BUDGET)
    );
    let _ = writeln!(
        out,
        "  the assembly's peak: {:.1} MiB allocated at once (one decoded summary at a time, the observations, the view)",
        mib(r.peak_bytes)
    );
    let _ = writeln!(
        out,
        "the elected assembler's summaries, held decoded between rounds: {:.1} MiB ({} summaries, {:.0} B each, their peers' names shared)",
        mib(r.held_bytes),
        r.held,
        ratio(r.held_bytes, r.held)
    );
}
