//! `health-agent status`, in the style of `cilium-health status`.

use std::{fmt::Write as _, time::Duration};

use clap::Args;

use super::{OutputFormat, SocketArgs, out};
use health_agent::{
    api::{client::Client, types::PROBE_DEADLINE_MAX},
    datapath::KernelReport,
    encryption::EncState,
    probe::{
        history::{EntryOutcome, HistoryStats, NodeHistory, NodeStats, WindowStats},
        path::{PathState, ProbeResult},
        status::{ClusterStatus, Connectivity, EncryptionSummary, NodeStatus},
    },
    util::{
        errors::chain,
        timefmt::{rfc3339, rfc3339_millis, short},
    },
};

#[derive(Debug, Args)]
#[allow(
    clippy::struct_excessive_bools,
    reason = "clap switches: each bool is a flag of the command line"
)]
pub(crate) struct StatusArgs {
    /// Per node and path: result, RTT, errors, and the loss ratio and RTT
    /// percentiles over the results the agent keeps.
    #[arg(short, long, conflicts_with_all = ["history", "quality", "cluster"])]
    verbose: bool,
    /// NODE's recent results, path by path: time, outcome, RTT, error (the
    /// agent keeps the last --history-length rounds).
    #[arg(long, value_name = "NODE", conflicts_with = "probe", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    history: Option<String>,
    /// NODE's paths over sliding windows of 1 minute, 10 minutes and 1
    /// hour: probes, loss with its 95 % confidence interval, RTT
    /// percentiles (p50 to p99.9, each once the window has enough
    /// samples), and whether the path is degraded.
    #[arg(long, value_name = "NODE", conflicts_with_all = ["probe", "history"], value_parser = clap::builder::NonEmptyStringValueParser::new())]
    quality: Option<String>,
    /// The cluster view instead of this node's: per node, its observers,
    /// how many reach it, and a verdict (node down, path degraded, observer
    /// problem, unknown); needs --kvstore etcd.
    #[arg(long, conflicts_with_all = ["probe", "history", "quality"])]
    cluster: bool,
    /// Ask for a fresh probe round instead of the last published one.
    #[arg(long)]
    probe: bool,
    /// Every node, even in a large cluster (past 50 nodes the table shows
    /// the counts and the first 100 nodes that are not reachable, failing
    /// first).
    #[arg(long, conflicts_with_all = ["history", "quality"])]
    all: bool,
    /// Follow the rounds: a row as each ends (its number, when it ended,
    /// how long it took, the node counts and the first nodes not
    /// reachable); with -o json, each round's summary as a line of JSON.
    /// Until interrupted, or --rounds; an agent that stops answering after
    /// it answered (a restart) is waited for, said once on stderr; one
    /// that never answered is an error.
    #[arg(long, conflicts_with_all = ["probe", "history", "quality", "cluster", "verbose", "all"])]
    watch: bool,
    /// With --watch: stop after this many rounds.
    #[arg(long, requires = "watch", value_name = "N", allow_negative_numbers = true,
          value_parser = clap::value_parser!(u64).range(1..))]
    rounds: Option<u64>,
    /// Deadline of a --probe round (at most 120s).
    #[arg(long, requires = "probe", default_value = "30s", allow_hyphen_values = true,
          value_parser = parse_probe_timeout)]
    probe_timeout: Duration,
    #[arg(short, long, value_enum, default_value_t)]
    output: OutputFormat,
    #[command(flatten)]
    socket: SocketArgs,
}

