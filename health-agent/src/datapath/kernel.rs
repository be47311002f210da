//! What the running kernel supports, probed once at start, and which tc
//! hook each program gets: tcx links where the kernel has them (Linux 6.6
//! and later), the classic hook (a `clsact` qdisc and a `cls_bpf` filter
//! in direct-action mode, through netlink) where it does not, as Cilium
//! falls back on older kernels.
//!
//! Essential features (program types, the ring buffer the kernel logs go
//! through, the helpers the programs call) are probed too: a kernel that
//! lacks one is refused at start with one error naming the feature and the
//! first Linux release that has it.

use std::{fmt, io, os::fd::FromRawFd as _, os::fd::OwnedFd, path::Path};

use aya::{
    maps::MapType,
    programs::ProgramType,
    sys::{BpfHelper, is_helper_supported, is_map_supported, is_program_supported},
};
use serde::{Deserialize, Serialize};

use super::AttachMode;

/// `--attach`: how the tc programs are attached.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "kebab-case")]
pub enum TcPolicy {
    /// tcx where the kernel has it (>= 6.6), classic tc otherwise.
    #[default]
    Auto,
    /// tcx links only (fails on kernels without them).
    Tcx,
    /// Classic tc: a clsact qdisc and `cls_bpf` filters in direct-action
    /// mode, through netlink (any supported kernel).
    Tc,
}

impl TcPolicy {
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Tcx => "tcx",
            Self::Tc => "tc",
        }
    }
}

impl fmt::Display for TcPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The tc hook a program is attached with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TcHook {
    /// A tcx link (`BPF_LINK_CREATE`, Linux >= 6.6).
    Tcx,
    /// A `cls_bpf` filter under the clsact qdisc.
    Tc,
}

impl TcHook {
    /// The echo responder's attach mode on this hook.
    #[must_use]
    pub const fn echo_mode(self) -> AttachMode {
        match self {
            Self::Tcx => AttachMode::Tcx,
            Self::Tc => AttachMode::Tc,
        }
    }

    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Tcx => "tcx",
            Self::Tc => "tc",
        }
    }
}

impl fmt::Display for TcHook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error(
        "kernel {release} lacks {feature}, which {needed_by} needs: Linux >= {minimum} is required \
         (the agent is tested on 6.1, 6.12 and 6.18)"
    )]
    Missing {
        release: String,
        feature: &'static str,
        needed_by: &'static str,
        minimum: &'static str,
    },
    #[error(
        "kernel {release} has no tcx links (Linux >= 6.6): `--attach tcx` cannot work here; use \
         `--attach auto` or `--attach tc` (classic tc, clsact + cls_bpf)"
    )]
    NoTcx { release: String },
    #[error("probing the kernel for {feature}")]
    Probe {
        feature: &'static str,
        source: io::Error,
    },
}

/// What the running kernel offers the agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelFeatures {
    /// `uname -r`.
    pub release: String,
    /// tcx links (`BPF_TCX_INGRESS`/`BPF_TCX_EGRESS`, Linux >= 6.6).
    pub tcx: bool,
    /// Kernel BTF (`/sys/kernel/btf/vmlinux`): reported, not required (the
    /// programs use no CO-RE relocations).
    pub btf: bool,
}

/// One essential feature: what it is, who needs it, since when.
struct Essential {
    feature: &'static str,
    needed_by: &'static str,
    minimum: &'static str,
    probe: fn() -> io::Result<bool>,
}

fn program(t: ProgramType) -> io::Result<bool> {
    is_program_supported(t).map_err(io::Error::other)
}

fn helper(t: ProgramType, h: BpfHelper) -> io::Result<bool> {
    is_helper_supported(t, h).map_err(io::Error::other)
}

