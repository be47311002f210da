//! What the endpoint's record proves is this agent's own, and the check
//! that refuses everything else.
//!
//! The record names each object the agent made by what a namesake made by
//! someone else does not share: the namespace by the device and inode of
//! its nsfs file (stat'ed through `/run/netns/NAME`) and its cookie, the
//! host end of the veth by its name and interface index in the node's
//! namespace, the endpoint end by its name and index inside the
//! namespace. The record is written as soon as each object is made
//! (before anything else is done with it), so an agent killed with
//! SIGKILL finds its objects named; one killed in the instant between the
//! kernel making an object and the record's rename finds that object
//! unproven and refuses it like a stranger's (the operator removes it).
//!
//! An nsfs inode number is handed out again once its namespace is freed;
//! the cookie (kernels from 5.14) never is, and is compared whenever the
//! record has one. Interface indexes are handed out cyclically and not
//! reused while the kernel runs. None of these outlives a boot: the
//! kernel starts every counter over, and a node booting the same way
//! hands the same numbers out again, perhaps to another agent's
//! `lxc_health`. The record names the boot its proofs were made in
//! ([`super::record::EndpointRecord::in_boot`]); another boot's prove
//! nothing, and what is under the names then is refused as foreign.
//!
//! A namespace, host interface or endpoint interface under the configured
//! names that the record does not prove is foreign: the agent refuses to
//! start (and the controller to repair) with an error naming it, and never
//! deletes it. On stop, only what the record proves is removed.
//!
//! A record of an earlier version names the namespace by name and the
//! addresses only. Its objects are adopted when what is there can only be
//! such an agent's endpoint: the namespace's endpoint interface holds every
//! address of the record and is the veth peer of the host interface (each
//! names the other's index), and their proof is recorded at once. Anything
//! less (a namespace without that pair, a host interface without the
//! namespace) is refused as foreign, as with no record at all: an upgrade
//! never takes over what it cannot tell from a stranger's.

use std::{fmt, net::IpAddr};

use serde::{Deserialize, Serialize};

use super::plan::{Plan, PlumbingError};
use crate::sys::netlink::in_netns;

/// The namespace the agent made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetnsProof {
    pub name: String,
    pub dev: u64,
    pub ino: u64,
    /// `SO_NETNS_COOKIE`, where the kernel has it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cookie: Option<u64>,
}

impl NetnsProof {
    /// Whether `found` is the namespace this proof names.
    fn proves(&self, found: &Self) -> bool {
        self.name == found.name
            && self.dev == found.dev
            && self.ino == found.ino
            && self.cookie.is_none_or(|c| found.cookie == Some(c))
    }
}

impl fmt::Display for NetnsProof {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "device {} inode {}", self.dev, self.ino)?;
        if let Some(c) = self.cookie {
            write!(f, " cookie {c}")?;
        }
        Ok(())
    }
}

/// An interface the agent made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkProof {
    pub name: String,
    pub ifindex: u32,
}

impl fmt::Display for LinkProof {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} with index {}", self.name, self.ifindex)
    }
}

/// Everything the record proves is the agent's. A record of an earlier
/// version has none of it (`None` in [`super::record::EndpointRecord`]);
/// one of this version has this, with what exists now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owned {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<NetnsProof>,
    /// The host end of the veth, in the node's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<LinkProof>,
    /// The endpoint end of the veth, inside the namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<LinkProof>,
}

/// An interface as found: its proof and the index its `IFLA_LINK` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundLink {
    pub link: LinkProof,
    pub peer_index: Option<u32>,
}

/// What is under the endpoint's names now.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Found {
    pub netns: Option<NetnsProof>,
    pub host: Option<FoundLink>,
    /// Only looked for when the namespace is there.
    pub peer: Option<FoundLink>,
    /// The endpoint interface's addresses.
    pub peer_addresses: Vec<IpAddr>,
}

/// What the record led the agent to expect under a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expected {
    /// There is no endpoint record.
    NoRecord,
    /// The record names nothing under this name.
    NotRecorded,
    Namespace(NetnsProof),
    Link(LinkProof),
    /// A record of an earlier version: only a namespace whose endpoint
    /// interface holds `addresses` and is the veth peer of the host
    /// interface.
    EarlierRecord {
        addresses: String,
    },
}

