//! `health-agent status`, in the style of `cilium-health status`.

use std::{fmt::Write as _, time::Duration};

use clap::Args;

use super::{OutputFormat, SocketArgs};
use health_agent::{
    api::client::Client,
    datapath::KernelReport,
    probe::{
        history::{EntryOutcome, HistoryStats, NodeHistory, NodeStats, WindowStats},
        path::{PathState, ProbeResult},
        status::{ClusterStatus, Connectivity, NodeStatus},
    },
    util::timefmt::{rfc3339, rfc3339_millis, short},
};

#[derive(Debug, Args)]
#[allow(
    clippy::struct_excessive_bools,
    reason = "clap switches: each bool is a flag of the command line"
)]
pub(crate) struct StatusArgs {
    /// Per node and path: result, RTT, errors, and the loss ratio and RTT
    /// percentiles over the results the agent keeps.
    #[arg(short, long)]
    verbose: bool,
    /// NODE's recent results, path by path: time, outcome, RTT, error (the
    /// agent keeps the last --history-length rounds).
    #[arg(long, value_name = "NODE", conflicts_with = "probe")]
    history: Option<String>,
    /// The cluster view instead of this node's: per node, its observers,
    /// how many reach it, and a verdict (node down, path degraded, observer
    /// problem, unknown); needs --kvstore etcd.
    #[arg(long, conflicts_with_all = ["probe", "history"])]
    cluster: bool,
    /// Ask for a fresh probe round instead of the last published one.
    #[arg(long)]
    probe: bool,
    /// Every node, even in a large cluster (past 50 nodes the table shows
    /// the counts and the nodes that are not reachable, failing first).
    #[arg(long)]
    all: bool,
    /// Deadline of a --probe round.
    #[arg(long, default_value = "30s", value_parser = health_agent::util::duration::parse)]
    probe_timeout: Duration,
    #[arg(short, long, value_enum, default_value_t)]
    output: OutputFormat,
    #[command(flatten)]
    socket: SocketArgs,
}

impl StatusArgs {
    pub(crate) async fn run(self) -> anyhow::Result<()> {
        let client = Client::new(self.socket.path);
        if self.cluster {
            let view = client.cluster().await?;
            match self.output {
                OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&view)?),
                OutputFormat::Table => print!("{}", super::cluster_view::render(&view, self.all)),
            }
            return Ok(());
        }
        if let Some(node) = &self.history {
            let history = client.history(node).await?;
            match self.output {
                OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&history)?),
                OutputFormat::Table => print!("{}", render_history(&history)),
            }
            return Ok(());
        }
        let status: ClusterStatus = if self.probe {
            client.probe(self.probe_timeout).await?
        } else {
            client.status().await?
        };
        match self.output {
            OutputFormat::Json => println!("{}", serde_json::to_string_pretty(&status)?),
            OutputFormat::Table => {
                if self.verbose
                    && let Some(kernel) = client.healthz().await.ok().and_then(|h| h.kernel)
                {
                    print!("{}", render_kernel(&kernel));
                }
                // The window's figures come from their own request: the
                // status itself stays as lean as the agent publishes it.
                let figures = if self.verbose {
                    client.history_stats().await.ok()
                } else {
                    None
                };
                print!(
                    "{}",
                    render(&status, self.verbose, self.all, figures.as_ref())
                );
            }
        }
        Ok(())
    }
}

/// The kernel and how each program is attached (`status --verbose`).
fn render_kernel(k: &KernelReport) -> String {
    let yes = |b: bool| if b { "yes" } else { "no" };
    let mut out = format!(
        "Kernel:           {} (tcx: {}, BTF: {}); --attach {} -> {}\n",
        k.features.release,
        yes(k.features.tcx),
        yes(k.features.btf),
        k.policy,
        k.tc_hook
    );
    for p in &k.programs {
        let detail = p
            .detail
            .as_ref()
            .map(|d| format!(" ({d})"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  {:<20} {:<12} on {}{detail}",
            p.program, p.attach, p.interface
        );
    }
    out
}

fn word(r: ProbeResult) -> &'static str {
    match r {
        ProbeResult::Success => "reachable",
        ProbeResult::Failure => "unreachable",
        ProbeResult::Unknown => "unknown",
    }
}

