//! The node's forwarding, on for as long as the agent runs: the node
//! forwards between its uplink and the endpoint (both routing modes).
//!
//! It is held here, not by the tasks that need it: a task that fails and
//! is restarted must not turn forwarding off between its runs, and a task
//! aborted at the stop deadline must not turn it off while what it made
//! (the endpoint, routed through the node) is still being removed.

use std::path::PathBuf;

use tracing::warn;

use crate::{
    endpoint::{record, settings::EndpointSettings},
    sys::sysctl::Sysctl,
};

const IPV4: &str = "net/ipv4/ip_forward";
const IPV6: &str = "net/ipv6/conf/all/forwarding";

/// `net.ipv4.ip_forward`, and `net.ipv6.conf.all.forwarding` for an
/// endpoint with an IPv6 address, set to 1; dropped, both are written back
/// ([`Sysctl`]) unless a kept endpoint still needs them.
#[derive(Debug)]
pub(super) struct Forwarding {
    set: Vec<Sysctl>,
    state_dir: PathBuf,
    /// The endpoint's namespace, by name.
    netns: String,
    keep_endpoint: bool,
}

impl Forwarding {
    /// Turns forwarding on. Without IPv6, the IPv6 forwarding an earlier
    /// agent of this boot set (killed, or keeping an IPv6 endpoint that is
    /// gone now) is written back. A sysctl that cannot be set is a warning:
    /// the agent runs on, and its probes through the node say what fails.
    pub(super) fn set(endpoint: &EndpointSettings) -> Self {
        let state_dir = &endpoint.state_dir;
        let mut set = Vec::with_capacity(2);
        let mut on = |name: &str| match Sysctl::set(name, "1", state_dir) {
            Ok(s) => set.push(s),
            Err(e) => warn!(sysctl = name, "could not enable forwarding: {e}"),
        };
        on(IPV4);
        if endpoint.health_cidr6.is_some() {
            on(IPV6);
        } else {
            Sysctl::restore_recorded(IPV6, "1", state_dir);
        }
        Self {
            set,
            state_dir: state_dir.clone(),
            netns: endpoint.endpoint_netns.clone(),
            keep_endpoint: endpoint.keep_endpoint,
        }
    }
}

impl Drop for Forwarding {
    fn drop(&mut self) {
        // An endpoint kept past the stop (its record or its namespace
        // left: a record not yet saved still leaves the namespace) is still
        // routed through the node: its forwarding stays, recorded for the
        // next agent of this boot.
        let left = || {
            self.state_dir.join(record::FILE_NAME).exists()
                || crate::sys::netns::Netns::named(&self.netns).is_ok_and(|n| n.path().exists())
        };
        let kept = self.keep_endpoint && left();
        for s in self.set.drain(..) {
            drop(if kept { s.kept_on_drop() } else { s });
        }
    }
}
