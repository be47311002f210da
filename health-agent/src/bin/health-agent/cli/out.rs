//! The commands' answers on stdout, written whole through one lock. A
//! reader that went away (`health-agent bpf ct list global | head -1`)
//! ends the command quietly, where `print!` would panic.

use std::io::{self, Write as _};

/// Writing an answer failed.
#[derive(Debug, thiserror::Error)]
#[error("writing to stdout: {0}")]
pub(crate) struct StdoutError(#[source] pub(crate) io::Error);

/// Writes `text` to stdout.
pub(crate) fn print(text: &str) -> Result<(), StdoutError> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(StdoutError)
}

/// Writes `text` and a newline to stdout.
pub(crate) fn print_line(text: &str) -> Result<(), StdoutError> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush())
        .map_err(StdoutError)
}

/// Whether `e` is stdout's reader having gone: nothing to report.
pub(crate) fn reader_gone(e: &anyhow::Error) -> bool {
    e.downcast_ref::<StdoutError>()
        .is_some_and(|StdoutError(io)| io.kind() == io::ErrorKind::BrokenPipe)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_closed_stdout_is_the_reader_gone() {
        let gone = anyhow::Error::from(StdoutError(io::ErrorKind::BrokenPipe.into()));
        assert!(reader_gone(&gone));
        assert!(reader_gone(&gone.context("listing the CT entries")));
        let full = anyhow::Error::from(StdoutError(io::Error::from_raw_os_error(libc::ENOSPC)));
        assert!(!reader_gone(&full), "a full disk is reported");
        // The agent's socket closing under a request is not stdout's.
        let socket = anyhow::Error::from(io::Error::from(io::ErrorKind::BrokenPipe));
        assert!(!reader_gone(&socket));
    }
}
