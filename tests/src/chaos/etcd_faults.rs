//! The faults of etcd: its leader killed, every member stopped.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use health_agent::cluster::view_cell::ClusterReply;
use nix::sys::signal::Signal;

use super::{Chaos, Options, Row, resync_bound, stopped};

/// How long after a resync every agent's cluster view may take to be
/// current again: an election (its lease, 3 s, ran out) and 2 rounds.
const VIEW_BACK: Duration = Duration::from_secs(5);

/// Whether `node` shows a cluster view that is current (not stale).
fn view_current(node: &crate::cluster::ClusterNode) -> bool {
    node.cluster_json::<ClusterReply>()
        .and_then(|r| r.assembly)
        .is_some_and(|a| !a.stale)
}

impl Chaos {
    fn etcd(&mut self) -> &mut crate::etcd_cluster::EtcdCluster {
        self.cluster.etcd_cluster.as_mut().expect("an etcd cluster")
    }

    /// The etcd leader killed (SIGKILL), then restarted.
    pub(super) fn leader_killed(&mut self, row: &mut Row, opts: Options) {
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

    /// Every etcd member stopped for `outage`, then started.
    pub(super) fn etcd_down(&mut self, row: &mut Row, opts: Options) {
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
}
