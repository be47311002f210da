//! The ICMP echo responder: loads the kernel object with its maps pinned,
//! configures the endpoint address, attaches in the chosen mode, and reads
//! the per-CPU counters.

mod error;
mod mode;
mod pins;
mod stats;

use std::{
    fmt,
    net::Ipv4Addr,
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::Array,
    programs::{
        LinkOrder, ProgramError, SchedClassifier, TcAttachType, Xdp, XdpMode, tc::TcAttach,
    },
};
use health_common::{
    ct::CtConfig,
    maps::{
        CT_CONFIG, ECHO_CONFIG, EchoConfig, NAT_CONFIG, PROG_ECHO_TC, PROG_ECHO_XDP,
        PROG_LXC_EGRESS, PROG_LXC_INGRESS, PROG_NAT_EGRESS, PROG_NAT_INGRESS, PROG_XDP_PASS,
    },
    nat::NatConfig,
};
use tracing::{debug, info, warn};

pub use self::{
    error::ResponderError,
    mode::AttachMode,
    pins::{BPFFS_ROOT, DEFAULT_PIN_DIR, ensure_pin_dir, remove_pins},
    stats::{EchoStats, read_pinned_stats},
};
use crate::{netns::Netns, object::HEALTH_EBPF};

/// An interface, optionally in another network namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub netns: Option<Netns>,
}

impl Interface {
    #[must_use]
    pub fn new(name: impl Into<String>, netns: Option<Netns>) -> Self {
        Self {
            name: name.into(),
            netns,
        }
    }

    fn c_name(&self) -> Result<std::ffi::CString, ResponderError> {
        std::ffi::CString::new(self.name.clone()).map_err(|_| ResponderError::BadInterfaceName {
            name: self.name.clone(),
        })
    }
}

impl fmt::Display for Interface {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.netns {
            Some(ns) => write!(f, "{} (netns {})", self.name, ns.path().display()),
            None => f.write_str(&self.name),
        }
    }
}

/// The loaded kernel object. Dropping it detaches every program it attached;
/// the pinned maps stay (their counters survive restarts) until
/// [`remove_pins`].
pub struct Responder {
    ebpf: Ebpf,
    pin_dir: PathBuf,
    attached: Vec<String>,
}

impl Responder {
    /// Loads the embedded object with its maps pinned under `pin_dir`
    /// (reusing pins left by an earlier run) and loads every program, so a
    /// verifier rejection surfaces here with its log.
    pub fn load(pin_dir: &Path) -> Result<Self, ResponderError> {
        ensure_pin_dir(pin_dir)?;
        let log_level = kernel_log_level();
        let mut ebpf = EbpfLoader::new()
            .default_map_pin_directory(pin_dir)
            .override_global(aya_log::LEVEL, &log_level, false)
            .load(HEALTH_EBPF)
            .map_err(|source| ResponderError::Object {
                pin_dir: pin_dir.to_owned(),
                source: Box::new(source),
            })?;
        for name in [PROG_ECHO_XDP, PROG_XDP_PASS] {
            let prog: &mut Xdp = program(&mut ebpf, name)?;
            prog.load().map_err(|e| ResponderError::load(name, e))?;
        }
        for name in [
            PROG_ECHO_TC,
            PROG_LXC_INGRESS,
            PROG_LXC_EGRESS,
            PROG_NAT_EGRESS,
            PROG_NAT_INGRESS,
        ] {
            let tc: &mut SchedClassifier = program(&mut ebpf, name)?;
            tc.load().map_err(|e| ResponderError::load(name, e))?;
        }
        debug!(pin_dir = %pin_dir.display(), "loaded the health kernel object");
        Ok(Self {
            ebpf,
            pin_dir: pin_dir.to_owned(),
            attached: Vec::new(),
        })
    }