impl StatusArgs {
    pub(crate) async fn run(self) -> anyhow::Result<()> {
        let client = Client::new(self.socket.path);
        if self.watch {
            return watch::watch(&client, self.output, self.rounds, &mut std::io::stdout()).await;
        }
        if self.cluster {
            let view = client.cluster().await?;
            match self.output {
                OutputFormat::Json => out::print_line(&serde_json::to_string_pretty(&view)?)?,
                OutputFormat::Table => {
                    out::print(&super::cluster_view::render_reply(&view, self.all))?;
                }
            }
            return Ok(());
        }
        if let Some(node) = &self.quality {
            let quality = client.quality(node).await?;
            match self.output {
                OutputFormat::Json => out::print_line(&serde_json::to_string_pretty(&quality)?)?,
                OutputFormat::Table => out::print(&super::quality::render(&quality))?,
            }
            return Ok(());
        }
        if let Some(node) = &self.history {
            let history = client.history(node).await?;
            match self.output {
                OutputFormat::Json => out::print_line(&serde_json::to_string_pretty(&history)?)?,
                OutputFormat::Table => out::print(&render_history(&history))?,
            }
            return Ok(());
        }
        let status: ClusterStatus = if self.probe {
            client.probe(self.probe_timeout).await?
        } else {
            client.status().await?
        };
        let (kernel, figures) = if self.verbose {
            verbose_extras(&client).await
        } else {
            (None, None)
        };
        match self.output {
            OutputFormat::Json if self.verbose => {
                let verbose = VerboseStatus {
                    status: &status,
                    kernel: kernel.as_ref(),
                    window: figures.as_ref(),
                };
                out::print_line(&serde_json::to_string_pretty(&verbose)?)?;
            }
            OutputFormat::Json => out::print_line(&serde_json::to_string_pretty(&status)?)?,
            OutputFormat::Table => {
                if let Some(kernel) = &kernel {
                    out::print(&render_kernel(kernel))?;
                }
                out::print(&render(&status, self.verbose, self.all, figures.as_ref()))?;
            }
        }
        Ok(())
    }
}

/// `--probe-timeout`: a duration within the agent's limit.
fn parse_probe_timeout(s: &str) -> Result<Duration, String> {
    let d = health_agent::util::duration::parse(s)?;
    if d > PROBE_DEADLINE_MAX {
        return Err(format!("at most {PROBE_DEADLINE_MAX:?}, the agent's limit"));
    }
    Ok(d)
}

/// `status -v -o json`: the status, with the kernel's report and each
/// node's figures over the window beside it (each absent where the agent
/// could not give it).
#[derive(serde::Serialize)]
struct VerboseStatus<'a> {
    #[serde(flatten)]
    status: &'a ClusterStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    kernel: Option<&'a KernelReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    window: Option<&'a HistoryStats>,
}

/// What `-v` adds to the status, each from a request of its own (the
/// status itself stays as lean as the agent publishes it): the kernel's
/// report and the window's figures. One the agent does not give is left
/// out, said on stderr.
async fn verbose_extras(client: &Client) -> (Option<KernelReport>, Option<HistoryStats>) {
    let kernel = match client.healthz().await {
        Ok(h) => h.kernel,
        Err(e) => {
            eprintln!("warning: the kernel's report left out: {}", chain(&e));
            None
        }
    };
    let figures = match client.history_stats().await {
        Ok(f) => Some(f),
        Err(e) => {
            eprintln!("warning: the loss and RTT figures left out: {}", chain(&e));
            None
        }
    };
    (kernel, figures)
}

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
            let warn = match p.mtu_blackhole {
                Some(bytes) => format!("{warn}, MTU black hole: {bytes}-byte probes lost"),
                None => warn,
            };
            let warn = match p.partial_loss() {
                Some(partial) => format!("{warn}, {partial}"),
                None => warn,
            };
            if p.degraded {
                format!(
                    "Degraded (answers, but loses probes: status --quality NODE), RTT={}{source}{warn}",
                    rtt()
                )
            } else {
                format!("OK, RTT={}{source}{warn}", rtt())
            }
        }
        ProbeResult::Failure => {
            let error = p.last_error.as_deref().unwrap_or("unknown error");
            match &p.trace {
                Some(t) => format!("Failure: {error}; traced: {}", t.line()),
                None => format!("Failure: {error}"),
            }
        }
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

