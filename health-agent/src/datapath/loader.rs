//! The kernel object: loaded with its maps pinned and shared through the
//! pins, its programs loaded into the kernel (each on first use at the
//! latest) and attached through [`Links`](super::links).

use std::{
    fs,
    net::{Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
};

use aya::{
    Ebpf, EbpfLoader,
    maps::Array,
    programs::{SchedClassifier, Xdp},
};
use health_common::{
    ct::CtConfig,
    maps::{EchoConfig, MapId, MapSizes, PIN_LAYOUT_VERSION, ProgId},
    nat::NatConfig,
};
use tracing::{debug, info, warn};

use super::{
    AttachMode, DatapathError, EchoStats, Interface, carry,
    kernel::{Attachment, TcHook},
    links::Links,
    missing::MissingAttachment,
    object::HEALTH_EBPF,
    pins,
    programs::{ensure_loaded, program},
    stats,
};

/// The loaded kernel object. Dropping it detaches every program it attached
/// (classic tc filters too, each in its interface's namespace, and a clsact
/// qdisc it created once empty); the pinned maps stay (their counters
/// survive restarts) until [`pins::remove_pins`](super::remove_pins).
pub struct Datapath {
    ebpf: Ebpf,
    pin_dir: PathBuf,
    /// What this object attached through its own methods.
    links: Links,
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
        pins::recover_aside(pin_dir);
        // A pin replaced for its size or layout waits aside until this
        // load is done: a failure after it (a map the kernel refuses, one
        // of `programs` the verifier does) pins the old map again, entries
        // and all. Programs loaded later, on first use, come after it.
        let mut replaced = pins::set_aside_other_layout(pin_dir);
        let loaded = Self::load_replacing(pin_dir, programs, sizes, &mut replaced);
        pins::settle_aside(pin_dir, &replaced, loaded.is_ok());
        loaded
    }

    /// [`Self::load_sized`]'s loads, the pins replaced named in `replaced`.
    fn load_replacing(
        pin_dir: &Path,
        programs: &[ProgId],
        sizes: &MapSizes,
        replaced: &mut Vec<String>,
    ) -> Result<Self, DatapathError> {
        let mut ebpf = load_object(pin_dir, sizes, replaced)?;
        for &id in programs {
            ensure_loaded(&mut ebpf, id)?;
        }
        let mut me = Self {
            ebpf,
            pin_dir: pin_dir.to_owned(),
            links: Links::new(),
        };
        me.set_config(MapId::PinLayout, PIN_LAYOUT_VERSION)?;
        debug!(pin_dir = %pin_dir.display(), "loaded the health kernel object");
        Ok(me)
    }

    #[must_use]
    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }

    /// Pins again every map of the object whose pin is gone (bpffs
    /// unmounted under the agent, a pin removed by hand): the maps live on
    /// in the kernel while the agent holds them, so nothing they hold is
    /// lost. A bpffs under `/sys/fs/bpf` is mounted again first. Returns
    /// the names pinned again; a pin that is there is left as it is.
    pub fn repin(&self) -> Result<Vec<String>, DatapathError> {
        let gone: Vec<&'static str> = MapId::ALL
            .iter()
            // aya-log's ring buffer is never pinned: its pin is not gone.
            .filter(|m| **m != MapId::AyaLogs)
            .map(|m| m.name())
            .filter(|name| fs::symlink_metadata(self.pin_dir.join(name)).is_err())
            .collect();
        if gone.is_empty() {
            return Ok(gone.into_iter().map(str::to_owned).collect());
        }
        pins::ensure_pin_dir(&self.pin_dir)?;
        let mut pinned = Vec::with_capacity(gone.len());
        for (name, map) in self.ebpf.maps() {
            if !gone.contains(&name) {
                continue;
            }
            let path = self.pin_dir.join(name);
            map.pin(&path).map_err(|source| DatapathError::Repin {
                name: name.to_owned(),
                path,
                source,
            })?;
            pinned.push(name.to_owned());
        }
        Ok(pinned)
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
        self.links.attach_tracking(&mut self.ebpf, host_iface, hook)
    }

    /// Attaches masquerade to the node's uplink: SNAT on tc egress, the
    /// reverse translation on tc ingress (before the stack sees a reply),
    /// on `hook`.
    pub fn attach_nat(&mut self, uplink: &Interface, hook: TcHook) -> Result<(), DatapathError> {
        self.links.attach_nat(&mut self.ebpf, uplink, hook)
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
        self.links
            .attach_echo(&mut self.ebpf, iface, mode, xdp_peer)
    }

    /// Where this object's programs are attached and how, for logs and
    /// status.
    #[must_use]
    pub fn attachments(&self) -> Vec<Attachment> {
        self.links.report()
    }

    /// The attached programs that are no longer where they were attached
    /// (a tcx link gone with its interface, a tc filter deleted or
    /// replaced by someone else, its qdisc removed). XDP attachments are
    /// not checked here (the endpoint's echo check covers the responder).
    pub fn missing_attachments(&self) -> Result<Vec<MissingAttachment>, DatapathError> {
        self.links.missing(&self.ebpf)
    }

    /// The object itself, for the sets of links its owner keeps
    /// ([`DatapathOwner`](super::DatapathOwner)).
    pub(super) fn ebpf_mut(&mut self) -> &mut Ebpf {
        &mut self.ebpf
    }

    pub(super) const fn ebpf(&self) -> &Ebpf {
        &self.ebpf
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
    /// Detaches what this object attached (see `Links::detach_all`); the
    /// programs and maps close with the object.
    fn drop(&mut self) {
        self.links.detach_all(&mut self.ebpf);
    }
}

/// The object with its maps created or taken from the pins. A pin whose
/// layout differs is replaced, once per map at most (set aside, named in
/// `replaced`), its entries carried into the new map where their layout
/// allows.
fn load_object(
    pin_dir: &Path,
    sizes: &MapSizes,
    replaced: &mut Vec<String>,
) -> Result<Ebpf, DatapathError> {
    let log_level = kernel_log_level();
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
