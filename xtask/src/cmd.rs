//! Running commands, echoing each so long tasks show progress.

use std::{
    path::Path,
    process::{Command, Output},
};

use anyhow::{Context as _, bail};

/// Prints and runs `cmd`; a non-zero exit is an error naming the command.
pub(crate) fn run(cmd: &mut Command) -> anyhow::Result<()> {
    eprintln!("xtask: $ {}", display(cmd));
    let status = cmd
        .status()
        .with_context(|| format!("starting {}", display(cmd)))?;
    if !status.success() {
        bail!("`{}` failed ({status})", display(cmd));
    }
    Ok(())
}

/// Runs `cmd` quietly and returns its output (exit status not checked).
pub(crate) fn output(cmd: &mut Command) -> anyhow::Result<Output> {
    cmd.output()
        .with_context(|| format!("starting {}", display(cmd)))
}

/// `cargo ARGS` in the workspace root, with the cargo that runs xtask.
pub(crate) fn cargo(root: &Path, args: &[&str]) -> anyhow::Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(Command::new(cargo).current_dir(root).args(args))
}

pub(crate) fn require_root(why: &str) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("run as root: {why}");
    }
    Ok(())
}

fn display(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}
