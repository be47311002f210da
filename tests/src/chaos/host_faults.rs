//! The faults of a node: its uplink flapping, the node replaced.

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use health_agent::probe::path::ProbeResult;
use nix::sys::signal::Signal;

use super::{Chaos, Options, ROUND, Row, resync_bound, stopped};

impl Chaos {
    /// A node's uplink deleted and made again `flaps` times within a
    /// minute, under probing. Then: every agent (the flapping node's too)
    /// sees every node again, its endpoint ready, no task of its agent
    /// past its restart budget.
    pub(super) fn uplink_flap(&mut self, row: &mut Row, opts: Options) {
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

    /// A node stopped for good (its agent killed, its namespaces
    /// removed) and a new node joining. Its record stays for the lease
    /// TTL (15 minutes): every agent must call it down. Run last: the
    /// cluster keeps the change.
    pub(super) fn node_replaced(&mut self, row: &mut Row) {
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
}
