//! `cargo xtask test --kernel 6.1|6.12`: the root integration tests that
//! matter for kernel compatibility, run on Debian bookworm's own kernel
//! packages booted in QEMU with virtme-ng. The guest sees the host's
//! filesystem (9p, read-only but for an overlay) and runs the host's test
//! binary and agent; only the kernel differs.
//!
//! Under TCG (no nested KVM on the project's machines; `HEALTH_VM_KVM=1`
//! uses KVM where it works) the guest is several times slower than the host, so the selection is focused ([`selection`])
//! and the tests' deadlines are stretched (`HEALTH_TEST_TIME_SCALE`).
//! Unix sockets cannot live on 9p: the guest mounts a tmpfs on /tmp (or, when
//! the workspace itself is under /tmp, on /mnt), where the tests keep their
//! sockets, pidfiles and state.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use crate::{cmd, setup::Apt};

/// A kernel of the matrix: a Debian bookworm package, pinned, with a
/// pattern to fall back on when the archive no longer carries the pin (the
/// security archive drops old ABIs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Kernel {
    pub name: &'static str,
    package: &'static str,
    /// `apt-cache search --names-only` regex of the same series.
    series: &'static str,
    /// Whether the kernel has tcx links (tests that force tcx run only there).
    tcx: bool,
    /// Whether the WireGuard tests run on it (the host's kernel has no
    /// WireGuard: they are ignored there and run here).
    wireguard: bool,
}

pub(crate) const KERNELS: [Kernel; 2] = [
    Kernel {
        name: "6.1",
        package: "linux-image-6.1.0-47-amd64-unsigned",
        series: r"^linux-image-6\.1\.0-[0-9]+-amd64-unsigned$",
        tcx: false,
        wireguard: false,
    },
    Kernel {
        name: "6.12",
        package: "linux-image-6.12.117+deb12-amd64-unsigned",
        series: r"^linux-image-6\.12\.[0-9]+\+deb12-amd64-unsigned$",
        tcx: true,
        wireguard: true,
    },
];

pub(crate) fn kernel(name: &str) -> anyhow::Result<Kernel> {
    KERNELS
        .iter()
        .find(|k| k.name == name)
        .copied()
        .with_context(|| format!("no kernel {name:?} in the matrix: use 6.1, 6.12 or host"))
}

/// Debian packages the guests need: QEMU, `depmod`, the initramfs's
/// busybox, and udev (virtme-ng finds its virtio-serial ports through it;
/// without, the guest's exit code is lost).
const VM_PACKAGES: &[&str] = &["qemu-system-x86", "kmod", "busybox-static", "udev"];
/// virtme-ng from PyPI, pinned.
const VIRTME_NG: &str = "virtme-ng==1.42";

/// The focused selection (exact test names): echo on every hook the
/// kernel has, the endpoint's life (ready, echo in eBPF, tc filters
/// coexisting/repaired/replaced/removed, SIGTERM), CT, NAT and RTT, and a
/// 3-node cluster. About 6 minutes per kernel under TCG.
#[must_use]
pub(crate) fn selection(k: &Kernel) -> Vec<&'static str> {
    let mut tests = vec![
        "echo_test_run::valid_echo_request_becomes_the_exact_reply",
        "echo_netns::tc_answers_every_request",
        "echo_netns::tc_treats_every_frame_class_as_the_kernel_does",
        "echo_netns::tc_replies_out_of_a_veth_whose_peer_shares_its_namespace",
        "echo_netns::xdp_generic_answers_every_request",
        "attach::auto_attach_uses_tcx_where_the_kernel_has_it_and_says_so",
        "attach::classic_tc_filters_coexist_are_repaired_replaced_after_kill_9_and_removed_on_sigterm",
        "endpoint::sigterm_leaves_nothing_behind",
        "nat_test_run::an_echo_is_masqueraded_and_its_reply_translated_back",
        "nat_test_run::the_later_fragments_of_a_masqueraded_datagram_follow_its_first",
        "datapath::ct_counts_rtt_expiry_losses_and_bpftool_agree",
        "cluster::three_nodes_reach_three_of_three_and_sigterm_leaves_nothing",
    ];
    if k.tcx {
        tests.insert(4, "echo_netns::tcx_answers_every_request");
    }
    if k.wireguard {
        tests.push("encryption::wireguard_paths_are_encrypted_and_each_fault_is_named");
        tests.push(
            "encryption::ipv6_health_addresses_left_out_of_allowed_ips_are_not_covered_and_named",
        );
    }
    tests
}

