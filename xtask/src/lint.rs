//! `cargo xtask lint`: formatting and clippy on both sides of the workspace.

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
