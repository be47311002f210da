//! Where programs of the kernel object are attached: one [`Links`] per
//! user of the object (the endpoint's programs, the uplink's, a test's),
//! each a tcx link, a classic tc filter (clsact + `cls_bpf`, see
//! [`classic`](super::classic)) or an XDP link, detached together in
//! their interfaces' namespaces; and which of them are no longer in place
//! ([`MissingAttachment`]).

use std::sync::{
    Mutex,
    atomic::{AtomicU64, Ordering},
};

use aya::{
    Ebpf,
    programs::{
        LinkOrder, SchedClassifier, TcAttachType, Xdp, XdpMode,
        tc::{SchedClassifierLinkId, TcAttach},
        xdp::XdpLinkId,
    },
};
use health_common::maps::ProgId;
use tracing::{debug, info, warn};

use super::{
    AttachMode, DatapathError, Interface, classic,
    kernel::{Attachment, TcHook},
    missing::{Hook, MissingAttachment, Why, direction_name},
    programs::loaded,
};
use crate::{sys::netlink::in_netns, util::errors::chain};

/// The programs one user of the object attached. [`Links::detach_all`]
/// (the object's owner calls it) takes them all off again, classic tc
/// filters in their interfaces' namespaces, and removes a clsact qdisc it
/// created once empty.
pub(super) struct Links {
    /// This set's key in [`ATTACHED`].
    id: u64,
    attached: Vec<Attached>,
    /// Interfaces whose clsact qdisc this set created.
    clsact_created: Vec<Interface>,
}

/// One program attached.
struct Attached {
    program: ProgId,
    iface: Interface,
    how: How,
}

enum How {
    Tcx {
        attach_type: TcAttachType,
        link: Option<SchedClassifierLinkId>,
    },
    Tc {
        attach_type: TcAttachType,
        link: Option<SchedClassifierLinkId>,
    },
    Xdp {
        mode: AttachMode,
        link: Option<XdpLinkId>,
    },
}

impl How {
    const fn hook(&self) -> Hook {
        match self {
            Self::Tcx { attach_type, .. } => Hook::Tcx(*attach_type),
            Self::Tc { attach_type, .. } => Hook::Tc(*attach_type),
            Self::Xdp { mode, .. } => Hook::Xdp(*mode),
        }
    }
}

impl Attached {
    fn report(&self) -> Attachment {
        let (attach, detail) = match &self.how {
            How::Tcx { attach_type, .. } => (
                "tcx".to_owned(),
                Some(direction_name(*attach_type).to_owned()),
            ),
            How::Tc { attach_type, .. } => (
                "tc".to_owned(),
                Some(format!(
                    "{} pref {} handle {:#x} bpf direct-action",
                    direction_name(*attach_type),
                    classic::PRIORITY,
                    classic::handle(self.program)
                )),
            ),
            How::Xdp { mode, .. } => (mode.to_string(), None),
        };
        Attachment {
            program: self.program.name().to_owned(),
            interface: self.iface.to_string(),
            attach,
            detail,
        }
    }
}

/// Every program attached by this process, by set: what `/v1/healthz`
/// shows.
static ATTACHED: Mutex<Vec<(u64, Attachment)>> = Mutex::new(Vec::new());
static SETS: AtomicU64 = AtomicU64::new(1);

/// Every program this process has attached now (`/v1/healthz`).
#[must_use]
pub fn attached_programs() -> Vec<Attachment> {
    ATTACHED
        .lock()
        .map(|a| a.iter().map(|(_, x)| x.clone()).collect())
        .unwrap_or_default()
}

impl Links {
    pub(super) fn new() -> Self {
        Self {
            id: SETS.fetch_add(1, Ordering::Relaxed),
            attached: Vec::new(),
            clsact_created: Vec::new(),
        }
    }

    fn record(&mut self, a: Attached) {
        if let Ok(mut all) = ATTACHED.lock() {
            all.push((self.id, a.report()));
        }
        self.attached.push(a);
    }

    /// Attaches connection tracking and RTT to the host side of the
    /// endpoint's veth: tc ingress (from the endpoint) and egress (to it),
    /// on `hook`.
    pub(super) fn attach_tracking(
        &mut self,
        ebpf: &mut Ebpf,
        host_iface: &Interface,
        hook: TcHook,
    ) -> Result<(), DatapathError> {
        self.attach_tc(
            ebpf,
            host_iface,
            &[
                (ProgId::LxcIngress, TcAttachType::Ingress),
                (ProgId::LxcEgress, TcAttachType::Egress),
            ],
            hook,
        )?;
        info!(interface = %host_iface, attach = %hook, "connection tracking and RTT attached");
        Ok(())
    }