pub(crate) fn ensure_tools(apt: &mut Apt) -> anyhow::Result<()> {
    apt.ensure(VM_PACKAGES)?;
    if Command::new("vng").arg("--version").output().is_err() {
        cmd::run(Command::new("pip").args([
            "install",
            "--quiet",
            "--root-user-action=ignore",
            VIRTME_NG,
        ]))?;
    }
    Ok(())
}

/// The kernel's files under `target/vm-kernels/PACKAGE` (downloaded and
/// unpacked once, modules indexed for the guest), and its release.
pub(crate) fn ensure_kernel(root: &Path, k: &Kernel) -> anyhow::Result<(PathBuf, String)> {
    let cache = root.join("target/vm-kernels");
    std::fs::create_dir_all(&cache).context("creating target/vm-kernels")?;
    let package = available(k)?;
    let dir = cache.join(&package);
    let ready = dir.join(".ready");
    if !ready.exists() {
        eprintln!("xtask: fetching {package}");
        cmd::run(
            Command::new("apt-get")
                .current_dir(&cache)
                .args(["download", "-q", &package]),
        )?;
        let deb = std::fs::read_dir(&cache)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&format!("{package}_")))
                    && p.extension().is_some_and(|e| e == "deb")
            })
            .with_context(|| format!("apt-get download left no {package}_*.deb"))?;
        let _ = std::fs::remove_dir_all(&dir);
        cmd::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&dir))?;
        let release = release_in(&dir)?;
        cmd::run(Command::new("depmod").arg("-b").arg(&dir).arg(&release))?;
        std::fs::remove_file(&deb).ok();
        std::fs::write(&ready, &release)?;
    }
    let release = release_in(&dir)?;
    Ok((dir, release))
}

/// The pinned package, or the newest of its series the archive has.
fn available(k: &Kernel) -> anyhow::Result<String> {
    let shown = cmd::output(Command::new("apt-cache").args(["show", "-q", k.package]))?;
    if shown.status.success() && !shown.stdout.is_empty() {
        return Ok(k.package.to_owned());
    }
    let found = cmd::output(Command::new("apt-cache").args(["search", "--names-only", k.series]))?;
    let mut names: Vec<String> = String::from_utf8_lossy(&found.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
        .collect();
    names.sort_by_key(|n| version_key(n));
    let newest = names.pop().with_context(|| {
        format!(
            "neither {} nor any package matching {} is in the apt sources (apt-get update?)",
            k.package, k.series
        )
    })?;
    eprintln!(
        "xtask: {} is gone from the archive; using {newest}",
        k.package
    );
    Ok(newest)
}

/// A guest that ended within [`FAST_FAILURE`] of its start, unsuccessfully:
/// too soon for any test of the selection to have run.
#[derive(Debug)]
struct FastFailure(Duration);

impl std::fmt::Display for FastFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the guest ended unsuccessfully {:.0?} after its start, before a test could run",
            self.0
        )
    }
}

/// Booting a guest under TCG takes several seconds and the selection
/// minutes.
const FAST_FAILURE: Duration = Duration::from_secs(30);

/// How much of the guest kernel's console a boot shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Console {
    /// Emergencies, and the whole trace of an oops or a panic.
    Emergencies,
    /// Every message from the first: where a boot stopped.
    Full,
}

/// Exit code of virtme-ng for a guest that ended without its script's
/// exit code: the guest kernel panicked (`panic=-1`) or QEMU ended.
const GUEST_LOST: i32 = 255;

/// Why a failed boot is worth a second one, and how much of the console
/// that one shows; `None` for a failure of the tests themselves.
fn second_boot(e: &anyhow::Error) -> Option<(String, Console)> {
    if cmd::interrupted() {
        return None;
    }
    if let Some(fast) = e.downcast_ref::<FastFailure>() {
        return Some((fast.to_string(), Console::Full));
    }
    let exited = e.downcast_ref::<cmd::Exited>()?;
    (exited.status.code() == Some(GUEST_LOST)).then(|| {
        (
            "the guest ended without its tests' exit code: its kernel panicked \
             (the trace is above) or QEMU ended"
                .to_owned(),
            Console::Emergencies,
        )
    })
}

