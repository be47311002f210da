//! Node-set changes applied, through the bounded-frequency runner, to the
//! prober (the same snapshot, not a copy) and to the peer routes (also
//! re-checked after link events: a link going down takes its routes).

use std::{
    collections::BTreeMap,
    net::IpAddr,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicU32, Ordering},
    },
    time::Duration,
};

use tokio::sync::{Notify, broadcast, watch};
use tokio_util::sync::CancellationToken;

use super::endpoint_names::EndpointNames;
use crate::{
    cluster::subset::{self, ProbePeers},
    membership::{
        NodeSet,
        published::Nodes,
        routes::{PeerRoute, PeerRoutes, RouteBounds, Synced},
        sync,
    },
    probe::Prober,
};

/// How soon a sync that could not make every route runs again after `n`
/// such syncs in a row: 1 s, doubling up to 32 s.
fn retry_after(n: u32) -> Duration {
    Duration::from_secs(1 << n.min(5))
}

#[derive(Clone)]
pub(super) struct NodeSync {
    pub(super) limits: sync::Limits,
    /// The prober in service (replaced when a reload changes its settings).
    pub(super) prober: watch::Receiver<Arc<Prober>>,
    pub(super) local_name: String,
    /// This node's endpoint addresses (no route is made to them).
    pub(super) own_ips: Vec<IpAddr>,
    /// On shutdown, leave the routes (the endpoint is kept too).
    pub(super) keep_routes: bool,
    /// The source gives its first set after the start (etcd's listing):
    /// until it does, the empty set the agent starts with syncs nothing
    /// (neither at the start nor at a link's event), so that routes kept
    /// from the last run (`--keep-endpoint`, or a crash) stay while etcd
    /// is away.
    pub(super) set_comes_later: bool,
    /// Which peers the prober gets (`None`: by the set's size).
    pub(super) peers: Option<ProbePeers>,
    /// What the routes to peers are kept within.
    pub(super) bounds: RouteBounds,
    /// Where the addresses refused a route are listed (`GET /v1/nodes`).
    pub(super) source: Nodes,
    /// The etcd endpoints given by name: their addresses, resolved at each
    /// sync, are kept off every route as those given as addresses are.
    pub(super) endpoint_names: Arc<EndpointNames>,
}

/// The nodes `local` probes out of `set`: all of them, or its zone and K
/// others (routes go to every node: any of them may probe this one).
pub(super) fn probed(set: &NodeSet, local: &str, peers: Option<ProbePeers>) -> NodeSet {
    let peers = peers.unwrap_or_else(|| ProbePeers::default_for(set.len()));
    if peers.is_full_mesh(set.len()) {
        return set.clone();
    }
    let zone = set.get(local).and_then(|n| n.zone.as_deref());
    set.subset(&subset::assigned(local, zone, set, peers))
}

