//! The health endpoint: its namespace, veth, addresses, routes, ownership and lifecycle.
//! Imported by `metrics`, `api`, `config`, `daemon`; imports `probe`, `datapath`, `sys`, `util`.
//!
//! The health endpoint: its own network namespace joined to the node by the
//! `lxc_health` veth, an address from the health CIDR, endpoint ID and the
//! reserved identity 4, walked through Cilium's endpoint lifecycle.

pub mod controller;
pub mod ipam;
pub mod lifecycle;
pub mod ownership;
pub mod plan;
pub mod plumbing;
pub mod record;
pub mod settings;
mod view;

use std::{
    collections::BTreeSet,
    path::PathBuf,
    sync::{Arc, RwLock},
    time::Duration,
};

use health_common::maps::EchoConfig;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use tracing::{info, warn};

pub use self::view::{EndpointView, SharedView, ipv4, ipv6};
use self::{
    lifecycle::{InvalidTransition, Lifecycle, State},
    ownership::{ForeignObject, Owned, Record},
    plan::{Plan, PlumbingError, V4, V6},
    plumbing::{Made, Missing},
    record::{EndpointRecord, RecordError, new_endpoint_id},
};
use crate::{
    datapath::{
        AttachMode, Attachments, DatapathError, DatapathHandle, Interface, TcHook, render_missing,
    },
    endpoint::ipam::{IpamError, Pool, allocate},
    sys::boot::{BootError, ThisBoot},
    sys::netlink::{NetlinkError, in_netns},
    sys::netns::{Netns, NetnsError},
    util::{cidr::Cidr as _, errors::chain},
};

