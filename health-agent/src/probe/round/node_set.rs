//! The nodes probed: a new set keeps the paths of the nodes still in it
//! (less the families they lost), forgets the others' and is published
//! at once.

use std::sync::Arc;

use super::{Prober, RoundKind};
use crate::membership::NodeSet;
use crate::probe::{
    family::{self, Family, Shown},
    http_round,
    targets::{EchoTrack, target_count, warn_unprobed},
};

impl Prober {
    /// The nodes probed (the snapshot, shared).
    #[must_use]
    pub fn nodes(&self) -> NodeSet {
        self.nodes.read().map(|n| n.clone()).unwrap_or_default()
    }

    /// A quiet round (`RoundKind::Joined`) over the nodes never probed
    /// (those that joined since the last round took their targets), and
    /// over those such rounds left with a path undecided, each up to
    /// `Prober::follow_ups` more times: a node just starting can miss the
    /// first probe, and with a failure threshold above one a path needs
    /// several to fail. The nodes it probed, none when there was nothing
    /// to do. While some node has such rounds to come, the scheduler is
    /// told as of a join: the next goes a gap after this one began.
    pub async fn probe_joined(self: &Arc<Self>) -> usize {
        // Read in the rounds' turn: a round that ran meanwhile probed them.
        let turn = self.turn().await;
        let nodes = self.nodes();
        let (picked, never) = self.joined_now(&nodes);
        if !picked.is_empty() {
            self.round_in_turn(turn, nodes.subset(&picked), RoundKind::Joined)
                .await;
        }
        if self.after_joined(&nodes, &picked, &never) {
            self.joins_more();
        }
        picked.len()
    }

    /// The nodes (indices into `nodes`, sorted) a round of the nodes that
    /// joined probes now, and of them those never probed.
    pub(super) fn joined_now(&self, nodes: &NodeSet) -> (Vec<usize>, Vec<usize>) {
        let never = self.never_probed(nodes);
        let again = self.joined_undecided(nodes);
        // Disjoint: the nodes never probed have no paths to be undecided.
        let mut picked: Vec<usize> = never.iter().chain(&again).copied().collect();
        picked.sort_unstable();
        (picked, never)
    }

