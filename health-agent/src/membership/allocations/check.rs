//! A peer's record against the allocations: its health addresses inside
//! its node's allocation, its node addresses outside every health address
//! allocated, the one its allocation names where it names one, and none
//! that another node's allocation names.

use std::net::IpAddr;

use super::{Allocation, Allocations, Held};
use crate::membership::{
    Node,
    record::{Field, MAX_REJECTED_SHOWN, RejectedRecord, Rule},
};

impl Allocations {
    /// Whether `node`'s health addresses lie in its allocation, and its
    /// node addresses are its own: the rule its record breaks if not.
    ///
    /// # Errors
    /// A health address outside the node's allocation, or the node has no
    /// allocation of that family, or its allocation was refused or
    /// overlaps another; a node address inside the health range or an
    /// allocation, another than its allocation names, or one another
    /// node's allocation names.
    pub fn check(&self, node: &Node) -> Result<(), Rule> {
        self.check_node_addresses(node)?;
        let held = self.held.get(&node.name);
        let counted = self.counted(&node.name, held);
        self.check_named(node, held, &counted)?;
        let fields = [
            node.health_ip.map(|ip| (Field::HealthIp, IpAddr::V4(ip))),
            node.health_ip6.map(|ip| (Field::HealthIp6, IpAddr::V6(ip))),
        ];
        for (field, ip) in fields.into_iter().flatten() {
            if let Some(reason) = self.outside(&node.name, &counted, ip) {
                return Err(Rule::Unallocated { field, ip, reason });
            }
        }
        Ok(())
    }

    /// A node address is never a health address: not inside the health
    /// range (where this agent has one of its family), nor inside any
    /// node's allocated health CIDRs (with a range or without).
    fn check_node_addresses(&self, node: &Node) -> Result<(), Rule> {
        let in_range = [
            node.node_ip.and_then(|ip| {
                let range = self.local.health_range.filter(|r| r.contains(&ip))?;
                Some((
                    Field::NodeIp,
                    IpAddr::V4(ip),
                    range.to_string(),
                    "--health-range",
                ))
            }),
            node.node_ip6.and_then(|ip| {
                let range = self.local.health_range6.filter(|r| r.contains(&ip))?;
                Some((
                    Field::NodeIp6,
                    IpAddr::V6(ip),
                    range.to_string(),
                    "--health-range6",
                ))
            }),
        ];
        if let Some((field, ip, range, flag)) = in_range.into_iter().flatten().next() {
            return Err(Rule::Unallocated {
                field,
                ip,
                reason: format!(
                    "is inside the cluster's health range {range} ({flag}), which holds only allocated health addresses (--kvstore-allocations)"
                ),
            });
        }
        if let Some((field, ip)) = node_addresses(node).find(|&(_, ip)| self.survey.spans.cover(ip))
        {
            return Err(Rule::Unallocated {
                field,
                ip,
                reason: "is a health address allocated to a node (--kvstore-allocations), not a node address".into(),
            });
        }
        Ok(())
    }

    /// A node address an allocation names is its node's alone, and a node
    /// whose allocation names one of a family has no other.
    fn check_named(
        &self,
        node: &Node,
        held: Option<&Held>,
        counted: &Result<&Allocation, Uncounted<'_>>,
    ) -> Result<(), Rule> {
        let own = held.and_then(|a| a.as_ref().ok());
        for (field, ip) in node_addresses(node) {
            let allocated = own.and_then(|a| match ip {
                IpAddr::V4(_) => a.node_ip.map(IpAddr::V4),
                IpAddr::V6(_) => a.node_ip6.map(IpAddr::V6),
            });
            let reason = match (allocated, counted) {
                // Its own allocation names it, but does not count.
                (Some(own), Err(why)) if own == ip => self.told(&node.name, why),
                (Some(own), Ok(_)) if own != ip => format!(
                    "is not the node's allocated node address {own} (etcd key {:?})",
                    self.key(&node.name)
                ),
                _ => match self.survey.named.get(&ip) {
                    // A refused allocation's address is no other node's.
                    None => match self.survey.reserved.get(&ip) {
                        Some(owner) if *owner != node.name => format!(
                            "is named by the allocation at etcd key {:?}, which is refused and counts for nothing: it is no other node's",
                            self.key(owner)
                        ),
                        _ => continue,
                    },
                    // An overlapping allocation's address stays reserved:
                    // it counts for no node, this one included.
                    Some(owner) if *owner != node.name => {
                        if self.survey.overlaps.contains_key(owner) {
                            format!(
                                "is named by the allocation at etcd key {:?}, which overlaps another and counts for nothing",
                                self.key(owner)
                            )
                        } else {
                            format!(
                                "is allocated to node {owner:?} (etcd key {:?})",
                                self.key(owner)
                            )
                        }
                    }
                    _ => continue,
                },
            };
            return Err(Rule::Unallocated { field, ip, reason });
        }
        Ok(())
    }

