//! `health-agent bpf ...`: the datapath's pinned maps, read directly (so
//! these work while no agent runs), in the style of `cilium bpf`.

use std::{fmt::Write as _, path::Path, time::Duration};

use clap::Subcommand;
use health_common::maps::MapId;
use serde_json::Value;

use super::{OutputFormat, PinArgs};
use health_agent::{
    datapath::{DatapathError, ct, dump, maps, nat, rtt},
    util::timefmt::short,
};

#[derive(Debug, Subcommand)]
pub(crate) enum BpfCommand {
    /// Connection tracking.
    #[command(subcommand)]
    Ct(CtCommand),
    /// Masquerade (SNAT) pairs.
    #[command(subcommand)]
    Nat(NatCommand),
    /// In-kernel RTT per peer and protocol.
    #[command(subcommand)]
    Rtt(RttCommand),
    /// The datapath's maps.
    #[command(subcommand)]
    Map(MapCommand),
}

#[derive(Debug, Subcommand)]
pub(crate) enum CtCommand {
    /// One line per entry (`global`: the only table).
    List {
        #[arg(value_parser = ["global"])]
        table: String,
        #[command(flatten)]
        pins: PinArgs,
        #[arg(short, long, value_enum, default_value_t)]
        output: OutputFormat,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum NatCommand {
    /// One line per entry: each masqueraded flow has an OUT (XLATE_SRC)
    /// and an IN (XLATE_DST) entry.
    List {
        #[command(flatten)]
        pins: PinArgs,
        #[arg(short, long, value_enum, default_value_t)]
        output: OutputFormat,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum RttCommand {
    /// last/min/avg/max RTT, samples and losses per peer and protocol.
    List {
        #[command(flatten)]
        pins: PinArgs,
        #[arg(short, long, value_enum, default_value_t)]
        output: OutputFormat,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum MapCommand {
    /// Name, type, entries / max entries and pressure of every map.
    List {
        #[command(flatten)]
        pins: PinArgs,
        #[arg(short, long, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// One map's keys and values, decoded.
    Dump {
        name: String,
        #[command(flatten)]
        pins: PinArgs,
        #[arg(short, long, value_enum, default_value_t)]
        output: OutputFormat,
    },
}

impl BpfCommand {
    pub(crate) fn run(self) -> anyhow::Result<()> {
        let text = match self {
            Self::Ct(CtCommand::List { pins, output, .. }) => {
                render_lines(&ct::list(&pins.dir)?, output, ct::CtRow::line)?
            }
            Self::Nat(NatCommand::List { pins, output }) => {
                render_lines(&nat::list(&pins.dir)?, output, nat::NatRow::line)?
            }
            Self::Rtt(RttCommand::List { pins, output }) => {
                render_rtt(&rtt::list(&pins.dir)?, output)?
            }
            Self::Map(MapCommand::List { pins, output }) => {
                let rows = maps::list(&pins.dir)?;
                if rows.is_empty() {
                    anyhow::bail!(
                        "no map of the agent is pinned under {} (the daemon's --bpffs-dir)",
                        pins.dir.display()
                    );
                }
                render_maps(&rows, output)?
            }
            Self::Map(MapCommand::Dump { name, pins, output }) => {
                let v = dump(&pins.dir, &name)?;
                match output {
                    OutputFormat::Json => serde_json::to_string_pretty(&v)?,
                    OutputFormat::Table => dump_table(&v),
                }
            }
        };
        if !text.is_empty() {
            super::out::print_line(&text)?;
        }
        Ok(())
    }
}

/// JSON, or one `line` per row (the `cilium bpf ... list` style).
fn render_lines<T: serde::Serialize>(
    rows: &[T],
    output: OutputFormat,
    line: fn(&T) -> String,
) -> anyhow::Result<String> {
    Ok(match output {
        OutputFormat::Json => serde_json::to_string_pretty(rows)?,
        OutputFormat::Table => rows.iter().map(line).collect::<Vec<_>>().join("\n"),
    })
}

fn render_rtt(rows: &[rtt::RttRow], output: OutputFormat) -> anyhow::Result<String> {
    if output == OutputFormat::Json {
        return Ok(serde_json::to_string_pretty(rows)?);
    }
    // As wide as the longest peer (an IPv6 address takes up to 39).
    let peers: Vec<String> = rows.iter().map(|r| r.peer.to_string()).collect();
    let w = peers.iter().map(String::len).max().unwrap_or(0).max(15);
    let mut out = format!(
        "{:<w$} {:<6} {:>10} {:>10} {:>10} {:>10} {:>8} {:>7}\n",
        "PEER", "PROTO", "LAST", "MIN", "AVG", "MAX", "SAMPLES", "LOSSES"
    );
    for (r, peer) in rows.iter().zip(&peers) {
        // No sample, no figure: a peer that only lost probes shows dashes.
        let d = |ns: u64| {
            if r.samples == 0 {
                "-".to_owned()
            } else {
                short(Duration::from_nanos(ns))
            }
        };
        let _ = writeln!(
            out,
            "{:<w$} {:<6} {:>10} {:>10} {:>10} {:>10} {:>8} {:>7}",
            peer,
            r.proto,
            d(r.last_ns),
            d(r.min_ns),
            d(r.avg_ns),
            d(r.max_ns),
            r.samples,
            r.losses
        );
    }
    Ok(out.trim_end().to_owned())
}

fn render_maps(rows: &[maps::MapRow], output: OutputFormat) -> anyhow::Result<String> {
    if output == OutputFormat::Json {
        return Ok(serde_json::to_string_pretty(rows)?);
    }
    let mut out = format!(
        "{:<12} {:<13} {:>8} {:>8} {:>9}\n",
        "NAME", "TYPE", "ENTRIES", "MAX", "PRESSURE"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:<12} {:<13} {:>8} {:>8} {:>8.1}%",
            r.name,
            r.kind,
            r.entries,
            r.max_entries,
            r.pressure * 100.0
        );
    }
    Ok(out.trim_end().to_owned())
}

/// A map's content as JSON, decoded by what the map holds; the name is
/// checked against the registry first.
fn dump(dir: &Path, name: &str) -> anyhow::Result<Value> {
    let known = || dump::dumpable().join(", ");
    let id = MapId::from_name(name)
        .ok_or_else(|| anyhow::anyhow!("no map {name:?}: known maps are {}", known()))?;
    dump::dump(dir, id).map_err(|e| match e {
        DatapathError::NoDecoder { .. } => {
            anyhow::anyhow!("no decoder for map {name:?}: known maps are {}", known())
        }
        e => e.into(),
    })
}

fn dump_table(v: &Value) -> String {
    match v {
        Value::Array(items) => items
            .iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Object(map) => map
            .iter()
            .map(|(k, v)| format!("{k:<16} {v}"))
            .collect::<Vec<_>>()
            .join("\n"),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(peer: [u8; 4], samples: u64, losses: u64, ns: u64) -> rtt::RttRow {
        rtt::RttRow {
            peer: std::net::Ipv4Addr::from(peer).into(),
            proto: "icmp",
            samples,
            losses,
            last_ns: ns,
            min_ns: ns,
            avg_ns: ns,
            max_ns: ns,
            last_at_ns: 0,
            histogram: Vec::new(),
        }
    }

    #[test]
    fn a_peer_without_samples_shows_no_rtt_rather_than_zero() {
        let rows = [
            row([198, 18, 0, 2], 3, 0, 250_000),
            row([198, 18, 0, 3], 0, 4, 0),
        ];
        let text = render_rtt(&rows, OutputFormat::Table).expect("table");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        let answered: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            answered,
            [
                "198.18.0.2",
                "icmp",
                "250µs",
                "250µs",
                "250µs",
                "250µs",
                "3",
                "0"
            ]
        );
        let lost: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(
            lost,
            ["198.18.0.3", "icmp", "-", "-", "-", "-", "0", "4"],
            "{text}"
        );
    }
}
