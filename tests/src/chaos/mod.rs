//! Faults injected into a live local cluster over a 3-member etcd cluster,
//! with the invariants checked every second: `cargo xtask chaos` runs
//! every scenario, the integration tests short forms of some.
//!
//! The agents run the product's defaults (lease TTL, thresholds, timeouts)
//! except a 1 s probe interval. Invariants: no node that is up is called
//! down by any agent; every agent keeps the whole node set (during an etcd
//! outage: the last one); after a fault ends, everything resyncs (no error
//! in any node set, every record in etcd) within [`resync_bound`].

mod agent_faults;
mod etcd_faults;
mod host_faults;
mod resources;
mod state_faults;

use std::{
    collections::BTreeSet,
    fmt::Write as _,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use health_agent::probe::path::ProbeResult;

use crate::cluster::{Cluster, ETCD_PREFIX, Settings};

/// Set (by a Ctrl-C handler) to end the scenario under way early: its
/// waits return, and the caller drops the cluster, which removes it.
pub static STOP: AtomicBool = AtomicBool::new(false);

fn stopped() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// The probe interval of the chaos cluster (the one setting that is not
/// the product's default): a round a second.
pub const PROBE_INTERVAL: &str = "1s";
const ROUND: Duration = Duration::from_secs(1);

/// How long a resync may take once the fault is gone (etcd serving
/// again): 2 rounds, plus 1 s for the agent to see it (etcd is asked
/// every 0.4 s, with jitter, during an outage) and reconnect.
#[must_use]
pub const fn resync_bound() -> Duration {
    Duration::from_secs(2 * ROUND.as_secs() + 1)
}

/// The scenarios, in the order `cargo xtask chaos` runs them.
pub const SCENARIOS: [&str; 8] = [
    "leader-killed",
    "agent-cut-off",
    "agent-kill-loop",
    "etcd-down",
    "uplink-flap",
    "state-read-only",
    "bpffs-unmounted",
    "node-replaced",
];

/// How hard each scenario pushes.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// How long an outage lasts (etcd down, an agent cut off).
    pub outage: Duration,
    /// How many times the kill loop kills the agent.
    pub kills: usize,
    /// How many times the flapping uplink is deleted and made again (in a
    /// minute).
    pub flaps: usize,
}

/// One scenario's outcome: a row of the table.
#[derive(Debug, Clone, Default)]
pub struct Row {
    pub scenario: String,
    pub fault: String,
    /// The invariants that held, as checked.
    pub held: Vec<String>,
    /// Invariants broken: the first few, with what was seen.
    pub failures: Vec<String>,
    /// From the end of the fault to everything resynced.
    pub recovery: Option<Duration>,
}

impl Row {
    #[must_use]
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    fn fail(&mut self, what: String) {
        if self.failures.len() < 8 && !self.failures.contains(&what) {
            self.failures.push(what);
        }
    }
}

/// The chaos cluster: N nodes, their agents on the product's defaults
/// (1 s probe interval), a 3-member etcd cluster.
pub struct Chaos {
    pub cluster: Cluster,
}

