//! The kernel's RTT samples in a round: a user-space RTT replaced by the
//! kernel's sample of the same probe, and the samples of departed peers
//! removed.

use std::net::IpAddr;

use super::path::{Outcome, RttSource};
use crate::{
    datapath::rtt::KernelRtt,
    membership::{Node, NodeSet},
};

/// Removes the kernel's RTT entries of peers no longer in `nodes`, off the
/// caller's thread (it walks the RTT maps).
pub(super) fn prune_kernel_rtt(dir: std::path::PathBuf, nodes: &NodeSet) {
    let keep: std::collections::HashSet<IpAddr> = nodes.iter().flat_map(Node::addresses).collect();
    let work = move || match crate::datapath::rtt::prune(&dir, |ip| keep.contains(&ip)) {
        Ok(removed) => tracing::debug!(removed, "kernel RTT entries of departed peers removed"),
        Err(e) => tracing::warn!(
            "removing kernel RTT entries of departed peers: {}",
            crate::util::errors::chain(&e)
        ),
    };
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => drop(rt.spawn_blocking(work)),
        Err(_) => work(),
    }
}

/// Replaces a user-space RTT by the kernel's sample of the same round
/// (ICMP: the echo; HTTP: the TCP handshake), when there is one, in
/// place.
pub(super) fn with_kernel_rtt(
    kernel: Option<&KernelRtt>,
    ip: IpAddr,
    proto: u8,
    outcome: &mut Outcome,
) {
    if let (Outcome::Ok { rtt, source, .. }, Some(k)) = (outcome, kernel) {
        match k.last_sample(ip, proto) {
            Some(kernel_rtt) => {
                *rtt = kernel_rtt;
                *source = RttSource::Kernel;
            }
            None => *source = RttSource::Userspace,
        }
    }
}
