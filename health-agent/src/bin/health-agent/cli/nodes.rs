//! `health-agent nodes`: the node set this agent probes, where it came
//! from, and what it refused or does not count (node records, health
//! routes, health allocations: the first 100 of each, and how many), with
//! why. What went wrong comes first; the set, which may run to thousands
//! of lines, last.

use std::fmt::Write as _;

use clap::Args;

use super::{OutputFormat, SocketArgs};
use health_agent::{
    api::{client::Client, types::NodesView},
    membership::{NodeSet, record::RejectedRecord},
    util::timefmt::rfc3339_millis,
};

#[derive(Debug, Args)]
pub(crate) struct NodesArgs {
    /// Only what was refused (records, routes, allocations), not the set.
    #[arg(long)]
    refused: bool,
    #[arg(short, long, value_enum, default_value_t)]
    output: OutputFormat,
    #[command(flatten)]
    socket: SocketArgs,
}

impl NodesArgs {
    pub(crate) async fn run(self) -> anyhow::Result<()> {
        let view = Client::new(self.socket.path).nodes().await?;
        super::out::print_line(&render(&view, self.refused, self.output)?)?;
        Ok(())
    }
}

/// A node's addresses of one kind, both families: `-` for none.
fn both(v4: Option<impl ToString>, v6: Option<impl ToString>) -> String {
    let both: Vec<String> = [v4.map(|a| a.to_string()), v6.map(|a| a.to_string())]
        .into_iter()
        .flatten()
        .collect();
    if both.is_empty() {
        "-".to_owned()
    } else {
        both.join(",")
    }
}

/// The widest a key or name column is drawn: a longer cell is cut, so
/// that one long key cannot push every row off the screen.
const MAX_COLUMN: usize = 64;

/// A cell as the terminal is to show it: control characters (from etcd
/// keys and values, which anyone with write access chose) escaped, and cut
/// to `max` characters when given.
fn cell(text: &str, max: Option<usize>) -> String {
    let mut shown = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() || invisible(c) {
            shown.extend(c.escape_default());
        } else {
            shown.push(c);
        }
    }
    match max {
        Some(max) if shown.chars().count() > max => {
            let cut: String = shown.chars().take(max - 1).collect();
            format!("{cut}…")
        }
        _ => shown,
    }
}

/// A character that changes how the text around it is drawn without
/// showing itself: bidirectional overrides and isolates, zero-width
/// characters.
const fn invisible(c: char) -> bool {
    matches!(
        c,
        '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2069}' | '\u{feff}'
    )
}

