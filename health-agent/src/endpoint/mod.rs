//! The health endpoint: its own network namespace joined to the node by the
//! `lxc_health` veth, an address from the health CIDR, endpoint ID and the
//! reserved identity 4, walked through Cilium's endpoint lifecycle.

pub mod controller;
pub mod ipam;
pub mod lifecycle;
pub mod plumbing;
pub mod record;
mod view;

use std::{
    collections::BTreeSet,
    net::{Ipv4Addr, Ipv6Addr},
    path::PathBuf,
    sync::{Arc, RwLock},
    time::Duration,
};

use health_common::maps::ProgId;
use tracing::{info, warn};

pub use self::view::{EndpointView, SharedView, ipv4, ipv6};
use self::{
    lifecycle::{InvalidTransition, Lifecycle, State},
    plumbing::{Missing, Plan, PlumbingError, V4, V6},
    record::{EndpointRecord, RecordError, new_endpoint_id},
};
use crate::{
    datapath::{AttachMode, Datapath, DatapathError, Interface, TcHook},
    endpoint::ipam::{IpamError, allocate, allocate6},
    sys::netlink::{NetlinkError, in_netns},
    sys::netns::{Netns, NetnsError},
    util::cidr::{Ipv4Cidr, Ipv6Cidr},
    util::errors::chain,
};

