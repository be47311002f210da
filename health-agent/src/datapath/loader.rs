//! The kernel object: loaded once per user (the endpoint's programs, the
//! uplink's, a test), with its maps pinned and shared through the pins, and
//! its programs attached with tcx, classic tc (clsact + `cls_bpf`, see
//! [`classic`](super::classic)) or XDP.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
    sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use aya::{
    Ebpf, EbpfLoader,
    maps::Array,
    programs::{
        LinkOrder, ProgramError, SchedClassifier, TcAttachType, Xdp, XdpMode,
        tc::{SchedClassifierLinkId, TcAttach},
    },
};
use health_common::{
    ct::CtConfig,
    maps::{EchoConfig, MapId, MapSizes, PIN_LAYOUT_VERSION, ProgId, ProgKind},
    nat::NatConfig,
};
use tracing::{debug, info, warn};

use super::{
    AttachMode, DatapathError, EchoStats, Interface, carry, classic,
    kernel::{Attachment, TcHook},
    object::HEALTH_EBPF,
    pins, stats,
};
use crate::{sys::netlink::in_netns, util::errors::chain};

/// The loaded kernel object. Dropping it detaches every program it attached
/// (classic tc filters too, each in its interface's namespace, and a clsact
/// qdisc it created once empty); the pinned maps stay (their counters
/// survive restarts) until [`pins::remove_pins`](super::remove_pins).
pub struct Datapath {
    ebpf: Ebpf,
    pin_dir: PathBuf,
    attached: Vec<Attached>,
    /// Interfaces whose clsact qdisc this object created.
    clsact_created: Vec<Interface>,
    /// This object's key in [`ATTACHED`].
    owner: u64,
}

/// One program attached by a [`Datapath`].
struct Attached {
    program: ProgId,
    iface: Interface,
    how: How,
}

enum How {
    Tcx(TcAttachType),
    Tc {
        attach_type: TcAttachType,
        link: Option<SchedClassifierLinkId>,
    },
    Xdp(AttachMode),
}

impl Attached {
    fn report(&self) -> Attachment {
        let (attach, detail) = match &self.how {
            How::Tcx(t) => ("tcx".to_owned(), Some(direction_name(*t).to_owned())),
            How::Tc { attach_type, .. } => (
                "tc".to_owned(),
                Some(format!(
                    "{} pref {} handle {:#x} bpf direct-action",
                    direction_name(*attach_type),
                    classic::PRIORITY,
                    classic::handle(self.program)
                )),
            ),
            How::Xdp(mode) => (mode.to_string(), None),
        };
        Attachment {
            program: self.program.name().to_owned(),
            interface: self.iface.to_string(),
            attach,
            detail,
        }
    }
}

const fn direction_name(t: TcAttachType) -> &'static str {
    match t {
        TcAttachType::Ingress => "ingress",
        TcAttachType::Egress => "egress",
    }
}

/// Every program attached by this process, by owner: what `/v1/healthz`
/// shows.
static ATTACHED: Mutex<Vec<(u64, Attachment)>> = Mutex::new(Vec::new());
static OWNERS: AtomicU64 = AtomicU64::new(1);

/// Every program this process has attached now (`/v1/healthz`).
#[must_use]
pub fn attached_programs() -> Vec<Attachment> {
    ATTACHED
        .lock()
        .map(|a| a.iter().map(|(_, x)| x.clone()).collect())
        .unwrap_or_default()
}

impl Datapath {
    /// Loads the embedded object with its maps pinned under `pin_dir` and
    /// every program loaded, so a verifier rejection surfaces here with its
    /// log.
    pub fn load(pin_dir: &Path) -> Result<Self, DatapathError> {
        Self::load_programs(pin_dir, &ProgId::ALL)
    }

    /// Loads the object with its maps pinned under `pin_dir` and the
    /// `programs` loaded into the kernel (the others stay unloaded).
    ///
    /// Pins left by an earlier run are reused when their layout matches
    /// the registry; an incompatible pin is replaced (and said so), so an
    /// upgrade that changes a map never keeps the agent from starting. The
    /// layout version is recorded in [`MapId::PinLayout`].
    pub fn load_programs(pin_dir: &Path, programs: &[ProgId]) -> Result<Self, DatapathError> {
        Self::load_sized(pin_dir, programs, &MapSizes::DEFAULT)
    }

