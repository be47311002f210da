//! The client commands at their edges, run as a user runs them: a reader
//! that went away, a directory with nothing of the agent's.
#![allow(
    unused_crate_dependencies,
    reason = "an integration test sees every dependency of the agent"
)]

use std::process::{Command, Stdio};

#[test]
fn commands_writing_to_a_closed_pipe_end_quietly() {
    for args in [
        &["completions", "bash"][..],
        &["config", "print-defaults"][..],
    ] {
        let (reader, writer) = std::io::pipe().expect("pipe");
        // Gone before the first byte: every write fails with EPIPE.
        drop(reader);
        let out = Command::new(env!("CARGO_BIN_EXE_health-agent"))
            .args(args)
            .stdout(Stdio::from(writer))
            .stderr(Stdio::piped())
            .output()
            .expect("run health-agent");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {:?}: {stderr}", out.status);
        assert_eq!(stderr, "", "{args:?}: nothing to report");
    }
}

#[test]
fn listing_maps_where_none_is_pinned_fails_naming_the_directory() {
    let dir = std::env::temp_dir().join(format!("health-cli-no-pins-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let out = Command::new(env!("CARGO_BIN_EXE_health-agent"))
        .args(["bpf", "map", "list", "--bpffs-dir"])
        .arg(&dir)
        .output()
        .expect("run health-agent");
    let _ = std::fs::remove_dir(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "no map of the agent is pinned under {}",
            dir.display()
        )),
        "{stderr}"
    );
    assert_eq!(out.stdout, b"", "no empty table");
}

#[test]
fn an_xdp_peer_outside_native_xdp_is_refused_before_anything_is_attached() {
    let out = Command::new(env!("CARGO_BIN_EXE_health-agent"))
        .args([
            "responder",
            "run",
            "--iface",
            "lo",
            "--address",
            "198.18.0.2",
        ])
        .args(["--mode", "tc", "--xdp-peer", "peer0"])
        .output()
        .expect("run health-agent");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("--xdp-peer goes with --mode xdp-native") && stderr.contains("not tc"),
        "{stderr}"
    );
}

/// `health-agent daemon` as node n1 with a health CIDR and `args`, which
/// must make it refuse to start: what it said.
fn daemon_refused(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_health-agent"))
        .args([
            "daemon",
            "--node-name",
            "n1",
            "--health-cidr",
            "198.18.64.0/24",
        ])
        .args(args)
        .output()
        .expect("run health-agent");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    stderr
}

#[test]
fn allocations_without_etcd_are_refused_at_start() {
    for source in [&["--nodes-file", "/nonexistent/nodes.yaml"][..], &[]] {
        let args = [&["--kvstore-allocations"][..], source].concat();
        let stderr = daemon_refused(&args);
        assert!(
            stderr.contains("--kvstore-allocations needs --kvstore etcd"),
            "{stderr}"
        );
    }
}

#[test]
fn etcd_flags_without_etcd_and_crossed_sync_bounds_are_refused_at_start() {
    let cases: [(&[&str], &str); 4] = [
        (
            &["--kvstore-ca", "/nonexistent/ca.pem"],
            "--kvstore-ca is read only with --kvstore etcd",
        ),
        (
            &[
                "--nodes-file",
                "/nonexistent/nodes.yaml",
                "--kvstore-user",
                "n1",
                "--kvstore-password-file",
                "/nonexistent/pw",
            ],
            "--kvstore-user is read only with --kvstore etcd",
        ),
        (
            &["--sync-min-interval", "2m"],
            "--sync-min-interval 2m is longer than --sync-max-interval 1m",
        ),
        (
            &["--sync-min-interval", "61s", "--sync-max-interval", "1m"],
            "--sync-min-interval 1m 1s is longer",
        ),
    ];
    for (args, needle) in cases {
        let stderr = daemon_refused(args);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
    }
}

#[test]
fn a_node_name_no_record_could_hold_is_refused_at_start() {
    for (name, why) in [
        ("bad name", "is not a node name"),
        (&*"n".repeat(254), "more than 253"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_health-agent"))
            .args([
                "daemon",
                "--node-name",
                name,
                "--health-cidr",
                "198.18.64.0/24",
            ])
            .output()
            .expect("run health-agent");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains("--node-name (or the hostname): ") && stderr.contains(why),
            "{stderr}"
        );
    }
}
