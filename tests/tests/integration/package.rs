//! The Debian package (`cargo xtask package`, here from the binary under
//! test): it builds, Debian's `lintian` finds no error or warning in it or
//! its `-dbgsym` package, `dpkg -i` installs every file where the system
//! looks for it, `systemd-analyze verify` accepts the installed unit, and
//! `dpkg -r` / `dpkg --purge` take everything away again.

use std::{
    path::Path,
    process::{Command, Output},
};

use health_tests::{agent::agent_binary, names};

const FILES: [&str; 11] = [
    "/usr/bin/health-agent",
    "/usr/share/doc/health-agent/copyright",
    "/usr/share/doc/health-agent/changelog.gz",
    "/lib/systemd/system/health-agent.service",
    "/usr/share/bash-completion/completions/health-agent",
    "/usr/share/zsh/vendor-completions/_health-agent",
    "/usr/share/fish/vendor_completions.d/health-agent.fish",
    "/usr/share/man/man1/health-agent-daemon.1.gz",
    "/usr/share/health-agent/prometheus/health-alerts.yml",
    "/usr/share/health-agent/prometheus/health-alerts.test.yml",
    "/usr/share/health-agent/grafana/health-dashboard.json",
];
const CONFIG: &str = "/etc/health-agent/config.yaml";

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

fn ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn installed() -> bool {
    run(Command::new("dpkg-query").args(["-W", "-f=${Status}", "health-agent"]))
        .stdout
        .starts_with(b"install ok installed")
}

fn group_exists() -> bool {
    nix::unistd::Group::from_name("health-agent").is_ok_and(|g| g.is_some())
}

/// Debian's checker on both packages: no error (E:) or warning (W:).
fn lintian_accepts(debs: &xtask::package::Debs) {
    let out = run(Command::new("lintian")
        .args(["--tag-display-limit", "0"])
        .arg(&debs.package)
        .arg(&debs.dbgsym));
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let faults: Vec<&str> = report
        .lines()
        .filter(|l| l.starts_with("E: ") || l.starts_with("W: "))
        .collect();
    assert!(
        faults.is_empty(),
        "lintian found {} errors or warnings:\n{}\n(all of its output:\n{report})",
        faults.len(),
        faults.join("\n")
    );
    // Exit status 0 means it ran and found no error (its own failures
    // print no tag and exit 1 or 2).
    assert!(out.status.success(), "lintian: {}\n{report}", out.status);
}

/// Purges the package if the test stops half-way.
struct Purge;

impl Drop for Purge {
    fn drop(&mut self) {
        let _ = Command::new("dpkg")
            .args(["--purge", "health-agent"])
            .output();
    }
}

#[test]
fn the_debian_package_installs_verifies_and_removes_cleanly() {
    health_tests::require_root();
    assert!(
        !installed() && !Path::new(FILES[0]).exists(),
        "health-agent is installed on this machine already: the test would remove it"
    );
    let out = std::env::temp_dir().join(names::unique("deb"));
    std::fs::create_dir_all(&out).expect("out dir");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let debs =
        xtask::package::build_deb(&agent_binary(), &workspace, &out).expect("build the .deb");
    let deb = &debs.package;
    lintian_accepts(&debs);
    let symbols = ok(Command::new("dpkg-deb").arg("--contents").arg(&debs.dbgsym));
    assert!(
        symbols.contains("./usr/lib/debug/.build-id/"),
        "no symbols by build ID in:\n{symbols}"
    );
    let contents = ok(Command::new("dpkg-deb").arg("--contents").arg(deb));
    for f in FILES.iter().chain([&CONFIG]) {
        assert!(
            contents.contains(&format!(".{f}\n")),
            "{f} not in:\n{contents}"
        );
    }

    let _purge = Purge;
    ok(Command::new("dpkg").arg("-i").arg(deb));
    assert!(installed());
    for f in FILES.iter().chain([&CONFIG]) {
        assert!(Path::new(f).is_file(), "{f} not installed");
    }
    assert!(group_exists(), "no health-agent group");
    // Stripped (no symbol table), its symbols in the -dbgsym package.
    let sections = ok(Command::new("readelf").args(["-S", "-W", FILES[0]]));
    assert!(!sections.contains(".symtab"), "{sections}");
    // DEP-5, every compiled-in crate under its license, each license's text.
    let copyright = std::fs::read_to_string(FILES[1]).expect("copyright");
    for line in [
        "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n",
        "\nFiles: *\n",
        "\nLicense: MIT or Apache-2.0\n",
        " vendor/tokio-",
        "\nLicense: MIT\n Permission is hereby granted",
        "\nLicense: Apache-2.0\n On Debian systems",
    ] {
        assert!(copyright.contains(line), "{line:?} not in:\n{copyright}");
    }
    // The installed alert rules load, and pass their own tests.
    let rules = ok(Command::new("promtool").args(["check", "rules", FILES[8]]));
    assert!(rules.contains("SUCCESS: 8 rules found"), "{rules}");
    let tested = ok(Command::new("promtool").args(["test", "rules", FILES[9]]));
    assert!(tested.contains("SUCCESS"), "{tested}");
    let version = ok(Command::new("/usr/bin/health-agent").arg("--version"));
    assert!(version.starts_with("health-agent "), "{version}");
    // The packaged config is the defaults, with the socket for the group.
    let check = ok(Command::new("/usr/bin/health-agent").args(["config", "check", CONFIG]));
    assert!(check.contains("valid"), "{check}");
    let config = std::fs::read_to_string(CONFIG).expect("config");
    assert!(
        config.contains("\nsocket-group: health-agent\n"),
        "{config}"
    );
    // Man pages are checked above; `man` itself need not be installed.
    ok(Command::new("systemd-analyze").args([
        "verify",
        "--man=no",
        "/lib/systemd/system/health-agent.service",
    ]));

    ok(Command::new("dpkg").args(["-r", "health-agent"]));
    for f in FILES {
        assert!(!Path::new(f).exists(), "{f} left by dpkg -r");
    }
    // A conffile stays until purge, as Debian policy wants.
    assert!(Path::new(CONFIG).exists());
    ok(Command::new("dpkg").args(["--purge", "health-agent"]));
    assert!(!Path::new(CONFIG).exists(), "{CONFIG} left by purge");
    assert!(!Path::new("/etc/health-agent").exists());
    assert!(!group_exists(), "group left by purge");
    assert!(!installed());
    let _ = std::fs::remove_dir_all(&out);
}
