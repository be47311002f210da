//! `health-agent status --cluster`: the cluster view as a table, the nodes
//! with a problem first.

use std::fmt::Write as _;

use health_agent::cluster::{
    view::{ClusterView, NodeView, Verdict},
    view_cell::ClusterReply,
};

/// Past this many nodes, only those with a problem are listed (all with
/// `--all`).
const LIST_ALL_UP_TO: usize = 50;

fn verdict(v: Verdict) -> &'static str {
    match v {
        Verdict::Healthy => "healthy",
        Verdict::NodeDown => "node down",
        Verdict::PathDegraded => "path degraded",
        Verdict::ObserverProblem => "observer problem",
        Verdict::Unknown => "unknown",
    }
}

fn detail(n: &NodeView) -> String {
    let mut d = String::new();
    if !n.failing_observers.is_empty() {
        let _ = write!(d, "failing from: {}", n.failing_observers.join(", "));
        if n.failing as usize > n.failing_observers.len() {
            let _ = write!(d, " (+{})", n.failing as usize - n.failing_observers.len());
        }
    }
    if !n.unreached_nodes.is_empty() {
        if !d.is_empty() {
            d.push_str("; ");
        }
        let _ = write!(d, "fails towards: {}", n.unreached_nodes.join(", "));
        if n.unreached as usize > n.unreached_nodes.len() {
            let _ = write!(d, " (+{})", n.unreached as usize - n.unreached_nodes.len());
        }
    }
    if !n.reporting {
        if !d.is_empty() {
            d.push_str("; ");
        }
        d.push_str("publishes no summary");
    }
    if n.plaintext > 0 {
        if !d.is_empty() {
            d.push_str("; ");
        }
        let _ = write!(d, "reached in plain text by {}", n.plaintext);
    }
    d
}

