//! What a restarted agent could leak, counted (its node's namespaces,
//! links, routes, pins, sockets, etcd keys and leases), and the other
//! agents' descriptors and memory, compared before and after.

use std::{
    fs,
    path::Path,
    time::{Duration, Instant},
};

use super::Chaos;
use crate::cluster::ETCD_PREFIX;

impl Chaos {
    /// [`Self::resources`] once every agent holds its two etcd leases (its
    /// record's and its election's): a fault just before (an agent cut off
    /// from etcd) can leave an agent campaigning again for a few seconds,
    /// and a count taken then would call the lease it gets back a leak.
    /// Bounded: past twice the election TTL and 10 s, the count as it is.
    pub(super) fn resources_at_rest(&self, i: usize) -> Vec<(&'static str, usize)> {
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
    pub(super) fn resources_settled(
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
        let (links, routes) = links_and_routes(&node.ns);
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
            ("links", links),
            ("routes", routes),
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
}

/// The change from `before` to `after`, in per cent (signed by its
/// larger side).
#[allow(
    clippy::cast_precision_loss,
    reason = "descriptor counts and kilobytes, far below 2^52"
)]
pub(super) fn change_pct(before: u64, after: u64) -> f64 {
    if before == 0 {
        return 0.0;
    }
    (after as f64 - before as f64) / before as f64 * 100.0
}

pub(super) fn within_10pct(before: u64, after: u64) -> bool {
    after <= before + before.div_ceil(10)
}

/// The links of `ns`, and its routes of both families in every table,
/// listed over netlink; a listing that fails fails the check (a count of
/// nothing would hide a leak).
fn links_and_routes(ns: &health_agent::sys::netns::Netns) -> (usize, usize) {
    use std::net::{Ipv4Addr, Ipv6Addr};
    health_agent::sys::netlink::in_netns(Some(ns), |nl| async move {
        let links = nl.links().await?.len();
        let routes = nl.routes::<Ipv4Addr>().await?.len() + nl.routes::<Ipv6Addr>().await?.len();
        Ok((links, routes))
    })
    .expect("listing a node's links and routes")
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
pub(super) fn settled_fds_and_rss(pid: u32) -> Option<(usize, u64)> {
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
fn fds_and_rss(pid: u32) -> Option<(usize, u64)> {
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