/// What the endpoint is made from.
#[derive(Debug, Clone)]
pub struct EndpointConfig {
    /// Where the IPv4 address comes from (`None`: the endpoint has none).
    pub cidr: Option<Ipv4Net>,
    /// Where the IPv6 address comes from (`None`: the endpoint has none).
    /// At least one of the two is given.
    pub cidr6: Option<Ipv6Net>,
    pub netns_name: String,
    pub host_iface: String,
    pub ep_iface: String,
    pub state_dir: PathBuf,
    /// Attach mode of the echo responder.
    pub mode: AttachMode,
    /// The hook of the tracking programs on the host side (tcx or classic
    /// tc).
    pub tc_hook: TcHook,
    /// On shutdown, leave namespace, veth and record for the next agent.
    pub keep: bool,
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
    #[error(transparent)]
    Foreign(#[from] Box<ForeignObject>),
    #[error("telling which boot the endpoint record's proofs are from")]
    Boot(#[from] BootError),
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
}

/// How long attaching waits for the endpoint interface's IPv6 link-local
/// address.
const LINK_LOCAL_WAIT: Duration = Duration::from_secs(2);

/// The endpoint at run time.
pub struct Endpoint {
    cfg: EndpointConfig,
    record: EndpointRecord,
    plan: Plan,
    lifecycle: Lifecycle,
    repairs: u64,
    /// The node's kernel object, through its owner.
    kernel: DatapathHandle,
    /// The echo and tracking programs, attached.
    datapath: Option<Attachments>,
    /// Index of the endpoint interface the responder was attached to.
    attached_to: Option<u32>,
    /// What the responder was last told of the endpoint interface.
    echo_config: Option<EchoConfig>,
    shared: SharedView,
    echo_seq: u16,
    /// Why the record's last save at run time failed (a read-only state
    /// directory): the record in memory is current, and the save is tried
    /// again at every controller run until it holds.
    unsaved: Option<String>,
}

impl Endpoint {
    /// Restores the endpoint a previous run left, or creates a new one.
    /// Everything that can be refused (CIDR, address exhaustion, a corrupt
    /// record) is checked before anything is created; a failure while
    /// creating a new endpoint removes what was made.
    ///
    /// A namespace or interface under the endpoint's names that the
    /// previous run's record does not prove is this agent's
    /// ([`ownership`]) is refused before anything is done, and left as it
    /// is.
    pub fn start(
        cfg: EndpointConfig,
        kernel: DatapathHandle,
        shared: SharedView,
    ) -> Result<Self, EndpointError> {
        let Begun {
            mut plan,
            previous,
            owned,
            begin,
        } = begin(&cfg)?;
        let mut lifecycle = Lifecycle::default();
        let mut record = match begin {
            Ok(r) => {
                lifecycle.transition(
                    State::Restoring,
                    format!(
                        "found endpoint {} ({}) in netns {} from a previous run",
                        r.id,
                        r.addresses(),
                        r.netns
                    ),
                )?;
                r
            }
            Err(record) => {
                lifecycle.transition(State::WaitingForIdentity, "allocating an identity")?;
                record
            }
        };
        let changed = previous
            .as_ref()
            .is_some_and(|r| r.owned.as_ref() != Some(&owned));
        record.owned = Some(owned);
        if changed {
            // An earlier record's objects, adopted: their proof is kept
            // from now on, as is what went missing meanwhile.
            record.save(&cfg.state_dir)?;
        }
        plan.v4 = record
            .ipv4
            .zip(record.cidr)
            .map(|(addr, cidr)| V4 { addr, cidr });
        plan.v6 = record
            .ipv6
            .zip(record.cidr6)
            .map(|(addr, cidr)| V6 { addr, cidr });
        let restoring = lifecycle.state() == Some(State::Restoring);
        // A task started again within the process goes on counting: the
        // metric is a counter.
        let repairs = repairs_so_far(&shared);
        let mut ep = Self {
            cfg,
            record,
            plan,
            lifecycle,
            repairs,
            kernel,
            datapath: None,
            attached_to: None,
            echo_config: None,
            shared,
            echo_seq: 0,
            unsaved: None,
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
        // At start the record must be saved: an agent that cannot record
        // what it made could not prove it its own after a restart.
        let result = ep
            .regenerate(if restoring {
                "restoring the endpoint's plumbing and programs"
            } else {
                "creating namespace, veth, address, routes and programs"
            })
            .and_then(|_| Ok(ep.record.save(&ep.cfg.state_dir)?));
        if let Err(e) = result {
            if !restoring {
                warn!(
                    "creating the endpoint failed, removing what was made: {}",
                    chain(&e)
                );
                ep.datapath = None;
                if let Err(c) = ep.remove_plumbing() {
                    warn!("cleanup after the failure: {}", chain(&c));
                }
            }
            return Err(e);
        }
        ep.unsaved = None;
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
    /// responder. Anything under the endpoint's names that the record does not prove
    /// is the agent's stops it, untouched.
    fn regenerate(&mut self, reason: &str) -> Result<Vec<Missing>, EndpointError> {
        self.transition(State::Regenerating, reason)?;
        let owned = self.record.owned.clone().unwrap_or_default();
        let owned = ownership::judge(Record::Current(&owned), &ownership::observe(&self.plan)?)?;
        let host_proven = owned.host.as_ref().map(|h| h.ifindex);
        self.record.owned = Some(owned);
        let (plan, record, dir) = (&self.plan, &mut self.record, &self.cfg.state_dir);
        let unsaved = &mut self.unsaved;
        let made = plumbing::ensure_with(plan, host_proven, |m| {
            record_made(plan, record, dir, unsaved, m)
        })?;
        self.attach()?;
        Ok(made)
    }

    /// Removes the namespace and interfaces the record proves are the
    /// agent's; anything else under their names is left, with a warning.
    /// The record then owns nothing.
    fn remove_plumbing(&mut self) -> Result<(), EndpointError> {
        let owned = self.record.owned.clone().unwrap_or_default();
        for left in plumbing::remove(&self.plan, &owned)? {
            warn!("not removed: {left}");
        }
        self.record.owned = Some(Owned::default());
        Ok(())
    }

    /// Attaches the echo responder (on the endpoint's side of the veth)
    /// and CT/RTT (on the host side), through the node's kernel object.
    fn attach(&mut self) -> Result<(), EndpointError> {
        // Detach the old set first: one program of each per interface.
        self.datapath = None;
        let set = self.kernel.attachments();
        let iface = self.ep_interface();
        // The link-local address is the endpoint's own source too: wait
        // for it, so the responder knows it from the start.
        if self.record.ipv6.is_some() && !plumbing::wait_link_local(&self.plan, LINK_LOCAL_WAIT)? {
            warn!(
                interface = %iface,
                "no IPv6 link-local address yet; the responder learns it at the controller's next run"
            );
        }
        self.echo_config = Some(self.kernel.set_echo_targets(
            &iface,
            self.record.ipv4,
            self.record.ipv6,
        )?);
        let peer = Interface::new(self.cfg.host_iface.clone(), None);
        set.attach_echo(&iface, self.cfg.mode, Some(&peer))?;
        set.attach_tracking(&peer, self.cfg.tc_hook)?;
        for a in set.report() {
            info!(
                program = %a.program,
                interface = %a.interface,
                attach = %a.attach,
                detail = a.detail.as_deref().unwrap_or(""),
                "program attached"
            );
        }
        self.attached_to = self.ep_index()?;
        self.datapath = Some(set);
        Ok(())
    }

    fn ep_interface(&self) -> Interface {
        Interface::new(self.cfg.ep_iface.clone(), Some(self.plan.netns.clone()))
    }

    /// Tells the responder the endpoint interface's addresses again when
    /// they changed (an address added or removed by hand, the link-local
    /// one coming late).
    fn refresh_echo_config(&mut self) -> Result<(), EndpointError> {
        let iface = self.ep_interface();
        let (ipv4, ipv6) = (self.record.ipv4, self.record.ipv6);
        if self.datapath.is_some() {
            let now = self.kernel.set_echo_targets(&iface, ipv4, ipv6)?;
            if self.echo_config != Some(now) {
                info!(interface = %iface, "the echo responder's own addresses follow the interface's");
                self.echo_config = Some(now);
            }
        }
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
        self.save_again();
        let mut missing = plumbing::inspect(&self.plan)?;
        if missing.is_empty() && self.ep_index()? != self.attached_to {
            missing.push(Missing::Programs);
        }
        let ready = self.lifecycle.state() == Some(State::Ready);
        owed_regeneration(&mut missing, self.datapath.is_some(), ready);
        if missing.is_empty()
            && let Some(d) = &self.datapath
        {
            // tcx links and tc filters still where they were attached: a
            // filter deleted by someone else (or its clsact qdisc) leaves
            // the interfaces as they were.
            let gone = d.missing()?;
            if !gone.is_empty() {
                warn!(programs = %render_missing(&gone), "programs detached from the endpoint");
                missing.push(Missing::Programs);
            }
        }
        if missing.is_empty() && !self.answers_echo(echo_timeout) {
            missing.push(Missing::EchoReply);
        }
        if missing.is_empty() {
            self.refresh_echo_config()?;
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
        })
    }

    /// Why the record could not be saved at run time, while it cannot.
    #[must_use]
    pub fn unsaved(&self) -> Option<&str> {
        self.unsaved.as_deref()
    }

    /// Saves the record again when its last save failed.
    fn save_again(&mut self) {
        if self.unsaved.is_some() {
            save_noted(&self.record, &self.cfg.state_dir, &mut self.unsaved);
            if self.unsaved.is_none() {
                info!(dir = %self.cfg.state_dir.display(), "endpoint record saved again");
            }
        }
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
            self.remove_plumbing()?;
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

/// What [`Endpoint::start`] found before it makes anything.
struct Begun {
    plan: Plan,
    previous: Option<EndpointRecord>,
    /// What the previous record proves is the agent's under the endpoint's
    /// names.
    owned: Owned,
    /// The record restored (`Ok`), or one made anew (`Err`).
    begin: Result<EndpointRecord, EndpointRecord>,
}

/// Loads the previous run's record and judges what is under the
/// endpoint's names; once everything that can be refused is checked, a
/// previous endpoint the flags no longer describe goes ([`retire`]), and
/// what is under the names is judged again.
fn begin(cfg: &EndpointConfig) -> Result<Begun, EndpointError> {
    let boot = ThisBoot::read()?;
    let previous = EndpointRecord::load_in(&cfg.state_dir, &boot)?;
    let plan = Plan {
        netns: Netns::named(&cfg.netns_name)?,
        netns_name: cfg.netns_name.clone(),
        host_iface: cfg.host_iface.clone(),
        ep_iface: cfg.ep_iface.clone(),
        v4: None,
        v6: None,
    };
    let claimed = claim(&plan, previous.as_ref())?;
    let restorable = previous
        .as_ref()
        .filter(|r| r.netns == cfg.netns_name && claimed.netns.is_some() && matches_config(r, cfg))
        .cloned();
    let begin = match restorable {
        Some(r) => Ok(r),
        None => Err(new_record(cfg, previous.as_ref(), &boot)?),
    };
    let (previous, owned) = match retire(previous, cfg)? {
        Retired::Kept(p) => (p, claimed),
        Retired::Removed(p) => {
            let owned = claim(&plan, Some(&p))?;
            (Some(p), owned)
        }
    };
    Ok(Begun {
        plan,
        previous,
        owned,
        begin,
    })
}

/// What [`retire`] did with the previous run's record.
enum Retired {
    /// It describes the endpoint to make (or proves nothing): kept as it is.
    Kept(Option<EndpointRecord>),
    /// Its endpoint was removed; the record, kept for its ID and address,
    /// owns nothing now.
    Removed(EndpointRecord),
}

/// Removes the endpoint a previous run left when it cannot be restored
/// under `cfg` (another namespace or interface name, another CIDR, an
/// address out of it): what its record proves is the agent's, under the
/// names it was made with, and nothing else. Only while its namespace is
/// there and proven: interface indexes start over at a reboot, so a link
/// proof alone (the namespace gone with the reboot) proves nothing.
fn retire(
    previous: Option<EndpointRecord>,
    cfg: &EndpointConfig,
) -> Result<Retired, EndpointError> {
    let Some(mut r) = previous else {
        return Ok(Retired::Kept(None));
    };
    let Some(owned) = r.owned.clone().filter(|o| *o != Owned::default()) else {
        return Ok(Retired::Kept(Some(r)));
    };
    let name_of = |l: Option<&ownership::LinkProof>, or: &str| {
        l.map_or_else(|| or.to_owned(), |l| l.name.clone())
    };
    let old = Plan {
        netns: Netns::named(&r.netns)?,
        netns_name: r.netns.clone(),
        host_iface: name_of(owned.host.as_ref(), &cfg.host_iface),
        ep_iface: name_of(owned.peer.as_ref(), &cfg.ep_iface),
        v4: None,
        v6: None,
    };
    let same_names = old.netns_name == cfg.netns_name
        && old.host_iface == cfg.host_iface
        && old.ep_iface == cfg.ep_iface;
    if same_names && matches_config(&r, cfg) {
        return Ok(Retired::Kept(Some(r)));
    }
    let netns = ownership::observe(&old)?.netns;
    let proven = netns.is_some()
        && ownership::judge(
            Record::Current(&owned),
            &ownership::Found {
                netns,
                ..ownership::Found::default()
            },
        )
        .is_ok();
    if proven {
        info!(
            netns = %r.netns,
            addresses = %r.addresses(),
            "the previous run's endpoint does not match the configuration: removing it"
        );
        for left in plumbing::remove(&old, &owned)? {
            warn!("not removed: {left}");
        }
    } else {
        info!(netns = %r.netns, "the previous run's endpoint is gone: nothing of it to remove");
    }
    r.owned = Some(Owned::default());
    r.save(&cfg.state_dir)?;
    Ok(Retired::Removed(r))
}

/// What of the objects under the endpoint's names the previous run's
/// record proves is the agent's (for a record of an earlier version, what
/// it adopts); the first one it does not prove is an error.
fn claim(plan: &Plan, previous: Option<&EndpointRecord>) -> Result<Owned, EndpointError> {
    let found = ownership::observe(plan)?;
    let addresses;
    let record = match previous.map(|r| (r, r.owned.as_ref())) {
        None => Record::None,
        Some((_, Some(owned))) => Record::Current(owned),
        Some((r, None)) => {
            // Only an earlier record of this very namespace can prove
            // anything.
            addresses = if r.netns == plan.netns_name {
                r.address_list()
            } else {
                Vec::new()
            };
            Record::Earlier(&addresses)
        }
    };
    let owned = ownership::judge(record, &found)?;
    if matches!(record, Record::Earlier(_)) && owned != Owned::default() {
        info!(
            netns = %plan.netns_name,
            "adopting the endpoint of an earlier version's record: its interface holds the \
             recorded addresses and is paired with the host interface"
        );
    }
    Ok(owned)
}

/// Saves `record`, keeping in `unsaved` what failed (a line for the log
/// and `/v1/healthz`), or `None`. A failure is logged when it begins or
/// changes, not at every retry.
fn save_noted(record: &EndpointRecord, state_dir: &std::path::Path, unsaved: &mut Option<String>) {
    let failed = record.save(state_dir).err().map(|e| chain(&e));
    if let Some(e) = failed.as_deref()
        && unsaved.as_deref() != Some(e)
    {
        warn!(
            "{e}: the endpoint runs on with its record in memory; saving again at each controller run"
        );
    }
    *unsaved = failed;
}

/// Records the object `ensure` just made, at once: in memory (what
/// proves it is the agent's from now on) and in the state directory. A
/// save that fails (a read-only state directory) does not fail the
/// repair: it is kept in `unsaved` and tried again.
fn record_made(
    plan: &Plan,
    record: &mut EndpointRecord,
    state_dir: &std::path::Path,
    unsaved: &mut Option<String>,
    made: Made,
) -> Result<(), EndpointError> {
    let found = ownership::observe(plan)?;
    let owned = record.owned.get_or_insert_with(Owned::default);
    match made {
        Made::Namespace => owned.netns = found.netns,
        Made::Veth => {
            owned.host = found.host.map(|h| h.link);
            owned.peer = found.peer.map(|p| p.link);
        }
    }
    save_noted(record, state_dir, unsaved);
    Ok(())
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
    boot: &ThisBoot,
) -> Result<EndpointRecord, EndpointError> {
    let ipv4 = cfg
        .cidr
        .map(|cidr| -> Result<_, EndpointError> {
            let in_use = node_addresses(cidr, &cfg.host_iface)?;
            Ok(allocate(cidr, &in_use, previous.and_then(|r| r.ipv4))?)
        })
        .transpose()?;
    let ipv6 = cfg
        .cidr6
        .map(|cidr| -> Result<_, EndpointError> {
            let in_use = node_addresses(cidr, &cfg.host_iface)?;
            Ok(allocate(cidr, &in_use, previous.and_then(|r| r.ipv6))?)
        })
        .transpose()?;
    Ok(EndpointRecord {
        id: previous.map_or_else(|| new_endpoint_id(&[]), |r| r.id),
        ipv4,
        cidr: cfg.cidr,
        ipv6,
        cidr6: cfg.cidr6,
        netns: cfg.netns_name.clone(),
        owned: Some(Owned::default()),
        boot: Some(boot.id.clone()),
    })
}

/// Addresses inside `cidr` already in use in this (the node's)
/// namespace: configured on an interface, or the destination of a host
/// route out of another interface than `host_iface` (someone else's:
/// the endpoint's own goes out of `host_iface`). Never handed to the
/// endpoint.
fn node_addresses<N: Pool>(cidr: N, host_iface: &str) -> Result<BTreeSet<N::Addr>, EndpointError> {
    let iface = host_iface.to_owned();
    let (addresses, routes, ours) = in_netns(None, |nl| async move {
        let ours = nl.link_index(&iface).await?;
        Ok((
            nl.addresses::<N::Addr>().await?,
            nl.routes::<N::Addr>().await?,
            ours,
        ))
    })?;
    let net: IpNet = cidr.into();
    let host = if net.addr().is_ipv4() { 32 } else { 128 };
    let elsewhere = routes
        .into_iter()
        .filter(|r| r.prefix == host && (ours.is_none() || r.oif != ours))
        .map(|r| r.destination);
    Ok(addresses
        .into_iter()
        .map(|(_, a, _)| a)
        .chain(elsewhere)
        .filter(|a| net.contains(&(*a).into()))
        .collect())
}

/// A regeneration that failed part-way is owed, whatever the plumbing
/// shows: the programs were detached before they were attached again
/// (`attached` false), or the endpoint was left short of ready. Without
/// this, the namespace's own kernel answering the echo passed every check
/// and the endpoint stayed without its programs, regenerating for ever.
fn owed_regeneration(missing: &mut Vec<Missing>, attached: bool, ready: bool) {
    if missing.is_empty() && !(attached && ready) {
        missing.push(Missing::Programs);
    }
}

/// The repairs the view counts so far: those of an endpoint task that ran
/// before in this process (none in a fresh view).
fn repairs_so_far(shared: &SharedView) -> u64 {
    shared
        .read()
        .ok()
        .and_then(|v| v.as_ref().map(|v| v.repairs))
        .unwrap_or(0)
}

/// A fresh shared view, empty until the endpoint publishes.
#[must_use]
pub fn shared_view() -> SharedView {
    Arc::new(RwLock::new(None))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regeneration_that_failed_part_way_is_owed() {
        for (attached, ready, owed) in [
            (true, true, false),
            (false, true, true),
            (true, false, true),
            (false, false, true),
        ] {
            let mut missing = Vec::new();
            owed_regeneration(&mut missing, attached, ready);
            assert_eq!(
                missing.contains(&Missing::Programs),
                owed,
                "{attached} {ready}"
            );
        }
        // Something else missing already: it is repaired, nothing added.
        let mut missing = vec![Missing::Address];
        owed_regeneration(&mut missing, false, false);
        assert_eq!(missing, [Missing::Address]);
    }

    /// An endpoint task started again within the process (the supervisor
    /// restarting it) counts on from the repairs its view shows.
    #[test]
    fn repairs_count_on_from_the_view() {
        let shared = shared_view();
        assert_eq!(repairs_so_far(&shared), 0);
        let view = EndpointView {
            id: 1,
            identity: record::HEALTH_IDENTITY,
            labels: Vec::new(),
            ipv4: None,
            ipv6: None,
            interface: "lxc_health".into(),
            netns: "health".into(),
            state: None,
            repairs: 3,
            history: Vec::new(),
        };
        *shared.write().expect("lock") = Some(view);
        assert_eq!(repairs_so_far(&shared), 3);
    }
}
