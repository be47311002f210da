//! Short forms of the chaos suite (`cargo xtask chaos` runs them in full):
//! 4 nodes over a 3-member etcd cluster, the etcd leader killed and
//! restarted, one agent cut off from etcd for 10 s, and one agent killed
//! with SIGKILL and restarted 5 times, one uplink deleted and made again 20
//! times in a minute, one state directory made read-only, one agent's
//! bpffs unmounted; every invariant checked every second, and each
//! scenario must pass.

use std::time::Duration;

use health_tests::chaos::{Chaos, Options, render};

#[test]
fn chaos_short_forms_hold_their_invariants() {
    let mut chaos = Chaos::start(4);
    let opts = Options {
        outage: Duration::from_secs(10),
        kills: 5,
        flaps: 20,
    };
    let rows: Vec<_> = [
        "leader-killed",
        "agent-cut-off",
        "agent-kill-loop",
        "uplink-flap",
        "state-read-only",
        "bpffs-unmounted",
    ]
    .into_iter()
    .map(|s| chaos.run(s, opts))
    .collect();
    let table = render(&rows);
    // The broken invariants first: a log that keeps only a failure's
    // first lines still says which scenario broke and how.
    let broken: Vec<String> = rows
        .iter()
        .filter(|r| !r.passed())
        .map(|r| format!("{}: {}", r.scenario, r.failures.join("; ")))
        .collect();
    assert!(broken.is_empty(), "{}\n\n{table}", broken.join("\n"));
    assert!(table.ends_with("6 passed, 0 failed\n"), "{table}");
}
