//! The report of a run: its shape, the writes, the deliveries, etcd's
//! size and CPU, and the verdict against the budget.

use std::{fmt::Write as _, sync::atomic::Ordering};

use health_agent::cluster::subset::DEFAULT_PEERS;

use super::{
    BUDGET, LEASE_TTL, Shape, ZONE_SIZE, default_seconds,
    measure::{Seen, Shared},
};

/// What a run measured.
pub(super) struct Outcome<'a> {
    pub(super) shape: &'a Shape,
    pub(super) shared: &'a Shared,
    /// Per agent.
    pub(super) acked: &'a [u64],
    /// Per watcher.
    pub(super) seen: &'a [Seen],
    pub(super) etcd: &'a etcd_client::StatusResponse,
    /// etcd's and this process's CPU, in % of a core over the run.
    pub(super) cpu: Option<(f64, f64)>,
}

/// Totals over the watchers.
#[derive(Default)]
struct Totals {
    got: u64,
    missing: u64,
    out_of_order: u64,
    invalid: u64,
    unstamped: u64,
    per_watcher_min: u64,
    per_watcher_max: u64,
}

impl Totals {
    fn of(acked: &[u64], seen: &[Seen]) -> Self {
        let mut t = Self {
            per_watcher_min: seen.iter().map(|s| s.deliveries).min().unwrap_or(0),
            per_watcher_max: seen.iter().map(|s| s.deliveries).max().unwrap_or(0),
            ..Self::default()
        };
        for s in seen {
            t.got += s.deliveries;
            t.out_of_order += s.out_of_order;
            t.invalid += s.invalid;
            t.unstamped += s.unstamped;
            t.missing += acked
                .iter()
                .zip(&s.per_agent)
                .map(|(&a, &(_, n))| a.saturating_sub(n))
                .sum::<u64>();
        }
        t
    }

    /// What is wrong, if anything: ", 3 missing, ...".
    fn problems(&self) -> String {
        let mut out = String::new();
        for (n, what) in [
            (self.missing, "deliveries missing"),
            (self.out_of_order, "out of order"),
            (self.invalid, "not a valid summary of its key"),
            (self.unstamped, "without a put time"),
        ] {
            if n > 0 {
                let _ = write!(out, ", {n} {what}");
            }
        }
        out
    }
}

#[expect(clippy::cast_precision_loss, reason = "microseconds to milliseconds")]
fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

#[expect(clippy::cast_precision_loss, reason = "counts for display")]
fn per_s(n: u64, secs: f64) -> f64 {
    n as f64 / secs
}

pub(super) fn render(o: &Outcome<'_>) -> String {
    let (shape, shared) = (o.shape, o.shared);
    let puts = shared.puts.load(Ordering::Relaxed);
    let secs = f64::from(shape.seconds);
    #[expect(clippy::cast_precision_loss, reason = "counts for display")]
    let asked = shape.agents as f64 / shape.interval.as_secs_f64();
    let expected = puts * shape.watchers as u64;
    let t = Totals::of(o.acked, o.seen);
    let p99 = shared.delivery.quantile(0.99);
    let pass = u128::from(p99) <= BUDGET.as_micros()
        && t.got == expected
        && t.got > 0
        && t.problems().is_empty();
    let attempts = puts + shared.put_errors.load(Ordering::Relaxed);
    let peers = o.shared.cluster.picks.iter().map(Vec::len);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "etcd {} on loopback; {} agents, each with its lease (TTL {} s, kept alive by its own stream) and its summary (the agent's encoding, K = {DEFAULT_PEERS} and a zone of {ZONE_SIZE}: {}-{} peers, {}-{} B, mean {} B) put with it every {:?}; {} watchers of {} (a watch stream each); all over {} connections; {} s{}",
        o.etcd.version(),
        shape.agents,
        LEASE_TTL.as_secs(),
        peers.clone().min().unwrap_or(0),
        peers.max().unwrap_or(0),
        shared
            .bytes_min
            .load(Ordering::Relaxed)
            .min(shared.bytes_max.load(Ordering::Relaxed)),
        shared.bytes_max.load(Ordering::Relaxed),
        shared.bytes_total.load(Ordering::Relaxed) / attempts.max(1),
        shape.interval,
        shape.watchers,
        shared.cluster.prefix,
        shape.connections,
        shape.seconds,
        if shape.seconds < default_seconds(shape.interval) {
            " (under two intervals: not every agent publishes twice)"
        } else {
            ""
        },
    );
    let _ = writeln!(
        out,
        "writes:      {:.1} puts/s achieved of {asked:.1} asked ({puts} puts, {} errors, {} keepalive errors); put latency p50 {:.1} ms, p99 {:.1} ms",
        per_s(puts, secs),
        shared.put_errors.load(Ordering::Relaxed),
        shared.keepalive_errors.load(Ordering::Relaxed),
        ms(shared.put_latency.quantile(0.5)),
        ms(shared.put_latency.quantile(0.99)),
    );
    #[expect(clippy::cast_precision_loss, reason = "counts for display")]
    let asked_deliveries = asked * shape.watchers as f64;
    let _ = writeln!(
        out,
        "deliveries:  {} of {expected} expected ({:.0}/s of {asked_deliveries:.0}/s asked; {}-{} per watcher); latency p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} recorded)",
        t.got,
        per_s(t.got, secs),
        t.per_watcher_min,
        t.per_watcher_max,
        ms(shared.delivery.quantile(0.5)),
        ms(p99),
        ms(shared.delivery.max()),
        shared.delivery.count(),
    );
    #[expect(clippy::cast_precision_loss, reason = "bytes to MiB for display")]
    let mib = |b: i64| b as f64 / (1024.0 * 1024.0);
    let _ = writeln!(
        out,
        "etcd:        db size {:.1} MiB ({:.1} MiB in use; no compaction during the run), raft index {}; CPU {}",
        mib(o.etcd.db_size()),
        mib(o.etcd.raft_used_db_size()),
        o.etcd.raft_index(),
        o.cpu.map_or_else(
            || "unknown".into(),
            |(etcd, this)| format!(
                "{etcd:.0} % of a core (this process, agents and watchers: {this:.0} %)"
            )
        )
    );
    let _ = writeln!(
        out,
        "{}: watch delivery p99 {:.1} ms against {} ms{}",
        if pass { "PASS" } else { "FAIL" },
        ms(p99),
        BUDGET.as_millis(),
        t.problems(),
    );
    out
}
