//! `cargo xtask setup`: installs exactly what `ebpf-toolchain.toml` pins.
//! Every step checks first, so a machine that has everything is done in
//! about a second.

use std::process::Command;

use anyhow::{Context as _, bail};

use xtask::pin::EbpfPin;

use crate::cmd;

/// Debian packages the build needs: protoc and the well-known `.proto`
/// files for the etcd-client crate's build script.
const BUILD_PACKAGES: &[&str] = &["protobuf-compiler", "libprotobuf-dev"];

/// Debian packages only the tests and tools use (`systemd` for
/// `systemd-analyze verify` of the packaged unit, `lintian` to check the
/// package; Prometheus scrapes the agents and Chromium loads the
/// connectivity page in the tests; etcd for the etcd tests, with openssl
/// to make their certificates; nftables to cut a node off from etcd in
/// the chaos tests and to drop a share of the probes in the path-quality
/// tests; fping for the benchmarks' reference figures; wireguard-tools
/// to configure the WireGuard tests' tunnels).
const TEST_PACKAGES: &[&str] = &[
    "iproute2",
    "etcd-server",
    "openssl",
    "nftables",
    "bpftool",
    "fping",
    "wireguard-tools",
    "systemd",
    "lintian",
    "prometheus",
    "chromium",
    "chromium-driver",
];

/// rust-src for `-Z build-std=core`, clippy for `cargo xtask lint`.
const NIGHTLY_COMPONENTS: &[&str] = &["rust-src", "clippy"];

/// Everything: what the build needs and what the tests use.
pub(crate) fn run(pin: &EbpfPin) -> anyhow::Result<()> {
    let mut all = BUILD_PACKAGES.to_vec();
    all.extend_from_slice(TEST_PACKAGES);
    setup(pin, &all)
}

/// What the build needs, and `extra` Debian packages (the demo's etcd);
/// none of the tests' tools.
pub(crate) fn for_build(pin: &EbpfPin, extra: &[&str]) -> anyhow::Result<()> {
    let mut packages = BUILD_PACKAGES.to_vec();
    packages.extend_from_slice(extra);
    setup(pin, &packages)
}

fn setup(pin: &EbpfPin, packages: &[&str]) -> anyhow::Result<()> {
    let mut apt = Apt::default();
    apt.ensure(packages)?;
    ensure_nightly(pin)?;
    ensure_bpf_linker(pin, &mut apt)?;
    eprintln!(
        "xtask: setup ok: {} with rust-src and clippy, bpf-linker {} on LLVM {}",
        pin.nightly, pin.bpf_linker, pin.llvm_major
    );
    Ok(())
}

/// `apt-get install` of what is missing, `apt-get update` once first.
#[derive(Default)]
pub(crate) struct Apt {
    updated: bool,
}

impl Apt {
    pub(crate) fn ensure(&mut self, packages: &[&str]) -> anyhow::Result<()> {
        let missing: Vec<&str> = packages.iter().copied().filter(|p| !installed(p)).collect();
        if missing.is_empty() {
            return Ok(());
        }
        eprintln!("xtask: installing Debian packages: {}", missing.join(" "));
        if !self.updated {
            cmd::run(Command::new("apt-get").args(["update", "-q"]))?;
            self.updated = true;
        }
        cmd::run(
            Command::new("apt-get")
                .env("DEBIAN_FRONTEND", "noninteractive")
                .args(["install", "-y", "-q", "--no-install-recommends"])
                .args(&missing),
        )
    }
}

fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
}

fn ensure_nightly(pin: &EbpfPin) -> anyhow::Result<()> {
    let components = cmd::output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        &pin.nightly,
    ]))?;
    let listed = String::from_utf8_lossy(&components.stdout);
    let complete = components.status.success()
        && NIGHTLY_COMPONENTS
            .iter()
            .all(|c| listed.lines().any(|l| l.trim().starts_with(c)));
    if !complete {
        cmd::run(
            Command::new("rustup")
                .args(["toolchain", "install", "--no-self-update", &pin.nightly])
                .args(["--profile", "minimal"])
                .args(NIGHTLY_COMPONENTS.iter().flat_map(|c| ["--component", c])),
        )?;
    }
    // The nightly's LLVM must be the pinned one, or bpf-linker cannot read
    // the bitcode it emits.
    let vv = cmd::output(Command::new("rustup").args(["run", &pin.nightly, "rustc", "-vV"]))?;
    let vv = String::from_utf8_lossy(&vv.stdout);
    let llvm = vv
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .context("rustc -vV printed no LLVM version")?;
    if llvm.split('.').next() != Some(pin.llvm_major.as_str()) {
        bail!(
            "{} uses LLVM {llvm}, but llvm-major = {} is pinned: fix ebpf-toolchain.toml",
            pin.nightly,
            pin.llvm_major
        );
    }
    Ok(())
}

fn ensure_bpf_linker(pin: &EbpfPin, apt: &mut Apt) -> anyhow::Result<()> {
    if let Some(problem) = bpf_linker_problem(pin) {
        eprintln!(
            "xtask: building bpf-linker {} against LLVM {}: {problem}",
            pin.bpf_linker, pin.llvm_major
        );
        let m = &pin.llvm_major;
        apt.ensure(&[
            &format!("llvm-{m}-dev"),
            &format!("libpolly-{m}-dev"),
            "libzstd-dev",
            "zlib1g-dev",
        ])?;
        cmd::run(
            Command::new("cargo")
                .env("LLVM_PREFIX", format!("/usr/lib/llvm-{m}"))
                .args([
                    "install",
                    "bpf-linker",
                    "--force",
                    "--locked",
                    "--no-default-features",
                ])
                .args([
                    "--version",
                    &pin.bpf_linker,
                    "--features",
                    &format!("llvm-{m}"),
                ]),
        )?;
        if let Some(problem) = bpf_linker_problem(pin) {
            bail!("bpf-linker still unusable after installing it: {problem}");
        }
    }
    Ok(())
}

/// Why the installed bpf-linker does not match the pin, or `None` when it does.
fn bpf_linker_problem(pin: &EbpfPin) -> Option<String> {
    let Ok(out) = Command::new("bpf-linker").arg("--version").output() else {
        return Some("not installed".into());
    };
    let version = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if version != format!("bpf-linker {}", pin.bpf_linker) {
        return Some(format!("found {version:?}"));
    }
    let path = which_bpf_linker()?;
    let ldd = Command::new("ldd").arg(&path).output().ok()?;
    let libs = String::from_utf8_lossy(&ldd.stdout);
    let want = format!("libLLVM.so.{}", pin.llvm_major);
    let want_alt = format!("libLLVM-{}", pin.llvm_major);
    if libs.contains("libLLVM") && !libs.contains(&want) && !libs.contains(&want_alt) {
        return Some(format!("{path} links another LLVM"));
    }
    None
}

fn which_bpf_linker() -> Option<String> {
    let out = Command::new("sh")
        .args(["-c", "command -v bpf-linker"])
        .output()
        .ok()?;
    let p = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (!p.is_empty()).then_some(p)
}