/// `n` and `what`, plural but for one.
fn count(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// A section of refused things: its title with the count, then a table,
/// and how many more there are than the agent listed.
fn section(out: &mut String, title: &str, total: usize, rows: &[[&str; 3]], head: [&str; 3]) {
    let _ = writeln!(out, "\n{title}: {total}");
    if rows.is_empty() {
        return;
    }
    let rows: Vec<[String; 3]> = rows
        .iter()
        .map(|r| {
            [
                cell(r[0], Some(MAX_COLUMN)),
                cell(r[1], Some(MAX_COLUMN)),
                cell(r[2], None),
            ]
        })
        .collect();
    table(out, head, &rows);
    if total > rows.len() {
        let _ = writeln!(out, "... and {} more, not listed", total - rows.len());
    }
}

fn rejected_rows(list: &[RejectedRecord]) -> Vec<[&str; 3]> {
    list.iter()
        .map(|r| {
            [
                r.record.as_str(),
                r.name.as_deref().unwrap_or("-"),
                r.reason.as_str(),
            ]
        })
        .collect()
}

/// Rows under a head, every column but the last padded to its widest
/// cell.
fn table<const N: usize>(out: &mut String, head: [&str; N], rows: &[[String; N]]) {
    let mut widths = head.map(str::len);
    for row in rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut line = |cells: [&str; N]| {
        let mut text = String::new();
        for (k, c) in cells.iter().enumerate() {
            if k + 1 < N {
                let _ = write!(text, "{c:<w$}  ", w = widths[k]);
            } else {
                text.push_str(c);
            }
        }
        let _ = writeln!(out, "{}", text.trim_end());
    };
    line(head);
    for row in rows {
        line(row.each_ref().map(String::as_str));
    }
}

fn node_table(out: &mut String, nodes: &NodeSet) {
    let rows: Vec<[String; 4]> = nodes
        .iter()
        .map(|n| {
            [
                n.name.clone(),
                both(n.node_ip, n.node_ip6),
                both(n.health_ip, n.health_ip6),
                n.zone.clone().unwrap_or_else(|| "-".to_owned()),
            ]
        })
        .collect();
    out.push('\n');
    table(out, ["NAME", "NODE-IP", "HEALTH-IP", "ZONE"], &rows);
}

/// One line of counts: what the set holds and what was refused.
fn counts(view: &NodesView) -> String {
    let mut line = format!(
        "{}; {}, {}",
        count(view.nodes.len(), "node"),
        count(view.rejected_total, "rejected record"),
        count(view.refused_routes_total, "refused route"),
    );
    if view.allocations_uncounted_total > 0 {
        let _ = write!(
            line,
            ", {} counting for nothing",
            count(view.allocations_uncounted_total, "health allocation")
        );
    }
    line
}

/// The view as a table (what was refused first, the set last, and the
/// counts again below it), or as the API's JSON (without the set with
/// `refused`).
pub(crate) fn render(
    view: &NodesView,
    refused: bool,
    output: OutputFormat,
) -> anyhow::Result<String> {
    if output == OutputFormat::Json {
        let mut json = serde_json::to_value(view)?;
        if refused && let Some(object) = json.as_object_mut() {
            object.remove("nodes");
        }
        return Ok(serde_json::to_string_pretty(&json)?);
    }
    let mut out = format!("Source:  {}\n", cell(&view.source, None));
    let updated = view
        .updated_ms
        .map_or_else(|| "never".to_owned(), rfc3339_millis);
    let _ = writeln!(out, "Updated: {updated}");
    if let Some(e) = &view.error {
        let kept = if view.updated_ms.is_some() {
            " (the set in use is the last good one)"
        } else {
            ""
        };
        let _ = writeln!(out, "Error:   {}{kept}", cell(e, None));
    }
    let _ = writeln!(out, "Nodes:   {}", view.nodes.len());
    section(
        &mut out,
        "Rejected records",
        view.rejected_total,
        &rejected_rows(&view.rejected),
        ["RECORD", "NAME", "REASON"],
    );
    let routes: Vec<(String, String, &str)> = view
        .refused_routes
        .iter()
        .map(|r| (r.address.to_string(), r.node.clone(), r.reason.as_str()))
        .collect();
    let route_rows: Vec<[&str; 3]> = routes
        .iter()
        .map(|(a, n, r)| [a.as_str(), n.as_str(), *r])
        .collect();
    section(
        &mut out,
        "Refused routes",
        view.refused_routes_total,
        &route_rows,
        ["ADDRESS", "NODE", "REASON"],
    );
    if view.allocations_uncounted_total > 0 || !view.allocations_uncounted.is_empty() {
        section(
            &mut out,
            "Health allocations counting for nothing",
            view.allocations_uncounted_total,
            &rejected_rows(&view.allocations_uncounted),
            ["KEY", "NODE", "REASON"],
        );
    }
    if !refused {
        node_table(&mut out, &view.nodes);
        // Below a long set, what was refused is above the screen.
        let _ = writeln!(out, "\n{} (--refused: those alone)", counts(view));
    }
    Ok(out.trim_end().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use health_agent::membership::{Node, routes::RefusedRoute};

    fn view() -> NodesView {
        let mut n1 = Node::v4(
            "node-1",
            "198.18.0.11".parse().expect("ip"),
            "198.18.64.5".parse().expect("ip"),
        );
        n1.node_ip6 = Some("2001:2::11".parse().expect("ip6"));
        n1.zone = Some("rack-a".into());
        let n2 = Node::v4(
            "node-20",
            "198.18.0.30".parse().expect("ip"),
            "198.18.83.5".parse().expect("ip"),
        );
        NodesView {
            source: "etcd:198.18.0.1:2379/health/nodes/".into(),
            nodes: NodeSet::new(vec![n2, n1]).expect("set"),
            error: None,
            updated_ms: Some(1_764_489_600_000),
            rejected: vec![RejectedRecord {
                record: "/health/nodes/squat".into(),
                name: Some("squat".into()),
                reason: "health-ip 198.18.66.2 is outside the node's allocation".into(),
            }],
            rejected_total: 3,
            refused_routes: vec![RefusedRoute {
                node: "node-20".into(),
                address: "198.18.83.5".parse().expect("ip"),
                reason: "inside a connected network".into(),
            }],
            refused_routes_total: 1,
            allocations_uncounted: vec![RejectedRecord {
                record: "/health/allocations/typo".into(),
                name: Some("typo".into()),
                reason: "refused: node_ip \"198.18.0.300\" is not an IPv4 address".into(),
            }],
            allocations_uncounted_total: 1,
        }
    }

    #[test]
    fn the_refused_come_first_and_the_set_last() {
        let text = render(&view(), false, OutputFormat::Table).expect("table");
        let expected = "\
Source:  etcd:198.18.0.1:2379/health/nodes/
Updated: 2025-11-30T08:00:00.000Z
Nodes:   2

Rejected records: 3
RECORD               NAME   REASON
/health/nodes/squat  squat  health-ip 198.18.66.2 is outside the node's allocation
... and 2 more, not listed

Refused routes: 1
ADDRESS      NODE     REASON
198.18.83.5  node-20  inside a connected network

Health allocations counting for nothing: 1
KEY                       NODE  REASON
/health/allocations/typo  typo  refused: node_ip \"198.18.0.300\" is not an IPv4 address

NAME     NODE-IP                 HEALTH-IP    ZONE
node-1   198.18.0.11,2001:2::11  198.18.64.5  rack-a
node-20  198.18.0.30             198.18.83.5  -

2 nodes; 3 rejected records, 1 refused route, 1 health allocation counting for nothing (--refused: those alone)";
        assert_eq!(text, expected);
        let refused = render(&view(), true, OutputFormat::Table).expect("table");
        assert!(refused.ends_with("is not an IPv4 address"), "{refused}");
        assert!(!refused.contains("NODE-IP"), "{refused}");
    }

    #[test]
    fn without_allocations_their_section_is_left_out_and_json_is_the_apis() {
        let mut v = view();
        v.allocations_uncounted.clear();
        v.allocations_uncounted_total = 0;
        v.error = Some("etcd at e: unreachable".into());
        let text = render(&v, true, OutputFormat::Table).expect("table");
        assert!(!text.contains("allocations"), "{text}");
        assert!(
            text.contains("Error:   etcd at e: unreachable (the set in use is the last good one)"),
            "{text}"
        );
        let json = render(&v, false, OutputFormat::Json).expect("json");
        let back: NodesView = serde_json::from_str(&json).expect("the API's form");
        assert_eq!(back.nodes.len(), 2);
        assert_eq!(back.rejected_total, 3);
        let json = render(&v, true, OutputFormat::Json).expect("json");
        let back: serde_json::Value = serde_json::from_str(&json).expect("JSON");
        assert!(back.get("nodes").is_none(), "--refused leaves the set out");
        assert_eq!(back["rejected_total"], 3);
        let text = render(&v, false, OutputFormat::Table).expect("table");
        assert!(
            text.ends_with("2 nodes; 3 rejected records, 1 refused route (--refused: those alone)"),
            "no allocations clause without any: {text}"
        );
    }

    /// What an etcd writer chose cannot steer the terminal or the table:
    /// control characters are escaped, long keys and names cut.
    #[test]
    fn a_writers_text_is_escaped_and_cut() {
        let mut v = view();
        v.rejected = vec![RejectedRecord {
            record: format!("/health/nodes/{}", "k".repeat(200)),
            name: Some("evil\u{1b}]0;owned\u{7}\nforged\u{202e}row".into()),
            reason: "unknown field `\u{1b}[2J`".into(),
        }];
        let text = render(&v, true, OutputFormat::Table).expect("table");
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}'),
            "{text:?}"
        );
        assert!(
            text.contains("evil\\u{1b}]0;owned\\u{7}\\nforged\\u{202e}row"),
            "{text}"
        );
        assert!(text.contains("unknown field `\\u{1b}[2J`"), "{text}");
        let row = text
            .lines()
            .find(|l| l.starts_with("/health/nodes/k"))
            .expect("the row");
        assert!(
            row.starts_with(&format!("/health/nodes/{}…  ", "k".repeat(49))),
            "{row}"
        );
    }
}
