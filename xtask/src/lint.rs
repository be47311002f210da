//! `cargo xtask lint`: formatting and clippy on both sides of the workspace,
//! and the host side's docs (a broken or private link is an error).

use std::{path::Path, process::Command};

use xtask::pin::EbpfPin;

use crate::cmd;

pub(crate) fn run(root: &Path, pin: &EbpfPin) -> anyhow::Result<()> {
    cmd::cargo(root, &["fmt", "--all", "--", "--check"])?;
    cmd::cargo(
        root,
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    // The docs of every host crate, their intra-doc links resolved: a
    // link to nothing, to an item the reader cannot see, or to two items
    // at once fails here.
    cmd::run(
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .current_dir(root)
            .args(["doc", "--workspace", "--no-deps", "--quiet"])
            .env("RUSTDOCFLAGS", "-D warnings"),
    )?;
    // The kernel programs, linted as what they are: bpf-target code built
    // with the pinned nightly (the host build of health-ebpf is empty).
    let target_dir = root.join("target").join("ebpf-clippy");
    cmd::run(
        Command::new("rustup")
            .current_dir(root.join("health-ebpf"))
            .args([
                "run",
                &pin.nightly,
                "cargo",
                "clippy",
                "--package",
                "health-ebpf",
            ])
            .args([
                "--target",
                "bpfel-unknown-none",
                "-Z",
                "build-std=core",
                "--release",
            ])
            .arg("--target-dir")
            .arg(&target_dir)
            .args(["--", "-D", "warnings"])
            .env(
                "CARGO_ENCODED_RUSTFLAGS",
                "--cfg=bpf_target_arch=\"x86_64\"",
            )
            .env_remove("RUSTC")
            .env_remove("RUSTC_WORKSPACE_WRAPPER"),
    )
}
