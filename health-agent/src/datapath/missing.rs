//! An attached program no longer where it was attached: which program, on
//! which interface, on which hook, and why.

use std::fmt;

use aya::programs::TcAttachType;
use health_common::maps::ProgId;

use super::{AttachMode, Interface};

/// The hook a program was attached on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// A tcx link, in its direction.
    Tcx(TcAttachType),
    /// A classic tc filter (clsact + `cls_bpf`), in its direction.
    Tc(TcAttachType),
    /// XDP, in its mode.
    Xdp(AttachMode),
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Tcx(t) => write!(f, "tcx {}", direction_name(*t)),
            Self::Tc(t) => write!(f, "tc {}", direction_name(*t)),
            Self::Xdp(mode) => write!(f, "{mode}"),
        }
    }
}

/// Why an attached program is no longer in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// The interface is gone (or its programs can no longer be listed).
    InterfaceGone,
    /// The interface's tcx list no longer holds the program.
    LinkGone,
    /// No filter at the program's slot (deleted, or its clsact qdisc
    /// removed).
    FilterGone,
    /// The filter at the program's slot runs another program.
    FilterReplaced,
}

impl Why {
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::InterfaceGone => "interface gone",
            Self::LinkGone => "tcx link detached",
            Self::FilterGone => "tc filter deleted",
            Self::FilterReplaced => "tc filter replaced by another program",
        }
    }
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One attached program no longer where it was attached. Shown as
/// `health_lxc_ingress on lxc_health (tc ingress: tc filter deleted)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingAttachment {
    pub program: ProgId,
    pub interface: Interface,
    pub hook: Hook,
    pub why: Why,
}

impl fmt::Display for MissingAttachment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} on {} ({}: {})",
            self.program.name(),
            self.interface,
            self.hook,
            self.why
        )
    }
}

/// The list as the logs show it: each one, comma-separated.
#[must_use]
pub fn render(missing: &[MissingAttachment]) -> String {
    missing
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `ingress` or `egress`.
pub(super) const fn direction_name(t: TcAttachType) -> &'static str {
    match t {
        TcAttachType::Ingress => "ingress",
        TcAttachType::Egress => "egress",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_attachment_names_program_interface_hook_and_why() {
        let missing = [
            MissingAttachment {
                program: ProgId::LxcIngress,
                interface: Interface::new("lxc_health", None),
                hook: Hook::Tc(TcAttachType::Ingress),
                why: Why::FilterGone,
            },
            MissingAttachment {
                program: ProgId::NatEgress,
                interface: Interface::new("uplink", None),
                hook: Hook::Tcx(TcAttachType::Egress),
                why: Why::LinkGone,
            },
        ];
        assert_eq!(
            render(&missing),
            format!(
                "{} on lxc_health (tc ingress: tc filter deleted), \
                 {} on uplink (tcx egress: tcx link detached)",
                ProgId::LxcIngress.name(),
                ProgId::NatEgress.name()
            )
        );
        assert_eq!(Hook::Xdp(AttachMode::XdpGeneric).to_string(), "xdp-generic");
    }
}
