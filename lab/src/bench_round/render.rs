//! The run's report, as printed.

use std::{fmt::Write as _, time::Duration};

use super::{
    Measured, Options, Round,
    clients::{Percentiles, ms},
    peers::PROBES_A_PEER,
    steady_cpu_per_peer, steady_rounds,
    topology::ROUTER_UPLINK,
};
use crate::since_ready::SinceReady;

#[allow(
    clippy::cast_precision_loss,
    reason = "MiB and ratios for display, from values far below 2^52"
)]
pub(super) fn render(opts: &Options, m: &Measured) -> String {
    let (served, rounds, fping) = (m.served, &m.rounds, m.fping);
    let (live_ok, live_paths, false_ok) = (m.live_ok, m.live_paths, m.false_ok);
    let mut text = String::new();
    let _ = writeln!(
        text,
        "bench-round: {} peers ({} probes a round), {}% silent, timeout 1 s{}",
        opts.peers,
        PROBES_A_PEER as usize * opts.peers,
        opts.silent_pct,
        if opts.network_thread {
            "; the simulated network in threads of its own"
        } else {
            ""
        }
    );
    let _ = writeln!(text, "socket served after {} ms", served.as_millis());
    let args = std::env::var("BENCH_AGENT_ARGS").unwrap_or_default();
    let _ = writeln!(text, "{}", in_flight_line(opts, m.open_files, &args));
    let _ = writeln!(text, "{}", SinceReady::line(m.since_ready));
    for r in rounds {
        let _ = writeln!(
            text,
            "round {:>3}: {:>6} ms wall, {:>6} ms agent CPU, RSS {:>6.1} MiB ({:.1} of files; peak {:>6.1}){}",
            r.seq,
            r.wall_ms,
            r.cpu.as_millis(),
            r.rss.now_kib as f64 / 1024.0,
            r.rss.file_kib as f64 / 1024.0,
            r.rss.peak_kib as f64 / 1024.0,
            if r.clients {
                ", status clients pulling"
            } else {
                ""
            }
        );
    }
    let steady: Vec<&Round> = steady_rounds(rounds).collect();
    if !steady.is_empty() {
        let n = steady.len() as u64;
        let per_peer = steady_cpu_per_peer(rounds, opts.peers).map_or(0.0, ms);
        let _ = writeln!(
            text,
            "steady rounds: mean {} ms wall, {} ms CPU ({per_peer:.3} ms a peer, {:.1} µs a probe)",
            steady.iter().map(|r| r.wall_ms).sum::<u64>() / n,
            steady.iter().map(|r| r.cpu.as_millis() as u64).sum::<u64>() / n,
            per_peer * 1000.0 / f64::from(PROBES_A_PEER)
        );
        render_steady_cpu(&mut text, opts, &steady);
        render_network(&mut text, opts, &steady);
        for (what, kib) in [
            (
                "RSS at the rounds' ends",
                rounds.iter().map(|r| r.rss.now_kib).collect::<Vec<_>>(),
            ),
            (
                "peak RSS within the rounds",
                rounds.iter().map(|r| r.rss.peak_kib).collect(),
            ),
        ] {
            let (lo, hi) = (
                kib.iter().min().copied().unwrap_or(0),
                kib.iter().max().copied().unwrap_or(0),
            );
            let _ = writeln!(
                text,
                "{what} over {} rounds: {:.1} .. {:.1} MiB ({:+.1}% from the lowest)",
                rounds.len(),
                lo as f64 / 1024.0,
                hi as f64 / 1024.0,
                100.0 * (hi as f64 - lo as f64) / (lo.max(1) as f64)
            );
        }
    }
    render_api(&mut text, m);
    let _ = writeln!(
        text,
        "correctness: {live_ok}/{live_paths} live paths OK, {false_ok} silent paths OK (false OK)"
    );
    let _ = writeln!(
        text,
        "after the last round: {}/{live_paths} live paths OK, {} silent paths OK (false OK), {} MTU black holes (false)",
        m.last.0, m.last.1, m.false_blackholes
    );
    let first_ms = rounds.first().map_or(0, |r| r.wall_ms);
    let _ = writeln!(
        text,
        "fping -i0 over the same {} ICMP targets: {} ms; first round / fping = {:.2}x",
        2 * opts.peers,
        fping.as_millis(),
        first_ms as f64 / fping.as_millis().max(1) as f64
    );
    text
}