/// `stats`: the figures of the ICMP and HTTP paths, when known; `indent`:
/// the heading's (a secondary address is indented under its primary, as
/// `cilium-health status --verbose` has it).
fn connectivity(
    out: &mut String,
    indent: usize,
    what: &str,
    c: &Connectivity,
    stats: [Option<&WindowStats>; 2],
) {
    let _ = writeln!(out, "{:indent$}{what} connectivity to {}:", "", c.ip);
    let inner = indent + 2;
    if let Some(e) = &c.encryption {
        let peer = e
            .peer
            .as_deref()
            .map(|k| format!(" (peer {k})"))
            .unwrap_or_default();
        let why = e
            .reason
            .as_deref()
            .map(|r| format!(": {r}"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "{:inner$}{:<16} {}{peer}{why}",
            "", "Encryption:", e.state
        );
    }
    for (name, path, w) in [
        ("ICMP to stack:", &c.icmp, stats[0]),
        ("HTTP to agent:", &c.http, stats[1]),
    ] {
        let _ = writeln!(out, "{:inner$}{name:<16} {}", "", path_line(path));
        if let Some(w) = w {
            let _ = writeln!(out, "{:inner$}{:<16} {}", "", "", window_line(w));
        }
    }
}

/// The status's `Encryption:` line: addresses per state, or why the
/// device could not be judged against.
fn encryption_line(e: &EncryptionSummary) -> String {
    match (&e.device, &e.error) {
        (_, Some(err)) => format!("Encryption: WireGuard not checked: {err}"),
        (device, None) => {
            let counts: Vec<String> = EncState::ALL
                .iter()
                .filter_map(|st| {
                    let n = e.paths.get(st.name()).copied().unwrap_or(0);
                    (n > 0).then(|| format!("{n} {st}"))
                })
                .collect();
            format!(
                "Encryption: WireGuard ({}): {} addresses",
                device.as_deref().unwrap_or("?"),
                if counts.is_empty() {
                    "no".to_owned()
                } else {
                    counts.join(", ")
                }
            )
        }
    }
}

/// The node's encryption as the table's column shows it: the one state
/// of all its addresses, or each address's that differs from encrypted
/// (`plaintext host, not covered endpoint`).
fn encryption_cell(n: &NodeStatus) -> String {
    let labelled = [
        ("host", Some(&n.host)),
        ("endpoint", Some(&n.endpoint)),
        ("host6", n.host_secondary.as_deref()),
        ("endpoint6", n.endpoint_secondary.as_deref()),
    ];
    let states: Vec<(&str, EncState)> = labelled
        .iter()
        .filter_map(|(l, c)| Some((*l, (*c)?.encryption.as_ref()?.state)))
        .collect();
    let Some(first) = states.first() else {
        return "-".into();
    };
    if states.iter().all(|(_, s)| *s == first.1) {
        return first.1.to_string();
    }
    states
        .iter()
        .filter(|(_, s)| *s != EncState::Encrypted)
        .map(|(l, s)| format!("{s} {l}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The node's addresses as the table shows them: the primary, then the
/// secondary (`198.18.1.1,2001:2:0:1::1`), as `cilium-health status` does.
fn addresses(n: &NodeStatus) -> String {
    match &n.host_secondary {
        Some(c) => format!("{},{}", n.host.ip, c.ip),
        None => n.host.ip.to_string(),
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
        let _ = writeln!(
            out,
            "\n  {} ({}) to {}: {}",
            p.path,
            p.family,
            p.ip,
            window_line(&stats)
        );
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

/// The names of the nodes `shown`, the local one marked.
fn shown_names(s: &ClusterStatus, shown: &[&NodeStatus]) -> Vec<String> {
    shown
        .iter()
        .map(|n| {
            if s.local_node.as_deref() == Some(n.name.as_str()) {
                format!("{} (localhost)", n.name)
            } else {
                n.name.clone()
            }
        })
        .collect()
}

/// Past this many nodes, the table lists only those not reachable.
const LARGE: usize = 50;

/// The nodes not reachable a large cluster's table lists at most (the
/// failing first): a cluster just started has every node unknown.
const NOT_REACHABLE_SHOWN: usize = 100;

/// The nodes a table lists: every one, or past [`LARGE`] nodes (unless
/// `all`) the counts, written to `out`, and the first
/// [`NOT_REACHABLE_SHOWN`] nodes not reachable, failing first; with how
/// many more were left out.
fn selected<'a>(s: &'a ClusterStatus, all: bool, out: &mut String) -> (Vec<&'a NodeStatus>, usize) {
    let mut shown: Vec<&NodeStatus> = s.nodes.iter().collect();
    if s.nodes.len() <= LARGE || all {
        return (shown, 0);
    }
    let sum = s.summary();
    let _ = writeln!(
        out,
        "{} reachable, {} unreachable, {} unknown; not reachable below, failing first (--all for every node)",
        sum.reachable, sum.unreachable, sum.unknown
    );
    // A path that is reachable but not encrypted is a problem too.
    shown.retain(|n| !n.reachable() || n.encryption().is_some_and(EncState::is_problem));
    shown.sort_by_key(|n| (n.state() != ProbeResult::Failure, n.name.as_str()));
    let more = shown.len().saturating_sub(NOT_REACHABLE_SHOWN);
    shown.truncate(NOT_REACHABLE_SHOWN);
    (shown, more)
}

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
    if let Some(e) = &s.encryption {
        let _ = writeln!(out, "{}", encryption_line(e));
    }
    let (shown, more) = selected(s, all, &mut out);
    // As wide as the widest address shown (an IPv6 one, or both of a
    // dual-stack node), never narrower than an IPv4 address.
    let ips: Vec<String> = shown.iter().map(|n| addresses(n)).collect();
    let width = ips.iter().map(String::len).max().unwrap_or(0).max(15);
    // As wide as the longest name shown, with its "(localhost)".
    let names = shown_names(s, &shown);
    let name_w = names
        .iter()
        .map(|n| n.chars().count())
        .max()
        .unwrap_or(0)
        .max(20);
    let encrypted = s.encryption.is_some();
    let _ = writeln!(
        out,
        "  {:<name_w$} {:<width$} {:<12} {}",
        "NAME",
        "IP",
        "NODE",
        if encrypted {
            "ENDPOINTS    ENCRYPTION"
        } else {
            "ENDPOINTS"
        }
    );
    for ((n, ip), name) in shown.iter().zip(&ips).zip(&names) {
        let local = s.local_node.as_deref() == Some(n.name.as_str());
        // Over every family probed: a node is reachable when all its
        // paths are.
        let endpoints = word(n.state_of(true));
        let _ = if encrypted && !local {
            writeln!(
                out,
                "  {name:<name_w$} {ip:<width$} {:<12} {endpoints:<12} {}",
                word(n.state_of(false)),
                encryption_cell(n)
            )
        } else {
            writeln!(
                out,
                "  {name:<name_w$} {ip:<width$} {:<12} {endpoints}",
                word(n.state_of(false)),
            )
        };
    }
    if more > 0 {
        let _ = writeln!(
            out,
            "  ... and {more} more not reachable (--all lists every node, -o json gives them all)"
        );
    }
    if verbose {
        // Both lists are in the node set's order.
        let by_name: std::collections::HashMap<&str, &NodeStats> = stats
            .map(|s| s.nodes.iter().map(|n| (n.name.as_str(), n)).collect())
            .unwrap_or_default();
        for n in &shown {
            let figures = by_name.get(n.name.as_str());
            let w = figures.map(|s| &s.paths);
            let w2 = figures.and_then(|s| s.secondary.as_ref());
            let path = |i: usize| w.map(|w| &w[i]);
            let path2 = |i: usize| w2.map(|w| &w[i]);
            let _ = writeln!(out, "\n  {} ({}):", n.name, addresses(n));
            connectivity(&mut out, 4, "Host", &n.host, [path(0), path(1)]);
            if let Some(c) = &n.host_secondary {
                connectivity(&mut out, 6, "Secondary", c, [path2(0), path2(1)]);
            }
            connectivity(&mut out, 4, "Endpoint", &n.endpoint, [path(2), path(3)]);
            if let Some(c) = &n.endpoint_secondary {
                connectivity(&mut out, 6, "Secondary", c, [path2(2), path2(3)]);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
mod watch;
