//! The Debian package, built with `dpkg-deb` from a staged tree: the
//! binary (stripped, its symbols in a `-dbgsym` package beside it), the
//! systemd unit, the default config (`health-agent config print-defaults`,
//! with the socket handed to the `health-agent` group), the bash/zsh/fish
//! completions and the man pages, all made by the binary itself from its
//! CLI definition; the copyright file (every compiled-in crate's license,
//! from cargo's metadata) and the changelog; maintainer scripts as
//! debhelper writes them. Debian's `lintian` accepts it (the package test
//! runs it).
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

/// Who answers for the package (`DEBFULLNAME <DEBEMAIL>` when both are set,
/// as Debian's own tools take them).
const MAINTAINER: &str = "health maintainers <maintainers@health-agent.example>";

const UNIT: &str = "health-agent.service";

// The maintainer scripts are what debhelper's `dh_installsystemd
// --no-enable --no-start` writes (deb-systemd-helper keeps the unit's
// enablement state, deb-systemd-invoke honours policy-rc.d): the unit is
// not enabled or started on install, since a node needs its settings
// first; it is restarted on upgrade if it runs, stopped on removal, and
// forgotten on purge. Plus the system group, created on install and
// removed with the state on purge.
const POSTINST: &str = r#"#!/bin/sh
set -e
if [ "$1" = configure ]; then
    getent group health-agent >/dev/null || groupadd --system health-agent
fi
if [ "$1" = "configure" ] || [ "$1" = "abort-upgrade" ] || [ "$1" = "abort-deconfigure" ] || [ "$1" = "abort-remove" ] ; then
    if deb-systemd-helper debian-installed 'health-agent.service'; then
        deb-systemd-helper unmask 'health-agent.service' >/dev/null || true
        if deb-systemd-helper --quiet was-enabled 'health-agent.service'; then
            deb-systemd-helper enable 'health-agent.service' >/dev/null || true
        fi
    fi
    deb-systemd-helper update-state 'health-agent.service' >/dev/null || true
fi
if [ "$1" = "configure" ] || [ "$1" = "abort-upgrade" ] || [ "$1" = "abort-deconfigure" ] || [ "$1" = "abort-remove" ] ; then
    if [ -z "${DPKG_ROOT:-}" ] && [ -d /run/systemd/system ]; then
        systemctl --system daemon-reload >/dev/null || true
        if [ -n "$2" ]; then
            deb-systemd-invoke try-restart 'health-agent.service' >/dev/null || true
        fi
    fi
fi
"#;

const PRERM: &str = r#"#!/bin/sh
set -e
if [ -z "${DPKG_ROOT:-}" ] && [ "$1" = remove ] && [ -d /run/systemd/system ] ; then
    deb-systemd-invoke stop 'health-agent.service' >/dev/null || true
fi
"#;

const POSTRM: &str = r#"#!/bin/sh
set -e
if [ "$1" = remove ] && [ -d /run/systemd/system ] ; then
    systemctl --system daemon-reload >/dev/null || true
fi
if [ "$1" = "purge" ]; then
    if [ -x "/usr/bin/deb-systemd-helper" ]; then
        deb-systemd-helper purge 'health-agent.service' >/dev/null || true
    fi
    rm -rf /var/lib/health-agent
    if getent group health-agent >/dev/null; then
        groupdel health-agent || true
    fi
fi
"#;

/// The packages `build_deb` made.
#[derive(Debug, Clone)]
pub struct Debs {
    /// `health-agent_<version>_<arch>.deb`.
    pub package: PathBuf,
    /// `health-agent-dbgsym_<version>_<arch>.deb`: the binary's symbols,
    /// found by its build ID, as Debian ships them.
    pub dbgsym: PathBuf,
}

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

/// Every directory under `stage` (itself included) mode 0755, whatever
/// the builder's umask made them: 0775 fails lintian, 0700 dpkg-deb.
fn dirs_0755(dir: &Path) -> io::Result<()> {
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755))?;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            dirs_0755(&entry.path())?;
        }
    }
    Ok(())
}

