//! The health endpoint's settings, and the cluster's health ranges its
//! addresses come from.
#![allow(
    clippy::doc_markdown,
    reason = "clap turns these doc comments into --help text, shown verbatim"
)]

use std::{path::PathBuf, time::Duration};

use clap::Args;

use crate::util::section::section;
use crate::{
    datapath::{AttachMode, TcHook},
    sys::netns::Netns,
    util::cidr,
};
use ipnet::{Ipv4Net, Ipv6Net};

section! {
    /// The health endpoint: its addresses, namespace, veth and record.
    #[derive(Debug, Clone, PartialEq, Eq, Args)]
    #[command(group(
        clap::ArgGroup::new("health-cidrs")
            .args(["health_cidr", "health_cidr6"])
            .required(true)
            .multiple(true)
    ))]
    pub struct EndpointSettings {
        /// The node's share of the pod range (IPv4, at most a /30); the
        /// endpoint's IPv4 address comes from it. At least one of --health-cidr and
        /// --health-cidr6 is given; both: a dual-stack endpoint.
        #[arg(long, value_name = "CIDR", value_parser = parse_health_cidr)]
        pub health_cidr: Option<Ipv4Net>,
        /// The node's share of the IPv6 pod range (such as
        /// `2001:db8:0:1::/64`; at most a /126); the endpoint's IPv6 address
        /// comes from it. Not with `--routing masquerade` (IPv4 only).
        #[arg(long, value_name = "CIDR", value_parser = parse_health_cidr6)]
        pub health_cidr6: Option<Ipv6Net>,
        /// The cluster-wide health range that every node's --health-cidr
        /// comes from. Peers' health addresses are routed only inside it (a
        /// record naming another address is refused), and masquerade leaves
        /// destinations inside it alone. Needed with peers (--nodes-file or
        /// --kvstore) when --health-cidr is given.
        #[arg(long, value_name = "CIDR", value_parser = cidr::parse::<Ipv4Net>)]
        pub health_range: Option<Ipv4Net>,
        /// The cluster-wide IPv6 health range that every node's
        /// --health-cidr6 comes from, likewise: needed with peers when
        /// --health-cidr6 is given.
        #[arg(long, value_name = "CIDR", value_parser = cidr::parse::<Ipv6Net>)]
        pub health_range6: Option<Ipv6Net>,
        /// Name of the endpoint's network namespace (under /run/netns).
        #[arg(long, default_value = "health", value_parser = validate_netns_name)]
        pub endpoint_netns: String,
        /// Host side of the endpoint's veth.
        #[arg(long, default_value = "lxc_health", value_parser = interface_name)]
        pub host_iface: String,
        /// Endpoint side of the veth, inside its namespace.
        #[arg(long, default_value = "eth0", value_parser = interface_name)]
        pub endpoint_iface: String,
        /// Where the endpoint record (IP, endpoint ID) is kept across restarts.
        /// It must be the agent's alone (owned by its user, writable by no
        /// one else), as must --bpffs-dir: else the agent refuses to start,
        /// naming it.
        #[arg(long, default_value = "/var/lib/health-agent")]
        pub state_dir: PathBuf,
        /// How often the controller verifies the endpoint (it also runs on link events).
        #[arg(long, default_value = "60s", value_parser = crate::util::duration::parse)]
        pub controller_interval: Duration,
        /// Attach mode of the echo responder (default: the tc hook --attach
        /// picks: tcx where the kernel has it, classic tc otherwise).
        #[arg(long, value_enum)]
        pub mode: Option<AttachMode>,
        /// On shutdown, leave the namespace, veth, pins and record for the next agent.
        #[arg(long)]
        pub keep_endpoint: bool,
    }
}

/// `--health-cidr`: an IPv4 CIDR that can hold the endpoint.
fn parse_health_cidr(s: &str) -> Result<Ipv4Net, String> {
    let cidr: Ipv4Net = cidr::parse(s).map_err(|e| e.to_string())?;
    crate::endpoint::ipam::check4(cidr).map_err(|e| e.to_string())?;
    Ok(cidr)
}

/// `--health-cidr6`: an IPv6 CIDR that can hold the endpoint.
fn parse_health_cidr6(s: &str) -> Result<Ipv6Net, String> {
    let cidr: Ipv6Net = cidr::parse(s).map_err(|e| e.to_string())?;
    crate::endpoint::ipam::check6(cidr).map_err(|e| e.to_string())?;
    Ok(cidr)
}

/// An interface name the kernel takes (its `dev_valid_name`): 1 to 15
/// bytes, not `.` or `..`, without `/`, `:` or white space.
pub(crate) fn interface_name(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > 15 {
        return Err(format!(
            "{s:?} is {} bytes: an interface name has 1 to 15",
            s.len()
        ));
    }
    if s == "." || s == ".." {
        return Err(format!("{s:?} is not an interface name"));
    }
    if let Some(c) = s
        .chars()
        .find(|c| *c == '/' || *c == ':' || c.is_whitespace())
    {
        return Err(format!("{s:?}: an interface name has no {c:?}"));
    }
    Ok(s.to_owned())
}

fn validate_netns_name(s: &str) -> Result<String, String> {
    Netns::named(s)
        .map(|_| s.to_owned())
        .map_err(|e| e.to_string())
}

impl super::EndpointConfig {
    /// The endpoint as `settings` describe it, with what is resolved from
    /// the kernel at start: the echo responder's attach mode and the hook
    /// of the tracking programs.
    #[must_use]
    pub fn new(settings: &EndpointSettings, mode: AttachMode, tc_hook: TcHook) -> Self {
        Self {
            cidr: settings.health_cidr,
            cidr6: settings.health_cidr6,
            netns_name: settings.endpoint_netns.clone(),
            host_iface: settings.host_iface.clone(),
            ep_iface: settings.endpoint_iface.clone(),
            state_dir: settings.state_dir.clone(),
            mode,
            tc_hook,
            keep: settings.keep_endpoint,
        }
    }
}

impl super::controller::ControllerConfig {
    /// The controller of `endpoint`, at the interval `settings` give, with
    /// the endpoint's hello server on `http_port`.
    #[must_use]
    pub fn new(
        settings: &EndpointSettings,
        endpoint: super::EndpointConfig,
        http_port: u16,
    ) -> Self {
        Self {
            endpoint,
            interval: settings.controller_interval,
            http_port,
            node: String::new(),
        }
    }

    /// `self`, its hello server's answers naming `node`.
    #[must_use]
    pub fn naming(mut self, node: &str) -> Self {
        node.clone_into(&mut self.node);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interface_names_are_those_the_kernel_takes() {
        for good in ["lxc_health", "eth0", "lxc.health", "a", "fifteen-bytes-1"] {
            assert_eq!(interface_name(good).as_deref(), Ok(good));
        }
        for (bad, says) in [
            ("", "1 to 15"),
            ("sixteen-bytes-12", "1 to 15"),
            (".", "not an interface name"),
            ("..", "not an interface name"),
            ("a/b", "'/'"),
            ("a:b", "':'"),
            ("a b", "' '"),
        ] {
            let e = interface_name(bad).expect_err(bad);
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }
}