    /// Attaches masquerade to the node's uplink: SNAT on tc egress, the
    /// reverse translation on tc ingress (before the stack sees a reply),
    /// on `hook`.
    pub(super) fn attach_nat(
        &mut self,
        ebpf: &mut Ebpf,
        uplink: &Interface,
        hook: TcHook,
    ) -> Result<(), DatapathError> {
        self.attach_tc(
            ebpf,
            uplink,
            &[
                (ProgId::NatIngress, TcAttachType::Ingress),
                (ProgId::NatEgress, TcAttachType::Egress),
            ],
            hook,
        )?;
        info!(interface = %uplink, attach = %hook, "masquerade attached");
        Ok(())
    }

    /// Attaches the encryption check's counter to the egress of `iface`:
    /// the tunnel's program on the WireGuard device (`tunnel`), the plain
    /// one on any other interface, on `hook`.
    pub(super) fn attach_watch(
        &mut self,
        ebpf: &mut Ebpf,
        iface: &Interface,
        tunnel: bool,
        hook: TcHook,
    ) -> Result<(), DatapathError> {
        let program = if tunnel {
            ProgId::TunnelEgress
        } else {
            ProgId::PlainEgress
        };
        self.attach_tc(ebpf, iface, &[(program, TcAttachType::Egress)], hook)?;
        debug!(interface = %iface, attach = %hook, program = program.name(), "probe counter attached");
        Ok(())
    }

    /// Attaches each program to `iface` on `hook`, in its direction.
    fn attach_tc(
        &mut self,
        ebpf: &mut Ebpf,
        iface: &Interface,
        programs: &[(ProgId, TcAttachType)],
        hook: TcHook,
    ) -> Result<(), DatapathError> {
        match hook {
            TcHook::Tcx => self.attach_tcx(ebpf, iface, programs),
            TcHook::Tc => self.attach_classic(ebpf, iface, programs),
        }
    }

    /// Attaches each program to `iface` with a classic tc filter, in its
    /// direction (the clsact qdisc is added first if missing).
    fn attach_classic(
        &mut self,
        ebpf: &mut Ebpf,
        iface: &Interface,
        programs: &[(ProgId, TcAttachType)],
    ) -> Result<(), DatapathError> {
        let name = iface.c_name()?;
        let created =
            crate::sys::netns::run_in(iface.netns.as_ref(), || classic::ensure_clsact(&name))?
                .map_err(|e| DatapathError::attach(programs[0].0, iface, AttachMode::Tc, e))?;
        if created && !self.clsact_created.contains(iface) {
            debug!(interface = %iface, "clsact qdisc added");
            self.clsact_created.push(iface.clone());
        }
        for &(id, attach_type) in programs {
            let prog: &mut SchedClassifier = loaded(ebpf, id)?;
            let attached = crate::sys::netns::run_in(iface.netns.as_ref(), || {
                classic::attach(prog, id, &name, attach_type)
            })?
            .map_err(|e| DatapathError::attach(id, iface, AttachMode::Tc, e))?;
            if attached.replaced {
                info!(
                    program = id.name(),
                    interface = %iface,
                    "replaced the tc filter a previous agent left at our slot"
                );
            }
            self.record(Attached {
                program: id,
                iface: iface.clone(),
                how: How::Tc {
                    attach_type,
                    link: Some(attached.link),
                },
            });
        }
        Ok(())
    }

    /// Attaches each program to `iface` with tcx, in its direction.
    fn attach_tcx(
        &mut self,
        ebpf: &mut Ebpf,
        iface: &Interface,
        programs: &[(ProgId, TcAttachType)],
    ) -> Result<(), DatapathError> {
        let name = iface.c_name()?;
        remove_classic_left(iface, programs);
        for &(id, attach_type) in programs {
            let prog: &mut SchedClassifier = loaded(ebpf, id)?;
            let attach = || {
                prog.attach(
                    &name,
                    TcAttach::Tcx {
                        attach_type,
                        order: LinkOrder::default(),
                    },
                )
            };
            let link = crate::sys::netns::run_in(iface.netns.as_ref(), attach)?
                .map_err(|e| DatapathError::attach(id, iface, AttachMode::Tcx, e))?;
            self.record(Attached {
                program: id,
                iface: iface.clone(),
                how: How::Tcx {
                    attach_type,
                    link: Some(link),
                },
            });
        }
        Ok(())
    }