fn path_line(p: &PathState) -> String {
    let rtt = || {
        p.rtt_ns
            .map(|ns| short(Duration::from_nanos(ns)))
            .unwrap_or_default()
    };
    let source = p
        .rtt_source
        .map(|s| {
            format!(
                " ({})",
                serde_json::to_value(s)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default()
            )
        })
        .unwrap_or_default();
    match p.result {
        ProbeResult::Success => {
            let warn = p
                .warning
                .as_ref()
                .map(|w| format!(", warning: {w}"))
                .unwrap_or_default();
            format!("OK, RTT={}{source}{warn}", rtt())
        }
        ProbeResult::Failure => format!(
            "Failure: {}",
            p.last_error.as_deref().unwrap_or("unknown error")
        ),
        ProbeResult::Unknown if p.probes == 0 => "Unknown (not probed yet)".to_owned(),
        ProbeResult::Unknown => format!(
            "Unknown ({} of the failure threshold; last: {})",
            p.consecutive_failures,
            p.last_error.as_deref().unwrap_or("-")
        ),
    }
}

fn percent(ratio: Option<f64>) -> String {
    ratio.map_or_else(|| "-".to_owned(), |r| format!("{:.1}%", r * 100.0))
}

fn rtt(ns: Option<u64>) -> String {
    ns.map_or_else(|| "-".to_owned(), |ns| short(Duration::from_nanos(ns)))
}

/// A path's figures over the window, for the line under its result.
fn window_line(w: &WindowStats) -> String {
    format!(
        "last {} results: loss {}, RTT p50 {} p99 {}",
        w.results,
        percent(w.loss_ratio),
        rtt(w.rtt_p50_ns),
        rtt(w.rtt_p99_ns)
    )
}

/// `stats`: the figures of the ICMP and HTTP paths, when known.
fn connectivity(out: &mut String, what: &str, c: &Connectivity, stats: [Option<&WindowStats>; 2]) {
    let _ = writeln!(out, "    {what} connectivity to {}:", c.ip);
    for (name, path, w) in [
        ("ICMP to stack:", &c.icmp, stats[0]),
        ("HTTP to agent:", &c.http, stats[1]),
    ] {
        let _ = writeln!(out, "      {name:<16} {}", path_line(path));
        if let Some(w) = w {
            let _ = writeln!(out, "      {:<16} {}", "", window_line(w));
        }
    }
}

/// `status --history NODE`: the node's paths, oldest result first.
#[must_use]
pub(crate) fn render_history(h: &NodeHistory) -> String {
    let mut out = format!(
        "History of {} (the agent keeps the last {} rounds)\n",
        h.node, h.window
    );
    for p in &h.paths {
        let stats = WindowStats {
            results: p.entries.len(),
            loss_ratio: p.loss_ratio,
            rtt_p50_ns: p.rtt_p50_ns,
            rtt_p99_ns: p.rtt_p99_ns,
        };
        let _ = writeln!(out, "\n  {} to {}: {}", p.path, p.ip, window_line(&stats));
        if p.entries.is_empty() {
            let _ = writeln!(out, "    (not probed yet)");
            continue;
        }
        let _ = writeln!(
            out,
            "    {:<24} {:<8} {:<10} ERROR",
            "TIME", "OUTCOME", "RTT"
        );
        for e in &p.entries {
            let outcome = match e.outcome {
                EntryOutcome::Success => "success",
                EntryOutcome::Failure => "failure",
            };
            let line = format!(
                "    {:<24} {outcome:<8} {:<10} {}",
                rfc3339_millis(e.at_ms),
                e.rtt_ns
                    .map(|ns| short(Duration::from_nanos(ns)))
                    .unwrap_or_default(),
                e.error.as_deref().unwrap_or_default()
            );
            let _ = writeln!(out, "{}", line.trim_end());
        }
    }
    out
}

/// Past this many nodes, the table lists only those not reachable.
const LARGE: usize = 50;