    /// [`Self::load_programs`] with the maps that grow with the cluster
    /// sized by `sizes`. Every user of one pin directory must pass the
    /// same sizes: a pinned map of another size is replaced (its entries
    /// carried over as far as they fit).
    pub fn load_sized(
        pin_dir: &Path,
        programs: &[ProgId],
        sizes: &MapSizes,
    ) -> Result<Self, DatapathError> {
        pins::ensure_pin_dir(pin_dir)?;
        pins::report_layout(pin_dir);
        let mut ebpf = load_object(pin_dir, sizes)?;
        for &id in programs {
            let loaded = match id.kind() {
                ProgKind::Xdp => program::<Xdp>(&mut ebpf, id)?.load(),
                ProgKind::SchedClassifier => program::<SchedClassifier>(&mut ebpf, id)?.load(),
            };
            loaded.map_err(|e| DatapathError::load(id, e))?;
        }
        let mut me = Self {
            ebpf,
            pin_dir: pin_dir.to_owned(),
            attached: Vec::new(),
            clsact_created: Vec::new(),
            owner: OWNERS.fetch_add(1, Ordering::Relaxed),
        };
        me.set_config(MapId::PinLayout, PIN_LAYOUT_VERSION)?;
        debug!(pin_dir = %pin_dir.display(), "loaded the health kernel object");
        Ok(me)
    }

