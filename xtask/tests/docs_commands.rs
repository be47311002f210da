//! Every `cargo xtask ...` command quoted in README.md, BENCHMARKS.md and
//! docs/*.md names subcommands and options that `cargo xtask` has.

// An integration test sees every dependency of the package.
use anyhow as _;
use clap as _;
use libc as _;
use serde_json as _;

use std::{path::Path, process::Command};

use xtask::docs::{self, Program};

fn help(path: &[String]) -> Result<String, String> {
    let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(path)
        .arg("--help")
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        String::from_utf8(out.stdout).map_err(|e| e.to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

#[test]
fn every_quoted_xtask_command_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let documents = docs::documents(&root).expect("reading the docs");
    let commands: Vec<_> = documents
        .iter()
        .flat_map(|(name, text)| docs::quoted(name, text))
        .filter(|q| q.program == Program::Xtask)
        .collect();
    // The README alone quotes `run`, `test` and `package`.
    assert!(
        commands.len() >= 3,
        "only {} commands found",
        commands.len()
    );
    let problems: Vec<_> = commands
        .iter()
        .flat_map(|q| docs::check(q, &mut help))
        .collect();
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}