    /// Attaches the echo responder to `iface` (ingress). In native XDP mode
    /// on a veth, the far end needs an XDP program for `XDP_TX` to be
    /// delivered: `xdp_peer` names it and gets an `XDP_PASS` program.
    pub(super) fn attach_echo(
        &mut self,
        ebpf: &mut Ebpf,
        iface: &Interface,
        mode: AttachMode,
        xdp_peer: Option<&Interface>,
    ) -> Result<(), DatapathError> {
        let echo = [(ProgId::EchoTc, TcAttachType::Ingress)];
        match mode {
            AttachMode::Tcx => self.attach_tcx(ebpf, iface, &echo)?,
            AttachMode::Tc => self.attach_classic(ebpf, iface, &echo)?,
            AttachMode::XdpNative | AttachMode::XdpGeneric => {
                let xdp_mode = if mode == AttachMode::XdpNative {
                    XdpMode::Driver
                } else {
                    XdpMode::Skb
                };
                if let (AttachMode::XdpNative, Some(peer)) = (mode, xdp_peer) {
                    self.attach_xdp(ebpf, ProgId::XdpPass, peer, XdpMode::Driver, mode)?;
                } else if mode == AttachMode::XdpNative {
                    warn!(
                        interface = %iface,
                        "native XDP without an XDP program on the veth peer: XDP_TX replies are \
                         dropped on veth; pass the peer to attach one"
                    );
                }
                self.attach_xdp(ebpf, ProgId::EchoXdp, iface, xdp_mode, mode)?;
            }
        }
        info!(interface = %iface, %mode, "echo responder attached");
        Ok(())
    }

    fn attach_xdp(
        &mut self,
        ebpf: &mut Ebpf,
        id: ProgId,
        iface: &Interface,
        xdp_mode: XdpMode,
        mode: AttachMode,
    ) -> Result<(), DatapathError> {
        let name = iface.c_name()?;
        let prog: &mut Xdp = loaded(ebpf, id)?;
        let link =
            crate::sys::netns::run_in(iface.netns.as_ref(), || prog.attach(&name, xdp_mode))?
                .map_err(|e| DatapathError::attach(id, iface, mode, e))?;
        self.record(Attached {
            program: id,
            iface: iface.clone(),
            how: How::Xdp {
                mode,
                link: Some(link),
            },
        });
        Ok(())
    }

    /// Where this set's programs are attached and how, for logs and
    /// status.
    pub(super) fn report(&self) -> Vec<Attachment> {
        self.attached.iter().map(Attached::report).collect()
    }

    /// The attached programs that are no longer where they were attached
    /// (a tcx link gone with its interface, a tc filter deleted or
    /// replaced by someone else, its qdisc removed). XDP attachments are
    /// not checked here (the endpoint's echo check covers the responder).
    pub(super) fn missing(&self, ebpf: &Ebpf) -> Result<Vec<MissingAttachment>, DatapathError> {
        let mut missing = Vec::new();
        for a in &self.attached {
            let prog_id = ebpf
                .program(a.program.name())
                .and_then(|p| match p {
                    aya::programs::Program::SchedClassifier(c) => c.info().ok(),
                    _ => None,
                })
                .map(|i| i.id());
            let why = match &a.how {
                How::Xdp { .. } => None,
                How::Tcx { attach_type, .. } => {
                    let name = a.iface.c_name()?;
                    let t = *attach_type;
                    match crate::sys::netns::run_in(a.iface.netns.as_ref(), || {
                        SchedClassifier::query_tcx(name.as_c_str(), t)
                    })? {
                        Err(_) => Some(Why::InterfaceGone),
                        Ok((_, progs)) if progs.iter().any(|p| Some(p.id()) == prog_id) => None,
                        Ok(_) => Some(Why::LinkGone),
                    }
                }
                How::Tc { attach_type, .. } => {
                    let (iface, dir) = (a.iface.name.clone(), classic::direction(*attach_type));
                    let filters = in_netns(a.iface.netns.as_ref(), |nl| async move {
                        match nl.link_index(&iface).await? {
                            Some(_) => nl.tc_filters(&iface, dir).await.map(Some),
                            None => Ok(None),
                        }
                    })
                    .map_err(|e| DatapathError::TcFilters {
                        interface: a.iface.to_string(),
                        source: Box::new(e),
                    })?;
                    match filters {
                        None => Some(Why::InterfaceGone),
                        Some(f) => classic::slot(&f, a.program, prog_id),
                    }
                }
            };
            if let Some(why) = why {
                missing.push(MissingAttachment {
                    program: a.program,
                    interface: a.iface.clone(),
                    hook: a.how.hook(),
                    why,
                });
            }
        }
        Ok(missing)
    }

