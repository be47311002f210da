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
/// runtime's threads (it walks the RTT maps), and waits for it: the
/// caller holds the rounds' turn, so that no probe to a departed address
/// is in flight whose reply would make its entry again. Whether they
/// went (a failure is logged).
pub(super) async fn prune_kernel_rtt(dir: std::path::PathBuf, nodes: &NodeSet) -> bool {
    let keep: std::collections::HashSet<IpAddr> = nodes.iter().flat_map(Node::addresses).collect();
    let work = move || crate::datapath::rtt::prune(&dir, |ip| keep.contains(&ip));
    match tokio::task::spawn_blocking(work).await {
        Ok(Ok(removed)) => {
            tracing::debug!(removed, "kernel RTT entries of departed peers removed");
            true
        }
        Ok(Err(e)) => {
            tracing::warn!(
                "removing kernel RTT entries of departed peers: {}",
                crate::util::errors::chain(&e)
            );
            false
        }
        Err(e) => {
            tracing::warn!("removing kernel RTT entries of departed peers: {e}");
            false
        }
    }
}

/// Replaces a user-space RTT by the kernel's sample of the same round
/// (ICMP: the echo; HTTP: the TCP handshake), when there is one, in
/// place. The kernel times a probe between the endpoint's veth and back,
/// inside the agent's own timing of it, so a sample longer than the
/// agent's is not this probe's: the late answer to an earlier round's
/// probe, closed after this round's own answer. The agent's figure
/// stands then.
pub(super) fn with_kernel_rtt(
    kernel: Option<&KernelRtt>,
    ip: IpAddr,
    proto: u8,
    outcome: &mut Outcome,
) {
    if let (Outcome::Ok { rtt, source, .. }, Some(k)) = (outcome, kernel) {
        match k.last_sample(ip, proto) {
            Some(kernel_rtt) if kernel_rtt <= *rtt => {
                *rtt = kernel_rtt;
                *source = RttSource::Kernel;
            }
            _ => *source = RttSource::Userspace,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const PEER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 18, 65, 2));
    const TCP: u8 = 6;

    fn ok(rtt_us: u64) -> Outcome {
        Outcome::Ok {
            rtt: Duration::from_micros(rtt_us),
            warning: None,
            source: RttSource::Userspace,
        }
    }

    fn rtt_of(o: &Outcome) -> (Duration, RttSource) {
        match o {
            Outcome::Ok { rtt, source, .. } => (*rtt, *source),
            Outcome::Failed(e) => panic!("failed: {e:?}"),
        }
    }

    #[test]
    fn the_kernels_sample_replaces_the_agents_within_it() {
        let k = KernelRtt::from_samples(&[(PEER, TCP, 180_000)]);
        let mut o = ok(250);
        with_kernel_rtt(Some(&k), PEER, TCP, &mut o);
        assert_eq!(rtt_of(&o), (Duration::from_micros(180), RttSource::Kernel));
        // Another protocol, or no map: the agent's own figure.
        let mut o = ok(250);
        with_kernel_rtt(Some(&k), PEER, 1, &mut o);
        assert_eq!(
            rtt_of(&o),
            (Duration::from_micros(250), RttSource::Userspace)
        );
        let mut o = ok(250);
        with_kernel_rtt(None, PEER, TCP, &mut o);
        assert_eq!(
            rtt_of(&o),
            (Duration::from_micros(250), RttSource::Userspace)
        );
    }

    /// A sample longer than the agent's timing of the probe is a late
    /// answer to an earlier probe (1.3 s, past a 1 s timeout): not this
    /// probe's RTT.
    #[test]
    fn a_sample_longer_than_the_probe_is_not_its() {
        let k = KernelRtt::from_samples(&[(PEER, TCP, 1_300_000_000)]);
        let mut o = ok(250);
        with_kernel_rtt(Some(&k), PEER, TCP, &mut o);
        assert_eq!(
            rtt_of(&o),
            (Duration::from_micros(250), RttSource::Userspace)
        );
    }
}