fn write(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    fs::write(path, contents).map_err(|e| fail(format!("writing {}: {e}", path.display())))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

fn maintainer() -> String {
    match (std::env::var("DEBFULLNAME"), std::env::var("DEBEMAIL")) {
        (Ok(name), Ok(mail)) if !name.trim().is_empty() && mail.contains('@') => {
            format!("{} <{}>", name.trim(), mail.trim())
        }
        _ => MAINTAINER.to_owned(),
    }
}

/// Splits `bin` as Debian's `dh_strip` does: its symbols into `debug`, then
/// everything but what runs stripped from it, with a link to `debug`.
/// Returns the binary's build ID, by which debuggers find the symbols.
fn strip(bin: &Path, debug: &Path) -> io::Result<String> {
    let notes = run(Command::new("readelf").arg("--notes").arg(bin))?;
    let build_id = String::from_utf8_lossy(&notes)
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .map(|id| id.trim().to_owned())
        .filter(|id| id.len() > 2 && id.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| fail(format!("{} has no build ID note", bin.display())))?;
    if let Some(dir) = debug.parent() {
        fs::create_dir_all(dir)?;
    }
    run(Command::new("objcopy")
        .args(["--only-keep-debug", "--compress-debug-sections"])
        .arg(bin)
        .arg(debug))?;
    fs::set_permissions(debug, fs::Permissions::from_mode(0o644))?;
    run(Command::new("strip")
        .args(["--remove-section=.comment", "--remove-section=.note"])
        .arg(bin))?;
    run(Command::new("objcopy")
        .arg(format!("--add-gnu-debuglink={}", debug.display()))
        .arg(bin))?;
    Ok(build_id)
}

/// The changelog (Debian's format, as a native package ships it), checked
/// to be this version's.
fn changelog(workspace: &Path, version: &str) -> io::Result<Vec<u8>> {
    let path = workspace.join("packaging/changelog");
    let text = fs::read(&path).map_err(|e| fail(format!("reading {}: {e}", path.display())))?;
    let head = format!("{NAME} ({version}) ");
    if !text.starts_with(head.as_bytes()) {
        return Err(fail(format!(
            "{} does not start with an entry for {NAME} {version} (`{head}...`)",
            path.display()
        )));
    }
    Ok(text)
}

/// `DEBIAN/md5sums` of the staged tree, as `dh_md5sums` writes it.
fn md5sums(stage: &Path) -> io::Result<Vec<u8>> {
    run(Command::new("sh").current_dir(stage).args([
        "-c",
        "find . -type f ! -path './DEBIAN/*' -printf '%P\\0' | LC_ALL=C sort -z | xargs -0r md5sum",
    ]))
}

fn control(fields: &[(&str, String)], description: &str) -> String {
    let mut out = String::new();
    for (k, v) in fields {
        out.push_str(k);
        out.push_str(": ");
        out.push_str(v);
        out.push('\n');
    }
    out.push_str("Description: ");
    out.push_str(description);
    out.push('\n');
    out
}

fn dpkg_deb(stage: &Path, deb: &Path) -> io::Result<()> {
    write(&stage.join("DEBIAN/md5sums"), &md5sums(stage)?, 0o644)?;
    dirs_0755(stage)?;
    run(Command::new("dpkg-deb")
        .args(["--root-owner-group", "-Zxz", "--build"])
        .arg(stage)
        .arg(deb))?;
    fs::remove_dir_all(stage)
}

/// The configuration, completions and man pages `bin` makes, in `stage`.
fn generated(bin: &Path, stage: &Path) -> io::Result<()> {
    let defaults =
        String::from_utf8_lossy(&run(Command::new(bin).args(["config", "print-defaults"]))?)
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
        let script = run(Command::new(bin).args(["completions", shell]))?;
        write(&stage.join(path), &script, 0o644)?;
    }

    let man = stage.join("usr/share/man/man1");
    run(Command::new(bin).args(["man", "--out-dir"]).arg(&man))?;
    for page in fs::read_dir(&man)? {
        let page = page?.path();
        fs::set_permissions(&page, fs::Permissions::from_mode(0o644))?;
        run(Command::new("gzip").args(["-9n"]).arg(&page))?;
    }

    Ok(())
}

/// The `-dbgsym` package of the package whose control `fields` are given:
/// the symbols in `debug`, under `/usr/lib/debug/.build-id` as `dh_strip`
/// puts them.
fn dbgsym(
    out_dir: &Path,
    debug: &Path,
    build_id: &str,
    fields: &[(&str, String)],
) -> io::Result<PathBuf> {
    let field = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    let (version, arch, maintainer) =
        (field("Version"), field("Architecture"), field("Maintainer"));
    let dbg_stage = out_dir.join(format!("{NAME}-dbgsym_{version}_{arch}"));
    if dbg_stage.exists() {
        fs::remove_dir_all(&dbg_stage)?;
    }
    let (dir, file) = build_id.split_at(2);
    let target = dbg_stage.join(format!("usr/lib/debug/.build-id/{dir}/{file}.debug"));
    if let Some(parent) = target.parent() {
        fs::create_dir_all(parent)?;
    }
    fs::rename(debug, &target).or_else(|_| fs::copy(debug, &target).map(drop))?;
    let _ = fs::remove_file(debug);
    fs::create_dir_all(dbg_stage.join("usr/share/doc"))?;
    std::os::unix::fs::symlink(
        NAME,
        dbg_stage
            .join("usr/share/doc")
            .join(format!("{NAME}-dbgsym")),
    )?;
    let size_kib = (dir_size(&dbg_stage)? / 1024).to_string();
    let fields = [
        ("Package", format!("{NAME}-dbgsym")),
        ("Source", NAME.to_owned()),
        ("Version", version.clone()),
        ("Auto-Built-Package", "debug-symbols".to_owned()),
        ("Architecture", arch.clone()),
        ("Maintainer", maintainer),
        ("Installed-Size", size_kib),
        ("Depends", format!("{NAME} (= {version})")),
        ("Section", "debug".to_owned()),
        ("Priority", "optional".to_owned()),
        ("Build-Ids", build_id.to_owned()),
    ];
    write(
        &dbg_stage.join("DEBIAN/control"),
        control(&fields, &format!("debug symbols for {NAME}")).as_bytes(),
        0o644,
    )?;
    let dbgsym = out_dir.join(format!("{NAME}-dbgsym_{version}_{arch}.deb"));
    dpkg_deb(&dbg_stage, &dbgsym)?;
    Ok(dbgsym)
}

