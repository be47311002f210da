//! A cluster whose node addresses live on WireGuard: each node keeps its
//! uplink address on the fabric (198.18.0.11, .12, ..., or `2001:2::11`,
//! ... in an IPv6-only cluster: the tunnel's endpoints) and gets `wg0`
//! with its node addresses (198.18.1.11, .12, ... /24 and, with IPv6,
//! `2001:2:0:1::11`, ... /64), a key pair, and every other node as a peer
//! whose AllowedIPs are that node's addresses and health CIDRs.
//! Configured with `wg` from wireguard-tools; the interface itself is
//! made through netlink.

use std::{
    io::Write as _,
    net::{Ipv4Addr, Ipv6Addr},
    process::{Command, Stdio},
};

use health_agent::sys::{netlink::in_netns, netns::Netns};

use crate::{cluster::Cluster, process};

/// The WireGuard device of every node.
pub const DEVICE: &str = "wg0";
/// The port WireGuard listens on.
pub const PORT: u16 = 51_820;

/// Node `i`'s address on `wg0`: `198.18.1.11`, `.12`, ...
#[must_use]
pub fn node_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 1, 11 + u8::try_from(i).expect("few nodes"))
}

/// Node `i`'s IPv6 address on `wg0`: `2001:2:0:1::11`, `::12`, ...
#[must_use]
pub fn node_ip6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(
        0x2001,
        2,
        0,
        1,
        0,
        0,
        0,
        0x11 + u16::try_from(i).expect("few nodes"),
    )
}

/// A node's key pair, base64 as `wg` prints it.
#[derive(Debug, Clone)]
pub struct Keys {
    pub private: String,
    pub public: String,
}

/// Runs `wg args` in `ns` with `input` on its stdin; its stdout, or a
/// panic naming the command and its stderr.
#[must_use]
pub fn wg(ns: Option<&Netns>, args: &[&str], input: &str) -> String {
    let mut cmd = Command::new("wg");
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(ns) = ns {
        process::enter(&mut cmd, ns);
    }
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("wg {args:?}: {e} (is wireguard-tools installed?)"));
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(input.as_bytes()).expect("wg stdin");
    }
    let out = child.wait_with_output().expect("wg output");
    assert!(
        out.status.success(),
        "wg {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn keys() -> Keys {
    let private = wg(None, &["genkey"], "");
    let public = wg(None, &["pubkey"], &private);
    Keys { private, public }
}

/// Makes `wg0` on every node of `cluster` (before its agents start) and
/// joins them in a full mesh; returns each node's keys.
#[must_use]
pub fn mesh(cluster: &Cluster) -> Vec<Keys> {
    let keys: Vec<Keys> = cluster.nodes.iter().map(|_| keys()).collect();
    let family = cluster.nodes[0].family;
    for (i, node) in cluster.nodes.iter().enumerate() {
        let (ip, ip6) = (node_ip(i), node_ip6(i));
        in_netns(Some(&node.ns), |nl| async move {
            nl.add_wireguard(DEVICE).await?;
            if family.has_v4() {
                nl.add_address(DEVICE, ip, 24).await?;
            }
            if family.has_v6() {
                nl.add_address(DEVICE, ip6, 64).await?;
            }
            nl.set_up(DEVICE).await
        })
        .unwrap_or_else(|e| panic!("{}: making {DEVICE}: {e}", node.name));
        let key_file = node.dir.join("wg.key");
        std::fs::write(&key_file, &keys[i].private).expect("key file");
        let port = PORT.to_string();
        let key_path = key_file.display().to_string();
        let mut args = vec![
            "set",
            DEVICE,
            "private-key",
            key_path.as_str(),
            "listen-port",
            port.as_str(),
        ];
        let peers: Vec<(String, String, String)> = (0..cluster.nodes.len())
            .filter(|j| *j != i)
            .map(|j| {
                (
                    keys[j].public.clone(),
                    endpoint(family, j),
                    allowed(family, j),
                )
            })
            .collect();
        for (public, endpoint, allowed) in &peers {
            args.extend([
                "peer",
                public.as_str(),
                "endpoint",
                endpoint.as_str(),
                "allowed-ips",
                allowed.as_str(),
            ]);
        }
        let _ = wg(Some(&node.ns), &args, "");
    }
    keys
}

/// Node `j`'s tunnel endpoint: its uplink address (IPv4 unless the
/// cluster is IPv6-only).
fn endpoint(family: crate::cluster::Family, j: usize) -> String {
    if family.has_v4() {
        format!("{}:{PORT}", crate::cluster::node_ip(j))
    } else {
        format!("[{}]:{PORT}", crate::cluster::node_ip6(j))
    }
}

/// Node `j`'s AllowedIPs: its node addresses and health CIDRs.
#[must_use]
pub fn allowed(family: crate::cluster::Family, j: usize) -> String {
    let mut nets = Vec::new();
    if family.has_v4() {
        nets.push(format!("{}/32", node_ip(j)));
        nets.push(crate::cluster::health_cidr(j));
    }
    if family.has_v6() {
        nets.push(format!("{}/128", node_ip6(j)));
        nets.push(crate::cluster::health_cidr6(j));
    }
    nets.join(",")
}

/// `wg set wg0 peer KEY allowed-ips LIST` on `ns` (LIST replaces the
/// peer's AllowedIPs).
pub fn set_allowed_ips(ns: &Netns, peer: &Keys, allowed: &str) {
    let _ = wg(
        Some(ns),
        &["set", DEVICE, "peer", &peer.public, "allowed-ips", allowed],
        "",
    );
}

/// `wg set wg0 peer KEY remove` on `ns`.
pub fn remove_peer(ns: &Netns, peer: &Keys) {
    let _ = wg(
        Some(ns),
        &["set", DEVICE, "peer", &peer.public, "remove"],
        "",
    );
}