/// One boot of `vmlinuz` running the guest script, showing `console` of the
/// guest kernel's console on stderr.
#[expect(
    clippy::too_many_arguments,
    reason = "one call site with a retry: a struct would only rename them"
)]
fn boot(
    vmlinuz: &Path,
    dir: &Path,
    script_path: &Path,
    kvm: bool,
    release: &str,
    k: &Kernel,
    tests: usize,
    console: Console,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut vng = Command::new("vng");
    vng.arg("--run")
        .arg(vmlinuz)
        .args(["--force-9p", "--memory", "2G", "--cpus", "2"])
        .arg("--rwdir")
        .arg(dir)
        .arg("--exec")
        .arg(format!("sh {}", shell_quote(script_path)));
    if !kvm {
        vng.arg("--disable-kvm");
    }
    // The guest kernel's console goes to stderr; at `loglevel=1` it shows
    // emergencies only, and an oops or a panic raises the level to print
    // its whole trace.
    vng.arg("--verbose");
    if matches!(console, Console::Emergencies) {
        vng.args(["--append", "loglevel=1"]);
    }
    // virtme-ng reopens the guest console's output: given our stdout as it
    // is, it truncated a log file that stdout was redirected to (everything
    // CI had printed before the guest was lost). Through pipes it cannot.
    vng.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    eprintln!(
        "xtask: Linux {release} ({}) under {}: {tests} tests",
        k.name,
        if kvm { "KVM" } else { "TCG" },
    );
    let result = cmd::run_forwarding_signals(&mut vng);
    let took = started.elapsed();
    eprintln!(
        "xtask: Linux {release}: {} in {took:.0?}",
        if result.is_ok() { "passed" } else { "FAILED" },
    );
    match result {
        Err(e) if took < FAST_FAILURE && !cmd::interrupted() => Err(e.context(FastFailure(took))),
        other => other,
    }
}

/// The host's memory and the kernel's last words, for a guest that failed.
fn host_state() {
    for (what, cmd) in [
        ("memory", "free -m"),
        ("kernel log", "dmesg 2>/dev/null | tail -n 15"),
        ("QEMU processes", "pgrep -a qemu || true"),
    ] {
        match Command::new("sh").args(["-c", cmd]).output() {
            Ok(out) => eprintln!(
                "xtask: host {what}:\n{}",
                String::from_utf8_lossy(&out.stdout).trim_end()
            ),
            Err(e) => eprintln!("xtask: host {what}: {e}"),
        }
    }
}

/// Numbers of a package name, for ordering versions.
fn version_key(name: &str) -> Vec<u64> {
    name.split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse().ok())
        .collect()
}

fn release_in(dir: &Path) -> anyhow::Result<String> {
    let modules = dir.join("lib/modules");
    std::fs::read_dir(&modules)
        .with_context(|| format!("reading {}", modules.display()))?
        .filter_map(Result::ok)
        .find_map(|e| e.file_name().to_str().map(str::to_owned))
        .with_context(|| format!("no kernel release under {}", modules.display()))
}

/// The integration test binary of the current build (`cargo test --no-run`
/// prints it).
pub(crate) fn build_tests(root: &Path) -> anyhow::Result<PathBuf> {
    cmd::cargo(root, &["build", "--workspace", "--bins"])?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = cmd::output(Command::new(cargo).current_dir(root).args([
        // --workspace as the host run: the same features, so nothing is
        // rebuilt after it.
        "test",
        "--workspace",
        "--test",
        "integration",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]))?;
    if !out.status.success() {
        bail!(
            "building the integration tests failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split("\"executable\":\"").nth(1))
        .filter_map(|rest| rest.split('"').next())
        .find(|p| {
            Path::new(p)
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("integration-"))
        })
        .map(PathBuf::from)
        .context("cargo test --no-run named no integration test binary")
}

