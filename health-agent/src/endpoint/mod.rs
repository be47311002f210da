//! The health endpoint: its own network namespace joined to the node by the
//! `lxc_health` veth, an address from the health CIDR, endpoint ID and the
//! reserved identity 4, walked through Cilium's endpoint lifecycle.

pub mod lifecycle;
pub mod plumbing;
pub mod record;
mod view;

use std::{
    collections::BTreeSet,
    net::Ipv4Addr,
    path::PathBuf,
    sync::{Arc, RwLock},
    time::Duration,
};

use tracing::{info, warn};

pub use self::view::{EndpointView, SharedView};
use self::{
    lifecycle::{InvalidTransition, Lifecycle, State},
    plumbing::{Missing, Plan, PlumbingError},
    record::{EndpointRecord, RecordError, new_endpoint_id},
};
use crate::{
    errors::chain,
    ipam::{IpamError, Ipv4Cidr, allocate},
    netlink::{NetlinkError, in_netns},
    netns::{Netns, NetnsError},
    responder::{AttachMode, Interface, Responder, ResponderError, remove_pins},
};

/// What the endpoint is made from.
#[derive(Debug, Clone)]
pub struct EndpointConfig {
    pub cidr: Ipv4Cidr,
    pub netns_name: String,
    pub host_iface: String,
    pub ep_iface: String,
    pub state_dir: PathBuf,
    pub pin_dir: PathBuf,
    pub mode: AttachMode,
    /// Connection-tracking lifetimes for the programs on the host interface.
    pub ct: health_common::ct::CtConfig,
    /// Masquerade on the node's uplink (`None`: routed mode).
    pub masquerade: Option<crate::masquerade::Masquerade>,
}