/// The human form of a status.
#[must_use]
pub(crate) fn render(
    s: &ClusterStatus,
    verbose: bool,
    all: bool,
    stats: Option<&HistoryStats>,
) -> String {
    let mut out = String::new();
    let when = s.round.as_ref().map_or_else(
        || "no probe round finished yet".to_owned(),
        |r| rfc3339(r.started_ms),
    );
    let _ = writeln!(
        out,
        "Cluster health: {}/{} reachable ({when}) (Probe interval: {})",
        s.reachable(),
        s.nodes.len(),
        short(Duration::from_millis(s.probe_interval_ms))
    );
    if let Some(r) = &s.round {
        let _ = writeln!(
            out,
            "Last round: {} probes in {}",
            r.probes,
            short(Duration::from_millis(r.duration_ms))
        );
    }
    let mut shown: Vec<&NodeStatus> = s.nodes.iter().collect();
    if s.nodes.len() > LARGE && !all {
        let sum = s.summary();
        let _ = writeln!(
            out,
            "{} reachable, {} unreachable, {} unknown; not reachable below, failing first (--all for every node)",
            sum.reachable, sum.unreachable, sum.unknown
        );
        shown.retain(|n| !n.reachable());
        shown.sort_by_key(|n| (n.state() != ProbeResult::Failure, n.name.as_str()));
    }
    let _ = writeln!(
        out,
        "  {:<20} {:<16} {:<12} ENDPOINTS",
        "NAME", "IP", "NODE"
    );
    for n in &shown {
        let local = if s.local_node.as_deref() == Some(n.name.as_str()) {
            " (localhost)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "  {:<20} {:<16} {:<12} {}",
            format!("{}{local}", n.name),
            n.host.ip,
            word(n.host.summary()),
            word(n.endpoint.summary())
        );
    }
    if verbose {
        // Both lists are in the node set's order.
        let by_name: std::collections::HashMap<&str, &NodeStats> = stats
            .map(|s| s.nodes.iter().map(|n| (n.name.as_str(), n)).collect())
            .unwrap_or_default();
        for n in &shown {
            let w = by_name.get(n.name.as_str()).map(|s| &s.paths);
            let path = |i: usize| w.map(|w| &w[i]);
            let _ = writeln!(out, "\n  {} ({}):", n.name, n.host.ip);
            connectivity(&mut out, "Host", &n.host, [path(0), path(1)]);
            connectivity(&mut out, "Endpoint", &n.endpoint, [path(2), path(3)]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use health_agent::probe::path::PathState;

    use super::*;

    fn node(name: &str, result: ProbeResult) -> NodeStatus {
        let path = PathState {
            result,
            ..PathState::default()
        };
        let c = Connectivity {
            ip: Ipv4Addr::new(198, 18, 0, 1),
            icmp: path.clone(),
            http: path,
        };
        NodeStatus {
            name: name.into(),
            host: c.clone(),
            endpoint: c,
        }
    }

    fn status(n: usize) -> ClusterStatus {
        let mut nodes: Vec<NodeStatus> = (0..n)
            .map(|i| node(&format!("node-{i:03}"), ProbeResult::Success))
            .collect();
        nodes[5] = node("node-005", ProbeResult::Unknown);
        nodes[40] = node("node-040", ProbeResult::Failure);
        nodes[41] = node("node-041", ProbeResult::Failure);
        ClusterStatus {
            local_node: None,
            probe_interval_ms: 60_000,
            probe_timeout_ms: 1_000,
            round: None,
            nodes,
        }
    }

    fn rows(text: &str) -> Vec<&str> {
        text.lines()
            .filter(|l| l.starts_with("  node-"))
            .map(|l| l.split_whitespace().next().unwrap_or_default())
            .collect()
    }

    #[test]
    fn a_large_cluster_shows_counts_and_the_nodes_not_reachable_failing_first() {
        let text = render(&status(60), false, false, None);
        assert!(
            text.contains("57 reachable, 2 unreachable, 1 unknown"),
            "{text}"
        );
        assert_eq!(rows(&text), ["node-040", "node-041", "node-005"], "{text}");
        assert_eq!(rows(&render(&status(60), false, true, None)).len(), 60);
    }

    fn window(results: usize, loss: f64, p50: u64, p99: u64) -> WindowStats {
        WindowStats {
            results,
            loss_ratio: Some(loss),
            rtt_p50_ns: Some(p50),
            rtt_p99_ns: Some(p99),
        }
    }

    #[test]
    fn verbose_shows_each_paths_figures_over_the_window() {
        let s = status(45);
        let mut stats = HistoryStats {
            window: 60,
            nodes: s
                .nodes
                .iter()
                .map(|n| NodeStats {
                    name: n.name.clone(),
                    paths: [WindowStats::default(); 4],
                })
                .collect(),
        };
        stats.nodes[40].paths = [
            window(60, 0.25, 120_000, 2_500_000),
            window(60, 0.0, 300_000, 400_000),
            WindowStats::default(),
            window(12, 1.0, 0, 0),
        ];
        stats.nodes[40].paths[3].rtt_p50_ns = None;
        stats.nodes[40].paths[3].rtt_p99_ns = None;
        let text = render(&s, true, false, Some(&stats));
        let block: Vec<&str> = text
            .split("\n\n")
            .find(|b| b.trim_start().starts_with("node-040"))
            .expect("node-040's block")
            .lines()
            .collect();
        assert_eq!(
            block[3].trim(),
            "last 60 results: loss 25.0%, RTT p50 120µs p99 2.5ms",
            "{block:#?}"
        );
        assert_eq!(
            block[5].trim(),
            "last 60 results: loss 0.0%, RTT p50 300µs p99 400µs"
        );
        assert_eq!(block[8].trim(), "last 0 results: loss -, RTT p50 - p99 -");
        assert_eq!(
            block[10].trim(),
            "last 12 results: loss 100.0%, RTT p50 - p99 -"
        );
        // Without the figures (an older agent), the paths alone.
        let plain = render(&s, true, false, None);
        assert!(!plain.contains("results: loss"), "{plain}");
        assert!(plain.contains("ICMP to stack:   Failure"), "{plain}");
    }

    #[test]
    fn history_lists_each_paths_results_oldest_first() {
        use health_agent::probe::history::{HistoryEntry, PathHistory};
        let entry = |at_ms, error: Option<&str>| HistoryEntry {
            at_ms,
            outcome: if error.is_some() {
                EntryOutcome::Failure
            } else {
                EntryOutcome::Success
            },
            rtt_ns: error.is_none().then_some(150_000),
            error: error.map(str::to_owned),
        };
        let path = |name: &str, entries: Vec<HistoryEntry>| PathHistory {
            path: name.to_owned(),
            ip: Ipv4Addr::new(198, 18, 0, 3),
            loss_ratio: (!entries.is_empty()).then_some(0.5),
            rtt_p50_ns: Some(150_000),
            rtt_p99_ns: Some(150_000),
            entries,
        };
        let h = NodeHistory {
            node: "node-3".into(),
            window: 60,
            paths: vec![
                path(
                    "host-icmp",
                    vec![
                        entry(1_790_000_000_000, None),
                        entry(1_790_000_001_500, Some("timeout")),
                    ],
                ),
                path("host-http", Vec::new()),
            ],
        };
        let text = render_history(&h);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "History of node-3 (the agent keeps the last 60 rounds)"
        );
        assert_eq!(
            lines[2],
            "  host-icmp to 198.18.0.3: last 2 results: loss 50.0%, RTT p50 150µs p99 150µs"
        );
        assert!(
            lines[3].contains("TIME") && lines[3].contains("ERROR"),
            "{text}"
        );
        assert_eq!(
            lines[4].split_whitespace().collect::<Vec<_>>(),
            ["2026-09-21T14:13:20.000Z", "success", "150µs"]
        );
        assert_eq!(
            lines[5].split_whitespace().collect::<Vec<_>>(),
            ["2026-09-21T14:13:21.500Z", "failure", "timeout"]
        );
        assert!(
            text.contains("host-http to 198.18.0.3: last 0 results"),
            "{text}"
        );
        assert!(text.contains("(not probed yet)"), "{text}");
    }

    #[test]
    fn a_small_cluster_shows_every_node_in_order() {
        let text = render(&status(45), false, false, None);
        assert_eq!(rows(&text).len(), 45, "{text}");
        assert!(!text.contains("--all"), "{text}");
    }
}
