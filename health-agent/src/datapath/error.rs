//! The one error type of the datapath: loading (with the verifier's log),
//! pinning, attaching and map access.

use std::{io, path::PathBuf};

use aya::programs::ProgramError;
use health_common::maps::{MapId, ProgId};

use super::{AttachMode, Interface};
use crate::sys::netns::NetnsError;

#[derive(Debug, thiserror::Error)]
pub enum DatapathError {
    #[error("bpffs directory {path}")]
    PinDir { path: PathBuf, source: io::Error },
    #[error("{path} is not on a bpf filesystem (mount one with `mount -t bpf bpf /sys/fs/bpf`)")]
    NotBpffs { path: PathBuf },
    #[error("loading the health kernel object (maps pinned under {pin_dir})")]
    Object {
        pin_dir: PathBuf,
        source: Box<aya::EbpfError>,
    },
    #[error("program {} is missing from the kernel object", program.name())]
    MissingProgram { program: ProgId },
    #[error("map {} is missing from the kernel object", map.name())]
    MissingMap { map: MapId },
    #[error("program {}", program.name())]
    Program {
        program: ProgId,
        source: ProgramError,
    },
    #[error("the verifier rejected program {}; verifier log:\n{log}", program.name())]
    Verifier {
        program: ProgId,
        source: io::Error,
        log: String,
    },
    #[error("attaching {} to {interface} in {mode} mode", program.name())]
    Attach {
        program: ProgId,
        interface: String,
        mode: AttachMode,
        source: ProgramError,
    },
    #[error("interface name {name:?} contains a NUL byte")]
    BadInterfaceName { name: String },
    #[error("map {}", map.name())]
    Map {
        map: MapId,
        source: aya::maps::MapError,
    },
    #[error("map {}: {op} (bpf syscall)", map.name())]
    MapBatch {
        map: MapId,
        op: &'static str,
        source: io::Error,
    },
    #[error("pinned map {path} (is the agent's --bpffs-dir right?)")]
    Pinned {
        path: PathBuf,
        source: aya::maps::MapError,
    },
    #[error("pinning map {name} again at {path}")]
    Repin {
        name: String,
        path: PathBuf,
        source: aya::pin::PinError,
    },
    #[error("replacing the incompatible pinned map {path}")]
    Unpin { path: PathBuf, source: io::Error },
    #[error("map {} has no decoder (it holds no entries to show)", map.name())]
    NoDecoder { map: MapId },
    #[error("encoding map {} as JSON: {detail}", map.name())]
    Encode { map: MapId, detail: String },
    #[error("forwarding kernel logs: {0}")]
    Logger(String),
    #[error("listing the tc filters of {interface}")]
    TcFilters {
        interface: String,
        source: Box<crate::sys::netlink::NetlinkError>,
    },
    #[error(transparent)]
    Kernel(#[from] super::kernel::KernelError),
    #[error("the node's kernel object is no longer loaded (the agent is stopping)")]
    OwnerGone,
    #[error("datapath work panicked: {0}")]
    Panicked(String),
    #[error("reading the monotonic clock")]
    Clock(#[source] nix::Error),
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("reading the MAC address of {interface}")]
    LinkAddress {
        interface: String,
        source: Box<crate::sys::netlink::NetlinkError>,
    },
    #[error("reading sysctl {path} in the namespace of {interface}")]
    Sysctl {
        interface: String,
        path: String,
        source: io::Error,
    },
}

impl DatapathError {
    pub(super) fn load(program: ProgId, err: ProgramError) -> Self {
        match err {
            ProgramError::LoadError {
                io_error,
                verifier_log,
            } => Self::Verifier {
                program,
                source: io_error,
                log: verifier_log.to_string(),
            },
            source => Self::Program { program, source },
        }
    }

    pub(super) fn attach(
        program: ProgId,
        iface: &Interface,
        mode: AttachMode,
        source: ProgramError,
    ) -> Self {
        Self::Attach {
            program,
            interface: iface.to_string(),
            mode,
            source,
        }
    }
}