#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error(transparent)]
    Ipam(#[from] IpamError),
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("endpoint plumbing")]
    Plumbing(#[from] PlumbingError),
    #[error("endpoint datapath")]
    Responder(#[source] Box<ResponderError>),
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    #[error(transparent)]
    Transition(#[from] InvalidTransition),
}

impl From<ResponderError> for EndpointError {
    fn from(e: ResponderError) -> Self {
        Self::Responder(Box::new(e))
    }
}

/// What a controller run found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ControllerRun {
    pub missing: Vec<String>,
    pub repaired: bool,
    /// The namespace itself was recreated: whatever was bound inside the
    /// old one (the endpoint's :4240 responder) must be bound again.
    pub namespace_recreated: bool,
}

/// The endpoint at run time.
pub struct Endpoint {
    cfg: EndpointConfig,
    record: EndpointRecord,
    plan: Plan,
    lifecycle: Lifecycle,
    repairs: u64,
    responder: Option<Responder>,
    /// Index of the endpoint interface the responder was attached to.
    attached_to: Option<u32>,
    shared: SharedView,
    echo_seq: u16,
}

impl Endpoint {
    /// Restores the endpoint a previous run left, or creates a new one.
    /// Everything that can be refused (CIDR, address exhaustion, a corrupt
    /// record) is checked before anything is created; a failure while
    /// creating a new endpoint removes what was made.
    pub fn start(cfg: EndpointConfig, shared: SharedView) -> Result<Self, EndpointError> {
        let previous = EndpointRecord::load(&cfg.state_dir)?;
        let netns = Netns::named(&cfg.netns_name)?;
        let restorable = previous.as_ref().filter(|r| {
            r.cidr == cfg.cidr
                && r.netns == cfg.netns_name
                && netns.exists()
                && cfg.cidr.is_usable(r.ipv4)
        });
        let mut lifecycle = Lifecycle::default();
        let record = if let Some(r) = restorable {
            lifecycle.transition(
                State::Restoring,
                format!(
                    "found endpoint {} ({}) in netns {} from a previous run",
                    r.id, r.ipv4, r.netns
                ),
            )?;
            r.clone()
        } else {
            let in_use = node_addresses(cfg.cidr)?;
            let ipv4 = allocate(cfg.cidr, &in_use, previous.as_ref().map(|r| r.ipv4))?;
            let id = previous
                .as_ref()
                .map_or_else(|| new_endpoint_id(&[]), |r| r.id);
            lifecycle.transition(State::WaitingForIdentity, "allocating an identity")?;
            EndpointRecord {
                id,
                ipv4,
                cidr: cfg.cidr,
                netns: cfg.netns_name.clone(),
            }
        };
        let plan = Plan {
            netns,
            netns_name: cfg.netns_name.clone(),
            host_iface: cfg.host_iface.clone(),
            ep_iface: cfg.ep_iface.clone(),
            ipv4: record.ipv4,
            cidr: cfg.cidr,
        };
        let restoring = lifecycle.state() == Some(State::Restoring);
        let mut ep = Self {
            cfg,
            record,
            plan,
            lifecycle,
            repairs: 0,
            responder: None,
            attached_to: None,
            shared,
            echo_seq: 0,
        };
        ep.publish();
        if !restoring {
            ep.transition(
                State::WaitingToRegenerate,
                format!(
                    "identity {} ({}) allocated",
                    record::HEALTH_IDENTITY,
                    record::HEALTH_LABEL
                ),
            )?;
        }
        let result = ep.regenerate(if restoring {
            "restoring the endpoint's plumbing and programs"
        } else {
            "creating namespace, veth, address, routes and programs"
        });
        if let Err(e) = result {
            if !restoring {
                warn!(
                    "creating the endpoint failed, removing what was made: {}",
                    chain(&e)
                );
                ep.responder = None;
                if let Err(c) = plumbing::remove(&ep.plan) {
                    warn!("cleanup after the failure: {}", chain(&c));
                }
                let _ = remove_pins(&ep.cfg.pin_dir);
            }
            return Err(e);
        }
        ep.record.save(&ep.cfg.state_dir)?;
        ep.transition(State::Ready, "endpoint plumbing and programs in place")?;
        Ok(ep)
    }

    fn transition(&mut self, to: State, reason: impl Into<String>) -> Result<(), EndpointError> {
        self.lifecycle.transition(to, reason)?;
        self.publish();
        Ok(())
    }

    fn publish(&self) {
        let view = EndpointView::new(&self.record, &self.cfg, &self.lifecycle, self.repairs);
        if let Ok(mut w) = self.shared.write() {
            *w = Some(view);
        }
    }

    /// Enters regenerating, puts the plumbing in place and (re)attaches the
    /// responder.
    fn regenerate(&mut self, reason: &str) -> Result<Vec<Missing>, EndpointError> {
        self.transition(State::Regenerating, reason)?;
        let made = plumbing::ensure(&self.plan)?;
        self.attach()?;
        Ok(made)
    }

    fn attach(&mut self) -> Result<(), EndpointError> {
        // Drop the old links first: one responder per interface.
        self.responder = None;
        let mut r = Responder::load(&self.cfg.pin_dir)?;
        r.set_address(self.record.ipv4)?;
        let iface = Interface::new(self.cfg.ep_iface.clone(), Some(self.plan.netns.clone()));
        let peer = Interface::new(self.cfg.host_iface.clone(), None);
        r.attach(&iface, self.cfg.mode, Some(&peer))?;
        r.set_ct_config(self.cfg.ct)?;
        r.attach_tracking(&peer)?;
        // Always written: pins reused from a masquerading run must not keep
        // translating after a switch to routed mode.
        let nat = self.cfg.masquerade.as_ref();
        r.set_nat_config(nat.map(|m| m.config).unwrap_or_default())?;
        if let Some(m) = nat {
            r.attach_nat(&Interface::new(m.uplink.clone(), None))?;
        }
        self.attached_to = self.ep_index()?;
        self.responder = Some(r);
        Ok(())
    }

    fn ep_index(&self) -> Result<Option<u32>, EndpointError> {
        if !self.plan.netns.exists() {
            return Ok(None);
        }
        let ep = self.cfg.ep_iface.clone();
        Ok(in_netns(Some(&self.plan.netns), |nl| async move {
            nl.link_index(&ep).await
        })?)
    }

    /// One controller pass: checks namespace, veth, address, routes, the
    /// attached programs and that the endpoint answers an echo; whatever is
    /// missing is recreated (ready -> waiting-to-regenerate -> regenerating
    /// -> ready) and counted.
    pub fn check_and_repair(
        &mut self,
        echo_timeout: Duration,
    ) -> Result<ControllerRun, EndpointError> {
        let found = plumbing::inspect(&self.plan)?;
        let namespace_recreated = found.contains(&Missing::Namespace);
        let mut missing: Vec<String> = found.iter().map(|m| m.as_str().to_owned()).collect();
        if missing.is_empty() && self.ep_index()? != self.attached_to {
            missing.push("programs".into());
        }
        if missing.is_empty() {
            self.echo_seq = self.echo_seq.wrapping_add(1);
            let answered = crate::icmp::echo(self.record.ipv4, 0x4845, self.echo_seq, echo_timeout)
                .map_err(|e| warn!("echo check: {e}"))
                .ok()
                .flatten();
            if answered.is_none() {
                missing.push("echo reply".into());
            }
        }
        if missing.is_empty() {
            return Ok(ControllerRun::default());
        }
        let what = missing.join(", ");
        warn!(missing = %what, "endpoint needs repair");
        self.transition(
            State::WaitingToRegenerate,
            format!("controller found missing: {what}"),
        )?;
        self.regenerate(&format!("recreating: {what}"))?;
        self.repairs += 1;
        self.transition(
            State::Ready,
            format!("repaired ({} repairs so far)", self.repairs),
        )?;
        info!(repairs = self.repairs, "endpoint repaired");
        Ok(ControllerRun {
            missing,
            repaired: true,
            namespace_recreated,
        })
    }

    /// Deletes the endpoint (disconnecting -> disconnected). With `keep`,
    /// the namespace, veth, pins and record stay for the next agent, which
    /// restores them; the programs detach when this process exits.
    pub fn shutdown(&mut self, keep: bool, reason: &str) -> Result<(), EndpointError> {
        self.transition(State::Disconnecting, reason.to_owned())?;
        self.responder = None;
        if keep {
            info!("keeping the endpoint for the next agent (--keep-endpoint)");
        } else {
            plumbing::remove(&self.plan)?;
            remove_pins(&self.cfg.pin_dir)?;
            EndpointRecord::remove(&self.cfg.state_dir)?;
        }
        self.transition(
            State::Disconnected,
            if keep {
                "agent stopped, endpoint kept"
            } else {
                "endpoint removed"
            },
        )
    }

    #[must_use]
    pub const fn record(&self) -> &EndpointRecord {
        &self.record
    }
}

/// IPv4 addresses already configured in this (the node's) namespace inside
/// `cidr`: never handed to the endpoint.
fn node_addresses(cidr: Ipv4Cidr) -> Result<BTreeSet<Ipv4Addr>, EndpointError> {
    let all = in_netns(None, |nl| async move { nl.addresses_v4().await })?;
    Ok(all
        .into_iter()
        .map(|(_, a, _)| a)
        .filter(|a| cidr.contains(*a))
        .collect())
}

/// A fresh shared view, empty until the endpoint publishes.
#[must_use]
pub fn shared_view() -> SharedView {
    Arc::new(RwLock::new(None))
}
