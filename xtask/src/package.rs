//! The Debian package, built with `dpkg-deb` from a staged tree: the
//! binary (debug info stripped), the systemd unit, the default config
//! (`health-agent config print-defaults`, with the socket handed to the
//! `health-agent` group), the bash/zsh/fish completions and the man pages,
//! all made by the binary itself from its CLI definition, and maintainer
//! scripts that create the group and reload systemd when it runs.
//!
//! `dpkg-deb` rather than cargo-deb: it is part of dpkg (on every Debian
//! machine), needs no tool built from source in CI, and packages any
//! already-built binary (the tests package the one they test).

use std::{
    fs,
    io::{self, Write as _},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::Command,
};

/// The package's name, also its system group's.
pub const NAME: &str = "health-agent";

const POSTINST: &str = r#"#!/bin/sh
set -e
if [ "$1" = configure ]; then
    getent group health-agent >/dev/null || groupadd --system health-agent
fi
if [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null || true
fi
"#;

const PRERM: &str = r#"#!/bin/sh
set -e
if [ -d /run/systemd/system ] && [ "$1" = remove ]; then
    systemctl --system stop health-agent.service >/dev/null 2>&1 || true
    systemctl --system disable health-agent.service >/dev/null 2>&1 || true
fi
"#;

const POSTRM: &str = r#"#!/bin/sh
set -e
if [ -d /run/systemd/system ]; then
    systemctl --system daemon-reload >/dev/null || true
fi
if [ "$1" = purge ]; then
    rm -rf /var/lib/health-agent
    if getent group health-agent >/dev/null; then
        groupdel health-agent || true
    fi
fi
"#;

fn fail(what: impl std::fmt::Display) -> io::Error {
    io::Error::other(what.to_string())
}

fn run(cmd: &mut Command) -> io::Result<Vec<u8>> {
    let out = cmd
        .output()
        .map_err(|e| fail(format!("running {cmd:?}: {e}")))?;
    if !out.status.success() {
        return Err(fail(format!(
            "{cmd:?}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(out.stdout)
}

fn write(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(path, contents).map_err(|e| fail(format!("writing {}: {e}", path.display())))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

/// Builds `health-agent_<version>_<arch>.deb` in `out_dir` from `binary`
/// and the unit in `packaging/` under `workspace`; returns its path.
pub fn build_deb(binary: &Path, workspace: &Path, out_dir: &Path) -> io::Result<PathBuf> {
    let version = env!("CARGO_PKG_VERSION");
    let arch = String::from_utf8_lossy(&run(Command::new("dpkg").arg("--print-architecture"))?)
        .trim()
        .to_owned();
    let stage = out_dir.join(format!("{NAME}_{version}_{arch}"));
    if stage.exists() {
        fs::remove_dir_all(&stage)?;
    }
    let bin = stage.join("usr/bin/health-agent");
    fs::create_dir_all(bin.parent().unwrap_or(&stage))?;
    fs::copy(binary, &bin).map_err(|e| fail(format!("copying {}: {e}", binary.display())))?;
    run(Command::new("strip").arg("--strip-debug").arg(&bin))?;
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o755))?;

    let unit = fs::read(workspace.join("packaging/health-agent.service"))?;
    write(
        &stage.join("lib/systemd/system/health-agent.service"),
        &unit,
        0o644,
    )?;

    let defaults =
        String::from_utf8_lossy(&run(Command::new(&bin).args(["config", "print-defaults"]))?)
            .into_owned();
    if !defaults.contains("\n# socket-group:\n") {
        return Err(fail("print-defaults has no socket-group key"));
    }
    let config = defaults.replace("\n# socket-group:\n", "\nsocket-group: health-agent\n");
    write(
        &stage.join("etc/health-agent/config.yaml"),
        config.as_bytes(),
        0o644,
    )?;

    for (shell, path) in [
        ("bash", "usr/share/bash-completion/completions/health-agent"),
        ("zsh", "usr/share/zsh/vendor-completions/_health-agent"),
        (
            "fish",
            "usr/share/fish/vendor_completions.d/health-agent.fish",
        ),
    ] {
        let script = run(Command::new(&bin).args(["completions", shell]))?;
        write(&stage.join(path), &script, 0o644)?;
    }

    let man = stage.join("usr/share/man/man1");
    run(Command::new(&bin).args(["man", "--out-dir"]).arg(&man))?;
    for page in fs::read_dir(&man)? {
        let page = page?.path();
        fs::set_permissions(&page, fs::Permissions::from_mode(0o644))?;
        run(Command::new("gzip").args(["-9n"]).arg(&page))?;
    }

    let size_kib = dir_size(&stage)? / 1024;
    let debian = stage.join("DEBIAN");
    let control = format!(
        "Package: {NAME}\n\
         Version: {version}\n\
         Architecture: {arch}\n\
         Maintainer: health developers <health@localhost>\n\
         Depends: libc6\n\
         Section: net\n\
         Priority: optional\n\
         Installed-Size: {size_kib}\n\
         Description: eBPF node and endpoint health datapath\n \
         health-agent owns a health endpoint on every node, answers ICMP echo\n \
         in the kernel, and probes every other node (ICMP and HTTP).\n"
    );
    write(&debian.join("control"), control.as_bytes(), 0o644)?;
    write(
        &debian.join("conffiles"),
        b"/etc/health-agent/config.yaml\n",
        0o644,
    )?;
    write(&debian.join("postinst"), POSTINST.as_bytes(), 0o755)?;
    write(&debian.join("prerm"), PRERM.as_bytes(), 0o755)?;
    write(&debian.join("postrm"), POSTRM.as_bytes(), 0o755)?;

    let deb = out_dir.join(format!("{NAME}_{version}_{arch}.deb"));
    run(Command::new("dpkg-deb")
        .args(["--root-owner-group", "--build"])
        .arg(&stage)
        .arg(&deb))?;
    fs::remove_dir_all(&stage)?;
    let _ = io::stderr().flush();
    Ok(deb)
}

fn dir_size(dir: &Path) -> io::Result<u64> {
    let mut total = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            dir_size(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}
