//! `health-agent daemon --config FILE`: the file's settings reach a real
//! agent, and SIGHUP applies each reloadable one (probe interval, timeout,
//! thresholds, log level) at run time, names the others as needing a
//! restart, and keeps the running settings when the file is refused.

use std::{
    fs,
    path::Path,
    time::{Duration, Instant},
};

use health_agent::probe::{path::ProbeResult, status::ClusterStatus};
use health_tests::{agent::AgentNode, api};
use nix::sys::signal::Signal;

/// A node that answers nothing: on the node's link, no neighbour.
const SILENT: &str = "198.18.0.99";

fn status(node: &AgentNode) -> Option<ClusterStatus> {
    api::call(&node.socket(), |c| async move { c.status().await }).ok()
}

/// Waits until the published status satisfies `accept`.
fn wait_status(
    node: &AgentNode,
    timeout: Duration,
    what: &str,
    accept: impl Fn(&ClusterStatus) -> bool,
) -> ClusterStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = status(node)
            && accept(&s)
        {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {timeout:?}; last status {:?}; log:\n{}",
            status(node),
            node.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn results(s: &ClusterStatus, name: &str) -> Vec<ProbeResult> {
    let n = s
        .nodes
        .iter()
        .find(|n| n.name == name)
        .unwrap_or_else(|| panic!("{name} not in {s:?}"));
    vec![
        n.host.icmp.result,
        n.host.http.result,
        n.endpoint.icmp.result,
        n.endpoint.http.result,
    ]
}

/// Replaces `path` at once (a rename), as an operator's tool would.
fn write(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, text).expect("write config");
    fs::rename(&tmp, path).expect("replace config");
}

fn config(nodes: &Path, interval: &str, timeout: &str, thresholds: u32, log: &str) -> String {
    format!(
        "# the test's agent\n\
         node-name: self\n\
         nodes-file: {}\n\
         health-range: 198.18.64.0/18\n\
         probe-interval: {interval}\n\
         probe-timeout: {timeout}\n\
         probe-spread: 10ms\n\
         success-threshold: {thresholds}\n\
         failure-threshold: {thresholds}\n\
         log-level: {log}\n",
        nodes.display()
    )
}