impl fmt::Display for Expected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoRecord => f.write_str("nothing (there is no endpoint record)"),
            Self::NotRecorded => f.write_str("nothing (the endpoint record names none)"),
            Self::Namespace(p) => write!(f, "{p}"),
            Self::Link(p) => write!(f, "{p}"),
            Self::EarlierRecord { addresses } => write!(
                f,
                "an endpoint interface holding {addresses} paired with the host interface \
                 (the record of an earlier version proves nothing else)"
            ),
        }
    }
}

/// An object under one of the endpoint's names that the record does not
/// prove is the agent's. It is left as it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForeignObject {
    #[error(
        "network namespace {name:?} was not made by this agent: expected {expected}, found \
         {found}; it is left untouched (remove it, or choose another --endpoint-netns)"
    )]
    Namespace {
        name: String,
        expected: Expected,
        found: NetnsProof,
    },
    #[error(
        "interface {name:?} in the node's namespace was not made by this agent: expected \
         {expected}, found index {found}; it is left untouched (remove it, or choose another \
         --host-iface)"
    )]
    HostInterface {
        name: String,
        expected: Expected,
        found: u32,
    },
    #[error(
        "interface {name:?} in network namespace {netns:?} was not made by this agent: expected \
         {expected}, found index {found}; it is left untouched (remove it, or choose another \
         --endpoint-iface)"
    )]
    EndpointInterface {
        name: String,
        netns: String,
        expected: Expected,
        found: u32,
    },
}

/// What is under the names of `plan` now.
pub fn observe(plan: &Plan) -> Result<Found, PlumbingError> {
    let netns = match plan.netns.identity()? {
        Some((dev, ino)) => Some(NetnsProof {
            name: plan.netns_name.clone(),
            dev,
            ino,
            cookie: plan.netns.cookie()?,
        }),
        None => None,
    };
    let found_link = |name: &str, l: Option<(u32, Option<u32>)>| {
        l.map(|(ifindex, peer_index)| FoundLink {
            link: LinkProof {
                name: name.to_owned(),
                ifindex,
            },
            peer_index,
        })
    };
    let host = in_netns(None, |nl| async move {
        nl.link_and_peer(&plan.host_iface).await
    })?;
    let host = found_link(&plan.host_iface, host);
    let (peer, peer_addresses) = if netns.is_some() {
        in_netns(Some(&plan.netns), |nl| async move {
            let Some((index, peer)) = nl.link_and_peer(&plan.ep_iface).await? else {
                return Ok((None, Vec::new()));
            };
            let v4 = nl.addresses::<std::net::Ipv4Addr>().await?.into_iter();
            let v6 = nl.addresses::<std::net::Ipv6Addr>().await?.into_iter();
            let addrs = v4
                .filter(|(i, ..)| *i == index)
                .map(|(_, a, _)| IpAddr::V4(a))
                .chain(
                    v6.filter(|(i, ..)| *i == index)
                        .map(|(_, a, _)| IpAddr::V6(a)),
                )
                .collect();
            Ok((Some((index, peer)), addrs))
        })?
    } else {
        (None, Vec::new())
    };
    Ok(Found {
        netns,
        host,
        peer: found_link(&plan.ep_iface, peer),
        peer_addresses,
    })
}

