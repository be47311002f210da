//! The node's one kernel object and its one owner. [`DatapathOwner`] is
//! made once per agent: it loads the object (maps pinned, on first use),
//! writes its configuration and attaches its programs, and unloads it when
//! dropped. The node's datapath task and the endpoint's controller hold
//! [`DatapathHandle`]s: they read the maps through the pins and ask the
//! owner for configuration and attachments, never loading the object
//! themselves. What each attaches is an [`Attachments`] set of its own,
//! detached when the set is dropped; attaching again after an interface
//! was recreated is dropping the set and attaching a new one.

use std::{
    collections::BTreeMap,
    fmt,
    net::{Ipv4Addr, Ipv6Addr},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError, Weak},
};

use health_common::{
    ct::CtConfig,
    maps::{EchoConfig, MapSizes, ProgId},
    nat::NatConfig,
};

use super::{
    AttachMode, Datapath, DatapathError, Interface,
    kernel::{Attachment, TcHook},
    links::Links,
    missing::MissingAttachment,
};

/// Owns the node's kernel object for the agent's lifetime: dropping it
/// detaches every set still attached and unloads the object (the pins
/// stay).
pub struct DatapathOwner {
    shared: Arc<Mutex<Owned>>,
    pin_dir: PathBuf,
}

/// The object (once loaded) and every set of attachments made through it.
struct Owned {
    pin_dir: PathBuf,
    sizes: MapSizes,
    /// Loaded (verified) with the object, before a pin it replaced goes.
    programs: Vec<ProgId>,
    datapath: Option<Datapath>,
    sets: BTreeMap<u64, Links>,
    next_set: u64,
}

impl Drop for Owned {
    /// The sets first, each in its interfaces' namespaces, then the object.
    fn drop(&mut self) {
        if let Some(d) = &mut self.datapath {
            for links in self.sets.values_mut() {
                links.detach_all(d.ebpf_mut());
            }
        }
    }
}

impl DatapathOwner {
    /// The owner of the object whose maps are pinned under `pin_dir`, with
    /// the maps that grow with the cluster sized by `sizes`. Nothing is
    /// loaded until the first request.
    #[must_use]
    pub fn new(pin_dir: PathBuf, sizes: MapSizes) -> Self {
        Self {
            shared: Arc::new(Mutex::new(Owned {
                pin_dir: pin_dir.clone(),
                sizes,
                programs: Vec::new(),
                datapath: None,
                sets: BTreeMap::new(),
                next_set: 1,
            })),
            pin_dir,
        }
    }

    /// The same owner, loading `programs` with the object (the ones the
    /// agent's settings attach): the verifier's refusal of one then fails
    /// the load as a map the kernel refuses does, and every pin the load
    /// replaced comes back, rather than at the first attachment, after
    /// the old pins went. Any other program loads on first use.
    #[must_use]
    pub fn with_programs(self, programs: &[ProgId]) -> Self {
        if let Ok(mut owned) = self.shared.lock() {
            owned.programs = programs.to_vec();
        }
        self
    }

    /// A handle for a user of the object.
    #[must_use]
    pub fn handle(&self) -> DatapathHandle {
        DatapathHandle {
            shared: Arc::downgrade(&self.shared),
            pin_dir: self.pin_dir.clone(),
        }
    }
}

/// A user's way to the node's kernel object: its pins, its configuration,
/// and sets of attachments, all through the owner. Once the owner is gone
/// (the agent stopping), every request fails with
/// [`DatapathError::OwnerGone`].
#[derive(Clone)]
pub struct DatapathHandle {
    shared: Weak<Mutex<Owned>>,
    pin_dir: PathBuf,
}

impl fmt::Debug for DatapathHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatapathHandle")
            .field("pin_dir", &self.pin_dir)
            .field("owned", &(self.shared.strong_count() > 0))
            .finish()
    }
}

impl DatapathHandle {
    /// The bpffs directory of the pinned maps (read and maintained through
    /// the pins).
    #[must_use]
    pub fn pin_dir(&self) -> &Path {
        &self.pin_dir
    }

    /// Runs `f` on the object, loading it first if it is not yet (a
    /// failed load is tried again at the next request).
    fn with<T>(
        &self,
        f: impl FnOnce(&mut Datapath, &mut BTreeMap<u64, Links>) -> Result<T, DatapathError>,
    ) -> Result<T, DatapathError> {
        let shared = self.shared.upgrade().ok_or(DatapathError::OwnerGone)?;
        let mut owned = shared.lock().unwrap_or_else(PoisonError::into_inner);
        let Owned {
            pin_dir,
            sizes,
            programs,
            datapath,
            sets,
            ..
        } = &mut *owned;
        let datapath = match datapath {
            Some(d) => d,
            None => datapath.insert(Datapath::load_sized(pin_dir, programs, sizes)?),
        };
        f(datapath, sets)
    }

    /// Sets the connection-tracking lifetimes.
    pub fn set_ct_config(&self, cfg: CtConfig) -> Result<(), DatapathError> {
        self.with(|d, _| d.set_ct_config(cfg))
    }

    /// Pins again the maps whose pins are gone ([`Datapath::repin`]).
    pub fn repin(&self) -> Result<Vec<String>, DatapathError> {
        self.with(|d, _| d.repin())
    }