/// The status clients' latencies, and when in their round each
/// kind's slowest answer was asked for.
fn render_api(text: &mut String, m: &Measured) {
    let which = if m.clients_at == 1 { "first" } else { "second" };
    let started = m.rounds.get(m.clients_at - 1).map(|r| r.started_ms);
    let slowest = |p: &Percentiles| {
        started.map_or_else(String::new, |s| {
            format!(
                "; the slowest asked {:+.3} s from the round's start",
                p.max_from(s)
            )
        })
    };
    let _ = writeln!(
        text,
        "GET /v1/status during the {which} round, 8 clients: {} (to the body's last byte, as sent{})",
        m.status_latency.line(),
        slowest(&m.status_latency)
    );
    let _ = writeln!(
        text,
        "GET /v1/status?summary=true and ?node=NAME beside them, 1 client: {}{}",
        m.summary_latency.line(),
        slowest(&m.summary_latency)
    );
}

/// The steady rounds' CPU: the agent's share of a core, its user-space
/// part, and the simulated network's thread with `--network-thread`.
#[allow(
    clippy::cast_precision_loss,
    reason = "percentages for display, from values far below 2^52"
)]
fn render_steady_cpu(text: &mut String, opts: &Options, steady: &[&Round]) {
    let n = steady.len() as u64;
    let cpu: Duration = steady.iter().map(|r| r.cpu).sum();
    let user: Duration = steady.iter().map(|r| r.user).sum();
    let _ = writeln!(
        text,
        "steady CPU: {:.2} % of a core at a {} s interval, {:.0} % of it in user space",
        100.0 * cpu.as_secs_f64() / (opts.interval.as_secs_f64() * steady.len() as f64),
        opts.interval.as_secs_f64(),
        100.0 * user.as_secs_f64() / cpu.as_secs_f64().max(1e-9)
    );
    if opts.network_thread {
        let network: Duration = steady.iter().map(|r| r.network).sum();
        let _ = writeln!(
            text,
            "steady CPU of the simulated network (router, peers and the agent node's receives, in the napi/{ROUTER_UPLINK} kernel thread and the peers' echo thread): {:.2} % of a core, {} ms a round",
            100.0 * network.as_secs_f64() / (opts.interval.as_secs_f64() * steady.len() as f64),
            network.as_millis() / u128::from(n)
        );
    }
    let lab: Duration = steady.iter().map(|r| r.lab).sum();
    let probes = f64::from(PROBES_A_PEER) * opts.peers as f64 * steady.len() as f64;
    let _ = writeln!(
        text,
        "steady CPU of the bench's process (the peers' HTTP server{}, and the simulated network's softirq work in its context): {} ms a round; with the agent's, {:.1} µs a probe",
        if opts.network_thread {
            " and their echo"
        } else {
            ""
        },
        lab.as_millis() / u128::from(n),
        (cpu + lab).as_secs_f64() * 1e6 / probes.max(1.0)
    );
}

/// The HTTP probes the agent holds in flight at most, and whether the
/// silent peers' fit: each such probe holds its socket a whole timeout,
/// so past the bound a round lasts a timeout more for each bound's worth.
/// The bound is the agent's: its open-file limit `open_files` less what it
/// keeps, or `--max-in-flight` from its extra flags (`BENCH_AGENT_ARGS`)
/// where that is lower; `--probe-flows` there multiplies the probes.
fn in_flight_line(opts: &Options, open_files: Option<u64>, agent_args: &str) -> String {
    let flag = |name: &str| {
        let mut words = agent_args.split_whitespace();
        while let Some(w) = words.next() {
            if w == name {
                return words.next().and_then(|v| v.parse::<u64>().ok());
            }
            if let Some(v) = w.strip_prefix(name).and_then(|r| r.strip_prefix('=')) {
                return v.parse().ok();
            }
        }
        None
    };
    let reserved = health_agent::probe::RESERVED_FILES as u64;
    let budget = open_files.map(|limit| (health_agent::probe::fd_budget(limit) as u64, limit));
    let (bound, why) = match (flag("--max-in-flight"), budget) {
        (Some(n), Some((b, _))) if n < b => (n, "--max-in-flight in BENCH_AGENT_ARGS".to_owned()),
        (_, Some((b, limit))) => (
            b,
            format!("the agent's open-file limit {limit} less {reserved}"),
        ),
        (_, None) => return "HTTP probes in flight: no open-file limit".to_owned(),
    };
    let flows = flag("--probe-flows").unwrap_or(1).max(1);
    let silent = 2
        * flows
        * (0..opts.peers)
            .filter(|&k| super::peers::silent(k, opts.silent_pct))
            .count() as u64;
    let fit = if silent <= bound {
        "fit".to_owned()
    } else {
        format!(
            "do not: a round lasts about {} timeouts",
            silent.div_ceil(bound)
        )
    };
    format!("HTTP probes in flight at most {bound} ({why}); the {silent} to silent peers {fit}")
}

