//! The shipped alert rules and dashboard against a real Prometheus
//! scraping real agents: the rules load and evaluate without error, the
//! node-down alert goes pending when a node's uplink goes down, and every
//! dashboard query runs and returns series.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use health_tests::{
    cluster::{Cluster, ClusterNode, Settings},
    prometheus::Prometheus,
};

fn packaging(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../packaging")
        .join(file)
}

/// `promtool` on the rules: they load, and their unit tests pass.
#[test]
fn the_alert_rules_load_and_pass_their_unit_tests() {
    let check = Command::new("promtool")
        .args(["check", "rules"])
        .arg(packaging("prometheus/health-alerts.yml"))
        .output()
        .expect("promtool (Debian package prometheus: cargo xtask setup installs it)");
    let text = String::from_utf8_lossy(&check.stdout);
    assert!(check.status.success(), "{check:?}");
    assert!(text.contains("SUCCESS: 8 rules found"), "{text}");
    let unit = Command::new("promtool")
        .args(["test", "rules"])
        .arg(packaging("prometheus/health-alerts.test.yml"))
        .output()
        .expect("promtool");
    assert!(unit.status.success(), "{unit:?}");
}

/// The dashboard's queries: every `expr` of every panel.
fn dashboard_queries() -> Vec<(String, String)> {
    let text =
        std::fs::read_to_string(packaging("grafana/health-dashboard.json")).expect("the dashboard");
    let d: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    d["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| {
            let title = p["title"].as_str().unwrap_or_default().to_owned();
            p["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(move |t| Some((title.clone(), t["expr"].as_str()?.to_owned())))
        })
        .collect()
}

#[test]
fn the_rules_and_the_dashboard_work_on_real_agents() {
    let cluster = Cluster::start(&Settings {
        extra_args: vec!["--metrics-per-peer".into()],
        ..Settings::default()
    });
    cluster.wait_status(0, Duration::from_secs(30), |s| s.reachable() == 3);
    let targets: Vec<_> = cluster.nodes.iter().map(ClusterNode::web_addr).collect();
    let rules = packaging("prometheus/health-alerts.yml");
    let prom = Prometheus::start_with_rules(
        &cluster.fabric,
        cluster.dir.join("prometheus"),
        &targets,
        &[&rules],
    );
    let patience = health_tests::patience(Duration::from_secs(60));
    prom.wait_value(r#"count(up{job="health"} == 1)"#, 3.0, patience);
    // Rates need two scrapes of each counter, and the histograms a probe.
    std::thread::sleep(Duration::from_secs(5));

    let queries = dashboard_queries();
    assert!(queries.len() >= 10, "{queries:?}");
    let deadline = Instant::now() + patience;
    for (title, expr) in &queries {
        loop {
            let answer = prom.query_raw(expr).expect("an answer");
            assert_eq!(answer["status"], "success", "{title}: {expr}: {answer}");
            let series = answer["data"]["result"].as_array().map_or(0, Vec::len);
            if series > 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{title}: {expr} has no series: {answer}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    // Every rule evaluates without error.
    let rules = prom.api("rules").expect("rules");
    let all: Vec<&serde_json::Value> = rules["data"]["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .collect();
    assert_eq!(all.len(), 8, "{rules}");
    for r in &all {
        assert_eq!(r["health"], "ok", "{r}");
    }
    // The counter the in-flight rule reads is there, and idle: three
    // peers never wait for the limit.
    let held = prom.query("health_probe_rounds_held_by_in_flight_limit_total");
    assert_eq!(held.len(), 3, "{held:?}");
    assert!(held.iter().all(|(_, v)| *v < 0.5), "{held:?}");
    let active = |name: &str| {
        prom.query(&format!(r#"ALERTS{{alertname="{name}"}}"#))
            .into_iter()
            .map(|(labels, _)| labels)
            .collect::<Vec<_>>()
    };
    assert!(active("HealthNodeDown").is_empty(), "all nodes are up");

    // node-3 cut off: the node-down alert goes pending for it alone.
    cluster.nodes[2].set_uplink(false);
    let deadline = Instant::now() + patience;
    loop {
        let down = active("HealthNodeDown");
        if !down.is_empty() {
            assert!(
                down.iter()
                    .all(|l| l["peer"] == cluster.nodes[2].name.as_str()),
                "{down:?}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "HealthNodeDown never pending");
        std::thread::sleep(Duration::from_millis(500));
    }
    cluster.nodes[2].set_uplink(true);
}
