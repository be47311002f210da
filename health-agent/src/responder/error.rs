use std::{io, path::PathBuf};

use aya::programs::ProgramError;

use super::{AttachMode, Interface};
use crate::netns::NetnsError;

#[derive(Debug, thiserror::Error)]
pub enum ResponderError {
    #[error("bpffs directory {path}")]
    PinDir { path: PathBuf, source: io::Error },
    #[error("{path} is not on a bpf filesystem (mount one with `mount -t bpf bpf /sys/fs/bpf`)")]
    NotBpffs { path: PathBuf },
    #[error("loading the health kernel object (maps pinned under {pin_dir})")]
    Object {
        pin_dir: PathBuf,
        source: Box<aya::EbpfError>,
    },
    #[error("program {program} is missing from the kernel object")]
    MissingProgram { program: &'static str },
    #[error("map {map} is missing from the kernel object")]
    MissingMap { map: &'static str },
    #[error("program {program}")]
    Program {
        program: &'static str,
        source: ProgramError,
    },
    #[error("the verifier rejected program {program}; verifier log:\n{log}")]
    Verifier {
        program: &'static str,
        source: io::Error,
        log: String,
    },
    #[error("attaching {program} to {interface} in {mode} mode")]
    Attach {
        program: &'static str,
        interface: String,
        mode: AttachMode,
        source: ProgramError,
    },
    #[error("interface name {name:?} contains a NUL byte")]
    BadInterfaceName { name: String },
    #[error("map {map}")]
    Map {
        map: &'static str,
        source: aya::maps::MapError,
    },
    #[error("pinned map {path}")]
    PinnedMap {
        path: PathBuf,
        source: aya::maps::MapError,
    },
    #[error("forwarding kernel logs: {0}")]
    Logger(String),
    #[error(transparent)]
    Netns(#[from] NetnsError),
}

impl ResponderError {
    pub(super) fn load(program: &'static str, err: ProgramError) -> Self {
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
        program: &'static str,
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