const ESSENTIALS: &[Essential] = &[
    Essential {
        feature: "BPF_PROG_TYPE_SCHED_CLS",
        needed_by: "every tc program",
        minimum: "4.1",
        probe: || program(ProgramType::SchedClassifier),
    },
    Essential {
        feature: "BPF_PROG_TYPE_XDP",
        needed_by: "the echo responder in XDP modes",
        minimum: "4.8",
        probe: || program(ProgramType::Xdp),
    },
    Essential {
        feature: "BPF_MAP_TYPE_RINGBUF",
        needed_by: "the kernel programs' log records (aya-log)",
        minimum: "5.8",
        probe: || is_map_supported(MapType::RingBuf).map_err(io::Error::other),
    },
    Essential {
        feature: "the helper bpf_skb_change_tail",
        needed_by: "the echo responder (tc)",
        minimum: "4.9",
        probe: || {
            helper(
                ProgramType::SchedClassifier,
                BpfHelper::BPF_FUNC_skb_change_tail,
            )
        },
    },
    Essential {
        feature: "the helper bpf_xdp_load_bytes",
        needed_by: "the echo responder (XDP checksum over non-linear frames)",
        minimum: "5.18",
        probe: || helper(ProgramType::Xdp, BpfHelper::BPF_FUNC_xdp_load_bytes),
    },
];

impl KernelFeatures {
    /// Probes the running kernel; a missing essential feature is an error
    /// naming it and the minimum kernel.
    pub fn probe() -> Result<Self, KernelError> {
        let release = release();
        for e in ESSENTIALS {
            let ok = (e.probe)().map_err(|source| KernelError::Probe {
                feature: e.feature,
                source,
            })?;
            if !ok {
                return Err(KernelError::Missing {
                    release,
                    feature: e.feature,
                    needed_by: e.needed_by,
                    minimum: e.minimum,
                });
            }
        }
        let tcx = probe_tcx().map_err(|source| KernelError::Probe {
            feature: "tcx links",
            source,
        })?;
        Ok(Self {
            release,
            tcx,
            btf: Path::new("/sys/kernel/btf/vmlinux").exists(),
        })
    }

    /// The tc hook under `policy`: tcx where the kernel has it (auto), or
    /// as forced.
    pub fn choose(&self, policy: TcPolicy) -> Result<TcHook, KernelError> {
        match policy {
            TcPolicy::Auto | TcPolicy::Tcx if self.tcx => Ok(TcHook::Tcx),
            TcPolicy::Auto | TcPolicy::Tc => Ok(TcHook::Tc),
            TcPolicy::Tcx => Err(KernelError::NoTcx {
                release: self.release.clone(),
            }),
        }
    }
}

/// `uname -r`.
#[must_use]
pub fn release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|_| "unknown".into(), |r| r.trim().to_owned())
}

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PROG_TYPE_SCHED_CLS: u32 = 3;
const BPF_TCX_INGRESS: u32 = 46;
/// `union bpf_attr` is larger; the kernel zero-checks what it does not know.
const ATTR_SIZE: usize = 128;

fn bpf(cmd: libc::c_long, attr: &mut [u8; ATTR_SIZE]) -> io::Result<i32> {
    // SAFETY: `attr` is a zero-initialised buffer at least as large as
    // every field the two commands used here read, and it lives for the
    // whole call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr.as_mut_ptr(),
            ATTR_SIZE as libc::c_uint,
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        i32::try_from(ret).map_err(io::Error::other)
    }
}

