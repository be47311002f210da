//! The faults of one agent: cut off from etcd, killed again and again.

use std::{collections::BTreeSet, process::Command, time::Duration};

use nix::sys::signal::Signal;

use super::{
    Chaos, Options, Row,
    resources::{change_pct, settled_fds_and_rss, within_10pct},
    resync_bound, stopped,
};

impl Chaos {
    /// One agent cut off from etcd (nft drops its packets to the
    /// members' client port) while it still reaches its peers.
    pub(super) fn agent_cut_off(&mut self, row: &mut Row, opts: Options) {
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

    /// One agent killed with SIGKILL and restarted `kills` times, 2 s
    /// apart, under probing; then the leak checks.
    pub(super) fn agent_kill_loop(&mut self, row: &mut Row, opts: Options) {
        let victim = self.n() - 1;
        let name = self.cluster.nodes[victim].name.clone();
        row.fault = format!(
            "{name}'s agent SIGKILLed and restarted {} times",
            opts.kills
        );
        let before = self.resources_at_rest(victim);
        let record = format!("{}{name}", crate::cluster::ETCD_PREFIX);
        let lease_of = |chaos: &Self| {
            let etcd = chaos.cluster.etcd_cluster.as_ref()?;
            let keys = etcd.keys(&record)?;
            keys.iter().find(|(k, _)| *k == record).map(|(_, l)| *l)
        };
        let lease_before = lease_of(self);
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
        // Each run took the lease its predecessor kept over: the record
        // never went, nor moved to a lease of its own.
        match (lease_before, lease_of(self)) {
            (Some(b), Some(a)) if a == b => {
                row.held
                    .push(format!("{name}'s record kept its lease {b:x}"));
            }
            (b, a) => row.fail(format!(
                "{name}'s record's lease: {b:x?} before, {a:x?} after"
            )),
        }
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
}