    #[must_use]
    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }

    /// Makes the echo responder answer for `addr` on `iface`, as that
    /// interface's stack would: its MAC and its
    /// `drop_unicast_in_l2_multicast` setting are read now, from its
    /// namespace.
    /// IPv4 only: any IPv6 address set before is cleared.
    pub fn set_echo_target(
        &mut self,
        iface: &Interface,
        addr: Ipv4Addr,
    ) -> Result<(), DatapathError> {
        self.set_echo_targets(iface, Some(addr), None).map(|_| ())
    }

    /// Makes the echo responder answer for `addr` (ICMP) and `addr6`
    /// (`ICMPv6`) on `iface`, as [`Self::set_echo_target`] does; a family
    /// given no address is not answered (its packets go to the stack).
    /// The interface's addresses as they are now (its IPv6 link-local one
    /// included) are its own sources. Returns the configuration set.
    pub fn set_echo_targets(
        &mut self,
        iface: &Interface,
        addr: Option<Ipv4Addr>,
        addr6: Option<Ipv6Addr>,
    ) -> Result<EchoConfig, DatapathError> {
        let cfg = super::echo_target::read(iface, addr, addr6)?;
        self.set_echo_config(cfg)?;
        Ok(cfg)
    }

    /// Sets the echo responder's configuration as given (all zero: answer
    /// nothing).
    pub fn set_echo_config(&mut self, cfg: EchoConfig) -> Result<(), DatapathError> {
        self.set_config(MapId::EchoConfig, cfg)
    }

    /// Sets the connection-tracking lifetimes.
    pub fn set_ct_config(&mut self, cfg: CtConfig) -> Result<(), DatapathError> {
        self.set_config(MapId::CtConfig, cfg)
    }

    /// Sets (or, all zero, clears) the masquerade configuration.
    pub fn set_nat_config(&mut self, cfg: NatConfig) -> Result<(), DatapathError> {
        self.set_config(MapId::NatConfig, cfg)
    }

    fn set_config<T: aya::Pod>(&mut self, map: MapId, value: T) -> Result<(), DatapathError> {
        let err = |source| DatapathError::Map { map, source };
        let m = self
            .ebpf
            .map_mut(map.name())
            .ok_or(DatapathError::MissingMap { map })?;
        Array::<_, T>::try_from(m)
            .map_err(err)?
            .set(0, &value, 0)
            .map_err(err)
    }

    /// Attaches connection tracking and RTT to the host side of the
    /// endpoint's veth: tc ingress (from the endpoint) and egress (to it),
    /// on `hook`.
    pub fn attach_tracking(
        &mut self,
        host_iface: &Interface,
        hook: TcHook,
    ) -> Result<(), DatapathError> {
        self.attach_tc_programs(
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
    pub fn attach_nat(&mut self, uplink: &Interface, hook: TcHook) -> Result<(), DatapathError> {
        self.attach_tc_programs(
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

    fn attach_tc_programs(
        &mut self,
        iface: &Interface,
        programs: &[(ProgId, TcAttachType)],
        hook: TcHook,
    ) -> Result<(), DatapathError> {
        match hook {
            TcHook::Tcx => self.attach_tcx_programs(iface, programs),
            TcHook::Tc => self.attach_classic_programs(iface, programs),
        }
    }

    fn record(&mut self, a: Attached) {
        if let Ok(mut all) = ATTACHED.lock() {
            all.push((self.owner, a.report()));
        }
        self.attached.push(a);
    }

    /// Attaches each program to `iface` with a classic tc filter, in its
    /// direction (the clsact qdisc is added first if missing).
    fn attach_classic_programs(
        &mut self,
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
            let prog: &mut SchedClassifier = program(&mut self.ebpf, id)?;
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
    fn attach_tcx_programs(
        &mut self,
        iface: &Interface,
        programs: &[(ProgId, TcAttachType)],
    ) -> Result<(), DatapathError> {
        let name = iface.c_name()?;
        for &(id, attach_type) in programs {
            let prog: &mut SchedClassifier = program(&mut self.ebpf, id)?;
            let attach = || {
                prog.attach(
                    &name,
                    TcAttach::Tcx {
                        attach_type,
                        order: LinkOrder::default(),
                    },
                )
            };
            crate::sys::netns::run_in(iface.netns.as_ref(), attach)?
                .map_err(|e| DatapathError::attach(id, iface, AttachMode::Tcx, e))?;
            self.record(Attached {
                program: id,
                iface: iface.clone(),
                how: How::Tcx(attach_type),
            });
        }
        Ok(())
    }

    /// Attaches the echo responder to `iface` (ingress). In native XDP mode
    /// on a veth, the far end needs an XDP program for `XDP_TX` to be
    /// delivered: `xdp_peer` names it and gets an `XDP_PASS` program.
    pub fn attach_echo(
        &mut self,
        iface: &Interface,
        mode: AttachMode,
        xdp_peer: Option<&Interface>,
    ) -> Result<(), DatapathError> {
        match mode {
            AttachMode::Tcx => {
                self.attach_tcx_programs(iface, &[(ProgId::EchoTc, TcAttachType::Ingress)])?;
            }
            AttachMode::Tc => {
                self.attach_classic_programs(iface, &[(ProgId::EchoTc, TcAttachType::Ingress)])?;
            }
            AttachMode::XdpNative | AttachMode::XdpGeneric => {
                let xdp_mode = if mode == AttachMode::XdpNative {
                    XdpMode::Driver
                } else {
                    XdpMode::Skb
                };
                if let (AttachMode::XdpNative, Some(peer)) = (mode, xdp_peer) {
                    self.attach_xdp(ProgId::XdpPass, peer, XdpMode::Driver, mode)?;
                } else if mode == AttachMode::XdpNative {
                    warn!(
                        interface = %iface,
                        "native XDP without an XDP program on the veth peer: XDP_TX replies are \
                         dropped on veth; pass the peer to attach one"
                    );
                }
                self.attach_xdp(ProgId::EchoXdp, iface, xdp_mode, mode)?;
            }
        }
        info!(interface = %iface, %mode, "echo responder attached");
        Ok(())
    }

    fn attach_xdp(
        &mut self,
        id: ProgId,
        iface: &Interface,
        xdp_mode: XdpMode,
        mode: AttachMode,
    ) -> Result<(), DatapathError> {
        let name = iface.c_name()?;
        let prog: &mut Xdp = program(&mut self.ebpf, id)?;
        crate::sys::netns::run_in(iface.netns.as_ref(), || prog.attach(&name, xdp_mode))?
            .map_err(|e| DatapathError::attach(id, iface, mode, e))?;
        self.record(Attached {
            program: id,
            iface: iface.clone(),
            how: How::Xdp(mode),
        });
        Ok(())
    }

    /// Where this object's programs are attached and how, for logs and
    /// status.
    #[must_use]
    pub fn attachments(&self) -> Vec<Attachment> {
        self.attached.iter().map(Attached::report).collect()
    }

    /// The attached programs that are no longer where they were attached
    /// (a tcx link gone with its interface, a tc filter deleted or
    /// replaced by someone else, its qdisc removed), by name. XDP
    /// attachments are not checked here (the endpoint's echo check covers
    /// the responder).
    pub fn missing_attachments(&self) -> Result<Vec<String>, DatapathError> {
        let mut missing = Vec::new();
        for a in &self.attached {
            let prog_id = self
                .ebpf
                .program(a.program.name())
                .and_then(|p| match p {
                    aya::programs::Program::SchedClassifier(c) => c.info().ok(),
                    _ => None,
                })
                .map(|i| i.id());
            let present = match &a.how {
                How::Xdp(_) => true,
                How::Tcx(attach_type) => {
                    let name = a.iface.c_name()?;
                    let t = *attach_type;
                    crate::sys::netns::run_in(a.iface.netns.as_ref(), || {
                        SchedClassifier::query_tcx(name.as_c_str(), t)
                    })?
                    .is_ok_and(|(_, progs)| progs.iter().any(|p| Some(p.id()) == prog_id))
                }
                How::Tc { attach_type, .. } => {
                    let (iface, dir) = (a.iface.name.clone(), classic::direction(*attach_type));
                    let filters = in_netns(a.iface.netns.as_ref(), |nl| async move {
                        match nl.link_index(&iface).await? {
                            Some(_) => nl.tc_filters(&iface, dir).await,
                            None => Ok(Vec::new()),
                        }
                    })
                    .map_err(|e| DatapathError::TcFilters {
                        interface: a.iface.to_string(),
                        source: Box::new(e),
                    })?;
                    classic::present(&filters, a.program, prog_id)
                }
            };
            if !present {
                missing.push(format!("{} on {}", a.program.name(), a.iface));
            }
        }
        Ok(missing)
    }

    /// The echo responder's per-CPU counters, summed.
    pub fn echo_stats(&self) -> Result<EchoStats, DatapathError> {
        stats::read_from(&self.ebpf)
    }

    /// An XDP program of the object, for `BPF_PROG_TEST_RUN`.
    pub fn xdp(&mut self, id: ProgId) -> Result<&mut Xdp, DatapathError> {
        program(&mut self.ebpf, id)
    }

    /// A tc program of the object, for `BPF_PROG_TEST_RUN`.
    pub fn classifier(&mut self, id: ProgId) -> Result<&mut SchedClassifier, DatapathError> {
        program(&mut self.ebpf, id)
    }

    /// Forwards the kernel programs' aya-log records into `tracing` (through
    /// the `log` bridge) until the runtime stops.
    pub fn spawn_log_forwarder(&mut self) -> Result<tokio::task::JoinHandle<()>, DatapathError> {
        let logger = aya_log::EbpfLogger::init(&mut self.ebpf)
            .map_err(|e| DatapathError::Logger(e.to_string()))?;
        // SAFETY: the logger owns its ring buffer fd and keeps it open for as
        // long as the AsyncFd (which owns the logger) lives.
        let mut fd = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE)
        }
        .map_err(|e| DatapathError::Logger(e.to_string()))?;
        Ok(tokio::spawn(async move {
            loop {
                let Ok(mut guard) = fd.readable_mut().await else {
                    return;
                };
                guard.get_inner_mut().flush();
                guard.clear_ready();
            }
        }))
    }
}

impl Drop for Datapath {
    /// Detaches the classic tc filters in their interfaces' namespaces (a
    /// netlink request goes to the namespace of the thread that sends it;
    /// tcx and XDP links detach by closing their descriptors, wherever),
    /// then removes a clsact qdisc this object created once nothing is
    /// left under it.
    fn drop(&mut self) {
        if let Ok(mut all) = ATTACHED.lock() {
            all.retain(|(owner, _)| *owner != self.owner);
        }
        for a in &mut self.attached {
            let How::Tc { link, .. } = &mut a.how else {
                continue;
            };
            let Some(link) = link.take() else { continue };
            let Some(aya::programs::Program::SchedClassifier(prog)) =
                self.ebpf.program_mut(a.program.name())
            else {
                continue;
            };
            match crate::sys::netns::run_in(a.iface.netns.as_ref(), || prog.detach(link)) {
                Ok(Ok(())) => {
                    debug!(program = a.program.name(), interface = %a.iface, "tc filter removed");
                }
                // The interface (or its namespace) went first, and the
                // filter with it.
                Ok(Err(e)) => debug!(
                    program = a.program.name(),
                    interface = %a.iface,
                    "tc filter not removed (gone with its interface?): {e}"
                ),
                Err(e) => debug!(interface = %a.iface, "tc filter not removed: {}", chain(&e)),
            }
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

/// The object with its maps created or taken from the pins. A pin whose
/// layout differs is replaced, once per map at most, its entries carried
/// into the new map where their layout allows.
fn load_object(pin_dir: &Path, sizes: &MapSizes) -> Result<Ebpf, DatapathError> {
    let log_level = kernel_log_level();
    let mut replaced = Vec::new();
    let mut carried = Vec::new();
    loop {
        let mut loader = EbpfLoader::new();
        loader.default_map_pin_directory(pin_dir).override_global(
            aya_log::LEVEL,
            &log_level,
            false,
        );
        for id in MapId::ALL {
            if let Some(n) = sizes.max_entries(id) {
                loader.map_max_entries(id.name(), n);
            }
        }
        let err = match loader.load(HEALTH_EBPF) {
            Ok(mut ebpf) => {
                restore(&mut ebpf, carried);
                return Ok(ebpf);
            }
            Err(err) if replaced.len() < MapId::ALL.len() => err,
            Err(err) => return Err(object_error(pin_dir, err)),
        };
        if let aya::EbpfError::MapError(aya::maps::MapError::IncompatiblePinnedMap { name, .. }) =
            &err
            && let Some(id) = MapId::from_name(name)
        {
            match carry::save(pin_dir, id) {
                Ok(saved) => carried.push((id, saved)),
                Err(why) => info!(map = %name, "entries not carried over: {why}"),
            }
        }
        match pins::replace_incompatible(pin_dir, err) {
            Ok(name) if !replaced.contains(&name) => replaced.push(name),
            Ok(name) => {
                return Err(DatapathError::Unpin {
                    path: pin_dir.join(name),
                    source: std::io::Error::other("the pin came back after it was removed"),
                });
            }
            Err(err) => return Err(object_error(pin_dir, err)),
        }
    }
}

/// Writes the entries saved from replaced pins into their new maps.
fn restore(ebpf: &mut Ebpf, carried: Vec<(MapId, carry::Saved)>) {
    for (id, saved) in carried {
        match carry::restore(ebpf, id, saved) {
            Ok((kept, 0)) => info!(
                map = id.name(),
                kept, "entries carried over into the new map"
            ),
            Ok((kept, lost)) => warn!(
                map = id.name(),
                kept, lost, "entries carried over; the new map is smaller and some did not fit"
            ),
            Err(e) => warn!(map = id.name(), "entries not carried over: {e}"),
        }
    }
}

fn object_error(pin_dir: &Path, source: aya::EbpfError) -> DatapathError {
    DatapathError::Object {
        pin_dir: pin_dir.to_owned(),
        source: Box::new(source),
    }
}

fn program<'a, T>(ebpf: &'a mut Ebpf, id: ProgId) -> Result<&'a mut T, DatapathError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    let prog = ebpf
        .program_mut(id.name())
        .ok_or(DatapathError::MissingProgram { program: id })?;
    prog.try_into().map_err(|source| DatapathError::Program {
        program: id,
        source,
    })
}

/// The aya-log level compiled into the kernel programs: what `tracing`
/// would show, so filtered-out records cost nothing in the kernel.
fn kernel_log_level() -> u8 {
    use tracing::level_filters::LevelFilter;
    let level = match LevelFilter::current() {
        LevelFilter::OFF => return 0,
        LevelFilter::ERROR => aya_log::Level::Error,
        LevelFilter::WARN => aya_log::Level::Warn,
        LevelFilter::INFO => aya_log::Level::Info,
        LevelFilter::DEBUG => aya_log::Level::Debug,
        _ => aya_log::Level::Trace,
    };
    level as u8
}