/// The steady rounds' traffic on the node's uplink: rate, bytes and
/// packets, a round and a peer.
#[expect(
    clippy::cast_precision_loss,
    reason = "rates and means for display, from values far below 2^52"
)]
fn render_network(text: &mut String, opts: &Options, steady: &[&Round]) {
    let n = steady.len() as u64;
    let bytes: u64 = steady.iter().map(|r| r.bytes).sum();
    let packets: u64 = steady.iter().map(|r| r.packets).sum();
    let _ = writeln!(
        text,
        "steady network: {:.1} kbit/s on the node's uplink at a {} s interval (both directions, {} B a round, {:.0} B a peer; {} packets a round, {:.2} a peer)",
        8.0 * bytes as f64 / (1e3 * opts.interval.as_secs_f64() * n as f64),
        opts.interval.as_secs_f64(),
        bytes / n,
        bytes as f64 / (n as f64 * opts.peers as f64),
        packets / n,
        packets as f64 / (n as f64 * opts.peers as f64)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(peers: usize) -> Options {
        Options {
            peers,
            silent_pct: 50,
            rounds: 3,
            interval: Duration::from_secs(5),
            network_thread: false,
        }
    }

    /// The bound follows the agent's rule (its limit less what it keeps)
    /// or the flag given, and a round past it is said to last a timeout
    /// for each bound's worth of silent peers' probes.
    #[test]
    fn the_in_flight_bound_says_whether_the_silent_peers_probes_fit() {
        let line = in_flight_line(&opts(10_000), Some(20_000), "");
        assert_eq!(
            line,
            "HTTP probes in flight at most 10976 (the agent's open-file limit 20000 less 9024); \
             the 10000 to silent peers fit"
        );
        let line = in_flight_line(&opts(20_000), Some(20_000), "--probe-mtu off");
        assert!(
            line.ends_with("the 20000 to silent peers do not: a round lasts about 2 timeouts"),
            "{line}"
        );
        let line = in_flight_line(&opts(10_000), Some(20_000), "--max-in-flight 4000");
        assert!(
            line.starts_with("HTTP probes in flight at most 4000 (--max-in-flight"),
            "{line}"
        );
        assert!(line.ends_with("about 3 timeouts"), "{line}");
        // Written with `=`; set above the budget, the budget binds.
        let line = in_flight_line(&opts(10_000), Some(20_000), "--max-in-flight=4000");
        assert!(line.ends_with("about 3 timeouts"), "{line}");
        let line = in_flight_line(&opts(10_000), Some(20_000), "--max-in-flight 50000");
        assert!(line.contains("at most 10976 (the agent's"), "{line}");
        // Two flows: twice the probes.
        let line = in_flight_line(&opts(10_000), Some(20_000), "--probe-flows 2");
        assert!(
            line.ends_with("the 20000 to silent peers do not: a round lasts about 2 timeouts"),
            "{line}"
        );
        // A limit below what the agent keeps: its floor of 64.
        assert!(in_flight_line(&opts(100), Some(1_024), "").contains("at most 64 "));
        assert_eq!(
            in_flight_line(&opts(100), None, ""),
            "HTTP probes in flight: no open-file limit"
        );
    }
}