impl Chaos {
    /// Starts it and waits until every agent sees every node reachable.
    #[must_use]
    pub fn start(nodes: usize) -> Self {
        let cluster = Cluster::start(&Settings {
            nodes,
            probe_interval: PROBE_INTERVAL,
            etcd: true,
            etcd_members: 3,
            product_defaults: true,
            ..Settings::default()
        });
        let chaos = Self { cluster };
        let deadline = Instant::now() + crate::patience(Duration::from_secs(90));
        while !chaos.settled() {
            assert!(
                Instant::now() < deadline,
                "the chaos cluster did not settle: {}",
                chaos.describe()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        chaos
    }

    fn n(&self) -> usize {
        self.cluster.nodes.len()
    }

    /// What every agent says, in a line each (for a failure's message).
    #[must_use]
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for node in &self.cluster.nodes {
            let view = node.nodes_view();
            let status = node.status();
            let _ = writeln!(
                out,
                "  {}: {} nodes (error: {:?}), {} reachable",
                node.name,
                view.as_ref().map_or(0, |v| v.nodes.len()),
                view.and_then(|v| v.error),
                status.map_or(0, |s| s.reachable())
            );
        }
        out
    }

    /// Every agent answers, sees every node, without an error, all
    /// reachable; etcd holds every record.
    fn settled(&self) -> bool {
        let n = self.n();
        self.cluster.nodes.iter().all(|node| {
            node.nodes_view()
                .is_some_and(|v| v.nodes.len() == n && v.error.is_none())
                && node.status().is_some_and(|s| s.reachable() == n)
        }) && self.records().is_some_and(|k| k.len() == n)
    }

    /// The node records in etcd, with their leases.
    fn records(&self) -> Option<Vec<(String, i64)>> {
        self.cluster.etcd_cluster.as_ref()?.keys(ETCD_PREFIX)
    }

    /// One check of the invariants (every agent but `skip`'s; nodes in
    /// `down` may be called down). `outage`: the node set may carry an
    /// error (the agent says it probes the last known set) but keeps every
    /// node.
    fn check(&self, row: &mut Row, skip: Option<usize>, outage: &BTreeSet<usize>) {
        let n = self.n();
        for (i, node) in self.cluster.nodes.iter().enumerate() {
            if Some(i) == skip {
                continue;
            }
            match node.nodes_view() {
                None => row.fail(format!("{} stopped answering", node.name)),
                Some(v) if v.nodes.len() != n => row.fail(format!(
                    "{} lost nodes: {} of {n} ({:?})",
                    node.name,
                    v.nodes.len(),
                    v.error
                )),
                Some(v) if v.error.is_some() && !outage.contains(&i) => {
                    row.fail(format!(
                        "{}'s node set in error: {:?}; its log about etcd:\n{}",
                        node.name,
                        v.error,
                        etcd_log_tail(&node.log())
                    ));
                }
                Some(_) => {}
            }
            if let Some(s) = node.status() {
                for peer in &s.nodes {
                    let j = self.cluster.nodes.iter().position(|x| x.name == peer.name);
                    if peer.state() == ProbeResult::Failure && j != skip {
                        row.fail(format!(
                            "{} calls {} down, which is up",
                            node.name, peer.name
                        ));
                    }
                }
            }
        }
    }

    /// Checks the invariants every second for `d`.
    fn watch(&self, row: &mut Row, d: Duration, skip: Option<usize>, outage: &BTreeSet<usize>) {
        let end = Instant::now() + d;
        while Instant::now() < end && !stopped() {
            self.check(row, skip, outage);
            std::thread::sleep(ROUND.min(end.saturating_duration_since(Instant::now())));
        }
    }

    /// Waits (checking) until everything resyncs; the time it took, or a
    /// failure after `bound` plus a grace to say how late.
    fn resync(&self, row: &mut Row, bound: Duration) {
        let start = Instant::now();
        let give_up = start + bound + Duration::from_secs(60);
        while !self.settled() {
            if stopped() {
                row.fail("stopped".into());
                return;
            }
            if Instant::now() > give_up {
                row.fail(format!(
                    "no resync in {}s:\n{}",
                    give_up.duration_since(start).as_secs(),
                    self.describe()
                ));
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let took = start.elapsed();
        row.recovery = Some(took);
        if took > bound {
            row.fail(format!(
                "resync took {:.1}s, over {}s",
                took.as_secs_f64(),
                bound.as_secs()
            ));
        }
    }

    /// Runs scenario `name`.
    ///
    /// # Panics
    /// On an unknown name (the callers check it against [`SCENARIOS`]).
    pub fn run(&mut self, name: &str, opts: Options) -> Row {
        let mut row = Row {
            scenario: name.to_owned(),
            ..Row::default()
        };
        match name {
            "leader-killed" => self.leader_killed(&mut row, opts),
            "agent-cut-off" => self.agent_cut_off(&mut row, opts),
            "agent-kill-loop" => self.agent_kill_loop(&mut row, opts),
            "etcd-down" => self.etcd_down(&mut row, opts),
            "uplink-flap" => self.uplink_flap(&mut row, opts),
            "state-read-only" => self.state_read_only(&mut row),
            "bpffs-unmounted" => self.bpffs_unmounted(&mut row),
            "node-replaced" => self.node_replaced(&mut row),
            other => panic!("unknown scenario {other:?}"),
        }
        row
    }

    fn rounds(&self) -> Vec<u64> {
        self.cluster
            .nodes
            .iter()
            .map(|n| n.status().and_then(|s| s.round).map_or(0, |r| r.seq))
            .collect()
    }
}

/// The last lines of an agent's log that speak of etcd.
fn etcd_log_tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("etcd")).collect();
    lines[lines.len().saturating_sub(6)..].join("\n")
}

/// The table: one row per scenario, then `N passed, M failed`.
#[must_use]
pub fn render(rows: &[Row]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<16} {:<48} {:>9}  result",
        "scenario", "fault", "recovery"
    );
    for r in rows {
        let recovery = r
            .recovery
            .map_or_else(|| "-".to_owned(), |d| format!("{:.1}s", d.as_secs_f64()));
        let result = if r.passed() { "passed" } else { "FAILED" };
        let _ = writeln!(
            out,
            "{:<16} {:<48} {:>9}  {result}",
            r.scenario, r.fault, recovery
        );
        for h in &r.held {
            let _ = writeln!(out, "{:<16}   held: {h}", "");
        }
        for f in &r.failures {
            let _ = writeln!(out, "{:<16}   broke: {f}", "");
        }
    }
    let passed = rows.iter().filter(|r| r.passed()).count();
    let _ = writeln!(out, "{passed} passed, {} failed", rows.len() - passed);
    out
}