/// Builds `health-agent_<version>_<arch>.deb` and its `-dbgsym` package in
/// `out_dir` from `binary` and `packaging/` under `workspace`.
pub fn build_deb(binary: &Path, workspace: &Path, out_dir: &Path) -> io::Result<Debs> {
    let version = env!("CARGO_PKG_VERSION");
    let arch = String::from_utf8_lossy(&run(Command::new("dpkg").arg("--print-architecture"))?)
        .trim()
        .to_owned();
    let maintainer = maintainer();
    let stage = out_dir.join(format!("{NAME}_{version}_{arch}"));
    if stage.exists() {
        fs::remove_dir_all(&stage)?;
    }
    let bin = stage.join("usr/bin/health-agent");
    fs::create_dir_all(bin.parent().unwrap_or(&stage))?;
    fs::copy(binary, &bin).map_err(|e| fail(format!("copying {}: {e}", binary.display())))?;
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o755))?;
    let debug = out_dir.join(format!("{NAME}_{version}_{arch}.debug"));
    let build_id = strip(&bin, &debug)?;

    let unit = fs::read(workspace.join("packaging").join(UNIT))?;
    write(&stage.join("lib/systemd/system").join(UNIT), &unit, 0o644)?;

    generated(&bin, &stage)?;

    // Alert rules and a dashboard, for the operator's Prometheus and
    // Grafana to load from here.
    let share = stage.join("usr/share").join(NAME);
    for file in [
        "prometheus/health-alerts.yml",
        "prometheus/health-alerts.test.yml",
        "grafana/health-dashboard.json",
    ] {
        let text = fs::read(workspace.join("packaging").join(file))
            .map_err(|e| fail(format!("reading packaging/{file}: {e}")))?;
        write(&share.join(file), &text, 0o644)?;
    }

    // The only override, with its reason, read by lintian from here.
    let overrides = fs::read(workspace.join("packaging/lintian-overrides"))?;
    write(
        &stage.join("usr/share/lintian/overrides").join(NAME),
        &overrides,
        0o644,
    )?;

    let doc = stage.join("usr/share/doc").join(NAME);
    let copyright = crate::copyright::copyright(workspace, &maintainer)?;
    write(&doc.join("copyright"), copyright.as_bytes(), 0o644)?;
    write(
        &doc.join("changelog.Debian"),
        &changelog(workspace, version)?,
        0o644,
    )?;
    run(Command::new("gzip")
        .args(["-9n"])
        .arg(doc.join("changelog.Debian")))?;
    // A native package's changelog is changelog.gz.
    fs::rename(doc.join("changelog.Debian.gz"), doc.join("changelog.gz"))?;

    let debian = stage.join("DEBIAN");
    let size_kib = (dir_size(&stage)? / 1024).to_string();
    let fields = [
        ("Package", NAME.to_owned()),
        ("Version", version.to_owned()),
        ("Architecture", arch.clone()),
        ("Maintainer", maintainer),
        ("Installed-Size", size_kib),
        ("Depends", "libc6".to_owned()),
        ("Section", "net".to_owned()),
        ("Priority", "optional".to_owned()),
    ];
    let description = "eBPF node and endpoint health datapath\n \
         health-agent owns a health endpoint on every node, answers ICMP echo\n \
         in the kernel, and probes every other node (ICMP and HTTP).";
    write(
        &debian.join("control"),
        control(&fields, description).as_bytes(),
        0o644,
    )?;
    write(
        &debian.join("conffiles"),
        b"/etc/health-agent/config.yaml\n",
        0o644,
    )?;
    write(&debian.join("postinst"), POSTINST.as_bytes(), 0o755)?;
    write(&debian.join("prerm"), PRERM.as_bytes(), 0o755)?;
    write(&debian.join("postrm"), POSTRM.as_bytes(), 0o755)?;
    let package = out_dir.join(format!("{NAME}_{version}_{arch}.deb"));
    dpkg_deb(&stage, &package)?;

    let dbgsym = dbgsym(out_dir, &debug, &build_id, &fields)?;
    let _ = io::stderr().flush();
    Ok(Debs { package, dbgsym })
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
