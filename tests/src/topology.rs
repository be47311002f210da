//! Two namespaces playing two nodes, joined by a veth pair:
//! `a` (198.18.0.1/24 on `veth-a`) <-> `b` (198.18.0.2/24 on `veth-b`),
//! and on request ([`TwoNodes::add_ipv6`]) `2001:2::1/64` <-> `2001:2::2/64`.
//! Removed on drop, including when a test panics; namespaces left by a test
//! process that died are swept at the next creation.

use std::{
    fs,
    net::{Ipv4Addr, Ipv6Addr},
    path::Path,
};

use health_agent::{
    membership::routes::PeerRoute,
    sys::{netlink::in_netns, netns::Netns},
};

use crate::names;

pub const A_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
pub const B_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
pub const PREFIX_LEN: u8 = 24;
pub const A_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 1);
pub const B_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 0, 0, 0, 0, 2);
pub const PREFIX_LEN6: u8 = 64;
pub const A_IF: &str = "veth-a";
pub const B_IF: &str = "veth-b";

pub struct TwoNodes {
    pub a: Netns,
    pub b: Netns,
}

impl TwoNodes {
    /// Builds the pair; panics with the failing step on error.
    #[must_use]
    pub fn new() -> Self {
        crate::require_root();
        names::sweep_stale_netns();
        let a = Netns::create(&names::unique("a")).expect("create netns a");
        // From here on, drop cleans up whatever was made.
        let mut nodes = Self { b: a.clone(), a };
        nodes.b = Netns::create(&names::unique("b")).expect("create netns b");
        let b = nodes.b.clone();
        in_netns(Some(&nodes.a), |nl| async move {
            nl.add_veth(A_IF, B_IF, Some(&b)).await?;
            nl.add_address(A_IF, A_IP, PREFIX_LEN).await?;
            nl.set_up(A_IF).await?;
            nl.set_up("lo").await
        })
        .expect("veth in netns a");
        in_netns(Some(&nodes.b), |nl| async move {
            nl.add_address(B_IF, B_IP, PREFIX_LEN).await?;
            nl.set_up(B_IF).await?;
            nl.set_up("lo").await
        })
        .expect("veth in netns b");
        nodes
    }

    /// Adds [`A_IP6`] and [`B_IP6`] to the veth ends, without duplicate
    /// address detection (usable at once).
    pub fn add_ipv6(&self) {
        for (ns, iface, addr) in [(&self.a, A_IF, A_IP6), (&self.b, B_IF, B_IP6)] {
            in_netns(Some(ns), |nl| async move {
                nl.add_address(iface, addr, PREFIX_LEN6).await
            })
            .unwrap_or_else(|e| panic!("adding {addr} to {iface}: {e}"));
        }
    }

    /// Sets a sysctl (path under /proc/sys, e.g. `net/ipv4/icmp_echo_ignore_all`) in `ns`.
    pub fn sysctl(ns: &Netns, key: &str, value: &str) {
        let path = Path::new("/proc/sys").join(key);
        ns.run(|| fs::write(&path, value))
            .expect("enter netns")
            .unwrap_or_else(|e| panic!("writing {value} to {}: {e}", path.display()));
    }
}

impl Default for TwoNodes {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TwoNodes {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            if let Err(e) = ns.delete() {
                eprintln!("warning: could not remove {}: {e}", ns.path().display());
            }
        }
    }
}

/// A peer `node` whose health address `health` node `a` routes via node
/// `b` ([`B_IP`]), as the agent's route sync wants it.
#[must_use]
pub fn peer_via_b(health: Ipv4Addr, node: &str) -> (std::net::IpAddr, PeerRoute) {
    (
        health.into(),
        PeerRoute {
            via: B_IP.into(),
            node: node.to_owned(),
        },
    )
}