/// The published view: who assembled it and when (stale or not), its
/// contradictions with this agent's rounds, then the view.
pub(crate) fn render_reply(reply: &ClusterReply, all: bool) -> String {
    let mut out = String::new();
    match &reply.assembly {
        Some(a) => {
            let _ = writeln!(
                out,
                "Assembled by:     {}{}, round {}, {} ({} ago){}",
                a.assembled_by,
                if a.here { " (this agent)" } else { "" },
                a.round,
                health_agent::util::timefmt::rfc3339_millis(a.at_ms),
                health_agent::util::timefmt::short(std::time::Duration::from_millis(a.age_ms)),
                if a.stale {
                    " STALE: older than 2 of its rounds, not current"
                } else {
                    ""
                }
            );
        }
        None => out.push_str("Assembled by:     this agent (no published view)\n"),
    }
    if !reply.contradictions.is_empty() {
        let _ = writeln!(
            out,
            "Contradictions:   {} with this agent's rounds ({} since start): {}",
            reply.contradictions.len(),
            reply.contradictions_total,
            reply
                .contradictions
                .iter()
                .map(|c| format!(
                    "{} ({}; this agent {})",
                    c.node,
                    verdict(c.published),
                    c.here
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    out.push_str(&render(&reply.view, all));
    out
}

pub(crate) fn render(view: &ClusterView, all: bool) -> String {
    let c = &view.counts;
    let total = (c.healthy + c.node_down + c.path_degraded + c.observer_problem + c.unknown)
        .max(view.nodes.len());
    let mut out = format!(
        "Cluster view:     {} nodes from {} summaries ({} left out)\n\
         Verdicts:         {} healthy, {} node down, {} path degraded, {} observer problem, {} unknown\n",
        total,
        view.reports,
        view.ignored,
        c.healthy,
        c.node_down,
        c.path_degraded,
        c.observer_problem,
        c.unknown
    );
    if c.lossy > 0 {
        let _ = writeln!(
            out,
            "Lossy paths:      to {} nodes (answering, yet losing probes: status --quality NODE on an observer)",
            c.lossy
        );
    }
    if c.plaintext > 0 {
        let more = c.plaintext.saturating_sub(view.plaintext_nodes.len());
        let _ = writeln!(
            out,
            "Plain text:       {} nodes reached outside the WireGuard tunnel (status --verbose on an observer says why): {}{}",
            c.plaintext,
            view.plaintext_nodes.join(", "),
            if more > 0 {
                format!(" (+{more})")
            } else {
                String::new()
            }
        );
    }
    out.push('\n');
    let mut rows: Vec<&NodeView> = view
        .nodes
        .iter()
        .filter(|n| {
            all || view.nodes.len() <= LIST_ALL_UP_TO
                || n.verdict != Verdict::Healthy
                || n.plaintext > 0
        })
        .collect();
    rows.sort_by(|a, b| {
        a.verdict
            .rank()
            .cmp(&b.verdict.rank())
            .then(a.name.cmp(&b.name))
    });
    let width = rows.iter().map(|n| n.name.len()).max().unwrap_or(4).max(4);
    if !rows.is_empty() {
        let _ = writeln!(
            out,
            "{:<width$}  {:<8}  {:>9}  {:>9}  {:<16}  DETAIL",
            "NODE", "ZONE", "OBSERVERS", "REACHABLE", "VERDICT"
        );
    }
    for n in &rows {
        let line = format!(
            "{:<width$}  {:<8}  {:>9}  {:>9}  {:<16}  {}",
            n.name,
            n.zone.as_deref().unwrap_or("-"),
            n.observers,
            n.seen_reachable,
            verdict(n.verdict),
            detail(n)
        );
        let _ = writeln!(out, "{}", line.trim_end());
    }
    let hidden = total.saturating_sub(rows.len());
    if view.nodes.len() < total {
        // The published view lists the nodes not healthy, as many as its
        // bound allows: the others are healthy, but for those left out.
        let healthy_shown = rows
            .iter()
            .filter(|n| n.verdict == Verdict::Healthy)
            .count();
        let healthy = c.healthy.saturating_sub(healthy_shown).min(hidden);
        let left_out = hidden - healthy;
        if hidden > 0 && !rows.is_empty() {
            out.push('\n');
        }
        if healthy > 0 {
            let _ = writeln!(
                out,
                "{healthy} healthy nodes not listed (the published view lists the nodes not healthy)"
            );
        }
        if left_out > 0 {
            let _ = writeln!(
                out,
                "{left_out} nodes not healthy left out of the published view (its size bound), counted above"
            );
        }
    } else if hidden > 0 {
        let _ = writeln!(out, "\n{hidden} healthy nodes not shown (--all shows them)");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use health_agent::cluster::view::VerdictCounts;

    fn node(name: &str, verdict: Verdict) -> NodeView {
        NodeView {
            plaintext: 0,
            name: name.into(),
            zone: None,
            reporting: true,
            observers: 3,
            seen_reachable: u32::from(verdict == Verdict::Healthy) * 3,
            failing: 0,
            discounted: 0,
            verdict,
            failing_observers: Vec::new(),
            unreached: 0,
            unreached_nodes: Vec::new(),
            lossy: 0,
        }
    }

    #[test]
    fn problems_come_first_and_healthy_nodes_are_hidden_in_large_views() {
        let mut nodes: Vec<NodeView> = (0..60)
            .map(|i| node(&format!("n{i:02}"), Verdict::Healthy))
            .collect();
        nodes[30].verdict = Verdict::PathDegraded;
        nodes[30].failing_observers = vec!["n01".into()];
        nodes[30].failing = 1;
        nodes[45].verdict = Verdict::NodeDown;
        nodes[10].plaintext = 2;
        let view = ClusterView {
            plaintext_nodes: vec!["n10".into()],
            reports: 59,
            ignored: 0,
            counts: VerdictCounts {
                healthy: 58,
                node_down: 1,
                path_degraded: 1,
                lossy: 2,
                plaintext: 1,
                ..VerdictCounts::default()
            },
            nodes,
        };
        let text = render(&view, false);
        assert!(text.contains("Lossy paths:      to 2 nodes"), "{text}");
        assert!(
            text.contains("Plain text:       1 nodes reached outside the WireGuard tunnel")
                && text.contains("): n10\n"),
            "{text}"
        );
        // Healthy, yet listed: reached in plain text.
        assert!(
            text.lines()
                .any(|l| l.starts_with("n10") && l.ends_with("reached in plain text by 2")),
            "{text}"
        );
        let lines: Vec<&str> = text.lines().collect();
        let header = lines
            .iter()
            .position(|l| l.starts_with("NODE"))
            .expect("header");
        assert!(
            lines[header + 1].starts_with("n45") && lines[header + 1].contains("node down"),
            "{text}"
        );
        assert!(
            lines[header + 2].contains("path degraded")
                && lines[header + 2].contains("failing from: n01"),
            "{text}"
        );
        assert!(text.contains("57 healthy nodes not shown"), "{text}");
        assert_eq!(
            render(&view, true)
                .lines()
                .filter(|l| l.ends_with("  healthy"))
                .count(),
            57,
            "and n10, healthy with its detail"
        );
    }

    #[test]
    fn a_published_view_of_healthy_nodes_prints_no_empty_table() {
        let mut view = ClusterView {
            plaintext_nodes: Vec::new(),
            reports: 4,
            ignored: 0,
            counts: VerdictCounts {
                healthy: 4,
                ..VerdictCounts::default()
            },
            nodes: Vec::new(),
        };
        let text = render(&view, false);
        assert!(!text.contains("NODE"), "{text}");
        assert!(
            text.ends_with(
                "\n\n4 healthy nodes not listed (the published view lists the nodes not healthy)\n"
            ),
            "{text}"
        );
        // Nodes not healthy beyond the view's bound: counted, not listed.
        view.counts.node_down = 3;
        view.nodes = vec![node("n3", Verdict::NodeDown)];
        let text = render(&view, false);
        assert!(text.contains("\nNODE "), "{text}");
        assert!(text.contains("\n4 healthy nodes not listed"), "{text}");
        assert!(
            text.ends_with(
                "2 nodes not healthy left out of the published view (its size bound), counted above\n"
            ),
            "{text}"
        );
        view.counts.healthy = 0;
        let text = render(&view, false);
        assert!(!text.contains("healthy nodes not listed"), "{text}");
        assert!(text.contains("\n\n2 nodes not healthy left out"), "{text}");
    }

    #[test]
    fn the_published_view_says_who_assembled_it_and_when_it_is_stale() {
        use health_agent::cluster::{contradiction::Contradiction, view_cell::Assembly};
        let view = ClusterView {
            plaintext_nodes: Vec::new(),
            reports: 5,
            ignored: 0,
            counts: VerdictCounts {
                healthy: 4,
                node_down: 1,
                ..VerdictCounts::default()
            },
            nodes: vec![node("n3", Verdict::NodeDown)],
        };
        let mut reply = ClusterReply {
            view,
            assembly: Some(Assembly {
                assembled_by: "n1".into(),
                here: false,
                round: 41,
                at_ms: 1_000_000,
                interval_ms: 1_000,
                age_ms: 600,
                stale: false,
                unlisted: 0,
                key: "/health/view/n1".into(),
            }),
            contradictions: Vec::new(),
            contradictions_total: 0,
            views_refused_total: 0,
            views_skipped_total: 0,
        };
        let text = render_reply(&reply, false);
        assert!(
            text.starts_with("Assembled by:     n1, round 41, "),
            "{text}"
        );
        assert!(!text.contains("STALE"), "{text}");
        assert!(
            text.contains("Cluster view:     5 nodes from 5 summaries"),
            "{text}"
        );
        assert!(
            text.contains(
                "4 healthy nodes not listed (the published view lists the nodes not healthy)"
            ),
            "{text}"
        );
        if let Some(a) = reply.assembly.as_mut() {
            a.stale = true;
            a.age_ms = 5_000;
        }
        reply.contradictions = vec![Contradiction {
            node: "n3".into(),
            published: Verdict::NodeDown,
            here: "reaches it on every path".into(),
        }];
        reply.contradictions_total = 1;
        let text = render_reply(&reply, false);
        assert!(
            text.lines()
                .next()
                .is_some_and(|l| l.ends_with("STALE: older than 2 of its rounds, not current")),
            "{text}"
        );
        assert!(
            text.contains("Contradictions:   1 with this agent's rounds (1 since start): n3 (node down; this agent reaches it on every path)"),
            "{text}"
        );
    }
}