    /// Tells the scheduler a round of the nodes that joined is due.
    pub(super) fn joins_more(&self) {
        self.joined.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The nodes (indices into `nodes`) left with a path undecided by the
    /// rounds of the nodes that joined, with rounds to come: each has one
    /// fewer now. Those decided meanwhile (by another round) have none
    /// left. No pass over the set when no node has rounds to come.
    pub(super) fn joined_undecided(&self, nodes: &NodeSet) -> Vec<usize> {
        if !self.joining.load(std::sync::atomic::Ordering::Relaxed) {
            return Vec::new();
        }
        let Ok(mut paths) = self.paths.lock() else {
            return Vec::new();
        };
        let families = self.cfg.families;
        (0..nodes.len())
            .filter(|&i| {
                let n = &nodes[i];
                let Some(p) = paths.get_mut(n.name.as_str()) else {
                    return false;
                };
                if p.join_rounds == 0 {
                    return false;
                }
                if !p.undecided(n, families) {
                    p.join_rounds = 0;
                    return false;
                }
                p.join_rounds -= 1;
                true
            })
            .collect()
    }

    /// After a round of the nodes that joined over `picked` (indices into
    /// `nodes`; `never`, sorted, those never probed before it): a node
    /// probed for the first time that some path left undecided gets
    /// [`Self::follow_ups`] rounds to come, a decided one none. Whether
    /// some node has rounds to come (kept in `joining`).
    pub(super) fn after_joined(&self, nodes: &NodeSet, picked: &[usize], never: &[usize]) -> bool {
        let follow_ups = self.follow_ups();
        let Ok(mut paths) = self.paths.lock() else {
            return false;
        };
        let mut more = false;
        for &i in picked {
            let n = &nodes[i];
            // Gone from the set meanwhile: nothing to come.
            let Some(p) = paths.get_mut(n.name.as_str()) else {
                continue;
            };
            if !p.undecided(n, self.cfg.families) {
                p.join_rounds = 0;
            } else if never.binary_search(&i).is_ok() {
                p.join_rounds = follow_ups;
            }
            more |= p.join_rounds > 0;
        }
        self.joining
            .store(more, std::sync::atomic::Ordering::Relaxed);
        more
    }

    /// The indices of `nodes`' nodes that no round has recorded, of those
    /// with an address to probe (a node with none never has a record).
    pub(super) fn never_probed(&self, nodes: &NodeSet) -> Vec<usize> {
        let Ok(paths) = self.paths.lock() else {
            return Vec::new();
        };
        (0..nodes.len())
            .filter(|&i| {
                let n = &nodes[i];
                !paths.contains_key(n.name.as_str())
                    && Family::ALL
                        .into_iter()
                        .any(|f| self.cfg.families.contains(f) && family::addresses(n, f).is_some())
            })
            .collect()
    }

    /// Replaces the node set (the snapshot, shared): removed nodes' paths
    /// are forgotten, new ones start Unknown, and the published status
    /// shows the new set at once.
    pub fn set_nodes(&self, nodes: NodeSet) {
        // The node sync runs at least once a minute with the set unchanged:
        // then there is nothing to redo (not a snapshot of the whole
        // status, which at 5,000 nodes is megabytes, in the middle of a
        // round).
        let Ok(before) = self.nodes.read().map(|n| n.clone()) else {
            return;
        };
        if before == nodes {
            return;
        }
        // A node new to the set, or one whose record changed (an address
        // it lacked, to be probed now, comes in a later record).
        let gained = nodes.iter().any(|n| before.get(&n.name) != Some(n));
        let gone = addresses_gone(&before, &nodes);
        let mut moved_any = false;
        let follow_ups = self.follow_ups();
        if let Ok(mut paths) = self.paths.lock() {
            // A node that lost a family's addresses (or kept them where
            // this agent does not probe) forgets that family's paths; so
            // does one whose addresses of a family changed: their paths
            // start Unknown, and are probed at once as a new node's are,
            // never showing the old address's verdict for the new one.
            paths.retain(|name, p| match nodes.get(name) {
                Some(n) => {
                    let moved = before.get(name).map_or(0, |old| family::moved(old, n));
                    let mask = Shown::of(n, self.cfg.families)
                        .probed()
                        .fold(0u8, |m, f| m | 1 << f.index())
                        & !moved;
                    p.history.retain_families(mask);
                    for f in Family::ALL {
                        if mask & (1 << f.index()) == 0 {
                            p.forget(f);
                        }
                        if moved & (1 << f.index()) != 0 {
                            p.echo[f.index()] = EchoTrack::default();
                        }
                    }
                    if moved != 0 {
                        p.join_rounds = follow_ups;
                        moved_any = true;
                    }
                    true
                }
                None => false,
            });
            if moved_any {
                self.joining
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
            // Set while the paths are locked: a round recording its
            // results a chunk of nodes at a time reads the set under the
            // same lock, so it never brings back a node just removed.
            if let Ok(mut n) = self.nodes.write() {
                *n = nodes.clone();
            }
        }
        drop(before);
        warn_unprobed(&nodes, self.cfg.families);
        // The round's sockets get their descriptor slots now, before the
        // round, not by the table's doubling under its load.
        http_round::reserve_descriptors(&self.cfg, target_count(&nodes, self.cfg.families));
        if let Ok(mut n) = self.nodes.write() {
            *n = nodes;
        }
        // A node gone, or an address it dropped or changed: the kernel's
        // samples, losses and pending requests of the addresses no node
        // has any more go, in the next turn (see `Prober::turn`). Set
        // after the set, which the turn reads.
        if gone && self.cfg.kernel_rtt.is_some() {
            self.prune_due
                .store(true, std::sync::atomic::Ordering::Release);
        }
        // The last round's flags number the old set: not kept alive.
        if let Ok(mut last) = self.failed.lock() {
            *last = None;
        }
        let round = self.status_summary().round.clone();
        self.publish(round, true);
        if gained {
            self.joins_more();
        }
    }
}

/// Whether some address of a node in `before` is not that node's in
/// `now`: the node left, or dropped or changed an address (a family
/// dropped whole included).
fn addresses_gone(before: &NodeSet, now: &NodeSet) -> bool {
    before.iter().any(|old| match now.get(&old.name) {
        None => true,
        Some(n) => old.addresses().any(|a| !n.addresses().any(|b| b == a)),
    })
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;
    use crate::membership::Node;

    fn node(name: &str, v4: Option<u8>, v6: Option<u16>) -> Node {
        Node {
            name: name.to_owned(),
            node_ip: v4.map(|i| Ipv4Addr::new(198, 18, 0, i)),
            health_ip: v4.map(|i| Ipv4Addr::new(198, 18, 1, i)),
            node_ip6: v6.map(|i| Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, i)),
            health_ip6: v6.map(|i| Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, i)),
            ..Node::default()
        }
    }

    fn set(nodes: &[Node]) -> NodeSet {
        NodeSet::new(nodes.to_vec()).expect("distinct names")
    }

    #[test]
    fn an_address_is_gone_when_its_node_leaves_drops_or_moves_it() {
        let both = set(&[node("a", Some(2), Some(2)), node("b", Some(3), None)]);
        // Unchanged, or a node and an address gained: nothing to prune.
        assert!(!addresses_gone(&both, &both));
        let more = set(&[
            node("a", Some(2), Some(2)),
            node("b", Some(3), Some(3)),
            node("c", Some(4), None),
        ]);
        assert!(!addresses_gone(&both, &more));
        // A node left.
        assert!(addresses_gone(&both, &set(&[node("a", Some(2), Some(2))])));
        // A family dropped whole, its node staying.
        let v4_only = set(&[node("a", Some(2), None), node("b", Some(3), None)]);
        assert!(addresses_gone(&both, &v4_only));
        // An address moved.
        let moved = set(&[node("a", Some(2), Some(9)), node("b", Some(3), None)]);
        assert!(addresses_gone(&both, &moved));
    }
}
