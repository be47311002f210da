//! The classic tc hook, for kernels without tcx (< 6.6) or under
//! `--attach tc`: a `clsact` qdisc and one `cls_bpf` filter per program in
//! direct-action mode, through netlink, as Cilium attaches on such kernels.
//!
//! Every filter of the agent sits at one fixed priority,
//! [`PRIORITY`], with a handle of its own per program ([`handle`]): it
//! coexists with other filters on the device (ours return
//! `TC_ACT_UNSPEC`, so filters after them still run), a filter a killed
//! agent left at that slot is replaced in place (no window without a
//! program, never two of ours), and it is deleted when the agent detaches.
//! A clsact qdisc the agent created is removed again once no filter is
//! left under it.

use std::ffi::CStr;

use aya::programs::{
    ProgramError, SchedClassifier, TcAttachType,
    tc::{
        self, NlOptions, SchedClassifierLink, SchedClassifierLinkId, TcAttach, TcError, TcHandle,
    },
};
use health_common::maps::ProgId;

use super::missing::Why;
use crate::sys::netlink::{Netlink, NetlinkError, TcDirection, TcFilter};

/// The priority of every filter of the agent (`tc filter show` prints
/// `pref 18501`): after Cilium's (1), before those tc numbers itself
/// (49152 and down).
pub const PRIORITY: u16 = 0x4845;

/// The handle of `program`'s filter: `0x4845` and the program's number.
#[must_use]
pub fn handle(program: ProgId) -> u32 {
    let n = ProgId::ALL
        .iter()
        .position(|p| *p == program)
        .unwrap_or_default();
    0x4845_0000 | (u32::try_from(n).unwrap_or(0) + 1)
}

/// The clsact parent of a direction.
fn parent(attach_type: TcAttachType) -> TcHandle {
    attach_type.into()
}

#[must_use]
pub const fn direction(attach_type: TcAttachType) -> TcDirection {
    match attach_type {
        TcAttachType::Ingress => TcDirection::Ingress,
        TcAttachType::Egress => TcDirection::Egress,
    }
}

/// What attaching did.
#[derive(Debug)]
pub struct Attached {
    pub link: SchedClassifierLinkId,
    /// A filter was already at our slot (a killed agent's) and was replaced.
    pub replaced: bool,
}

fn os_error(e: &ProgramError) -> Option<i32> {
    match e {
        ProgramError::TcError(TcError::NetlinkError(n)) | ProgramError::NetlinkError(n) => {
            n.raw_os_error()
        }
        ProgramError::TcError(TcError::IoError(io)) => io.raw_os_error(),
        _ => None,
    }
}

/// Adds the clsact qdisc to `iface` unless it has one; `true` when it was
/// created now. Runs in the calling thread's namespace.
pub fn ensure_clsact(iface: &CStr) -> Result<bool, ProgramError> {
    match tc::qdisc_add_clsact(iface) {
        Ok(()) => Ok(true),
        Err(TcError::AlreadyAttached) => Ok(false),
        Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Attaches `prog` as `program`'s filter on `iface` (the clsact qdisc must
/// be there), replacing a filter already at its slot. Runs in the calling
/// thread's namespace.
pub fn attach(
    prog: &mut SchedClassifier,
    program: ProgId,
    iface: &CStr,
    attach_type: TcAttachType,
) -> Result<Attached, ProgramError> {
    let options = NlOptions {
        priority: PRIORITY,
        handle: TcHandle::from(handle(program)),
        classid: None,
    };
    let parent = parent(attach_type);
    match prog.attach(iface, TcAttach::Netlink { parent, options }) {
        Ok(link) => Ok(Attached {
            link,
            replaced: false,
        }),
        Err(e) if os_error(&e) == Some(libc::EEXIST) => {
            let stale = SchedClassifierLink::attached(
                iface,
                parent,
                PRIORITY,
                TcHandle::from(handle(program)),
                None,
            )
            .map_err(ProgramError::IOError)?;
            let link = prog.attach_to_link(stale)?;
            Ok(Attached {
                link,
                replaced: true,
            })
        }
        Err(e) => Err(e),
    }
}

/// Removes the classic filter at `program`'s slot on `iface`, in
/// `attach_type`'s direction: one an agent attached with `--attach tc`
/// and left when it was killed, which would run beside the tcx program
/// this agent attaches instead. Runs in the calling thread's namespace.
pub fn remove_left(
    iface: &CStr,
    program: ProgId,
    attach_type: TcAttachType,
) -> Result<(), ProgramError> {
    let link = SchedClassifierLink::attached(
        iface,
        parent(attach_type),
        PRIORITY,
        TcHandle::from(handle(program)),
        None,
    )
    .map_err(ProgramError::IOError)?;
    aya::programs::Link::detach(link)
}

/// Whether `filters` hold one at `program`'s slot (whatever it runs).
#[must_use]
pub fn at_slot(filters: &[TcFilter], program: ProgId) -> bool {
    slot(filters, program, None).is_none()
}

/// What is at `program`'s slot in `filters`: `None` when its filter runs
/// `prog_id` (any program when `prog_id` is unknown), else why not.
#[must_use]
pub fn slot(filters: &[TcFilter], program: ProgId, prog_id: Option<u32>) -> Option<Why> {
    let at_slot = filters
        .iter()
        .filter(|f| f.priority == PRIORITY && f.handle == handle(program) && f.kind == "bpf");
    let mut found = false;
    for f in at_slot {
        if prog_id.is_none() || f.bpf_id == prog_id {
            return None;
        }
        found = true;
    }
    Some(if found {
        Why::FilterReplaced
    } else {
        Why::FilterGone
    })
}

/// Removes the clsact qdisc of `iface` if no filter is left under it
/// (one the agent created; filters of others keep it).
pub async fn remove_clsact_if_empty(nl: &Netlink, iface: &str) -> Result<bool, NetlinkError> {
    if nl.link_index(iface).await?.is_none() {
        return Ok(false);
    }
    let ingress = nl.tc_filters(iface, TcDirection::Ingress).await?;
    let egress = nl.tc_filters(iface, TcDirection::Egress).await?;
    if ingress.is_empty() && egress.is_empty() {
        nl.delete_clsact(iface).await?;
        Ok(true)
    } else {
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_program_has_its_own_handle_in_the_agents_range() {
        let mut seen = std::collections::BTreeSet::new();
        for p in ProgId::ALL {
            let h = handle(p);
            assert_eq!(h >> 16, 0x4845, "{h:#x}");
            assert!(seen.insert(h), "{p:?} shares {h:#x}");
        }
    }

    fn filter(program: ProgId, bpf_id: Option<u32>) -> TcFilter {
        TcFilter {
            priority: PRIORITY,
            handle: handle(program),
            kind: "bpf".into(),
            bpf_id,
            bpf_name: None,
        }
    }

    #[test]
    fn the_slot_says_ours_deleted_or_replaced() {
        let p = ProgId::LxcIngress;
        assert_eq!(slot(&[filter(p, Some(7))], p, Some(7)), None);
        assert_eq!(slot(&[filter(p, Some(8))], p, None), None, "id unknown");
        assert_eq!(
            slot(&[filter(p, Some(8))], p, Some(7)),
            Some(Why::FilterReplaced)
        );
        assert_eq!(
            slot(&[filter(ProgId::LxcEgress, Some(7))], p, Some(7)),
            Some(Why::FilterGone),
            "another program's slot"
        );
        assert_eq!(slot(&[], p, Some(7)), Some(Why::FilterGone));
    }
}