/// What the agent knows of its objects from its record.
#[derive(Debug, Clone, Copy)]
pub enum Record<'a> {
    /// No record in the state directory.
    None,
    /// A record of an earlier version, with the endpoint's addresses.
    Earlier(&'a [IpAddr]),
    Current(&'a Owned),
}

/// Decides whether everything in `found` is the agent's by `record`:
/// what the agent owns now (for an earlier record, what it adopts), or the
/// first object it does not own.
pub fn judge(record: Record<'_>, found: &Found) -> Result<Owned, Box<ForeignObject>> {
    match record {
        Record::Current(owned) => judge_current(owned, found),
        Record::None => {
            if let Some(e) = first_unproven(found, &Expected::NoRecord) {
                return Err(Box::new(e));
            }
            Ok(Owned::default())
        }
        Record::Earlier(addresses) => judge_earlier(addresses, found),
    }
}

/// The first object of `found`, each reported as foreign expecting
/// `expected`; `None` when nothing is there.
fn first_unproven(found: &Found, expected: &Expected) -> Option<ForeignObject> {
    if let Some(ns) = &found.netns {
        return Some(ForeignObject::Namespace {
            name: ns.name.clone(),
            expected: expected.clone(),
            found: ns.clone(),
        });
    }
    found.host.as_ref().map(|h| ForeignObject::HostInterface {
        name: h.link.name.clone(),
        expected: expected.clone(),
        found: h.link.ifindex,
    })
}

fn judge_current(owned: &Owned, found: &Found) -> Result<Owned, Box<ForeignObject>> {
    let expect = |p: Option<Expected>| p.unwrap_or(Expected::NotRecorded);
    if let Some(ns) = &found.netns
        && !owned.netns.as_ref().is_some_and(|p| p.proves(ns))
    {
        return Err(Box::new(ForeignObject::Namespace {
            name: ns.name.clone(),
            expected: expect(owned.netns.clone().map(Expected::Namespace)),
            found: ns.clone(),
        }));
    }
    if let Some(h) = &found.host
        && owned.host.as_ref() != Some(&h.link)
    {
        return Err(Box::new(ForeignObject::HostInterface {
            name: h.link.name.clone(),
            expected: expect(owned.host.clone().map(Expected::Link)),
            found: h.link.ifindex,
        }));
    }
    if let (Some(ns), Some(p)) = (&found.netns, &found.peer)
        && owned.peer.as_ref() != Some(&p.link)
    {
        return Err(Box::new(ForeignObject::EndpointInterface {
            name: p.link.name.clone(),
            netns: ns.name.clone(),
            expected: expect(owned.peer.clone().map(Expected::Link)),
            found: p.link.ifindex,
        }));
    }
    // What is gone is no longer the agent's to prove or remove.
    Ok(Owned {
        netns: found.netns.clone(),
        host: found.host.as_ref().map(|h| h.link.clone()),
        peer: found.peer.as_ref().map(|p| p.link.clone()),
    })
}

fn judge_earlier(addresses: &[IpAddr], found: &Found) -> Result<Owned, Box<ForeignObject>> {
    let expected = Expected::EarlierRecord {
        addresses: addresses
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
    };
    let pair = match (&found.netns, &found.host, &found.peer) {
        (Some(ns), Some(host), Some(peer))
            if !addresses.is_empty()
                && addresses.iter().all(|a| found.peer_addresses.contains(a))
                && host.peer_index == Some(peer.link.ifindex)
                && peer.peer_index == Some(host.link.ifindex) =>
        {
            Some(Owned {
                netns: Some(ns.clone()),
                host: Some(host.link.clone()),
                peer: Some(peer.link.clone()),
            })
        }
        _ => None,
    };
    match pair {
        Some(owned) => Ok(owned),
        None => first_unproven(found, &expected)
            .map_or_else(|| Ok(Owned::default()), |e| Err(Box::new(e))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(ino: u64, cookie: Option<u64>) -> NetnsProof {
        NetnsProof {
            name: "health".into(),
            dev: 4,
            ino,
            cookie,
        }
    }

    fn link(name: &str, ifindex: u32, peer_index: u32) -> FoundLink {
        FoundLink {
            link: LinkProof {
                name: name.into(),
                ifindex,
            },
            peer_index: Some(peer_index),
        }
    }

    const ADDR: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 18, 64, 2));

    /// A namespace with `eth0` (index 2) paired with `lxc_health` (index 7).
    fn endpoint(ino: u64, cookie: Option<u64>) -> Found {
        Found {
            netns: Some(ns(ino, cookie)),
            host: Some(link("lxc_health", 7, 2)),
            peer: Some(link("eth0", 2, 7)),
            peer_addresses: vec![ADDR],
        }
    }

    fn owned_of(f: &Found) -> Owned {
        Owned {
            netns: f.netns.clone(),
            host: f.host.as_ref().map(|h| h.link.clone()),
            peer: f.peer.as_ref().map(|p| p.link.clone()),
        }
    }

    #[test]
    fn without_a_record_anything_found_is_foreign_and_named() {
        assert_eq!(judge(Record::None, &Found::default()), Ok(Owned::default()));
        let err = judge(Record::None, &endpoint(9, None)).expect_err("foreign");
        assert!(matches!(*err, ForeignObject::Namespace { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains("\"health\"")
                && text.contains("no endpoint record")
                && text.contains("inode 9"),
            "{text}"
        );
        let host_only = Found {
            host: Some(link("lxc_health", 7, 2)),
            ..Found::default()
        };
        let err = judge(Record::None, &host_only).expect_err("foreign");
        assert_eq!(
            *err,
            ForeignObject::HostInterface {
                name: "lxc_health".into(),
                expected: Expected::NoRecord,
                found: 7
            }
        );
        assert!(err.to_string().contains("--host-iface"), "{err}");
    }

    #[test]
    fn what_the_record_proves_is_owned_and_what_is_gone_is_forgotten() {
        let found = endpoint(9, Some(77));
        let owned = owned_of(&found);
        assert_eq!(judge(Record::Current(&owned), &found), Ok(owned.clone()));
        // The veth went: the namespace is still owned, the links are not.
        let ns_only = Found {
            host: None,
            peer: None,
            peer_addresses: Vec::new(),
            ..found.clone()
        };
        assert_eq!(
            judge(Record::Current(&owned), &ns_only),
            Ok(Owned {
                netns: owned.netns.clone(),
                host: None,
                peer: None
            })
        );
        assert_eq!(
            judge(Record::Current(&owned), &Found::default()),
            Ok(Owned::default())
        );
    }

    #[test]
    fn a_namesake_is_told_by_inode_cookie_or_index() {
        let mine = endpoint(9, Some(77));
        let owned = owned_of(&mine);
        // Same inode, another cookie: the inode was handed out again.
        for other in [
            endpoint(10, Some(77)),
            endpoint(9, Some(78)),
            endpoint(9, None),
        ] {
            let err = judge(Record::Current(&owned), &other).expect_err("foreign namespace");
            assert!(matches!(*err, ForeignObject::Namespace { .. }), "{err:?}");
            assert!(
                err.to_string()
                    .contains("expected device 4 inode 9 cookie 77"),
                "{err}"
            );
        }
        let mut host = mine.clone();
        host.host = Some(link("lxc_health", 8, 2));
        let err = judge(Record::Current(&owned), &host).expect_err("foreign host link");
        assert_eq!(
            *err,
            ForeignObject::HostInterface {
                name: "lxc_health".into(),
                expected: Expected::Link(LinkProof {
                    name: "lxc_health".into(),
                    ifindex: 7
                }),
                found: 8
            }
        );
        let mut peer = mine;
        peer.peer = Some(link("eth0", 3, 7));
        let err = judge(Record::Current(&owned), &peer).expect_err("foreign eth0");
        assert!(
            matches!(&*err, ForeignObject::EndpointInterface { name, found: 3, .. } if name == "eth0"),
            "{err:?}"
        );
        // A record that owns nothing: everything found is foreign.
        let err =
            judge(Record::Current(&Owned::default()), &endpoint(9, None)).expect_err("foreign");
        assert!(err.to_string().contains("names none"), "{err}");
    }

    #[test]
    fn a_record_without_a_cookie_is_checked_by_inode() {
        let owned = owned_of(&endpoint(9, None));
        let found = endpoint(9, Some(5));
        assert!(judge(Record::Current(&owned), &found).is_ok());
    }

    #[test]
    fn an_earlier_record_adopts_only_the_paired_endpoint_holding_its_addresses() {
        let found = endpoint(9, None);
        assert_eq!(
            judge(Record::Earlier(&[ADDR]), &found),
            Ok(owned_of(&found))
        );
        assert_eq!(
            judge(Record::Earlier(&[ADDR]), &Found::default()),
            Ok(Owned::default())
        );
        let other = IpAddr::V4(std::net::Ipv4Addr::new(198, 18, 64, 3));
        let mut unpaired = found.clone();
        unpaired.host = Some(link("lxc_health", 7, 5));
        let mut empty = found.clone();
        empty.peer = None;
        empty.peer_addresses.clear();
        for (addrs, f) in [
            (&[other][..], &found),
            (&[][..], &found),
            (&[ADDR][..], &unpaired),
            (&[ADDR][..], &empty),
        ] {
            let err = judge(Record::Earlier(addrs), f).expect_err("not proven");
            assert!(matches!(*err, ForeignObject::Namespace { .. }), "{err:?}");
            assert!(err.to_string().contains("earlier version"), "{err}");
        }
        let host_only = Found {
            host: Some(link("lxc_health", 7, 2)),
            ..Found::default()
        };
        assert!(matches!(
            judge(Record::Earlier(&[ADDR]), &host_only).map_err(|e| *e),
            Err(ForeignObject::HostInterface { .. })
        ));
    }
}
