//! Builds `health-ebpf` for the bpf target with the pinned nightly (see
//! `ebpf-toolchain.toml`) and leaves the object in `OUT_DIR/health`, where
//! `src/datapath/object.rs` embeds it into the agent binary; compiles the
//! summary's schema (`proto/summary.proto`) with protoc into
//! `OUT_DIR/health.summary.v3.rs`, which `src/cluster/summary/wire.rs`
//! includes, and the published view's (`proto/view.proto`) into
//! `OUT_DIR/health.view.v1.rs`, which `src/cluster/published_view.rs`
//! includes.

use std::{
    env,
    error::Error,
    path::{Path, PathBuf},
    process::Command,
};

// Named as a build dependency only so that cargo rebuilds the embedded
// object when the kernel crate changes.
use health_ebpf as _;
use xtask::pin;

const SETUP_HINT: &str = "run `cargo xtask setup` to install the pinned eBPF toolchain";

fn main() -> Result<(), Box<dyn Error + Send + Sync>> {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let root = manifest_dir
        .parent()
        .ok_or("health-agent has no parent directory")?;
    println!(
        "cargo::rerun-if-changed={}",
        root.join(pin::FILE_NAME).display()
    );
    let pin = pin::EbpfPin::read(root)?;

    compile_schemas(&manifest_dir)?;

    let nightly_ok = Command::new("rustup")
        .args(["run", &pin.nightly, "rustc", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !nightly_ok {
        return Err(format!(
            "the eBPF toolchain {} is not installed; {SETUP_HINT}",
            pin.nightly
        )
        .into());
    }
    match Command::new("bpf-linker").arg("--version").output() {
        Ok(out) if String::from_utf8_lossy(&out.stdout).contains(&pin.bpf_linker) => {}
        Ok(out) => println!(
            "cargo::warning=bpf-linker reports {:?} but {} is pinned; {SETUP_HINT}",
            String::from_utf8_lossy(&out.stdout).trim(),
            pin.bpf_linker
        ),
        Err(err) => return Err(format!("bpf-linker not found ({err}); {SETUP_HINT}").into()),
    }

    let ebpf_dir = root.join("health-ebpf");
    let ebpf_dir = ebpf_dir.to_str().ok_or("workspace path is not UTF-8")?;
    // The workspace's release profile optimises for size; the kernel
    // programs and every crate they are built from (health-common, aya's
    // bpf side, core) are built at opt-level 3, as they are verified: at
    // "s" LLVM leaves calls out of line whose frames together pass the
    // 512-byte stack that Linux 6.1's verifier allows. aya-build runs
    // cargo with this process's environment.
    // SAFETY: the build script has one thread here (no other thread reads
    // the environment while it is set).
    unsafe {
        env::set_var("CARGO_PROFILE_RELEASE_OPT_LEVEL", "3");
    }
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "health-ebpf",
            root_dir: ebpf_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::Custom(&pin.nightly),
    )?;
    Ok(())
}

/// The protobuf schemas of what the agent writes for other agents.
fn compile_schemas(manifest_dir: &Path) -> Result<(), Box<dyn Error + Send + Sync>> {
    let proto_dir = manifest_dir.join("proto");
    let schemas = [
        proto_dir.join("summary.proto"),
        proto_dir.join("view.proto"),
    ];
    for schema in &schemas {
        println!("cargo::rerun-if-changed={}", schema.display());
    }
    prost_build::Config::new()
        .compile_protos(&schemas, &[&proto_dir])
        .map_err(|e| {
            format!(
                "compiling {} and {}: {e} (protoc: `cargo xtask setup` installs it)",
                schemas[0].display(),
                schemas[1].display()
            )
        })?;
    Ok(())
}