    /// Sets (or, all zero, clears) the masquerade configuration.
    pub fn set_nat_config(&self, cfg: NatConfig) -> Result<(), DatapathError> {
        self.with(|d, _| d.set_nat_config(cfg))
    }

    /// Makes the echo responder answer for `addr` and `addr6` on `iface`
    /// ([`Datapath::set_echo_targets`]); returns the configuration set.
    pub fn set_echo_targets(
        &self,
        iface: &Interface,
        addr: Option<Ipv4Addr>,
        addr6: Option<Ipv6Addr>,
    ) -> Result<EchoConfig, DatapathError> {
        self.with(|d, _| d.set_echo_targets(iface, addr, addr6))
    }

    /// A new, empty set of attachments.
    #[must_use]
    pub fn attachments(&self) -> Attachments {
        let set = self.shared.upgrade().map_or(0, |shared| {
            let mut owned = shared.lock().unwrap_or_else(PoisonError::into_inner);
            owned.next_set += 1;
            owned.next_set
        });
        Attachments {
            handle: self.clone(),
            set,
        }
    }
}

/// Programs one user attached through the owner: detached together when
/// the set is dropped.
#[derive(Debug)]
pub struct Attachments {
    handle: DatapathHandle,
    set: u64,
}

impl Attachments {
    fn with<T>(
        &self,
        f: impl FnOnce(&mut Datapath, &mut Links) -> Result<T, DatapathError>,
    ) -> Result<T, DatapathError> {
        self.handle
            .with(|d, sets| f(d, sets.entry(self.set).or_insert_with(Links::new)))
    }

    /// Attaches the echo responder to `iface` ([`Datapath::attach_echo`]).
    pub fn attach_echo(
        &self,
        iface: &Interface,
        mode: AttachMode,
        xdp_peer: Option<&Interface>,
    ) -> Result<(), DatapathError> {
        self.with(|d, links| links.attach_echo(d.ebpf_mut(), iface, mode, xdp_peer))
    }

    /// Attaches connection tracking and RTT to the host side of the
    /// endpoint's veth ([`Datapath::attach_tracking`]).
    pub fn attach_tracking(
        &self,
        host_iface: &Interface,
        hook: TcHook,
    ) -> Result<(), DatapathError> {
        self.with(|d, links| links.attach_tracking(d.ebpf_mut(), host_iface, hook))
    }

    /// Attaches masquerade to the node's uplink ([`Datapath::attach_nat`]).
    pub fn attach_nat(&self, uplink: &Interface, hook: TcHook) -> Result<(), DatapathError> {
        self.with(|d, links| links.attach_nat(d.ebpf_mut(), uplink, hook))
    }

    /// Attaches the encryption check's probe counter to the egress of
    /// `iface` (`tunnel`: the WireGuard device).
    pub fn attach_watch(
        &self,
        iface: &Interface,
        tunnel: bool,
        hook: TcHook,
    ) -> Result<(), DatapathError> {
        self.with(|d, links| links.attach_watch(d.ebpf_mut(), iface, tunnel, hook))
    }

    /// Where this set's programs are attached and how (nothing once the
    /// owner is gone).
    #[must_use]
    pub fn report(&self) -> Vec<Attachment> {
        self.with(|_, links| Ok(links.report())).unwrap_or_default()
    }

    /// This set's programs no longer where they were attached.
    pub fn missing(&self) -> Result<Vec<MissingAttachment>, DatapathError> {
        self.with(|d, links| links.missing(d.ebpf()))
    }
}

impl Drop for Attachments {
    fn drop(&mut self) {
        let Some(shared) = self.handle.shared.upgrade() else {
            // The owner went first, detaching everything.
            return;
        };
        let mut owned = shared.lock().unwrap_or_else(PoisonError::into_inner);
        let Owned { datapath, sets, .. } = &mut *owned;
        if let (Some(mut links), Some(d)) = (sets.remove(&self.set), datapath.as_mut()) {
            links.detach_all(d.ebpf_mut());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of this test's own, not on bpffs.
    fn not_bpffs(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("health-owner-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        dir
    }

    #[test]
    fn a_failed_load_is_the_requests_error_and_tried_again_at_the_next() {
        let dir = not_bpffs("load");
        let owner = DatapathOwner::new(dir.clone(), MapSizes::DEFAULT);
        let handle = owner.handle();
        for _ in 0..2 {
            let err = handle.set_ct_config(CtConfig::default());
            assert!(
                matches!(&err, Err(DatapathError::NotBpffs { path }) if *path == dir),
                "{err:?}"
            );
        }
        assert!(
            owner.shared.lock().expect("lock").datapath.is_none(),
            "nothing kept"
        );
        let _ = std::fs::remove_dir(&dir);
    }

    #[test]
    fn a_handle_outliving_its_owner_is_refused_and_its_set_drops_quietly() {
        let owner = DatapathOwner::new(not_bpffs("gone"), MapSizes::DEFAULT);
        let handle = owner.handle();
        let set = handle.attachments();
        drop(owner);
        assert!(matches!(
            handle.set_nat_config(NatConfig::default()),
            Err(DatapathError::OwnerGone)
        ));
        assert!(matches!(set.missing(), Err(DatapathError::OwnerGone)));
        assert_eq!(set.report(), Vec::<Attachment>::new());
        drop(set);
        let _ = std::fs::remove_dir(handle.pin_dir());
    }
}