impl NodeSync {
    /// Applies changes until `shutdown`, then removes the routes it made
    /// (unless they are kept).
    pub(super) async fn run(
        self,
        mut nodes: watch::Receiver<NodeSet>,
        mut links: broadcast::Receiver<()>,
        shutdown: CancellationToken,
    ) {
        // `None` once stopped: a sync still under way then (its blocking
        // part cannot be cancelled) finds no routes to make.
        let routes = Arc::new(Mutex::new(Some(PeerRoutes::default())));
        let wake = Arc::new(Notify::new());
        let mut changes = nodes.clone();
        // A reload's prober gets the set too: taken over from the one it
        // replaced, which a sync under way meanwhile may have handed a
        // newer one.
        let mut reloads = self.prober.clone();
        // Only reloads from now on: the first sync is woken below.
        reloads.borrow_and_update();
        let mut reloads_open = true;
        let waker = wake.clone();
        let watch = async move {
            loop {
                tokio::select! {
                    r = changes.changed() => if r.is_err() { break },
                    r = reloads.changed(), if reloads_open => {
                        // No more reloads: the node set still changes.
                        if r.is_err() {
                            reloads_open = false;
                            continue;
                        }
                    }
                    r = links.recv() => if matches!(r, Err(broadcast::error::RecvError::Closed)) { break },
                }
                waker.notify_one();
            }
        };
        // The first run installs routes for the initial set.
        wake.notify_one();
        // Consecutive syncs that could not make every route.
        let failures = Arc::new(AtomicU32::new(0));
        let apply = sync::run(self.limits, &wake, || {
            let failures = failures.clone();
            let set = nodes.borrow_and_update().clone();
            // Nothing to sync before the source's first set (etcd's holds
            // this node at least).
            let waiting = self.set_comes_later && set.is_empty();
            let probers = self.prober.clone();
            let desired = PeerRoutes::desired(&set, Some(&self.local_name), &self.own_ips);
            let subset = probed(&set, &self.local_name, self.peers);
            let bounds = self.bounds.clone();
            let source = self.source.clone();
            let names = self.endpoint_names.clone();
            // With encryption on, health addresses go into its device (a
            // reload keeps it: changing it takes a restart).
            let encryption = probers.borrow().config().encryption.clone();
            let routes = routes.clone();
            async move {
                if waiting {
                    return None;
                }
                let synced = make_routes(routes, desired, bounds, &names, encryption).await;
                // The prober in service now (a reload may have replaced
                // it meanwhile) gets the set once its routes were tried
                // (or skipped, the encryption device unreadable: the set
                // is not held back for it): a node new to it is probed at
                // once (in the round of the nodes that joined), and its
                // health address is reached through its route.
                let prober = probers.borrow().clone();
                prober.set_nodes(subset);
                // Skipped, the routes and what was refused stay as they
                // were: tried again, as after a failure.
                let failed = synced.is_none_or(|s| {
                    source.set_refused_routes(s.refused);
                    s.failed
                });
                // A failed sync runs again without waiting for news (a
                // link that just came up gets its connected routes back
                // after the event that woke this sync); lasting failures
                // less and less often. Meanwhile any news wakes it.
                if failed {
                    Some(retry_after(failures.fetch_add(1, Ordering::Relaxed)))
                } else {
                    failures.store(0, Ordering::Relaxed);
                    None
                }
            }
        });
        tokio::select! {
            () = shutdown.cancelled() => {}
            () = watch => {}
            () = apply => {}
        }
        let keep = self.keep_routes;
        let _ = tokio::task::spawn_blocking(move || {
            let stopped = routes.lock().unwrap_or_else(PoisonError::into_inner).take();
            if let Some(mut made) = stopped.filter(|_| !keep) {
                made.clear();
            }
        })
        .await;
    }
}

/// Makes `desired`'s routes within `bounds` (the etcd endpoints given by
/// name kept off them, and, with `encryption`, its device as the tunnel);
/// `None` when that device cannot be read now (the routes stay as they
/// are rather than flap out of the tunnel and back: tried again), or once
/// the routes are stopped.
async fn make_routes(
    routes: Arc<Mutex<Option<PeerRoutes>>>,
    desired: BTreeMap<IpAddr, PeerRoute>,
    mut bounds: RouteBounds,
    names: &EndpointNames,
    encryption: Option<Arc<crate::encryption::EncryptionMonitor>>,
) -> Option<Synced> {
    bounds.protected.extend(names.addresses().await);
    tokio::task::spawn_blocking(move || {
        if let Some(enc) = &encryption {
            bounds.tunnel = enc.device().ok()?;
        }
        // A sync that panicked left the routes as a sync leaves them: the
        // next one goes on from there. Stopped, none is made.
        routes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
            .map(|made| made.apply(&desired, &bounds))
    })
    .await
    // This sync panicked: run one again, as after a failure.
    .unwrap_or_else(|_| {
        Some(Synced {
            refused: Vec::new(),
            failed: true,
        })
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::retry_after;

    #[test]
    fn failed_syncs_are_retried_at_once_then_less_and_less_often() {
        assert_eq!(retry_after(0), Duration::from_secs(1));
        assert_eq!(retry_after(1), Duration::from_secs(2));
        assert_eq!(retry_after(5), Duration::from_secs(32));
        assert_eq!(retry_after(40), Duration::from_secs(32));
    }
}