    /// Whether the allocations give `ip`, claimed as `field`, to node
    /// `name`: a health address inside its counted allocation, or the node
    /// address it names. Such a claim outranks any other node's hold on
    /// the address.
    #[must_use]
    pub fn backs(&self, name: &str, field: Field, ip: IpAddr) -> bool {
        let Ok(a) = self.counted(name, self.held.get(name)) else {
            return false;
        };
        match (field, ip) {
            (Field::NodeIp, IpAddr::V4(v4)) => a.node_ip == Some(v4),
            (Field::NodeIp6, IpAddr::V6(v6)) => a.node_ip6 == Some(v6),
            (Field::HealthIp, IpAddr::V4(v4)) => a.cidr.is_some_and(|c| c.contains(&v4)),
            (Field::HealthIp6, IpAddr::V6(v6)) => a.cidr6.is_some_and(|c| c.contains(&v6)),
            _ => false,
        }
    }

    /// The etcd key of `name`'s allocation, for a verdict's reason.
    fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// A node's allocation as held (`held`, its entry) if it counts; why
    /// it does not if not (told by [`Self::told`] only where a record is
    /// refused for it: a validation of 50,000 records passes here once a
    /// record).
    fn counted<'a>(
        &'a self,
        name: &str,
        held: Option<&'a Held>,
    ) -> Result<&'a Allocation, Uncounted<'a>> {
        match held {
            None => Err(Uncounted::Missing),
            Some(Err(refused)) => Err(Uncounted::Refused(&refused.why)),
            Some(Ok(a)) => match self.survey.overlaps.get(name) {
                Some(other) => Err(Uncounted::Overlaps(other)),
                None => Ok(a),
            },
        }
    }

    /// Why node `name`'s allocation does not count, in a sentence.
    fn told(&self, name: &str, why: &Uncounted<'_>) -> String {
        match why {
            Uncounted::Missing => format!(
                "is not allocated: no allocation at etcd key {:?} (--kvstore-allocations)",
                self.key(name)
            ),
            Uncounted::Refused(why) => format!(
                "is not allocated: the allocation at etcd key {:?} is refused: {why}",
                self.key(name)
            ),
            Uncounted::Overlaps(other) => format!(
                "is not allocated: the allocation at etcd key {:?} overlaps the one at {:?}, and neither counts",
                self.key(name),
                self.key(other)
            ),
        }
    }

    /// Why `ip` is not a health address allocated to node `name`, if it is
    /// not.
    fn outside(
        &self,
        name: &str,
        counted: &Result<&Allocation, Uncounted<'_>>,
        ip: IpAddr,
    ) -> Option<String> {
        let allocation = match counted {
            Ok(a) => a,
            Err(why) => return Some(self.told(name, why)),
        };
        let inside = match ip {
            IpAddr::V4(v4) => allocation.cidr.map(|c| c.contains(&v4)),
            IpAddr::V6(v6) => allocation.cidr6.map(|c| c.contains(&v6)),
        };
        match inside {
            Some(true) => None,
            Some(false) => Some(format!(
                "is outside the node's allocation {allocation} (etcd key {:?})",
                self.key(name)
            )),
            None => Some(format!(
                "is not allocated: the allocation at etcd key {:?} has no {}",
                self.key(name),
                if ip.is_ipv4() {
                    "health_cidr"
                } else {
                    "health_cidr6"
                }
            )),
        }
    }

    /// Every allocation that counts for nothing (its value refused, or
    /// overlapping another), by name, with why: the first
    /// [`MAX_REJECTED_SHOWN`], and how many in all. Made when the
    /// allocations settle, not at each validation.
    pub(super) fn list_uncounted(&self) -> (Vec<RejectedRecord>, usize) {
        let mut names: Vec<&String> = self
            .held
            .iter()
            .filter(|(name, a)| a.is_err() || self.survey.overlaps.contains_key(*name))
            .map(|(name, _)| name)
            .collect();
        let total = names.len();
        names.sort_unstable();
        names.truncate(MAX_REJECTED_SHOWN);
        let shown = names
            .into_iter()
            .filter_map(|name| {
                let reason = match self.counted(name, self.held.get(name)) {
                    Ok(_) | Err(Uncounted::Missing) => return None,
                    Err(Uncounted::Refused(why)) => format!("refused: {why}"),
                    Err(Uncounted::Overlaps(other)) => format!(
                        "overlaps the one at {:?}, and neither counts",
                        self.key(other)
                    ),
                };
                Some(RejectedRecord {
                    record: self.key(name),
                    name: Some(name.clone()),
                    reason,
                })
            })
            .collect();
        (shown, total)
    }

    /// This node's own record against its allocation: what is wrong, for
    /// a warning (its peers refuse its record while it holds).
    #[must_use]
    pub fn own_mismatch(&self, own: &Node) -> Option<String> {
        self.check(own)
            .err()
            .map(|rule| format!("this node's record is refused by its peers: {rule}"))
    }
}

/// Why a node's allocation does not count.
enum Uncounted<'a> {
    /// It has none.
    Missing,
    /// Its value was refused, for this reason.
    Refused(&'a str),
    /// It overlaps this node's.
    Overlaps(&'a str),
}

/// A record's node addresses, with their fields.
fn node_addresses(node: &Node) -> impl Iterator<Item = (Field, IpAddr)> {
    [
        node.node_ip.map(|ip| (Field::NodeIp, IpAddr::V4(ip))),
        node.node_ip6.map(|ip| (Field::NodeIp6, IpAddr::V6(ip))),
    ]
    .into_iter()
    .flatten()
}