#[test]
fn sighup_applies_each_reloadable_setting_and_only_those() {
    let mut node = AgentNode::new();
    let nodes = node.dir.join("nodes.yaml");
    fs::write(
        &nodes,
        format!(
            "nodes:\n  - name: self\n    node-ip: {}\n    health-cidr: {}\n  \
             - name: silent\n    node-ip: {SILENT}\n    health-ip: 198.18.65.1\n",
            health_tests::agent::NODE_IP,
            health_tests::agent::HEALTH_CIDR
        ),
    )
    .expect("nodes file");
    let file = node.dir.join("config.yaml");
    write(&file, &config(&nodes, "1h", "1500ms", 50, "info"));
    let file_arg = file.to_str().expect("utf-8").to_owned();
    // RUST_LOG would override log-level.
    node.start_with(&["--config", &file_arg], |c| {
        c.env_remove("RUST_LOG");
    });

    // The file's settings are the agent's: one round (the interval is an
    // hour), nothing reaches 50 consecutive results, and no debug line.
    let before = wait_status(&node, Duration::from_secs(20), "first round", |s| {
        s.round.is_some()
    });
    assert_eq!(before.probe_interval_ms, 3_600_000);
    assert_eq!(before.probe_timeout_ms, 1500);
    assert_eq!(results(&before, "self"), [ProbeResult::Unknown; 4]);
    assert_eq!(results(&before, "silent"), [ProbeResult::Unknown; 4]);
    let first = before.round.as_ref().expect("round").clone();
    assert!(first.duration_ms >= 1400, "timeout 1.5s: {first:?}");
    assert!(!node.log().contains("probe round"), "{}", node.log());

    // Every reloadable setting changes, and one that needs a restart.
    write(
        &file,
        &(config(&nodes, "300ms", "200ms", 1, "debug") + "controller-interval: 5s\n"),
    );
    let pre = status(&node).expect("status before the reload");
    node.signal(Signal::SIGHUP);
    let after = wait_status(&node, Duration::from_secs(10), "the reload", |s| {
        s.probe_interval_ms == 300
    });
    // Timeout: in the status, and rounds now wait 200ms for the silent node.
    assert_eq!(after.probe_timeout_ms, 200);
    let fast = wait_status(
        &node,
        Duration::from_secs(5),
        "a round after the reload",
        |s| s.round.as_ref().is_some_and(|r| r.duration_ms < 1000),
    );
    let seq = fast.round.as_ref().expect("round").seq;
    // The reload changed settings, not history: every path's counters go
    // on from where they were, and rounds keep their numbering.
    let probes = |s: &ClusterStatus| {
        s.nodes
            .iter()
            .find(|n| n.name == "silent")
            .map(|n| (n.host.icmp.probes, n.host.icmp.consecutive_failures))
            .expect("the silent node")
    };
    let (was, now) = (probes(&pre), probes(&fast));
    assert!(
        was.0 >= 1 && now.0 > was.0 && now.1 > was.1,
        "{was:?} then {now:?}"
    );
    assert!(seq > pre.round.as_ref().expect("round").seq);
    // Thresholds of 1: one result decides each path.
    assert_eq!(
        results(&fast, "self"),
        [ProbeResult::Success; 4],
        "{fast:?}"
    );
    assert_eq!(
        results(&fast, "silent"),
        [ProbeResult::Failure; 4],
        "{fast:?}"
    );
    // Interval: rounds every 300ms (about 500ms with the timeout).
    std::thread::sleep(Duration::from_secs(2));
    let later = status(&node).expect("status").round.expect("round").seq;
    assert!(later >= seq + 2, "rounds {seq} then {later} in 2s");
    // Log level: the debug lines appear.
    let log = node.log();
    assert!(log.contains("probe round"), "{log}");
    assert!(
        log.contains("need a restart") && log.contains("controller-interval"),
        "{log}"
    );

    bad_files_change_nothing(&node, &file, &nodes);

    let exit = node.stop(Signal::SIGTERM);
    assert!(exit.success(), "{exit}; log:\n{}", node.log());
}

/// Reloads of files the agent would refuse change nothing of its running
/// settings (interval 300 ms, timeout 200 ms), and say why.
fn bad_files_change_nothing(node: &AgentNode, file: &Path, nodes: &Path) {
    let wait_logged = |what: &str| {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !node.log().contains(what) {
            assert!(
                Instant::now() < deadline,
                "no refusal logged ({what}):\n{}",
                node.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // A file that no longer parses, naming where.
    write(file, "probe-interval: 2s\nprobe-timeout: never\n");
    node.signal(Signal::SIGHUP);
    wait_logged("config.yaml:2");
    assert_eq!(status(node).expect("status").probe_interval_ms, 300);
    // One that parses but that the agent would refuse at start (a timeout
    // past the interval).
    write(file, &config(nodes, "300ms", "2s", 1, "debug"));
    node.signal(Signal::SIGHUP);
    wait_logged("--probe-timeout 2s is longer than --probe-interval 300ms");
    let kept = status(node).expect("status");
    assert_eq!(
        (kept.probe_interval_ms, kept.probe_timeout_ms),
        (300, 200),
        "the running settings stay"
    );
}

#[test]
fn a_bad_config_file_fails_naming_the_key_and_line_and_creates_nothing() {
    let node = AgentNode::new();
    let file = node.dir.join("bad.yaml");
    fs::write(&file, "probe-interval: 5s\nfailure-treshold: 3\n").expect("config");
    let out = node.run_to_exit(
        health_tests::agent::HEALTH_CIDR,
        &["--config", file.to_str().expect("utf-8")],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("bad.yaml:2: unknown key \"failure-treshold\""),
        "{err}"
    );
    assert!(!node.socket().exists());
    assert!(!node.node_has_link("lxc_health"));
}