/// Boots `k` and runs `tests` (exact names; empty: the kernel's
/// [`selection`]) in it. The guest's exit code is the tests'.
pub(crate) fn run(root: &Path, k: &Kernel, binary: &Path, tests: &[String]) -> anyhow::Result<()> {
    let (dir, release) = ensure_kernel(root, k)?;
    let vmlinuz = dir.join(format!("boot/vmlinuz-{release}"));
    // TCG unless asked: on the project's machines /dev/kvm opens but
    // nested KVM fails at the first vCPU setup.
    let kvm = std::env::var("HEALTH_VM_KVM").is_ok_and(|v| v == "1");
    // TCG runs the guest several times slower than the host.
    let scale = if kvm { "2" } else { "6" };
    // Ignored tests run too: those that need what the host's kernel
    // lacks (WireGuard) are ignored there, and selected here by name.
    let (args, exact) = if tests.is_empty() {
        (
            selection(k).into_iter().map(str::to_owned).collect(),
            " --exact --include-ignored",
        )
    } else {
        (tests.to_vec(), " --include-ignored")
    };
    let mut script = String::from("set -u\n");
    // Sockets and pidfiles cannot live on 9p: the tests' temporary files go
    // to a tmpfs of the guest's own, on the first of these directories that
    // does not hold the workspace (a checkout under /tmp, as CI's may be,
    // must stay visible).
    let _ = writeln!(
        script,
        "for d in /tmp /mnt /media /srv; do case {}/ in \"$d\"/*) continue;; esac; \
         [ -d \"$d\" ] && TMPFS=\"$d\" && break; done",
        shell_quote(root)
    );
    script.push_str("mount -t tmpfs -o mode=1777 tmpfs \"$TMPFS\"\n");
    script.push_str("mkdir -p /run/netns\n");
    // As systemd does on a booted host.
    script.push_str("mountpoint -q /sys/fs/bpf || mount -t bpf -o mode=0700 bpf /sys/fs/bpf\n");
    let _ = writeln!(
        script,
        "export TMPDIR=\"$TMPFS\" HEALTH_TEST_TIME_SCALE={scale} RUST_BACKTRACE=1"
    );
    script.push_str("echo \"guest: Linux $(uname -r), $(nproc) CPUs\"\n");
    let _ = writeln!(script, "cd {}", shell_quote(&root.join("tests")));
    let _ = write!(
        script,
        "exec {} --test-threads=1{exact}",
        shell_quote(binary)
    );
    for t in &args {
        let _ = write!(script, " {}", shell_quote(Path::new(t)));
    }
    script.push('\n');
    let vm_dir = root.join("target/vm");
    std::fs::create_dir_all(&vm_dir)?;
    let script_path = vm_dir.join(format!("guest-{}.sh", k.name));
    std::fs::write(&script_path, script)?;

    let boot_once = |console| {
        boot(
            &vmlinuz,
            &dir,
            &script_path,
            kvm,
            &release,
            k,
            args.len(),
            console,
        )
    };
    let mut result = boot_once(Console::Emergencies);
    if let Some((why, console)) = result.as_ref().err().and_then(second_boot) {
        // One more boot tells a rare fault of the guest or of QEMU, which
        // passes, from a fault of the tests or the agent, which fails again.
        eprintln!("xtask: {why}; booting Linux {release} once more");
        host_state();
        std::thread::sleep(Duration::from_secs(5));
        result = boot_once(console);
    }
    if result.is_err() {
        host_state();
    }
    result.with_context(|| format!("the tests on Linux {release} ({})", k.name))
}

fn shell_quote(p: &Path) -> String {
    format!("'{}'", p.display().to_string().replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_of_the_matrix_runs_echo_endpoint_datapath_and_a_cluster() {
        for k in KERNELS {
            let s = selection(&k);
            for area in [
                "echo_",
                "attach::",
                "endpoint::",
                "datapath::",
                "nat_",
                "cluster::",
            ] {
                assert!(s.iter().any(|t| t.starts_with(area)), "{}: {area}", k.name);
            }
            assert_eq!(
                s.iter().any(|t| t.contains("::tcx_")),
                k.tcx,
                "{}: tcx-only tests only where tcx exists",
                k.name
            );
        }
    }

    fn exited(code: i32) -> anyhow::Error {
        use std::os::unix::process::ExitStatusExt as _;
        cmd::Exited {
            cmd: "vng".into(),
            status: std::process::ExitStatus::from_raw(code << 8),
        }
        .into()
    }

    #[test]
    fn a_lost_guest_boots_again_and_failing_tests_do_not() {
        let (why, console) = second_boot(&exited(GUEST_LOST)).expect("a panic boots again");
        assert!(why.contains("panicked"), "{why}");
        assert_eq!(console, Console::Emergencies);
        // The tests' own failure (libtest exits 101) is the answer.
        assert!(second_boot(&exited(101)).is_none());
        assert!(second_boot(&anyhow::anyhow!("vng not found")).is_none());
        // Gone before a test could run: the whole console, to see where.
        let fast = exited(1).context(FastFailure(Duration::from_secs(3)));
        assert_eq!(second_boot(&fast).map(|(_, c)| c), Some(Console::Full));
        let fast_panic = exited(GUEST_LOST).context(FastFailure(Duration::from_secs(3)));
        assert_eq!(
            second_boot(&fast_panic).map(|(_, c)| c),
            Some(Console::Full)
        );
    }

    #[test]
    fn newest_version_sorts_last() {
        let mut v = [
            "linux-image-6.1.0-9-amd64-unsigned",
            "linux-image-6.1.0-47-amd64-unsigned",
            "linux-image-6.1.0-10-amd64-unsigned",
        ];
        v.sort_by_key(|n| version_key(n));
        assert_eq!(v[2], "linux-image-6.1.0-47-amd64-unsigned");
    }

    #[test]
    fn unknown_kernels_are_refused_naming_the_choices() {
        let err = kernel("5.10").expect_err("not in the matrix").to_string();
        assert!(err.contains("6.1, 6.12 or host"), "{err}");
    }
}