/// Whether `BPF_LINK_CREATE` knows `BPF_TCX_INGRESS`: a minimal `sched_cls`
/// program is linked to an interface index that cannot exist. A kernel
/// with tcx looks the device up and answers `ENODEV`; one without refuses
/// the attach type with `EINVAL` (the probe cilium/ebpf uses).
fn probe_tcx() -> io::Result<bool> {
    // r0 = 0; exit
    let insns: [u8; 16] = [
        0xb7, 0, 0, 0, 0, 0, 0, 0, //
        0x95, 0, 0, 0, 0, 0, 0, 0,
    ];
    let license = c"GPL";
    let mut attr = [0u8; ATTR_SIZE];
    attr[0..4].copy_from_slice(&BPF_PROG_TYPE_SCHED_CLS.to_ne_bytes());
    attr[4..8].copy_from_slice(&2u32.to_ne_bytes());
    attr[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    let fd = bpf(BPF_PROG_LOAD, &mut attr)?;
    // SAFETY: the kernel just returned this descriptor to us; nothing else
    // owns it.
    let prog = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut attr = [0u8; ATTR_SIZE];
    let prog_fd = u32::try_from(std::os::fd::AsRawFd::as_raw_fd(&prog)).unwrap_or(0);
    attr[0..4].copy_from_slice(&prog_fd.to_ne_bytes());
    attr[4..8].copy_from_slice(&u32::MAX.to_ne_bytes());
    attr[8..12].copy_from_slice(&BPF_TCX_INGRESS.to_ne_bytes());
    match bpf(BPF_LINK_CREATE, &mut attr) {
        Ok(link) => {
            // Cannot happen (no such device); never keep a link.
            // SAFETY: as above, a descriptor the kernel just returned.
            drop(unsafe { OwnedFd::from_raw_fd(link) });
            Ok(true)
        }
        Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok(false),
        Err(e) => Err(e),
    }
}

/// One program attached by this process, as `/v1/healthz` and the
/// start-up log show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attachment {
    pub program: String,
    /// The interface (and its namespace when not the agent's own).
    pub interface: String,
    /// `tcx`, `tc`, `xdp-native` or `xdp-generic`.
    pub attach: String,
    /// For classic tc: where the filter sits (`ingress prio 18501 handle
    /// 0x48450003`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// The kernel and what the agent chose on it, for `/v1/healthz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelReport {
    #[serde(flatten)]
    pub features: KernelFeatures,
    /// `--attach` as given.
    pub policy: TcPolicy,
    /// The hook the tc programs got under it.
    pub tc_hook: TcHook,
    /// Every program attached now.
    #[serde(default)]
    pub programs: Vec<Attachment>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn features(tcx: bool) -> KernelFeatures {
        KernelFeatures {
            release: "6.1.0-47-amd64".into(),
            tcx,
            btf: true,
        }
    }

    #[test]
    fn auto_picks_tcx_where_it_exists_and_classic_tc_elsewhere() {
        assert_eq!(
            features(true).choose(TcPolicy::Auto).ok(),
            Some(TcHook::Tcx)
        );
        assert_eq!(
            features(false).choose(TcPolicy::Auto).ok(),
            Some(TcHook::Tc)
        );
        assert_eq!(features(true).choose(TcPolicy::Tc).ok(), Some(TcHook::Tc));
        assert_eq!(features(true).choose(TcPolicy::Tcx).ok(), Some(TcHook::Tcx));
    }

    #[test]
    fn forced_tcx_without_tcx_names_the_kernel_and_the_way_out() {
        let err = features(false)
            .choose(TcPolicy::Tcx)
            .expect_err("no tcx")
            .to_string();
        assert!(
            err.contains("6.1.0-47-amd64") && err.contains(">= 6.6") && err.contains("--attach tc"),
            "{err}"
        );
    }

    #[test]
    fn a_missing_feature_names_it_and_the_minimum_kernel() {
        let err = KernelError::Missing {
            release: "5.15.0".into(),
            feature: "the helper bpf_xdp_load_bytes",
            needed_by: "the echo responder",
            minimum: "5.18",
        }
        .to_string();
        assert!(
            err.contains("5.15.0") && err.contains("bpf_xdp_load_bytes") && err.contains(">= 5.18"),
            "{err}"
        );
    }

    #[test]
    fn this_kernel_is_probed() {
        // Unprivileged runs cannot load programs: only check the shape.
        if let Ok(f) = KernelFeatures::probe() {
            assert_ne!(f.release, "");
        }
    }
}
