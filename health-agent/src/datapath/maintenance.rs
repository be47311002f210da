//! The node's datapath task: it creates the pins and writes the datapath's
//! configuration (CT lifetimes, masquerade), keeps masquerade attached to
//! the uplink (re-attached when the uplink is recreated), and maintains the
//! maps: the NAT and CT collectors and the RTT loss sweep. On shutdown it
//! detaches. The pins outlive a restart of this task (the endpoint's
//! programs share the maps through them): [`PinsGuard`] removes them when
//! the agent ends.

use std::{path::PathBuf, time::Duration};

use health_common::{ct::CtConfig, maps::ProgId};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{
    Datapath, DatapathError, Interface, ct, masquerade::Masquerade, nat, remove_pins, rtt,
};

use crate::{
    sys::{netlink::in_netns, sysctl::Sysctl},
    util::errors::chain,
};

/// What the node's datapath is made of.
#[derive(Debug, Clone)]
pub struct DatapathConfig {
    /// bpffs directory of the pinned maps.
    pub pin_dir: PathBuf,
    /// Connection-tracking lifetimes.
    pub ct: CtConfig,
    /// Masquerade on the uplink (`None`: routed mode).
    pub masquerade: Option<Masquerade>,
    /// Period of the collectors and the loss sweep.
    pub gc_interval: Duration,
    /// A request unanswered for this long counts as an RTT loss.
    pub probe_timeout: Duration,
    /// On shutdown, leave the pins for the next agent.
    pub keep_pins: bool,
}

/// Removes the pins under its directory when dropped (the agent's end,
/// however it ends), unless they are kept for the next agent.
#[derive(Debug)]
pub struct PinsGuard {
    pub dir: PathBuf,
    pub keep: bool,
}

impl Drop for PinsGuard {
    fn drop(&mut self) {
        if !self.keep
            && let Err(e) = remove_pins(&self.dir)
        {
            warn!("removing the pins: {}", chain(&e));
        }
    }
}

/// The loaded object and, in masquerade mode, the uplink it is attached to.
struct Node {
    datapath: Datapath,
    uplink_index: Option<u32>,
}

/// Runs until `shutdown`; `ready` is called once the configuration is
/// written and masquerade (if any) is attached.
pub async fn run(
    cfg: DatapathConfig,
    shutdown: CancellationToken,
    ready: impl FnOnce() + Send,
) -> Result<(), DatapathError> {
    // The node forwards between its uplink and the endpoint (both modes).
    let forwarding = Sysctl::set("net/ipv4/ip_forward", "1")
        .map_err(|e| warn!("could not enable IPv4 forwarding: {e}"))
        .ok();
    let c = cfg.clone();
    let mut node = blocking(move || set_up(&c)).await?;
    ready();
    let mut tick = tokio::time::interval(cfg.gc_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = tick.tick() => {}
        }
        let c = cfg.clone();
        node = blocking(move || maintain(&c, node)).await?;
    }
    drop(node);
    if cfg.keep_pins {
        // The kept endpoint still needs the node to forward for it.
        std::mem::forget(forwarding);
    } else {
        drop(forwarding);
    }
    Ok(())
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, DatapathError> + Send + 'static,
) -> Result<T, DatapathError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| DatapathError::Panicked(e.to_string()))?
}

/// Loads the object (the NAT programs only in masquerade mode), writes the
/// configuration and attaches masquerade.
fn set_up(cfg: &DatapathConfig) -> Result<Node, DatapathError> {
    let programs: &[ProgId] = if cfg.masquerade.is_some() {
        &[ProgId::NatEgress, ProgId::NatIngress]
    } else {
        &[]
    };
    let mut datapath = Datapath::load_programs(&cfg.pin_dir, programs)?;
    datapath.set_ct_config(cfg.ct)?;
    // Always written: pins reused from a masquerading run must not keep
    // translating after a switch to routed mode.
    datapath.set_nat_config(
        cfg.masquerade
            .as_ref()
            .map(|m| m.config)
            .unwrap_or_default(),
    )?;
    let uplink_index = match &cfg.masquerade {
        Some(m) => {
            datapath.attach_nat(&Interface::new(m.uplink.clone(), None))?;
            uplink_index(&m.uplink)
        }
        None => None,
    };
    Ok(Node {
        datapath,
        uplink_index,
    })
}

fn uplink_index(name: &str) -> Option<u32> {
    let name = name.to_owned();
    in_netns(None, |nl| async move { nl.link_index(&name).await })
        .map_err(|e| warn!("looking up the uplink: {}", chain(&e)))
        .ok()
        .flatten()
}

/// One maintenance pass: masquerade still on the uplink, then the
/// collectors and the sweep (failures are logged; the next pass retries).
fn maintain(cfg: &DatapathConfig, node: Node) -> Result<Node, DatapathError> {
    let node = match &cfg.masquerade {
        Some(m) if uplink_index(&m.uplink) != node.uplink_index => {
            warn!(uplink = %m.uplink, "the uplink was recreated: attaching masquerade again");
            drop(node);
            let node = set_up(cfg)?;
            info!(uplink = %m.uplink, "masquerade attached again");
            node
        }
        _ => node,
    };
    let dir = node.datapath.pin_dir();
    // NAT first: it removes pairs whose CT entry expired, which the CT
    // collector is about to delete.
    if let Err(e) = nat::gc(dir) {
        warn!("NAT garbage collection: {}", chain(&e));
    }
    match (ct::gc(dir), rtt::sweep(dir, cfg.probe_timeout)) {
        (Ok(removed), Ok(lost)) => debug!(removed, lost, "datapath maintenance"),
        (r, l) => {
            for e in [r.err(), l.err()].into_iter().flatten() {
                warn!("datapath maintenance: {}", chain(&e));
            }
        }
    }
    Ok(node)
}
