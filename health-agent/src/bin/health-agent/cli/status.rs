//! `health-agent status`, in the style of `cilium-health status`.

use std::{fmt::Write as _, time::Duration};

use clap::Args;

use super::{OutputFormat, SocketArgs};
use health_agent::{
    api::client::Client,
    datapath::KernelReport,
    probe::{
        path::{PathState, ProbeResult},
        status::{ClusterStatus, Connectivity, NodeStatus},
    },
    util::timefmt::{rfc3339, short},
};

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// Per node and path: result, RTT, errors.
    #[arg(short, long)]
    verbose: bool,
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
                print!("{}", render(&status, self.verbose, self.all));
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

fn connectivity(out: &mut String, what: &str, c: &Connectivity) {
    let _ = writeln!(out, "    {what} connectivity to {}:", c.ip);
    let _ = writeln!(out, "      ICMP to stack:   {}", path_line(&c.icmp));
    let _ = writeln!(out, "      HTTP to agent:   {}", path_line(&c.http));
}

/// Past this many nodes, the table lists only those not reachable.
const LARGE: usize = 50;

/// The human form of a status.
#[must_use]
pub(crate) fn render(s: &ClusterStatus, verbose: bool, all: bool) -> String {
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
        for n in &shown {
            let _ = writeln!(out, "\n  {} ({}):", n.name, n.host.ip);
            connectivity(&mut out, "Host", &n.host);
            connectivity(&mut out, "Endpoint", &n.endpoint);
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
        let text = render(&status(60), false, false);
        assert!(
            text.contains("57 reachable, 2 unreachable, 1 unknown"),
            "{text}"
        );
        assert_eq!(rows(&text), ["node-040", "node-041", "node-005"], "{text}");
        assert_eq!(rows(&render(&status(60), false, true)).len(), 60);
    }

    #[test]
    fn a_small_cluster_shows_every_node_in_order() {
        let text = render(&status(45), false, false);
        assert_eq!(rows(&text).len(), 45, "{text}");
        assert!(!text.contains("--all"), "{text}");
    }
}
