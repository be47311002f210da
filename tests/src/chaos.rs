//! Faults injected into a live local cluster over a 3-member etcd cluster,
//! with the invariants checked every second: `cargo xtask chaos` runs
//! every scenario, the integration tests short forms of some.
//!
//! The agents run the product's defaults (lease TTL, thresholds, timeouts)
//! except a 1 s probe interval. Invariants: no node that is up is called
//! down by any agent; every agent keeps the whole node set (during an etcd
//! outage: the last one); after a fault ends, everything resyncs (no error
//! in any node set, every record in etcd) within [`resync_bound`].

use std::{
    collections::BTreeSet,
    fmt::Write as _,
    fs,
    path::Path,
    process::Command,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use health_agent::{
    cluster::view_cell::ClusterReply, probe::path::ProbeResult, sys::netlink::in_netns,
};
use health_common::maps::MapId;
use nix::sys::signal::Signal;

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

    fn etcd(&mut self) -> &mut crate::etcd_cluster::EtcdCluster {
        self.cluster.etcd_cluster.as_mut().expect("an etcd cluster")
    }

    /// (1) The etcd leader killed (SIGKILL), then restarted.
    fn leader_killed(&mut self, row: &mut Row, opts: Options) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let leader = loop {
            if let Some(l) = self.etcd().leader() {
                break l;
            }
            if Instant::now() > deadline {
                row.fail("no etcd leader".into());
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        let before = self.records().unwrap_or_default();
        row.fault = format!("etcd leader {} killed", self.etcd().members[leader].name);
        let killed = Instant::now();
        self.etcd().stop(leader, Signal::SIGKILL);
        let elected = loop {
            match self.etcd().leader() {
                Some(l) if l != leader => break Some(killed.elapsed()),
                _ if killed.elapsed() > Duration::from_secs(15) => break None,
                _ => {}
            }
            self.check(row, None, &BTreeSet::new());
            std::thread::sleep(Duration::from_millis(100));
        };
        match elected {
            Some(t) => row
                .held
                .push(format!("new leader in {:.1}s", t.as_secs_f64())),
            None => row.fail("no new leader in 15 s".into()),
        }
        let hold = opts.outage.min(Duration::from_secs(10));
        self.watch(row, hold, None, &BTreeSet::new());
        let after = self.records().unwrap_or_default();
        if after == before {
            row.held.push("records kept on their leases".into());
        } else {
            row.fail(format!("records changed: {before:?} -> {after:?}"));
        }
        self.etcd().restart(leader);
        self.etcd().wait_answering(leader, Duration::from_secs(30));
        row.fault.push_str(", restarted");
        self.resync(row, resync_bound());
        row.held.push("node sets kept, nobody called down".into());
    }

    /// (3) One agent cut off from etcd (nft drops its packets to the
    /// members' client port) while it still reaches its peers.
    fn agent_cut_off(&mut self, row: &mut Row, opts: Options) {
        let victim = self.n() - 1;
        let name = self.cluster.nodes[victim].name.clone();
        row.fault = format!("{name} cut off from etcd ({}s)", opts.outage.as_secs());
        if let Err(e) = self.nft(victim, true) {
            row.fail(e);
            return;
        }
        let outage = BTreeSet::from([victim]);
        self.watch(row, opts.outage, None, &outage);
        let said = self.cluster.nodes[victim]
            .nodes_view()
            .and_then(|v| v.error)
            .is_some();
        if let Err(e) = self.nft(victim, false) {
            row.fail(e);
        }
        if said {
            row.held
                .push(format!("{name} said its set is the last known"));
        } else if opts.outage > Duration::from_secs(30) {
            row.fail(format!("{name} did not say etcd is out of reach"));
        }
        self.resync(row, resync_bound() + Duration::from_secs(15));
        row.held
            .push(format!("{name} kept probing its set; nobody called down"));
    }

    /// Adds (or removes) the nft table that drops node `i`'s packets to
    /// etcd's client port.
    fn nft(&self, i: usize, add: bool) -> Result<(), String> {
        let rules = if add {
            format!(
                "table inet chaos {{\n chain out {{\n  type filter hook output priority 0;\n  \
                 tcp dport {} drop\n }}\n}}\n",
                crate::etcd_cluster::CLIENT_PORT
            )
        } else {
            "delete table inet chaos".to_owned()
        };
        let mut cmd = Command::new("nft");
        cmd.args(["-f", "-"]);
        crate::process::enter(&mut cmd, &self.cluster.nodes[i].ns);
        let mut child = cmd
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("nft (Debian package nftables): {e}"))?;
        if let Some(mut stdin) = child.stdin.take() {
            use std::io::Write as _;
            let _ = stdin.write_all(rules.as_bytes());
        }
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("nft: {}", String::from_utf8_lossy(&out.stderr)))
        }
    }

    /// (4) One agent killed with SIGKILL and restarted `kills` times, 2 s
    /// apart, under probing; then the leak checks.
    fn agent_kill_loop(&mut self, row: &mut Row, opts: Options) {
        let victim = self.n() - 1;
        let name = self.cluster.nodes[victim].name.clone();
        row.fault = format!(
            "{name}'s agent SIGKILLed and restarted {} times",
            opts.kills
        );
        let before = self.resources_at_rest(victim);
        let others_before: Vec<(usize, Option<(usize, u64)>)> = (0..victim)
            .map(|i| (i, self.cluster.nodes[i].pid().and_then(settled_fds_and_rss)))
            .collect();
        for _ in 0..opts.kills {
            if stopped() {
                break;
            }
            self.cluster.stop_agent(victim, Signal::SIGKILL);
            self.cluster.start_agent(victim);
            self.watch(row, Duration::from_secs(2), Some(victim), &BTreeSet::new());
        }
        let bound = resync_bound() + Duration::from_secs(10);
        self.resync(row, bound);
        if let Some(t) = row.recovery {
            row.held.push(format!(
                "{name} back, every node reachable, {:.1}s after the loop",
                t.as_secs_f64()
            ));
        }
        let after = self.resources_settled(victim, &before);
        for (what, b, a) in before.iter().zip(&after).map(|((w, b), (_, a))| (w, b, a)) {
            if a > b {
                row.fail(format!("leaked {what}: {b} before, {a} after"));
                if *what == "etcd leases"
                    && let Some(e) = self.cluster.etcd_cluster.as_ref()
                {
                    eprintln!("etcd's leases after the kill loop:\n{}", e.lease_details());
                }
            }
        }
        if row.failures.is_empty() {
            row.held
                .push("no leaked namespaces, links, routes, pins, etcd keys or leases".into());
        }
        let mut largest = (0.0f64, 0.0f64);
        for (i, b) in others_before {
            let node = &self.cluster.nodes[i];
            match (b, node.pid().and_then(settled_fds_and_rss)) {
                (Some((fd0, rss0)), Some((fd1, rss1))) => {
                    largest.0 = largest.0.max(change_pct(fd0 as u64, fd1 as u64));
                    largest.1 = largest.1.max(change_pct(rss0, rss1));
                    if !within_10pct(fd0 as u64, fd1 as u64) || !within_10pct(rss0, rss1) {
                        row.fail(format!(
                            "{}: fds {fd0} -> {fd1}, RSS {rss0} -> {rss1} kB",
                            node.name
                        ));
                    }
                }
                _ => row.fail(format!("{}'s agent is gone", node.name)),
            }
        }
        if row.failures.is_empty() {
            row.held.push(format!(
                "other agents' fds and RSS within 10 % (at most {:+.1} % and {:+.1} %)",
                largest.0, largest.1
            ));
        }
    }

    /// [`Self::resources`] once every agent holds its two etcd leases (its
    /// record's and its election's): a fault just before (an agent cut off
    /// from etcd) can leave an agent campaigning again for a few seconds,
    /// and a count taken then would call the lease it gets back a leak.
    /// Bounded: past twice the election TTL and 10 s, the count as it is.
    fn resources_at_rest(&self, i: usize) -> Vec<(&'static str, usize)> {
        let Some(etcd) = self.cluster.etcd_cluster.as_ref() else {
            return self.resources(i);
        };
        let deadline = Instant::now()
            + 2 * health_agent::daemon::cluster_view::ELECTION_TTL
            + Duration::from_secs(10);
        while etcd.leases().map_or(0, |l| l.len()) < 2 * self.n() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(250));
        }
        self.resources(i)
    }

    /// [`Self::resources`] once the killed agents' election leases have
    /// had time to end: etcd expires each within the election TTL (plus
    /// its expiry sweep), so only a count still above `before` after that
    /// is a leak.
    fn resources_settled(
        &self,
        i: usize,
        before: &[(&'static str, usize)],
    ) -> Vec<(&'static str, usize)> {
        let deadline = Instant::now()
            + 2 * health_agent::daemon::cluster_view::ELECTION_TTL
            + Duration::from_secs(2);
        loop {
            let now = self.resources(i);
            let grown = before.iter().zip(&now).any(|((_, b), (_, a))| a > b);
            if !grown || Instant::now() >= deadline {
                return now;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// What node `i` holds that a restarted agent could leak: namespaces,
    /// its links and routes, its pins, the agent's sockets, etcd's keys
    /// and leases.
    fn resources(&self, i: usize) -> Vec<(&'static str, usize)> {
        let node = &self.cluster.nodes[i];
        let etcd = self.cluster.etcd_cluster.as_ref();
        let summaries = health_agent::daemon::cluster_view::summaries_prefix(ETCD_PREFIX);
        vec![
            (
                "namespaces",
                fs::read_dir(health_agent::sys::netns::NETNS_RUN_DIR).map_or(0, |entries| {
                    entries
                        .flatten()
                        // The agent's: its endpoint's, and any made
                        // beside it (other tests of this process make
                        // their own meanwhile).
                        .filter(|e| {
                            e.file_name()
                                .to_str()
                                .is_some_and(|n| n.starts_with(&node.endpoint_netns))
                        })
                        .count()
                }),
            ),
            ("links", ip_lines(&node.ns, &["-o", "link", "show"])),
            (
                "routes",
                ip_lines(&node.ns, &["-o", "route", "show", "table", "all"]),
            ),
            ("pins", count_files(&node.pins)),
            (
                // Besides its etcd connections (the client holds one to a
                // member or several), at rest (the fewest of 5 samples).
                "agent sockets",
                node.pid().map_or(0, |p| {
                    (0..5)
                        .map(|_| {
                            std::thread::sleep(Duration::from_millis(300));
                            sockets_of(p).saturating_sub(crate::etcd_cluster::etcd_connections(p))
                        })
                        .min()
                        .unwrap_or(0)
                }),
            ),
            (
                "etcd keys",
                etcd.and_then(|e| e.keys(ETCD_PREFIX))
                    .map_or(0, |k| k.len())
                    + etcd.and_then(|e| e.keys(&summaries)).map_or(0, |k| k.len()),
            ),
            (
                "etcd leases",
                etcd.and_then(crate::etcd_cluster::EtcdCluster::leases)
                    .map_or(0, |l| l.len()),
            ),
        ]
    }

    /// (2) Every etcd member stopped for `outage`, then started.
    fn etcd_down(&mut self, row: &mut Row, opts: Options) {
        row.fault = format!("all 3 etcd members stopped {}s", opts.outage.as_secs());
        let rounds_before: Vec<u64> = self.rounds();
        for m in 0..3 {
            self.etcd().stop(m, Signal::SIGTERM);
        }
        let everyone: BTreeSet<usize> = (0..self.n()).collect();
        self.watch(row, opts.outage, None, &everyone);
        // By now (2 of the assembler's rounds without a new view) every
        // agent shows the cluster view as stale, never as current.
        let current: Vec<&str> = self
            .cluster
            .nodes
            .iter()
            .filter(|n| view_current(n))
            .map(|n| n.name.as_str())
            .collect();
        if current.is_empty() {
            row.held
                .push("every agent's cluster view said stale during the outage".into());
        } else {
            row.fail(format!(
                "cluster view shown current during the outage by {current:?}"
            ));
        }
        let rounds_after = self.rounds();
        let probing = rounds_before
            .iter()
            .zip(&rounds_after)
            .all(|(b, a)| *a >= *b + opts.outage.as_secs() / 2);
        if probing {
            row.held
                .push("every agent kept probing its last node set".into());
        } else {
            row.fail(format!(
                "rounds stalled: {rounds_before:?} -> {rounds_after:?}"
            ));
        }
        for m in 0..3 {
            self.etcd().restart(m);
        }
        let restarted = Instant::now();
        for m in 0..3 {
            self.etcd().wait_answering(m, Duration::from_secs(60));
        }
        // etcd is back when it serves again: its members listen, then
        // elect a leader (an election timeout or more after a full stop).
        while self.etcd().leader().is_none() && restarted.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(50));
        }
        row.held.push(format!(
            "etcd served again {:.1}s after its members were started",
            restarted.elapsed().as_secs_f64()
        ));
        self.resync(row, resync_bound());
        row.held.push("node sets kept, nobody called down".into());
        // A new view needs an assembler elected again (its election lease
        // ran out during the outage) and a round of its.
        let back = Instant::now();
        while !self.cluster.nodes.iter().all(view_current) {
            if back.elapsed() > VIEW_BACK || stopped() {
                row.fail(format!(
                    "the cluster view not current again in {}s",
                    VIEW_BACK.as_secs()
                ));
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        row.held.push(format!(
            "every agent's cluster view current again {:.1}s after the resync",
            back.elapsed().as_secs_f64()
        ));
    }

    /// (5) A node's uplink deleted and made again `flaps` times within a
    /// minute, under probing. Then: every agent (the flapping node's too)
    /// sees every node again, its endpoint ready, no task of its agent
    /// past its restart budget.
    fn uplink_flap(&mut self, row: &mut Row, opts: Options) {
        let victim = self.n() - 1;
        let name = self.cluster.nodes[victim].name.clone();
        let flaps = opts.flaps.max(1);
        let every = Duration::from_secs(60) / u32::try_from(flaps).unwrap_or(u32::MAX);
        row.fault = format!("{name}'s uplink deleted and made again {flaps} times in 60s");
        let started = Instant::now();
        for k in 0..flaps {
            if stopped() {
                break;
            }
            if let Err(e) = self.cluster.recreate_uplink(victim) {
                row.fail(format!("making {name}'s uplink again ({k}): {e}"));
                return;
            }
            self.check(row, Some(victim), &BTreeSet::new());
            let next = started + every * u32::try_from(k + 1).unwrap_or(u32::MAX);
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        row.held.push(format!(
            "{flaps} flaps in {:.1}s; no other node called down",
            started.elapsed().as_secs_f64()
        ));
        // The flapping node's own routes to its peers went with each
        // uplink: they come back through the link events.
        self.resync(row, resync_bound() + Duration::from_secs(10));
        // Longer than the failure threshold's rounds: a path the flaps
        // left broken would be called down meanwhile.
        self.watch(row, Duration::from_secs(5), None, &BTreeSet::new());
        match self.cluster.nodes[victim].healthz() {
            Some(h) if h.state == "ok" => {
                let restarts: u32 = h.tasks.iter().map(|t| t.restarts).sum();
                row.held.push(format!(
                    "{name}'s endpoint ready, its agent ok ({restarts} task restarts, none past its budget)"
                ));
            }
            Some(h) => row.fail(format!("{name}'s agent says {:?}: {:?}", h.state, h.tasks)),
            None => row.fail(format!(
                "{name}'s agent is gone:\n{}",
                self.cluster.nodes[victim].log()
            )),
        }
    }

    /// (7a) The state directory made read-only under a running agent (a
    /// read-only bind mount: root ignores permissions), and the endpoint's
    /// veth deleted so that its repair must record the new one. The agent
    /// repairs it, says it is degraded (its record unsaved), keeps
    /// answering and probing; once the directory is writable again the
    /// record is saved, naming the veth in place.
    fn state_read_only(&mut self, row: &mut Row) {
        let victim = self.n() - 1;
        let node = &self.cluster.nodes[victim];
        let name = node.name.clone();
        let state = node.dir.join("state");
        row.fault = format!("{name}'s state directory read-only, its lxc_health deleted");
        let ro = match ReadOnly::bind(&state) {
            Ok(ro) => ro,
            Err(e) => {
                row.fail(format!("read-only bind mount of {}: {e}", state.display()));
                return;
            }
        };
        let ns = node.ns.clone();
        if let Err(e) = in_netns(
            Some(&ns),
            |nl| async move { nl.delete_link("lxc_health").await },
        ) {
            row.fail(format!("deleting {name}'s lxc_health: {e}"));
            return;
        }
        let degraded = self.wait_healthz(victim, Duration::from_secs(15), |h| {
            h.tasks.iter().any(|t| {
                t.name == "endpoint" && t.problem.as_deref().is_some_and(|p| p.contains("record"))
            })
        });
        match degraded {
            Some(t) => row.held.push(format!(
                "{name} repaired its endpoint and said in {:.1}s its record is unsaved",
                t.as_secs_f64()
            )),
            None => row.fail(format!(
                "{name} did not say its record is unsaved: {:?}",
                self.cluster.nodes[victim].healthz()
            )),
        }
        self.watch(row, Duration::from_secs(5), None, &BTreeSet::new());
        if self.settled() {
            row.held.push(format!(
                "{name} answered and probed on, every node reachable"
            ));
        } else {
            row.fail(format!(
                "not every node reachable while read-only:\n{}",
                self.describe()
            ));
        }
        drop(ro);
        let ended = Instant::now();
        let saved = self.wait_healthz(victim, Duration::from_secs(15), |h| h.state == "ok");
        row.recovery = saved.map(|_| ended.elapsed());
        if saved.is_none() {
            row.fail(format!(
                "{name} still degraded once writable: {:?}",
                self.cluster.nodes[victim].healthz()
            ));
            return;
        }
        let recorded = health_agent::endpoint::record::EndpointRecord::load(&state)
            .ok()
            .flatten()
            .and_then(|r| r.owned?.host)
            .map(|h| h.ifindex);
        let ns = self.cluster.nodes[victim].ns.clone();
        let live = in_netns(
            Some(&ns),
            |nl| async move { nl.link_index("lxc_health").await },
        )
        .ok()
        .flatten();
        if recorded.is_some() && recorded == live {
            row.held.push(format!(
                "record saved once writable, naming the lxc_health in place (index {})",
                live.unwrap_or(0)
            ));
        } else {
            row.fail(format!(
                "record names lxc_health {recorded:?}, the live one is {live:?}"
            ));
        }
    }

    /// (7b) The bpffs that holds an agent's pins unmounted under it: the
    /// agent pins the same maps again (their counters carry on), keeps
    /// answering and probing, and is not degraded once they are back.
    fn bpffs_unmounted(&mut self, row: &mut Row) {
        let victim = self.n() - 1;
        let name = self.cluster.nodes[victim].name.clone();
        let pins = self.cluster.nodes[victim].pins.clone();
        row.fault = format!("{name}'s bpffs unmounted under its agent");
        // The agent's pins in a bpffs of their own, so that unmounting it
        // touches nothing else of this machine.
        self.cluster.stop_agent(victim, Signal::SIGTERM);
        let mount = match OwnBpffs::mount(&pins) {
            Ok(m) => m,
            Err(e) => {
                row.fail(format!("mounting a bpffs on {}: {e}", pins.display()));
                self.cluster.start_agent(victim);
                return;
            }
        };
        self.cluster.start_agent(victim);
        if self
            .wait_healthz(victim, Duration::from_secs(30), |h| h.state == "ok")
            .is_none()
        {
            row.fail(format!("{name} did not start on its own bpffs"));
            return;
        }
        self.resync(row, Duration::from_secs(30));
        row.recovery = None;
        let before = pinned(&pins);
        let answered = health_agent::datapath::read_pinned_stats(&pins).map_or(0, |s| s.answered);
        let ids_before = map_ids(&pins);
        let rounds = self.rounds();
        drop(mount);
        let gone = pinned(&pins);
        let unmounted = Instant::now();
        let mut back = None;
        while unmounted.elapsed() < Duration::from_secs(15) && !stopped() {
            if pinned(&pins) == pinned_maps().count() {
                back = Some(unmounted.elapsed());
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        row.recovery = back;
        let Some(t) = back else {
            row.fail(format!(
                "pins not back in 15s: {} of {before}",
                pinned(&pins)
            ));
            return;
        };
        row.held.push(format!(
            "{before} pins, {gone} left by the unmount, all pinned again in {:.1}s",
            t.as_secs_f64()
        ));
        self.watch(row, Duration::from_secs(4), None, &BTreeSet::new());
        let again = health_agent::datapath::read_pinned_stats(&pins).map_or(0, |s| s.answered);
        let ids_after = map_ids(&pins);
        if ids_after == ids_before && again > answered {
            row.held.push(format!(
                "the same maps pinned again (their kernel IDs), echo replies counted on from {answered} to {again}"
            ));
        } else {
            row.fail(format!(
                "map IDs {ids_before:?} before, {ids_after:?} after; echo replies {answered} before, {again} after"
            ));
        }
        let advanced = rounds.iter().zip(self.rounds()).all(|(b, a)| a > *b);
        match self.cluster.nodes[victim].healthz() {
            Some(h) if h.state == "ok" && advanced => {
                row.held.push(format!("{name} probed on and is ok"));
            }
            h => row.fail(format!(
                "{name} after the unmount: {h:?}, rounds advanced: {advanced}"
            )),
        }
    }

    /// Polls node `i`'s `/v1/healthz` until `accept` holds: how long it
    /// took, or `None` after `timeout`.
    fn wait_healthz(
        &self,
        i: usize,
        timeout: Duration,
        accept: impl Fn(&health_agent::api::types::Healthz) -> bool,
    ) -> Option<Duration> {
        let start = Instant::now();
        while start.elapsed() < timeout && !stopped() {
            if self.cluster.nodes[i].healthz().is_some_and(|h| accept(&h)) {
                return Some(start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        None
    }

    /// (6) A node stopped for good (its agent killed, its namespaces
    /// removed) and a new node joining. Its record stays for the lease
    /// TTL (15 minutes): every agent must call it down. Run last: the
    /// cluster keeps the change.
    fn node_replaced(&mut self, row: &mut Row) {
        let gone = self.n() - 1;
        let name = self.cluster.nodes[gone].name.clone();
        self.cluster.stop_agent(gone, Signal::SIGKILL);
        let node = &self.cluster.nodes[gone];
        let _ = health_agent::sys::netns::Netns::named(&node.endpoint_netns).map(|ns| ns.delete());
        let _ = node.ns.delete();
        let removed = Instant::now();
        // Called down by every other agent: the failure threshold's
        // rounds (3 by default) and 2 more at most.
        let bound = ROUND * 5;
        let mut down_in = None;
        while removed.elapsed() < bound + Duration::from_secs(30) && !stopped() {
            let all = (0..gone).all(|i| {
                self.cluster.nodes[i].status().is_some_and(|s| {
                    s.nodes
                        .iter()
                        .any(|n| n.name == name && n.state() == ProbeResult::Failure)
                })
            });
            if all {
                down_in = Some(removed.elapsed());
                break;
            }
            self.check(row, Some(gone), &BTreeSet::new());
            std::thread::sleep(Duration::from_millis(200));
        }
        match down_in {
            Some(t) if t <= bound => row.held.push(format!(
                "{name} called down by every agent in {:.1}s",
                t.as_secs_f64()
            )),
            Some(t) => row.fail(format!(
                "{name} called down in {:.1}s, over {}s",
                t.as_secs_f64(),
                bound.as_secs()
            )),
            None => row.fail(format!("{name} never called down by every agent")),
        }
        let new = self.cluster.join();
        let new_name = self.cluster.nodes[new].name.clone();
        row.fault = format!("{name} removed for good, {new_name} joining");
        let joined = Instant::now();
        let n = self.n();
        let seen = loop {
            let all = (0..n).filter(|i| *i != gone).all(|i| {
                self.cluster.nodes[i].status().is_some_and(|s| {
                    s.nodes.len() == n
                        && s.nodes
                            .iter()
                            .filter(|x| x.name != name)
                            .all(health_agent::probe::status::NodeStatus::reachable)
                })
            });
            if all {
                break Some(joined.elapsed());
            }
            if joined.elapsed() > Duration::from_secs(60) || stopped() {
                break None;
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        row.recovery = seen;
        match seen {
            Some(t) => row.held.push(format!(
                "{new_name} reachable from every agent {:.1}s after its start",
                t.as_secs_f64()
            )),
            None => row.fail(format!(
                "{new_name} not seen by every agent in 60 s:\n{}",
                self.describe()
            )),
        }
    }

    fn rounds(&self) -> Vec<u64> {
        self.cluster
            .nodes
            .iter()
            .map(|n| n.status().and_then(|s| s.round).map_or(0, |r| r.seq))
            .collect()
    }
}

/// A read-only bind mount of a directory over itself, removed when
/// dropped.
struct ReadOnly(std::path::PathBuf);

impl ReadOnly {
    fn bind(dir: &Path) -> nix::Result<Self> {
        use nix::mount::{MsFlags, mount};
        mount(Some(dir), dir, None::<&str>, MsFlags::MS_BIND, None::<&str>)?;
        let ro = Self(dir.to_owned());
        mount(
            None::<&str>,
            dir,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None::<&str>,
        )?;
        Ok(ro)
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// A bpffs of its own mounted on a directory (made if needed), unmounted
/// (lazily: whatever holds it keeps it) when dropped.
struct OwnBpffs(std::path::PathBuf);

impl OwnBpffs {
    fn mount(dir: &Path) -> Result<Self, String> {
        fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        nix::mount::mount(
            Some("bpf"),
            dir,
            Some("bpf"),
            nix::mount::MsFlags::empty(),
            Some("mode=0700"),
        )
        .map_err(|e| e.to_string())?;
        Ok(Self(dir.to_owned()))
    }
}

impl Drop for OwnBpffs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// How long after a resync every agent's cluster view may take to be
/// current again: an election (its lease, 3 s, ran out) and 2 rounds.
const VIEW_BACK: Duration = Duration::from_secs(5);

/// Whether `node` shows a cluster view that is current (not stale).
fn view_current(node: &crate::cluster::ClusterNode) -> bool {
    node.cluster_json::<ClusterReply>()
        .and_then(|r| r.assembly)
        .is_some_and(|a| !a.stale)
}

/// The last lines of an agent's log that speak of etcd.
fn etcd_log_tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("etcd")).collect();
    lines[lines.len().saturating_sub(6)..].join("\n")
}

/// The change from `before` to `after`, in per cent (signed by its
/// larger side).
#[allow(
    clippy::cast_precision_loss,
    reason = "descriptor counts and kilobytes, far below 2^52"
)]
fn change_pct(before: u64, after: u64) -> f64 {
    if before == 0 {
        return 0.0;
    }
    (after as f64 - before as f64) / before as f64 * 100.0
}

fn within_10pct(before: u64, after: u64) -> bool {
    after <= before + before.div_ceil(10)
}

/// Lines `ip ARGS` prints in `ns`.
fn ip_lines(ns: &health_agent::sys::netns::Netns, args: &[&str]) -> usize {
    let mut cmd = Command::new("ip");
    cmd.args(args);
    crate::process::enter(&mut cmd, ns);
    cmd.output()
        .map_or(0, |o| String::from_utf8_lossy(&o.stdout).lines().count())
}

/// The kernel IDs of the maps pinned in `dir`, in [`MapId::ALL`] order
/// (`None` where a pin is missing).
fn map_ids(dir: &Path) -> Vec<Option<u32>> {
    MapId::ALL
        .iter()
        .map(|m| {
            aya::maps::MapInfo::from_pin(dir.join(m.name()))
                .ok()
                .map(|i| i.id())
        })
        .collect()
}

/// How many of the datapath's maps have their pin in `dir`.
/// The maps the agent pins: all but aya-log's ring buffer.
fn pinned_maps() -> impl Iterator<Item = MapId> {
    MapId::ALL.into_iter().filter(|m| *m != MapId::AyaLogs)
}

/// How many of [`pinned_maps`] are pinned under `dir`.
fn pinned(dir: &Path) -> usize {
    pinned_maps()
        .filter(|m| fs::symlink_metadata(dir.join(m.name())).is_ok())
        .count()
}

fn count_files(dir: &Path) -> usize {
    fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .map(|e| {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    count_files(&e.path())
                } else {
                    1
                }
            })
            .sum()
    })
}

/// The sockets among `pid`'s descriptors.
fn sockets_of(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |entries| {
        entries
            .flatten()
            .filter(|e| {
                fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))
            })
            .count()
    })
}

/// [`fds_and_rss`] at rest: the fewest descriptors and least memory of
/// 5 samples over 1.5 s (probes in flight hold sockets for a moment).
fn settled_fds_and_rss(pid: u32) -> Option<(usize, u64)> {
    let samples: Vec<(usize, u64)> = (0..5)
        .filter_map(|_| {
            std::thread::sleep(Duration::from_millis(300));
            fds_and_rss(pid)
        })
        .collect();
    Some((
        samples.iter().map(|s| s.0).min()?,
        samples.iter().map(|s| s.1).min()?,
    ))
}

/// `pid`'s descriptor count and resident memory (kB).
#[must_use]
pub fn fds_and_rss(pid: u32) -> Option<(usize, u64)> {
    let fds = fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count();
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some((fds, rss))
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