    /// Detaches every program of the set: classic tc filters in their
    /// interfaces' namespaces (a netlink request goes to the namespace of
    /// the thread that sends it), tcx and XDP links by closing their
    /// descriptors, wherever; then removes a clsact qdisc the set created
    /// once nothing is left under it.
    pub(super) fn detach_all(&mut self, ebpf: &mut Ebpf) {
        if let Ok(mut all) = ATTACHED.lock() {
            all.retain(|(set, _)| *set != self.id);
        }
        for mut a in self.attached.drain(..) {
            detach(ebpf, &mut a);
        }
        for iface in self.clsact_created.drain(..) {
            let name = iface.name.clone();
            let removed = in_netns(iface.netns.as_ref(), |nl| async move {
                classic::remove_clsact_if_empty(&nl, &name).await
            });
            match removed {
                Ok(true) => debug!(interface = %iface, "clsact qdisc removed"),
                Ok(false) => {}
                Err(e) => debug!(interface = %iface, "clsact qdisc not removed: {}", chain(&e)),
            }
        }
    }
}

/// Removes the classic tc filters at the slots of `programs` on `iface`:
/// those an agent run with `--attach tc` left when it was killed (an
/// orderly stop removes its own). Attached with tcx, the programs would
/// otherwise run twice: tracked twice, masqueraded twice. Only the
/// agent's own slots are looked at ([`classic::PRIORITY`] and its
/// handles); a failure is logged and the attach goes on.
fn remove_classic_left(iface: &Interface, programs: &[(ProgId, TcAttachType)]) {
    let Ok(name) = iface.c_name() else { return };
    let dev = iface.name.clone();
    let directions = [TcAttachType::Ingress, TcAttachType::Egress];
    let listed = in_netns(iface.netns.as_ref(), |nl| async move {
        let mut by_dir = Vec::with_capacity(2);
        for dir in directions {
            by_dir.push(nl.tc_filters(&dev, classic::direction(dir)).await?);
        }
        Ok(by_dir)
    });
    let listed = match listed {
        Ok(l) => l,
        Err(e) => {
            debug!(interface = %iface, "tc filters not listed: {}", chain(&e));
            return;
        }
    };
    for &(id, attach_type) in programs {
        let filters = &listed[usize::from(attach_type == TcAttachType::Egress)];
        if !classic::at_slot(filters, id) {
            continue;
        }
        let removed = crate::sys::netns::run_in(iface.netns.as_ref(), || {
            classic::remove_left(&name, id, attach_type)
        });
        match removed {
            Ok(Ok(())) => info!(
                program = id.name(),
                interface = %iface,
                "removed the tc filter a previous agent left at our slot (now attached with tcx)"
            ),
            Ok(Err(e)) => warn!(
                program = id.name(),
                interface = %iface,
                "the tc filter a previous agent left at our slot is not removed: {}",
                chain(&e)
            ),
            Err(e) => warn!(interface = %iface, "tc filter not removed: {}", chain(&e)),
        }
    }
}

fn detach(ebpf: &mut Ebpf, a: &mut Attached) {
    let Some(prog) = ebpf.program_mut(a.program.name()) else {
        return;
    };
    let (program, iface) = (a.program.name(), &a.iface);
    match (&mut a.how, prog) {
        (How::Tcx { link, .. }, aya::programs::Program::SchedClassifier(prog)) => {
            if let Some(link) = link.take()
                && let Err(e) = prog.detach(link)
            {
                debug!(program, interface = %iface, "tcx link not detached: {e}");
            }
        }
        (How::Xdp { link, .. }, aya::programs::Program::Xdp(prog)) => {
            if let Some(link) = link.take()
                && let Err(e) = prog.detach(link)
            {
                debug!(program, interface = %iface, "XDP link not detached: {e}");
            }
        }
        (How::Tc { link, .. }, aya::programs::Program::SchedClassifier(prog)) => {
            let Some(id) = link.take() else { return };
            let Ok(filter) = prog.take_link(id) else {
                return;
            };
            // Taken out of the program, detached in its namespace; if that
            // namespace is gone, so is the filter, and the link is
            // forgotten, never detached from another namespace.
            let mut held = Some(filter);
            let detached = crate::sys::netns::run_in(iface.netns.as_ref(), || {
                held.take().map(aya::programs::Link::detach)
            });
            match detached {
                Ok(Some(Ok(()))) => debug!(program, interface = %iface, "tc filter removed"),
                // The interface went first, and the filter with it.
                Ok(Some(Err(e))) => debug!(
                    program,
                    interface = %iface,
                    "tc filter not removed (gone with its interface?): {e}"
                ),
                Ok(None) => {}
                Err(e) => debug!(interface = %iface, "tc filter not removed: {}", chain(&e)),
            }
            if let Some(stale) = held {
                std::mem::forget(stale);
            }
        }
        _ => {}
    }
}
