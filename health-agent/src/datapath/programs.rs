//! The object's programs by [`ProgId`]: looked up, typed and loaded into
//! the kernel on first use. Below the loader and the attachments, which
//! both take programs through it.

use aya::{
    Ebpf,
    programs::{ProgramError, SchedClassifier, Xdp},
};
use health_common::maps::{ProgId, ProgKind};

use super::error::DatapathError;

/// Loads program `id` into the kernel unless it is loaded already, so a
/// verifier rejection surfaces with its log.
pub(super) fn ensure_loaded(ebpf: &mut Ebpf, id: ProgId) -> Result<(), DatapathError> {
    let prog = ebpf
        .program(id.name())
        .ok_or(DatapathError::MissingProgram { program: id })?;
    if prog.fd().is_ok() {
        return Ok(());
    }
    let loaded = match id.kind() {
        ProgKind::Xdp => program::<Xdp>(ebpf, id)?.load(),
        ProgKind::SchedClassifier => program::<SchedClassifier>(ebpf, id)?.load(),
    };
    loaded.map_err(|e| DatapathError::load(id, e))
}

/// Program `id` of the object, loaded into the kernel first if it is not.
pub(super) fn loaded<'a, T>(ebpf: &'a mut Ebpf, id: ProgId) -> Result<&'a mut T, DatapathError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = ProgramError>,
{
    ensure_loaded(ebpf, id)?;
    program(ebpf, id)
}

pub(super) fn program<'a, T>(ebpf: &'a mut Ebpf, id: ProgId) -> Result<&'a mut T, DatapathError>
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