    #[must_use]
    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }

    /// Sets the address the responder answers for (`0.0.0.0`: none).
    pub fn set_address(&mut self, addr: Ipv4Addr) -> Result<(), ResponderError> {
        self.set_config(
            ECHO_CONFIG,
            EchoConfig {
                addr: addr.octets(),
            },
        )
    }

    /// Sets the connection-tracking lifetimes.
    pub fn set_ct_config(&mut self, cfg: CtConfig) -> Result<(), ResponderError> {
        self.set_config(CT_CONFIG, cfg)
    }

    /// Sets (or, all zero, clears) the masquerade configuration.
    pub fn set_nat_config(&mut self, cfg: NatConfig) -> Result<(), ResponderError> {
        self.set_config(NAT_CONFIG, cfg)
    }

    fn set_config<T: aya::Pod>(
        &mut self,
        name: &'static str,
        value: T,
    ) -> Result<(), ResponderError> {
        let err = |source| ResponderError::Map { map: name, source };
        let map = self
            .ebpf
            .map_mut(name)
            .ok_or(ResponderError::MissingMap { map: name })?;
        Array::<_, T>::try_from(map)
            .map_err(err)?
            .set(0, &value, 0)
            .map_err(err)
    }

    /// Attaches connection tracking and RTT to the host side of the
    /// endpoint's veth: tcx ingress (from the endpoint) and egress (to it).
    pub fn attach_tracking(&mut self, host_iface: &Interface) -> Result<(), ResponderError> {
        self.attach_tcx_programs(
            host_iface,
            &[
                (PROG_LXC_INGRESS, TcAttachType::Ingress),
                (PROG_LXC_EGRESS, TcAttachType::Egress),
            ],
        )?;
        info!(interface = %host_iface, "connection tracking and RTT attached");
        Ok(())
    }

    /// Attaches masquerade to the node's uplink: SNAT on tcx egress, the
    /// reverse translation on tcx ingress (before the stack sees a reply).
    pub fn attach_nat(&mut self, uplink: &Interface) -> Result<(), ResponderError> {
        self.attach_tcx_programs(
            uplink,
            &[
                (PROG_NAT_INGRESS, TcAttachType::Ingress),
                (PROG_NAT_EGRESS, TcAttachType::Egress),
            ],
        )?;
        info!(interface = %uplink, "masquerade attached");
        Ok(())
    }

    /// Attaches each program to `iface` with tcx, in its direction.
    fn attach_tcx_programs(
        &mut self,
        iface: &Interface,
        programs: &[(&'static str, TcAttachType)],
    ) -> Result<(), ResponderError> {
        let name = iface.c_name()?;
        for &(program_name, attach_type) in programs {
            let prog: &mut SchedClassifier = program(&mut self.ebpf, program_name)?;
            let attach = || {
                prog.attach(
                    &name,
                    TcAttach::Tcx {
                        attach_type,
                        order: LinkOrder::default(),
                    },
                )
            };
            crate::netns::run_in(iface.netns.as_ref(), attach)?
                .map_err(|e| ResponderError::attach(program_name, iface, AttachMode::Tcx, e))?;
            self.attached.push(format!("{program_name} on {iface}"));
        }
        Ok(())
    }

    /// Attaches the responder to `iface` (ingress). In native XDP mode on a
    /// veth, the far end needs an XDP program for `XDP_TX` to be delivered:
    /// `xdp_peer` names it and gets an `XDP_PASS` program.
    pub fn attach(
        &mut self,
        iface: &Interface,
        mode: AttachMode,
        xdp_peer: Option<&Interface>,
    ) -> Result<(), ResponderError> {
        match mode {
            AttachMode::Tcx => {
                self.attach_tcx_programs(iface, &[(PROG_ECHO_TC, TcAttachType::Ingress)])?;
            }
            AttachMode::XdpNative | AttachMode::XdpGeneric => {
                let xdp_mode = if mode == AttachMode::XdpNative {
                    XdpMode::Driver
                } else {
                    XdpMode::Skb
                };
                if let (AttachMode::XdpNative, Some(peer)) = (mode, xdp_peer) {
                    self.attach_xdp(PROG_XDP_PASS, peer, XdpMode::Driver, mode)?;
                } else if mode == AttachMode::XdpNative {
                    warn!(
                        interface = %iface,
                        "native XDP without an XDP program on the veth peer: XDP_TX replies are \
                         dropped on veth; pass the peer to attach one"
                    );
                }
                self.attach_xdp(PROG_ECHO_XDP, iface, xdp_mode, mode)?;
            }
        }
        info!(interface = %iface, %mode, "echo responder attached");
        Ok(())
    }

    fn attach_xdp(
        &mut self,
        program_name: &'static str,
        iface: &Interface,
        xdp_mode: XdpMode,
        mode: AttachMode,
    ) -> Result<(), ResponderError> {
        let name = iface.c_name()?;
        let prog: &mut Xdp = program(&mut self.ebpf, program_name)?;
        crate::netns::run_in(iface.netns.as_ref(), || prog.attach(&name, xdp_mode))?
            .map_err(|e| ResponderError::attach(program_name, iface, mode, e))?;
        self.attached.push(format!("{program_name} on {iface}"));
        Ok(())
    }

    /// Where the responder is attached, for logs and status.
    #[must_use]
    pub fn attachments(&self) -> &[String] {
        &self.attached
    }

    /// The per-CPU counters, summed.
    pub fn stats(&self) -> Result<EchoStats, ResponderError> {
        stats::read_from(&self.ebpf)
    }

    /// The XDP responder, for `BPF_PROG_TEST_RUN`.
    pub fn xdp_program(&mut self) -> Result<&mut Xdp, ResponderError> {
        program(&mut self.ebpf, PROG_ECHO_XDP)
    }

    /// A tracking program (`from_endpoint`: the ingress one), for `BPF_PROG_TEST_RUN`.
    pub fn tracking_program(
        &mut self,
        from_endpoint: bool,
    ) -> Result<&mut SchedClassifier, ResponderError> {
        program(
            &mut self.ebpf,
            if from_endpoint {
                PROG_LXC_INGRESS
            } else {
                PROG_LXC_EGRESS
            },
        )
    }

    /// A masquerade program (`egress`: the SNAT one), for `BPF_PROG_TEST_RUN`.
    pub fn nat_program(&mut self, egress: bool) -> Result<&mut SchedClassifier, ResponderError> {
        program(
            &mut self.ebpf,
            if egress {
                PROG_NAT_EGRESS
            } else {
                PROG_NAT_INGRESS
            },
        )
    }

    /// The tc responder, for `BPF_PROG_TEST_RUN`.
    pub fn tc_program(&mut self) -> Result<&mut SchedClassifier, ResponderError> {
        program(&mut self.ebpf, PROG_ECHO_TC)
    }

    /// Forwards the kernel programs' aya-log records into `tracing` (through
    /// the `log` bridge) until the runtime stops.
    pub fn spawn_log_forwarder(&mut self) -> Result<tokio::task::JoinHandle<()>, ResponderError> {
        let logger = aya_log::EbpfLogger::init(&mut self.ebpf)
            .map_err(|e| ResponderError::Logger(e.to_string()))?;
        // SAFETY: the logger owns its ring buffer fd and keeps it open for as
        // long as the AsyncFd (which owns the logger) lives.
        let mut fd = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE)
        }
        .map_err(|e| ResponderError::Logger(e.to_string()))?;
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

fn program<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T, ResponderError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    let prog = ebpf
        .program_mut(name)
        .ok_or(ResponderError::MissingProgram { program: name })?;
    prog.try_into().map_err(|source| ResponderError::Program {
        program: name,
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