/// What the endpoint is made from.
#[derive(Debug, Clone)]
pub struct EndpointConfig {
    /// Where the IPv4 address comes from (`None`: the endpoint has none).
    pub cidr: Option<Ipv4Cidr>,
    /// Where the IPv6 address comes from (`None`: the endpoint has none).
    /// At least one of the two is given.
    pub cidr6: Option<Ipv6Cidr>,
    pub netns_name: String,
    pub host_iface: String,
    pub ep_iface: String,
    pub state_dir: PathBuf,
    pub pin_dir: PathBuf,
    /// Attach mode of the echo responder.
    pub mode: AttachMode,
    /// The hook of the tracking programs on the host side (tcx or classic
    /// tc).
    pub tc_hook: TcHook,
    /// On shutdown, leave namespace, veth and record for the next agent.
    pub keep: bool,
    /// Sizes of the shared maps (the node's datapath task loads with the
    /// same, so neither replaces the other's pins).
    pub map_sizes: health_common::maps::MapSizes,
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
    Datapath(#[source] Box<DatapathError>),
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    #[error(transparent)]
    Transition(#[from] InvalidTransition),
}

impl From<DatapathError> for EndpointError {
    fn from(e: DatapathError) -> Self {
        Self::Datapath(Box::new(e))
    }
}

/// What a controller run found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ControllerRun {
    pub missing: Vec<Missing>,
    pub repaired: bool,
    /// The namespace itself was recreated: whatever was bound inside the
    /// old one (the endpoint's :4240 hello server) must be bound again.
    pub namespace_recreated: bool,
}

/// The endpoint at run time.
pub struct Endpoint {
    cfg: EndpointConfig,
    record: EndpointRecord,
    plan: Plan,
    lifecycle: Lifecycle,
    repairs: u64,
    /// The echo and tracking programs, attached.
    datapath: Option<Datapath>,
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
        let restorable = previous
            .as_ref()
            .filter(|r| r.netns == cfg.netns_name && netns.exists() && matches_config(r, &cfg));
        let mut lifecycle = Lifecycle::default();
        let record = if let Some(r) = restorable {
            lifecycle.transition(
                State::Restoring,
                format!(
                    "found endpoint {} ({}) in netns {} from a previous run",
                    r.id,
                    r.addresses(),
                    r.netns
                ),
            )?;
            r.clone()
        } else {
            let record = new_record(&cfg, previous.as_ref())?;
            lifecycle.transition(State::WaitingForIdentity, "allocating an identity")?;
            record
        };
        let plan = Plan {
            netns,
            netns_name: cfg.netns_name.clone(),
            host_iface: cfg.host_iface.clone(),
            ep_iface: cfg.ep_iface.clone(),
            v4: record
                .ipv4
                .zip(record.cidr)
                .map(|(addr, cidr)| V4 { addr, cidr }),
            v6: record
                .ipv6
                .zip(record.cidr6)
                .map(|(addr, cidr)| V6 { addr, cidr }),
        };
        let restoring = lifecycle.state() == Some(State::Restoring);
        let mut ep = Self {
            cfg,
            record,
            plan,
            lifecycle,
            repairs: 0,
            datapath: None,
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
                ep.datapath = None;
                if let Err(c) = plumbing::remove(&ep.plan) {
                    warn!("cleanup after the failure: {}", chain(&c));
                }
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

    /// Attaches the echo responder (on the endpoint's side of the veth)
    /// and CT/RTT (on the host side); the maps are the node's, shared
    /// through the pins.
    fn attach(&mut self) -> Result<(), EndpointError> {
        // Drop the old links first: one program of each per interface.
        self.datapath = None;
        let mut programs = vec![ProgId::LxcIngress, ProgId::LxcEgress];
        programs.extend(match self.cfg.mode {
            AttachMode::Tcx | AttachMode::Tc => &[ProgId::EchoTc][..],
            AttachMode::XdpNative => &[ProgId::EchoXdp, ProgId::XdpPass][..],
            AttachMode::XdpGeneric => &[ProgId::EchoXdp][..],
        });
        let mut d = Datapath::load_sized(&self.cfg.pin_dir, &programs, &self.cfg.map_sizes)?;
        let iface = Interface::new(self.cfg.ep_iface.clone(), Some(self.plan.netns.clone()));
        d.set_echo_targets(&iface, self.record.ipv4, self.record.ipv6)?;
        let peer = Interface::new(self.cfg.host_iface.clone(), None);
        d.attach_echo(&iface, self.cfg.mode, Some(&peer))?;
        d.attach_tracking(&peer, self.cfg.tc_hook)?;
        for a in d.attachments() {
            info!(
                program = %a.program,
                interface = %a.interface,
                attach = %a.attach,
                detail = a.detail.as_deref().unwrap_or(""),
                "program attached"
            );
        }
        self.attached_to = self.ep_index()?;
        self.datapath = Some(d);
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
        let mut missing = plumbing::inspect(&self.plan)?;
        let namespace_recreated = missing.contains(&Missing::Namespace);
        if missing.is_empty() && self.ep_index()? != self.attached_to {
            missing.push(Missing::Programs);
        }
        if missing.is_empty()
            && let Some(d) = &self.datapath
        {
            // tcx links and tc filters still where they were attached: a
            // filter deleted by someone else (or its clsact qdisc) leaves
            // the interfaces as they were.
            let gone = d.missing_attachments()?;
            if !gone.is_empty() {
                warn!(programs = %gone.join(", "), "programs detached from the endpoint");
                missing.push(Missing::Programs);
            }
        }
        if missing.is_empty() && !self.answers_echo(echo_timeout) {
            missing.push(Missing::EchoReply);
        }
        if missing.is_empty() {
            return Ok(ControllerRun::default());
        }
        let what = missing
            .iter()
            .map(|m| m.as_str())
            .collect::<Vec<_>>()
            .join(", ");
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

    /// Deletes the endpoint (disconnecting -> disconnected). With `keep`
    /// in its configuration, the namespace, veth and record stay for the
    /// next agent, which restores them; the programs detach now.
    pub fn shutdown(&mut self, reason: &str) -> Result<(), EndpointError> {
        let keep = self.cfg.keep;
        self.transition(State::Disconnecting, reason.to_owned())?;
        self.datapath = None;
        if keep {
            info!("keeping the endpoint for the next agent (--keep-endpoint)");
        } else {
            plumbing::remove(&self.plan)?;
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

    /// Whether the endpoint answers an echo on each of its addresses.
    fn answers_echo(&mut self, timeout: Duration) -> bool {
        self.echo_seq = self.echo_seq.wrapping_add(1);
        let seq = self.echo_seq;
        let v4 = self.record.ipv4.is_none_or(|ip| {
            crate::sys::icmp::echo(ip.into(), 0x4845, seq, timeout)
                .map_err(|e| warn!("echo check of {ip}: {e}"))
                .ok()
                .flatten()
                .is_some()
        });
        let v6 = self.record.ipv6.is_none_or(|ip| {
            crate::sys::icmp::echo(ip.into(), 0x4845, seq, timeout)
                .map_err(|e| warn!("echo check of {ip}: {e}"))
                .ok()
                .flatten()
                .is_some()
        });
        v4 && v6
    }
}

/// Whether the record `r` of a previous run has the addresses `cfg` asks
/// for: the same CIDRs, each address still usable.
fn matches_config(r: &EndpointRecord, cfg: &EndpointConfig) -> bool {
    let v4 = r.cidr == cfg.cidr
        && match (cfg.cidr, r.ipv4) {
            (Some(c), Some(a)) => c.is_usable(a),
            (None, None) => true,
            _ => false,
        };
    let v6 = r.cidr6 == cfg.cidr6
        && match (cfg.cidr6, r.ipv6) {
            (Some(c), Some(a)) => c.is_usable(a),
            (None, None) => true,
            _ => false,
        };
    v4 && v6
}

/// A new endpoint's record: an address of each configured family (the
/// previous run's when it is still usable and free), the previous ID.
fn new_record(
    cfg: &EndpointConfig,
    previous: Option<&EndpointRecord>,
) -> Result<EndpointRecord, EndpointError> {
    let ipv4 = cfg
        .cidr
        .map(|cidr| -> Result<_, EndpointError> {
            let in_use = node_addresses(cidr)?;
            Ok(allocate(cidr, &in_use, previous.and_then(|r| r.ipv4))?)
        })
        .transpose()?;
    let ipv6 = cfg
        .cidr6
        .map(|cidr| -> Result<_, EndpointError> {
            let in_use = node_addresses6(cidr)?;
            Ok(allocate6(cidr, &in_use, previous.and_then(|r| r.ipv6))?)
        })
        .transpose()?;
    Ok(EndpointRecord {
        id: previous.map_or_else(|| new_endpoint_id(&[]), |r| r.id),
        ipv4,
        cidr: cfg.cidr,
        ipv6,
        cidr6: cfg.cidr6,
        netns: cfg.netns_name.clone(),
    })
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

/// IPv6 addresses already configured in this (the node's) namespace inside
/// `cidr`: never handed to the endpoint.
fn node_addresses6(cidr: Ipv6Cidr) -> Result<BTreeSet<Ipv6Addr>, EndpointError> {
    let all = in_netns(None, |nl| async move { nl.addresses_v6().await })?;
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
